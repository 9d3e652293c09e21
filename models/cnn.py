"""Convolutional bundled models: small_cnn and mobilenetv2 (BatchNormalization kept, as exporters
in eval mode without constant folding write it), with seeded random weights."""

from __future__ import annotations

import numpy as np
import onnx

from tpuflow.models.builder import ModelBuilder

# MobileNetV2 inverted-residual settings: expansion t, output channels c, repeats n, first stride s.
MOBILENET_V2 = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                (6, 160, 3, 2), (6, 320, 1, 1))


def conv_bn(b: ModelBuilder, x: str, name: str, cin: int, cout: int, k: int, stride: int = 1,
            group: int = 1, act: str | None = "Relu") -> str:
    """Conv (no bias) -> BatchNormalization -> activation (Relu, Relu6 as Clip, or none). Weights
    keep the activation variance: He gain 2 before a rectifier, 1 before a linear output (the
    projections of inverted residuals), so random-weight networks stay well conditioned."""
    fan_in = cin // group * k * k
    gain = 1.0 if act is None else 2.0
    w = b.normal(f"{name}.weight", (cout, cin // group, k, k), np.sqrt(gain / fan_in))
    y = b.op("Conv", [x, w], name=f"{name}/conv", kernel_shape=[k, k], strides=[stride, stride],
             pads=[k // 2] * 4, group=group)
    bn = [b.uniform(f"{name}.bn.{p}", (cout,), lo, hi)
          for p, lo, hi in (("gamma", 0.5, 1.5), ("beta", -0.1, 0.1), ("mean", -0.1, 0.1), ("var", 0.5, 1.5))]
    y = b.op("BatchNormalization", [y, *bn], name=f"{name}/bn", epsilon=1e-5)
    if act == "Relu":
        y = b.op("Relu", [y], name=f"{name}/relu")
    elif act == "Relu6":
        y = b.op("Clip", [y, "relu6.min", "relu6.max"], name=f"{name}/relu6")
    return y


def small_cnn() -> onnx.ModelProto:
    """1x3x32x32 -> 3 conv blocks (BN, Relu, MaxPool / stride) -> GlobalAveragePool -> Gemm(10)."""
    b = ModelBuilder("small_cnn", opset=13)
    x = b.input("image", (1, 3, 32, 32))
    x = conv_bn(b, x, "block1", 3, 16, 3)
    x = b.op("MaxPool", [x], name="pool1", kernel_shape=[2, 2], strides=[2, 2])
    x = conv_bn(b, x, "block2", 16, 32, 3)
    x = b.op("MaxPool", [x], name="pool2", kernel_shape=[2, 2], strides=[2, 2])
    x = conv_bn(b, x, "block3", 32, 64, 3, stride=2)
    x = b.op("GlobalAveragePool", [x], name="gap")
    x = b.op("Flatten", [x], name="flatten", axis=1)
    w = b.normal("fc.weight", (10, 64), np.sqrt(2.0 / 64))
    bias = b.uniform("fc.bias", (10,), -0.05, 0.05)
    b.op("Gemm", [x, w, bias], name="fc", outputs=["logits"], transB=1)
    b.output("logits", (1, 10))
    return b.build()


def _inverted_residual(b: ModelBuilder, x: str, name: str, cin: int, cout: int, t: int, stride: int) -> str:
    hidden = cin * t
    y = conv_bn(b, x, f"{name}/expand", cin, hidden, 1, act="Relu6") if t != 1 else x
    y = conv_bn(b, y, f"{name}/dw", hidden, hidden, 3, stride=stride, group=hidden, act="Relu6")
    y = conv_bn(b, y, f"{name}/project", hidden, cout, 1, act=None)
    if stride == 1 and cin == cout:
        y = b.op("Add", [x, y], name=f"{name}/residual")
    return y


def mobilenetv2() -> onnx.ModelProto:
    """MobileNetV2 (width 1.0) at 1x3x112x112: inverted residuals, depthwise 3x3, Relu6 = Clip(0, 6)."""
    b = ModelBuilder("mobilenetv2", opset=13)
    b.const("relu6.min", np.asarray(0.0, np.float32))
    b.const("relu6.max", np.asarray(6.0, np.float32))
    x = b.input("image", (1, 3, 112, 112))
    x = conv_bn(b, x, "stem", 3, 32, 3, stride=2, act="Relu6")
    cin, index = 32, 0
    for t, c, n, s in MOBILENET_V2:
        for i in range(n):
            x = _inverted_residual(b, x, f"block{index}", cin, c, t, s if i == 0 else 1)
            cin, index = c, index + 1
    x = conv_bn(b, x, "head", cin, 1280, 1, act="Relu6")
    x = b.op("GlobalAveragePool", [x], name="gap")
    x = b.op("Flatten", [x], name="flatten", axis=1)
    w = b.normal("classifier.weight", (1000, 1280), np.sqrt(1.0 / 1280))
    bias = b.uniform("classifier.bias", (1000,), -0.05, 0.05)
    b.op("Gemm", [x, w, bias], name="classifier", outputs=["logits"], transB=1)
    b.output("logits", (1, 1000))
    return b.build()
