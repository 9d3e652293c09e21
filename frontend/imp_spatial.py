"""Convolutions and pools off 2-D, built from 2-D ones: 1-D as 2-D with H = 1; 3-D Conv as a sum of
2-D Convs over the depth taps; 3-D pools as a 2-D pool over (H, W) then one over depth (max and
box averages compose exactly); ConvTranspose as a 1x1 Conv + pixel shuffle when kernel == stride,
else zero insertion + a Conv with the flipped kernel; DepthToSpace / SpaceToDepth as views + Transpose."""

from __future__ import annotations

import numpy as np

from tpuflow.frontend.onnx_view import ONode
from tpuflow.frontend.ops import OpKind
from tpuflow.frontend.registry import importer
from tpuflow.frontend.rewrite import Rewriter

K = OpKind


def nd_window(node: ONode, spatial: tuple[int, ...], kernel: tuple[int, ...]):
    """(strides, dilations, begins, ends) of an N-d sliding window, auto_pad resolved."""
    n = len(kernel)
    strides = tuple(int(s) for s in node.attr("strides") or (1,) * n)
    dilations = tuple(int(d) for d in node.attr("dilations") or (1,) * n)
    auto = node.attr("auto_pad", "NOTSET")
    if auto in ("NOTSET", "VALID"):
        pads = [int(p) for p in node.attr("pads") or [0] * (2 * n)] if auto == "NOTSET" else [0] * (2 * n)
        return strides, dilations, tuple(pads[:n]), tuple(pads[n:])
    begins, ends = [], []
    for size, k, s, d in zip(spatial, kernel, strides, dilations):
        total = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
        begin = total // 2 if auto == "SAME_UPPER" else total - total // 2
        begins.append(begin)
        ends.append(total - begin)
    return strides, dilations, tuple(begins), tuple(ends)


def conv2d(rw: Rewriter, x: str, weights: np.ndarray, bias: np.ndarray | None, out_shape, strides, dilations,
           pads, group: int, out: str | None = None) -> str:
    """A canonical Conv with constant weights (and bias)."""
    inputs = [x, rw.const(weights, tag="W")] + ([rw.const(bias, tag="B")] if bias is not None else [])
    return rw.op(K.CONV, inputs, out_shape, out, kernel_shape=tuple(weights.shape[2:]), strides=tuple(strides),
                 dilations=tuple(dilations), group=int(group), pads=tuple(pads))


FRAMING_MIN_STRIDE = 4       # a 1-D Conv striding at least this far ...
FRAMING_MAX_BLOCK_TAPS = 4   # ... whose kernel spans at most this many strides is a framing transform


def conv_1d(node: ONode, ctx) -> None:
    x, y = node.input(0), node.outputs[0]
    w = ctx.const(node.input(1))
    b = ctx.const(node.input(2)) if ctx.has_input(2) else None
    (n, c, length), (_, o, lo) = ctx.shape(x), ctx.shape(y)
    (s,), (d,), (pb,), (pe,) = nd_window(node, (length,), tuple(w.shape[2:]))
    rw = Rewriter(ctx)
    group = int(node.attr("group", 1))
    if d == 1 and group == 1 and s >= FRAMING_MIN_STRIDE and s <= w.shape[2] <= FRAMING_MAX_BLOCK_TAPS * s:
        x, w, s, pb, pe = _as_blocks(rw, x, w, s, pb, pe, lo)
        n, c, length = rw.shape(x)
    # the signal runs down H (a [N, C, L, 1] view of the same bytes): layer groups slice 1-D chains
    # by rows like images
    y2 = conv2d(rw, rw.reshape(x, (n, c, length, 1)), w[:, :, :, None], b, (n, o, lo, 1), (s, 1), (d, 1),
                (pb, 0, pe, 0), group)
    rw.reshape(y2, (n, o, lo), out=y)


def _as_blocks(rw: Rewriter, x: str, w: np.ndarray, s: int, pb: int, pe: int, lo: int):
    """A framing Conv (STFT front ends: kernel 256, stride 128) as a stride-1 Conv over blocks of s
    samples: input [N, C, L] -> [N, C*s, blocks], weights [O, C, k] -> [O, C*s, ceil(k/s)]
    (zero taps past k). Returns the new input, weights, stride and pads."""
    n, c, length = rw.shape(x)
    taps = -(-w.shape[2] // s)
    blocks = lo - 1 + taps
    need = blocks * s - (length + pb)                      # samples to add (or drop) at the end
    x = rw.pad(x, (0, 0, pb, 0, 0, max(need, 0))) if pb or need > 0 else x
    if need < 0:
        x = rw.slice(x, 2, 0, blocks * s)
    framed = rw.transpose(rw.reshape(x, (n, c, blocks, s)), (0, 1, 3, 2))
    wide = np.zeros(w.shape[:2] + (taps * s,), w.dtype)
    wide[:, :, :w.shape[2]] = w
    w_blocks = wide.reshape(w.shape[0], c, taps, s).transpose(0, 1, 3, 2).reshape(w.shape[0], c * s, taps)
    return rw.reshape(framed, (n, c * s, blocks)), np.ascontiguousarray(w_blocks), 1, 0, 0


def conv_3d(node: ONode, ctx) -> None:
    x, y = node.input(0), node.outputs[0]
    w = ctx.const(node.input(1))
    b = ctx.const(node.input(2)) if ctx.has_input(2) else None
    strides, dilations, begins, ends = nd_window(node, ctx.shape(x)[2:], tuple(w.shape[2:]))
    conv3d(Rewriter(ctx), x, w, b, ctx.shape(y), strides, dilations, begins, ends, int(node.attr("group", 1)), y)


def conv3d(rw: Rewriter, x: str, w: np.ndarray, b, out_shape, strides, dilations, begins, ends, group: int,
           out: str | None = None) -> str:
    """Sum over depth taps t of Conv2D(x[:, :, t*dd + z*sd], W[:, :, t]) with depth folded into the batch."""
    (n, c, _, h, wd), (_, o, do, ho, wo) = rw.shape(x), out_shape
    (sd, sh, sw), (dd, dh, dw) = strides, dilations
    if begins[0] or ends[0]:
        x = rw.pad(x, (0, 0, begins[0], 0, 0, 0, 0, ends[0], 0, 0))
    xt = rw.transpose(x, (0, 2, 1, 3, 4))                                   # N, D, C, H, W
    total = None
    for t in range(w.shape[2]):
        taps = rw.slice(xt, 1, t * dd, t * dd + (do - 1) * sd + 1, sd)        # N, Do, C, H, W
        part = conv2d(rw, rw.reshape(taps, (n * do, c, h, wd)), np.ascontiguousarray(w[:, :, t]),
                      b if t == 0 else None, (n * do, o, ho, wo), (sh, sw), (dh, dw),
                      (begins[1], begins[2], ends[1], ends[2]), group)
        total = part if total is None else rw.add(total, part)
    return rw.transpose(rw.reshape(total, (n, do, o, ho, wo)), (0, 2, 1, 3, 4), out=out)


def _pool_attrs(kind: OpKind, node: ONode, kernel, strides, dilations, pads) -> dict:
    attrs = dict(kernel_shape=tuple(kernel), strides=tuple(strides), dilations=tuple(dilations), pads=tuple(pads))
    if kind == K.AVERAGE_POOL:
        attrs["count_include_pad"] = bool(node.attr("count_include_pad", 0))
    return attrs


def pool_nd(kind: OpKind, node: ONode, ctx) -> None:
    """1-D pools as 2-D with W = 1 (the signal down H, like 1-D convs); 3-D pools as a 2-D pool over (H, W) then one over depth."""
    x, y = node.input(0), node.outputs[0]
    kernel = tuple(int(k) for k in node.attr("kernel_shape"))
    dims, out_dims = ctx.shape(x), ctx.shape(y)
    s, d, begins, ends = nd_window(node, dims[2:], kernel)
    rw = Rewriter(ctx)
    n, c = dims[:2]
    if len(kernel) == 1:
        y2 = rw.op(kind, (rw.reshape(x, (n, c, dims[2], 1)),), (n, c, out_dims[2], 1),
                   **_pool_attrs(kind, node, (*kernel, 1), (*s, 1), (*d, 1), (begins[0], 0, ends[0], 0)))
        rw.reshape(y2, out_dims, out=y)
        return
    depth, h, w = dims[2:]
    do, ho, wo = out_dims[2:]
    plane = rw.op(kind, (rw.reshape(x, (n, c * depth, h, w)),), (n, c * depth, ho, wo),
                  **_pool_attrs(kind, node, kernel[1:], s[1:], d[1:], (begins[1], begins[2], ends[1], ends[2])))
    deep = rw.op(kind, (rw.reshape(plane, (n, c, depth, ho * wo)),), (n, c, do, ho * wo),
                 **_pool_attrs(kind, node, (kernel[0], 1), (s[0], 1), (d[0], 1), (begins[0], 0, ends[0], 0)))
    rw.reshape(deep, out_dims, out=y)


@importer("DepthToSpace")
def depth_to_space(node: ONode, ctx) -> None:
    x, y = node.input(0), node.outputs[0]
    (n, c, h, w), b = ctx.shape(x), int(node.attr("blocksize"))
    rw = Rewriter(ctx)
    crd = node.attr("mode", "DCR") == "CRD"
    split = (n, c // (b * b), b, b, h, w) if crd else (n, b, b, c // (b * b), h, w)
    if w * b * w <= INTERLEAVE_MAX_ELEMENTS:
        _depth_to_space_by_matmul(rw, rw.reshape(x, split), crd, y)
        return
    perm = (0, 1, 4, 2, 5, 3) if crd else (0, 3, 4, 1, 5, 2)
    rw.reshape(rw.transpose(rw.reshape(x, split), perm), ctx.shape(y), out=y)


INTERLEAVE_MAX_ELEMENTS = 1 << 20    # 0/1 interleave matrices [W, b*W] up to this size (4 MB at fp32)


def _depth_to_space_by_matmul(rw: Rewriter, view: str, crd: bool, y: str) -> None:
    """Column taps interleaved by 0/1 MatMuls over rows (c, a, h) or (a, c, h); only the row
    interleave (a past h, runs of b*W elements) is a Transpose."""
    dims = rw.shape(view)
    n, h, w = dims[0], dims[4], dims[5]
    b = dims[2]
    col_axis = 3 if crd else 2
    rows = [rw.slice(view, col_axis, bb, bb + 1) for bb in range(b)]
    lead = (n, dims[1], dims[2]) if crd else (n, dims[1], dims[3])        # (c, a) or (a, c)
    wide = rw.interleave_columns([rw.reshape(r, lead + (h, w)) for r in rows])     # [n, ., ., h, b*w]
    perm = (0, 1, 3, 2, 4) if crd else (0, 2, 3, 1, 4)                    # -> [n, c, h, a, b*w]
    rw.reshape(rw.transpose(wide, perm), rw.shape(y), out=y)


@importer("SpaceToDepth")
def space_to_depth(node: ONode, ctx) -> None:
    x, y = node.input(0), node.outputs[0]
    (n, c, h, w), b = ctx.shape(x), int(node.attr("blocksize"))
    rw = Rewriter(ctx)
    if w * (w // b) <= INTERLEAVE_MAX_ELEMENTS:
        # rows: a moved before c (runs of W); columns: de-interleaved by 0/1 MatMuls; taps stacked
        rows = rw.transpose(rw.reshape(x, (n, c, h // b, b, w)), (0, 3, 1, 2, 4))         # n, a, c, h/b, w
        parts = rw.deinterleave_columns(rows, b)                                             # n, a, c, h/b, w/b
        stacked = rw.concat([rw.reshape(p, (n, b, 1, c, h // b, w // b)) for p in parts], 2)
        rw.reshape(stacked, ctx.shape(y), out=y)
        return
    moved = rw.transpose(rw.reshape(x, (n, c, h // b, b, w // b, b)), (0, 3, 5, 1, 2, 4))
    rw.reshape(moved, ctx.shape(y), out=y)
