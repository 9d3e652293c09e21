"""One model on 1, 2, 4 and 8 cores, side by side in one run: latency, speedup over one core, DRAM
bytes and achieved bandwidth against the chip's total, compile and simulation CPU time.

    python benchmarks/multicore_bench.py [--models resnet50,mobilenetv2,bert_base,gpt_block]
                                         [--cores 1,2,4,8] [--chip sg2260] [--dtype fp16]

Writes benchmarks/results/multicore_<dtype>.json and prints a table (issue 14's targets: a
compute-bound encoder at seq 384 speeds up >= 5x on 8 cores; 8-core ResNet-50 simulates in < 5 s).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model

RESULTS = Path(__file__).parent / "results"
MODELS = ("resnet50", "mobilenetv2", "bert_base", "gpt_block")


def measure(model: str, chip: str, dtype: str, cores: int) -> dict:
    from tpuflow.estimate import estimate_report
    from tpuflow.hwmodel.timing import simulate
    began = time.process_time()
    _, program = compile_model(model, chip, CompileOptions(dtype=dtype, cores=cores))
    compiled = time.process_time()
    result = simulate(program)
    simulated = time.process_time()
    report = estimate_report(program, result)
    dram = report["dram"]
    moved = dram["bytes_read"] + dram["bytes_written"]
    return {"cores": cores, "latency_us": report["latency_us"], "ddr_bytes": moved,
            "dram_gbps": round(moved / report["latency_us"] / 1e3, 2),
            "chip_dram_peak_gbps": program.chip.dram.chip_peak_gbps or program.chip.dram.peak_gbps * cores,
            "instructions": program.total_instruction_count,
            "compile_cpu_s": round(compiled - began, 3), "simulate_cpu_s": round(simulated - compiled, 3)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--cores", default="1,2,4,8")
    ap.add_argument("--chip", default="sg2260")
    ap.add_argument("--dtype", default="fp16")
    args = ap.parse_args(argv)
    rows = []
    print(f"{'model':12s} {'cores':>5s} {'latency_us':>11s} {'speedup':>8s} {'DDR MB':>8s} {'GB/s':>7s} "
          f"{'compile_s':>9s} {'simulate_s':>10s}")
    for model in args.models.split(","):
        single = None
        for cores in (int(c) for c in args.cores.split(",")):
            row = {"model": model, **measure(model, args.chip, args.dtype, cores)}
            single = row["latency_us"] if cores == 1 else single
            row["speedup"] = round(single / row["latency_us"], 3) if single else None
            rows.append(row)
            print(f"{model:12s} {cores:5d} {row['latency_us']:11.1f} {row['speedup'] or 0:8.2f} "
                  f"{row['ddr_bytes'] / 1e6:8.1f} {row['dram_gbps']:7.1f} {row['compile_cpu_s']:9.2f} "
                  f"{row['simulate_cpu_s']:10.2f}", flush=True)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"multicore_{args.dtype}.json"
    rows = _merged(out, args.chip, rows)
    out.write_text(json.dumps({"chip": args.chip, "dtype": args.dtype, "rows": rows}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


def _merged(out, chip: str, rows: list[dict]) -> list[dict]:
    """The rows measured now, replacing the file's rows of the same (model, cores); the file's other
    rows kept when it is for the same chip (so `--models X` updates X's rows only)."""
    if not out.exists():
        return rows
    old = json.loads(out.read_text())
    if old.get("chip") != chip:
        return rows
    fresh = {(r["model"], r["cores"]) for r in rows}
    return [r for r in old["rows"] if (r["model"], r["cores"]) not in fresh] + rows


if __name__ == "__main__":
    sys.exit(main())
