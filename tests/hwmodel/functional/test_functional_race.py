"""The race detector against a brute-force oracle: random deadlock-free programs of TIU copies,
GDMA copies and TILE pushes over partly overlapping LMEM regions (tile slots included); the
detector must report a race exactly when two conflicting accesses of different engines are not
ordered by the transitive closure of queue order and waits, whatever the interleaving and the
bucket size."""

from __future__ import annotations

import itertools

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from functional_helpers import CHIP, flat
from tpuflow.errors import RaceError
from tpuflow.isa.base import LocalTensor, Prec
from tpuflow.isa.gdma import TensorDma
from tpuflow.isa.tile import TPush
from tpuflow.isa.tiu import ArTiu
from tpuflow.program import ENGINES, MemoryPlan, Program
from tpuflow.hwmodel.functional import race, run
from tpuflow.hwmodel.functional.engines import waits_of

WINDOW = CHIP.tile_window_offset
# (lane, offset, channels, width in fp32): overlapping in bytes and lanes; the last two are the
# first two T-queue tile slots (lanes 0 and 1 of the tile window)
REGIONS = [(0, 0, 8, 8), (4, 32, 8, 16), (60, 64, 8, 8), (0, 96, 40, 16), (2, 0, 1, 24), (0, WINDOW, 1, 16),
           (1, WINDOW, 1, 16)]


def _tensor(region: int) -> LocalTensor:
    lane, off, c, w = REGIONS[region]
    return LocalTensor(flat(lane, off), (1, c, 1, w), (w * 2, w, w, 1), Prec.FP32)


def _copy_shape(src: int, dst: int) -> tuple[int, int]:
    (_, _, c1, w1), (_, _, c2, w2) = REGIONS[src], REGIONS[dst]
    return min(c1, c2), min(w1, w2)


def _tiu(src: int, dst: int, dep: int) -> ArTiu:
    c, w = _copy_shape(src, dst)
    s, d = _tensor(src), _tensor(dst)
    return ArTiu(op="copy", res0_addr=d.addr, res0_n=1, res0_c=c, res0_h=1, res0_w=w, opd0_addr=s.addr,
                 short_res0_str=3, res0_n_str=d.strides[0], res0_c_str=d.strides[1], res0_h_str=w, res0_w_str=1,
                 short_opd0_str=3, opd0_n_str=s.strides[0], opd0_c_str=s.strides[1], opd0_h_str=w, opd0_w_str=1,
                 cmd_id_dep=dep)


def _gdma(src: int, dst: int, dep: int) -> TensorDma:
    c, w = _copy_shape(src, dst)
    s, d = _tensor(src), _tensor(dst)
    g = CHIP.core.gdma_lmem_base_address
    return TensorDma(src_start_addr=s.addr + g, dst_start_addr=d.addr + g, src_nsize=1, src_csize=c, src_hsize=1,
                     src_wsize=w, src_nstride=s.strides[0], src_cstride=s.strides[1], src_hstride=w, src_wstride=1,
                     dst_nsize=1, dst_csize=c, dst_hsize=1, dst_wsize=w, dst_nstride=d.strides[0],
                     dst_cstride=d.strides[1], dst_hstride=w, dst_wstride=1, cmd_id_dep=dep)


@st.composite
def programs(draw) -> Program:
    """A global order of instructions; every wait names an instruction earlier in that order."""
    order = draw(st.lists(st.sampled_from("BDT"), min_size=2, max_size=14))
    queues = {"B": [], "D": [], "T": []}
    for letter in order:
        seen = {k: len(v) for k, v in queues.items()}
        pick = lambda other: draw(st.integers(0, seen[other]))  # noqa: E731
        if letter == "T":
            if seen["T"] >= 2:
                continue
            queues["T"].append(TPush(dst_queue=0, dst_size=7, wait_tiu_id=pick("B"), wait_gdma_id=pick("D")))
            continue
        src, dst = draw(st.integers(0, len(REGIONS) - 1)), draw(st.integers(0, len(REGIONS) - 1))
        make = _tiu if letter == "B" else _gdma
        queues[letter].append(make(src, dst, pick("D" if letter == "B" else "B")))
    return Program(chip=CHIP, tiu=queues["B"], gdma=queues["D"], tile=queues["T"],
                   memory=MemoryPlan(ddr_bytes_used=64))


def oracle_has_race(program: Program) -> bool:
    """Pairs of conflicting accesses of different engines unordered by the happens-before graph."""
    graph = nx.DiGraph()
    for engine in ENGINES:
        queue = program.queue(engine)
        for i, instr in enumerate(queue):
            graph.add_node((engine, i + 1))
            if i:
                graph.add_edge((engine, i), (engine, i + 1))
            for w in waits_of(engine, instr):
                graph.add_edge((w.engine, w.count), (engine, i + 1))
    closure = {node: nx.descendants(graph, node) for node in graph}
    accesses = {(e, i + 1): program.accesses(e, i) for e in ENGINES for i in range(len(program.queue(e)))}
    for (a, acc_a), (b, acc_b) in itertools.combinations(accesses.items(), 2):
        if a[0] is b[0] or b in closure[a] or a in closure[b]:
            continue
        if _conflict(acc_a, acc_b):
            return True
    return False


def _conflict(x, y) -> bool:
    pairs = [(x.lmem_writes, y.lmem_writes), (x.lmem_writes, y.lmem_reads), (x.lmem_reads, y.lmem_writes)]
    return any(r.overlaps(s) for one, two in pairs for r in one for s in two)


@pytest.mark.parametrize("bucket_bytes", [32, 16384])
@settings(max_examples=150, deadline=None)
@given(programs(), st.sampled_from(["round_robin", "tiu_first", "gdma_first", "random"]), st.integers(0, 3))
def test_detector_agrees_with_the_happens_before_oracle(bucket_bytes, program, interleave, seed):
    expected = oracle_has_race(program)
    original = race.BUCKET_BYTES
    race.BUCKET_BYTES = bucket_bytes
    try:
        run(program, {}, interleave=interleave, seed=seed)
        found = False
    except RaceError:
        found = True
    finally:
        race.BUCKET_BYTES = original
    assert found == expected


def test_detector_passes_long_correct_programs_and_finds_one_late_race():
    from tpuflow.hwmodel.functional.bench import pipeline_program
    program = pipeline_program(300)
    x = np.zeros((1, 64, 8, 16), np.float32)
    run(program, {"x": x}, interleave="random", seed=5)
    tiu = list(program.tiu)
    late = 2 * 250                       # block 250's add waits for block 249's load, not its own
    tiu[late] = type(tiu[late])(**{**tiu[late].field_values(), "cmd_id_dep": 2 * 249 + 1})
    racy = program.with_queues(tiu, program.gdma, [], [], [], [], "")
    with pytest.raises(RaceError, match=f"B{late + 1} arith.add.*D{late + 1} dma.tensor|"
                                        f"D{late + 1} dma.tensor.*B{late + 1} arith.add"):
        run(racy, {"x": x}, interleave="gdma_first")
