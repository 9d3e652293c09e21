"""Speed of the timing model: compiled models (ResNet-50, a BERT layer) and a synthetic ResNet-50-sized
program with many small instructions.

    python benchmarks/timing_bench.py [--chip sg2260] [--repeat 3] [--models resnet50,bert_layer] [--profile]
                                      [--before OLD_timing.json] [--out timing.json]
    (--models resnet50@tile times the TILE-path ResNet-50: 430k instructions, minutes; resnet50:8 the
     8-core compile, every core on one heap)

Compiled models go through tpuflow.pipeline.compile_model (schedule "program", TIU matmul path,
fp32). The synthetic program is hwmodel.timing.synthetic.resnet50_like (ResNet-50's 53 convolutions
lowered into output-channel chunks x row tiles x 32-channel input chunks: conv + input/weight loads
+ stores + residual adds; 11k instructions). Each is simulated `repeat` times; results go to
benchmarks/results/timing.json: wall and CPU seconds (best of the repeats; the machine is shared,
CPU time is the steadier number), simulated instructions per second, DRAM bursts per second, the
simulated latency and the program's size (every core's), plus the compile time of the compiled models.
The first repeat is the one a user's single `tpuflow estimate` sees (isa.ddr_range / lmem_ranges and the
burst tables are cached per process): its speed is first_run_instructions_per_s.
Every program is also simulated with the per-burst memory model (memory="burst", the path before the
rate model) in the same run: its speed and latency under "burst", and speedup_vs_burst.
--before names a timing.json this benchmark wrote at an earlier commit (run it there, in the same
session, so both see the same machine load): each program then also records that run's
instructions_per_s and cpu_s under "before", and the speedup.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import subprocess
import sys
import time
from pathlib import Path

from tpuflow.chip import load_chip
from tpuflow.hwmodel.timing import simulate
from tpuflow.hwmodel.timing.synthetic import resnet50_like

RESULTS = Path(__file__).resolve().parent / "results" / "timing.json"


def measure(program, repeat: int, memory: str = "rate") -> dict:
    walls, cpus, result = [], [], None
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        result = simulate(program, memory=memory)
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    wall, cpu = min(walls), min(cpus)
    n = program.total_instruction_count
    cores = result.cores or [result]
    bursts = sum(r.dram.bursts for r in cores)
    nbytes = sum(r.dram.bytes_read + r.dram.bytes_written for r in cores)
    return {
        "wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "wall_s_all": [round(x, 3) for x in walls],
        "cpu_s_all": [round(x, 3) for x in cpus], "first_run_instructions_per_s": round(n / cpus[0]),
        "instructions": n, "counts": program.counts(), "cores": len(cores), "dram_bursts": bursts,
        "dram_mbytes": round(nbytes / 1e6, 1),
        "instructions_per_s": round(n / cpu), "dram_bursts_per_s": round(bursts / cpu),
        "simulated_latency_us": round(result.total_us, 3), "events": result.events,
        "busy_us": {k: round(v / 1e6, 3) for k, v in result.busy_ps.items()},
        "dram_page_hit_rate": round(result.dram.page_hit_rate, 4),
        "dram_achieved_gbps": round(nbytes / result.total_ps * 1e3, 2) if result.total_ps else 0.0,
    }


def side_by_side(program, repeat: int) -> dict:
    """The rate model's numbers, with the per-burst model's (memory="burst", the old path) timed in the same
    run under "burst" and the speedup."""
    now = measure(program, repeat)
    old = measure(program, repeat, memory="burst")
    now["burst"] = {k: old[k] for k in ("cpu_s", "wall_s", "instructions_per_s", "simulated_latency_us")}
    now["speedup_vs_burst"] = round(old["cpu_s"] / now["cpu_s"], 2) if now["cpu_s"] else None
    return now


def add_before(report: dict, before: dict) -> None:
    """Record an earlier run's speed next to each program it also timed."""
    report["before_commit"] = before.get("commit", "")
    for name, now in report["programs"].items():
        old = before["programs"].get(name)
        if old and old["instructions"] == now["instructions"]:
            now["before"] = {"instructions_per_s": old["instructions_per_s"], "cpu_s": old["cpu_s"],
                             "simulated_latency_us": old["simulated_latency_us"],
                             "first_run_cpu_s": old.get("cpu_s_all", [None])[0]}
            now["speedup"] = round(old["cpu_s"] / now["cpu_s"], 2) if now["cpu_s"] else None


def commit() -> str:
    """The git commit of the checkout whose tpuflow is timed ('' outside git)."""
    import tpuflow
    where = Path(tpuflow.__file__).resolve().parent
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=where, text=True,
                              capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def compiled(spec: str, chip):
    """A compiled bundled model: 'name' (TIU matmul path), 'name@tile' (TILE path), either with ':N' for
    N cores ('resnet50:8')."""
    from tpuflow.options import CompileOptions
    from tpuflow.pipeline import compile_model
    spec, _, cores = spec.partition(":")
    name, _, matmul = spec.partition("@")
    t = time.perf_counter()
    options = CompileOptions(schedule="program", matmul=matmul or "tiu", **({"cores": int(cores)} if cores else {}))
    _, program = compile_model(name, chip, options)
    return program, time.perf_counter() - t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chip", default="sg2260")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--models", default="resnet50,bert_layer",
                    help="compiled models to time, name or name@tile ('' for none)")
    ap.add_argument("--profile", action="store_true", help="print the top functions of one synthetic run")
    ap.add_argument("--before", type=Path, help="timing.json of an earlier commit to compare with")
    ap.add_argument("--out", type=Path, default=RESULTS, help="where the results go (default %(default)s)")
    args = ap.parse_args(argv)
    chip = load_chip(args.chip)
    report = {"benchmark": "timing model (hwmodel.timing.simulate)", "chip": chip.name,
              "chip_fingerprint": chip.fingerprint(), "commit": commit(), "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
              "programs": {}}
    for name in filter(None, args.models.split(",")):
        program, build = compiled(name, chip)
        report["programs"][name] = {"compile_s": round(build, 3), **side_by_side(program, args.repeat)}
    t = time.perf_counter()
    program = resnet50_like(chip)
    build = time.perf_counter() - t
    report["programs"]["synthetic_resnet50_like"] = {"build_s": round(build, 3), **side_by_side(program, args.repeat)}
    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(simulate, program)
        pstats.Stats(prof).sort_stats("cumtime").print_stats(25)
    if args.before:
        add_before(report, json.loads(args.before.read_text()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    tmp.replace(args.out)
    print(json.dumps(report, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
