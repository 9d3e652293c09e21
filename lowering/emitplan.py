"""The emitter protocol: a group emitter plans its LMEM use for one region (a frozen plan naming
every buffer), the compiler chooses among the regions' plans, and the emitter emits the chosen
plan into a fresh trial context that is committed only when the emission succeeded.

An emitter class following the protocol has
    plan(region) -> FrozenPlan | None   every choice (tile sizes, copies, what stays resident,
                                        ...) and every LMEM buffer with its offset, or None when
                                        the group does not fit `region`; errors that are not
                                        about space (unsupported shapes) raise LoweringError
    emit(plan)                          the instructions of a plan; no fitting decisions
and optionally
    prefers(plan, other) -> bool        whether `plan` (a later region's) beats `other`
    wants_wider(plan) -> bool           whether a plan that fits should still be compared with
                                        the next region's (else the first fitting plan is taken)
    misfit() -> str                     why nothing fits, for the error (default NO_FIT)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar

from tpuflow.errors import GroupDoesNotFit

REGIONS = ("ring", "full")          # the LMEM regions a group is planned in, in order of preference
NO_FIT = "does not fit LMEM: no tiling fits"


@dataclass(frozen=True)
class FrozenPlan:
    """Where a group emits: its region, that region's per-lane window [start, end), and every
    LMEM buffer it uses as (name, per-lane offset, bytes per lane) in allocation order.
    Emitters subclass it with their own frozen choices."""

    region: str
    window: tuple[int, int]
    buffers: tuple[tuple[str, int, int], ...]
    # names of buffers that may overlap others (an emitter documenting a reuse lists them)
    reused: ClassVar[frozenset[str]] = frozenset()

    @property
    def peak(self) -> int:
        """The end of the highest buffer (0 when there is none), the layer's reported LMEM peak."""
        return max((off + size for _, off, size in self.buffers), default=0)

    @property
    def ring_buffers(self) -> tuple[tuple[str, int, int], ...]:
        """The buffers the LMEM ring places the next group after (all of them unless an
        emitter says otherwise)."""
        return self.buffers


@dataclass(frozen=True)
class NoBuffersPlan(FrozenPlan):
    """The plan of a group that uses no LMEM buffer of its own (it fits any region)."""


def no_buffers(ctx, region: str) -> NoBuffersPlan:
    return NoBuffersPlan(region, ctx.window(region), ())


class PlannedEmission:
    """A protocol emitter's planning instance (over the real context, read only) and how to emit."""

    def __init__(self, make: Callable, planner, group):
        self.make, self.planner, self.group = make, planner, group

    def plan(self, region: str) -> FrozenPlan | None:
        return self.planner.plan(region)

    def prefers(self, plan: FrozenPlan, other: FrozenPlan) -> bool:
        prefers = getattr(self.planner, "prefers", None)
        return prefers is not None and prefers(plan, other)

    def wants_wider(self, plan: FrozenPlan) -> bool:
        wants = getattr(self.planner, "wants_wider", None)
        return wants is not None and wants(plan)

    def misfit(self) -> str:
        misfit = getattr(self.planner, "misfit", None)
        return misfit() if misfit is not None else NO_FIT

    def emit_into(self, trial, plan: FrozenPlan) -> None:
        trial.adopt(plan.ring_buffers)
        self.make(trial, self.group).emit(plan)


def emission_for(make: Callable, ctx, group) -> PlannedEmission:
    """The planner of a group: its emitter over the real context (planning reads it only)."""
    return PlannedEmission(make, make(ctx, group), group)


def choose_plan(emission, ctx, group) -> FrozenPlan:
    """The first region's plan that fits (a later region's when the emitter prefers it); one
    error naming the layer when the group fits no region."""
    chosen = None
    for region in REGIONS:
        plan = emission.plan(region)
        if plan is not None and (chosen is None or emission.prefers(plan, chosen)):
            chosen = plan
        if chosen is not None and not emission.wants_wider(chosen):
            return chosen
    if chosen is not None:
        return chosen
    windows = ", ".join(f"{r} {ctx.window(r)[1] - ctx.window(r)[0]} B" for r in REGIONS)
    raise GroupDoesNotFit(f"layer {group.anchor.name} ({group.anchor.op_type}): {emission.misfit()} in any region "
                          f"(per lane: {windows})", [n.name for n in group.nodes])
