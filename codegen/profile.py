"""Per-instruction outputs of a simulation: the CSV profile (`--profile`) and the Chrome / Perfetto
trace-event JSON (`--trace`).

CSV profile: one row per instruction, engine-major (every TIU, then GDMA, then TILE instruction,
each queue in cmd_id order). Times are measured from the start of the run; `*_ns` in nanoseconds,
`*_cycles` in cycles of the instruction's own engine clock (TIU, GDMA or TILE clock).

  engine          tiu | gdma | tile
  cmd_id          1-based position in the engine's queue
  cmd_id_dep      TIU/GDMA: the cmd_id_dep field (the other engine's id it waits for);
                  TILE: wait_tiu_id
  op              instruction name as in `tpuflow disasm` (conv.normal, arith.add, dma.tensor, TMATMUL ...)
  op_class        conv | matmul | vector | sync | dma load | dma store | dma lmem | dma ddr |
                  tile matmul | tile other
  layer           the ONNX node the instruction belongs to ("" for program-level instructions)
  ddr_bytes       DDR bytes the instruction moves (GDMA; both sides for DDR -> DDR; 0 otherwise)
  wait_tiu, wait_gdma, wait_tile
                  id of that engine the instruction waited for, as the engines honoured it (0: none)
  txi_acq_ns, pack_ns, decode_ns, check_ns, issue_ns
                  instruction fetch engine stages: descriptor fetched, packed, decoded, dependency
                  check done, issued to the engine's command list
  transfer_ns     arrival in the engine's command list
  dispatch_ns     the engine took it (its waits held and the engine was free)
  start_ns        first busy cycle (TIU: first COMPUTE cycle; GDMA: command start)
  end_ns          last cycle done (its completion advances the engine's sync id)
  start_cycles, end_cycles
                  start_ns and end_ns in engine cycles
  stall_dependency_cycles     dispatch delayed by cross-engine waits
  stall_bank_conflict_cycles  LMEM bank-arbiter bubbles (TIU)
  stall_dma_credit_cycles     GDMA issue threads waiting for outstanding-request credits
  stall_fifo_full_cycles      IFE held back by a full request FIFO / command list
  stall_dram_cycles           last DDR response later than an ideal memory would give it

Trace (open in ui.perfetto.dev or chrome://tracing): one process; one thread track per engine
(TIU, GDMA, TILE) and, where an engine's pipelined instructions overlap in time, extra
"(overlap n)" tracks so that slices on a track never partially overlap; every instruction exactly
once as a complete ("X") event with ts/dur in microseconds at nanosecond resolution (no
displayTimeUnit: its meaning differs between viewers), name = op, cat = op class, args = cmd_id,
cmd_id_dep, layer, cycles and the non-zero stalls in ns; the engine is the track (tid // 1000:
1 TIU, 2 GDMA, 3 TILE); a "DRAM GB/s" counter track.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from tpuflow.codegen.report_data import (ENGINE_NAMES, OP_CLASSES, Bins, dram_bandwidth_gbps, row_classes,
                                         row_ddr_bytes)
from tpuflow.errors import InputFileError

PROFILE_COLUMNS = ["engine", "cmd_id", "cmd_id_dep", "op", "op_class", "layer", "ddr_bytes",
                   "wait_tiu", "wait_gdma", "wait_tile",
                   "txi_acq_ns", "pack_ns", "decode_ns", "check_ns", "issue_ns", "transfer_ns", "dispatch_ns",
                   "start_ns", "end_ns", "start_cycles", "end_cycles",
                   "stall_dependency_cycles", "stall_bank_conflict_cycles", "stall_dma_credit_cycles",
                   "stall_fifo_full_cycles", "stall_dram_cycles"]
TRACE_PID = 1
TRACK_BASE = {"tiu": 1000, "gdma": 2000, "tile": 3000}   # tid of an engine's first track; overlap tracks follow
BANDWIDTH_BINS = 400


def write_atomically(path: Path, text: str) -> None:
    """Write `text` to a temporary file beside `path`, then rename it over `path`."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    except OSError as exc:
        raise InputFileError(f"{path}: cannot write ({exc.strerror})") from None
    try:
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
            os.fchmod(f.fileno(), 0o644)
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ------------------------------------------------------------------ CSV profile

def profile_csv(sim, program=None) -> str:
    """The CSV profile (columns in the module docstring; op_class and ddr_bytes need `program`)."""
    classes = row_classes(program) if program is not None else None
    nbytes = row_ddr_bytes(program) if program is not None else None
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=PROFILE_COLUMNS, extrasaction="ignore", restval="",
                            lineterminator="\n")
    writer.writeheader()
    for i, row in enumerate(sim.rows()):
        if classes is not None:
            row["op_class"], row["ddr_bytes"] = OP_CLASSES[classes[i]], int(nbytes[i])
        writer.writerow(row)
    return out.getvalue()


def write_profile(path: Path, sim, program=None) -> None:
    write_atomically(path, profile_csv(sim, program))


# ------------------------------------------------------------------ trace

def overlap_lanes(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Greedy track per interval (in start order) so that intervals on one track never overlap
    (zero-length ones stay on track 0: they nest in whatever runs there); 0 for all when none
    overlaps (the usual case for GDMA and TILE)."""
    lanes = np.zeros(len(start), dtype=np.int64)
    if len(start) < 2:
        return lanes
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    if np.all(s[1:] >= np.maximum.accumulate(e)[:-1]):
        return lanes
    free_at: list[int] = []
    for k, (a, b) in enumerate(zip(s.tolist(), e.tolist())):
        if a == b:
            continue
        for lane, t in enumerate(free_at):
            if t <= a:
                free_at[lane], lanes[order[k]] = b, lane
                break
        else:
            free_at.append(b)
            lanes[order[k]] = len(free_at) - 1
    return lanes


def _track_names(engine: str, lanes: int) -> list[tuple[int, str]]:
    name = engine.upper()
    return [(TRACK_BASE[engine] + k, name if k == 0 else f"{name} (overlap {k})") for k in range(lanes)]


def trace_events(program, sim, bandwidth_bins: int = BANDWIDTH_BINS) -> dict:
    """The trace document (see the module docstring); a multi-core result gives one process per core
    (pid TRACE_PID + core), each with its engine tracks."""
    name = f"{program.model_name or 'program'} on {program.chip.name}"
    events = _core_events(program, sim, TRACE_PID, name + (" core 0" if sim.cores else ""))
    for k, core_sim in enumerate(sim.cores[1:], start=1):
        events += _core_events(program.core(k), core_sim, TRACE_PID + k, f"{name} core {k}")
    events += _bandwidth_counter(program, sim, bandwidth_bins)
    return {"traceEvents": events,
            "otherData": {"model": program.model_name, "chip": program.chip.name,
                          "chip_fingerprint": program.chip.fingerprint(), "latency_us": sim.total_us,
                          "time_unit": "us"}}


def _core_events(program, sim, pid: int, name: str) -> list[dict]:
    """The process of one core: its name, engine tracks and instruction events."""
    start_ns, end_ns = sim.times["start"] // 1000, sim.times["end"] // 1000
    end_ns = np.maximum(end_ns, start_ns)
    classes = row_classes(program)
    tids = np.zeros(len(sim.engine), dtype=np.int64)
    events = [{"ph": "M", "pid": pid, "name": "process_name", "args": {"name": name}}]
    for code, engine in enumerate(ENGINE_NAMES):
        rows = np.flatnonzero(sim.engine == code)
        lanes = overlap_lanes(start_ns[rows], end_ns[rows])
        tids[rows] = TRACK_BASE[engine] + lanes
        for tid, track in _track_names(engine, int(lanes.max()) + 1 if len(rows) else 1):
            events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": track}})
            events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index",
                           "args": {"sort_index": tid}})
    return events + _instruction_events(sim, start_ns, end_ns, tids, classes, pid)


def _instruction_events(sim, start_ns, end_ns, tids, classes, pid: int = TRACE_PID) -> list[dict]:
    periods = np.asarray(sim.periods_ps, dtype=np.int64)[sim.engine]
    cycles = ((sim.times["end"] - sim.times["start"]) // periods).tolist()
    stall_ns = {cause: (sim.stalls[cause] // 1000).tolist() for cause in sim.stalls}
    cmd_id = sim.cmd_id.tolist()
    dep, starts, ends, tid = sim.cmd_id_dep.tolist(), start_ns.tolist(), end_ns.tolist(), tids.tolist()
    cls = classes.tolist()
    events = []
    for i in range(len(cmd_id)):
        args = {"cmd_id": cmd_id[i], "cmd_id_dep": dep[i], "layer": sim.layer[i], "cycles": cycles[i]}
        for cause, values in stall_ns.items():
            if values[i]:
                args[f"stall_{cause}_ns"] = values[i]
        events.append({"ph": "X", "pid": pid, "tid": tid[i], "name": sim.op[i],
                       "cat": OP_CLASSES[cls[i]], "ts": starts[i] / 1000, "dur": (ends[i] - starts[i]) / 1000,
                       "args": args})
    return events


def _bandwidth_counter(program, sim, bins: int) -> list[dict]:
    if not np.any(sim.engine == 1) or sim.total_ps <= 0:
        return []
    grid = Bins.spanning(sim.total_ps, bins)
    gbps = dram_bandwidth_gbps(program, sim, grid)
    edges_us = [round(float(t) / 1e6, 6) for t in grid.edge(np.arange(bins + 1))]
    events = [{"ph": "C", "pid": TRACE_PID, "name": "DRAM GB/s", "ts": edges_us[b],
               "args": {"GB/s": round(float(gbps[b]), 3)}} for b in range(bins)]
    events.append({"ph": "C", "pid": TRACE_PID, "name": "DRAM GB/s", "ts": edges_us[bins], "args": {"GB/s": 0.0}})
    return events


def write_trace(path: Path, program, sim) -> None:
    write_atomically(path, json.dumps(trace_events(program, sim), separators=(",", ":")))
