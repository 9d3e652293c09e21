"""Which engine a tile-path model's products run on (lowering.ops.tilemm.ENGINE_CHOICE): with "cost",
a matrix-vector product runs on the vector unit's GEMV (not a TGEMV filling one row of every fractal),
and the whole model still matches onnxruntime; with "tile" it stays on the cube; with "fit" (the
default) a drain-bound conv runs on the TIU."""

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


def _conv(cin: int, kernel: tuple[int, int], hw: tuple[int, int] = (14, 14)):
    """Neg, a conv (cin -> 128, `kernel`, same padding along the taps) + Relu over `hw`."""
    b = ModelBuilder(seed=cin + kernel[1])
    x = b.node("Neg", [b.input("x", [1, cin, *hw])], "nx")
    pads = [(kernel[0] - 1) // 2, (kernel[1] - 1) // 2, kernel[0] // 2, kernel[1] // 2]
    conv = b.node("Conv", [x, b.weight("w", [128, cin, *kernel]), b.weight("b", [128], 0.2)], "c", pads=pads)
    b.output(b.node("Relu", [conv], "r"))
    return b.model()


@pytest.mark.parametrize("dtype, cin, kernel, hw, on_cube", [
    ("fp16", 16, (1, 2), (14, 14), False), ("fp16", 128, (1, 1), (14, 14), False), ("fp16", 32, (3, 3), (6, 60), False),
    ("fp16", 16, (3, 3), (14, 14), True), ("fp16", 32, (3, 3), (14, 14), True), ("fp32", 8, (1, 2), (14, 14), True)])
def test_fit_keeps_on_the_cube_the_convs_it_expands_on_chip(dtype, cin, kernel, hw, on_cube, monkeypatch):
    """ENGINE_CHOICE "fit" (the default) runs on the TIU a conv whose ACCCVT drain outlasts its MACs
    (K * acccvt_bytes_per_cycle < 4 * tile_macs_per_cycle: K < 128 in fp16, K < 16 in fp32 on sg2260: a
    16-channel 1x2 conv in fp16), a conv whose windows are not expanded on chip (a 1x1 conv) and one whose
    halo holds one of its channel blocks (32 channels, 60 wide: a one-row halo of 62-wide padded rows is
    5.8 KiB per 16-channel block, two do not fit a slot), any other on the cube (3x3 over 16 channels:
    K = 144, one block; 3x3 over 32 channels 14 wide: both blocks in one halo; 1x2 over 8 channels in
    fp32: K = 16); "tile" keeps every one on the cube; the model matches onnxruntime either way."""
    from tpuflow.isa import ConvTiu
    from tpuflow.lowering.ops import tilemm
    model = _conv(cin, kernel, hw)
    options = CompileOptions(dtype=dtype, matmul="tile")
    for choice, expect in (("fit", on_cube), ("tile", True)):
        monkeypatch.setattr(tilemm, "ENGINE_CHOICE", choice)
        _, program = compile_model(model, None, options)
        assert any(isinstance(i, TMatmul) for i in program.tile) == expect
        assert any(isinstance(i, ConvTiu) for i in program.tiu) == (not expect)
        assert verify(model, None, options, race_check=True)["ok"]
