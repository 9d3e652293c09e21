"""Which engine a tile-path model's products run on (lowering.ops.tilemm.ENGINE_CHOICE): with "cost",
a matrix-vector product runs on the vector unit's GEMV (not a TGEMV filling one row of every fractal),
and the whole model still matches onnxruntime; with "tile" it stays on the cube."""

from __future__ import annotations

import pytest
from onnx_build import ModelBuilder

from tpuflow.isa import Engine, TMatmul
from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model, verify


def _conv_then_classifier():
    """Neg, a 3x3 conv (32 -> 32) + Relu, flattened, then a (1 x 2048) . (2048 x 40) classifier."""
    b = ModelBuilder(seed=3)
    x = b.node("Neg", [b.input("x", [1, 32, 8, 8])], "nx")
    y = b.node("Relu", [b.node("Conv", [x, b.weight("w", [32, 32, 3, 3]), b.weight("b", [32], 0.2)], "c",
                               pads=[1, 1, 1, 1])], "r")
    flat = b.node("Reshape", [y, b.const("shape", [1, 2048])], "flat")
    b.output(b.node("MatMul", [flat, b.weight("fc", [2048, 40])], "fc_out"))
    return b.model()


@pytest.mark.parametrize("choice", ["tile", "cost"])
def test_a_matrix_vector_product_runs_on_the_tiu_only_by_cost(choice, monkeypatch):
    from tpuflow.lowering.ops import tilemm
    monkeypatch.setattr(tilemm, "ENGINE_CHOICE", choice)
    model = _conv_then_classifier()
    options = CompileOptions(dtype="fp16", matmul="tile")
    _, program = compile_model(model, None, options)
    on_tile = {layer for layer, i in zip(program.layer_names(Engine.TILE), program.tile) if isinstance(i, TMatmul)}
    assert ("matmul_4" in on_tile) == (choice == "tile"), on_tile       # the classifier
    assert verify(model, None, options, race_check=True)["ok"]
