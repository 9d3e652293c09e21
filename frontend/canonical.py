"""Canonicalising passes over the Draft: per-channel affine ops (BatchNormalization's Mul + Add)
folded into the preceding Conv or ConvTranspose when its output has no other consumer; elementwise ops
moved ahead of the views that drop trailing unit axes (1-D layers run as [N, C, L, 1]), so the
view pairs between consecutive 1-D layers cancel."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from tpuflow.frontend.draft import Draft, make_node
from tpuflow.frontend.graph import OpNode
from tpuflow.frontend.ops import OpKind, spec


def _per_channel(value: np.ndarray, out_shape: tuple[int, ...]) -> np.ndarray | None:
    """`value` as a [C] vector if broadcasting it against an NCHW output only varies along C."""
    if value.ndim > len(out_shape) or value.dtype.kind != "f":
        return None
    full = value.reshape((1,) * (len(out_shape) - value.ndim) + value.shape)
    channels = out_shape[1]
    if any(d != 1 for i, d in enumerate(full.shape) if i != 1) or full.shape[1] not in (1, channels):
        return None
    return np.broadcast_to(full.reshape(-1), (channels,))


FOLDS_AFFINE = {OpKind.CONV: 0, OpKind.CONV_TRANSPOSE: 1}    # op -> the weights' output-channel axis


def _affine_partner(draft: Draft, conv: OpNode, users: dict[str, list[OpNode]]) -> tuple[OpNode, np.ndarray] | None:
    y = conv.outputs[0]
    if y in draft.outputs or len(users.get(y, [])) != 1:
        return None
    op = users[y][0]
    if op.op_type not in (OpKind.MUL, OpKind.ADD) or op.inputs.count(y) != 1:
        return None
    other = op.inputs[1] if op.inputs[0] == y else op.inputs[0]
    value = draft.const(other)
    if value is None:
        return None
    vector = _per_channel(value, draft.tensors[y].shape)
    return None if vector is None else (op, vector)


def _fold(draft: Draft, conv: OpNode, op: OpNode, vector: np.ndarray) -> OpNode:
    weights = draft.const(conv.inputs[1])
    axis = FOLDS_AFFINE[conv.op_type]
    bias = draft.const(conv.inputs[2]) if len(conv.inputs) > 2 else np.zeros(weights.shape[axis], weights.dtype)
    v = vector.astype(np.float64)
    if op.op_type == OpKind.MUL:
        weights = weights.astype(np.float64) * v.reshape((-1,) + (1,) * (weights.ndim - 1 - axis))
        bias = bias.astype(np.float64) * v
    else:
        bias = bias.astype(np.float64) + v
    dtype = draft.tensors[conv.inputs[1]].dtype
    w = draft.add_const(f"{conv.name}/W", weights.astype(dtype))
    b = draft.add_const(f"{conv.name}/B", bias.astype(dtype))
    return replace(conv, inputs=(conv.inputs[0], w, b), outputs=op.outputs)


def fold_affine_into_conv(draft: Draft) -> int:
    """Repeat sweeps until no Conv -> Mul/Add(per-channel constant) pair is left; returns the count."""
    total = 0
    while True:
        users: dict[str, list[OpNode]] = {}
        for n in draft.nodes:
            for t in set(n.inputs):
                users.setdefault(t, []).append(n)
        removed: set[str] = set()
        nodes = []
        for n in draft.nodes:
            if n.name in removed:
                continue
            partner = _affine_partner(draft, n, users) if n.op_type in FOLDS_AFFINE else None
            if partner:
                n = _fold(draft, n, *partner)
                removed.add(partner[0].name)
            nodes.append(n)
        draft.nodes = nodes
        total += len(removed)
        if not removed:
            return total
        draft.prune()


def _drops_unit_axes(draft: Draft, node: OpNode) -> int:
    """How many trailing unit axes a Reshape removes (its output is its input's shape without
    them), else 0."""
    if node.op_type != OpKind.RESHAPE:
        return 0
    src, out = draft.tensors[node.inputs[0]].shape, draft.tensors[node.outputs[0]].shape
    extra = len(src) - len(out)
    return extra if extra > 0 and src[:len(out)] == out and all(d == 1 for d in src[len(out):]) else 0


def _sinkable(draft: Draft, node: OpNode, producers: dict[str, OpNode]):
    """(the view making each runtime operand, unit axes) when every runtime operand of elementwise
    `node` is made by a view dropping the same trailing unit axes, has the node's output shape, and
    the other operands are constants; else None. (The views stay for their other readers.) Ops on
    quantized tensors stay (their Quants are per tensor: the int8 lowering handles them)."""
    if spec(node.op_type).row_role != "elementwise" or any(
            draft.tensors[t].quant is not None for t in (*node.inputs, *node.outputs) if t):
        return None
    runtime = [t for t in node.inputs if t and draft.const(t) is None]
    views = {t: producers.get(t) for t in runtime}
    units = {_drops_unit_axes(draft, v) if v is not None else 0 for v in views.values()}
    shape = draft.tensors[node.outputs[0]].shape
    if not runtime or len(units) != 1 or 0 in units or any(draft.tensors[t].shape != shape for t in runtime):
        return None
    if any(len(draft.tensors[v.inputs[0]].shape) != 4 for v in views.values()):
        return None                       # only NCHW sources: the [N, C, L, 1] of 1-D layers
    return views, units.pop()


def _sink(draft: Draft, node: OpNode, views: dict[str, OpNode], units: int) -> list[OpNode]:
    """`node` computed on the views' sources (constants get the trailing unit axes too), then a view
    to the node's old output."""
    def operand(t: str) -> str:
        if not t or t in views:
            return views[t].inputs[0] if t else t
        value = draft.const(t)
        return t if value.ndim == 0 else draft.add_const(f"{t}/unit", value.reshape(value.shape + (1,) * units))
    view = next(iter(views.values()))
    info = draft.tensors[node.outputs[0]]
    wide = draft.add_tensor(f"{node.outputs[0]}/unit", info.shape + (1,) * units, info.dtype)
    moved = replace(node, inputs=tuple(operand(t) for t in node.inputs), outputs=(wide,))
    back = make_node(draft.node_name(f"{node.name}/view"), OpKind.RESHAPE, (wide,), node.outputs,
                     {**view.attrs, "shape": info.shape})
    return [moved, back]


def _fold_views(draft: Draft) -> int:
    """A view of a view reads the first view's input; a view to its input's own shape is dropped
    (its readers read the input) unless it makes a graph output. Returns the views changed."""
    producers = {t: n for n in draft.nodes for t in n.outputs}
    changed, rename, nodes = 0, {}, []
    for n in draft.nodes:
        if n.op_type == OpKind.RESHAPE:
            first = producers.get(n.inputs[0])
            if first is not None and first.op_type == OpKind.RESHAPE:
                n = replace(n, inputs=first.inputs)
                producers[n.outputs[0]] = n
                changed += 1
            if draft.tensors[n.inputs[0]].shape == draft.tensors[n.outputs[0]].shape and n.outputs[0] not in draft.outputs:
                rename[n.outputs[0]] = n.inputs[0]
                changed += 1
                continue
        nodes.append(n)
    def final(t: str) -> str:
        while t in rename:
            t = rename[t]
        return t
    draft.nodes = [replace(n, inputs=tuple(final(t) for t in n.inputs)) for n in nodes]
    draft.prune()
    return changed


def sink_views_below_elementwise(draft: Draft) -> int:
    """Move elementwise ops ahead of the views that drop trailing unit axes, then cancel the view
    pairs that leaves (Conv1d -> view -> Relu -> view -> Conv1d becomes Conv -> Relu -> Conv over
    [N, C, L, 1]); returns how many ops moved (views may have folded without any)."""
    moved = 0
    while True:
        producers = {t: n for n in draft.nodes for t in n.outputs}
        nodes, count = [], 0
        for n in draft.nodes:
            found = _sinkable(draft, n, producers)
            if found is None:
                nodes.append(n)
                continue
            nodes.extend(_sink(draft, n, *found))
            count += 1
        draft.nodes = nodes
        moved += count
        if not _fold_views(draft) and not count:
            return moved
