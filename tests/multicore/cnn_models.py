"""Small CNNs for the multi-core CNN tests (tests/multicore/test_cnn_*.py): bottleneck residual
blocks as ResNet stacks them, built with seeded random weights."""

from __future__ import annotations

import numpy as np
import onnx

from tpuflow.models.builder import ModelBuilder
from tpuflow.models.cnn import conv_bn


def bottlenecks(blocks: int = 2, channels: int = 128, width: int = 32, size: int = 16,
                stem: bool = False) -> onnx.ModelProto:
    """(1, channels, size, size) -> `blocks` bottlenecks (1x1 to `width`, 3x3, 1x1 back, residual
    Add, Relu) -> GlobalAveragePool; with `stem` a 3x3 conv from 3 channels first."""
    b = ModelBuilder(f"bottlenecks{blocks}x{channels}", opset=13)
    x = b.input("image", (1, 3 if stem else channels, size, size))
    if stem:
        x = conv_bn(b, x, "stem", 3, channels, 3)
    for i in range(blocks):
        y = conv_bn(b, x, f"b{i}/reduce", channels, width, 1)
        y = conv_bn(b, y, f"b{i}/conv", width, width, 3)
        y = conv_bn(b, y, f"b{i}/expand", width, channels, 1, act=None)
        y = b.op("Add", [x, y], name=f"b{i}/add")
        x = b.op("Relu", [y], name=f"b{i}/relu")
    b.op("GlobalAveragePool", [x], name="gap", outputs=["pooled"])
    b.output("pooled", (1, channels, 1, 1))
    return b.build()
