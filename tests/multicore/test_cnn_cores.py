"""Multi-core CNNs (issue 14): spans of conv groups run in bands over the cores
(lowering.cores.band_regions) and programs that keep a CNN on core 0 but for its classifier.
The band rule's promises against the graph (hypothesis over block shapes and core counts), the
exact DDR bytes every core moves, results against onnxruntime with the race detector, and the
choice among the variants."""

from __future__ import annotations

import math
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tpuflow.lowering.compiler as compiler
from tpuflow.chip import load_chip
from tpuflow.isa import SysTiu
from tpuflow.lowering.cores import BAND_RECOMPUTE_LIMIT, band_regions, span_tensors
from tpuflow.lowering.groups import form_groups
from tpuflow.lowering.prepare import fold_matmul_transposes, materialize_broadcasts
from tpuflow.lowering.slicing import chunk, input_rows, output_height, output_of
from tpuflow.options import CompileOptions
from tpuflow.pipeline import load_graph, verify

from tests.multicore.cnn_models import bottlenecks, saved

CHIP = load_chip("sg2260")


def _groups(path: str):
    graph = materialize_broadcasts(fold_matmul_transposes(load_graph(path)))
    return graph, form_groups(graph, fuse_pool=True, lanes=CHIP.lanes)


def _weights(graph, group) -> int:
    return sum(graph.tensor(t).const.size for n in group.nodes for t in n.inputs
               if t and graph.tensor(t).const is not None)


@settings(max_examples=25, deadline=None)
@given(blocks=st.integers(1, 3), channels=st.sampled_from([32, 64, 128, 256]), width=st.sampled_from([16, 32, 64]),
       size=st.sampled_from([8, 14, 28]), cores=st.sampled_from([2, 4, 8]), lenient=st.booleans())
def test_band_spans_keep_their_promises(blocks, channels, width, size, cores, lenient):
    """Every span: consecutive groups; one band per core; the last member's bands cover its
    output rows once each, in core order; every member computes the rows the later members
    read; what leaves the span is the last member's output only; no member recomputes more
    than the limit; and (the strict rule) the weights other cores load again weigh less than
    the activations kept inside."""
    with tempfile.TemporaryDirectory() as tmp:
        graph, groups = _groups(saved(bottlenecks(blocks, channels, width, size), tmp))
    for region in band_regions(graph, groups, cores, lenient=lenient):
        members = region.members
        assert list(members) == list(range(members[0], members[-1] + 1)) and region.slices == cores
        last = members[-1]
        assert list(region.rows[last]) == [chunk(output_height(graph, groups[last]), cores, k) for k in range(cores)]
        made_by = {output_of(groups[m]): m for m in members}
        for s in range(cores):
            for m in members:
                lo, hi = region.rows[m][s]
                if hi <= lo:
                    continue
                for tensor, (a, b) in input_rows(graph, groups[m], (lo, hi)).items():
                    if tensor in made_by:
                        have = region.rows[made_by[tensor]][s]
                        assert have[0] <= a and b <= have[1], (tensor, (a, b), have)
        inside, edges = span_tensors(graph, groups, members)
        assert edges & {t for m in members for t in groups[m].produced()} <= set(groups[last].produced())
        for m in members:
            assert sum(hi - lo for lo, hi in region.rows[m]) <= BAND_RECOMPUTE_LIMIT * output_height(graph, groups[m])
        if not lenient:
            kept = sum(2 * math.prod(graph.tensor(t).shape) for t in inside)
            assert (cores - 1) * sum(_weights(graph, groups[m]) for m in members) < kept


def test_a_span_that_loads_its_weights_on_every_core_for_little_gain_is_not_banded(tmp_path):
    """Blocks at 4x4 with 256 channels keep 2 x 16 x 64 elements inside per block but would load
    their ~70k weight elements on every core: no span (the bundled ResNet-50's late stages)."""
    graph, groups = _groups(saved(bottlenecks(2, 256, 64, 4), tmp_path))
    assert band_regions(graph, groups, 4) == []


def _banded(monkeypatch, name: str = "bands"):
    """Make lower_split keep the `name` variant (whatever the timing model says)."""
    def pick(variants):
        assert name in variants, sorted(variants)
        return variants[name]
    monkeypatch.setattr(compiler, "_fastest", pick)


def _ddr_bytes(program, core: int) -> tuple[int, int, int]:
    """(weight bytes read, activation bytes read, bytes written) by one core's GDMA."""
    base = program.memory.weight_base
    wr = ar = w = 0
    for instr in program.cores[core].gdma:
        acc = instr.accesses(program.chip)
        wr += sum(r.hi - r.lo for r in acc.ddr_reads if r.lo >= base)
        ar += sum(r.hi - r.lo for r in acc.ddr_reads if r.lo < base)
        w += sum(r.hi - r.lo for r in acc.ddr_writes)
    return wr, ar, w


@pytest.mark.parametrize("blocks, cores", [(2, 2), (1, 4)])
def test_each_core_of_a_banded_program_moves_exactly_its_rows_and_the_weights_once(blocks, cores, tmp_path,
                                                                                  monkeypatch):
    """Bottlenecks (64 channels, 16 x 16) as one span: every core reads every weight once
    (the whole weight image), the input rows its band needs (the first conv's halo-widened rows,
    the residual Add's own rows) and writes its own rows of the output; nothing else touches DDR
    (the activations inside stay in its LMEM)."""
    _banded(monkeypatch)
    path = saved(bottlenecks(blocks, 64, 16, 16, pool=False), tmp_path)
    graph, groups = _groups(path)
    (region,) = band_regions(graph, groups, cores)
    assert region.members == tuple(range(len(groups)))
    program = compiler.lower_split(load_graph(path), CHIP, CompileOptions(dtype="fp16", cores=cores))
    row_bytes = 64 * 16 * 2
    for k in range(cores):
        need = 0
        for m in region.members:
            lo, hi = region.rows[m][k]
            for tensor, (a, b) in input_rows(graph, groups[m], (lo, hi)).items():
                need += (b - a) * row_bytes if tensor == "image" else 0
        own = region.rows[region.last][k]
        assert _ddr_bytes(program, k) == (len(program.memory.weight_image), need, (own[1] - own[0]) * row_bytes)


@pytest.mark.parametrize("model, cores", [((3, 64, 16, 16), 2), ((2, 128, 32, 14), 4), ((2, 64, 16, 28), 8)])
def test_banded_programs_match_onnxruntime(model, cores, tmp_path, monkeypatch):
    _banded(monkeypatch)
    result = verify(saved(bottlenecks(*model), tmp_path), "sg2260", CompileOptions(dtype="fp16", cores=cores),
                    race_check=True)
    assert result["ok"], result["outputs"]


def test_core0_but_gemv_runs_only_the_classifier_on_the_other_cores(monkeypatch):
    """small_cnn on 2 cores with everything but its classifier (a matrix-vector product) on core
    0: core 1 has the classifier's half of the columns and the barriers, and the result matches
    onnxruntime."""
    _banded(monkeypatch, "core0_but_gemv")
    from tpuflow.pipeline import compile_model
    import tpuflow.lowering as lowering
    monkeypatch.setattr(lowering, "lower", compiler.lower_split)
    _, program = compile_model("small_cnn", "sg2260", CompileOptions(dtype="fp16", cores=2))
    assert set(program.core_split[1]["groups"]) == {"fc"}
    assert program.core_split[1]["groups"]["fc"] == {"columns": [5, 10]}
    assert len(program.core_split[0]["groups"]) > 3
    result = verify("small_cnn", "sg2260", CompileOptions(dtype="fp16", cores=2), race_check=True)
    assert result["ok"], result["outputs"]


def test_lower_split_keeps_the_fastest_variant(variant_times):
    """lower_split compiles every variant and keeps the one the timing model runs fastest."""
    from tpuflow.hwmodel.timing import simulate
    program = compiler.lower_split(load_graph("small_cnn"), CHIP, CompileOptions(dtype="fp16", cores=2))
    assert {"split", "bands", "core0_but_gemv"} <= set(variant_times)
    assert simulate(program).total_ps == min(variant_times.values())


def test_a_banded_program_is_the_same_every_time(tmp_path, monkeypatch):
    _banded(monkeypatch)
    path = saved(bottlenecks(2, 64, 16, 16), tmp_path)
    a, b = (compiler.lower_split(load_graph(path), CHIP, CompileOptions(dtype="fp16", cores=4)) for _ in range(2))
    for k in range(4):
        assert a.cores[k].tiu == b.cores[k].tiu and a.cores[k].gdma == b.cores[k].gdma
    assert a.memory.weight_image == b.memory.weight_image
    assert any(isinstance(i, SysTiu) for i in a.cores[1].tiu)
    assert np.array_equal(np.frombuffer(a.memory.weight_image, np.uint8), np.frombuffer(b.memory.weight_image, np.uint8))
