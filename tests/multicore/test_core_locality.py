"""Data crossing cores (lowering.cores): the barrier rule (a group waits only when one of its
cores touches DDR another core wrote, or writes DDR another read, since the last barrier) against
a brute-force replay of set accesses; the crossing-tensor rule (a core reads what another wrote)
likewise; and whole programs: activations whose parts stay on their core stay in its LMEM, fewer
barriers than groups, and the result still matches onnxruntime with the race detector on."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuflow.isa import SysTiu
from tpuflow.lowering.cores import CELL_BYTES, CrossCoreHazards, crossing_tensors
from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model, verify

CELLS = 24
cells = st.lists(st.integers(0, CELLS - 1), max_size=6)
group = st.lists(st.tuples(cells, cells), min_size=2, max_size=3)      # per core: (reads, writes)


def _brute_barriers(groups) -> list[bool]:
    """Replay with plain sets: since the last barrier, who wrote and who read each cell."""
    wrote, read, out = {}, {}, []
    for cores in groups:
        need = any(any(wrote.get(c, {k}) - {k} for c in set(r) | set(w)) or any(read.get(c, {k}) - {k} for c in w)
                   for k, (r, w) in enumerate(cores))
        if need:
            wrote, read = {}, {}
        for k, (r, w) in enumerate(cores):
            for c in w:
                wrote.setdefault(c, set()).add(k)
            for c in r:
                read.setdefault(c, set()).add(k)
        out.append(need)
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(group, min_size=1, max_size=6).filter(lambda gs: len({len(g) for g in gs}) == 1))
def test_barriers_exactly_where_a_core_touches_another_cores_data(groups):
    hazards, got = CrossCoreHazards(CELLS * CELL_BYTES), []
    for cores in groups:
        arrays = [(np.array(r, np.int64), np.array(w, np.int64)) for r, w in cores]
        need = any(hazards.conflicts(k, r, w) for k, (r, w) in enumerate(arrays))
        if need:
            hazards.barrier()
        for k, (r, w) in enumerate(arrays):
            hazards.record(k, r, w)
        got.append(need)
    assert got == _brute_barriers(groups)


@settings(max_examples=300, deadline=None)
@given(st.lists(group, min_size=1, max_size=6).filter(lambda gs: len({len(g) for g in gs}) == 1))
def test_a_tensor_crosses_when_a_core_reads_cells_another_core_wrote_last(groups):
    spans = {"a": (0, 8), "b": (8, 16), "c": (16, 24)}
    per_group = [[(np.array(r, np.int64), np.array(w, np.int64)) for r, w in cores] for cores in groups]
    reads = [["a", "b", "c"]] * len(groups)
    last, expected = {}, set()
    for cores in groups:
        for k, (r, _) in enumerate(cores):
            expected |= {t for t, (lo, hi) in spans.items() for c in r if lo <= c < hi and last.get(c, k) != k}
        for k, (_, w) in enumerate(cores):
            last.update(dict.fromkeys(w, k))
    crossing, gathered = crossing_tensors(per_group, reads, spans, CELLS * CELL_BYTES)
    assert crossing == expected and gathered <= crossing


def _barriers(program) -> list[int]:
    return [sum(1 for i in core.tiu if isinstance(i, SysTiu) and i.op == "wait_msg") for core in program.cores]


def test_attention_of_a_cores_heads_stays_in_its_lmem_and_barriers_only_where_data_crosses(split_lowering):
    _, program = compile_model("bert_layer", "sg2260", CompileOptions(dtype="fp16", cores=4))
    assert all(len(core.tiu) > 2 for core in program.cores)                   # split, not on core 0 alone
    resident = {t for lg in program.layer_groups for t in lg["resident"]}
    assert {"attention/query/bias", "attention/key/bias", "attention/value/bias", "attention/scale",
            "attention/softmax"} <= resident
    groups = len(program.core_split[0]["groups"])
    waits = _barriers(program)
    assert len(set(waits)) == 1 and 0 < waits[0] < groups - 1


@pytest.mark.parametrize("model, cores", [("bert_layer", 4), ("small_cnn", 4), ("llama_mlp", 2)])
def test_programs_with_core_local_layer_groups_match_onnxruntime(model, cores, split_lowering):
    result = verify(model, "sg2260", CompileOptions(dtype="fp16", cores=cores), race_check=True)
    assert result["ok"], result


def test_a_model_whose_split_is_slower_runs_on_core_0_and_the_others_idle():
    from tpuflow.hwmodel.timing import simulate
    from tpuflow.lowering.compiler import lower_split
    from tpuflow.pipeline import load_graph
    options = CompileOptions(dtype="fp16", cores=2, schedule="program")
    _, program = compile_model("gpt_block", "sg2260", options)
    _, one = compile_model("gpt_block", "sg2260", CompileOptions(dtype="fp16", schedule="program"))
    split = lower_split(load_graph("gpt_block"), program.chip, options)
    assert simulate(split).total_ps > simulate(one).total_ps          # splitting it costs more than it gains
    assert program.core_count == 2 and program.core(1).tiu == [SysTiu(op="end")]
    assert program.core(0).tiu == one.tiu and program.core(0).gdma == one.gdma
    assert simulate(program).total_ps == simulate(one).total_ps


def test_a_split_program_is_the_same_every_time(tmp_path):
    from tpuflow.cli import main
    for d in ("a", "b"):
        assert main(["compile", "bert_layer", "--cores", "4", "--dtype", "fp16", "-o", str(tmp_path / d)]) == 0
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert len(names) == 14 and names == sorted(p.name for p in (tmp_path / "b").iterdir())
    assert all((tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes() for n in names)
