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
TILE: one block at a time, start on a tile clock edge, end = start + tile_cycles * period; consecutive
TMATMUL / TGEMV blocks stream through the cube as the TIU's cube pipe does: the next one starts when the
previous one's body ends (its fill_latency overlaps), an ACCCVT starts after the previous end (it reads the
ACC). With tile.acc_buffers > 1 an ACCCVT drains its ACC on a path of its own (after the cube's last block,
one ACCCVT at a time), the engine goes on after block_overhead and the cube keeps streaming: a TMATMUL
that starts a fresh ACC (no .ACC) waits until the buffer it takes has drained: the n-th fresh start waits
for the end of the ACCCVT number n - acc_buffers (ACCs are taken and drained in the same order: one tile
after another, or two interleaved tiles in ACCs 0 and 1 drained in that order). TPUSH, TMOVE and TIMG2COL do not use the cube: they wait only for the ACCCVT writes whose
slots they touch and leave the stream as it was (a TMATMUL after TMATMUL, TMOVE still streams; issue 16). A TMOVE
goes to the tile buffer's DMA port (TilePort) and the engine takes the next block block_overhead cycles later;
the port runs its moves in order (LMEM / tile only: move_port_latency + bytes / move_port_bytes_per_cycle
tile cycles; with a DDR side: the GDMA's cost of its descriptor, as a flow of the shared memory owned by
the core, so it shares the core's DDR port with the GDMA). A block that touches LMEM bytes of a move in
flight waits for it; blocks retire in order (end = max(own end, the previous block's end), like the TIU's
in-order retirement), and the sync id advances at retirement.
A move frees the port when its bandwidth phase ends (the next move's requests overlap its latency): with a
DDR side the GDMA's bandwidth phase, without one its bytes at move_port_bytes_per_cycle (the port pipelines
its LMEM requests; before issue 16's halo work such a move held the port until it landed).
A TIMG2COL goes the same way to the tile buffer's expansion path (a second TilePort: img2col_latency_cycles
+ written bytes / img2col_bytes_per_cycle tile cycles, in order); a unit does not begin a TMOVE or TIMG2COL
whose LMEM bytes meet an earlier one still in flight on the other unit until that one has landed (the
engine goes on meanwhile: the two units keep a scoreboard, the halo's move and its expansion).
GDMA: one command at a time, the next after the previous one's end. Rate model (default): the command
is a flow of the shared memory (memory.py) from its dispatch; when its bandwidth phase ends at t_bw,
end = align_gdma(t_bw + latency) (transfers.py). Per-burst model (memory="burst"): the command's
timeline relative to its dispatch comes from gdma.CommandTable (computed for the whole queue first).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from tpuflow.chip import ChipConfig
from tpuflow.hwmodel.timing.banks import bank_bubbles
from tpuflow.hwmodel.timing.compute import CUBE, tile_cycles, tiu_work
from tpuflow.hwmodel.timing.events import COMPLETE, DISPATCH, push
from tpuflow.hwmodel.timing.gdma import CommandTable
from tpuflow.hwmodel.timing.transfers import TransferCosts, TransferModel
from tpuflow.isa import AccCvt, Engine, Instruction, SysDma, SysTiu, TImg2Col, TMatmul, TMove, TPush

TIU, GDMA, TILE = (e.code for e in Engine)
SYNC_NAMES = ("tiu_sync_id", "tdma_sync_id", "tile_sync_id")   # by Engine.code


class EngineBase:
    """Command list, dispatch once the head's waits hold, completion -> the engine's sync id. The
    per-instruction columns it fills are Python lists (sim.cols[code][column])."""

    code: int

    def __init__(self, sim, instrs: list[Instruction], period: int):
        self.sim, self.q = sim, sim.queue
        self.instrs = instrs
        self.period = period
        self.cmds: deque[int] = deque()      # indices in the command list
        self.arrival = [0] * len(instrs)
        self.waits = sim.waits.ids[self.code].tolist()     # per instruction [tiu, gdma, tile] ids
        self.sync = 0
        self.sync_ids = sim.sync             # every engine's sync id (shared list, by Engine.code)
        self.watchers: list = []             # the engines with an instruction that waits on this one (watch())
        self.planned = 0                     # earliest() of the head when its dispatch was scheduled
        self.pos_of = sim.pos_of[self.code]  # issue position of each instruction
        self.scheduled = False
        self.col = sim.cols[self.code]
        self.col_dispatch, self.col_dependency = self.col["dispatch"], self.col["dependency"]
        self.col_start, self.col_end = self.col["start"], self.col["end"]
        self.messages = {i: m for i, instr in enumerate(instrs) if isinstance(instr, (SysTiu, SysDma))
                         and (m := instr.message()) is not None}   # cross-core SEND / WAIT (cores.py)

    def watch(self, engines: list) -> None:
        """Only engines that have an instruction waiting on this engine's sync id can be released by it."""
        ids = self.sim.waits.ids
        self.watchers = [e for e in engines if e is not self and bool(ids[e.code][:, self.code].any())]

    def waits_hold(self, index: int) -> bool:
        tiu, gdma, tile = self.waits[index]
        sync = self.sync_ids
        if sync[TIU] < tiu or sync[GDMA] < gdma or sync[TILE] < tile:
            return False
        if self.messages:
            msg = self.messages.get(index)
            if msg is not None and msg.kind == "wait":
                return self.sim.board.passes(self, msg)
        return True

    def message_dispatched(self, index: int) -> None:
        msg = self.messages.get(index)
        if msg is not None and msg.kind == "wait":
            self.sim.board.consume(msg)

    # --- to implement (the default: when it has arrived and the engine is free)
    def earliest(self, index: int) -> int:
        arrival = self.arrival[index]
        return self.free if self.free > arrival else arrival

    def execute(self, index: int, now: int) -> int:
        """Time the instruction; record it; return its end time."""
        raise NotImplementedError

    # --- shared
    def _dispatched(self, since: int) -> tuple[int, int]:
        """Take the next command now: (its index, now), its dispatch time and its dependency wait (from
        the later of its arrival and `since`, when the engine could have taken it) recorded."""
        index = self.cmds.popleft()
        now = self.q.now
        self.col_dispatch[index] = now
        arrival = self.arrival[index]
        self.col_dependency[index] = now - (arrival if arrival > since else since)
        self._taken(index)
        return index, now

    def arrive(self, index: int, at: int) -> None:
        """The IFE hands `index` over now; it is in the command list at `at` (earliest() honours it)."""
        self.arrival[index] = at
        self.cmds.append(index)
        if not self.scheduled:
            self.poke()

    def poke(self) -> None:
        if self.scheduled or not self.cmds:
            return
        index = self.cmds[0]
        tiu, gdma, tile = self.waits[index]
        sync = self.sync_ids
        if sync[TIU] < tiu or sync[GDMA] < gdma or sync[TILE] < tile:
            return
        if self.messages and not self.waits_hold(index):
            return
        self.scheduled = True
        q = self.q
        self.planned = earliest = self.earliest(index)     # unchanged until this dispatch executes
        now = q.now
        q.seq = seq = q.seq + 1
        push(q.heap, (earliest if earliest > now else now, DISPATCH, seq, self._dispatch, None))

    def _taken(self, index: int) -> None:
        """The instruction left the command list: the IFE frees its bytes; a WAIT message is consumed."""
        self.sim.ife.cmd_taken(self.code, self.pos_of[index])
        if self.messages:
            self.message_dispatched(index)

    def _dispatch(self, _) -> None:
        self.scheduled = False
        index, now = self._dispatched(self.planned)
        end = self.execute(index, now)
        self.q.schedule(end, COMPLETE, self._complete, index)
        self.poke()

    def _complete(self, index: int) -> None:
        code, sync = self.code, index + 1
        self.sync = self.sync_ids[code] = sync
        if self.messages:
            msg = self.messages.get(index)
            if msg is not None and msg.kind == "send":
                self.sim.board.send(msg)
        # poke the engines whose head waited for exactly this one (a head whose waits held before was
        # already scheduled by its own poke)
        for engine in self.watchers:
            cmds = engine.cmds
            if cmds and not engine.scheduled and engine.waits[cmds[0]][code] == sync:
                engine.poke()

    def blocked_on(self) -> str:
        """Why the head instruction cannot go (for deadlock reports)."""
        if not self.cmds:
            return "no command in its list"
        index = self.cmds[0]
        msg = self.messages.get(index)
        if msg is not None and msg.kind == "wait" and self.sim.board.sent(msg) < msg.count:
            letter = Engine.of_code(self.code).letter
            return (f"{letter}{index + 1} waits for message {msg.msg_id} ({self.sim.board.sent(msg)} of "
                    f"{msg.count} sends arrived)")
        return self.describe_wait(index)

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
        p = period
        self.pipes = {   # pipe -> (DES delay, GEN..ARB fill, GEN lookahead), in ps
            CUBE: (t.cube_des_delay_cycles * p,
                   (t.cube_gen_delay_cycles + t.cube_issue_delay_cycles + t.cube_arb_delay_cycles) * p,
                   (t.cube_issue_buffer + t.cube_arb_buffer) * p),
            "vector": (t.vector_des_delay_cycles * p, (t.vector_gen_delay_cycles + t.vector_issue_delay_cycles) * p,
                       (t.vector_issue_buffer + t.vector_arb_flow_buffer) * p),
        }
        self.same = sim.same[TIU]
        self.work_of: list = [None] * len(instrs)
        self.col_bank = self.col["bank_conflict"]
        self.des_buffer = t.vector_des_buffer
        self.gen_in_history: deque[int] = deque(maxlen=self.des_buffer)
        self.gen_in = 0
        self.gen_release = 0
        self.body_end = 0
        self.end = 0
        self.pipe = None

    def _work(self, index: int):
        """(pipe, body ps, latency ps, bubble ps) of an instruction, computed once per distinct instruction."""
        w = self.work_of[index]
        if w is None:
            first = self.same[index]
            w = self.work_of[first] if first < index else None
            if w is None:
                instr = self.instrs[index]
                acc = self.sim.accesses[TIU][index] if self.sim.accesses else None
                work, bubbles, p = tiu_work(instr, self.chip), bank_bubbles(instr, self.chip, acc), self.period
                w = (work.pipe, (work.startup + work.body + bubbles) * p, work.latency * p, bubbles * p)
            self.work_of[index] = w
        return w

    def earliest(self, index: int) -> int:
        pipe = (self.work_of[index] or self._work(index))[0]
        history = self.gen_in_history   # DES holds des_buffer descriptors until GEN takes them
        t = history[0] if len(history) == self.des_buffer else 0
        if self.pipe is not None and pipe != self.pipe and self.end > t:
            t = self.end
        arrival = self.arrival[index]
        return t if t > arrival else arrival

    def execute(self, index: int, now: int) -> int:
        pipe, body, latency, bubbles = self.work_of[index] or self._work(index)
        des, fill, lookahead = self.pipes[pipe]
        gen_in, start = now + des, self.gen_release
        gen_in = gen_in if gen_in > start else start
        start, body_end = gen_in + fill, self.body_end
        start = start if start > body_end else body_end
        body_end = start + body
        release, end = gen_in + body, body_end - lookahead
        self.gen_release = release if release > end else end
        end, last = body_end + latency, self.end
        end = end if end > last else last
        self.gen_in, self.body_end, self.end, self.pipe = gen_in, body_end, end, pipe
        self.gen_in_history.append(gen_in)
        self.col_start[index], self.col_end[index], self.col_bank[index] = start, end, bubbles
        return end


class GdmaEngine(EngineBase):
    code = GDMA

    def __init__(self, sim, chip: ChipConfig, instrs, period: int, table: CommandTable):
        super().__init__(sim, instrs, period)
        self.span = table.end.tolist()
        self.dram_span = list(zip(table.dram_first.tolist(), table.dram_last.tolist()))
        self.col["dma_credit"][:] = table.credit_stall.tolist()
        self.col["dram"][:] = table.dram_stall.tolist()
        self.free = 0
        self.dram_first = -1
        self.dram_last = 0


    def execute(self, index: int, now: int) -> int:
        end = self.free = now + self.span[index]
        self.col_start[index], self.col_end[index] = now, end
        first, last = self.dram_span[index]
        if first >= 0:
            first += now
            self.dram_first = first if self.dram_first < 0 else min(self.dram_first, first)
            self.dram_last = max(self.dram_last, now + last)
        return end


class GdmaFlowEngine(EngineBase):
    """GDMA on the rate model: a command runs as a flow of sim.memory; stalls: dma_credit = the credit
    term beyond the other limits, dram = the bandwidth phase beyond the core's own limits and its DDR
    bytes at dram.peak_gbps (DRAM pages, few UMCs, other cores' transfers). While a command is in flight
    the engine stays `scheduled` (nothing else dispatches)."""

    code = GDMA

    def __init__(self, sim, chip: ChipConfig, instrs, clock, costs: TransferCosts, memory):
        super().__init__(sim, instrs, clock.period)
        self.clock, self.costs, self.memory = clock, costs, memory
        self.ps_per_byte = 1000 / chip.dram.peak_gbps
        port, credit, dram = (np.asarray(v, dtype=np.int64).reshape(-1) for v in (costs.port, costs.credit, costs.dram))
        ddr = np.asarray(costs.ddr_bytes, dtype=np.int64).reshape(-1)
        self.solo = np.maximum(np.maximum(port, credit), dram).tolist()      # costs.solo_ps
        ideal = (ddr * self.ps_per_byte).astype(np.int64)                    # the bytes at the port's peak rate
        self.own = np.maximum(np.maximum(port, credit), ideal).tolist()
        self.col["dma_credit"][:] = np.maximum(0, credit - np.maximum(port, dram)).tolist()
        self.latency, self.ddr_bytes = costs.latency, costs.ddr_bytes
        self.col_dram = self.col["dram"]
        self.free = 0
        self.running = -1            # the command in flight (-1: none)
        self.dram_first = -1
        self.dram_last = 0

    def _dispatch(self, _) -> None:
        index, now = self._dispatched(self.free)
        self.running = index
        self.col_start[index] = now
        solo, memory = self.solo[index], self.memory
        if memory.exclusive:
            self._moved(now + solo if solo > 0 else now)
            return
        c = self.costs
        memory.start(solo, lambda: c.occupancy_of(index), c.ddr_bytes[index], self._moved, owner=self.sim)

    def _moved(self, t: int) -> None:
        """The bandwidth phase of the running command ended at `t`."""
        index = self.running
        start = self.col_start[index]
        dram = t - start - self.own[index]
        self.col_dram[index] = dram if dram > 0 else 0
        period = self.period
        end = self.free = -(-(t + self.latency[index]) // period) * period      # the next GDMA clock edge
        self.col_end[index] = end
        if self.ddr_bytes[index]:
            first = self.dram_first
            self.dram_first = start if first < 0 or start < first else first
            if t > self.dram_last:
                self.dram_last = t
        q = self.q
        q.seq = seq = q.seq + 1
        push(q.heap, (end, COMPLETE, seq, self._finish, index))       # end >= t >= now

    def _finish(self, index: int) -> None:
        self.running = -1
        self.scheduled = False
        self._complete(index)
        self.poke()


class TileEngine(EngineBase):
    code = TILE

    def __init__(self, sim, chip: ChipConfig, instrs, clock, memory=None):
        super().__init__(sim, instrs, clock.period)
        self.chip, self.clock = chip, clock
        self.free = 0
        self.port = TilePort(sim, chip, instrs, clock, memory, self._move_done)
        self.expander = TilePort(sim, chip, instrs, clock, None, self._move_done, TImg2Col)   # TIMG2COL's path
        self.port.other, self.expander.other = self.expander, self.port
        self.units = {TMove: self.port, TImg2Col: self.expander}
        self.finished = [False] * len(instrs)
        self.completed = 0            # blocks whose completion was signalled (in order)
        self.parked = -1              # a block waiting for a move in flight that it conflicts with
        self.last_matmul = False      # the previous cube block run was a TMATMUL / TGEMV (the cube pipeline)
        self.last_end = 0             # the latest end of a block run so far
        self.cube_end = 0             # the latest end of a TMATMUL / TGEMV (the ACC's results complete)
        self.tile_writes: list[tuple[int, int]] = []   # (ACCCVT index, end) of conversions maybe still running
        self.acc_buffers = chip.tile.acc_buffers
        self.drain_free = 0           # the ACCCVT drain path is free (acc_buffers > 1)
        self.drained: list[int] = []  # end of every ACCCVT so far (acc_buffers > 1: when its ACC is free again)
        self.fresh = 0                # TMATMULs that started a fresh ACC so far (the n-th takes the buffer drain n - acc_buffers freed)

    def _dispatch(self, _) -> None:
        index, now = self._dispatched(self.planned)
        unit = self.units.get(type(self.instrs[index]))
        if unit is not None:
            self._hand_over(index, now, unit)
            return
        if self.blocks(index):
            self.parked = index           # stays `scheduled`: nothing behind it dispatches
            return
        self._run(index, now)

    def blocks(self, index: int) -> bool:
        """Whether block `index` touches LMEM bytes of a move or expansion in flight."""
        return self.port.blocks(index) or self.expander.blocks(index)

    def _written(self, index: int, now: int) -> int:
        """When the ACCCVT tile writes that block `index` touches have landed (0: none pending)."""
        self.tile_writes = [(i, end) for i, end in self.tile_writes if end > now]
        if not self.tile_writes:
            return 0
        acc = self.port.tile_acc(Engine.TILE, index)
        return max((end for i, end in self.tile_writes if _conflict(acc, self.port.tile_acc(Engine.TILE, i))), default=0)

    def _hand_over(self, index: int, now: int, unit: "TilePort") -> None:
        """A TMOVE or TIMG2COL: neither reads nor drains the cube, waits for the tile writes it touches."""
        start = max(self.clock.align(now), self._written(index, now))
        self.free = start + tile_cycles(self.instrs[index], self.chip) * self.period     # the hand-over
        unit.submit(index, start)
        self.scheduled = False
        self.poke()

    def _run(self, index: int, now: int) -> None:
        instr, period = self.instrs[index], self.period
        start = self.clock.align(now)
        if isinstance(instr, TPush):         # queue bookkeeping: off the cube, after the tile writes it pushes
            start = max(start, self._written(index, now))
            end = start + tile_cycles(instr, self.chip) * period
            self.free = end
        elif isinstance(instr, AccCvt) and self.acc_buffers > 1:     # the drain path: the cube goes on
            start = max(start, self.cube_end, self.drain_free)
            end = self.drain_free = start + tile_cycles(instr, self.chip) * period
            self.drained.append(end)
            self.tile_writes.append((index, end))
            self.free = self.clock.align(now) + self.chip.tile.block_overhead_cycles * period
        else:
            streams = isinstance(instr, TMatmul) and self.last_matmul
            if not streams and self.last_end > start:
                start = self.last_end            # another block waits for the cube's results
            if isinstance(instr, TMatmul) and not instr.accumulates and self.acc_buffers > 1:
                back = self.fresh - self.acc_buffers     # a fresh ACC: the drain that freed its buffer
                if 0 <= back < len(self.drained):
                    start = max(start, self.drained[back])
                self.fresh += 1
            end = start + tile_cycles(instr, self.chip) * period
            self.last_matmul = isinstance(instr, TMatmul)
            self.free = end - self.chip.tile.fill_latency_cycles * period if self.last_matmul else end
            if self.last_matmul:
                self.cube_end = max(self.cube_end, end)
            else:
                self.tile_writes.append((index, end))
        self.last_end = max(self.last_end, end)
        self.col_start[index], self.col_end[index] = start, end
        self.q.schedule(end, COMPLETE, self._block_done, index)
        self.scheduled = False
        self.poke()

    def _block_done(self, index: int) -> None:
        self.finished[index] = True
        self._signal()

    def _move_done(self, index: int) -> None:
        self.finished[index] = True
        self._signal()
        parked = self.parked
        if parked >= 0 and not self.blocks(parked):
            self.parked = -1
            self._run(parked, self.q.now)

    def _signal(self) -> None:
        """Retire, in queue order, every block done so far: its end is its retirement (as the TIU's
        in-order retirement), the sync id advances."""
        now = self.q.now
        while self.completed < len(self.finished) and self.finished[self.completed]:
            self.completed += 1
            if self.col_end[self.completed - 1] < now:
                self.col_end[self.completed - 1] = now
            self._complete(self.completed - 1)


class TilePort:
    """The tile buffer's DMA port: TMOVEs one at a time in order, each from its hand-over (see the module
    docstring); `done(index)` when a move has landed."""

    def __init__(self, sim, chip: ChipConfig, instrs, clock, memory, done, kind=TMove):
        self.sim, self.q, self.clock, self.memory, self.done = sim, sim.queue, clock, memory, done
        self.col = sim.cols[TILE]
        moves = [i for i, instr in enumerate(instrs) if isinstance(instr, kind)]
        self.acc = {i: sim.program.accesses(Engine.TILE, i) for i in moves}
        self.tile_acc = sim.program.accesses
        ddr = [i for i in moves if self.acc[i].ddr_reads or self.acc[i].ddr_writes]
        self.ddr_row = {i: row for row, i in enumerate(ddr)}
        self.costs = TransferModel(chip, sim.clocks).costs([instrs[i].desc for i in ddr]) if ddr else None
        phases = {i: unit_phases(instrs[i], chip) for i in moves if i not in self.ddr_row}
        self.lmem_ps = {i: (lat + busy) * clock.period for i, (lat, busy) in phases.items()}
        self.busy_ps = {i: busy * clock.period for i, (_, busy) in phases.items()}
        self.waiting: deque[tuple[int, int]] = deque()
        self.running = -1
        self.inflight: list[int] = []
        self.other: TilePort | None = None     # the other unit of the tile buffer (DMA port / expansion path)
        self.stalled = -1                      # the item waiting for an earlier conflicting one on `other`

    def submit(self, index: int, start: int) -> None:
        self.inflight.append(index)
        self.waiting.append((index, start))
        if self.running < 0:
            self._next()

    def blocks(self, index: int) -> bool:
        """Whether block `index` touches LMEM bytes of an earlier move in flight (RAW, WAR, WAW)."""
        if not self.inflight:
            return False
        acc = self.tile_acc(Engine.TILE, index)
        return any(_conflict(acc, self.acc[m]) for m in self.inflight if m < index)

    def _next(self) -> None:
        if not self.waiting:
            return
        index, start = self.waiting.popleft()
        self.running = index
        now = self.q.now
        self.q.schedule(start if start > now else now, DISPATCH, self._begin, index)

    def _begin(self, index: int) -> None:
        if self.other is not None and self.other.blocks(index):
            self.stalled = index           # the unit stays held (running) until the other unit's item lands
            return
        now = self.q.now
        self.col["start"][index] = now
        row = self.ddr_row.get(index)
        if row is None:
            self._landed(index, now + self.lmem_ps[index])
            self.q.schedule(now + self.busy_ps[index], COMPLETE, self._transferred, index)
            return
        c = self.costs
        if self.memory is None or self.memory.exclusive:
            self._moved(now + c.solo_ps(row))
            return
        self.memory.start(c.solo_ps(row), lambda: c.occupancy_of(row), c.ddr_bytes[row], self._moved, owner=self.sim)

    def _moved(self, t: int) -> None:
        """The bandwidth phase ended: the port takes the next move now (its requests go out while this
        one's last data is still on the way), this one lands after its latency."""
        index = self.running
        row = self.ddr_row[index]
        self.running = -1
        self._landed(index, self.clock.align(t + self.costs.latency[row]))
        self._next()

    def _transferred(self, index: int) -> None:
        """An LMEM-side item's bytes went through: the unit takes the next one (pipelined: this one lands
        after its latency)."""
        if self.running == index:
            self.running = -1
            self._next()

    def _landed(self, index: int, end: int) -> None:
        self.col["end"][index] = end
        self.q.schedule(end, COMPLETE, self._finish, index)

    def _finish(self, index: int) -> None:
        self.inflight.remove(index)
        if self.running == index:
            self.running = -1
            self._next()
        other = self.other
        if other is not None and other.stalled >= 0 and not self.blocks(other.stalled):
            stalled, other.stalled = other.stalled, -1
            other._begin(stalled)
        self.done(index)


def unit_phases(instr, chip: ChipConfig) -> tuple[int, int]:
    """(latency, transfer) tile cycles of a TMOVE without a DDR side on the DMA port, or of a TIMG2COL on
    the expansion path: its bytes at the unit's width hold the unit, the latency does not (pipelined)."""
    t = chip.tile
    if isinstance(instr, TImg2Col):
        return t.img2col_latency_cycles, -(-instr.tiles * instr.tile_bytes(chip) // max(1, t.img2col_bytes_per_cycle))
    return t.move_port_latency_cycles, -(-instr.desc.nbytes // max(1, t.move_port_bytes_per_cycle))


def unit_cycles(instr, chip: ChipConfig) -> int:
    """Tile cycles from a unit beginning a TMOVE (no DDR side) or TIMG2COL to its landing."""
    return sum(unit_phases(instr, chip))


def _overlap(a, b) -> bool:
    return a.lane < b.lane + b.lanes and b.lane < a.lane + a.lanes and a.lo < b.hi and b.lo < a.hi


def _conflict(x, y) -> bool:
    """Whether two Accesses touch common LMEM bytes with at least one writing."""
    return (any(_overlap(w, r) for w in x.lmem_writes for r in y.lmem_reads + y.lmem_writes)
            or any(_overlap(w, r) for w in y.lmem_writes for r in x.lmem_reads))
