"""The lowering's view of the one spec per op kind: frontend/ops.py holds every entry (the frontend
is upstream, so the table lives there and carries the lowering facts as plain data: group, row
role, reduction, row axes, scratch tiles, slicing rule, emission rule); this module re-exports it
with the lookups the lowering uses."""

from __future__ import annotations

from tpuflow.frontend.ops import SPECS, Emit, OpSpec, spec

__all__ = ["SPECS", "Emit", "OpSpec", "spec", "kinds_with"]


def kinds_with(role: str) -> frozenset[str]:
    """The op types with row role `role` (elementwise | reduce | normalize)."""
    return frozenset(k.value for k, s in SPECS.items() if s.row_role == role)
