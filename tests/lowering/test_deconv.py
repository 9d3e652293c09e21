"""ConvTranspose with kernel == stride as one canonical op and its TIU emitter: each kernel tap's
1x1 conv writes its strided positions of an LMEM output tile, so DDR sees the input and output
once; numbers match onnxruntime over channel counts past the lanes, cropping pads, batches,
folded BatchNorm, fused Relu and a residual epilogue."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tpuflow.frontend import load
from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model, verify

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e"))
from onnx_build import ModelBuilder  # noqa: E402


def _deconv(shape, cout, k, pads=None, bn=False, relu=False, seed=21):
    b = ModelBuilder(seed=seed)
    x = b.input("x", shape)
    attrs = dict(kernel_shape=[k, k], strides=[k, k], **({"pads": pads} if pads else {}))
    y = b.node("ConvTranspose", [x, b.weight("w", (shape[1], cout, k, k)), b.weight("b", (cout,))], "up", **attrs)
    if bn:
        y = b.node("BatchNormalization", [y, b.weight("s", (cout,), positive=True), b.weight("bb", (cout,)),
                                          b.weight("m", (cout,)), b.weight("v", (cout,), positive=True)], "bn")
    if relu:
        y = b.node("Relu", [y], "r")
    b.output(y)
    return b.model()


def test_kernel_equal_stride_is_one_op_with_batchnorm_folded():
    graph = load(_deconv((1, 16, 6, 7), 12, 2, bn=True, relu=True))
    assert [n.op_type for n in graph.nodes()] == ["ConvTranspose", "Relu"]


def test_few_output_channels_keep_the_tap_stacked_conv():
    """Under DECONV_MIN_CHANNELS output channels the taps stack as channels of one 1x1 Conv."""
    kinds = [n.op_type for n in load(_deconv((1, 16, 6, 7), 2, 2)).nodes()]
    assert "ConvTranspose" not in kinds and "Conv" in kinds


@pytest.mark.parametrize("shape,cout,k,pads,bn,relu,dtype", [
    ((1, 96, 20, 24), 24, 2, None, True, True, "fp16"),      # a DB-text-detector neck upsampling
    ((1, 64, 6, 7), 70, 3, [1, 1, 1, 1], False, False, "fp32"),  # channels past the lanes, cropped pads
    ((2, 130, 5, 6), 16, 2, None, True, False, "bf16"),       # input channels past the lanes, batch 2
])
def test_deconv_programs_match_onnxruntime(shape, cout, k, pads, bn, relu, dtype):
    model = _deconv(shape, cout, k, pads, bn, relu)
    result = verify(model, None, CompileOptions(dtype=dtype), race_check=True)
    assert result["ok"], result["outputs"]


def test_deconv_with_a_residual_add_epilogue_matches_onnxruntime():
    b = ModelBuilder(seed=22)
    x, skip = b.input("x", (1, 32, 8, 10)), b.input("skip", (1, 16, 16, 20))
    y = b.node("ConvTranspose", [x, b.weight("w", (32, 16, 2, 2))], "up", kernel_shape=[2, 2], strides=[2, 2])
    b.output(b.node("Relu", [b.node("Add", [y, skip], "add")], "r"))
    result = verify(b.model(), None, CompileOptions(dtype="fp16"), race_check=True)
    assert result["ok"], result["outputs"]


def test_deconv_moves_its_input_and_output_once():
    from tpuflow.estimate import estimate_report
    from tpuflow.hwmodel.timing import simulate
    model = _deconv((1, 96, 40, 40), 24, 2, bn=True, relu=True)
    _, program = compile_model(model, None, CompileOptions(dtype="fp16"))
    dram = estimate_report(program, simulate(program))["dram"]
    moved = dram["bytes_read"] + dram["bytes_written"]
    # the fp16 input read once, the fp16 output written once, the weights and bias: nothing else
    activations = (96 * 40 * 40 + 24 * 80 * 80) * 2
    constants = 96 * 24 * 4 * 2 + 24 * 4
    assert activations <= moved <= activations + 2 * constants
