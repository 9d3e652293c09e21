"""ConvTranspose (1-D, 2-D and 3-D) as canonical ops: when kernel == stride (no dilation, no output
padding) the canonical ConvTranspose (each input pixel becomes a kernel-sized block; 2-D, group 1)
or a 1x1 Conv producing every kernel tap, then a pixel shuffle, and a crop; otherwise zero
insertion between input elements, then a stride-1 Conv with the flipped, transposed kernel whose
padding is (k - 1) * d - pad (negative parts cropped from the output)."""

from __future__ import annotations

import numpy as np

from tpuflow.frontend.imp_spatial import conv2d, conv3d
from tpuflow.frontend.onnx_view import ONode
from tpuflow.frontend.ops import OpKind
from tpuflow.frontend.registry import Facts, importer
from tpuflow.frontend.rewrite import Rewriter

K = OpKind


def _geometry(node: ONode, in_hw, kernel, out_hw):
    """(strides, dilations, output_padding, begins, ends) per axis; pads derived from output_shape /
    auto_pad the way onnxruntime does (the output shape inferred by onnx is authoritative)."""
    n = len(kernel)
    strides = [int(s) for s in node.attr("strides") or [1] * n]
    dil = [int(d) for d in node.attr("dilations") or [1] * n]
    extra = [int(p) for p in node.attr("output_padding") or [0] * n]
    pads = [int(p) for p in node.attr("pads") or [0] * (2 * n)]
    begins, ends = pads[:n], pads[n:]
    if node.attr("output_shape") is not None or node.attr("auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER"):
        for i in range(n):
            total = strides[i] * (in_hw[i] - 1) + extra[i] + (kernel[i] - 1) * dil[i] + 1 - out_hw[i]
            small = total // 2
            lower = node.attr("auto_pad", "NOTSET") != "SAME_UPPER"
            begins[i], ends[i] = (total - small, small) if lower else (small, total - small)
    return strides, dil, extra, begins, ends


def _as_conv_weights(w: np.ndarray, group: int, flip: bool) -> np.ndarray:
    """[Cin, Cout/g, kh, kw] -> [Cout, Cin/g, kh, kw] (group-major), optionally spatially flipped."""
    cin, og = w.shape[:2]
    cg = cin // group
    out = w.reshape(group, cg, og, *w.shape[2:]).swapaxes(1, 2).reshape(group * og, cg, *w.shape[2:])
    return np.ascontiguousarray(out[(slice(None), slice(None)) + (slice(None, None, -1),) * (w.ndim - 2)] if flip
                                else out)


def _crop(rw: Rewriter, x: str, begins, ends, out: str | None) -> str:
    dims = rw.shape(x)
    for i, (b, e) in enumerate(zip(begins, ends)):
        axis = 2 + i
        if b or e:
            x = rw.slice(x, axis, b, dims[axis] - e)
    return rw.reshape(x, rw.shape(x), out=out) if out else x


# The canonical ConvTranspose computes its output channels on lanes, one conv per kernel tap; with
# fewer output channels than this (1/8 of the 64 lanes of the SG2260 / BM1684X family, the lowering's
# STARVED_FILL for row groups) the tap-stacked 1x1 Conv (O * kh * kw channels) fills more lanes and
# is faster even with its pixel shuffle in DDR (PP-OCRv4 det's last upsampling, 1 channel: 127 us
# decomposed vs 320 us + a one-lane Sigmoid epilogue as the canonical op)
DECONV_MIN_CHANNELS = 8
SPREAD_MAX_ELEMENTS = 1 << 20    # the 0/1 interleave matrix [W, kw*W] up to this size (4 MB at fp32)


def _pixel_shuffle(rw, x, w, bias, group, begins, ends, out):
    """kernel == stride: y[n, o, i*kh + a, j*kw + b] = sum_c x[n, c, i, j] W[c, o, a, b] (+ B[o]): a 1x1
    Conv computes every tap, then the taps are interleaved into the output."""
    n, c, h, wd = rw.shape(x)
    kh, kw = w.shape[2:]
    if group == 1 and len(w.shape) == 4 and w.shape[1] >= DECONV_MIN_CHANNELS:
        inputs = [x, rw.const(w, tag="W")] + ([rw.const(bias, tag="B")] if bias is not None else [])
        cropped = any(begins) or any(ends)
        y = rw.op(K.CONV_TRANSPOSE, inputs, (n, w.shape[1], h * kh, wd * kw), None if cropped else out,
                  kernel_shape=(kh, kw), strides=(kh, kw))
        return _crop(rw, y, begins, ends, out) if cropped else y
    conv_w = _as_conv_weights(w, group, flip=False)                  # [O, Cg, kh, kw]
    o = conv_w.shape[0]
    if group == 1 and wd * kw * wd <= SPREAD_MAX_ELEMENTS:
        return _interleave_by_matmul(rw, x, conv_w, bias, begins, ends, out)
    taps = conv_w.transpose(0, 2, 3, 1).reshape(o * kh * kw, -1, 1, 1)
    tap_bias = None if bias is None else np.repeat(bias, kh * kw)
    y = conv2d(rw, x, np.ascontiguousarray(taps), tap_bias, (n, o * kh * kw, h, wd), (1, 1), (1, 1), (0, 0, 0, 0),
               group)
    y = rw.transpose(rw.reshape(y, (n, o, kh, kw, h, wd)), (0, 1, 4, 2, 5, 3))
    return _crop(rw, rw.reshape(y, (n, o, h * kh, wd * kw)), begins, ends, out)


def _interleave_by_matmul(rw, x, conv_w, bias, begins, ends, out):
    """Taps ordered (b, o, a) so each kernel column b is one contiguous block; block b times the 0/1
    matrix S_b [W, kw*W] (S_b[j, j*kw + b] = 1) puts its columns in place, the blocks add up, and
    only the row interleave (a past H, runs of kw*W elements) is left to a Transpose. Replaces a
    Transpose that moves the innermost axis (1x96x80x80 k2 s2: 3956 -> 525 us simulated)."""
    n, c, h, wd = rw.shape(x)
    o, _, kh, kw = conv_w.shape
    taps = conv_w.transpose(3, 0, 2, 1).reshape(kw * o * kh, c, 1, 1)
    tap_bias = None if bias is None else np.tile(np.repeat(bias, kh), kw)
    y = conv2d(rw, x, np.ascontiguousarray(taps), tap_bias, (n, kw * o * kh, h, wd), (1, 1), (1, 1), (0, 0, 0, 0), 1)
    rows = o * kh * h
    blocks = rw.reshape(y, (n, kw, rows, wd))
    total = rw.interleave_columns([rw.reshape(rw.slice(blocks, 1, b, b + 1), (n, rows, wd)) for b in range(kw)])
    rows_last = rw.transpose(rw.reshape(total, (n, o, kh, h, kw * wd)), (0, 1, 3, 2, 4))
    return _crop(rw, rw.reshape(rows_last, (n, o, h * kh, wd * kw)), begins, ends, out)


def _spread(rw: Rewriter, x: str, strides) -> str:
    """stride - 1 zeros between neighbours on every spatial axis: view [.., d, 1, ..], Pad, view, crop."""
    n, c, *sizes = rw.shape(x)
    if all(s == 1 for s in strides):
        return x
    split = (n, c) + tuple(v for d in sizes for v in (d, 1))
    rank = len(split)
    ends = [0] * rank
    for i, s in enumerate(strides):
        ends[3 + 2 * i] = s - 1
    wide = (n, c) + tuple(d * s for d, s in zip(sizes, strides))
    spread = rw.reshape(rw.pad(rw.reshape(x, split), [0] * rank + ends), wide)
    for i, (d, s) in enumerate(zip(sizes, strides)):
        spread = rw.slice(spread, 2 + i, 0, (d - 1) * s + 1)
    return spread


def _zero_insertion(rw, x, w, bias, group, strides, dil, extra, begins, ends, out):
    x = _spread(rw, x, strides)
    full = [(k - 1) * d for k, d in zip(w.shape[2:], dil)]
    lo = [f - b for f, b in zip(full, begins)]
    hi = [f - e + p for f, e, p in zip(full, ends, extra)]
    conv_w = _as_conv_weights(w, group, flip=True)
    n, _, *sizes = rw.shape(x)
    pb, pe = [max(v, 0) for v in lo], [max(v, 0) for v in hi]
    out_sizes = tuple(d + b + e - f for d, b, e, f in zip(sizes, pb, pe, full))
    out_shape = (n, conv_w.shape[0]) + out_sizes
    ones = (1,) * len(sizes)
    if len(sizes) == 3:
        y = conv3d(rw, x, conv_w, bias, out_shape, ones, tuple(dil), pb, pe, group)
    else:
        y = conv2d(rw, x, conv_w, bias, out_shape, ones, tuple(dil), (*pb, *pe), group)
    return _crop(rw, y, [max(-v, 0) for v in lo], [max(-v, 0) for v in hi], out)


def _check(node: ONode, facts: Facts) -> str | None:
    r = facts.rank(node.input(0))
    return f"{r - 2}-D input" if r is not None and r not in (3, 4, 5) else None


@importer("ConvTranspose", const_inputs=((1, "weights"), (2, "bias")), check=_check)
def conv_transpose(node: ONode, ctx) -> None:
    x, y = node.input(0), node.outputs[0]
    w = ctx.const(node.input(1))
    bias = ctx.const(node.input(2)) if ctx.has_input(2) else None
    group = int(node.attr("group", 1))
    rw = Rewriter(ctx)
    one_d = ctx.rank(x) == 3
    if ctx.rank(x) not in (3, 4, 5):
        ctx.unsupported(f"{ctx.rank(x) - 2}-D input")
        return
    if one_d:
        n, c, length = ctx.shape(x)
        x, w = rw.reshape(x, (n, c, 1, length)), w[:, :, None, :]
    kernel, out_shape = list(w.shape[2:]), ctx.shape(y)
    in_hw, out_hw = ctx.shape(x)[2:], (out_shape[2:] if not one_d else (1, out_shape[2]))
    strides, dil, extra, begins, ends = _geometry(_as_2d(node) if one_d else node, in_hw, kernel, out_hw)
    target = None if one_d else y
    if strides == kernel and dil == [1, 1] and extra == [0, 0] and len(kernel) == 2:
        result = _pixel_shuffle(rw, x, w, bias, group, begins, ends, target)
    else:
        result = _zero_insertion(rw, x, w, bias, group, strides, dil, extra, begins, ends, target)
    if one_d:
        rw.reshape(result, out_shape, out=y)


def _as_2d(node: ONode) -> ONode:
    """The node's 1-D window attributes with a leading unit axis."""
    attrs = dict(node.attrs)
    for key, unit in (("strides", 1), ("dilations", 1), ("output_padding", 0), ("output_shape", 1)):
        if attrs.get(key) is not None:
            attrs[key] = [unit, *attrs[key]]
    if attrs.get("pads") is not None:
        b, e = attrs["pads"]
        attrs["pads"] = [0, b, 0, e]
    return ONode(node.name, node.op_type, node.domain, node.inputs, node.outputs, attrs, node.proto)
