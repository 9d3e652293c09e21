"""Row reductions over rows longer than LMEM (a global pool over a large feature map) run in
column chunks folded into an accumulator, and match onnxruntime."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model, verify

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e"))
from onnx_build import ModelBuilder  # noqa: E402


def _model(op: str):
    b = ModelBuilder(seed=5)
    y = b.node("Relu", [b.input("x", (1, 4, 256, 256))], "r")        # 65536-element rows: 256 KiB in fp32
    if op == "GlobalAveragePool":
        y = b.node(op, [y], "g")
    elif op == "ReduceMax":
        y = b.node(op, [y], "g", axes=[2, 3], keepdims=1)
    else:
        y = b.node(op, [y, b.const("axes", np.array([2, 3]))], "g", keepdims=1)
    b.output(y)
    return b.model()


@pytest.mark.parametrize("op,dtype", [("GlobalAveragePool", "fp32"), ("ReduceMax", "fp16"), ("ReduceSum", "fp32")])
def test_long_row_reductions_run_in_column_chunks(op, dtype):
    _, program = compile_model(_model(op), None, CompileOptions(dtype=dtype, schedule="program"))
    adds = [i for i in program.tiu if getattr(i, "op", "") in ("add", "max")]
    assert adds, "no accumulation of column chunks"
    result = verify(_model(op), None, CompileOptions(dtype=dtype), race_check=True)
    assert result["ok"], result["outputs"]
