"""Importers of reductions built from ReduceSum / ReduceMax / ReduceMean + elementwise ops:
ReduceL1, ReduceL2, ReduceSumSquare, ReduceLogSum, ReduceLogSumExp, ReduceMin, ReduceProd, and
the global pools of any rank (GlobalMaxPool, GlobalAveragePool off 4-D)."""

from __future__ import annotations

import math

from tpuflow.frontend.onnx_view import ONode
from tpuflow.frontend.ops import OpKind
from tpuflow.frontend.registry import importer
from tpuflow.frontend.rewrite import Rewriter

K = OpKind
AXES_INPUT_SINCE = 18
MAX_PROD_TERMS = 64          # ReduceProd is a chain of Muls over the reduced elements


def reduce_axes(node: ONode, ctx, since: int = AXES_INPUT_SINCE) -> tuple[int, ...] | None:
    """Sorted non-negative axes; None means 'keep the input' (noop_with_empty_axes)."""
    rank = ctx.rank(node.input(0))
    if ctx.opset >= since:
        value = ctx.const(node.input(1))
        axes = [] if value is None else [int(a) for a in value.reshape(-1)]
    else:
        axes = [int(a) for a in node.attr("axes") or []]
    if not axes:
        return None if node.attr("noop_with_empty_axes", 0) else tuple(range(rank))
    return tuple(sorted({a + rank if a < 0 else a for a in axes}))


def _rewrite(node: ONode, ctx, body) -> None:
    """body(rewriter, x, axes or None, keepdims, y) writes y."""
    x, y = node.input(0), node.outputs[0]
    body(Rewriter(ctx, ctx.dtype(x)), x, reduce_axes(node, ctx), bool(node.attr("keepdims", 1)), y)


def _l1(rw, x, axes, keep, y):
    a = rw.unary(K.ABS, x)
    return rw.reduce(K.REDUCE_SUM, a, axes, keep, out=y) if axes is not None else rw.unary(K.ABS, x, out=y)


def _sum_square(rw, x, axes, keep, y):
    sq = rw.mul(x, x, out=y if axes is None else None)
    return sq if axes is None else rw.reduce(K.REDUCE_SUM, sq, axes, keep, out=y)


def _l2(rw, x, axes, keep, y):
    if axes is None:
        return rw.unary(K.ABS, x, out=y)
    return rw.unary(K.SQRT, _sum_square(rw, x, axes, keep, None), out=y)


def _log_sum(rw, x, axes, keep, y):
    s = x if axes is None else rw.reduce(K.REDUCE_SUM, x, axes, keep)
    return rw.unary(K.LOG, s, out=y)


def _log_sum_exp(rw, x, axes, keep, y):
    """max + log(sum(exp(x - max))), the max kept for the broadcast."""
    if axes is None:
        return rw.unary(K.LOG, rw.unary(K.EXP, x), out=y)
    m = rw.reduce(K.REDUCE_MAX, x, axes, True)
    s = rw.reduce(K.REDUCE_SUM, rw.unary(K.EXP, rw.sub(x, m)), axes, True)
    r = rw.add(rw.unary(K.LOG, s), m)
    return rw.reshape(r, rw.shape(y), out=y)


def _min(rw, x, axes, keep, y):
    if axes is None:
        return rw.reshape(x, rw.shape(x), out=y)
    return rw.neg(rw.reduce(K.REDUCE_MAX, rw.neg(x), axes, keep), out=y)


def _prod(rw, x, axes, keep, y):
    """The reduced axes moved last and flattened, then a Mul chain over their slices."""
    if axes is None:
        return rw.reshape(x, rw.shape(x), out=y)
    dims = rw.shape(x)
    rest = [a for a in range(len(dims)) if a not in axes]
    n = math.prod(dims[a] for a in axes)
    flat = rw.reshape(rw.transpose(x, rest + list(axes)), tuple(dims[a] for a in rest) + (n,))
    last = len(rest)
    acc = rw.slice(flat, last, 0, 1)
    for i in range(1, n):
        acc = rw.mul(acc, rw.slice(flat, last, i, i + 1))
    return rw.reshape(acc, rw.shape(y), out=y)


BODIES = {"ReduceL1": _l1, "ReduceL2": _l2, "ReduceSumSquare": _sum_square, "ReduceLogSum": _log_sum,
          "ReduceLogSumExp": _log_sum_exp, "ReduceMin": _min, "ReduceProd": _prod}


def _make(op: str):
    def run(node: ONode, ctx) -> None:
        if op == "ReduceProd":
            axes = reduce_axes(node, ctx)
            dims = ctx.shape(node.input(0))
            if axes is not None and math.prod(dims[a] for a in axes) > MAX_PROD_TERMS:
                ctx.unsupported(f"more than {MAX_PROD_TERMS} reduced elements")
                return
        _rewrite(node, ctx, BODIES[op])
    return run


for _op in BODIES:
    importer(_op, const_inputs=((1, "axes"),))(_make(_op))


@importer("GlobalMaxPool", "GlobalAveragePool")
def global_pool(node: ONode, ctx) -> None:
    """4-D GlobalAveragePool stays canonical; the rest are ReduceMax / ReduceMean over every spatial axis."""
    x, y = node.input(0), node.outputs[0]
    rank = ctx.rank(x)
    if node.op_type == "GlobalAveragePool" and rank == 4:
        ctx.emit(K.GLOBAL_AVERAGE_POOL, (x,), (y,))
        return
    kind = K.REDUCE_MAX if node.op_type == "GlobalMaxPool" else K.REDUCE_MEAN
    Rewriter(ctx).reduce(kind, x, tuple(range(2, rank)), True, out=y)
