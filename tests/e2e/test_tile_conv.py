"""Convolutions on the TILE path: which ones stay on the TIU (depthwise, fewer input channels per
group than one K fractal row), numerics against onnxruntime (race detector on)."""

from __future__ import annotations

import pytest
from onnx_build import ModelBuilder

from tpuflow.isa import AccCvt, ConvTiu, Engine, TMatmul
from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model, verify


# these tests exercise the TILE conv itself (conftest.convs_on_the_cube)
pytestmark = pytest.mark.usefixtures("convs_on_the_cube")


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_a_conv_with_fewer_input_channels_than_k0_runs_on_the_tiu(dtype):
    """An RGB stem (Cin = 3 < K0 = 8 fp32 / 16 fp16) then a 16 -> 32 conv: the stem is a TIU
    CONV (its im2col would move 3-element runs), the second conv runs on the CUBE."""
    b = ModelBuilder()
    x = b.node("Neg", [b.input("x", [1, 3, 16, 16])], "nx")
    y = b.node("Conv", [x, b.weight("w1", [16, 3, 3, 3]), b.weight("b1", [16], 0.1)], "stem", pads=[1, 1, 1, 1])
    y = b.node("Relu", [y], "r1")
    y = b.node("Conv", [y, b.weight("w2", [32, 16, 3, 3]), b.weight("b2", [32], 0.1)], "body", pads=[1, 1, 1, 1])
    b.output(y)
    model = b.model()
    _, program = compile_model(model, None, CompileOptions(dtype=dtype, matmul="tile"))
    tiu_layers = program.layer_names(Engine.TIU)[:len(program.tiu)]
    tile_layers = set(program.layer_names(Engine.TILE)[:len(program.tile)])
    convs = {layer for layer, instr in zip(tiu_layers, program.tiu) if isinstance(instr, ConvTiu)}
    assert len(convs) == 1 and not convs & tile_layers
    assert any(isinstance(i, TMatmul) for i in program.tile) and len(tile_layers - {""}) == 1
    result = verify(model, None, CompileOptions(dtype=dtype, matmul="tile"), race_check=True)
    assert result["ok"], result["outputs"]


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("act", [None, "Relu", "Sigmoid"])
def test_a_conv_bias_followed_only_by_relu_is_added_in_the_acc(act, dtype):
    """Conv (+ bias) [+ activation] with Cin >= K0 on the CUBE: with no activation or a Relu the
    bias enters the ACC as [bias_hi | bias_lo] . ones (a K = 2 TMATMUL per output tile; Relu commutes
    with rounding, so the result leaves the ACC in the model's dtype); another activation keeps the
    fp32 TIU epilogue (no K = 2 step). Numerics against onnxruntime either way."""
    b = ModelBuilder()
    x = b.node("Neg", [b.input("x", [1, 32, 12, 12])], "nx")
    y = b.node("Conv", [x, b.weight("w", [48, 32, 3, 3]), b.weight("b", [48], 0.5)], "c", pads=[1, 1, 1, 1])
    if act:
        y = b.node(act, [y], "a")
    b.output(y)
    model = b.model()
    _, program = compile_model(model, None, CompileOptions(dtype=dtype, matmul="tile"))
    # the K = 2 bias step reads the sticky ones tile (.reuse) and a sticky or streamed bias tile
    bias_steps = [i for i in program.tile if isinstance(i, TMatmul) and i.k == 2 and i.reuse1]
    firsts = [i for i in program.tile if isinstance(i, TMatmul) and not i.accumulates]
    assert bool(bias_steps) == (act != "Sigmoid")
    if bias_steps:
        assert firsts == bias_steps            # every output tile starts from the bias
    result = verify(model, None, CompileOptions(dtype=dtype, matmul="tile"), race_check=True)
    assert result["ok"], result["outputs"]


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_a_conv_residual_and_relu_leave_the_acc_in_the_model_dtype(dtype):
    """Conv + bias + Add(skip) + Relu (a ResNet block's tail) on the CUBE: the bias and the skip
    tensor both enter the ACC (K = 2 bias step, then R . I or I . R with R read from NCHW), only the Relu runs
    on the TIU; numerics against onnxruntime."""
    b = ModelBuilder()
    x = b.node("Neg", [b.input("x", [1, 32, 10, 10])], "nx")
    y = b.node("Conv", [x, b.weight("w", [32, 32, 3, 3]), b.weight("b", [32], 0.5)], "c", pads=[1, 1, 1, 1])
    b.output(b.node("Relu", [b.node("Add", [y, x], "add")], "r"))
    model = b.model()
    _, program = compile_model(model, None, CompileOptions(dtype=dtype, matmul="tile"))
    matmuls = [i for i in program.tile if isinstance(i, TMatmul)]
    bias_steps = [i for i in matmuls if i.k == 2 and not i.accumulates]
    # R . I (R an A tile) or I . R (R a B tile, channel rows whole fractals): R comes from queue N (code 48..63)
    residual_steps = [i for i in matmuls if i.accumulates and 3 in (i.src0 // 16, i.src1 // 16)]
    assert bias_steps and len(residual_steps) == len(bias_steps)
    result = verify(model, None, CompileOptions(dtype=dtype, matmul="tile"), race_check=True)
    assert result["ok"], result["outputs"]


def _block_model(cin: int = 32):
    """Neg, a 3x3 conv + Relu, then a 1x1 conv + bias + Add(the first conv's result) + Relu: two convs
    whose activations a layer group keeps in LMEM."""
    b = ModelBuilder(seed=cin)
    x = b.node("Neg", [b.input("x", [1, cin, 12, 12])], "nx")
    y1 = b.node("Relu", [b.node("Conv", [x, b.weight("w1", [32, cin, 3, 3]), b.weight("b1", [32], 0.2)], "c1",
                                pads=[1, 1, 1, 1])], "r1")
    y2 = b.node("Conv", [y1, b.weight("w2", [32, 32, 1, 1]), b.weight("b2", [32], 0.2)], "c2")
    b.output(b.node("Relu", [b.node("Add", [y2, y1], "add")], "r2"))
    return b.model()


def _ddr_stores(program) -> list[str]:
    """The layer of every GDMA data command from LMEM to DDR."""
    from tpuflow.hwmodel.timing.segments import transfer_sides
    out = []
    for instr, layer in zip(program.gdma, program.layer_names(Engine.GDMA)):
        try:
            src, dst = transfer_sides(instr, program.chip)
        except TypeError:
            continue
        if src is not None and src.lmem and not dst.lmem:
            out.append(layer)
    return out


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_consecutive_tile_engine_keep_their_activations_in_lmem(dtype):
    """Both convs on the CUBE inside one layer group: the first reads the Neg result from LMEM and writes
    its result there, the second reads it as its input and as its residual (I . R from LMEM); the only
    stores to DDR are the output's (no activation round trip), and the numbers match onnxruntime."""
    model = _block_model()
    options = CompileOptions(dtype=dtype, matmul="tile")
    _, program = compile_model(model, None, options)
    tile_layers = set(program.layer_names(Engine.TILE)[:len(program.tile)])
    assert {"conv_1", "conv_3"} <= tile_layers
    assert not any(isinstance(i, ConvTiu) for i in program.tiu)
    stores = _ddr_stores(program)
    # the output only: the second conv's group (its Relu is the ACCCVTs', tile.acccvt_relu)
    assert stores and set(stores) == {"conv_3"}
    assert any(isinstance(i, AccCvt) and i.relu for i in program.tile)
    result = verify(model, None, options, race_check=True)
    assert result["ok"], result["outputs"]


def test_a_conv_the_cube_cannot_read_from_lmem_runs_on_the_tiu():
    """fp16, 24 input channels (1.5 K fractals: no implicit GEMM) whose input a layer group keeps in LMEM:
    the TILE conv's im2col needs it in DDR, so the TIU conv takes it (no round trip); exact."""
    model = _block_model(24)
    options = CompileOptions(dtype="fp16", matmul="tile")
    _, program = compile_model(model, None, options)
    convs = {layer for layer, instr in zip(program.layer_names(Engine.TIU), program.tiu) if isinstance(instr, ConvTiu)}
    assert convs == {"conv_1"}
    assert "conv_3" in set(program.layer_names(Engine.TILE)[:len(program.tile)])
    assert verify(model, None, options, race_check=True)["ok"]


@pytest.mark.parametrize("cheaper", ["tile", "tiu"])
def test_the_cost_choice_takes_the_engine_the_timing_model_prefers(cheaper, monkeypatch):
    """ENGINE_CHOICE "cost": every conv the cube can take runs where TileEngineChoice._cost (its plan's
    instructions alone on the timing model) is lower; here the costs are forced one way, then the other."""
    from tpuflow.lowering.ops import tilemm
    monkeypatch.setattr(tilemm, "ENGINE_CHOICE", "cost")
    monkeypatch.setattr(tilemm.TileEngineChoice, "_cost",
                        lambda self, plan: int(isinstance(plan, tilemm.TileConvPlan) == (cheaper == "tiu")))
    model = _block_model()
    _, program = compile_model(model, None, CompileOptions(dtype="fp16", matmul="tile"))
    on_tiu = {layer for layer, instr in zip(program.layer_names(Engine.TIU), program.tiu) if isinstance(instr, ConvTiu)}
    on_tile = {layer for layer, instr in zip(program.layer_names(Engine.TILE), program.tile) if isinstance(instr, TMatmul)}
    assert (on_tiu, on_tile) == ((set(), {"conv_1", "conv_3"}) if cheaper == "tile" else ({"conv_1", "conv_3"}, set()))
