"""The multi-core seam of the scheduler: a run order of every core's instructions that respects the
waits and the SEND/WAIT messages (tpuflow.isa.messages), and which sends each wait consumed; the DAG
of a multi-core program is built in this order and gets an edge from every consumed send."""

from __future__ import annotations

from tpuflow.errors import DeadlockError
from tpuflow.isa.messages import MessageQueue
from tpuflow.program import ENGINES, Program

Slot = tuple[int, int, int]      # (core, Engine.code, 0-based queue index)


def run_order(program: Program) -> tuple[list[Slot], dict[Slot, list[Slot]]]:
    """Every instruction of every core in an order an execution could take (each engine drains
    what its waits and messages allow, core by core), and per message wait the sends of its round."""
    views = [program.core(k) for k in range(program.core_count)]
    queues = [[view.queue(e) for e in ENGINES] for view in views]
    done = [[0] * len(ENGINES) for _ in views]
    messages = MessageQueue(program.chip.core.message_ids)
    rounds: dict[int, list[Slot]] = {}
    consumed: dict[Slot, list[Slot]] = {}
    order: list[Slot] = []
    progressed = True
    while progressed:
        progressed = False
        for k, core_queues in enumerate(queues):
            for code, queue in enumerate(core_queues):
                while done[k][code] < len(queue):
                    slot = (k, code, done[k][code])
                    if not _step(queue[slot[2]], slot, done[k], messages, rounds, consumed):
                        break
                    order.append(slot)
                    done[k][code] += 1
                    progressed = True
    if len(order) < sum(len(q) for core_queues in queues for q in core_queues):
        raise DeadlockError("schedule: the program cannot finish: " + _stuck(views, done))
    return order, consumed


def _step(instr, slot: Slot, done: list[int], messages: MessageQueue, rounds: dict, consumed: dict) -> bool:
    """Run `instr` if its waits and message allow (recording the message); whether it ran."""
    if any(done[other] < count for other, count in enumerate(instr.waits()) if count > 0):
        return False
    message = instr.message()
    if message is None:
        return True
    problem = messages.problem(message)
    if problem:
        raise DeadlockError(f"schedule: core {slot[0]} {ENGINES[slot[1]].letter}{slot[2] + 1}: {problem}")
    if not messages.ready(message):
        return False
    if message.kind == "send":
        messages.send(message)
        rounds.setdefault(message.msg_id, []).append(slot)
    else:
        consumed[slot] = list(rounds.get(message.msg_id, []))
        if messages.wait(message):
            rounds.pop(message.msg_id, None)
    return True


def _stuck(views, done) -> str:
    return "; ".join(f"core {k} {e.name} at {e.letter}{done[k][e.code] + 1} ({view.queue(e)[done[k][e.code]].op_name})"
                     for k, view in enumerate(views) for e in ENGINES if done[k][e.code] < len(view.queue(e)))
