"""`tpuflow estimate`: the JSON document, its consistency with the simulation, the CSV profile
and the trace, determinism."""

from __future__ import annotations

import csv
import json

import pytest

from tpuflow.cli import main
from tpuflow.options import CompileOptions
from tpuflow.pipeline import estimate

KEYS = {"latency_us", "latency_cycles", "lower_bound_us", "engines", "stalls", "dram", "layers", "chip",
        "chip_fingerprint", "model", "options", "bounds", "latency_over_bound", "top_layers"}


@pytest.fixture(scope="module")
def bert():
    return estimate("bert_layer", None, CompileOptions(), with_sim=True)


def test_json_has_the_documented_keys(bert):
    report, program, sim = bert
    assert KEYS <= set(report)
    assert set(report["engines"]) == {"tiu", "gdma", "tile"}
    for e in report["engines"].values():
        assert {"busy_us", "instructions", "utilisation"} <= set(e)
    for row in report["layers"]:
        assert {"name", "op", "start_us", "end_us", "macs", "bytes", "bound"} <= set(row)
        assert row["bound"] in ("compute", "memory", "dependency")


def test_report_agrees_with_the_simulation(bert):
    report, program, sim = bert
    assert report["latency_us"] == pytest.approx(sim.total_us)
    assert report["latency_us"] >= report["lower_bound_us"]
    assert sum(e["instructions"] for e in report["engines"].values()) == program.instruction_count
    assert sum(r["macs"] for r in report["layers"]) == report["macs"] == 52428800
    for r in report["layers"]:
        assert 0 <= r["start_us"] <= r["end_us"] <= report["latency_us"] + 1e-6


def test_profile_and_trace_cover_every_instruction_once(tmp_path):
    trace, profile = tmp_path / "t.json", tmp_path / "p.csv"
    assert main(["estimate", "small_cnn", "--trace", str(trace), "--profile", str(profile)]) == 0
    rows = list(csv.DictReader(profile.open()))
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    report = estimate("small_cnn")
    count = sum(e["instructions"] for e in report["engines"].values())
    assert len(rows) == len(events) == count
    assert len({(r["engine"], r["cmd_id"]) for r in rows}) == count
    assert {"txi_acq_ns", "check_ns", "issue_ns", "start_ns", "end_ns", "stall_dependency_cycles"} <= set(rows[0])
    assert any(e["ph"] == "C" for e in json.loads(trace.read_text())["traceEvents"])


def test_estimate_is_deterministic():
    a, b = estimate("mlp"), estimate("mlp")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_bad_output_path_is_a_user_error(tmp_path, capsys):
    assert main(["estimate", "mlp", "--profile", str(tmp_path / "missing" / "p.csv")]) == 2
    assert "cannot write" in capsys.readouterr().err
