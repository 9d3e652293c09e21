"""The TILE (LinxISA CUBE) path against the TIU path, model by model (issue 16).

    python benchmarks/tile_bench.py [--models a,b] [--dtype fp16] [--chip sg2260] [--choices tile,cost] [--out FILE]

For each model: latency, instructions per engine, engine busy time, the estimate's wall time and
the CPU seconds (time.process_time: the machine may be shared) of the compile (frontend, lowering,
list schedule) and of the whole estimate (compile + timing simulation + report) on both --matmul
paths (issue 16 target: TILE-path ResNet-50 estimated in under 10 s), the TILE / TIU latency
ratio, where the TILE path's GDMA time goes (per kind of transfer: DDR -> tile buffer,
DDR -> LMEM, LMEM -> DDR, ...) and what the tile buffer's own DMA port (TMOVE) carries. The TILE path
runs once per --choices value of lowering.ops.tilemm.ENGINE_CHOICE ("fit", the default: every conv the
cube can use well on it; "tile": every conv the cube can take; "cost": per conv by the timing model; rows
say which). Writes benchmarks/results/tile_<dtype>.json
and prints a table.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model

MODELS = "bert_layer,gpt_block,llama_mlp,squeezenet,resnet50"
RESULTS = Path(__file__).parent / "results"


def transfer_kind(instr, chip) -> str:
    """'D' DDR, 'L' LMEM, 'T' tile buffer, 'F' constant fill: source then destination ('DT' = a
    tile fill from DDR)."""
    from tpuflow.hwmodel.timing.segments import transfer_sides
    try:
        src, dst = transfer_sides(instr, chip)
    except TypeError:
        return type(instr).__name__

    def side(s) -> str:
        if s is None:
            return "F"
        if not s.lmem:
            return "D"
        return "T" if chip.in_tile_buffer(s.addr) else "L"
    return side(src) + side(dst)


def gdma_by_kind(program, sim) -> dict[str, dict[str, float]]:
    """Per transfer kind: commands and the us they held the GDMA (dispatch to end)."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: {"commands": 0, "us": 0.0})
    for row in np.flatnonzero(sim.engine == 1):
        kind = transfer_kind(program.gdma[int(sim.cmd_id[row]) - 1], program.chip)
        out[kind]["commands"] += 1
        out[kind]["us"] += float(sim.times["end"][row] - sim.times["dispatch"][row]) / 1e6
    return {k: {"commands": v["commands"], "us": round(v["us"], 3)} for k, v in sorted(out.items())}


def port_by_kind(program, sim) -> dict[str, dict[str, float]]:
    """TMOVEs on the tile buffer's DMA port per transfer kind: moves and the us they were in flight
    (start to landing; moves overlap the TILE engine's other blocks)."""
    from tpuflow.isa import TMove
    out: dict[str, dict[str, float]] = defaultdict(lambda: {"moves": 0, "us": 0.0})
    for row in np.flatnonzero(sim.engine == 2):
        instr = program.tile[int(sim.cmd_id[row]) - 1]
        if isinstance(instr, TMove):
            kind = transfer_kind(instr.desc, program.chip)
            out[kind]["moves"] += 1
            out[kind]["us"] += float(sim.times["end"][row] - sim.times["start"][row]) / 1e6
    return {k: {"moves": v["moves"], "us": round(v["us"], 3)} for k, v in sorted(out.items())}


def run(model: str, chip: str, dtype: str, matmul: str, choice: str = "fit") -> dict:
    """What pipeline.estimate does, with the compile's and the whole estimate's CPU time."""
    from tpuflow.estimate import estimate_report
    from tpuflow.hwmodel.timing import simulate
    from tpuflow.lowering.ops import tilemm
    tilemm.ENGINE_CHOICE = choice
    t0, cpu0 = time.perf_counter(), time.process_time()
    _, program = compile_model(model, chip, CompileOptions(dtype=dtype, matmul=matmul))
    compile_cpu = time.process_time() - cpu0
    sim = simulate(program)
    report = estimate_report(program, sim)
    wall, estimate_cpu = time.perf_counter() - t0, time.process_time() - cpu0
    engines = report["engines"]
    return {"model": model, "matmul": matmul, **({"engine_choice": choice} if matmul == "tile" else {}),
            "dtype": dtype, "latency_us": report["latency_us"],
            "instructions": {k: v["instructions"] for k, v in engines.items()},
            "busy_us": {k: round(v["busy_us"], 3) for k, v in engines.items()},
            "gdma_by_kind": gdma_by_kind(program, sim), "tile_port_by_kind": port_by_kind(program, sim),
            "wall_s": round(wall, 2),
            "compile_cpu_s": round(compile_cpu, 2), "estimate_cpu_s": round(estimate_cpu, 2)}


def _commit() -> str:
    """The git commit the numbers were measured at (with '+' when the work tree differs), or ''."""
    import subprocess
    root = Path(__file__).parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "."], cwd=root.parent, capture_output=True,
                               text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
    return head + ("+" if dirty else "")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=MODELS)
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--chip", default="sg2260")
    ap.add_argument("--choices", default="fit,tile,cost", help="ENGINE_CHOICE values the TILE path runs with")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    out = args.out or RESULTS / f"tile_{args.dtype}.json"
    rows = []
    print(f"{'model':12} {'choice':6} {'TIU us':>9} {'TILE us':>9} {'ratio':>6} {'TIU instr':>10} {'TILE instr':>10} "
          f"{'TIU cpu s':>9} {'TILE cpu s':>10} {'TILE compile cpu s':>18}")
    for model in args.models.split(","):
        tiu = run(model, args.chip, args.dtype, "tiu")
        rows.append(tiu)
        for choice in args.choices.split(","):
            tile = run(model, args.chip, args.dtype, "tile", choice)
            tile["over_tiu"] = round(tile["latency_us"] / tiu["latency_us"], 3)
            rows.append(tile)
            print(f"{model:12} {choice:6} {tiu['latency_us']:9.1f} {tile['latency_us']:9.1f} {tile['over_tiu']:6.2f} "
                  f"{sum(tiu['instructions'].values()):10d} {sum(tile['instructions'].values()):10d} "
                  f"{tiu['estimate_cpu_s']:9.1f} {tile['estimate_cpu_s']:10.1f} {tile['compile_cpu_s']:18.1f}")
        out.write_text(json.dumps({"chip": args.chip, "dtype": args.dtype, "runs": rows, "commit": _commit(),
                                   "command": "python benchmarks/tile_bench.py"}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
