"""The report's timeline: one row per engine plus a DRAM-bandwidth row, drawn as SVG rectangles in
`COLUMNS` time columns. Instructions at least `WIDE_COLUMNS` columns long are drawn one by one;
shorter ones are aggregated per column (height = occupancy, colour = the dominant op class or
layer, tooltip = count, busy share, dominant op, layer and stalls), and equal neighbouring columns
merge, so the size is bounded by the column count, not by the instruction count."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from tpuflow.codegen.report_data import (ENGINE_NAMES, OP_CLASSES, Bins, dominant, dram_bandwidth_gbps, pieces,
                                         row_classes, waited_rows)

COLUMNS = 3000          # time columns of the whole run (the SVG's viewBox width)
WIDE_COLUMNS = 2.0      # instructions at least this many columns long are drawn individually
LEVELS = 16             # occupancy / bandwidth heights are quantised to this many steps
ROW_HEIGHT = 30
ROW_GAP = 8
LAYER_COLOURS = 12      # layer colours cycle through this many hues
STALL_NAMES = {"dependency": "dependency wait", "bank_conflict": "bank conflicts", "dma_credit": "DMA credits",
               "fifo_full": "full IFE FIFO", "dram": "DRAM latency"}


@dataclass
class Rect:
    x: float
    y: int
    w: float
    h: int
    css: str
    title: str
    count: int = 0      # instructions the rectangle stands for


@dataclass
class Row:
    label: str
    detail: str
    y: int
    rects: list[Rect] = field(default_factory=list)


@dataclass
class Timeline:
    columns: int
    height: int
    total_us: float
    rows: list[Row]
    ticks: list[tuple[float, str]]
    classes: list[str]          # op classes present, for the legend

    @property
    def rect_count(self) -> int:
        return sum(len(r.rects) for r in self.rows)


def us(ps: float) -> str:
    """A time in microseconds, to the nanosecond."""
    return f"{ps / 1e6:.3f}"


def build_timeline(program, sim, classes: np.ndarray, nbytes: np.ndarray, layer_ids: dict[str, int],
                   columns: int = COLUMNS) -> Timeline:
    """The timeline view of a simulated program (`classes`, `nbytes`: per-row op class and DDR bytes;
    `layer_ids`: layer name -> colour order)."""
    bins = Bins.spanning(sim.total_ps, columns)
    layer = np.asarray([layer_ids.get(name, 0) for name in sim.layer], dtype=np.int64)
    layer_names = [""] * (max(layer_ids.values(), default=0) + 1)
    for name, k in layer_ids.items():
        layer_names[k] = name
    rows, y, present = [], 0, set(classes.tolist())
    for k, core_sim in enumerate(sim.cores or [sim]):       # multi-core: one row per engine of every core
        if k:
            core_layer = np.asarray([layer_ids.get(name, 0) for name in core_sim.layer], dtype=np.int64)
            classes, layer = row_classes(program.core(k)), core_layer
            present |= set(classes.tolist())
        waited = waited_rows(core_sim)
        prefix = f"C{k} " if sim.cores else ""
        for code, engine in enumerate(ENGINE_NAMES):
            members = np.flatnonzero(core_sim.engine == code)
            if not len(members) and engine == "tile":
                continue
            row = Row(prefix + engine.upper(), f"{len(members)} instr.", y)
            context = _Context(core_sim, classes, layer, layer_names, waited, bins, y)
            row.rects = context.single_bars(members) + context.aggregated(members)
            rows.append(row)
            y += ROW_HEIGHT + ROW_GAP
    dram = Row("DRAM", f"peak {sim.dram.peak_gbps:g} GB/s", y)
    dram.rects = _bandwidth_rects(dram_bandwidth_gbps(program, sim, bins, nbytes), bins, sim.dram.peak_gbps, y)
    rows.append(dram)
    return Timeline(columns, y + ROW_HEIGHT, sim.total_us, rows, ticks(sim.total_us),
                    [OP_CLASSES[c] for c in sorted(present)])


def ticks(total_us: float, target: int = 10) -> list[tuple[float, str]]:
    """(percent of the run, label) at a 1-2-5 step giving about `target` ticks."""
    if total_us <= 0:
        return [(0.0, "0")]
    raw = total_us / target
    step = min((m * 10 ** math.floor(math.log10(raw)) for m in (1, 2, 5, 10)), key=lambda s: abs(s - raw))
    count = int(total_us // step) + 1
    unit, scale = ("ms", 1e-3) if step >= 1000 else ("us", 1.0)
    return [(round(100 * k * step / total_us, 3), f"{k * step * scale:g} {unit}") for k in range(count)]


class _Context:
    """Shared per-engine inputs of the rectangle builders."""

    def __init__(self, sim, classes, layer, layer_names, waited, bins: Bins, y: int):
        self.sim, self.classes, self.layer, self.waited, self.bins, self.y = sim, classes, layer, waited, bins, y
        self.layer_names = layer_names
        self.start = sim.times["start"].astype(np.float64)
        self.end = np.maximum(sim.times["end"].astype(np.float64), self.start)

    def _wide(self, rows: np.ndarray) -> np.ndarray:
        return (self.end[rows] - self.start[rows]) >= WIDE_COLUMNS * self.bins.width_ps

    def single_bars(self, rows: np.ndarray) -> list[Rect]:
        rects = []
        for i in rows[self._wide(rows)].tolist():
            x = self.start[i] / self.bins.width_ps
            w = (self.end[i] - self.start[i]) / self.bins.width_ps
            rects.append(Rect(round(x, 2), self.y, round(w, 2), ROW_HEIGHT, self._css(self.classes[i], self.layer[i]),
                              self._bar_title(i), 1))
        return rects

    def _css(self, cls: int, layer: int) -> str:
        return f"k{cls} l{layer % LAYER_COLOURS}"

    def _bar_title(self, i: int) -> str:
        sim = self.sim
        engine = ENGINE_NAMES[sim.engine[i]]
        cycles = int((sim.times["end"][i] - sim.times["start"][i]) // sim.periods_ps[sim.engine[i]])
        text = (f"{sim.op[i]} ({OP_CLASSES[self.classes[i]]}) · {engine.upper()} #{int(sim.cmd_id[i])} · "
                f"layer {sim.layer[i] or '(program)'} · {us(self.start[i])}–{us(self.end[i])} us, {cycles} cycles")
        return text + self._stall_text([i])

    def _stall_text(self, rows) -> str:
        totals = {c: int(self.sim.stalls[c][rows].sum()) for c in STALL_NAMES}
        parts = [f"{STALL_NAMES[c]} {us(v)} us" for c, v in sorted(totals.items(), key=lambda kv: -kv[1]) if v > 0]
        if len(rows) == 1 and totals["dependency"] > 0:
            parts[0] += self._waited_on(rows[0])
        return " · stalls: " + ", ".join(parts) if parts else " · no stalls"

    def _waited_on(self, i: int) -> str:
        sim, names = self.sim, []
        for code, engine in enumerate(ENGINE_NAMES):
            j = int(self.waited[engine][i])
            if j >= 0:
                names.append(f"{engine.upper()} #{int(sim.cmd_id[j])} {sim.op[j]}")
        return f" (on {', '.join(names)})" if names else ""

    def aggregated(self, rows: np.ndarray) -> list[Rect]:
        narrow = rows[~self._wide(rows)]
        if not len(narrow):
            return []
        index, b, overlap = pieces(self.start[narrow], self.end[narrow], self.bins)
        member = narrow[index]
        weight = overlap + 1e-3                       # zero-length instructions still count
        cls, _ = dominant(b, self.classes[member], weight, self.bins.count)
        lay, _ = dominant(b, self.layer[member], weight, self.bins.count)
        ops = np.unique(np.asarray(self.sim.op, dtype=object)[narrow].astype(str), return_inverse=True)
        op_id = np.empty(len(self.sim.op), dtype=np.int64)
        op_id[narrow] = ops[1]
        op, _ = dominant(b, op_id[member], weight, self.bins.count)
        busy = np.minimum(np.bincount(b, weights=overlap, minlength=self.bins.count) / self.bins.width_ps, 1.0)
        first_bin = self.bins.of(self.start[narrow])
        count = np.bincount(first_bin, minlength=self.bins.count)
        level = np.where(count > 0, np.maximum(np.ceil(busy * LEVELS), 1), np.ceil(busy * LEVELS)).astype(np.int64)
        level[cls < 0] = 0
        return self._runs(narrow, first_bin, (cls, lay, op, level), busy, count, ops[0])

    def _runs(self, narrow, first_bin, keys, busy, count, op_names) -> list[Rect]:
        cls, lay, op, level = keys
        stacked = np.stack(keys, axis=1)
        change = np.r_[True, np.any(stacked[1:] != stacked[:-1], axis=1)]
        starts = np.flatnonzero(change)
        stops = np.r_[starts[1:], len(cls)]
        order = np.argsort(first_bin, kind="stable")
        by_bin = np.searchsorted(first_bin[order], np.arange(self.bins.count + 1))
        rects = []
        for a, z in zip(starts.tolist(), stops.tolist()):
            if level[a] == 0:
                continue
            members = narrow[order[by_bin[a]:by_bin[z]]]
            h = int(round(ROW_HEIGHT * level[a] / LEVELS))
            title = (f"{us(self.bins.edge(a))}–{us(self.bins.edge(z))} us · {int(count[a:z].sum())} instructions · "
                     f"busy {100 * busy[a:z].mean():.0f}% · mostly {OP_CLASSES[cls[a]]} ({op_names[op[a]]}) · "
                     f"layer {self.layer_names[lay[a]] or '(program)'}")
            rects.append(Rect(a, self.y + ROW_HEIGHT - h, z - a, h, self._css(cls[a], lay[a]),
                              title + self._stall_text(members), int(count[a:z].sum())))
        return rects


def _bandwidth_rects(gbps: np.ndarray, bins: Bins, peak_gbps: float, y: int) -> list[Rect]:
    level = np.ceil(np.minimum(gbps / peak_gbps, 1.0) * LEVELS).astype(np.int64) if peak_gbps > 0 else \
        np.zeros(len(gbps), dtype=np.int64)
    change = np.r_[True, level[1:] != level[:-1]]
    starts = np.flatnonzero(change)
    stops = np.r_[starts[1:], len(level)]
    rects = []
    for a, z in zip(starts.tolist(), stops.tolist()):
        if level[a] == 0:
            continue
        mean = float(gbps[a:z].mean())
        h = int(round(ROW_HEIGHT * level[a] / LEVELS))
        rects.append(Rect(a, y + ROW_HEIGHT - h, z - a, h, "bw",
                          f"{us(bins.edge(a))}–{us(bins.edge(z))} us · DRAM {mean:.1f} GB/s "
                          f"({100 * mean / peak_gbps:.0f}% of the {peak_gbps:g} GB/s peak)"))
    return rects
