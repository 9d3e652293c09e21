"""Pool ceil_mode edge cases: onnxruntime (and the ONNX spec: "sliding windows that would start in
the right padded region are ignored") drops a last window that starts past input + begin padding,
while onnx shape inference counts it. Affected nodes are rewritten before the shapes are final:

- if every axis then has its floor-mode size, ceil_mode is cleared (same values);
- if some axes keep a larger ceil-mode size, ceil_mode is cleared and those axes get the extra end
  padding that makes floor mode produce it (MaxPool pads with -inf and AveragePool without
  count_include_pad ignores padding, so the values are the same). AveragePool with
  count_include_pad on such mixed axes is rejected as unsupported (its divisor would change).
"""

from __future__ import annotations

import onnx
from onnx import helper

from tpuflow.errors import UnsupportedOpError
from tpuflow.frontend.onnx_view import ONode, OnnxView

POOLS = ("MaxPool", "AveragePool")
UNSUPPORTED = "AveragePool[ceil_mode window dropped with count_include_pad]"


class _Unsupported(Exception):
    pass


def pool_sizes(size: int, k: int, s: int, d: int, begin: int, end: int) -> tuple[int, int, int]:
    """(floor-mode, naive ceil-mode, onnxruntime ceil-mode) output lengths of one axis."""
    span = size + begin + end - d * (k - 1) - 1
    floor, naive = span // s + 1, -(-span // s) + 1
    ceil = naive - 1 if naive > floor and (naive - 1) * s >= size + begin else naive
    return floor, naive, ceil


def _rewritten_pads(node: ONode, shape: tuple[int, ...]) -> list[int] | None:
    """New pads for a ceil_mode=0 version of `node`, or None when the node is fine as it is."""
    if not node.attr("ceil_mode", 0) or node.attr("auto_pad", "NOTSET") != "NOTSET" or len(shape) < 3:
        return None
    kernel = node.attr("kernel_shape")
    n = len(kernel)
    strides, dilations = node.attr("strides") or [1] * n, node.attr("dilations") or [1] * n
    pads = list(node.attr("pads") or [0] * (2 * n))
    sizes = [pool_sizes(shape[2 + i], kernel[i], strides[i], dilations[i], pads[i], pads[n + i]) for i in range(n)]
    if all(naive == ceil for _, naive, ceil in sizes):
        return None                                         # onnx and onnxruntime agree
    if any(ceil > floor for floor, _, ceil in sizes) and node.op_type == "AveragePool" \
            and node.attr("count_include_pad", 0):
        raise _Unsupported
    for i, (floor, _, ceil) in enumerate(sizes):
        if ceil > floor:
            span = shape[2 + i] + pads[i] + pads[n + i] - dilations[i] * (kernel[i] - 1) - 1
            pads[n + i] += (ceil - 1) * strides[i] - span
    return pads


def clear_needless_ceil_mode(view: OnnxView) -> bool:
    """Rewrite (copies of) the affected nodes; True when any changed (shapes must be re-inferred)."""
    changed, unsupported = False, []
    for i, node in enumerate(view.nodes):
        shape = view.static_shape(node.input(0)) if node.op_type in POOLS else None
        try:
            pads = None if shape is None else _rewritten_pads(node, shape)
        except _Unsupported:
            unsupported.append(node.name)
            continue
        if pads is None:
            continue
        proto = onnx.NodeProto()
        proto.CopyFrom(node.proto)
        del proto.attribute[:]
        proto.attribute.extend(a for a in node.proto.attribute if a.name not in ("ceil_mode", "pads"))
        proto.attribute.extend([helper.make_attribute("ceil_mode", 0), helper.make_attribute("pads", pads)])
        view.nodes[i] = ONode(node.name, node.op_type, node.domain, node.inputs, node.outputs,
                              {**node.attrs, "ceil_mode": 0, "pads": pads}, proto)
        changed = True
    if unsupported:
        raise UnsupportedOpError({UNSUPPORTED: unsupported})
    return changed
