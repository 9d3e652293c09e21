"""Cross-core messages: the SEND/WAIT operands of TIU system.send_msg / wait_msg and GDMA
dma.sys.sys_send / sys_wait, their chip-wide counting rule, and the chip-wide barrier built from them.

Encoding (tpu-mlir 1.30.2 python/debugger/target_2260/opparam.py, SYS_converter and
sDMA_sys_converter): the message id is bits 0-8 of the operand (9 bits: 512 ids, the size of the
SG2260 message queue, target_2260/multi_core.py), the count is 7 bits: bits 16-22 of the TIU SYS
`imm`, bits 9-15 of the GDMA sDMA_sys `constant_value`. `reg_idx` / `index` stay 0; the value
TILE_WAIT_TAG there is tpuflow's TILE synchronisation and never a message.

Semantics (target_2260/multi_core.py and the vendor runtime's tpu_gdma_send_msg(msg_id, wait_cnt)
/ tpu_gdma_wait_msg(msg_id, send_cnt)): every id is one chip-wide entry (sent, remaining_waits).
- send(id, wait_cnt): takes effect once every earlier instruction of its engine has completed and
  never blocks; sent += 1, and if remaining_waits is 0 it becomes wait_cnt (the number of waits
  that will consume this round of the id).
- wait(id, send_cnt): blocks until sent >= send_cnt (the number of sends of this round), then
  remaining_waits -= 1; when it reaches 0 the entry clears (sent = 0) and the id may be reused.
Messages are the only ordering between cores. A chip-wide barrier (the vendor's tpu_sync_all) is one
send and one wait per taking-part engine of every core, all with count = engines x cores; successive
barriers alternate between two ids (the vendor compiler keeps ids 0 and 1 for this), because an id can
only be reused once all the waits of its previous round have consumed it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpuflow.isa.base import Engine, Instruction

MESSAGE_ID_BITS = 9
MESSAGE_COUNT_BITS = 7
TIU_COUNT_SHIFT = 16        # SYS imm: id bits 0-8, count bits 16-22
GDMA_COUNT_SHIFT = 9        # sDMA_sys constant_value: id bits 0-8, count bits 9-15
BARRIER_ENGINES = (Engine.TIU, Engine.GDMA)
BARRIER_IDS = (0, 1)        # the ids successive barriers alternate between


@dataclass(frozen=True)
class Message:
    """One SEND or WAIT: `count` is wait_cnt for a send (waits that consume the round) and
    send_cnt for a wait (sends it waits for)."""

    kind: str       # "send" or "wait"
    msg_id: int
    count: int


def pack(msg_id: int, count: int, count_shift: int) -> int:
    """The operand value carrying (msg_id, count)."""
    if not 0 <= msg_id < 1 << MESSAGE_ID_BITS:
        raise ValueError(f"message id {msg_id} outside 0..{(1 << MESSAGE_ID_BITS) - 1}")
    if not 1 <= count < 1 << MESSAGE_COUNT_BITS:
        raise ValueError(f"message count {count} outside 1..{(1 << MESSAGE_COUNT_BITS) - 1}")
    return msg_id | count << count_shift


def unpack(value: int, count_shift: int) -> tuple[int, int]:
    """(msg_id, count) of an operand value."""
    return value & ((1 << MESSAGE_ID_BITS) - 1), (value >> count_shift) & ((1 << MESSAGE_COUNT_BITS) - 1)


class MessageQueue:
    """The chip-wide message queue under the rule above: per id the sends of the current round
    (`sent`) and the waits still to consume it (`remaining`). Callers check `ready` before `wait`."""

    def __init__(self, ids: int):
        self.sent = [0] * ids
        self.remaining = [0] * ids

    def problem(self, message: Message) -> str:
        """Why `message` cannot be used on this queue ('' when it can)."""
        if not 0 <= message.msg_id < len(self.sent):
            return f"message id {message.msg_id} beyond the chip's {len(self.sent)} (core.message_ids)"
        return f"message {message.msg_id} with count 0" if message.count < 1 else ""

    def ready(self, message: Message) -> bool:
        """A send always is; a wait once its round has `count` sends (an unusable message is, so
        that its user reports `problem`)."""
        return message.kind == "send" or self.problem(message) != "" or self.sent[message.msg_id] >= message.count

    def send(self, message: Message) -> str:
        """Deliver a send; a non-empty string says why it breaks the round rule."""
        i = message.msg_id
        self.sent[i] += 1
        if self.remaining[i] == 0:
            self.remaining[i] = message.count
        elif self.remaining[i] != message.count:
            return f"message {i} sent for {message.count} waits, but this round of the id expects {self.remaining[i]}"
        return ""

    def wait(self, message: Message) -> bool:
        """Consume one wait of the round; True when that cleared the id."""
        i = message.msg_id
        self.remaining[i] -= 1
        if self.remaining[i] == 0:
            self.sent[i] = 0
            return True
        return False

    def leftovers(self) -> list[str]:
        return [f"message {i}: {n} sends never consumed" for i, n in enumerate(self.sent) if n]


def barrier(cores: int, msg_id: int) -> dict[Engine, list[Instruction]]:
    """The instructions every core appends to its TIU and GDMA queues for one chip-wide barrier over
    `cores` cores on `msg_id`: each engine sends then waits, all counts = engines x cores."""
    from tpuflow.isa.gdma import SysDma
    from tpuflow.isa.tiu import SysTiu
    count = len(BARRIER_ENGINES) * cores
    return {Engine.TIU: [SysTiu.send(msg_id, count), SysTiu.wait(msg_id, count)],
            Engine.GDMA: [SysDma.send(msg_id, count), SysDma.wait(msg_id, count)]}


def barrier_id(index: int) -> int:
    """The message id of the `index`-th (0-based) barrier of a program."""
    return BARRIER_IDS[index % len(BARRIER_IDS)]
