"""The HTML report: self-contained (nothing to fetch), escaped, bounded in size on a large program,
byte-identical for the same inputs; `tpuflow report` on the command line; the schedule
comparison when a scheduler is missing or the program is too large."""

from __future__ import annotations

import re

import pytest

from tpuflow.cli import main
from tpuflow.codegen import report as report_module
from tpuflow.codegen.report import compare_schedules, render_report
from tpuflow.codegen.report_timeline import COLUMNS
from tpuflow.errors import OptionError
from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model

FETCHING = [r"https?://", r"\bsrc\s*=", r"\bhref\s*=", r"url\(", r"@import", r"<link\b", r"<iframe\b", r"<img\b",
            r"\bfetch\(", r"XMLHttpRequest", r"\bimport\("]


def assert_self_contained(html: str) -> None:
    for pattern in FETCHING:
        assert not re.search(pattern, html, re.IGNORECASE), f"report contains {pattern}"


def test_bert_report_is_self_contained_and_complete(bert_run):
    program, sim, report, runs, ctx = bert_run
    html = render_report(ctx)
    assert_self_contained(html)
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    for anchor in ("summary", "findings", "timeline", "layers", "stalls", "banks", "dram", "schedules"):
        assert f'id="{anchor}"' in html
    assert report["chip_fingerprint"] in html and f"{report['latency_us']:,.1f} us" in html
    assert html.count("<tr>") >= len(report["layers"])
    assert len(re.findall(r"<rect ", html)) == ctx["timeline"].rect_count + len(ctx["timeline"].rows)
    for line in ctx["bottlenecks"]:
        assert line.replace("'", "&#39;") in html


def test_names_are_escaped(fake_large):
    html = render_report(fake_large[4])
    assert "layer<1>&" not in html and "layer&lt;1&gt;&amp;" in html


def test_large_program_report_stays_small(fake_large):
    program, sim, report, runs, ctx = fake_large
    assert program.instruction_count == 200_000
    html = render_report(ctx)
    assert_self_contained(html)
    assert len(html.encode()) < 4_000_000
    # bounded by the columns: per engine at most the wide bars (>= 2 columns each) plus one run per column
    assert ctx["timeline"].rect_count <= 3 * (COLUMNS + COLUMNS // 2) + COLUMNS


def test_cli_report_is_deterministic_and_writes_trace_and_profile(tmp_path, capsys):
    outputs = []
    for k in range(2):
        out, trace, prof = tmp_path / f"r{k}.html", tmp_path / f"t{k}.json", tmp_path / f"p{k}.csv"
        assert main(["report", "small_cnn", "-o", str(out), "--trace", str(trace), "--profile", str(prof)]) == 0
        outputs.append((out.read_bytes(), trace.read_bytes(), prof.read_bytes()))
    assert outputs[0] == outputs[1]
    html = outputs[0][0].decode()
    assert_self_contained(html)
    assert "small_cnn on sg2260" in html and "CP-SAT limit" in html
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{n}{k}.{x}" for k in range(2)
                                                                   for n, x in (("r", "html"), ("t", "json"), ("p", "csv")))
    assert "-> " in capsys.readouterr().out


def test_bad_output_path_is_a_user_error(tmp_path, capsys):
    assert main(["report", "mlp", "--schedule", "program", "-o", str(tmp_path / "missing" / "r.html")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tpuflow: error:") and "cannot write" in err and err.count("\n") == 1


@pytest.fixture(scope="module")
def mlp_program():
    return compile_model("mlp", None, CompileOptions(schedule="program"))[1]


def test_unavailable_scheduler_shows_as_not_available(mlp_program, monkeypatch):
    import tpuflow.scheduler as scheduler

    def refuse(program, method, time_limit_s=20.0):
        raise OptionError(f"option --schedule: '{method}' is not implemented yet")
    monkeypatch.setattr(scheduler, "schedule_with_report", refuse)
    runs = compare_schedules(mlp_program, "program", 5.0)
    assert runs["program"].status == "ok" and runs["program"].sim is not None
    for method in ("list", "cpsat"):
        assert runs[method].status == "not available" and "not implemented" in runs[method].note
    with pytest.raises(OptionError):
        compare_schedules(mlp_program, "list", 5.0)


def test_comparison_is_skipped_above_the_size_limit(mlp_program, monkeypatch):
    monkeypatch.setattr(report_module, "COMPARISON_MAX_INSTRUCTIONS", 3)
    runs = compare_schedules(mlp_program, "program", 5.0)
    assert runs["program"].status == "ok"
    assert runs["list"].status == runs["cpsat"].status == "not run"
    assert "tpuflow estimate --schedule list" in runs["list"].note


def test_comparison_uses_the_short_cpsat_limit_unless_cpsat_was_asked(mlp_program):
    runs = compare_schedules(mlp_program, "list", 7.0, cpsat_limit_s=0.5)
    assert runs["cpsat"].time_limit_s == 0.5 and runs["list"].time_limit_s is None
    assert all(r.status == "ok" for r in runs.values())
    assert runs["cpsat"].sim.total_ps <= runs["list"].sim.total_ps
    runs = compare_schedules(mlp_program, "cpsat", 0.7)
    assert runs["cpsat"].time_limit_s == 0.7
