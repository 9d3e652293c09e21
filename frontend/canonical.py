"""Canonicalising passes over the Draft: per-channel affine ops (BatchNormalization's Mul + Add)
folded into the preceding Conv when that Conv's output has no other consumer."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from tpuflow.frontend.draft import Draft
from tpuflow.frontend.graph import OpNode
from tpuflow.frontend.ops import OpKind


def _per_channel(value: np.ndarray, out_shape: tuple[int, ...]) -> np.ndarray | None:
    """`value` as a [C] vector if broadcasting it against an NCHW output only varies along C."""
    if value.ndim > len(out_shape) or value.dtype.kind != "f":
        return None
    full = value.reshape((1,) * (len(out_shape) - value.ndim) + value.shape)
    channels = out_shape[1]
    if any(d != 1 for i, d in enumerate(full.shape) if i != 1) or full.shape[1] not in (1, channels):
        return None
    return np.broadcast_to(full.reshape(-1), (channels,))


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
    bias = draft.const(conv.inputs[2]) if len(conv.inputs) > 2 else np.zeros(weights.shape[0], weights.dtype)
    v = vector.astype(np.float64)
    if op.op_type == OpKind.MUL:
        weights = weights.astype(np.float64) * v[:, None, None, None]
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
            partner = _affine_partner(draft, n, users) if n.op_type == OpKind.CONV else None
            if partner:
                n = _fold(draft, n, *partner)
                removed.add(partner[0].name)
            nodes.append(n)
        draft.nodes = nodes
        total += len(removed)
        if not removed:
            return total
        draft.prune()
