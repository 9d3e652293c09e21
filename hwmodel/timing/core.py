"""The simulator of one core: wires IFE, TIU, GDMA (+ WDC) and TILE onto an event heap (its own, or the one
every core shares, cores.py) and runs it."""

from __future__ import annotations

import numpy as np

from tpuflow.hwmodel.timing.clocks import Clocks
from tpuflow.hwmodel.timing.cores import check_finished, message_board
from tpuflow.hwmodel.timing.deps import IssueOrder, Waits, same_instructions
from tpuflow.hwmodel.timing.descriptors import descriptor_bits
from tpuflow.hwmodel.timing.engines import GDMA, TILE, TIU, GdmaEngine, GdmaFlowEngine, TiuEngine, TileEngine
from tpuflow.isa import Engine, TMove
from tpuflow.hwmodel.timing.events import EventQueue
from tpuflow.hwmodel.timing.gdma import CommandModel
from tpuflow.hwmodel.timing.ife import Ife
from tpuflow.hwmodel.timing.memory import SharedMemory
from tpuflow.hwmodel.timing.transfers import TransferModel
from tpuflow.hwmodel.timing.result import STAGES, STALLS, DramResult, SimResult, busy_union_ps
from tpuflow.program import ENGINES, Program

_IFE_COLUMNS = ("txi_acq", "pack", "decode", "check", "issue", "transfer", "fifo_full")
_ENGINE_COLUMNS = tuple(c for c in STAGES + STALLS if c not in _IFE_COLUMNS)


def shared_capacity(chip) -> float:
    """How many cores' worth of UMC time each UMC serves (memory.py): chip total over one core's port."""
    return max(1.0, chip.ddr_chip_peak_bytes_per_second / chip.ddr_peak_bytes_per_second)


def _tile_ddr_moves(program: Program) -> bool:
    """Whether a TMOVE of the TILE queue has a DDR side (its flows then share the memory with the GDMA's)."""
    return any(isinstance(instr, TMove) and (acc := instr.accesses(program.chip)).ddr_reads + acc.ddr_writes
               for instr in program.tile)


def _descriptor_bits(queues, order) -> list[int]:
    """descriptor_bits of every instruction in issue order (a TIU or GDMA descriptor's size is its class's)."""
    of_class: dict = {}
    bits = []
    for code, index in order:
        instr = queues[code][index]
        if code == TILE:
            bits.append(descriptor_bits(instr))
            continue
        size = of_class.get(type(instr))
        if size is None:
            size = of_class[type(instr)] = descriptor_bits(instr)
        bits.append(size)
    return bits


def _op_names(queue, same: list[int]) -> list[str]:
    """op_name of every instruction of a queue (equal instructions share it)."""
    names: list[str] = []
    for i, instr in enumerate(queue):
        first = same[i]
        names.append(names[first] if first < i else instr.op_name)
    return names


def _layers(program: Program, engine) -> list[str]:
    """program.layer_of of every instruction of `engine`'s queue."""
    names, count = program.layer_names(engine), len(program.queue(engine))
    return list(names[:count]) + [""] * (count - len(names))


class Simulator:
    """One core: the IFE and the three engines on one event heap (sim.queue). Engines fill their columns
    (Python lists, converted to arrays in the result); the IFE stage times and fifo_full stalls are
    gathered from the IFE's per-position lists after the run."""

    def __init__(self, program: Program, waits: Waits, accesses: list | None = None, same: list | None = None,
                 memory: str = "rate", queue: EventQueue | None = None, shared: SharedMemory | None = None,
                 board=None, core: int | None = None):
        self.program, self.waits = program, waits
        self.core = core                # None: the only core (names in reports stay as before)
        self.same = same or same_instructions(program)     # per engine: first equal instruction
        self.sync = [0, 0, 0]          # completed instructions per engine (tiu / tdma / tile sync ids)
        self.accesses = accesses if accesses and len(accesses[0]) == len(program.tiu) else None
        chip = program.chip
        self.chip = chip
        self.clocks = clocks = Clocks.of(chip)
        self.queue = queue or EventQueue()
        self.board = board or message_board(self.queue, chip)
        if memory == "burst":
            self.commands = CommandModel(chip, clocks).table(program.gdma, self.same[GDMA])
        else:
            self.commands = TransferModel(chip, clocks).costs(program.gdma, self.same[GDMA])
            self.memory = shared or SharedMemory(self.queue, chip.umc_count, shared_capacity(chip),
                                                 exclusive=not _tile_ddr_moves(program))
        queues = [program.queue(e) for e in ENGINES]
        self.cols = [{c: [0] * len(q) for c in _ENGINE_COLUMNS} for q in queues]
        issue = IssueOrder.of(program)
        self.order = list(zip(issue.code.tolist(), issue.index.tolist()))      # program.issue_sequence()
        self.pos_of = [np.flatnonzero(issue.code == code).tolist() for code in range(len(queues))]
        if any(len(p) != len(q) for p, q in zip(self.pos_of, queues)):
            raise IndexError(f"issue order {program.issue_order!r} does not match the queues")
        bits = _descriptor_bits(queues, self.order)
        gdma = (GdmaEngine(self, chip, queues[GDMA], clocks.gdma.period, self.commands) if memory == "burst" else
                GdmaFlowEngine(self, chip, queues[GDMA], clocks.gdma, self.commands, self.memory))
        self.engines = [TiuEngine(self, chip, queues[TIU], clocks.tiu.period), gdma,
                        TileEngine(self, chip, queues[TILE], clocks.tile, getattr(self, "memory", None))]
        for engine in self.engines:
            engine.watch(self.engines)
        self.ife = Ife(self, chip, clocks, self.order, bits)

    def _ife_columns(self) -> dict[str, np.ndarray]:
        """IFE stage times and the fifo_full stall of every instruction (engine-major rows, queue order)."""
        pos = np.asarray(self.pos_of[TIU] + self.pos_of[GDMA] + self.pos_of[TILE], dtype=np.int64)
        ife, front = self.ife, self.ife.front.t
        at = (lambda values: np.asarray(values, dtype=np.int64)[pos])
        issue, moved = at(front["iss_push"]), at(ife.moved)
        cols = {"txi_acq": at(front["txi"]), "pack": at(front["pack_push"]), "decode": at(front["dec_push"]),
                "check": at(front["chk_push"]), "issue": issue, "transfer": at(ife.arrived)}
        cols["fifo_full"] = issue - at(ife.ready) + np.maximum(0, moved - issue - ife.handover)
        return cols

    # ---- run
    def run(self) -> SimResult:
        self.ife.start()
        self.queue.run()
        check_finished([self])
        return self.result()

    def release(self) -> None:
        """Drop the engines and the IFE (they point back at the simulator): the run's objects are freed by
        reference counting instead of waiting for a cyclic garbage collection."""
        self.engines = self.ife = None

    def stuck_heads(self) -> list[str]:
        """What each unfinished engine's head waits for (core named when there are several)."""
        queues = (self.program.tiu, self.program.gdma, self.program.tile)
        where = f"core {self.core} " if self.core is not None else ""
        heads = [where + e.blocked_on() for e, q in zip(self.engines, queues) if e.sync < len(q)]
        if heads and self.ife.pos < len(self.order):
            code, index = self.order[self.ife.pos]
            engine = Engine.of_code(code)
            heads.append(f"{where}the IFE cannot issue {engine.letter}{index + 1}: the "
                         f"{engine.name} request FIFO and command list are full")
        return heads

    def result(self) -> SimResult:
        program, waits = self.program, self.waits
        engine = np.concatenate([np.full(len(c["end"]), code, dtype=np.int8) for code, c in enumerate(self.cols)])
        cmd_id = np.concatenate([np.arange(1, len(c["end"]) + 1, dtype=np.int64) for c in self.cols])
        ids = np.concatenate(waits.ids)
        first_field = [next(iter(q[0].WAIT_FIELDS)).code if q else 0 for q in map(program.queue, ENGINES)]
        deps = np.concatenate([w[:, column] for w, column in zip(waits.ids, first_field)])   # cmd_id_dep
        on = {e.value: ids[:, e.code] for e in ENGINES}
        t, g, b = self.cols
        columns = {k: np.asarray(t[k] + g[k] + b[k], dtype=np.int64) for k in _ENGINE_COLUMNS}
        columns.update(self._ife_columns())
        times = {s: columns[s] for s in STAGES}
        stalls = {s: columns[s] for s in STALLS}
        ops = [name for e in ENGINES for name in _op_names(program.queue(e), self.same[e.code])]
        layers = [name for e in ENGINES for name in _layers(program, e)]
        bounds = np.cumsum([0] + [len(c["end"]) for c in self.cols]).tolist()
        busy = {e.value: busy_union_ps(times["start"][lo:hi], times["end"][lo:hi])
                for e, lo, hi in zip(ENGINES, bounds, bounds[1:])}
        st, g = self.commands.state, self.engines[GDMA]     # g: the GDMA engine from here
        active = g.dram_last - g.dram_first if g.dram_first >= 0 else 0
        dram = DramResult(st.bytes_read, st.bytes_written, st.bursts, st.page_hits.copy(), st.page_misses.copy(),
                          st.page_opens.copy(), active, self.chip.dram.peak_gbps)
        total = int(times["end"].max()) if len(engine) else 0
        periods = (self.clocks.tiu.period, self.clocks.gdma.period, self.clocks.tile.period)
        return SimResult(engine, cmd_id, deps, ops, layers, times, stalls, periods, busy, dram, total,
                         events=self.queue.processed, chip_fingerprint=self.chip.fingerprint(), waits=on)
