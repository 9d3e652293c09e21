"""Scan unrolled at compile time: step k binds the body's state inputs to the previous states and its
scan inputs to slice k (or length-1-k, reverse) of each scan input (Gather with a scalar index), and
the per-step scan outputs are stacked along their axis (reversed for reverse outputs)."""

from __future__ import annotations

import numpy as np
from onnx import helper

from tpuflow.frontend.control import MAX_UNROLLED_NODES, _Splicer, _stack
from tpuflow.frontend.onnx_view import ONode, OnnxView


def _layout(node: ONode, view: OnnxView):
    body = node.attrs["body"]
    m = int(node.attr("num_scan_inputs"))
    states = len(node.inputs) - m
    outs = len(body.output) - states
    in_axes = list(node.attr("scan_input_axes") or [0] * m)
    in_dirs = list(node.attr("scan_input_directions") or [0] * m)
    out_axes = list(node.attr("scan_output_axes") or [0] * outs)
    out_dirs = list(node.attr("scan_output_directions") or [0] * outs)
    return body, m, states, in_axes, in_dirs, out_axes, out_dirs


def scan_plan(node: ONode, view: OnnxView) -> tuple[int, str | None]:
    """(sequence length, reason it cannot be unrolled or None)."""
    body, m, states, in_axes, *_ = _layout(node, view)
    shape = view.static_shape(node.inputs[states]) if m else None
    if shape is None:
        return 0, "no static sequence length"
    length = shape[in_axes[0] % len(shape)]
    if length * max(len(body.node), 1) > MAX_UNROLLED_NODES:
        return 0, f"sequence length {length} too large to unroll"
    return length, None


def unroll_scan(node: ONode, view: OnnxView, length: int) -> list[ONode]:
    body, m, n_states, in_axes, in_dirs, out_axes, out_dirs = _layout(node, view)
    sp = _Splicer(view, node)
    states = list(node.inputs[:n_states])
    collected: list[list[str]] = [[] for _ in out_axes]
    for step in range(length):
        prefix = f"{node.name}/iter{step}"
        bound = {vi.name: s for vi, s in zip(body.input[:n_states], states)}
        for j, (vi, x) in enumerate(zip(body.input[n_states:], node.inputs[n_states:])):
            index = f"{prefix}/index{j}"
            view.consts[index] = np.asarray(length - 1 - step if in_dirs[j] else step, np.int64)
            axis = in_axes[j] % len(view.static_shape(x))
            bound[vi.name] = f"{prefix}/slice{j}"
            sp.add(helper.make_node("Gather", [x, index], [bound[vi.name]], name=f"{prefix}/take{j}", axis=axis))
        mapping = sp.splice(body, prefix, bound)
        results = [mapping.get(o.name, o.name) for o in body.output]
        states = results[:n_states]
        for acc, value in zip(collected, results[n_states:]):
            acc.append(value)
    for j, out in enumerate(node.outputs[:n_states]):
        if out:
            sp.identity(states[j], out, f"final{j}")
    for j, out in enumerate(node.outputs[n_states:]):
        if out:
            values = collected[j][::-1] if out_dirs[j] else collected[j]
            axis = out_axes[j]
            if axis < 0:
                axis += _slice_rank(body, n_states + j) + 1
            _stack(sp, node, view, values, out, j, axis)
    return sp.nodes


def _slice_rank(body, index: int) -> int:
    """Rank of a per-step scan output (from the body's declared output type)."""
    tt = body.output[index].type.tensor_type
    return len(tt.shape.dim)
