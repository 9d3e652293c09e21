"""Tiling and placement: output tiles cover every element exactly once, LMEM use stays inside the
chip, live DDR tensors never overlap, and layers too large for any tiling get a clear error."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e"))
from onnx_build import ModelBuilder  # noqa: E402

from tpuflow.chip import load_chip
from tpuflow.errors import LoweringError
from tpuflow.frontend import load
from tpuflow.isa import TensorDma, is_lmem
from tpuflow.lowering import lower
from tpuflow.lowering.ddrplan import plan_ddr
from tpuflow.lowering.groups import form_groups
from tpuflow.lowering.tiling import steps
from tpuflow.options import CompileOptions
from tpuflow.pipeline import load_graph

CHIP = load_chip("sg2260")


@given(st.integers(1, 5000), st.integers(1, 700))
def test_steps_cover_a_range_exactly_once(total, step):
    cover = np.zeros(total, int)
    for start, size in steps(total, step):
        assert 1 <= size <= step
        cover[start:start + size] += 1
    assert (cover == 1).all()


def written_elements(program, tensor) -> np.ndarray:
    """How many times each element of a DDR tensor is written by GDMA stores."""
    t = program.memory.tensors[tensor]
    esize = 4 if t.dtype == "fp32" else 2
    counts = np.zeros(int(np.prod(t.shape)), int)
    for instr in program.gdma:
        if not isinstance(instr, TensorDma) or is_lmem(instr.dst_start_addr, program.chip):
            continue
        base = (instr.dst_start_addr - t.addr) // esize
        if not 0 <= base < counts.size:
            continue
        idx = base
        for size, stride in zip(instr.dst_shape, instr.dst_strides):
            idx = (np.asarray(idx)[..., None] + np.arange(size) * stride)
        np.add.at(counts, idx.reshape(-1), 1)
    return counts


def conv_pool_model(cin, cout, hw, k, stride, pad, group, pool):
    b = ModelBuilder()
    x = b.input("x", [1, cin, hw, hw])
    y = b.node("Conv", [x, b.weight("w", [cout, cin // group, k, k])], "c", strides=[stride] * 2, pads=[pad] * 4,
               group=group)
    y = b.node("Relu", [y], "r")
    if pool:
        y = b.node("MaxPool", [y], "p", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    b.output(y)
    return b.model()


conv_cases = st.tuples(st.sampled_from([3, 16, 64, 96, 200]), st.sampled_from([8, 64, 130, 256]),
                       st.sampled_from([7, 15, 56, 100]), st.sampled_from([1, 3, 5]), st.sampled_from([1, 2]),
                       st.booleans(), st.booleans())


SMALL_CHIP = load_chip("sg2262")          # 16 lanes, 4 MiB: real layers need several tiles


def stores_per_layer(program) -> int:
    return sum(1 for i in program.gdma if isinstance(i, TensorDma) and not is_lmem(i.dst_start_addr, program.chip))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv_cases, st.sampled_from(["fp32", "fp16"]))
def test_conv_tiles_write_every_output_once_and_fit_lmem(case, dtype):
    cin, cout, hw, k, stride, padded, pool = case
    model = conv_pool_model(cin, cout, hw, k, stride, k // 2 if padded else 0, 1, pool)
    graph = load(model)
    program = lower(graph, SMALL_CHIP, CompileOptions(dtype=dtype))
    counts = written_elements(program, graph.outputs[0])
    assert (counts == 1).all(), f"elements written {counts.min()}..{counts.max()} times"
    for info in program.layers.values():
        assert info.lmem_peak_bytes <= SMALL_CHIP.tile_window_offset


def test_a_large_conv_is_tiled_and_still_exact():
    from tpuflow.pipeline import verify
    model = conv_pool_model(64, 128, 112, 3, 1, 1, 1, True)
    program = lower(load(model), SMALL_CHIP, CompileOptions())
    assert stores_per_layer(program) >= 8
    result = verify(model, SMALL_CHIP, CompileOptions(), race_check=True)
    assert result["ok"], result["outputs"]


@pytest.mark.parametrize("model", ["resnet50", "bert_layer", "densenet121", "inception_v1", "squeezenet"])
def test_live_ddr_tensors_never_overlap(model):
    graph = load_graph(model)
    groups = form_groups(graph)
    plan = plan_ddr(graph, groups, CHIP, "fp32", 0)
    first, last = {}, {}
    for i, g in enumerate(groups):
        for n in g.nodes:
            for t in n.outputs:
                first.setdefault(t, i)
            for t in n.inputs:
                last[t] = i
    real = [t for t in plan.tensors.values() if t.role in ("activation", "input", "output", "alias")]
    for a in real:
        for b in real:
            if a.name >= b.name or plan.alias_root(a.name)[0] == plan.alias_root(b.name)[0]:
                continue
            live_a = (first.get(a.name, -1), last.get(a.name, len(groups)) if a.role in ("activation", "alias") else len(groups))
            live_b = (first.get(b.name, -1), last.get(b.name, len(groups)) if b.role in ("activation", "alias") else len(groups))
            if live_a[0] <= live_b[1] and live_b[0] <= live_a[1]:
                assert a.addr + a.nbytes <= b.addr or b.addr + b.nbytes <= a.addr, (a.name, b.name)


def test_a_row_too_long_for_lmem_is_a_clear_error():
    """(A Softmax that long is decomposed into column-chunked pieces: tests/lowering/test_long_rows.py.)"""
    b = ModelBuilder(opset=17)
    x = b.input("x", [2, 100000])
    b.output(b.node("LayerNormalization", [x, b.weight("g", (100000,)), b.weight("b", (100000,))], "n", axis=-1))
    with pytest.raises(LoweringError, match=r"100000 elements"):
        lower(load(b.model()), CHIP, CompileOptions())


def test_resident_weights_and_double_buffers_are_reported_per_layer():
    program = lower(load_graph("resnet50"), CHIP, CompileOptions())
    peaks = [info.lmem_peak_bytes for info in program.layers.values() if info.op_type == "Conv"]
    assert len(peaks) == 53 and min(peaks) > 0 and max(peaks) <= CHIP.tile_window_offset


def test_integer_inputs_read_only_as_gather_indices_stay_int32_in_ddr():
    """A 30522-row vocabulary: fp16 storage would round most token ids; int32 keeps them exact."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    from tpuflow.options import CompileOptions
    from tpuflow.pipeline import compile_model, verify
    table = numpy_helper.from_array(np.random.default_rng(0).standard_normal((30522, 8)).astype(np.float32), "emb")
    graph = helper.make_graph([helper.make_node("Gather", ["emb", "ids"], ["y"])], "g",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 8])], [table])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    _, program = compile_model(model, None, CompileOptions(dtype="fp16"))
    assert program.memory.tensors["ids"].dtype == "int32" and program.memory.tensors["ids"].nbytes == 64 * 4
    result = verify(model, None, CompileOptions(dtype="fp16"))
    assert result["ok"], result["outputs"]
