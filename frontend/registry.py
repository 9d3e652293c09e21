"""The importer registry: which ONNX op types the frontend imports, and their up-front legality rules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from tpuflow.frontend.onnx_view import ONode


class Facts(Protocol):
    """What the up-front legality check knows about a tensor before any folding."""

    def is_const(self, name: str) -> bool: ...
    def is_used(self, name: str) -> bool: ...
    def rank(self, name: str) -> int | None: ...


@dataclass(frozen=True)
class Importer:
    """`run(node, ctx)` emits canonical nodes; `const_inputs` maps input position -> role for inputs
    that must be constant; `check(node, facts)` returns the reason a node is unsupported, or None."""

    run: Callable
    const_inputs: tuple[tuple[int, str], ...] = ()
    check: Callable[[ONode, Facts], str | None] | None = None


IMPORTERS: dict[str, Importer] = {}

# Ops that are accepted only when constant folding removes them (all inputs constant), and ops
# that are never folded (their result is not a function of their inputs).
NEVER_FOLD = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                        "Multinomial", "Bernoulli", "If", "Loop", "Scan"})
SHAPE_ONLY = frozenset({"Shape", "Size"})        # constant whenever their input has a static shape


def importer(*op_types: str, const_inputs: tuple[tuple[int, str], ...] = (),
             check: Callable[[ONode, Facts], str | None] | None = None):
    """Register `fn` as the importer of `op_types`."""
    def register(fn):
        for op in op_types:
            if op in IMPORTERS:
                raise RuntimeError(f"two importers for {op}")
            IMPORTERS[op] = Importer(fn, const_inputs, check)
        return fn
    return register


def rank_is(expected: int, what: str = "input") -> Callable[[ONode, Facts], str | None]:
    """A check: input 0 must have rank `expected` when its rank is already known."""
    def check(node: ONode, facts: Facts) -> str | None:
        r = facts.rank(node.input(0))
        return f"{r}-D {what}" if r is not None and r != expected else None
    return check


def unused_outputs(first: int, what: str) -> Callable[[ONode, Facts], str | None]:
    """A check: outputs from position `first` on must not be consumed."""
    def check(node: ONode, facts: Facts) -> str | None:
        return what if any(t and facts.is_used(t) for t in node.outputs[first:]) else None
    return check


def all_of(*checks: Callable[[ONode, Facts], str | None]) -> Callable[[ONode, Facts], str | None]:
    def check(node: ONode, facts: Facts) -> str | None:
        for c in checks:
            reason = c(node, facts)
            if reason:
                return reason
        return None
    return check
