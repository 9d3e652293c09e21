"""README's quickstart: exactly two commands, and .ci/run runs the test one verbatim."""

from pathlib import Path

ROOT = Path(__file__).parents[1]


def quickstart_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return [line.strip() for line in section.splitlines() if line.startswith("    ")]


def test_quickstart_has_a_main_job_and_a_test_command():
    commands = quickstart_commands()
    assert len(commands) == 2
    assert commands[0].endswith("tpuflow estimate")
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command():
    test_command = quickstart_commands()[1]
    install_and_test = test_command.split("&& ", 2)[-1]      # after venv creation and activation
    ci = (ROOT / ".ci" / "run").read_text()
    assert install_and_test in ci.splitlines()
