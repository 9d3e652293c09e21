"""README's Python example runs as written and verifies the very program it compiled."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

ROOT = Path(__file__).parents[1]


def python_example() -> str:
    section = (ROOT / "README.md").read_text().split("## Python API", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_readme_python_example_verifies_the_program_it_compiled():
    scope: dict = {}
    with contextlib.redirect_stdout(io.StringIO()) as out:
        exec(compile(python_example(), "README.md", "exec"), scope)   # noqa: S102 - our own README
    result, program = scope["result"], scope["program"]
    assert result["ok"] is True and result["instructions"] == program.counts()
    assert (result["dtype"], result["matmul"]) == (program.options["dtype"], program.options["matmul"]) == ("fp16", "tile")
    assert out.getvalue().startswith(str(program.counts()) + " True ")


def test_readme_says_what_the_browser_test_needs_and_how_long_the_suite_takes():
    text = " ".join((ROOT / "README.md").read_text().split("## Tests and benchmarks", 1)[1].split())
    assert "Chromium" in text and "apt-get install chromium" in text
    assert "minutes" in text and "SUITE_TIME" not in text
