"""`tpuflow verify --matmul tile` on whole models (issue 16): resnet50, squeezenet and small_cnn in fp32 / fp16
/ bf16, under --tile-engine fit (the default) and all (every conv the cube can take), race detector on; and
the tile path's routing pieces that make fit match the TIU path: a pool fused into the conv group before it
when that conv runs on the TIU, no im2col scratch for convs that do not need it."""

from __future__ import annotations

import pytest

from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model, verify


@pytest.fixture(autouse=True)
def choice_from_options(monkeypatch):
    """The engine choice comes from --tile-engine here (tests/e2e's conftest may have set the override)."""
    from tpuflow.lowering.ops import tilemm
    monkeypatch.setattr(tilemm, "ENGINE_CHOICE", None)


@pytest.mark.slow
@pytest.mark.parametrize("tile_engine", ["fit", "all"])
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("model", ["small_cnn", "squeezenet", "resnet50"])
def test_verify_tile_path(model, dtype, tile_engine):
    result = verify(model, None, CompileOptions(dtype=dtype, matmul="tile", tile_engine=tile_engine), race_check=True)
    assert result["ok"], result["outputs"]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["squeezenet", "resnet50"])
def test_verify_forced_c0_layouts(model, monkeypatch):
    """Every activation that can be NC1HWC0 made so (tilemm.C0_LAYOUTS "always"; layer groups off, so they
    live in DDR: squeezenet 8, resnet50 51 of them, residuals and stride-2 readers included), fp16 --tile-engine
    all: the result still matches onnxruntime (race detector on)."""
    from tpuflow.lowering.ops import tilemm
    from tpuflow.pipeline import verify_program
    monkeypatch.setattr(tilemm, "C0_LAYOUTS", "always")
    graph, program = compile_model(model, None, CompileOptions(dtype="fp16", matmul="tile", tile_engine="all",
                                                               layer_group="off"))
    assert sum(t.layout == "NC1HWC0" for t in program.memory.tensors.values()) == {"squeezenet": 8, "resnet50": 51}[model]
    result = verify_program(graph, program, race_check=True)
    assert result["ok"], result["outputs"]


def test_tile_fit_squeezenet_is_the_tiu_program():
    """fp16 sg2260: no SqueezeNet conv is faster on the cube (equal fp16 peaks), so --matmul tile (fit) fuses
    the stem's MaxPool into its conv group as the TIU path does and reserves no im2col scratch: the same
    instructions and memory plan as --matmul tiu, hence the same latency (127.0 us)."""
    _, tile = compile_model("squeezenet", None, CompileOptions(dtype="fp16", matmul="tile"))
    _, tiu = compile_model("squeezenet", None, CompileOptions(dtype="fp16"))
    assert tile.tiu == tiu.tiu and tile.gdma == tiu.gdma and not tile.tile
    assert tile.memory.weight_base == tiu.memory.weight_base
    assert tile.fused_groups == tiu.fused_groups


def _conv_pool_model():
    from onnx_build import ModelBuilder
    b = ModelBuilder(seed=3)
    x = b.node("Neg", [b.input("x", [1, 32, 12, 12])], "nx")
    y = b.node("Relu", [b.node("Conv", [x, b.weight("w", [32, 32, 3, 3]), b.weight("b", [32], 0.5)], "c",
                               pads=[1, 1, 1, 1])], "r")
    b.output(b.node("MaxPool", [y], "p", kernel_shape=[2, 2], strides=[2, 2]))
    return b.model()


@pytest.mark.parametrize("tile_engine, fused", [("fit", True), ("all", False)])
def test_pool_fused_only_after_a_tiu_conv(tile_engine, fused):
    """Conv + Relu + MaxPool: under fit the conv runs on the TIU on sg2260 (equal fp16 peaks) and the pool
    joins its group (one TIU conv + pool group, as on the TIU path); under all the cube takes the conv and
    the pool is a group of its own (the cube cannot pool its result tiles). Both match onnxruntime."""
    options = CompileOptions(dtype="fp16", matmul="tile", tile_engine=tile_engine)
    graph, program = compile_model(_conv_pool_model(), None, options)
    pool = next(n.name for n in graph.nodes() if n.op_type == "MaxPool")
    assert any(pool in g for g in program.fused_groups) == fused
    assert bool(program.tile) != fused
    assert verify(_conv_pool_model(), None, options, race_check=True)["ok"]
