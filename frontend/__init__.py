"""ONNX -> canonical Graph: read, check, fix input shapes, infer shapes, fold constants, import, canonicalise.

`load(model, input_shapes=None) -> Graph` is the entry point; the contract of its result is in
frontend/graph.py (Graph, OpNode, TensorInfo) and frontend/ops.py (OpKind and attribute conventions).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from tpuflow.frontend.graph import Graph, OpNode, TensorInfo
from tpuflow.frontend.ops import OpKind

from tpuflow.frontend.pinning import InputValue

__all__ = ["load", "Graph", "OpNode", "TensorInfo", "OpKind", "InputValue"]


def _name_of(model: Any, label: str) -> str:
    if isinstance(model, (str, Path)):
        return Path(model).stem
    graph_name = getattr(getattr(model, "graph", None), "name", "")
    return graph_name or label.strip("<>")


def load(model: Any, input_shapes: Mapping[str, Any] | None = None, name: str | None = None,
         input_values: Mapping[str, Any] | None = None) -> Graph:
    """Model path, onnx.ModelProto or serialized bytes -> canonical static-shape Graph.

    `input_shapes` fixes the symbolic dimensions of runtime inputs; a symbolic dimension left over
    is a ModelError naming the input. `input_values` pins inputs to constants (InputValue or
    array-likes; InputValue entries of `input_shapes` count too): the Graph's model then has them
    as initializers. Unsupported operators are rejected up front, all in one UnsupportedOpError.
    Pre-quantized models (QDQ, QOperator) give the canonical quantized graph of frontend/quant.py, with
    elementwise functions of one 8-bit tensor collapsed into LookupTable nodes (frontend/lookup.py)."""
    from tpuflow.frontend import canonical, ceil_mode, control, folding, importing, legality, pinning, quirks, reader
    from tpuflow.frontend import imp_quant, qoperator
    from tpuflow.frontend.onnx_view import infer_types
    from tpuflow.frontend.verify import lint

    proto, label = reader.read_model(model)
    input_shapes, pinned = pinning.split_inputs(input_shapes)
    proto = pinning.pin_inputs(proto, label, {**pinned, **(input_values or {})})
    view = reader.view_of(proto, label, name or _name_of(model, label))
    as_given = [n.proto for n in view.nodes]
    qoperator.to_qdq(view)
    legality.check_supported(view)
    reader.run_checker(proto, label, as_given)
    reader.fix_input_shapes(view, input_shapes)
    view.load_constants()
    quirks.fill_default_attrs(view)
    infer_types(view, declared=True)
    if ceil_mode.clear_needless_ceil_mode(view):
        infer_types(view)
    folding.fold_constants(view)
    if any(n.op_type in legality.CONTROL for n in view.nodes):
        while control.inline_control_flow(view):
            infer_types(view)
            folding.fold_constants(view)
        legality.check_supported(view)
    imp_quant.transpose_gemm_weights(view)
    draft = importing.import_view(view)
    lint(draft.nodes, draft.tensors, draft.inputs, draft.outputs, "import", quantized=False)
    if imp_quant.is_quantized(draft):
        imp_quant.absorb(draft, view.dequantized, label)
        lint(draft.nodes, draft.tensors, draft.inputs, draft.outputs, "quantized-op absorption")
    canonical.sink_views_below_elementwise(draft)
    lint(draft.nodes, draft.tensors, draft.inputs, draft.outputs, "views moved below elementwise ops")
    if canonical.fold_affine_into_conv(draft):
        lint(draft.nodes, draft.tensors, draft.inputs, draft.outputs, "BatchNormalization folding")
    graph = draft.to_graph(proto, view.opset)
    if imp_quant.is_quantized(draft):
        from tpuflow.frontend.lookup import collapse_lookup_tables
        graph = collapse_lookup_tables(graph)
        lint(graph.nodes(), graph.tensors, graph.inputs, graph.outputs, "lookup tables")
    return graph
