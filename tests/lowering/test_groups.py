"""Fusion: the chains the lowering keeps in LMEM, on the bundled models."""

from __future__ import annotations

import pytest

from tpuflow.chip import load_chip
from tpuflow.lowering import lower
from tpuflow.lowering.groups import form_groups
from tpuflow.options import CompileOptions
from tpuflow.pipeline import load_graph


def kinds(model: str) -> list[tuple[str, tuple[str, ...]]]:
    return [(g.kind, tuple(n.op_type for n in g.nodes)) for g in form_groups(load_graph(model))]


def test_resnet_bottleneck_conv_residual_relu_is_one_group():
    groups = kinds("resnet50")
    assert ("conv", ("Conv", "Add", "Relu")) in groups          # BN folded, residual Add, Relu
    residual = [ops for kind, ops in groups if kind == "conv" and ops[:3] == ("Conv", "Add", "Relu")]
    assert len(residual) == 16                                  # every bottleneck's Add stays in LMEM
    assert ("conv", ("Conv", "Add", "Relu", "AveragePool")) in groups   # the last one pools too
    assert ("conv", ("Conv", "Relu", "MaxPool")) in groups      # the stem: Conv -> Relu -> Pool


def test_conv_relu_pool_fuses_on_tiu_not_on_tile():
    graph = load_graph("alexnet")
    tiu = [tuple(n.op_type for n in g.nodes) for g in form_groups(graph, fuse_pool=True)]
    tile = [tuple(n.op_type for n in g.nodes) for g in form_groups(graph, fuse_pool=False)]
    assert ("Conv", "Relu", "MaxPool") in tiu and ("Conv", "Relu", "MaxPool") not in tile


def test_matmul_bias_activation_is_one_group():
    assert ("matmul", ("MatMul", "Add", "Relu")) in kinds("mlp")


def test_softmax_layernorm_and_gelu_are_row_groups():
    groups = kinds("bert_layer")
    assert ("row", ("Softmax",)) in groups or any(k == "row" and "Softmax" in ops for k, ops in groups)
    assert any(k == "row" and "LayerNormalization" in ops for k, ops in groups)
    gelu = [ops for k, ops in groups if k in ("row", "matmul") and "Erf" in ops]
    assert gelu and all(op in gelu[0] for op in ("Div", "Erf", "Add", "Mul"))


def test_decomposed_rmsnorm_is_one_row_group():
    groups = kinds("llama_mlp")
    assert ("row", ("Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul")) in groups


@pytest.mark.parametrize("model", ["resnet50", "bert_layer"])
def test_program_reports_its_fused_groups(model):
    program = lower(load_graph(model), load_chip(), CompileOptions())
    assert program.fused_groups and all(len(g) > 1 for g in program.fused_groups)
    fused_layers = {name for g in program.fused_groups for name in g}
    assert {info.fused_group for name, info in program.layers.items() if name in fused_layers} - {""}


def test_attention_transposes_fold_into_the_matmuls():
    graph = load_graph("bert_layer")
    program = lower(graph, load_chip(), CompileOptions())
    transposes = [n.name for n in graph.nodes() if n.op_type == "Transpose"]
    assert transposes
    emitted = set(program.tiu_layers) | set(program.gdma_layers)
    assert not emitted & set(transposes)                  # read through strided / transposed views
    assert any(i.op_name == "mm2.nt" for i in program.tiu)


@pytest.mark.parametrize("channels, split", [(1, 3), (4, 3), (16, 2), (64, 2)])
def test_a_few_channel_map_is_cut_so_its_rows_fill_the_lanes(channels, split, tmp_path):
    """A row group over (1, C, H, W) is cut after C (rows = channels, the NCHW layout layer groups
    keep) unless that leaves most of the 64 lanes idle: a 1-channel map is cut after H instead,
    and the program still matches onnxruntime."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parents[1] / "e2e"))
    from onnx_build import ModelBuilder

    from tpuflow.pipeline import verify
    b = ModelBuilder(seed=5)
    x = b.node("Sigmoid", [b.node("Mul", [b.input("x", (1, channels, 40, 24)), b.input("y", (1, channels, 40, 24))],
                                  "m")], "s")
    b.output(x)
    graph = load_graph(b.model())
    (group,) = form_groups(graph, lanes=64)
    assert group.kind == "row" and group.split == split and len(group.nodes) == 2
    assert form_groups(graph)[0].split == 2                  # without a chip: the NCHW cut
    assert verify(b.model(), "sg2260", CompileOptions(dtype="fp16"))["ok"]
