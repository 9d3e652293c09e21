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
