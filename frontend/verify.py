"""The graph verifier run between frontend passes (and by later stages): every node is checked
against its kind's spec (frontend/ops.py: attributes, constant inputs, shape function); every
failure names the node, the broken invariant and the fix."""

from __future__ import annotations

from typing import Iterable

import numpy as np

from tpuflow.errors import TpuflowError
from tpuflow.frontend.graph import Graph, OpNode, TensorInfo
from tpuflow.frontend.ops import ALL, CONVERT, expected_shapes, spec


class GraphLintError(TpuflowError):
    """A canonical graph breaks an invariant: a bug in the pass that produced it (exit code 1)."""


def _fail(stage: str, where: str, problem: str, fix: str) -> None:
    raise GraphLintError(f"graph check after {stage}: {where}: {problem}; fix: {fix}")


def _check_tensor(stage: str, info: TensorInfo) -> None:
    where = f"tensor '{info.name}'"
    if not all(isinstance(d, (int, np.integer)) and d >= 0 for d in info.shape):
        _fail(stage, where, f"shape {info.shape} is not static", "give every tensor a static integer shape")
    try:
        np.dtype(info.dtype)
    except TypeError:
        _fail(stage, where, f"dtype '{info.dtype}' is not a numpy dtype name", "use names like 'float32'")
    if info.const is not None and (tuple(info.const.shape) != tuple(info.shape) or info.const.dtype.name != info.dtype):
        _fail(stage, where, f"constant value is {info.const.dtype.name}{list(info.const.shape)} but the tensor "
              f"says {info.dtype}{list(info.shape)}", "build TensorInfo from the constant itself")
    q = info.quant
    if q is not None and (q.storage != info.dtype or q.per_channel and (
            q.axis >= len(info.shape) or info.shape[q.axis] != q.channels)):
        _fail(stage, where, f"quantization {q.describe()} does not fit {info.dtype}{list(info.shape)}",
              "give a quantized tensor its storage dtype and one scale per channel of its axis")


def _check_node(stage: str, node: OpNode, tensors: dict[str, TensorInfo], defined: set[str],
                quantized: bool = True) -> None:
    where = f"node '{node.name}' ({node.op_type})"
    if node.op_type not in ALL:
        _fail(stage, where, "op type is not an OpKind", "lower it to canonical ops in an importer")
    facts = spec(node.op_type)
    missing = [a for a in facts.attrs if a not in node.attrs]
    if missing:
        _fail(stage, where, f"attributes {missing} missing", "set them in the importer")
    for t in node.inputs:
        if t not in tensors:
            _fail(stage, where, f"input '{t}' has no TensorInfo", "register the tensor when creating it")
        if t not in defined and not tensors[t].is_const:
            _fail(stage, where, f"input '{t}' is neither produced earlier, a graph input nor a constant",
                  "keep nodes in topological order and rewire consumers of removed nodes")
    if all(tensors[t].is_const for t in node.inputs):
        _fail(stage, where, "all inputs are constant", "constant folding should have evaluated this node")
    for pos in facts.const_inputs:
        if pos < len(node.inputs) and not tensors[node.inputs[pos]].is_const:
            _fail(stage, where, f"input {pos} ('{node.inputs[pos]}') must be constant",
                  "reject the node as unsupported in the legality check")
    for t in node.outputs:
        if t not in tensors or tensors[t].is_const:
            _fail(stage, where, f"output '{t}' has no runtime TensorInfo", "register outputs as runtime tensors")
        if t in defined:
            _fail(stage, where, f"tensor '{t}' is produced twice", "give every new tensor a fresh name")
    _check_shapes(stage, where, node, tensors)
    if node.op_type in CONVERT:
        _check_convert(stage, where, node, tensors)
    elif quantized and any(tensors[t].quant is not None and not tensors[t].is_const for t in node.inputs):
        for t in node.outputs:
            if tensors[t].quant is None and np.dtype(tensors[t].dtype).kind in "iu":
                _fail(stage, where, f"reads quantized tensors but its integer output '{t}' has no quantization",
                      "carry TensorInfo.quant (dataclasses.replace) when rewriting quantized tensors")


def _check_convert(stage: str, where: str, node: OpNode, tensors: dict[str, TensorInfo]) -> None:
    """QuantizeLinear: float in, quantized out; DequantizeLinear: quantized in, float out."""
    side = node.outputs[0] if node.op_type == "QuantizeLinear" else node.inputs[0]
    other = node.inputs[0] if node.op_type == "QuantizeLinear" else node.outputs[0]
    if tensors[side].quant is None or tensors[other].quant is not None:
        _fail(stage, where, f"'{side}' must be quantized and '{other}' not",
              "set TensorInfo.quant on the integer side of a quantization boundary only")


def _check_shapes(stage: str, where: str, node: OpNode, tensors: dict[str, TensorInfo]) -> None:
    try:
        choices = expected_shapes(node, [tensors[t].shape for t in node.inputs])
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        _fail(stage, where, f"inputs {[tensors[t].shape for t in node.inputs]} do not fit: {exc}",
              "fix the attributes or operands the importer produced")
    if len(choices) != len(node.outputs):
        _fail(stage, where, f"{len(node.outputs)} outputs, expected {len(choices)}", "emit one output per result")
    for t, allowed in zip(node.outputs, choices):
        if tensors[t].shape not in allowed:
            _fail(stage, where, f"output '{t}' has shape {tensors[t].shape}, the op gives {allowed[0]}",
                  "make the tensor shape and the attributes agree")


def lint(nodes: Iterable[OpNode], tensors: dict[str, TensorInfo], inputs: list[str], outputs: list[str],
         stage: str = "frontend", quantized: bool = True) -> None:
    """Check the canonical-graph invariants; raises GraphLintError naming the node and the fix.
    `quantized=False` skips the rule that a node reading quantized tensors writes quantized (or
    float) ones: right after import, before frontend/imp_quant.absorb has carried the Quants."""
    for info in tensors.values():
        _check_tensor(stage, info)
    defined: set[str] = set()
    for name in inputs:
        if name not in tensors or tensors[name].is_const:
            _fail(stage, f"graph input '{name}'", "missing or constant", "list only runtime inputs")
        defined.add(name)
    names: set[str] = set()
    for node in nodes:
        if node.name in names:
            _fail(stage, f"node '{node.name}'", "name used twice", "give every node a unique name")
        names.add(node.name)
        _check_node(stage, node, tensors, defined, quantized)
        defined.update(node.outputs)
    for name in outputs:
        if name not in defined and not (name in tensors and tensors[name].is_const):
            _fail(stage, f"graph output '{name}'", "produced by no node", "keep the output's producer and name")


def lint_graph(graph: Graph, stage: str = "frontend") -> None:
    lint(graph.nodes(), graph.tensors, graph.inputs, graph.outputs, stage)
