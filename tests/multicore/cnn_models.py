"""Small CNNs for the multi-core CNN tests (tests/multicore/test_cnn_*.py): bottleneck residual
blocks as ResNet stacks them, built with seeded random weights."""

from __future__ import annotations

import onnx

from tpuflow.models.builder import ModelBuilder
from tpuflow.models.cnn import conv_bn


def bottlenecks(blocks: int = 2, channels: int = 128, width: int = 32, size: int = 16,
                pool: bool = True) -> onnx.ModelProto:
    """(1, channels, size, size) -> `blocks` bottlenecks (1x1 to `width`, 3x3, 1x1 back, residual
    Add, Relu) -> GlobalAveragePool (`pool`, else the last block's output is the model's)."""
    b = ModelBuilder(f"bottlenecks{blocks}x{channels}x{size}", opset=13)
    x = b.input("image", (1, channels, size, size))
    for i in range(blocks):
        y = conv_bn(b, x, f"b{i}/reduce", channels, width, 1)
        y = conv_bn(b, y, f"b{i}/conv", width, width, 3)
        y = conv_bn(b, y, f"b{i}/expand", width, channels, 1, act=None)
        y = b.op("Add", [x, y], name=f"b{i}/add")
        last = i == blocks - 1 and not pool
        x = b.op("Relu", [y], name=f"b{i}/relu", outputs=["features"] if last else 1)
    if pool:
        b.op("GlobalAveragePool", [x], name="gap", outputs=["pooled"])
        b.output("pooled", (1, channels, 1, 1))
    else:
        b.output("features", (1, channels, size, size))
    return b.build()


def saved(model: onnx.ModelProto, directory) -> str:
    """`model` written to `directory` (a test's tmp_path); its path."""
    path = f"{directory}/{model.graph.name}.onnx"
    onnx.save(model, path)
    return path
