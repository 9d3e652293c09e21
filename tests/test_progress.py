"""Progress lines on stderr: one per finished step on a terminal, nothing otherwise."""

from __future__ import annotations

import io

from tpuflow.options import CompileOptions
from tpuflow.pipeline import estimate


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_steps_are_reported_on_a_terminal(monkeypatch):
    err = Terminal()
    monkeypatch.setattr("sys.stderr", err)
    estimate("mlp", None, CompileOptions(schedule="list"))
    lines = err.getvalue().splitlines()
    assert [line.split(" (")[0].split(" ")[1] for line in lines] == ["import", "lower", "list", "timing"]
    assert all(line.startswith("tpuflow: ") and line.endswith(" s)") for line in lines)


def test_nothing_is_printed_when_stderr_is_not_a_terminal(capsys):
    estimate("mlp")
    assert capsys.readouterr().err == ""
