"""Multi-core execution: every core's engines on one shared DDR and private LMEM, ordered across
cores by SEND/WAIT messages on the chip-wide message queue (tpuflow.isa.messages semantics); a state
where no engine of any core can proceed is a deadlock naming every waiting engine and core."""

from __future__ import annotations

import random
from typing import Callable

from tpuflow.errors import DeadlockError, OptionError
from tpuflow.isa.base import Engine
from tpuflow.isa.messages import Message, MessageQueue
from tpuflow.program import ENGINES, Program

from tpuflow.hwmodel.functional.engines import INTERLEAVINGS, EngineState, waits_of
from tpuflow.hwmodel.functional.errors import ExecutionError
from tpuflow.hwmodel.functional.machine import Machine, describe
from tpuflow.hwmodel.functional.race import RaceDetector, join

PER_CORE = len(ENGINES)


class ChipState:
    """Queue heads of every engine of every core, and the message queue."""

    def __init__(self, program: Program):
        self.views = [program.core(k) for k in range(program.core_count)]
        self.states = [EngineState(view) for view in self.views]
        self.messages = MessageQueue(program.chip.core.message_ids)

    def finished(self) -> bool:
        return all(state.finished() for state in self.states)

    def ready_units(self) -> list[int]:
        """Ready (core * 3 + engine code) units: own waits hold, and a message wait has its sends."""
        ready = []
        for core, state in enumerate(self.states):
            for engine in ENGINES:
                if state.ready(engine):
                    message = state.head(engine)[1].message()
                    if message is None or self.messages.ready(message):
                        ready.append(core * PER_CORE + engine.code)
        return ready

    def label(self, core: int, engine: Engine, index: int) -> str:
        view = self.views[core]
        return f"core {core} " + describe(view.queue(engine)[index], index + 1, view.layer_of(engine, index))

    def deadlock(self) -> DeadlockError:
        parts = []
        for core, state in enumerate(self.states):
            for engine in ENGINES:
                total = len(state.queues[engine])
                if state.done[engine] == total:
                    continue
                index, instr = state.head(engine)
                blocked = [f"{w.engine.name} {w.count} (completed {state.done[w.engine]})"
                           for w in state.head_waits[engine] if state.done[w.engine] < w.count]
                message = instr.message()
                if message is not None and not self.messages.ready(message):
                    blocked.append(f"message {message.msg_id} ({self.messages.sent[message.msg_id]} of "
                                   f"{message.count} sends)")
                parts.append(f"{self.label(core, engine, index)} ({engine.name}) waits for " + " and ".join(blocked))
        return DeadlockError("deadlock, no engine of any core can proceed: " + "; ".join(parts))


def make_unit_policy(name: str, units: int, seed: int = 0) -> Callable[[list[int]], int]:
    """The chooser among ready units of an interleaving policy (engines.INTERLEAVINGS)."""
    if name == "round_robin":
        last = [units - 1]

        def pick(ready: list[int]) -> int:
            after = [u for u in ready if u > last[0]]
            last[0] = after[0] if after else ready[0]
            return last[0]
        return pick
    if name in ("tiu_first", "gdma_first"):
        first = Engine.TIU if name == "tiu_first" else Engine.GDMA
        rank = {first: 0, Engine.TIU: 1, Engine.GDMA: 1, Engine.TILE: 2}
        return lambda ready: min(ready, key=lambda u: (rank[ENGINES[u % PER_CORE]], u))
    if name == "random":
        rng = random.Random(seed)
        return lambda ready: ready[rng.randrange(len(ready))]
    raise OptionError(f"unknown interleave {name!r} (choose from {', '.join(INTERLEAVINGS)})")


def execute_cores(machines: list[Machine], program: Program, *, race_check: bool = True,
                  interleave: str = "round_robin", seed: int = 0, observe=None) -> None:
    """Run every queue of every core to its end (machines[k] is core k, all on one DDR).
    `observe(core, engine, index)`, when given, is called after each instruction executes."""
    chip = ChipState(program)
    pick = make_unit_policy(interleave, len(chip.states) * PER_CORE, seed)
    detector = RaceDetector(program) if race_check else None
    round_clocks: dict[int, tuple] = {}
    while not chip.finished():
        ready = chip.ready_units()
        if not ready:
            raise chip.deadlock()
        core, code = divmod(pick(ready), PER_CORE)
        engine, state = ENGINES[code], chip.states[core]
        index, instr = state.head(engine)
        message = instr.message()
        clock = None
        if detector is not None:
            joins = (round_clocks[message.msg_id],) if message and message.kind == "wait" \
                and message.msg_id in round_clocks else ()
            clock = detector.step(engine, index, waits_of(engine, instr), core=core, joins=joins)
        machines[core].execute(instr, index + 1, chip.views[core].layer_of(engine, index))
        if message is not None:
            _deliver(chip, message, core, engine, index, clock, round_clocks)
        state.complete(engine)
        if observe is not None:
            observe(core, engine, index)
    leftovers = chip.messages.leftovers()
    if leftovers:
        raise ExecutionError("program ended with unconsumed messages: " + "; ".join(leftovers))


def _deliver(chip: ChipState, message: Message, core: int, engine: Engine, index: int, clock, round_clocks) -> None:
    problem = chip.messages.problem(message) or (chip.messages.send(message) if message.kind == "send" else "")
    if problem:
        raise ExecutionError(f"{chip.label(core, engine, index)}: {problem}")
    if message.kind == "send":
        if clock is not None:
            previous = round_clocks.get(message.msg_id)
            round_clocks[message.msg_id] = clock if previous is None else join(previous, clock)
    elif chip.messages.wait(message):
        round_clocks.pop(message.msg_id, None)


def has_messages(program: Program) -> bool:
    return any(instr.message() is not None for s in program.cores for instr in (*s.tiu, *s.gdma))
