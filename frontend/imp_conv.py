"""Importers of the convolution family: Conv, BatchNormalization, MaxPool, AveragePool (1-D and 3-D
through imp_spatial), LRN."""

from __future__ import annotations

import numpy as np

from tpuflow.frontend import imp_spatial
from tpuflow.frontend.onnx_view import ONode
from tpuflow.frontend.ops import OpKind
from tpuflow.frontend.registry import Facts, all_of, importer, rank_is, unused_outputs


def resolve_pads(node: ONode, in_hw: tuple[int, int], kernel, strides, dilations) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) with auto_pad resolved (ONNX pads are [h_begin, w_begin, h_end, w_end])."""
    auto = node.attr("auto_pad", "NOTSET")
    if auto == "NOTSET":
        pads = node.attr("pads") or [0, 0, 0, 0]
        return tuple(int(p) for p in pads)
    if auto == "VALID":
        return (0, 0, 0, 0)
    begins, ends = [], []
    for size, k, s, d in zip(in_hw, kernel, strides, dilations):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        begin = total // 2 if auto == "SAME_UPPER" else total - total // 2
        begins.append(begin)
        ends.append(total - begin)
    return (begins[0], begins[1], ends[0], ends[1])


def _window(node: ONode, kernel) -> tuple[tuple[int, ...], tuple[int, ...]]:
    strides = tuple(node.attr("strides") or (1,) * len(kernel))
    dilations = tuple(node.attr("dilations") or (1,) * len(kernel))
    return strides, dilations


def _conv_check(node: ONode, facts: Facts) -> str | None:
    ks = node.attr("kernel_shape")
    w_rank = facts.rank(node.input(1))
    dims = len(ks) if ks else (w_rank - 2 if w_rank else None)
    if dims is not None and dims not in (1, 2, 3):
        return f"{dims}-D convolution"
    return None


@importer("Conv", const_inputs=((1, "weights"), (2, "bias")), check=_conv_check)
def conv(node: ONode, ctx) -> None:
    x, w = node.input(0), node.input(1)
    if ctx.rank(x) in (3, 5):
        (imp_spatial.conv_1d if ctx.rank(x) == 3 else imp_spatial.conv_3d)(node, ctx)
        return
    if ctx.rank(x) != 4:
        ctx.unsupported(f"{ctx.rank(x) - 2}-D convolution")
        return
    kernel = tuple(node.attr("kernel_shape") or ctx.shape(w)[2:])
    strides, dilations = _window(node, kernel)
    pads = resolve_pads(node, ctx.shape(x)[2:], kernel, strides, dilations)
    inputs = (x, w, node.input(2)) if ctx.has_input(2) else (x, w)
    ctx.emit(OpKind.CONV, inputs, node.outputs[:1], kernel_shape=kernel, strides=strides,
             dilations=dilations, group=int(node.attr("group", 1)), pads=pads)


def _bn_check(node: ONode, facts: Facts) -> str | None:
    if node.attr("training_mode", 0):
        return "training mode"
    return unused_outputs(1, "training outputs used")(node, facts)


@importer("BatchNormalization", check=_bn_check,
          const_inputs=((1, "scale"), (2, "bias"), (3, "mean"), (4, "variance")))
def batch_norm(node: ONode, ctx) -> None:
    """y = (x - mean) / sqrt(var + eps) * gamma + beta as Mul + Add with [C,1,1] constants; the
    canonical pass folds them into a preceding Conv when legal."""
    x, y = node.input(0), node.outputs[0]
    gamma, beta, mean, var = (ctx.const(node.input(i)).astype(np.float64) for i in range(1, 5))
    scale = gamma / np.sqrt(var + float(node.attr("epsilon", 1e-5)))
    shift = beta - mean * scale
    shape = (ctx.shape(x)[1],) + (1,) * (ctx.rank(x) - 2)
    dtype = ctx.dtype(x)
    s = ctx.add_const("scale", scale.astype(dtype).reshape(shape))
    t = ctx.add_const("shift", shift.astype(dtype).reshape(shape))
    scaled = ctx.temp("scaled", ctx.shape(x), dtype)
    ctx.emit(OpKind.MUL, (x, s), (scaled,))
    ctx.emit(OpKind.ADD, (scaled, t), (y,), suffix="shift")


def _pool_attrs(node: ONode, ctx, x: str) -> dict:
    kernel = tuple(int(k) for k in node.attr("kernel_shape"))
    strides, dilations = _window(node, kernel)
    pads = resolve_pads(node, ctx.shape(x)[2:], kernel, strides, dilations)
    return dict(kernel_shape=kernel, strides=strides, dilations=dilations, pads=pads)


def _pool_rank(node: ONode, facts: Facts) -> str | None:
    r = facts.rank(node.input(0))
    return f"{r}-D input" if r is not None and r not in (3, 4, 5) else None


@importer("MaxPool", check=all_of(_pool_rank, unused_outputs(1, "indices output used")))
def max_pool(node: ONode, ctx) -> None:
    x = node.input(0)
    if ctx.rank(x) in (3, 5):
        imp_spatial.pool_nd(OpKind.MAX_POOL, node, ctx)
        return
    if ctx.rank(x) != 4:
        ctx.unsupported(f"{ctx.rank(x)}-D input")
        return
    ctx.emit(OpKind.MAX_POOL, (x,), node.outputs[:1], **_pool_attrs(node, ctx, x))


@importer("AveragePool", check=_pool_rank)
def average_pool(node: ONode, ctx) -> None:
    x = node.input(0)
    if ctx.rank(x) in (3, 5):
        imp_spatial.pool_nd(OpKind.AVERAGE_POOL, node, ctx)
        return
    if ctx.rank(x) != 4:
        ctx.unsupported(f"{ctx.rank(x)}-D input")
        return
    ctx.emit(OpKind.AVERAGE_POOL, (x,), node.outputs, **_pool_attrs(node, ctx, x),
             count_include_pad=bool(node.attr("count_include_pad", 0)))


@importer("LRN", check=rank_is(4))
def lrn(node: ONode, ctx) -> None:
    if ctx.rank(node.input(0)) != 4:
        ctx.unsupported(f"{ctx.rank(node.input(0))}-D input")
        return
    ctx.emit(OpKind.LRN, node.inputs[:1], node.outputs, size=int(node.attr("size")),
             alpha=float(node.attr("alpha", 1e-4)), beta=float(node.attr("beta", 0.75)),
             bias=float(node.attr("bias", 1.0)))
