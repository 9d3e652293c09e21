"""1-D / 3-D convolutions and pools, ConvTranspose, DepthToSpace / SpaceToDepth rewritten into 2-D
canonical ops: same values as onnxruntime on the original, over hypothesis-drawn attributes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st
from frontend_util import assert_canonical_matches, kinds
from op_models import node_model, weights

FAST = settings(max_examples=15, deadline=None, derandomize=True)
rng = np.random.default_rng(5)


def check(model):
    graph = assert_canonical_matches(model, rtol=1e-4, atol=1e-5)
    for n in graph.nodes():
        if n.op_type in ("Conv", "MaxPool", "AveragePool"):
            assert len(graph.tensor(n.inputs[0]).shape) == 4
    return graph


def out_len(size, k, s, d, b, e):
    return (size + b + e - d * (k - 1) - 1) // s + 1


@FAST
@given(k=st.integers(1, 4), s=st.integers(1, 3), d=st.integers(1, 2), b=st.integers(0, 2), e=st.integers(0, 2),
       group=st.sampled_from([1, 2]), bias=st.booleans(), auto=st.sampled_from(["NOTSET", "SAME_UPPER", "VALID"]))
def test_conv_1d(k, s, d, b, e, group, bias, auto):
    assume(out_len(13, k, s, d, b, e) > 0)
    consts = {"w": weights(rng, 6, 4 // group, k)} | ({"b": weights(rng, 6)} if bias else {})
    attrs = dict(strides=[s], dilations=[d], group=group)
    attrs.update(pads=[b, e]) if auto == "NOTSET" else attrs.update(auto_pad=auto)
    check(node_model("Conv", {"x": (2, 4, 13)}, consts, **attrs))


@FAST
@given(kd=st.integers(1, 3), sd=st.integers(1, 2), dd=st.integers(1, 2), pd=st.integers(0, 1),
       group=st.sampled_from([1, 2]), bias=st.booleans())
def test_conv_3d(kd, sd, dd, pd, group, bias):
    consts = {"w": weights(rng, 4, 4 // group, kd, 3, 2)} | ({"b": weights(rng, 4)} if bias else {})
    graph = check(node_model("Conv", {"x": (1, 4, 6, 5, 5)}, consts, strides=[sd, 2, 1], dilations=[dd, 1, 2],
                             pads=[pd, 1, 0, pd, 1, 1], group=group))
    assert kinds(graph).count("Conv") == kd


@FAST
@given(op=st.sampled_from(["MaxPool", "AveragePool"]), k=st.integers(1, 3), s=st.integers(1, 3),
       pad=st.integers(0, 1), ceil=st.integers(0, 1), include=st.integers(0, 1), rank=st.sampled_from([3, 5]))
def test_pools_1d_3d(op, k, s, pad, ceil, include, rank):
    assume(pad < k)
    n = rank - 2
    attrs = dict(kernel_shape=[k] * n, strides=[s] * n, pads=[pad] * (2 * n), ceil_mode=ceil)
    if op == "AveragePool":
        attrs["count_include_pad"] = include
        assume(not (ceil and include))          # ceil windows clipped with count_include_pad: ORT-specific
    check(node_model(op, {"x": (1, 3, 7, 6, 5)[:rank]}, **attrs))


@FAST
@given(kh=st.integers(1, 4), kw=st.integers(1, 3), sh=st.integers(1, 3), sw=st.integers(1, 2),
       dil=st.integers(1, 2), pad=st.integers(0, 2), extra=st.integers(0, 1), group=st.sampled_from([1, 2]),
       bias=st.booleans())
def test_conv_transpose(kh, kw, sh, sw, dil, pad, extra, group, bias):
    assume(extra < sh and extra < sw)
    pads = [pad, 0, 0, pad]
    assume(pad < kh * dil and 5 * sh + kh > 2 * pad)
    consts = {"w": weights(rng, 4, 6 // group, kh, kw)} | ({"b": weights(rng, 6)} if bias else {})
    check(node_model("ConvTranspose", {"x": (1, 4, 5, 4)}, consts, strides=[sh, sw], dilations=[dil, dil],
                     pads=pads, output_padding=[extra, extra], group=group))


@pytest.mark.parametrize("attrs", [dict(strides=[2, 2], output_shape=[10, 12]),
                                   dict(strides=[2, 2], output_shape=[11, 13], auto_pad="SAME_UPPER"),
                                   dict(strides=[2, 2], auto_pad="SAME_LOWER"),
                                   dict(strides=[2, 2], auto_pad="SAME_UPPER")])
def test_conv_transpose_output_shape_and_auto_pad(attrs):
    check(node_model("ConvTranspose", {"x": (1, 4, 5, 6)}, {"w": weights(rng, 4, 2, 3, 3)}, **attrs))


def test_conv_transpose_kernel_equal_stride_is_a_1x1_conv_and_a_shuffle():
    graph = check(node_model("ConvTranspose", {"x": (1, 8, 5, 6)}, {"w": weights(rng, 8, 4, 2, 2), "b": weights(rng, 4)},
                             strides=[2, 2]))
    conv = next(n for n in graph.nodes() if n.op_type == "Conv")
    assert conv.attrs["kernel_shape"] == (1, 1) and "Transpose" in kinds(graph) and "Pad" not in kinds(graph)
    assert kinds(graph).count("MatMul") == 2               # kernel columns interleaved by 0/1 MatMuls


@pytest.mark.parametrize("kernel,group", [((2, 2), 2), ((3, 3), 1), ((1, 2), 1), ((2, 1), 1)])
def test_conv_transpose_kernel_equal_stride_variants(kernel, group):
    consts = {"w": weights(rng, 4, 3, *kernel), "b": weights(rng, 3 * group)}
    graph = check(node_model("ConvTranspose", {"x": (1, 4, 5, 6)}, consts, strides=list(kernel), group=group))
    assert ("MatMul" in kinds(graph)) == (group == 1)


@pytest.mark.parametrize("strides,pads", [([2], [1, 1]), ([2], [0, 0]), ([3], [0, 2])])
def test_conv_transpose_1d(strides, pads):
    check(node_model("ConvTranspose", {"x": (1, 4, 9)}, {"w": weights(rng, 4, 2, 4), "b": weights(rng, 2)},
                     strides=strides, pads=pads))


@pytest.mark.parametrize("op,mode", [("DepthToSpace", "DCR"), ("DepthToSpace", "CRD"), ("SpaceToDepth", None)])
@pytest.mark.parametrize("block", [2, 3])
def test_depth_space(op, mode, block):
    shape = (1, 2 * block * block, 3, 2) if op == "DepthToSpace" else (1, 2, 3 * block, 2 * block)
    attrs = dict(blocksize=block) | ({"mode": mode} if mode else {})
    graph = check(node_model(op, {"x": shape}, **attrs))
    # column taps (de)interleaved by MatMuls; the one Transpose moves rows only (runs of whole rows)
    assert kinds(graph).count("MatMul") == block
    assert all(len(graph.tensor(n.inputs[0]).shape) == 5 for n in graph.nodes() if n.op_type == "Transpose")


@pytest.mark.parametrize("attrs", [dict(strides=[2, 2, 2]), dict(strides=[2, 1, 2], pads=[1, 0, 1, 0, 1, 0], group=2,
                                                                 output_padding=[1, 0, 1]),
                                   dict(dilations=[2, 1, 1], pads=[0, 2, 0, 1, 0, 0])])
def test_conv_transpose_3d(attrs):
    c_out = 2 if attrs.get("group") else 3
    check(node_model("ConvTranspose", {"x": (1, 4, 3, 4, 5)}, {"w": weights(rng, 4, c_out, 3, 2, 2),
                                                                 "b": weights(rng, c_out * attrs.get("group", 1))},
                     **attrs))


@FAST
@given(s=st.integers(4, 9), taps=st.integers(1, 4), cut=st.integers(0, 3), b=st.integers(0, 3), e=st.integers(0, 3),
       bias=st.booleans())
def test_framing_conv_1d_becomes_a_stride_1_conv_over_blocks(s, taps, cut, b, e, bias):
    """STFT-style Convs (kernel 256, stride 128 in silero-vad) exceed the conv descriptor's stride
    field; as a Conv over blocks of `stride` samples they have stride 1."""
    k = max(s, taps * s - cut)
    consts = {"w": weights(rng, 5, 2, k)} | ({"b": weights(rng, 5)} if bias else {})
    graph = check(node_model("Conv", {"x": (1, 2, 11 * s + 3)}, consts, strides=[s], pads=[b, e]))
    conv = next(n for n in graph.nodes() if n.op_type == "Conv")
    assert conv.attrs["strides"] == (1, 1) and graph.tensor(conv.inputs[1]).shape[1] == 2 * s


@pytest.mark.parametrize("pads", [None, [1, 0, 1, 1]])
def test_conv_transpose_kernel_equal_stride_with_many_channels_is_the_canonical_op(pads):
    """At least DECONV_MIN_CHANNELS output channels: one canonical ConvTranspose (then a crop)."""
    attrs = dict(strides=[2, 2], **({"pads": pads} if pads else {}))
    graph = check(node_model("ConvTranspose", {"x": (1, 4, 5, 6)}, {"w": weights(rng, 4, 8, 2, 2), "b": weights(rng, 8)},
                             **attrs))
    assert kinds(graph)[0] == "ConvTranspose" and "MatMul" not in kinds(graph) and "Transpose" not in kinds(graph)
    assert ("Slice" in kinds(graph)) == bool(pads)
