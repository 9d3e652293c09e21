"""Per-instruction outputs of a simulation: the CSV profile and the Chrome / Perfetto trace."""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from tpuflow.errors import InputFileError

PROFILE_COLUMNS = ["engine", "cmd_id", "cmd_id_dep", "op", "layer", "txi_acq_ns", "pack_ns", "decode_ns", "check_ns",
                   "issue_ns", "start_ns", "end_ns", "start_cycles", "end_cycles", "stall_dependency_cycles",
                   "stall_bank_conflict_cycles", "stall_dma_credit_cycles", "stall_fifo_full_cycles",
                   "stall_dram_cycles"]
TRACK = {"tiu": 1, "gdma": 2, "tile": 3}


def write_atomically(path: Path, text: str) -> None:
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    except OSError as exc:
        raise InputFileError(f"{path}: cannot write ({exc.strerror})") from None
    with os.fdopen(fd, "w", newline="") as f:
        os.fchmod(f.fileno(), 0o644)
        f.write(text)
    os.replace(tmp, path)


def profile_csv(sim) -> str:
    """One row per instruction: engine, ids, op, layer, stage times (ns), stall cycles by cause."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=PROFILE_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in sim.rows():
        writer.writerow(row)
    return out.getvalue()


def trace_events(program, sim, bandwidth_bins: int = 400) -> dict:
    """Trace-event JSON (chrome://tracing, ui.perfetto.dev): one track per engine, every
    instruction once as a complete event, plus a DRAM bandwidth counter track."""
    start, end = sim.times["start"] / 1e6, sim.times["end"] / 1e6     # us
    events = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": f"{program.model_name} on {program.chip.name}"}}]
    for name, tid in TRACK.items():
        events.append({"ph": "M", "pid": 1, "tid": tid, "name": "thread_name", "args": {"name": name.upper()}})
    names = ("tiu", "gdma", "tile")
    for i in range(len(sim.engine)):
        engine = names[sim.engine[i]]
        events.append({"ph": "X", "pid": 1, "tid": TRACK[engine], "name": sim.op[i], "cat": sim.layer[i] or "program",
                       "ts": round(float(start[i]), 4), "dur": round(float(max(end[i] - start[i], 0.0)), 4),
                       "args": {"cmd_id": int(sim.cmd_id[i]), "dep": int(sim.cmd_id_dep[i]), "layer": sim.layer[i]}})
    events += _bandwidth_counter(program, sim, start, end, bandwidth_bins)
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"chip": program.chip.name, "fingerprint": program.chip.fingerprint(),
                          "latency_us": sim.total_us}}


def _bandwidth_counter(program, sim, start, end, bins: int) -> list[dict]:
    from tpuflow.estimate import ddr_bytes
    gdma_rows = np.flatnonzero(sim.engine == 1)
    if not len(gdma_rows) or sim.total_us <= 0:
        return []
    edges = np.linspace(0.0, sim.total_us, bins + 1)
    volume = np.zeros(bins)
    for row in gdma_rows:
        nbytes = ddr_bytes(program.gdma[int(sim.cmd_id[row]) - 1], program.chip)
        s, e = float(start[row]), float(max(end[row], start[row] + 1e-6))
        lo, hi = np.searchsorted(edges, s, "right") - 1, np.searchsorted(edges, e, "left")
        for b in range(max(lo, 0), min(hi, bins)):
            overlap = min(e, edges[b + 1]) - max(s, edges[b])
            volume[b] += nbytes * max(overlap, 0.0) / (e - s)
    width = edges[1] - edges[0]
    return [{"ph": "C", "pid": 1, "name": "DRAM GB/s", "ts": round(float(edges[b]), 4),
             "args": {"GB/s": round(float(volume[b] / width / 1e3), 3)}} for b in range(bins)]


def write_trace(path: Path, program, sim) -> None:
    write_atomically(path, json.dumps(trace_events(program, sim), separators=(",", ":")))


def write_profile(path: Path, sim) -> None:
    write_atomically(path, profile_csv(sim))
