"""Constant folding on the ONNX view: nodes whose inputs are all constant are evaluated by
onnx.reference.ReferenceEvaluator on a one-node model; Shape / Size of static tensors become
constants. ConstantOfShape is expanded as a broadcast view (no memory for uniform weights)."""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from tpuflow.errors import ModelError
from tpuflow.frontend.onnx_view import ONode, OnnxView, infer_types, node_reads, one_line
from tpuflow.frontend.registry import NEVER_FOLD, SHAPE_ONLY

MAX_ROUNDS = 8


def evaluate(node: ONode, inputs: dict[str, np.ndarray], view: OnnxView) -> list[np.ndarray]:
    """Run one node on constant inputs with the ONNX reference implementation."""
    infos = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
             for k, v in inputs.items()]
    outs = [helper.make_empty_tensor_value_info(t) for t in node.outputs if t]
    graph = helper.make_graph([node.proto], "fold", infos, outs)
    model = helper.make_model(graph, opset_imports=list(view.proto.opset_import),
                              ir_version=max(view.proto.ir_version, 4))
    feeds = {k: np.require(v, requirements="C") for k, v in inputs.items()}
    return [np.asarray(r) for r in ReferenceEvaluator(model).run(None, feeds)]


def _shape_value(node: ONode, shape: tuple[int, ...]) -> np.ndarray:
    if node.op_type == "Size":
        return np.asarray(int(np.prod(shape)), dtype=np.int64)
    start, end = node.attr("start", 0), node.attr("end", None)
    return np.asarray(shape[start:end], dtype=np.int64)


def _constant_of_shape(node: ONode, shape: np.ndarray) -> np.ndarray:
    value = node.attr("value")
    scalar = numpy_helper.to_array(value).reshape(-1)[0] if value is not None else np.float32(0)
    return np.broadcast_to(np.asarray(scalar), tuple(int(d) for d in shape.reshape(-1)))


def _fold_node(node: ONode, view: OnnxView) -> list[np.ndarray] | None:
    """The node's output values if it folds now, else None."""
    if node.domain not in ("", "ai.onnx") or node.op_type in NEVER_FOLD:
        return None
    if node.op_type in SHAPE_ONLY:
        shape = view.static_shape(node.input(0))
        return None if shape is None else [_shape_value(node, shape)]
    names = [t for t in node.inputs if t]
    if not all(t in view.consts for t in names):
        return None
    if node.op_type == "ConstantOfShape":
        return [_constant_of_shape(node, view.consts[names[0]])]
    if node.op_type in ("DequantizeLinear", "QuantizeLinear"):
        from tpuflow.frontend.imp_quant import fold_quantization
        return [fold_quantization(node, view)]
    try:
        return evaluate(node, {t: view.consts[t] for t in dict.fromkeys(names)}, view)
    except Exception as exc:  # noqa: BLE001 - the reference implementation's complaint is the model's
        raise ModelError(f"{view.label}: constant folding failed at node '{node.name}' ({node.op_type}): "
                         f"{one_line(exc)}") from None


def fold_pass(view: OnnxView) -> int:
    """One topological sweep; returns how many nodes were folded away."""
    kept, folded = [], 0
    for node in view.nodes:
        values = _fold_node(node, view)
        if values is None:
            kept.append(node)
            continue
        for name, value in zip([t for t in node.outputs if t], values):
            view.consts[name] = value
        folded += 1
    view.nodes = kept
    return folded


def drop_dead_nodes(view: OnnxView) -> None:
    """Remove nodes none of whose outputs is used (after folding, shape chains leave some)."""
    while True:
        used = {t for n in view.nodes for t in node_reads(n.proto)} | set(view.outputs)
        kept = [n for n in view.nodes if any(t in used for t in n.outputs if t)]
        if len(kept) == len(view.nodes):
            return
        view.nodes = kept


def _all_static(view: OnnxView) -> bool:
    used = {t for n in view.nodes for t in node_reads(n.proto)} | set(view.outputs)
    return all(view.static_shape(t) is not None for n in view.nodes for t in n.outputs if t in used)


def fold_constants(view: OnnxView) -> int:
    """Fold until nothing changes; shape inference reruns while some shape is still unknown."""
    total = 0
    for _ in range(MAX_ROUNDS):
        folded = fold_pass(view)
        drop_dead_nodes(view)
        total += folded
        if _all_static(view) or not folded:
            break
        infer_types(view)
    return total
