"""Importers of broadcasting and masking ops on live tensors: Expand, Tile, variadic Max / Min / Mean,
Trilu, CumSum."""

from __future__ import annotations

import math

import numpy as np

from tpuflow.frontend.onnx_view import ONode
from tpuflow.frontend.ops import OpKind
from tpuflow.frontend.registry import importer
from tpuflow.frontend.rewrite import Rewriter

K = OpKind


@importer("Expand", const_inputs=((1, "shape"),))
def expand(node: ONode, ctx) -> None:
    x, y = node.input(0), node.outputs[0]
    if ctx.shape(x) == ctx.shape(y):
        ctx.alias(x, y)
        return
    ctx.emit(K.EXPAND, (x,), (y,), shape=ctx.shape(y))


@importer("Tile", const_inputs=((1, "repeats"),))
def tile(node: ONode, ctx) -> None:
    """Tile = view [.., 1, d, ..] -> Expand to [.., r, d, ..] -> view [.., r*d, ..] (one stride-0 copy)."""
    x, y = node.input(0), node.outputs[0]
    reps = [int(r) for r in ctx.const(node.input(1)).reshape(-1)]
    dims = ctx.shape(x)
    if all(r == 1 for r in reps):
        ctx.alias(x, y)
        return
    rw = Rewriter(ctx)
    split = [v for d in dims for v in (1, d)]
    target = [v for d, r in zip(dims, reps) for v in (r, d)]
    wide = rw.op(K.EXPAND, (rw.reshape(x, split),), target, shape=tuple(target))
    rw.reshape(wide, ctx.shape(y), out=y)


@importer("Max", "Min")
def max_min(node: ONode, ctx) -> None:
    """Max(a, b, c, ...) -> Max(Max(a, b), c) ... with broadcasting (binary Max / Min kernels)."""
    kind, y = (K.MAX if node.op_type == "Max" else K.MIN), node.outputs[0]
    terms = list(node.inputs)
    if len(terms) == 1:
        ctx.alias(terms[0], y)
        return
    rw = Rewriter(ctx)
    current = terms[0]
    for i, term in enumerate(terms[1:], start=1):
        current = rw.binary(kind, current, term, out=y if i == len(terms) - 1 else None)


@importer("Mean")
def mean(node: ONode, ctx) -> None:
    """Mean(a, b, ...) = (a + b + ...) * (1 / n), broadcasting like Sum."""
    rw, y = Rewriter(ctx), node.outputs[0]
    terms = list(node.inputs)
    if len(terms) == 1:
        ctx.alias(terms[0], y)
        return
    total = terms[0]
    for term in terms[1:]:
        total = rw.add(total, term)
    rw.mul(total, 1.0 / len(terms), out=y)


@importer("Trilu", const_inputs=((1, "k"),))
def trilu(node: ONode, ctx) -> None:
    """Multiply by a constant 0/1 mask over the last two axes."""
    x, y = node.input(0), node.outputs[0]
    k = int(ctx.const(node.input(1)).reshape(-1)[0]) if ctx.has_input(1) else 0
    rows, cols = ctx.shape(x)[-2:]
    upper = bool(node.attr("upper", 1))
    mask = np.triu(np.ones((rows, cols)), k) if upper else np.tril(np.ones((rows, cols)), k)
    rw = Rewriter(ctx)
    rw.mul(x, rw.const(mask), out=y)


@importer("CumSum", const_inputs=((1, "axis"),))
def cumsum(node: ONode, ctx) -> None:
    """A prefix sum along `axis` is a MatMul with a constant triangular 0/1 matrix (on the right for
    the last axis, on the left of an [outer, n, inner] view otherwise): inclusive / exclusive,
    forward / reverse."""
    x, y = node.input(0), node.outputs[0]
    if np.dtype(ctx.dtype(x)).kind != "f":
        ctx.unsupported(f"{ctx.dtype(x)} input")
        return
    dims = ctx.shape(x)
    rank = len(dims)
    axis = int(ctx.const(node.input(1)).reshape(-1)[0])
    axis = axis + rank if axis < 0 else axis
    n = dims[axis]
    i, j = np.indices((n, n))
    exclusive, reverse = bool(node.attr("exclusive", 0)), bool(node.attr("reverse", 0))
    take = (i >= j) if reverse else (i <= j)          # y_j = sum_i x_i T[i, j]
    if exclusive:
        take &= i != j
    rw = Rewriter(ctx)
    if axis == rank - 1:
        rw.matmul(x, rw.const(take.astype(np.float64)), out=y)
        return
    # another axis: the constant on the left, x viewed [outer, n, inner] (no Transpose)
    view = rw.reshape(x, (math.prod(dims[:axis]), n, math.prod(dims[axis + 1:])))
    summed = rw.matmul(rw.const(take.T.astype(np.float64)), view)
    rw.reshape(summed, dims, out=y)
