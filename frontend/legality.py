"""Up-front legality: every unsupported operator of a model, found before any work, in one error.

A node is acceptable when constant folding will remove it (all inputs constant-derivable; Shape
and Size of any tensor, since every shape is static) or when it has an importer whose rules
hold: inputs that must be constant are, attributes are in the supported range.
"""

from __future__ import annotations

from tpuflow.errors import UnsupportedOpError
from tpuflow.frontend import importing  # noqa: F401 (fills the registry)
from tpuflow.frontend.onnx_view import OnnxView, ONode
from tpuflow.frontend.registry import IMPORTERS, NEVER_FOLD, SHAPE_ONLY


class _Facts:
    """Structural knowledge: which tensors will be constant, which are used, known ranks."""

    def __init__(self, view: OnnxView):
        self.const = set(view.initializers)
        self.used = {t for n in view.nodes for t in n.inputs if t} | set(view.outputs)
        self.ranks = {k: len(t.dims) for k, t in view.initializers.items()}
        self.ranks.update({k: len(d) for k, (d, _) in view.inputs.items() if d is not None})
        for vi in view.proto.graph.value_info:
            tt = vi.type.tensor_type
            if vi.type.HasField("tensor_type") and tt.HasField("shape"):
                self.ranks.setdefault(vi.name, len(tt.shape.dim))

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


def check_supported(view: OnnxView) -> None:
    """Raise one UnsupportedOpError listing every unsupported op type with its node names."""
    facts = _Facts(view)
    problems: dict[str, list[str]] = {}
    for node in view.nodes:
        if _folds(node, facts):
            facts.const.update(t for t in node.outputs if t)
            continue
        key = _problem(node, facts)
        if key:
            problems.setdefault(key, []).append(node.name)
    if problems:
        raise UnsupportedOpError(problems)
