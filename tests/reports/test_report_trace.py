"""The --trace file against the trace-event format rules Perfetto's JSON importer applies, every
instruction exactly once; the --profile CSV and its documented columns."""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuflow.cli import main
from tpuflow.codegen import profile
from tpuflow.codegen.profile import PROFILE_COLUMNS, overlap_lanes, profile_csv, trace_events
from tpuflow.codegen.report_data import OP_CLASSES, row_ddr_bytes

PHASES = {"X", "M", "C"}


def validate_trace(doc: dict) -> list[dict]:
    """Assert the trace-event rules; return the complete events. Rules: an object with a
    traceEvents list; no displayTimeUnit (Perfetto and chrome://tracing read it differently);
    every event has ph/pid/name; complete events have numeric ts >= 0 and dur >= 0 and an integer
    tid that a thread_name metadata event names; on one track, slices nest or are disjoint (no
    partial overlap, at the nanosecond resolution the importer uses); counters have numeric args."""
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    assert "displayTimeUnit" not in doc
    named, complete, tracks = set(), [], defaultdict(list)
    for e in doc["traceEvents"]:
        assert e["ph"] in PHASES and isinstance(e["pid"], int) and isinstance(e["name"], str)
        if e["ph"] == "M":
            assert e["name"] in {"process_name", "thread_name", "thread_sort_index"}
            if e["name"] == "thread_name":
                named.add((e["pid"], e["tid"]))
                assert isinstance(e["args"]["name"], str) and e["args"]["name"]
        elif e["ph"] == "X":
            assert isinstance(e["tid"], int)
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0
            complete.append(e)
            tracks[(e["pid"], e["tid"])].append((round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000)))
        else:
            assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values())
            assert isinstance(e["ts"], (int, float))
    assert set(tracks) <= named
    for slices in tracks.values():
        slices.sort(key=lambda s: (s[0], -s[1]))
        stack: list[int] = []
        for begin, end in slices:
            while stack and stack[-1] <= begin:
                stack.pop()
            assert not stack or end <= stack[-1], "slices partially overlap on one track"
            stack.append(end)
    return complete


def engine_of(event: dict) -> str:
    return {1: "tiu", 2: "gdma", 3: "tile"}[event["tid"] // 1000]


def _every_instruction_once(complete: list[dict], sim) -> None:
    seen = [(engine_of(e), e["args"]["cmd_id"]) for e in complete]
    expected = [(("tiu", "gdma", "tile")[c], int(i)) for c, i in zip(sim.engine, sim.cmd_id)]
    assert len(seen) == len(set(seen)) == len(sim.engine)
    assert set(seen) == set(expected)


def test_bert_trace_follows_the_format_and_covers_each_instruction_once(bert_run):
    program, sim, *_ = bert_run
    doc = json.loads(json.dumps(trace_events(program, sim)))
    complete = validate_trace(doc)
    _every_instruction_once(complete, sim)
    tiu_tracks = {e["tid"] for e in complete if engine_of(e) == "tiu"}
    starts, ends = sim.times["start"][sim.engine == 0], sim.times["end"][sim.engine == 0]
    assert (len(tiu_tracks) > 1) == bool(np.any(starts[1:] < ends[:-1]))   # pipelined TIU: overlap tracks
    by_row = {(engine_of(e), e["args"]["cmd_id"]): e for e in complete}
    row = int(np.flatnonzero(sim.engine == 1)[3])
    event = by_row[("gdma", int(sim.cmd_id[row]))]
    assert event["ts"] == sim.times["start"][row] // 1000 / 1000
    assert event["dur"] == pytest.approx((sim.times["end"][row] // 1000 - sim.times["start"][row] // 1000) / 1000)
    assert event["name"] == sim.op[row] and event["args"]["layer"] == sim.layer[row]
    assert event["cat"] in OP_CLASSES


def test_counter_track_carries_the_ddr_bytes(bert_run):
    program, sim, *_ = bert_run
    counters = [e for e in trace_events(program, sim, bandwidth_bins=50)["traceEvents"] if e["ph"] == "C"]
    assert len(counters) == 51 and counters[-1]["args"]["GB/s"] == 0.0
    width_us = counters[1]["ts"] - counters[0]["ts"]
    moved = sum(e["args"]["GB/s"] * width_us * 1e3 for e in counters)     # GB/s * us = 1e3 bytes
    assert moved == pytest.approx(row_ddr_bytes(program).sum(), rel=1e-3)


def test_large_trace_is_valid(fake_large):
    program, sim, *_ = fake_large
    complete = validate_trace(trace_events(program, sim))
    _every_instruction_once(complete, sim)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 30)), min_size=0, max_size=40))
def test_overlap_lanes_never_overlap_and_use_the_fewest_tracks(spans):
    start = np.asarray(sorted(s for s, _ in spans), dtype=np.int64)
    end = start + np.asarray([d for _, d in spans], dtype=np.int64)
    lanes = overlap_lanes(start, end)
    for lane in set(lanes.tolist()):
        idx = np.flatnonzero((lanes == lane) & (end > start))
        assert np.all(start[idx][1:] >= end[idx][:-1])
    depth = max([int(np.sum((start <= t) & (end > t))) for t in start.tolist()] + [1])
    assert (int(lanes.max()) + 1 if len(lanes) else 1) == depth


def test_profile_csv_has_the_documented_columns(bert_run):
    program, sim, *_ = bert_run
    rows = list(csv.DictReader(io.StringIO(profile_csv(sim, program))))
    assert list(rows[0]) == PROFILE_COLUMNS
    assert len(rows) == len(sim.engine)
    assert {r["op_class"] for r in rows} <= set(OP_CLASSES)
    assert sum(int(r["ddr_bytes"]) for r in rows) == int(row_ddr_bytes(program).sum())
    for column in PROFILE_COLUMNS:
        assert column in profile.__doc__, f"column {column} is not documented"
    first = rows[0]
    assert int(first["end_cycles"]) >= int(first["start_cycles"]) and float(first["end_ns"]) >= float(first["start_ns"])


def test_estimate_writes_trace_and_profile(tmp_path):
    trace, prof = tmp_path / "t.json", tmp_path / "p.csv"
    assert main(["estimate", "small_cnn", "--schedule", "program", "--trace", str(trace), "--profile", str(prof)]) == 0
    complete = validate_trace(json.loads(trace.read_text()))
    rows = list(csv.DictReader(prof.open()))
    assert len(complete) == len(rows) and all(r["op_class"] for r in rows)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.csv", "t.json"]
