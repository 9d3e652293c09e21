"""The timestep table of sliced runs and the pipelined order that follows it: every slice loads,
computes and stores once, in that order, overlapping its neighbours; reordering a real sliced
run keeps every conflicting pair of instructions in order, runs loads of the next slice ahead of
this slice's compute, and the program still verifies with the race detector."""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tpuflow.isa import Engine
from tpuflow.lowering.timesteps import COMPUTE, LOAD, STORE, phase_of, step_of, timestep_table

sys.path.insert(0, str(Path(__file__).parent))
from sliced_chain import pointwise_chain, small_lmem_chip  # noqa: E402


@given(st.integers(1, 64))
def test_every_slice_loads_computes_and_stores_once_in_that_order(slices):
    table = timestep_table(slices)
    assert [s.index for s in table] == list(range(slices + 2))
    for phase in (LOAD, COMPUTE, STORE):
        seen = [s.slice_in(phase) for s in table if s.slice_in(phase) is not None]
        assert seen == list(range(slices))
        assert all(table[step_of(k, phase)].slice_in(phase) == k for k in range(slices))
    for step in table[2:-2]:            # the steady state: three slices in flight
        assert (step.load, step.compute, step.store) == (step.index, step.index - 1, step.index - 2)


def test_a_single_slice_runs_its_phases_in_three_steps():
    assert [(s.load, s.compute, s.store) for s in timestep_table(1)] == \
        [(0, None, None), (None, 0, None), (None, None, 0)]


class _Acc:
    def __init__(self, lmem_reads=(), lmem_writes=(), ddr_reads=(), ddr_writes=()):
        self.lmem_reads, self.lmem_writes = lmem_reads, lmem_writes
        self.ddr_reads, self.ddr_writes = ddr_reads, ddr_writes


def test_phases_follow_the_direction_of_a_dma():
    r = (object(),)
    assert phase_of(Engine.GDMA, _Acc(ddr_reads=r, lmem_writes=r)) == LOAD
    assert phase_of(Engine.GDMA, _Acc(lmem_reads=r, ddr_writes=r)) == STORE
    assert phase_of(Engine.GDMA, _Acc(lmem_reads=r, lmem_writes=r)) == COMPUTE
    assert phase_of(Engine.TIU, _Acc(ddr_reads=r, lmem_writes=r)) == COMPUTE


def _conflict(a, b) -> bool:
    """Independent check: two accesses touch a common byte and at least one writes it."""
    def lmem(x, y):
        return any(p.overlaps(q) for p in x for q in y)

    def ddr(x, y):
        return any(p.lo < q.hi and q.lo < p.hi for p in x for q in y)
    return (lmem(a.lmem_writes, b.lmem_writes + b.lmem_reads) or lmem(b.lmem_writes, a.lmem_reads)
            or ddr(a.ddr_writes, b.ddr_writes + b.ddr_reads) or ddr(b.ddr_writes, a.ddr_reads))


def test_a_sliced_run_is_pipelined_without_reordering_any_conflict(monkeypatch, tmp_path):
    import tpuflow.lowering.compiler as compiler
    from tpuflow.lowering.timesteps import pipelined_order
    from tpuflow.options import CompileOptions
    from tpuflow.pipeline import compile_model, verify
    chip_file = small_lmem_chip(tmp_path)
    model = pointwise_chain()
    runs = []

    def recording(records, slice_of, chip):
        order = pipelined_order(records, slice_of, chip)
        runs.append((list(records), list(slice_of), order, chip))
        return order

    monkeypatch.setattr(compiler, "pipelined_order", recording)
    fp16 = CompileOptions(dtype="fp16")
    compile_model(model, chip_file, fp16)
    assert runs
    records, slice_of, order, chip = runs[-1]
    assert sorted(order) == list(range(len(records)))
    accesses = [r.instr.accesses(chip) for r in records]
    position = {node: p for p, node in enumerate(order)}
    for i in range(len(records)):
        for j in range(i + 1, len(records)):
            if _conflict(accesses[i], accesses[j]):
                assert position[i] < position[j], (i, j)
    phases = [phase_of(r.engine, a) for r, a in zip(records, accesses)]
    last_compute_of_first = max(position[i] for i in range(len(records)) if slice_of[i] == 0 and phases[i] == COMPUTE)
    first_load_of_second = min(position[i] for i in range(len(records)) if slice_of[i] == 1 and phases[i] == LOAD)
    assert first_load_of_second < last_compute_of_first      # slice 1 loads while slice 0 computes
    assert verify(model, chip_file, fp16, race_check=True)["ok"]
