"""The three engines as event-driven components: command list, dispatch on waits, completion -> sync ids.

Common behaviour: an engine takes the head of its command list when (a) its own resources allow
(`earliest`), and (b) its waits hold: every id it waits for (Instruction.waits(): TIU cmd_id_dep on
GDMA, GDMA cmd_id_dep on TIU, TILE wait_tiu_id / wait_gdma_id, a SYS tile wait's operand on TILE)
is at most that engine's sync id (tiu_sync_id, tdma_sync_id, tile_sync_id). Sync ids advance in
order at each instruction's end.

TIU DPC pipes (CUBE for CONV/MM2, VECTOR otherwise; T = TIU period; d_* = the pipe's delays):
  des_in   = dispatch (>= gen_in of the instruction vector_des_buffer places back: DES holds that
             many descriptors; a pipe switch also waits until the previous instruction has ended)
  gen_in   = max(des_in + d_des*T, gen_release_prev)
  start    = max(gen_in + (d_gen + d_issue + d_arb)*T, body_end_prev)      (first COMPUTE cycle)
  body_end = start + (startup + body + bubbles)*T
  gen_release = max(gen_in + (startup + body + bubbles)*T, body_end - lookahead*T)
             (GEN runs ahead of COMPUTE by the ISSUE + ARB buffers: lookahead)
  end      = max(body_end + compute_latency*T, end_prev)                    (in-order retirement)
Vector ARB has no fixed delay (d_arb = 0; its cost is the bubbles). The per-bus GEN address FIFOs
(vector_gen_fifo_depth) are not modelled one by one: GEN's run-ahead is bounded by lookahead.
TILE: one block at a time, start on a tile clock edge, end = start + tile_cycles * period.
GDMA: one command at a time, the next after the previous one's end; a command's timeline relative
to its dispatch comes from gdma.CommandTable (computed for the whole queue before the run).
"""

from __future__ import annotations

from collections import deque

from tpuflow.chip import ChipConfig
from tpuflow.hwmodel.timing.banks import bank_bubbles
from tpuflow.hwmodel.timing.compute import CUBE, tile_cycles, tiu_work
from tpuflow.hwmodel.timing.events import COMPLETE, DISPATCH
from tpuflow.hwmodel.timing.gdma import CommandTable
from tpuflow.isa import Engine, Instruction

TIU, GDMA, TILE = (e.code for e in Engine)
SYNC_NAMES = ("tiu_sync_id", "tdma_sync_id", "tile_sync_id")   # by Engine.code


class EngineBase:
    code: int

    def __init__(self, sim, instrs: list[Instruction], period: int):
        self.sim, self.q = sim, sim.queue
        self.instrs = instrs
        self.period = period
        self.cmds: deque[int] = deque()      # indices in the command list
        self.arrival = [0] * len(instrs)
        self.waits = [tuple(row) for row in sim.waits.ids[self.code].tolist()]
        self.sync = 0
        self.scheduled = False

    def waits_hold(self, index: int) -> bool:
        tiu, gdma, tile = self.waits[index]
        sync = self.sim.sync
        return sync[TIU] >= tiu and sync[GDMA] >= gdma and sync[TILE] >= tile

    # --- to implement
    def earliest(self, index: int) -> int:
        raise NotImplementedError

    def execute(self, index: int, now: int) -> int:
        """Time the instruction; record it; return its end time."""
        raise NotImplementedError

    # --- shared
    def arrive(self, index: int, at: int) -> None:
        """The IFE hands `index` over now; it is in the command list at `at` (earliest() honours it)."""
        self.arrival[index] = at
        self.cmds.append(index)
        self.poke()

    def poke(self) -> None:
        if self.scheduled or not self.cmds:
            return
        index = self.cmds[0]
        if not self.waits_hold(index):
            return
        self.scheduled = True
        self.q.schedule(max(self.q.now, self.earliest(index)), DISPATCH, self._dispatch)

    def _dispatch(self, _) -> None:
        self.scheduled = False
        index = self.cmds.popleft()
        now = self.q.now
        self.sim.record(self.code, index, "dispatch", now)
        self.sim.record(self.code, index, "dependency", now - max(self.arrival[index], self.earliest(index)))
        self.sim.cmd_taken(self.code, index)
        end = self.execute(index, now)
        self.q.schedule(end, COMPLETE, self._complete, index)
        self.poke()

    def _complete(self, index: int) -> None:
        self.sync = self.sim.sync[self.code] = index + 1
        self.sim.sync_changed(self.code)

    def blocked_on(self) -> str:
        """Why the head instruction cannot go (for deadlock reports)."""
        if not self.cmds:
            return "no command in its list"
        return self.describe_wait(self.cmds[0])

    def describe_wait(self, index: int) -> str:
        waited = [(Engine.of_code(o), w) for o, w in enumerate(self.waits[index]) if w or o != TILE and o != self.code]
        ids = " and ".join(f"{e.letter}{w}" for e, w in waited)
        syncs = ", ".join(f"{SYNC_NAMES[e.code]}={self.sim.sync[e.code]}" for e, w in waited)
        return f"{Engine.of_code(self.code).letter}{index + 1} waits for {ids} ({syncs})"


class TiuEngine(EngineBase):
    code = TIU

    def __init__(self, sim, chip: ChipConfig, instrs, period: int):
        super().__init__(sim, instrs, period)
        self.chip = chip
        t = chip.tiu
        self.pipes = {
            CUBE: (t.cube_des_delay_cycles, t.cube_gen_delay_cycles + t.cube_issue_delay_cycles + t.cube_arb_delay_cycles,
                   t.cube_issue_buffer + t.cube_arb_buffer),
            "vector": (t.vector_des_delay_cycles, t.vector_gen_delay_cycles + t.vector_issue_delay_cycles,
                       t.vector_issue_buffer + t.vector_arb_flow_buffer),
        }
        self.work = {}
        self.des_buffer = t.vector_des_buffer
        self.gen_in_history: deque[int] = deque(maxlen=self.des_buffer)
        self.gen_in = 0
        self.gen_release = 0
        self.body_end = 0
        self.end = 0
        self.pipe = None

    def _work(self, index: int):
        w = self.work.get(index)
        if w is None:
            instr = self.instrs[index]
            work = tiu_work(instr, self.chip)
            acc = self.sim.accesses[TIU][index] if self.sim.accesses else None
            w = self.work[index] = (work, bank_bubbles(instr, self.chip, acc))
        return w

    def earliest(self, index: int) -> int:
        work, _ = self._work(index)
        history = self.gen_in_history   # DES holds des_buffer descriptors until GEN takes them
        t = history[0] if len(history) == self.des_buffer else 0
        if self.pipe is not None and work.pipe != self.pipe:
            t = max(t, self.end)
        return max(t, self.arrival[index])

    def execute(self, index: int, now: int) -> int:
        work, bubbles = self._work(index)
        del self.work[index]
        p = self.period
        des, fill, lookahead = self.pipes[work.pipe]
        gen_in = max(now + des * p, self.gen_release)
        start = max(gen_in + fill * p, self.body_end)
        cycles = work.startup + work.body + bubbles
        body_end = start + cycles * p
        self.gen_release = max(gen_in + cycles * p, body_end - lookahead * p)
        end = max(body_end + work.latency * p, self.end)
        self.gen_in, self.body_end, self.end, self.pipe = gen_in, body_end, end, work.pipe
        self.gen_in_history.append(gen_in)
        rec = self.sim.record
        rec(TIU, index, "start", start)
        rec(TIU, index, "end", end)
        rec(TIU, index, "bank_conflict", bubbles * p)
        return end


class GdmaEngine(EngineBase):
    code = GDMA

    def __init__(self, sim, chip: ChipConfig, instrs, period: int, table: CommandTable):
        super().__init__(sim, instrs, period)
        self.table = table
        self.free = 0
        self.dram_first = -1
        self.dram_last = 0

    def earliest(self, index: int) -> int:
        return max(self.free, self.arrival[index])

    def execute(self, index: int, now: int) -> int:
        t = self.table
        end = now + int(t.end[index])
        self.free = end
        rec = self.sim.record
        rec(GDMA, index, "start", now)
        rec(GDMA, index, "end", end)
        rec(GDMA, index, "dma_credit", int(t.credit_stall[index]))
        rec(GDMA, index, "dram", int(t.dram_stall[index]))
        if t.dram_first[index] >= 0:
            first = now + int(t.dram_first[index])
            self.dram_first = first if self.dram_first < 0 else min(self.dram_first, first)
            self.dram_last = max(self.dram_last, now + int(t.dram_last[index]))
        return end


class TileEngine(EngineBase):
    code = TILE

    def __init__(self, sim, chip: ChipConfig, instrs, clock):
        super().__init__(sim, instrs, clock.period)
        self.chip, self.clock = chip, clock
        self.free = 0

    def earliest(self, index: int) -> int:
        return max(self.free, self.arrival[index])

    def execute(self, index: int, now: int) -> int:
        start = self.clock.align(now)
        end = start + tile_cycles(self.instrs[index], self.chip) * self.period
        self.free = end
        self.sim.record(TILE, index, "start", start)
        self.sim.record(TILE, index, "end", end)
        return end
