"""ONNX -> canonical Graph: read, check, fix input shapes, infer shapes, fold constants, import, canonicalise.

`load(model, input_shapes=None) -> Graph` is the entry point; the contract of its result is in
frontend/graph.py (Graph, OpNode, TensorInfo) and frontend/ops.py (OpKind and attribute conventions).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from tpuflow.frontend.graph import Graph, OpNode, TensorInfo
from tpuflow.frontend.ops import OpKind

__all__ = ["load", "Graph", "OpNode", "TensorInfo", "OpKind"]


def _name_of(model: Any, label: str) -> str:
    if isinstance(model, (str, Path)):
        return Path(model).stem
    graph_name = getattr(getattr(model, "graph", None), "name", "")
    return graph_name or label.strip("<>")


def load(model: Any, input_shapes: Mapping[str, tuple[int, ...]] | None = None, name: str | None = None) -> Graph:
    """Model path, onnx.ModelProto or serialized bytes -> canonical static-shape Graph.

    `input_shapes` fixes the symbolic dimensions of runtime inputs; a symbolic dimension left over
    is a ModelError naming the input. Unsupported operators are rejected up front, all in one
    UnsupportedOpError."""
    from tpuflow.frontend import canonical, ceil_mode, folding, importing, legality, reader
    from tpuflow.frontend.onnx_view import infer_types
    from tpuflow.frontend.verify import lint

    proto, label = reader.read_model(model)
    view = reader.view_of(proto, label, name or _name_of(model, label))
    legality.check_supported(view)
    reader.run_checker(proto, label, [n.proto for n in view.nodes])
    reader.fix_input_shapes(view, input_shapes)
    view.load_constants()
    infer_types(view, declared=True)
    if ceil_mode.clear_needless_ceil_mode(view):
        infer_types(view)
    folding.fold_constants(view)
    draft = importing.import_view(view)
    lint(draft.nodes, draft.tensors, draft.inputs, draft.outputs, "import")
    if canonical.fold_affine_into_conv(draft):
        lint(draft.nodes, draft.tensors, draft.inputs, draft.outputs, "BatchNormalization folding")
    return draft.to_graph(proto, view.opset)
