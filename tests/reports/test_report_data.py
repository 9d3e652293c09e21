"""Report data: per-layer sums equal the totals, the timeline stands for every instruction once,
binning conserves time and bytes, wait attribution, the plain-word bottlenecks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuflow.codegen.report_analysis import WAIT_KINDS, layer_sentence, layer_stats, wait_kinds
from tpuflow.codegen.report_data import (OP_CLASSES, Bins, dominant, dram_bandwidth_gbps, pieces, row_classes,
                                         row_ddr_bytes, spread)
from tpuflow.codegen.report_timeline import COLUMNS
from tpuflow.hwmodel.timing.result import STALLS


def test_layer_sums_equal_the_totals(bert_run):
    program, sim, report, runs, ctx = bert_run
    layers = ctx["layers"]
    assert sum(row["stats"]["instructions"] for row in layers) == program.instruction_count == len(sim.engine)
    for cause in STALLS:
        assert sum(row["stats"]["stalls_ps"][cause] for row in layers) == int(sim.stalls[cause].sum())
    for code, engine in enumerate(("tiu", "gdma", "tile")):
        total = int(sim.stalls["dependency"][sim.engine == code].sum())
        assert sum(row["stats"]["dependency_ps"][engine] for row in layers) == total
    assert sum(row["macs"] for row in layers) == report["macs"] == 52428800
    assert sum(row["bytes"] for row in layers) == ctx["ddr_bytes"] == int(row_ddr_bytes(program).sum()) > 0
    attributed = sum(sum(row["stats"]["wait_kinds_ps"].values()) for row in layers)
    assert 0 < attributed <= int(sim.stalls["dependency"].sum())


def test_stall_table_matches_the_simulation(bert_run):
    program, sim, report, runs, ctx = bert_run
    for row in ctx["stalls"]:
        assert row["total_us"] == pytest.approx(sim.stalls[row["cause"]].sum() / 1e6)
        assert row["total_us"] == pytest.approx(report["stalls"][row["cause"]])
    assert ctx["banks"]["cycles"] == int((sim.stalls["bank_conflict"][sim.engine == 0] // sim.periods_ps[0]).sum())
    umcs = ctx["umcs"]
    assert sum(u["hits"] for u in umcs) == report["dram"]["page_hits"]
    assert sum(u["misses"] for u in umcs) == report["dram"]["page_misses"]


@pytest.mark.parametrize("which", ["bert_run", "fake_large"])
def test_timeline_stands_for_every_instruction_once(which, request):
    program, sim, report, runs, ctx = request.getfixturevalue(which)
    rows = {row.label: row for row in ctx["timeline"].rows}
    for code, engine in enumerate(("TIU", "GDMA", "TILE")):
        expected = int(np.sum(sim.engine == code))
        if engine in rows:
            assert sum(r.count for r in rows[engine].rects) == expected
        else:
            assert expected == 0
    assert sum(r.count for r in rows["DRAM"].rects) == 0
    for row in ctx["timeline"].rows:
        for r in row.rects:
            assert 0 <= r.x and r.x + r.w <= COLUMNS + 1e-6 and 0 < r.h <= 30


def test_bandwidth_bins_conserve_the_ddr_bytes(bert_run):
    program, sim, *_ = bert_run
    bins = Bins.spanning(sim.total_ps, 777)
    gbps = dram_bandwidth_gbps(program, sim, bins)
    assert (gbps * bins.width_ps / 1e3).sum() == pytest.approx(row_ddr_bytes(program).sum(), rel=1e-9)


def test_op_classes_of_a_real_program(bert_run):
    program, sim, *_ = bert_run
    classes = [OP_CLASSES[c] for c in row_classes(program)]
    assert len(classes) == len(sim.engine)
    by_op = dict(zip(sim.op, classes))
    assert by_op["mm2.nn"] == "matmul" and by_op["arith.add"] == "vector"
    assert {"dma load", "dma store"} <= set(classes)


intervals = st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 3_000)), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(intervals, st.integers(1, 50))
def test_pieces_cover_each_interval_exactly(spans, count):
    start = np.asarray([s for s, _ in spans], dtype=np.float64)
    end = start + np.asarray([d for _, d in spans], dtype=np.float64)
    bins = Bins.spanning(float(end.max()) or 1.0, count)
    index, b, overlap = pieces(start, end, bins)
    assert np.all((b >= 0) & (b < count))
    assert np.allclose(np.bincount(index, weights=overlap, minlength=len(start)), end - start)
    assert set(index.tolist()) == set(range(len(start)))
    amount = np.arange(1, len(start) + 1, dtype=np.float64)
    assert spread(start, end, amount, bins).sum() == pytest.approx(amount.sum())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 6), st.integers(1, 9)), min_size=1, max_size=60))
def test_dominant_is_the_heaviest_key_per_bin(items):
    b = np.asarray([i[0] for i in items])
    key = np.asarray([i[1] for i in items])
    weight = np.asarray([i[2] for i in items], dtype=np.float64)
    best, best_weight = dominant(b, key, weight, 6)
    for k in range(6):
        totals = {}
        for bi, ki, wi in items:
            if bi == k:
                totals[ki] = totals.get(ki, 0) + wi
        if not totals:
            assert best[k] == -1
            continue
        top = max(totals.values())
        assert best[k] == min(key_ for key_, v in totals.items() if v == top) and best_weight[k] == top


def test_waits_are_attributed_to_what_was_waited_for():
    from report_fakes import fake_run
    program, sim = fake_run(6, 6, n_layers=2)
    sim.stalls["dependency"][:] = 0
    sim.stalls["dependency"][0] = 5_000           # TIU #1 waits for GDMA #1
    sim.stalls["dependency"][6] = 7_000           # GDMA #1 waits for nothing (id 0): unattributed
    kinds = wait_kinds(sim, row_classes(program))
    waited_class = OP_CLASSES[row_classes(program)[6]]
    assert WAIT_KINDS[kinds[0]] == {"dma load": "GDMA loads", "dma store": "GDMA stores"}[waited_class]
    assert kinds[6] == -1 and np.all(kinds[1:6] == -1)
    rows = [{"name": n, "start_us": 0.0, "end_us": 1.0, "busy_us": {"tiu": 0.0, "gdma": 0.0, "tile": 0.0}}
            for n in program.layers]
    stats = layer_stats(sim, rows, kinds)
    assert stats[0]["waiter"] == "gdma" and stats[0]["dependency_ps"] == {"tiu": 5_000, "gdma": 7_000, "tile": 0}
    assert stats[0]["wait_kinds_ps"] == {WAIT_KINDS[kinds[0]]: 5_000}


def test_bottleneck_sentence_names_the_wait():
    row = {"name": "conv2_1", "op": "Conv", "start_us": 0.0, "end_us": 100.0, "bytes": 2_000_000, "bound": "memory",
           "utilisation": 0.1, "busy_us": {"tiu": 39.0, "gdma": 90.0, "tile": 0.0}}
    stat = {"waiter": "tiu", "waits_on": "GDMA loads", "wait_share": 0.61, "dependency_ps": {"tiu": 61_000_000}}
    text = layer_sentence(row, stat, 400.0, 64.0)
    assert text.startswith("layer conv2_1 (Conv) waits 61% of its TIU time on GDMA loads (61.0 us waiting")
    assert "25% of the run" in text and "memory-bound: GDMA busy 90%" in text and "20.0 GB/s (31% of DRAM" in text


def test_bottlenecks_lead_with_the_gap_and_rank_layers(bert_run):
    program, sim, report, runs, ctx = bert_run
    lines = ctx["bottlenecks"]
    assert lines[0].startswith(f"The run takes {report['latency_us']:.1f} us")
    layer_lines = [line for line in lines if line.startswith("layer ")]
    assert len(layer_lines) == 5
    occupied = {row["name"]: row["stats"]["occupied_us"] for row in ctx["layers"]}
    named = [line.split(" ")[1] for line in layer_lines]
    assert [occupied[n] for n in named] == sorted(occupied.values(), reverse=True)[:5]
