"""Up-front legality: every unsupported operator of a model, found before any work, in one error.

A node is acceptable when constant folding will remove it (all inputs constant-derivable; Shape
and Size of any tensor, since every shape is static) or when it has an importer whose rules
hold: inputs that must be constant are, attributes are in the supported range. An If with a
constant-derivable condition, a Loop with a constant-derivable trip count and every Scan are
removed at compile time (frontend/control.py, frontend/scan.py); the nodes of their subgraphs
are checked again once inlined.
Subgraph nodes are listed as owner/branch/node, and they are listed in the error whenever the
model is rejected, so one error names every problem.
"""

from __future__ import annotations

import copy

from tpuflow.errors import UnsupportedOpError
from tpuflow.frontend import importing  # noqa: F401 (fills the registry)
from tpuflow.frontend.onnx_view import OnnxView, ONode, node_reads
from tpuflow.frontend.reader import parse_attrs
from tpuflow.frontend.registry import IMPORTERS, NEVER_FOLD, SHAPE_ONLY


class _Facts:
    """Structural knowledge: which tensors will be constant, which are used, known ranks."""

    def __init__(self, view: OnnxView):
        self.const = set(view.initializers) | set(view.consts)
        self.used = {t for n in view.nodes for t in node_reads(n.proto) if t} | set(view.outputs)
        self.ranks = {k: len(t.dims) for k, t in view.initializers.items()}
        self.ranks.update({k: len(d) for k, (d, _) in view.inputs.items() if d is not None})
        for vi in view.proto.graph.value_info:
            tt = vi.type.tensor_type
            if vi.type.HasField("tensor_type") and tt.HasField("shape"):
                self.ranks.setdefault(vi.name, len(tt.shape.dim))

    def inside(self, graph, extra_const: list[str]) -> "_Facts":
        """The facts seen from inside a subgraph (its initializers and `extra_const` constant)."""
        inner = copy.copy(self)
        inner.const = self.const | {t.name for t in graph.initializer} | set(extra_const)
        inner.used = self.used | {t for n in graph.node for t in n.input if t} | {o.name for o in graph.output}
        return inner

    def is_const(self, name: str) -> bool:
        return name in self.const

    def is_used(self, name: str) -> bool:
        return name in self.used

    def rank(self, name: str) -> int | None:
        return self.ranks.get(name)


def _folds(node: ONode, facts: _Facts) -> bool:
    if node.domain not in ("", "ai.onnx") or node.op_type in NEVER_FOLD:
        return False
    if node.op_type in SHAPE_ONLY:
        return True
    return all(facts.is_const(t) for t in node.inputs if t)


def _problem(node: ONode, facts: _Facts) -> str | None:
    """The key under which `node` is unsupported ('Op' or 'Op[reason]'), or None if it is fine."""
    if node.domain not in ("", "ai.onnx"):
        return f"{node.domain}.{node.op_type}"
    imp = IMPORTERS.get(node.op_type)
    if imp is None:
        return node.op_type
    for pos, role in imp.const_inputs:
        if node.input(pos) and not facts.is_const(node.input(pos)):
            return f"{node.op_type}[runtime {role}]"
    reason = imp.check(node, facts) if imp.check else None
    return f"{node.op_type}[{reason}]" if reason else None


CONTROL = ("If", "Loop", "Scan")
PIN_HINT = "If[runtime condition: pin the inputs it depends on with --input-value]"
SUBGRAPHS = {"If": ("then_branch", "else_branch"), "Loop": ("body",), "Scan": ("body",)}


def _control_problem(node: ONode, facts: _Facts) -> str | None:
    """Why a control node cannot be removed at compile time, or None."""
    if node.op_type == "If":
        return None if facts.is_const(node.input(0)) else PIN_HINT
    if node.op_type == "Loop":
        if not node.input(0) or not facts.is_const(node.input(0)):
            return "Loop[no constant trip count]"
        return "Loop[runtime condition]" if node.input(1) and not facts.is_const(node.input(1)) else None
    return None                                     # Scan: unrolled over its (static) sequence length


def _subgraph_nodes(node: ONode, branch: str) -> list[ONode]:
    graph = node.attrs[branch]
    return [ONode(f"{node.name}/{branch}/{n.name or f'{n.op_type}_{i}'}", n.op_type, n.domain, tuple(n.input),
                  tuple(n.output), parse_attrs(n), n) for i, n in enumerate(graph.node)]


def _scan(nodes: list[ONode], facts: _Facts, problems: dict, deferred: dict) -> None:
    """Record the problems of `nodes` (and of their subgraphs); a removable control node's
    subgraph problems go to `deferred` (they matter only for the branch taken)."""
    for node in nodes:
        if node.domain in ("", "ai.onnx") and node.op_type in CONTROL:
            key = _control_problem(node, facts)
            if key:
                problems.setdefault(key, []).append(node.name)
            for branch in SUBGRAPHS[node.op_type]:
                graph = node.attrs[branch]
                counters = [i.name for i in graph.input[:2]] if node.op_type == "Loop" else []
                _scan(_subgraph_nodes(node, branch), facts.inside(graph, counters),
                      problems if key else deferred, deferred)
            continue
        if _folds(node, facts):
            facts.const.update(t for t in node.outputs if t)
            continue
        key = _problem(node, facts)
        if key:
            problems.setdefault(key, []).append(node.name)


def check_supported(view: OnnxView) -> None:
    """Raise one UnsupportedOpError listing every unsupported op type with its node names."""
    problems: dict[str, list[str]] = {}
    deferred: dict[str, list[str]] = {}
    _scan(view.nodes, _Facts(view), problems, deferred)
    if problems:
        for key, names in deferred.items():
            problems.setdefault(key, []).extend(names)
        raise UnsupportedOpError(problems)
