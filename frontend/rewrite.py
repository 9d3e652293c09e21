"""Rewriter: builds canonical-op decompositions of one ONNX node with inferred intermediate shapes."""

from __future__ import annotations

import math

import numpy as np

from tpuflow.frontend.ops import OpKind
from tpuflow.frontend.shapes import matmul_shape

K = OpKind


UNROLL_AXIS_MAX = 32      # Softmax over a non-last axis of at most this size: elementwise over its slices
UNROLL_INNER_MIN = 16     # ... when each slice is a contiguous run at least this long (else Transpose)
REDUCE_UNROLL_MAX = 16    # the same for ReduceMax over a non-trailing block (measured on sg2260: C=4 of
                          # 1x4x160x160 49 vs 517 us, C=16 of 1x16x80x80 76 vs 148 us, C=24 of 1x24x40x40
                          # 72 vs 29 us: the transposed row form wins on longer axes); ReduceSum / Mean
                          # over a non-trailing block are a MatMul with a constant row of ones instead


def square_rows(count: int) -> int:
    """The largest divisor of `count` up to its square root: rows of a near-square 2-D view (the
    lowering spreads rows across lanes, so a [1, n] slice would keep one lane busy)."""
    return max(d for d in range(1, math.isqrt(count) + 1) if count % d == 0)


def _slice(v, a):
    return v[tuple(slice(s, e, st) for s, e, st in zip(a["starts"], a["ends"], a["steps"]))]


# Canonical ops evaluated at rewrite time when every input is a constant (initial RNN states ...).
FOLDERS = {
    K.RESHAPE: lambda v, a: v[0].reshape(a["shape"]),
    K.TRANSPOSE: lambda v, a: v[0].transpose(a["perm"]),
    K.SLICE: lambda v, a: _slice(v[0], a),
    K.CONCAT: lambda v, a: np.concatenate(v, a["axis"]),
    K.MATMUL: lambda v, a: np.matmul(v[0], v[1]),
    K.ADD: lambda v, a: v[0] + v[1], K.SUB: lambda v, a: v[0] - v[1],
    K.MUL: lambda v, a: v[0] * v[1], K.DIV: lambda v, a: v[0] / v[1],
    K.NEG: lambda v, a: -v[0], K.ABS: lambda v, a: np.abs(v[0]), K.EXP: lambda v, a: np.exp(v[0]),
    K.RELU: lambda v, a: np.maximum(v[0], 0), K.TANH: lambda v, a: np.tanh(v[0]),
    K.SIGMOID: lambda v, a: 1 / (1 + np.exp(-v[0])),
    K.CLIP: lambda v, a: np.clip(v[0], a["min"], a["max"]),
    K.LEAKY_RELU: lambda v, a: np.where(v[0] >= 0, v[0], v[0] * a["alpha"]),
    K.HARD_SIGMOID: lambda v, a: np.clip(v[0] * a["alpha"] + a["beta"], 0, 1),
}


class Rewriter:
    """Emits canonical nodes for the importer's current node. Every method returns the name of the
    produced tensor; `out=` names the tensor to write instead of a new intermediate (the node's own
    output for the last step). Constants take the dtype of the value they meet."""

    def __init__(self, ctx, dtype: str | None = None):
        self.ctx = ctx
        self.dtype = dtype or ctx.dtype(ctx.node.outputs[0])
        self.count = 0

    # ---- basics
    def shape(self, t: str) -> tuple[int, ...]:
        return self.ctx.shape(t)

    def op(self, kind: OpKind, inputs, out_shape, out: str | None = None, dtype: str | None = None,
           **attrs) -> str:
        values = [self.ctx.const(t) for t in inputs]
        if out is None and kind in FOLDERS and all(v is not None for v in values):
            result = np.asarray(FOLDERS[kind](values, attrs))
            return self.const(result.reshape(tuple(out_shape)), result.dtype.name, tag="folded")
        self.count += 1
        tag = f"{kind.value.lower()}{self.count}"
        y = out or self.ctx.temp(tag, tuple(int(d) for d in out_shape), dtype or self.dtype)
        alone = self.count == 1 and y in self.ctx.node.outputs        # a 1:1 rewrite keeps the node's name
        self.ctx.emit(kind, tuple(inputs), (y,), suffix=None if alone else tag, **attrs)
        return y

    def const(self, value, dtype: str | None = None, tag: str = "c") -> str:
        return self.ctx.add_const(tag, np.asarray(value, dtype or self.dtype))

    def scalar(self, value: float) -> str:
        return self.const(value, tag="k")

    # ---- elementwise
    def unary(self, kind: OpKind, x: str, out: str | None = None, **attrs) -> str:
        return self.op(kind, (x,), self.shape(x), out, **attrs)

    def binary(self, kind: OpKind, a: str, b: str | float, out: str | None = None) -> str:
        if not isinstance(b, str):
            b = self.scalar(b)
        shape = np.broadcast_shapes(self.shape(a), self.shape(b))
        return self.op(kind, (a, b), shape, out)

    def add(self, a, b, out=None): return self.binary(K.ADD, a, b, out)
    def sub(self, a, b, out=None): return self.binary(K.SUB, a, b, out)
    def mul(self, a, b, out=None): return self.binary(K.MUL, a, b, out)
    def div(self, a, b, out=None): return self.binary(K.DIV, a, b, out)

    def rsub(self, value: float, x: str, out: str | None = None) -> str:
        """value - x."""
        return self.op(K.SUB, (self.scalar(value), x), self.shape(x), out)

    def relu(self, x, out=None): return self.unary(K.RELU, x, out)
    def neg(self, x, out=None): return self.unary(K.NEG, x, out)

    def min0(self, x: str, out: str | None = None) -> str:
        """min(x, 0) = -relu(-x)."""
        return self.neg(self.relu(self.neg(x)), out)

    # ---- layout
    def reshape(self, x: str, shape, out: str | None = None) -> str:
        shape = tuple(int(d) for d in shape)
        if shape == self.shape(x) and out is None:
            return x
        return self.op(K.RESHAPE, (x,), shape, out, shape=shape, view=True)

    def transpose(self, x: str, perm, out: str | None = None) -> str:
        perm = tuple(int(p) for p in perm)
        if perm == tuple(range(len(perm))) and out is None:
            return x
        return self.op(K.TRANSPOSE, (x,), tuple(self.shape(x)[p] for p in perm), out, perm=perm)

    def slice(self, x: str, axis: int, start: int, end: int, step: int = 1, out: str | None = None) -> str:
        dims = self.shape(x)
        starts, ends, steps = [0] * len(dims), list(dims), [1] * len(dims)
        starts[axis], ends[axis], steps[axis] = start, end, step
        shape = tuple(len(range(s, e, st)) for s, e, st in zip(starts, ends, steps))
        if shape == dims and out is None:
            return x
        return self.op(K.SLICE, (x,), shape, out, starts=tuple(starts), ends=tuple(ends), steps=tuple(steps))

    def concat(self, xs: list[str], axis: int, out: str | None = None) -> str:
        if len(xs) == 1 and out is None:
            return xs[0]
        shape = list(self.shape(xs[0]))
        shape[axis] = sum(self.shape(x)[axis] for x in xs)
        return self.op(K.CONCAT, xs, shape, out, axis=axis)

    def pad(self, x: str, pads, value: float = 0.0, out: str | None = None) -> str:
        rank = len(self.shape(x))
        shape = tuple(d + pads[i] + pads[rank + i] for i, d in enumerate(self.shape(x)))
        return self.op(K.PAD, (x,), shape, out, pads=tuple(int(p) for p in pads), value=float(value))

    # ---- contractions and reductions
    def matmul(self, a: str, b: str, out: str | None = None) -> str:
        return self.op(K.MATMUL, (a, b), matmul_shape(self.shape(a), self.shape(b)), out)

    def reduce(self, kind: OpKind, x: str, axes, keepdims: bool = True, out: str | None = None) -> str:
        """A reduction over any axes: non-trailing axes are moved last first (the lowering reduces
        trailing axes)."""
        dims, axes = self.shape(x), tuple(sorted(axes))
        rank = len(dims)
        keep = [a for a in range(rank) if a not in axes]
        out_shape = tuple(1 if a in axes else d for a, d in enumerate(dims))
        final = out_shape if keepdims else tuple(d for a, d in enumerate(dims) if a not in axes)
        if axes == tuple(range(rank - len(axes), rank)):
            return self.op(kind, (x,), final, out, axes=axes, keepdims=keepdims)
        block = axes == tuple(range(axes[0], axes[-1] + 1))
        if block and kind in (K.REDUCE_SUM, K.REDUCE_MEAN):
            return self.reshape(self.reduce_by_matmul(kind, x, axes), final, out)
        if block and math.prod(dims[a] for a in axes) <= REDUCE_UNROLL_MAX \
                and math.prod(dims[axes[-1] + 1:]) >= UNROLL_INNER_MIN:
            return self.reshape(self.reduce_unrolled(kind, x, axes), final, out)
        moved = self.transpose(x, keep + list(axes))
        flat = self.reshape(moved, tuple(dims[a] for a in keep) + (math.prod(dims[a] for a in axes),))
        r = self.op(kind, (flat,), tuple(dims[a] for a in keep) + (1,), axes=(len(keep),), keepdims=True)
        return self.reshape(r, final, out)

    def slices_of(self, x: str, first: int, last: int) -> tuple[list[str], tuple[int, int]]:
        """The slices of x along its axes first..last (flattened), each viewed near-square, and the
        (outer, inner) sizes around that block."""
        dims = self.shape(x)
        outer, size, inner = math.prod(dims[:first]), math.prod(dims[first:last + 1]), math.prod(dims[last + 1:])
        view = self.reshape(x, (outer, size, inner))
        rows = square_rows(outer * inner)
        return [self.reshape(self.slice(view, 1, i, i + 1), (rows, outer * inner // rows)) for i in range(size)], \
            (outer, inner)

    def reduce_by_matmul(self, kind: OpKind, x: str, axes) -> str:
        """ReduceSum / Mean over a non-trailing block: a constant row of ones (1/n) times the
        [outer, n, inner] view, shaped [outer, 1, inner] (no Transpose)."""
        dims = self.shape(x)
        outer, n, inner = (math.prod(dims[:axes[0]]), math.prod(dims[axes[0]:axes[-1] + 1]),
                           math.prod(dims[axes[-1] + 1:]))
        weight = 1.0 / n if kind == K.REDUCE_MEAN else 1.0
        view = self.reshape(x, (outer, n, inner))
        return self.matmul(self.const(np.full((1, n), weight)), view)

    def reduce_unrolled(self, kind: OpKind, x: str, axes) -> str:
        """ReduceMax (or Sum / Mean) over a short block of non-trailing axes as an elementwise chain
        over its slices (no Transpose of the innermost axis); shaped [outer, 1, inner]."""
        parts, (outer, inner) = self.slices_of(x, axes[0], axes[-1])
        step = K.MAX if kind == K.REDUCE_MAX else K.ADD
        acc = parts[0]
        for p in parts[1:]:
            acc = self.binary(step, acc, p)
        if kind == K.REDUCE_MEAN:
            acc = self.mul(acc, 1.0 / len(parts))
        return self.reshape(acc, (outer, 1, inner))

    def softmax_unrolled(self, kind: OpKind, x: str, axis: int, out: str | None = None) -> str:
        """(Log)Softmax along a non-last `axis` as elementwise ops over its slices (each a contiguous
        block when viewed as [outer, axis, inner]): no Transpose of the innermost axis."""
        dims = self.shape(x)
        parts, (outer, inner) = self.slices_of(x, axis, axis)
        top = parts[0]
        for p in parts[1:]:
            top = self.binary(K.MAX, top, p)
        shifted = [self.sub(p, top) for p in parts]
        exps = [self.unary(K.EXP, s) for s in shifted]
        total = exps[0]
        for e in exps[1:]:
            total = self.add(total, e)
        if kind == K.LOG_SOFTMAX:
            log_total = self.unary(K.LOG, total)
            results = [self.sub(s, log_total) for s in shifted]
        else:
            inverse = self.unary(K.RECIPROCAL, total)
            results = [self.mul(e, inverse) for e in exps]
        results = [self.reshape(r, (outer, 1, inner)) for r in results]
        return self.reshape(self.concat(results, 1), dims, out)

    def interleave_columns(self, parts: list[str], out: str | None = None) -> str:
        """[..., W] tensors p_0 .. p_{k-1} -> [..., k*W] with out[..., j*k + b] = p_b[..., j]: a sum of
        MatMuls with constant 0/1 matrices (no Transpose of the innermost axis)."""
        width, k = self.shape(parts[0])[-1], len(parts)
        total = None
        for b, part in enumerate(parts):
            spread = np.zeros((width, k * width))
            spread[np.arange(width), np.arange(width) * k + b] = 1.0
            last = b == k - 1
            product = self.matmul(part, self.const(spread), out=out if last and total is None else None)
            total = product if total is None else self.add(total, product, out=out if last else None)
        return total

    def deinterleave_columns(self, x: str, k: int) -> list[str]:
        """[..., k*W] -> k tensors [..., W] with part_b[..., j] = x[..., j*k + b] (constant 0/1 MatMuls)."""
        width = self.shape(x)[-1] // k
        parts = []
        for b in range(k):
            pick = np.zeros((k * width, width))
            pick[np.arange(width) * k + b, np.arange(width)] = 1.0
            parts.append(self.matmul(x, self.const(pick)))
        return parts

    def last_axis(self, kind: OpKind, x: str, axis: int, out: str | None = None, **attrs) -> str:
        """A shape-preserving op that works along the last axis (Softmax ...), applied along `axis`
        by swapping it with the last one (a pure view when every axis after `axis` has size 1)."""
        dims = self.shape(x)
        rank = len(dims)
        if axis == rank - 1:
            return self.op(kind, (x,), dims, out, axis=axis, **attrs)
        if kind in (K.SOFTMAX, K.LOG_SOFTMAX) and dims[axis] <= UNROLL_AXIS_MAX \
                and math.prod(dims[axis + 1:]) >= UNROLL_INNER_MIN:
            return self.softmax_unrolled(kind, x, axis, out)
        if all(d == 1 for d in dims[axis + 1:]):
            flat = self.reshape(x, dims[:axis] + (dims[axis],))
            y = self.op(kind, (flat,), self.shape(flat), axis=axis, **attrs)
            return self.reshape(y, dims, out)
        perm = list(range(rank))
        perm[axis], perm[-1] = perm[-1], perm[axis]
        y = self.op(kind, (self.transpose(x, perm),), tuple(dims[p] for p in perm), axis=rank - 1, **attrs)
        return self.transpose(y, perm, out)
