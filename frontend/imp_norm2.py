"""Importers of normalisations built from LayerNormalization / reductions: InstanceNormalization,
GroupNormalization, LpNormalization, MeanVarianceNormalization."""

from __future__ import annotations

import math

import numpy as np

from tpuflow.frontend.onnx_view import ONode
from tpuflow.frontend.ops import OpKind
from tpuflow.frontend.registry import importer
from tpuflow.frontend.rewrite import Rewriter

K = OpKind
MVN_EPSILON = 1e-9           # the ONNX function body of MeanVarianceNormalization adds it to the std
LAYER_NORM_MAX_ROW = 8192    # longer rows (instance / group norm of large maps) take the MatMul-moment form


def _normalize_rows(rw: Rewriter, x: str, rows_shape: tuple[int, ...], epsilon: float) -> str:
    """x viewed as rows_shape, normalised over its last axis: LayerNormalization (unit scale) for
    rows up to LAYER_NORM_MAX_ROW, else moments by MatMuls with a column of 1/n (any length)."""
    flat = rw.reshape(x, rows_shape)
    length = rows_shape[-1]
    if length <= LAYER_NORM_MAX_ROW:
        ones = rw.const(np.ones(rows_shape[-1:]))
        return rw.op(K.LAYER_NORM, (flat, ones), rows_shape, axis=len(rows_shape) - 1, epsilon=float(epsilon))
    chunks = next(k for k in range(2, length + 1) if length % k == 0 and length // k <= LAYER_NORM_MAX_ROW)
    rows = math.prod(rows_shape[:-1])
    view = rw.reshape(flat, (rows, chunks, length // chunks))
    def mean(t: str) -> str:                           # equal chunks: the mean of the chunk means
        per_chunk = rw.reduce(K.REDUCE_MEAN, t, (2,), keepdims=False)
        return rw.reshape(rw.reduce(K.REDUCE_MEAN, per_chunk, (1,), keepdims=False), (rows, 1, 1))
    centered = rw.sub(view, mean(view))
    inverse = rw.unary(K.RECIPROCAL, rw.unary(K.SQRT, rw.add(mean(rw.mul(centered, centered)), float(epsilon))))
    return rw.reshape(rw.mul(centered, inverse), rows_shape)


def _channel_affine(rw: Rewriter, x: str, scale: np.ndarray | str, bias: np.ndarray | str, out: str) -> str:
    """x * scale[c] + bias[c] on an N, C, ... tensor."""
    rank = len(rw.shape(x))
    def operand(v):
        if isinstance(v, str):
            return rw.reshape(v, rw.shape(v) + (1,) * (rank - 2))
        return rw.const(np.asarray(v, np.float64).reshape((-1,) + (1,) * (rank - 2)))
    return rw.add(rw.mul(x, operand(scale)), operand(bias), out=out)


@importer("InstanceNormalization")
def instance_norm(node: ONode, ctx) -> None:
    x, y = node.input(0), node.outputs[0]
    dims = ctx.shape(x)
    rw = Rewriter(ctx)
    normed = _normalize_rows(rw, x, (dims[0], dims[1], math.prod(dims[2:])), node.attr("epsilon", 1e-5))
    normed = rw.reshape(normed, dims)
    _channel_affine(rw, normed, _value_or_name(ctx, node.input(1)), _value_or_name(ctx, node.input(2)), y)


def _value_or_name(ctx, name: str):
    value = ctx.const(name)
    return name if value is None else value


@importer("GroupNormalization")
def group_norm(node: ONode, ctx) -> None:
    """Opset 18 takes per-group scale and bias, opset 21 per-channel ones."""
    x, y = node.input(0), node.outputs[0]
    dims = ctx.shape(x)
    groups, channels = int(node.attr("num_groups")), dims[1]
    rw = Rewriter(ctx)
    normed = _normalize_rows(rw, x, (dims[0], groups, channels // groups * math.prod(dims[2:])),
                             node.attr("epsilon", 1e-5))
    normed = rw.reshape(normed, dims)
    scale, bias = (_value_or_name(ctx, node.input(i)) for i in (1, 2))
    if ctx.shape(node.input(1))[0] != channels:
        if isinstance(scale, str) or isinstance(bias, str):
            ctx.unsupported("runtime per-group scale")
            return
        scale, bias = (np.repeat(v.reshape(-1), channels // groups) for v in (scale, bias))
    _channel_affine(rw, normed, scale, bias, y)


@importer("LpNormalization")
def lp_norm(node: ONode, ctx) -> None:
    """x / ||x||_p along `axis` (p = 1 or 2), as the ONNX reference computes it (no epsilon)."""
    x, y = node.input(0), node.outputs[0]
    rank = ctx.rank(x)
    axis = int(node.attr("axis", -1))
    axis = axis + rank if axis < 0 else axis
    p = int(node.attr("p", 2))
    if p not in (1, 2):
        ctx.unsupported(f"p={p}")
        return
    rw = Rewriter(ctx)
    if p == 1:
        norm = rw.reduce(K.REDUCE_SUM, rw.unary(K.ABS, x), (axis,), True)
    else:
        norm = rw.unary(K.SQRT, rw.reduce(K.REDUCE_SUM, rw.mul(x, x), (axis,), True))
    rw.div(x, norm, out=y)


@importer("MeanVarianceNormalization")
def mean_variance_norm(node: ONode, ctx) -> None:
    """(x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9) over `axes` (default 0, 2, 3)."""
    x, y = node.input(0), node.outputs[0]
    rank = ctx.rank(x)
    axes = tuple(sorted({int(a) + rank if int(a) < 0 else int(a) for a in node.attr("axes", [0, 2, 3])}))
    rw = Rewriter(ctx)
    mean = rw.reduce(K.REDUCE_MEAN, x, axes, True)
    mean_sq = rw.reduce(K.REDUCE_MEAN, rw.mul(x, x), axes, True)
    var = rw.sub(mean_sq, rw.mul(mean, mean))
    std = rw.add(rw.unary(K.SQRT, rw.unary(K.RELU, var)), MVN_EPSILON)
    rw.div(rw.sub(x, mean), std, out=y)
