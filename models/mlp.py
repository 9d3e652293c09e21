"""mlp: a three-layer perceptron (Gemm + Relu, Softmax head) with seeded random weights."""

from __future__ import annotations

import numpy as np
import onnx

from tpuflow.models.builder import ModelBuilder

BATCH, SIZES = 4, (784, 512, 256, 10)


def mlp() -> onnx.ModelProto:
    b = ModelBuilder("mlp", opset=13)
    x = b.input("x", (BATCH, SIZES[0]))
    layers = len(SIZES) - 1
    for i, (fan_in, fan_out) in enumerate(zip(SIZES, SIZES[1:])):
        w = b.normal(f"fc{i}.weight", (fan_out, fan_in), np.sqrt(2.0 / fan_in))   # torch layout, transB
        bias = b.uniform(f"fc{i}.bias", (fan_out,), -0.05, 0.05)
        x = b.op("Gemm", [x, w, bias], name=f"fc{i}", transB=1)
        if i < layers - 1:
            x = b.op("Relu", [x], name=f"relu{i}")
    b.op("Softmax", [x], name="probs", outputs=["probs"], axis=1)
    b.output("probs", (BATCH, SIZES[-1]))
    return b.build()
