"""Transposes that move the innermost axis and concats of short runs go through LMEM (long DMA runs,
TIU CW transpose / strided copy): numerics against onnxruntime for hypothesis-drawn shapes and
permutations, and the DMA runs they emit are long."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from onnx import TensorProto, helper

from tpuflow.isa import CwBcTiu, TensorDma
from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model, verify


def _model(op, in_shapes, out_shape, **attrs):
    names = [f"x{i}" for i in range(len(in_shapes))]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in zip(names, in_shapes)]
    graph = helper.make_graph([helper.make_node(op, names, ["y"], name="n0", **attrs)], "m", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def transpose_model(shape, perm):
    return _model("Transpose", [shape], [shape[p] for p in perm], perm=list(perm))


def concat_model(shapes, axis):
    out = list(shapes[0])
    out[axis] = sum(s[axis] for s in shapes)
    return _model("Concat", shapes, out, axis=axis)


def check(model, dtype="fp32"):
    result = verify(model, None, CompileOptions(dtype=dtype), race_check=True)
    assert result["ok"], result["outputs"]
    if dtype == "fp32":
        assert result["outputs"][0]["max_abs_err"] == 0.0      # data movement is exact


SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(shape=st.lists(st.integers(1, 70), min_size=2, max_size=4), data=st.data())
def test_transpose_any_perm_matches_onnxruntime(shape, data):
    perm = data.draw(st.sampled_from(list(itertools.permutations(range(len(shape))))))
    check(transpose_model(tuple(shape), perm))


@SETTINGS
@given(rows=st.integers(1, 300), widths=st.lists(st.integers(1, 5), min_size=2, max_size=4),
       inner_axis=st.booleans())
def test_concat_of_short_runs_matches_onnxruntime(rows, widths, inner_axis):
    shapes = [(1, rows, w) if inner_axis else (rows, w, 1) for w in widths]
    check(concat_model(shapes, 2 if inner_axis else 1))


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_low_precision_transpose_and_concat_exact(dtype):
    check(transpose_model((1, 40, 120), (0, 2, 1)), dtype)
    check(concat_model([(1, 700, 1), (1, 700, 3)], 2), dtype)
    check(slice_model((1, 4, 30, 30), [0, 0, 1, 0], [1, 4, 30, 30], [1, 1, 2, 2]), dtype)
    check(split_model((1, 500, 7), 2, [2, 5]), dtype)


def _dma_runs(program):
    """(shortest contiguous DDR run in elements) over the program's tensor DMAs."""
    shortest = []
    for i in program.gdma:
        if isinstance(i, TensorDma) and not i.fill_constant_en:
            for shape, strides in ((i.src_shape, i.src_strides), (i.dst_shape, i.dst_strides)):
                shortest.append(shape[3] if strides[3] == 1 else 1)
    return min(shortest)


def test_innermost_transpose_uses_cw_transpose_and_long_runs():
    _, program = compile_model(transpose_model((1, 40, 120), (0, 2, 1)))
    assert any(isinstance(i, CwBcTiu) and i.op == "cw_ts" for i in program.tiu)
    assert _dma_runs(program) >= 40


def test_size1_axis_concat_moves_long_runs():
    _, program = compile_model(concat_model([(1, 102400, 1), (1, 102400, 1)], 2))
    assert _dma_runs(program) >= 1000
    assert sum(isinstance(i, TensorDma) for i in program.gdma) <= 8


def slice_model(shape, starts, ends, steps):
    from onnx import numpy_helper
    inits = [numpy_helper.from_array(np.asarray(v, np.int64), n) for n, v in
             (("s", starts), ("e", ends), ("a", list(range(len(shape)))), ("t", steps))]
    out = [len(range(s, e, t)) for s, e, t in zip(starts, ends, steps)]
    graph = helper.make_graph([helper.make_node("Slice", ["x", "s", "e", "a", "t"], ["y"], name="n0")], "m",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def split_model(shape, axis, sizes):
    from onnx import numpy_helper
    outs = [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT,
                                          [s if a == axis else d for a, d in enumerate(shape)]) for i, s in enumerate(sizes)]
    graph = helper.make_graph([helper.make_node("Split", ["x", "sp"], [f"y{i}" for i in range(len(sizes))], axis=axis,
                                                name="n0")], "m",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))], outs,
                              [numpy_helper.from_array(np.asarray(sizes, np.int64), "sp")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@SETTINGS
@given(shape=st.lists(st.integers(2, 40), min_size=2, max_size=4), data=st.data())
def test_strided_slices_match_onnxruntime(shape, data):
    steps = [data.draw(st.integers(1, 3)) for _ in shape]
    steps[-1] = data.draw(st.integers(2, 4))                   # the innermost axis strided: the LMEM path
    starts = [data.draw(st.integers(0, d - 1)) for d in shape]
    ends = [data.draw(st.integers(s + 1, d)) for s, d in zip(starts, shape)]
    check(slice_model(tuple(shape), starts, ends, steps))


@SETTINGS
@given(rows=st.integers(2, 300), sizes=st.lists(st.integers(1, 40), min_size=2, max_size=4), inner_axis=st.booleans())
def test_split_into_short_runs_matches_onnxruntime(rows, sizes, inner_axis):
    shape = (1, rows, sum(sizes)) if inner_axis else (rows, sum(sizes), 1)
    check(split_model(shape, 2 if inner_axis else 1, sizes))


def test_focus_slice_loads_rows_not_elements():
    _, program = compile_model(slice_model((1, 8, 64, 64), [0, 0, 0, 1], [1, 8, 64, 64], [1, 1, 2, 2]))
    assert _dma_runs(program) >= 32


def test_rows_too_long_for_lmem_fall_back_to_plain_dmas():
    """A row that does not fit a lane's share of LMEM takes the DDR -> DDR path, still exact."""
    check(slice_model((1, 2, 90000), [0, 0, 1], [1, 2, 90000], [1, 1, 2]))
    check(concat_model([(1, 3, 1), (1, 3, 40000)], 2))
    check(split_model((1, 3, 40001), 2, [1, 40000]))


@SETTINGS
@given(data=st.data(), rank=st.integers(2, 4))
def test_expand_of_live_tensors_matches_onnxruntime(data, rank):
    """Broadcasts of the innermost axis (rows replicated in LMEM), of whole rows (one row read,
    repeats written from LMEM) and mixtures."""
    from onnx import numpy_helper
    out = [data.draw(st.integers(1, 9)) for _ in range(rank - 1)] + [data.draw(st.sampled_from([1, 7, 40]))]
    src = [d if data.draw(st.booleans()) else 1 for d in out]
    inits = [numpy_helper.from_array(np.asarray(out, np.int64), "s")]
    graph = helper.make_graph([helper.make_node("Neg", ["x"], ["nx"]), helper.make_node("Expand", ["nx", "s"], ["y"])],
                              "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, src)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    check(m)


def test_innermost_broadcast_expand_writes_long_runs():
    from onnx import numpy_helper
    graph = helper.make_graph([helper.make_node("Neg", ["x"], ["nx"]), helper.make_node("Expand", ["nx", "s"], ["y"])],
                              "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256, 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256, 400])],
                              [numpy_helper.from_array(np.asarray([1, 256, 400], np.int64), "s")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    _, program = compile_model(m)
    stores = [i for i in program.gdma if isinstance(i, TensorDma) and i.dst_wsize == 400]
    assert stores and all(i.dst_wstride == 1 for i in stores)
