"""Nodes rewritten on the view before shape inference because onnx's own inference trips on them:
MeanVarianceNormalization without `axes` (its function body references the absent attribute)."""

from __future__ import annotations

import onnx
from onnx import helper

from tpuflow.frontend.onnx_view import ONode, OnnxView

DEFAULT_ATTRS = {"MeanVarianceNormalization": {"axes": [0, 2, 3]}}


def fill_default_attrs(view: OnnxView) -> None:
    """Give nodes in DEFAULT_ATTRS their default attributes explicitly (copies; the model is untouched)."""
    for i, node in enumerate(view.nodes):
        missing = {k: v for k, v in DEFAULT_ATTRS.get(node.op_type, {}).items() if k not in node.attrs}
        if not missing or node.domain not in ("", "ai.onnx"):
            continue
        proto = onnx.NodeProto()
        proto.CopyFrom(node.proto)
        proto.attribute.extend(helper.make_attribute(k, v) for k, v in missing.items())
        view.nodes[i] = ONode(node.name, node.op_type, node.domain, node.inputs, node.outputs,
                              {**node.attrs, **missing}, proto)
