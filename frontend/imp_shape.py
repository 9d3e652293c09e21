"""Importers of layout ops: Reshape-likes (as views), Transpose, Concat, Split, Slice, Gather, Pad,
and the ops that vanish (Identity, Dropout)."""

from __future__ import annotations

import math

import numpy as np

from tpuflow.errors import ModelError
from tpuflow.frontend.onnx_view import ONode
from tpuflow.frontend.ops import OpKind
from tpuflow.frontend.registry import Facts, importer, unused_outputs
from tpuflow.frontend.rewrite import Rewriter

K = OpKind


def _axis(value: int, rank: int) -> int:
    return value + rank if value < 0 else value


@importer("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def reshape(node: ONode, ctx) -> None:
    """Row-major reshapes to the (static, inferred) output shape: views, no data movement."""
    x, y = node.input(0), node.outputs[0]
    if math.prod(ctx.shape(x)) != math.prod(ctx.shape(y)):
        raise ModelError(f"{ctx.view.label}: contradictory shapes: node '{node.name}' ({node.op_type}) turns "
                         f"{ctx.shape(x)} into {ctx.shape(y)}, which has a different number of elements")
    ctx.emit(K.RESHAPE, (x,), (y,), shape=ctx.shape(y), view=True)


@importer("Identity")
def identity(node: ONode, ctx) -> None:
    ctx.alias(node.input(0), node.outputs[0])


@importer("Dropout", check=unused_outputs(1, "mask output used"))
def dropout(node: ONode, ctx) -> None:
    training = ctx.const(node.input(2))
    if training is not None and bool(training.item()):
        ctx.unsupported("training mode")
        return
    ctx.alias(node.input(0), node.outputs[0])


@importer("Transpose")
def transpose(node: ONode, ctx) -> None:
    rank = ctx.rank(node.input(0))
    perm = node.attr("perm") or list(range(rank))[::-1]
    ctx.emit(K.TRANSPOSE, node.inputs[:1], node.outputs, perm=tuple(int(p) for p in perm))


@importer("Concat")
def concat(node: ONode, ctx) -> None:
    rank = ctx.rank(node.outputs[0])
    ctx.emit(K.CONCAT, node.inputs, node.outputs, axis=_axis(int(node.attr("axis")), rank))


@importer("Split", const_inputs=((1, "split sizes"),))
def split(node: ONode, ctx) -> None:
    """Sizes come from the (inferred) output shapes, whichever way the model stated them."""
    x = node.input(0)
    axis = _axis(int(node.attr("axis", 0)), ctx.rank(x))
    used = [bool(t) and t in ctx.draft.tensors for t in node.outputs]
    if all(used):
        ctx.emit(K.SPLIT, (x,), node.outputs, axis=axis, sizes=tuple(ctx.shape(t)[axis] for t in node.outputs))
        return
    # some outputs unused (their shapes may be unknown): a Slice for each used one
    sizes = _split_sizes(node, ctx, axis)
    rw, start = Rewriter(ctx, ctx.dtype(x)), 0
    for t, size, keep in zip(node.outputs, sizes, used):
        if keep:
            rw.slice(x, axis, start, start + size, out=t)
        start += size


def _split_sizes(node: ONode, ctx, axis: int) -> list[int]:
    """Split sizes from the attribute / input, else equal parts (the last one smaller)."""
    given = ctx.const(node.input(1)) if ctx.opset >= 13 and node.input(1) else None
    if given is None and node.attr("split") is not None:
        given = node.attr("split")
    if given is not None:
        return [int(v) for v in np.asarray(given).reshape(-1)]
    dim, parts = ctx.shape(node.input(0))[axis], len(node.outputs)
    each = -(-dim // parts)
    return [min(each, dim - i * each) for i in range(parts)]


def _slice_params(node: ONode, ctx) -> tuple[list[int], list[int], list[int], list[int]]:
    if ctx.opset < 10:
        starts, ends = node.attr("starts"), node.attr("ends")
        axes = node.attr("axes") or list(range(len(starts)))
        return list(starts), list(ends), list(axes), [1] * len(starts)
    values = [ctx.const(node.input(i)) for i in range(1, 5)]
    starts, ends = (v.reshape(-1).tolist() for v in values[:2])
    axes = values[2].reshape(-1).tolist() if values[2] is not None else list(range(len(starts)))
    steps = values[3].reshape(-1).tolist() if values[3] is not None else [1] * len(starts)
    return starts, ends, axes, steps


@importer("Slice", const_inputs=((1, "starts"), (2, "ends"), (3, "axes"), (4, "steps")))
def slice_(node: ONode, ctx) -> None:
    """Full-rank starts / ends / steps, clamped into [0, dim]; steps must be positive."""
    x = node.input(0)
    dims = ctx.shape(x)
    starts, ends, steps = [0] * len(dims), list(dims), [1] * len(dims)
    for s, e, a, st in zip(*_slice_params(node, ctx)):
        if st <= 0:
            ctx.unsupported("non-positive step")
            return
        a = _axis(int(a), len(dims))
        d = dims[a]
        starts[a] = min(max(s + d if s < 0 else s, 0), d)
        ends[a] = min(max(e + d if e < 0 else e, 0), d)
        steps[a] = int(st)
    ctx.emit(K.SLICE, (x,), node.outputs, starts=tuple(int(s) for s in starts),
             ends=tuple(int(e) for e in ends), steps=tuple(steps))


@importer("Gather", const_inputs=((1, "indices"),))
def gather(node: ONode, ctx) -> None:
    """Constant indices, made non-negative."""
    data, indices = node.input(0), node.input(1)
    axis = _axis(int(node.attr("axis", 0)), ctx.rank(data))
    value = ctx.const(indices)
    dim = ctx.shape(data)[axis]
    if (value < 0).any():
        indices = ctx.add_const("indices", np.where(value < 0, value + dim, value).astype(value.dtype))
    ctx.emit(K.GATHER, (data, indices), node.outputs, axis=axis)


def _pad_check(node: ONode, facts: Facts) -> str | None:
    mode = node.attr("mode", "constant")
    return f"mode={mode}" if mode != "constant" else None


@importer("Pad", const_inputs=((1, "pads"), (2, "value"), (3, "axes")), check=_pad_check)
def pad(node: ONode, ctx) -> None:
    """pads = (begin of every axis, then end of every axis), non-negative; value a float."""
    x = node.input(0)
    rank = ctx.rank(x)
    if ctx.opset < 11:
        given, value, axes = list(node.attr("pads")), float(node.attr("value", 0.0)), list(range(rank))
    else:
        given = ctx.const(node.input(1)).reshape(-1).tolist()
        v = ctx.const(node.input(2))
        value = 0.0 if v is None or v.size == 0 else float(v.reshape(-1)[0])
        a = ctx.const(node.input(3))
        axes = [_axis(int(i), rank) for i in a.reshape(-1)] if a is not None else list(range(rank))
    pads = pads_per_axis(given, axes, rank)
    if min(pads) < 0:
        ctx.unsupported("negative pads")
        return
    ctx.emit(K.PAD, (x,), node.outputs, pads=tuple(pads), value=value)


def pads_per_axis(given: list, axes: list[int], rank: int) -> list[int]:
    """ONNX Pad amounts for `axes` (begins, then ends) as begin of every axis, then end of every axis."""
    pads = [0] * (2 * rank)
    for i, axis in enumerate(axes):
        pads[axis], pads[rank + axis] = int(given[i]), int(given[len(axes) + i])
    return pads
