"""SimResult: the columnar outcome of a timing simulation (numpy arrays per field) and its CSV rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from tpuflow.isa import Engine

ENGINE_NAMES = tuple(e.value for e in Engine)     # by Engine.code, as in SimResult.engine
ENGINE_LETTERS = "".join(e.letter for e in Engine)
STAGES = ("txi_acq", "pack", "decode", "check", "issue", "transfer", "dispatch", "start", "end")
STALLS = ("dependency", "bank_conflict", "dma_credit", "fifo_full", "dram")


@dataclass
class DramResult:
    bytes_read: int
    bytes_written: int
    bursts: int
    page_hits: np.ndarray      # per UMC
    page_misses: np.ndarray    # per UMC: another row was open (close + open)
    page_opens: np.ndarray     # per UMC: bank closed, first use (open only)
    active_ps: int             # first DRAM request start .. last completion
    peak_gbps: float

    @property
    def page_hit_rate(self) -> float:
        total = int(self.page_hits.sum() + self.page_misses.sum() + self.page_opens.sum())
        return float(self.page_hits.sum()) / total if total else 0.0

    def achieved_gbps(self, span_ps: int | None = None) -> float:
        span = self.active_ps if span_ps is None else span_ps
        return (self.bytes_read + self.bytes_written) / span * 1e3 if span > 0 else 0.0


@dataclass
class SimResult:
    """Per instruction (engine-major order: every TIU, then GDMA, then TILE instruction, each queue in
    cmd_id order): engine code (0 tiu, 1 gdma, 2 tile), cmd_id, the effective dependency, op name,
    layer, the stage times in ps (`times[stage]`; see ns() and cycles()), stall ps by cause
    (`stalls[cause]`); per engine busy ps; DRAM statistics; total latency.

    Stages: txi_acq, pack, decode, check, issue (IFE, ns timestamps of TPUPerf), transfer (command
    list arrival), dispatch (engine took it), start (TIU: first COMPUTE cycle), end (last done).
    Stalls: dependency (dispatch delayed by waits), bank_conflict (arbiter bubbles), dma_credit
    (issue threads waiting for outstanding credits), fifo_full (IFE held by full request FIFO /
    command list), dram (last DDR response beyond an ideal memory's).
    cmd_id_dep: TIU/GDMA rows their cmd_id_dep (the other engine's id), TILE rows wait_tiu_id;
    waits["tiu" | "gdma" | "tile"]: per row the id of that engine it waits for (0 = none; TIU/GDMA
    rows wait for TILE through their SYS tile waits), all as the engines honoured them."""

    engine: np.ndarray
    cmd_id: np.ndarray
    cmd_id_dep: np.ndarray
    op: list[str]
    layer: list[str]
    times: dict[str, np.ndarray]
    stalls: dict[str, np.ndarray]
    periods_ps: tuple[int, int, int]
    busy_ps: dict[str, int]
    dram: DramResult
    total_ps: int
    events: int = 0
    chip_fingerprint: str = ""
    waits: dict[str, np.ndarray] = field(default_factory=dict)   # engine -> id of it each row waits for
    extra: dict = field(default_factory=dict)
    cores: list = field(default_factory=list)      # multi-core: one SimResult per core (core 0 first)

    def __len__(self) -> int:
        return len(self.engine)

    @property
    def total_ns(self) -> float:
        return self.total_ps / 1e3

    @property
    def total_us(self) -> float:
        return self.total_ps / 1e6

    def ns(self, stage: str) -> np.ndarray:
        return self.times[stage] / 1e3

    def _period(self) -> np.ndarray:
        return np.asarray(self.periods_ps, dtype=np.int64)[self.engine]

    def cycles(self, stage: str) -> np.ndarray:
        """Stage times in cycles of each instruction's engine clock."""
        return self.times[stage] // self._period()

    def stall_cycles(self, cause: str) -> np.ndarray:
        return self.stalls[cause] // self._period()

    def index(self, engine: str, cmd_id: int) -> int:
        """Row of instruction `cmd_id` (1-based) of `engine` ('tiu'/'gdma'/'tile' or 'B'/'D'/'T')."""
        code = ENGINE_NAMES.index(engine) if engine in ENGINE_NAMES else ENGINE_LETTERS.index(engine)
        rows = np.flatnonzero((self.engine == code) & (self.cmd_id == cmd_id))
        if len(rows) != 1:
            raise KeyError(f"no instruction {engine}{cmd_id}")
        return int(rows[0])

    def stall_totals_ps(self) -> dict[str, int]:
        return {c: int(self.stalls[c].sum()) for c in STALLS}

    def instructions(self) -> dict[str, int]:
        return {name: int(np.sum(self.engine == i)) for i, name in enumerate(ENGINE_NAMES)}

    def rows(self) -> Iterator[dict]:
        """One dict per instruction for the CSV profile (times in ns and engine cycles, stalls in cycles)."""
        names = ["engine", "cmd_id", "cmd_id_dep", "op", "layer"]
        columns = [[ENGINE_NAMES[e] for e in self.engine.tolist()], self.cmd_id.tolist(), self.cmd_id_dep.tolist(),
                   self.op, self.layer]
        for e in ENGINE_NAMES:
            if e in self.waits:
                names.append(f"wait_{e}")
                columns.append(self.waits[e].tolist())
        for s in STAGES:
            names += [f"{s}_ns", f"{s}_cycles"]
            columns += [np.round(self.ns(s), 3).tolist(), self.cycles(s).tolist()]
        for c in STALLS:
            names.append(f"stall_{c}_cycles")
            columns.append(self.stall_cycles(c).tolist())
        for values in zip(*columns):
            yield dict(zip(names, values))

    def summary(self) -> dict:
        """Plain-dict digest (stable keys) for reports and --json."""
        d = self.dram
        return {
            "latency_ps": self.total_ps, "latency_us": self.total_us,
            "instructions": self.instructions(),
            "busy_us": {k: v / 1e6 for k, v in self.busy_ps.items()},
            "stalls_us": {k: v / 1e6 for k, v in self.stall_totals_ps().items()},
            "dram": {"bytes_read": d.bytes_read, "bytes_written": d.bytes_written, "bursts": d.bursts,
                     "page_hits": int(d.page_hits.sum()), "page_misses": int(d.page_misses.sum()),
                     "page_opens": int(d.page_opens.sum()), "page_hit_rate": d.page_hit_rate,
                     "achieved_gbps": d.achieved_gbps(self.total_ps), "active_gbps": d.achieved_gbps(),
                     "peak_gbps": d.peak_gbps},
        }


def core_rows(sim: "SimResult") -> list[dict]:
    """Per core of a multi-core result (estimate --json `cores`): latency, per-engine busy time,
    instructions and utilisation (busy / the whole program's latency), stalls, DRAM traffic; [] for one core."""
    rows = []
    for k, c in enumerate(sim.cores):
        s = c.summary()
        engines = {e: {"busy_us": s["busy_us"].get(e, 0.0), "instructions": s["instructions"][e],
                       "utilisation": s["busy_us"].get(e, 0.0) / sim.total_us if sim.total_us else 0.0}
                   for e in ENGINE_NAMES}
        rows.append({"core": k, "latency_us": s["latency_us"], "engines": engines, "stalls_us": s["stalls_us"],
                     "dram_bytes": s["dram"]["bytes_read"] + s["dram"]["bytes_written"]})
    return rows


def busy_union_ps(start: np.ndarray, end: np.ndarray) -> int:
    """Length of the union of [start, end) intervals whose starts are non-decreasing."""
    if len(start) == 0:
        return 0
    reach = np.maximum.accumulate(end)
    prev = np.concatenate(([start[0]], reach[:-1]))
    return int(np.clip(end - np.maximum(start, prev), 0, None).sum())
