"""The TILE (LinxISA CUBE) path against the TIU path, model by model (issue 16).

    python benchmarks/tile_bench.py [--models a,b] [--dtype fp16] [--chip sg2260] [--choices tile,cost] [--out FILE]

For each model: latency, instructions per engine, engine busy time, the estimate's wall time and
the CPU seconds (time.process_time: the machine may be shared) of the compile (frontend, lowering,
list schedule) and of the whole estimate (compile + timing simulation + report) on both --matmul
paths (issue 16 target: TILE-path ResNet-50 estimated in under 10 s), the TILE / TIU latency
ratio, where the TILE path's GDMA time goes (per kind of transfer: DDR -> tile buffer,
DDR -> LMEM, LMEM -> DDR, ...) and what the tile buffer's own DMA port (TMOVE) carries. The TILE path
runs once per --choices value of `--tile-engine` (CompileOptions.tile_engine: "fit", the default: a conv
or MatMul runs on the cube where the shared cost model times it faster there; "all": every conv and MatMul
the cube can take; "cost": per group by the timing model; rows say which). With --cube-scales (default 2,4) the
--cube-models (default resnet50,squeezenet) also run on chip variants whose cube has that many times
sg2260's fp16 / bf16 / int8 MACs per cycle (compute.tile_macs_per_cycle; a chip TOML written from the base
chip's, `base = ...`), TIU path and TILE path side by side: does a bigger cube pay off? --what-if models
(default resnet50) also run with the 4x cube and its tile buffer's port, expansion path and ACCCVT drain
4x as wide, then also those units' per-block latencies cut 4x: what it would take.
Writes benchmarks/results/tile_<dtype>.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model

MODELS = "bert_layer,gpt_block,llama_mlp,squeezenet,resnet50,bert_base"
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


def cube_variant(base: str, scale: int, folder: Path, buffer: str = "") -> Path:
    """A chip TOML: `base` with `scale` times its cube's 16-bit and int8 MACs per cycle (fp32 as it is);
    `buffer` "ports": also the tile buffer's DMA port, expansion path and ACCCVT drain `scale` times as
    wide; "ports+latency": and their per-block latencies (cube fill, port, expansion) cut by `scale`."""
    from tpuflow.chip import load_chip
    chip = load_chip(base)
    scaled = {k: v * scale if k != "fp32" else v for k, v in chip.compute.tile_macs_per_cycle.items()}
    name = f"{base}_cube{scale}x" + (f"_{buffer.replace('+', '_')}{scale}x" if buffer else "")
    tile = {}
    if buffer:
        t = chip.tile
        tile = {"move_port_bytes_per_cycle": t.move_port_bytes_per_cycle * scale,
                "img2col_bytes_per_cycle": t.img2col_bytes_per_cycle * scale,
                "acccvt_bytes_per_cycle": t.acccvt_bytes_per_cycle * scale}
    if buffer == "ports+latency":
        tile.update(fill_latency_cycles=max(1, t.fill_latency_cycles // scale),
                    move_port_latency_cycles=max(1, t.move_port_latency_cycles // scale),
                    img2col_latency_cycles=max(1, t.img2col_latency_cycles // scale))
    path = folder / f"{name}.toml"
    path.write_text(f'base = "{base}"\n\n[core]\nname = "{name}"\n\n[compute]\n'
                    f'tile_macs_per_cycle = {{ {", ".join(f"{k} = {v}" for k, v in scaled.items())} }}\n'
                    + ("\n[tile]\n" + "".join(f"{k} = {v}\n" for k, v in tile.items()) if tile else ""))
    return path


def layout_counts(layouts: dict) -> dict:
    """The estimate's activation layouts (issue 16) as counts: activations NC1HWC0 in DDR, layout
    conversions, TIU transposes into pixel-major images and the TILE conv layers that run them."""
    return {"c0_blocked": len(layouts["c0_blocked"]), "conversions": len(layouts["conversions"]),
            "lmem_transposes": sum(layouts["lmem_transposes"].values()), "transposing_layers": len(layouts["lmem_transposes"])}


def run(model: str, chip: str, dtype: str, matmul: str, choice: str = "fit") -> dict:
    """What pipeline.estimate does, with the compile's and the whole estimate's CPU time."""
    from tpuflow.estimate import estimate_report
    from tpuflow.hwmodel.timing import simulate
    t0, cpu0 = time.perf_counter(), time.process_time()
    options = CompileOptions(dtype=dtype, matmul=matmul, **({"tile_engine": choice} if matmul == "tile" else {}))
    _, program = compile_model(model, chip, options)
    compile_cpu = time.process_time() - cpu0
    sim = simulate(program)
    report = estimate_report(program, sim)
    wall, estimate_cpu = time.perf_counter() - t0, time.process_time() - cpu0
    engines = report["engines"]
    return {"model": model, "chip": program.chip.name, "matmul": matmul, **({"engine_choice": choice} if matmul == "tile" else {}),
            "dtype": dtype, "latency_us": report["latency_us"],
            "instructions": {k: v["instructions"] for k, v in engines.items()},
            "busy_us": {k: round(v["busy_us"], 3) for k, v in engines.items()},
            "gdma_by_kind": gdma_by_kind(program, sim), "tile_port_by_kind": port_by_kind(program, sim),
            **({"layouts": layout_counts(report["layouts"])} if report.get("layouts") else {}),
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
    ap.add_argument("--choices", default="fit,all,cost", help="--tile-engine values the TILE path runs with")
    ap.add_argument("--cube-scales", default="2,4", help="cube MAC multipliers of the chip variants ('' for none)")
    ap.add_argument("--cube-models", default="resnet50,squeezenet", help="models run on the chip variants")
    ap.add_argument("--cube-choices", default="fit,all,cost", help="--tile-engine values run on the chip variants")
    ap.add_argument("--what-if", default="resnet50",
                    help="models also run with a 4x cube whose tile buffer ports (and then latencies) scale too ('' none)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    out = args.out or RESULTS / f"tile_{args.dtype}.json"
    rows: list[dict] = []
    print(f"{'model':12} {'chip':18} {'choice':6} {'TIU us':>9} {'TILE us':>9} {'ratio':>6} {'TIU instr':>10} "
          f"{'TILE instr':>10} {'TIU cpu s':>9} {'TILE cpu s':>10} {'TILE compile cpu s':>18}")

    def write() -> None:
        out.write_text(json.dumps({"chip": args.chip, "dtype": args.dtype, "runs": rows, "commit": _commit(),
                                   "command": shlex.join(["python", "benchmarks/tile_bench.py", *sys.argv[1:]])}, indent=1) + "\n")

    def compare(model: str, chip: str, choices: list[str]) -> None:
        tiu = run(model, chip, args.dtype, "tiu")
        rows.append(tiu)
        for choice in choices:
            tile = run(model, chip, args.dtype, "tile", choice)
            tile["over_tiu"] = round(tile["latency_us"] / tiu["latency_us"], 3)
            rows.append(tile)
            print(f"{model:12} {tile['chip']:18} {choice:6} {tiu['latency_us']:9.1f} {tile['latency_us']:9.1f} "
                  f"{tile['over_tiu']:6.2f} {sum(tiu['instructions'].values()):10d} "
                  f"{sum(tile['instructions'].values()):10d} {tiu['estimate_cpu_s']:9.1f} "
                  f"{tile['estimate_cpu_s']:10.1f} {tile['compile_cpu_s']:18.1f}")
        write()

    for model in args.models.split(","):
        compare(model, args.chip, args.choices.split(","))
    with tempfile.TemporaryDirectory() as folder:
        for scale in [int(x) for x in args.cube_scales.split(",") if x]:
            variant = cube_variant(args.chip, scale, Path(folder))
            for model in args.cube_models.split(","):
                compare(model, str(variant), args.cube_choices.split(","))
        for buffer in ("ports", "ports+latency") if args.what_if else ():
            variant = cube_variant(args.chip, 4, Path(folder), buffer)
            for model in args.what_if.split(","):
                compare(model, str(variant), args.cube_choices.split(","))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
