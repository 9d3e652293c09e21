"""Shared report fixtures: a simulated BERT layer (program and list order) and its report context."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def bert_run():
    """(program, sim, estimate report, runs, report context) of bert_layer in list order."""
    from tpuflow.codegen.report import compare_schedules, report_context
    from tpuflow.estimate import estimate_report
    from tpuflow.options import CompileOptions
    from tpuflow.pipeline import compile_model
    _, emitted = compile_model("bert_layer", None, CompileOptions(schedule="program"))
    runs = compare_schedules(emitted, "list", 1.0, cpsat_limit_s=0.5)
    program, sim = runs["list"].program, runs["list"].sim
    program.options["schedule"] = "list"
    report = estimate_report(program, sim)
    return program, sim, report, runs, report_context(program, sim, report, runs)


@pytest.fixture(scope="session")
def fake_large():
    """A 200k-instruction program with a made-up simulation, its estimate report and context."""
    from report_fakes import fake_run
    from tpuflow.codegen.report import ScheduleRun, report_context
    from tpuflow.estimate import estimate_report
    program, sim = fake_run(100_000, 100_000)
    report = estimate_report(program, sim)
    runs = {"program": ScheduleRun("program", "ok", "", program, sim)}
    return program, sim, report, runs, report_context(program, sim, report, runs)
