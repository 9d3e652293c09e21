"""Engine interleaving: each engine runs its queue in order; an instruction runs once its waits
(Instruction.waits()) hold; a policy picks among the ready engines; no ready engine left is a
deadlock."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

from tpuflow.errors import DeadlockError, OptionError
from tpuflow.isa.base import Engine, Instruction
from tpuflow.program import ENGINES, Program

from tpuflow.hwmodel.functional.machine import describe


@dataclass(frozen=True)
class Wait:
    """Holds once `engine` has completed at least `count` instructions."""

    engine: Engine
    count: int


def waits_of(engine: Engine, instr: Instruction) -> tuple[Wait, ...]:
    """Every wait of an instruction of `engine`'s queue (zero counts dropped)."""
    return tuple(Wait(Engine.of_code(code), count) for code, count in enumerate(instr.waits()) if count > 0)


class EngineState:
    """Queue heads and completed counts of the three engines."""

    def __init__(self, program: Program):
        self.program = program
        self.queues = {e: program.queue(e) for e in ENGINES}
        self.done = {e: 0 for e in ENGINES}
        self.head_waits = {e: self._waits(e) for e in ENGINES}

    def _waits(self, engine: Engine) -> tuple[Wait, ...] | None:
        queue, index = self.queues[engine], self.done[engine]
        return waits_of(engine, queue[index]) if index < len(queue) else None

    def finished(self) -> bool:
        return all(self.done[e] == len(self.queues[e]) for e in ENGINES)

    def ready(self, engine: Engine) -> bool:
        waits = self.head_waits[engine]
        return waits is not None and all(self.done[w.engine] >= w.count for w in waits)

    def ready_engines(self) -> list[Engine]:
        return [e for e in ENGINES if self.ready(e)]

    def head(self, engine: Engine) -> tuple[int, Instruction]:
        index = self.done[engine]
        return index, self.queues[engine][index]

    def complete(self, engine: Engine) -> None:
        self.done[engine] += 1
        self.head_waits[engine] = self._waits(engine)

    def deadlock(self) -> DeadlockError:
        parts = []
        for engine in ENGINES:
            total = len(self.queues[engine])
            if self.done[engine] == total:
                parts.append(f"{engine.name} finished ({total} instructions)")
                continue
            index, instr = self.head(engine)
            label = describe(instr, index + 1, self.program.layer_of(engine, index))
            blocked = [f"{w.engine.name} {w.count} (completed {self.done[w.engine]})"
                       for w in self.head_waits[engine] if self.done[w.engine] < w.count]
            parts.append(f"{engine.name} blocked at {label}, waiting for " + " and ".join(blocked))
        return DeadlockError("deadlock: " + "; ".join(parts))


def _round_robin() -> Callable[[list[Engine]], Engine]:
    last = [len(ENGINES) - 1]

    def pick(ready: list[Engine]) -> Engine:
        for step in range(1, len(ENGINES) + 1):
            engine = ENGINES[(last[0] + step) % len(ENGINES)]
            if engine in ready:
                last[0] = ENGINES.index(engine)
                return engine
        raise AssertionError("pick() needs a ready engine")
    return pick


def _priority(order: tuple[Engine, ...]) -> Callable[[list[Engine]], Engine]:
    def pick(ready: list[Engine]) -> Engine:
        return next(e for e in order if e in ready)
    return pick


def _random(seed: int) -> Callable[[list[Engine]], Engine]:
    rng = random.Random(seed)
    return lambda ready: ready[rng.randrange(len(ready))]


INTERLEAVINGS = ("round_robin", "tiu_first", "gdma_first", "random")


def make_policy(name: str, seed: int = 0) -> Callable[[list[Engine]], Engine]:
    """The engine chooser of an interleaving policy."""
    if name == "round_robin":
        return _round_robin()
    if name == "tiu_first":
        return _priority((Engine.TIU, Engine.GDMA, Engine.TILE))
    if name == "gdma_first":
        return _priority((Engine.GDMA, Engine.TIU, Engine.TILE))
    if name == "random":
        return _random(seed)
    raise OptionError(f"unknown interleave {name!r} (choose from {', '.join(INTERLEAVINGS)})")
