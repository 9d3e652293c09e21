"""The numbers behind reports and traces, per simulated instruction row: op classes, DDR bytes,
the instruction each row waited for, and time binning (busy time, dominant class, DRAM bandwidth
per bin), all vectorised so that a million-instruction program stays cheap."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tpuflow.isa import ConvTiu, GeneralDma, MatrixDma, Mm2Tiu, SysDma, SysTiu, TensorDma, TMatmul, is_lmem
from tpuflow.program import ENGINES, Program

ENGINE_NAMES = tuple(e.value for e in ENGINES)      # in Engine.code order
# The closed set of op classes a timeline colours by (index = class code).
OP_CLASSES = ("conv", "matmul", "vector", "sync", "dma load", "dma store", "dma lmem", "dma ddr",
              "tile matmul", "tile other")
CLASS_CODE = {name: code for code, name in enumerate(OP_CLASSES)}


def op_class(instr, chip) -> str:
    """The op class of one instruction (see OP_CLASSES)."""
    if isinstance(instr, ConvTiu):
        return "conv"
    if isinstance(instr, Mm2Tiu):
        return "matmul"
    if isinstance(instr, (SysTiu, SysDma)):
        return "sync"
    if isinstance(instr, (TensorDma, MatrixDma, GeneralDma)):
        return _dma_class(instr, chip)
    if isinstance(instr, TMatmul):
        return "tile matmul"
    if instr.ENGINE.value == "tile":
        return "tile other"
    return "vector"


def _dma_class(instr, chip) -> str:
    src_lmem = bool(getattr(instr, "fill_constant_en", 0)) or is_lmem(instr.src_start_addr, chip)
    dst_lmem = is_lmem(instr.dst_start_addr, chip)
    if dst_lmem:
        return "dma lmem" if src_lmem else "dma load"
    return "dma store" if src_lmem else "dma ddr"


def row_classes(program: Program) -> np.ndarray:
    """Class code per SimResult row (engine-major, cmd_id order)."""
    chip, codes, cache = program.chip, [], {}
    for engine in ENGINES:
        for instr in program.queue(engine):
            kind = type(instr)
            if kind in cache:
                codes.append(cache[kind])
                continue
            code = CLASS_CODE[op_class(instr, chip)]
            if not isinstance(instr, (TensorDma, MatrixDma, GeneralDma)):
                cache[kind] = code
            codes.append(code)
    return np.asarray(codes, dtype=np.int16)


def row_ddr_bytes(program: Program) -> np.ndarray:
    """DDR bytes per SimResult row (GDMA rows only; hwmodel.timing.segments.ddr_bytes)."""
    from tpuflow.hwmodel.timing.segments import ddr_bytes
    chip = program.chip
    gdma = [ddr_bytes(i, chip) for i in program.gdma]
    return np.concatenate([np.zeros(len(program.tiu), dtype=np.int64), np.asarray(gdma, dtype=np.int64),
                           np.zeros(len(program.tile), dtype=np.int64)])


def row_offsets(sim) -> np.ndarray:
    """Row of cmd_id 1 of each engine: the row of (engine e, cmd c) is offsets[e] + c - 1."""
    counts = np.bincount(sim.engine.astype(np.int64), minlength=3)
    return np.concatenate(([0], np.cumsum(counts)[:-1]))


def waited_rows(sim) -> dict[str, np.ndarray]:
    """Per row and other engine, the row it waited for (-1: none), from SimResult.waits (falling
    back to cmd_id_dep between TIU and GDMA when the simulation did not record waits)."""
    offsets, counts = row_offsets(sim), np.bincount(sim.engine.astype(np.int64), minlength=3)
    waits = dict(getattr(sim, "waits", {}) or {})
    if not waits:
        dep = sim.cmd_id_dep.astype(np.int64)
        zero = np.zeros(len(dep), dtype=np.int64)
        waits = {"gdma": np.where(sim.engine == 0, dep, zero), "tiu": np.where(sim.engine == 1, dep, zero),
                 "tile": zero}
    out = {}
    for code, name in enumerate(ENGINE_NAMES):
        ids = np.asarray(waits.get(name, np.zeros(len(sim.engine))), dtype=np.int64)
        valid = (ids > 0) & (ids <= counts[code]) & (sim.engine != code)
        out[name] = np.where(valid, offsets[code] + ids - 1, -1)
    return out


@dataclass(frozen=True)
class Bins:
    """`count` equal time bins of `width_ps` from `t0_ps`."""

    t0_ps: float
    width_ps: float
    count: int

    @classmethod
    def spanning(cls, total_ps: float, count: int) -> "Bins":
        return cls(0.0, max(float(total_ps), 1.0) / count, count)

    def edge(self, b) -> np.ndarray:
        return self.t0_ps + np.asarray(b, dtype=np.float64) * self.width_ps

    def of(self, t: np.ndarray) -> np.ndarray:
        return np.clip(np.floor((np.asarray(t, dtype=np.float64) - self.t0_ps) / self.width_ps), 0,
                       self.count - 1).astype(np.int64)


def pieces(start: np.ndarray, end: np.ndarray, bins: Bins) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every interval [start, end) cut at the bin edges: (interval index, bin, overlap ps) per piece.
    A zero-length interval gives one piece of overlap 0 in its bin."""
    start = np.asarray(start, dtype=np.float64)
    end = np.maximum(np.asarray(end, dtype=np.float64), start)
    first = bins.of(start)
    last = np.maximum(first, np.clip(np.ceil((end - bins.t0_ps) / bins.width_ps).astype(np.int64) - 1, 0,
                                     bins.count - 1))
    counts = last - first + 1
    index = np.repeat(np.arange(len(start)), counts)
    step = np.arange(len(index)) - np.repeat(np.cumsum(counts) - counts, counts)
    b = first[index] + step
    overlap = np.minimum(end[index], bins.edge(b + 1)) - np.maximum(start[index], bins.edge(b))
    return index, b, np.clip(overlap, 0.0, None)


def spread(start, end, amount, bins: Bins) -> np.ndarray:
    """`amount` of each interval spread uniformly over its time, summed per bin (zero-length
    intervals put all of it in their bin)."""
    index, b, overlap = pieces(start, end, bins)
    duration = (np.asarray(end, dtype=np.float64) - np.asarray(start, dtype=np.float64))[index]
    share = np.where(duration > 0, overlap / np.where(duration > 0, duration, 1.0), 1.0)
    return np.bincount(b, weights=np.asarray(amount, dtype=np.float64)[index] * share, minlength=bins.count)


def dominant(bin_of: np.ndarray, key: np.ndarray, weight: np.ndarray, nbins: int) -> tuple[np.ndarray, np.ndarray]:
    """Per bin the key with the largest total weight (-1 for an empty bin; ties: the smallest key)
    and that key's weight."""
    best, best_weight = np.full(nbins, -1, dtype=np.int64), np.zeros(nbins)
    if len(bin_of) == 0:
        return best, best_weight
    pair = bin_of.astype(np.int64) * (int(key.max()) + 1) + key.astype(np.int64)
    unique, inverse = np.unique(pair, return_inverse=True)
    total = np.bincount(inverse, weights=weight)
    ubin, ukey = unique // (int(key.max()) + 1), unique % (int(key.max()) + 1)
    order = np.lexsort((ukey, -total, ubin))
    first = order[np.r_[True, ubin[order][1:] != ubin[order][:-1]]]
    best[ubin[first]], best_weight[ubin[first]] = ukey[first], total[first]
    return best, best_weight


def dram_bandwidth_gbps(program: Program, sim, bins: Bins, nbytes: np.ndarray | None = None) -> np.ndarray:
    """DDR bytes of the GDMA rows spread over their [start, end), as GB/s per bin."""
    nbytes = row_ddr_bytes(program) if nbytes is None else nbytes
    rows = np.flatnonzero((sim.engine == 1) & (nbytes > 0))
    volume = spread(sim.times["start"][rows], sim.times["end"][rows], nbytes[rows], bins)
    return volume / bins.width_ps * 1e3     # bytes/ps = 1e3 GB/s


def activation_layouts(program: Program) -> dict:
    """Under --matmul tile, the DDR layout of the activations (issue 16) for the estimate report and the
    manifest: those C0-blocked ("NC1HWC0", DdrTensor.layout; every other tensor row-major NCHW), the
    conversions the compiler emitted between layouts (layers of op LayoutConversion: GDMA NC1HWC0 <-> NCHW
    copies in DDR) and the TILE convs' per-image layout changes in LMEM (TIU C<->W transposes of an NCHW
    input or residual into pixel-major phase images). Empty for --matmul tiu."""
    from tpuflow.isa import CwBcTiu, Engine
    if program.options.get("matmul") != "tile":
        return {}
    tile_layers = {program.layer_of(Engine.TILE, i) for i in range(len(program.tile))}
    transposes: dict[str, int] = {}
    for i, instr in enumerate(program.tiu):
        layer = program.layer_of(Engine.TIU, i)
        if isinstance(instr, CwBcTiu) and instr.op == "cw_ts" and layer in tile_layers:
            transposes[layer] = transposes.get(layer, 0) + 1
    return {"c0_blocked": sorted(t.name for t in program.memory.tensors.values() if t.layout == "NC1HWC0"),
            "conversions": sorted(name for name, info in program.layers.items() if info.op_type == "LayoutConversion"),
            "lmem_transposes": dict(sorted(transposes.items())), "other_tensors": "NCHW (row-major)"}


def layout_line(layouts: dict) -> list[str]:
    """The estimate text's line for activation_layouts (none when empty)."""
    if not layouts:
        return []
    convs = layouts["conversions"]
    return [f"layouts        {len(layouts['c0_blocked'])} activations NC1HWC0 in DDR, the rest NCHW; "
            f"{len(convs)} layout conversions in DDR{' (' + ', '.join(convs[:4]) + (' ...' if len(convs) > 4 else '') + ')' if convs else ''}; "
            f"{sum(layouts['lmem_transposes'].values())} TIU transposes into pixel-major images in "
            f"{len(layouts['lmem_transposes'])} TILE conv layers"]
