"""Every core of a multi-core Program on one event heap: per-core simulators sharing the DRAM (memory.py)
and the chip-wide message queue; deadlocks name the waiting engines and cores.

Messages (tpuflow.isa.messages: TIU system.send_msg / wait_msg, GDMA dma.sys.sys_send / sys_wait):
  * a SEND takes effect when it completes (its engine retires in order, so every earlier instruction
    of that engine has completed) and is seen by the board core.message_latency_ns later: then
    MessageQueue.send (sent[id] += 1, and remaining[id] = wait_cnt if it was 0);
  * a WAIT is dispatched only once sent[id] >= send_cnt (its other waits held too); dispatching it
    consumes one wait (MessageQueue.wait: remaining[id] -= 1, at 0 the id clears);
  * an id beyond core.message_ids or a round sent with two counts is a ProgramError;
  * a WAIT that can never pass leaves its engine unfinished: the run ends with a DeadlockError naming
    every stuck engine, its core and what its head instruction waits for.
With one core the board is still there (a single-core program holding messages gets the same rule).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from tpuflow.errors import DeadlockError, TpuflowError
from tpuflow.hwmodel.timing.clocks import ns_to_ps
from tpuflow.hwmodel.timing.events import COMPLETE, EventQueue
from tpuflow.hwmodel.timing.result import DramResult
from tpuflow.isa.messages import MessageQueue


class ProgramError(TpuflowError):
    """A program breaks the message rules (an id beyond core.message_ids, a round sent with two counts)."""


class MessageBoard:
    """The chip-wide message queue (tpuflow.isa.messages.MessageQueue: the round rule) in time: sends
    arrive after the message latency; engines blocked on an id are poked when it changes."""

    def __init__(self, queue: EventQueue, latency_ps: int, ids: int):
        self.q, self.latency = queue, latency_ps
        self.queue = MessageQueue(ids)
        self.blocked: dict[int, list] = defaultdict(list)

    def sent(self, msg) -> int:
        return self.queue.sent[msg.msg_id] if not self.queue.problem(msg) else 0

    def passes(self, engine, msg) -> bool:
        """Whether a WAIT `msg` may go now; if not, `engine` is poked when the id's count changes."""
        self._check(msg)
        if self.queue.ready(msg):
            return True
        if engine not in self.blocked[msg.msg_id]:
            self.blocked[msg.msg_id].append(engine)
        return False

    def consume(self, msg) -> None:
        self.queue.wait(msg)

    def send(self, msg) -> None:
        """A SEND completed now: it reaches the board after the message latency."""
        self._check(msg)
        self.q.schedule(self.q.now + self.latency, COMPLETE, self._arrive, msg)

    def _arrive(self, msg) -> None:
        problem = self.queue.send(msg)
        if problem:
            raise ProgramError(f"timing model: {problem}")
        for engine in self.blocked.pop(msg.msg_id, []):
            engine.poke()

    def _check(self, msg) -> None:
        problem = self.queue.problem(msg)
        if problem:
            raise ProgramError(f"timing model: {problem}")


def message_board(queue: EventQueue, chip) -> MessageBoard:
    """The board of `chip`: core.message_latency_ns, core.message_ids."""
    return MessageBoard(queue, ns_to_ps(chip.core.message_latency_ns), chip.core.message_ids)


def check_finished(simulators) -> None:
    """Raise DeadlockError naming every engine (and core, with several) that did not finish."""
    heads = [h for sim in simulators for h in sim.stuck_heads()]
    if heads:
        raise DeadlockError(f"timing model: engines wait on each other forever: {'; '.join(heads)}")


def simulate_cores(program, *, dep_mode=None, check=True, memory="rate"):
    """Simulate every core of `program` on one heap; the result is core 0's SimResult (its instructions,
    engines and stalls) with `cores` (one SimResult per core), the latency of the slowest core and the
    DRAM statistics of all cores. memory="burst" gives each core its own per-burst DRAM (no sharing)."""
    from tpuflow.hwmodel.timing.core import Simulator, shared_capacity
    from tpuflow.hwmodel.timing.deps import resolve_waits, same_instructions
    from tpuflow.hwmodel.timing.memory import SharedMemory

    chip = program.chip
    queue = EventQueue()
    shared = SharedMemory(queue, chip.umc_count, shared_capacity(chip)) if memory == "rate" else None
    board = message_board(queue, chip)
    sims = []
    for k in range(program.core_count):
        view = program.core(k)
        accesses: list = [[], [], []]
        same = same_instructions(view)
        waits = resolve_waits(view, dep_mode, check=check, keep=accesses, same=same)
        sims.append(Simulator(view, waits, accesses, same, memory=memory, queue=queue, shared=shared, board=board,
                              core=k if program.core_count > 1 else None))
    for sim in sims:
        sim.ife.start()
    queue.run()
    check_finished(sims)
    results = [sim.result() for sim in sims]
    dram = chip_dram(sims, results, chip) if len(results) > 1 else None
    for sim in sims:
        sim.release()
    if len(results) == 1:
        return results[0]
    return dataclasses.replace(results[0], cores=results, total_ps=max(r.total_ps for r in results),
                               events=queue.processed, dram=dram)


def chip_dram(sims, results, chip) -> DramResult:
    """The DRAM statistics of every core together (the chip's traffic, active from the first core's first
    DDR access to the last one's; peak = dram.chip_peak_gbps)."""
    d = [r.dram for r in results]
    spans = [(e.dram_first, e.dram_last) for e in (sim.engines[1] for sim in sims) if e.dram_first >= 0]
    active = max(last for _, last in spans) - min(first for first, _ in spans) if spans else 0
    return DramResult(sum(x.bytes_read for x in d), sum(x.bytes_written for x in d), sum(x.bursts for x in d),
                      sum(x.page_hits for x in d), sum(x.page_misses for x in d), sum(x.page_opens for x in d),
                      active, chip.ddr_chip_peak_bytes_per_second / 1e9)
