"""The DRAM every core shares, as a rate model in the event heap: GDMA transfers are flows whose rates are
recomputed (max-min fair) whenever a transfer starts or ends; no per-burst or per-beat events.

A flow f (one GDMA command, transfers.py) has a bandwidth phase of solo length D_f = max(port, credit, dram)
ps and takes occupancy o_{f,u} ps of UMC u over it; after the phase, its fixed latency L_f follows
(no bandwidth), then the command ends on a GDMA clock edge.

Rates. Flow f progresses at speed s_f in (0, 1] of its solo speed: its remaining solo time R_f
falls by s_f per ps. Resources: each UMC u serves at most C = dram.chip_peak_gbps / dram.peak_gbps
ps of one core's UMC time per ps (a core alone sees a UMC at 1/U of its port rate; all cores together
reach the chip's total: C = 204.8 / 68.264 = 3 on sg2260), and the flows of one owner (a core: its
GDMA and its tile buffer's DMA port, TMOVE) together at most 1 (the core's own DDR port), so

    sum_f s_f * o_{f,u} / D_f <= C   for every UMC u,        s_f <= 1 (the core's own port limits),
    sum_{f of owner k} s_f * o_{f,u} / D_f <= 1   for every owner k and UMC u.

The speeds are max-min fair in bytes per ps, x_f = s_f * B_f / D_f (progressive filling: every
unfrozen flow's byte rate rises together; a flow freezes when it reaches its solo rate or a UMC it
uses is full). One flow alone always runs at s = 1 (o_{f,u} <= D_f), so a single core's commands take
exactly latency + solo time, in integer ps. Shared speeds are floats; a flow's end is
ceil(now + R_f / s_f - 1e-6), recomputed at every start and end (events carry a version; stale ones are
dropped). With one core (one GDMA, one command at a time) no two flows overlap: the memory is
`exclusive` and a flow's end is known at its start.
"""

from __future__ import annotations

import math
from typing import Callable

from tpuflow.hwmodel.timing.events import COMPLETE, EventQueue

ROUNDING_PS = 1e-6     # float noise of shared speeds: an end within this of a whole ps is that ps


class Flow:
    """One transfer in flight: solo bandwidth-phase ps, remaining solo ps, UMC occupancies, bytes."""

    __slots__ = ("solo", "remaining", "usage", "nbytes", "speed", "version", "done", "started", "_per_byte", "owner")

    def __init__(self, solo: int, usage: Callable[[], tuple], nbytes: int, done: Callable[[int], None],
                 owner: object = None):
        self.owner = owner        # flows of one owner share its port (None: a flow of its own)
        self.solo, self.remaining = solo, solo
        self.usage, self.nbytes = usage, max(1, nbytes)     # usage() -> (UMCs, occupancy ps), asked when shared
        self.speed, self.version, self.done, self.started = 1.0, 0, done, 0
        self._per_byte = None

    def per_byte(self) -> list[tuple[int, float]]:
        """(UMC, ps of it per byte moved), computed once."""
        if self._per_byte is None:
            self._per_byte = [(u, o / self.nbytes) for u, o in zip(*self.usage())]
        return self._per_byte


class SharedMemory:
    """The flows of every core's GDMA on one event queue (see the module docstring)."""

    def __init__(self, queue: EventQueue, umcs: int, capacity: float, exclusive: bool = False):
        self.q, self.umcs, self.capacity = queue, umcs, capacity
        self.exclusive = exclusive      # one GDMA on the chip: flows never overlap, no end events needed
        self.flows: list[Flow] = []
        self.last = 0
        self.recomputes = 0

    def start(self, solo: int, usage: Callable[[], tuple], nbytes: int, done: Callable[[int], None],
              owner: object = None) -> None:
        """A transfer starts now; `done(t)` is called at the end of its bandwidth phase; usage() gives its
        (UMCs, occupancy ps); `owner` (a core) caps its flows together at one port's UMC time."""
        now = self.q.now
        if solo <= 0 or self.exclusive:
            done(now + max(solo, 0))
            return
        flow = Flow(solo, usage, nbytes, done, owner)
        flow.started = now
        if not self.flows:                       # alone: solo speed, exact integer end
            self.last = now
            self.flows.append(flow)
            self.q.schedule(now + solo, COMPLETE, self._end, (flow, 0))
            return
        self._advance(now)
        self.flows.append(flow)
        self._reshare(now)

    def _advance(self, now: int) -> None:
        dt = now - self.last
        if dt:
            for f in self.flows:
                f.remaining = f.remaining - f.speed * dt if f.speed != 1.0 else f.remaining - dt
        self.last = now

    def _end(self, arg) -> None:
        flow, version = arg
        if version != flow.version or flow not in self.flows:
            return
        now = self.q.now
        self._advance(now)
        self.flows.remove(flow)
        flow.done(now)
        if self.flows:
            self._reshare(now)

    def _reshare(self, now: int) -> None:
        self.recomputes += 1
        for flow, speed in zip(self.flows, max_min_speeds(self.flows, self.umcs, self.capacity)):
            flow.speed = speed
            flow.version += 1
            remaining = max(flow.remaining, 0)
            end = now + math.ceil((remaining if speed == 1.0 else remaining / speed) - ROUNDING_PS)
            self.q.schedule(end, COMPLETE, self._end, (flow, flow.version))


def max_min_speeds(flows: list[Flow], umcs: int, capacity: float) -> list[float]:
    """Speeds (fraction of each flow's solo speed) that are max-min fair in bytes per ps (progressive
    filling over the UMCs and each flow's solo rate)."""
    cap = [f.nbytes / f.solo for f in flows]                                   # solo byte rate
    per_byte = [f.per_byte() for f in flows]                                   # UMC ps per byte
    owners: dict = {}
    for f in flows:                                   # owners with several flows: one more resource per UMC
        if f.owner is not None:
            owners[id(f.owner)] = owners.get(id(f.owner), 0) + 1
    shared = [k for k, n in owners.items() if n > 1]
    limit = [capacity] * umcs + [1.0] * (umcs * len(shared))
    if shared:
        slot = {k: umcs * (1 + i) for i, k in enumerate(shared)}
        per_byte = [pb + ([(slot[id(f.owner)] + u, a) for u, a in pb] if f.owner is not None and id(f.owner) in slot
                          else []) for f, pb in zip(flows, per_byte)]
    umcs = len(limit)
    rate = [0.0] * len(flows)
    used = [0.0] * umcs
    active = list(range(len(flows)))
    level = 0.0
    while active:
        load = [0.0] * umcs
        for i in active:
            for u, a in per_byte[i]:
                load[u] += a
        step = min(cap[i] for i in active)
        for u in range(umcs):
            if load[u] > 0:
                step = min(step, (limit[u] - used[u]) / load[u])
        level = max(level, step)
        full = {u for u in range(umcs) if load[u] > 0 and used[u] + level * load[u] >= limit[u] * (1 - 1e-12)}
        frozen = [i for i in active if cap[i] <= level * (1 + 1e-12) or any(u in full for u, _ in per_byte[i])]
        for i in frozen:
            rate[i] = min(level, cap[i])
            for u, a in per_byte[i]:
                used[u] += rate[i] * a
        active = [i for i in active if i not in frozen]
    return [min(1.0, r / c) for r, c in zip(rate, cap)]
