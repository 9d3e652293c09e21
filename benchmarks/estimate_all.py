"""Estimate every bundled model on every built-in chip: latency, lower bound, busiest engine.

    python benchmarks/estimate_all.py [--models a,b] [--chips sg2260,bm1684x,sg2262] [--paths tiu,tile]
        [--dtype fp32] [--schedule list]

Writes benchmarks/results/estimate_all.json (one row per model x chip x path: latency_us,
lower_bound_us, latency / bound, per-engine busy us, instructions, wall seconds) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tpuflow.chip import builtin_chip_names
from tpuflow.models import names
from tpuflow.options import CompileOptions
from tpuflow.pipeline import estimate

RESULTS = Path(__file__).parent / "results" / "estimate_all.json"


def row(model: str, chip: str, path: str, dtype: str, schedule: str) -> dict:
    began = time.perf_counter()
    report = estimate(model, chip, CompileOptions(dtype=dtype, matmul=path, schedule=schedule))
    engines = report["engines"]
    return {"model": model, "chip": chip, "matmul": path, "dtype": dtype, "schedule": schedule,
            "latency_us": report["latency_us"], "lower_bound_us": report["lower_bound_us"],
            "over_bound": round(report["latency_us"] / report["lower_bound_us"], 3),
            "busy_us": {k: v["busy_us"] for k, v in engines.items()},
            "instructions": sum(v["instructions"] for v in engines.values()),
            "wall_s": round(time.perf_counter() - began, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(names()))
    ap.add_argument("--chips", default=",".join(builtin_chip_names()))
    ap.add_argument("--paths", default="tiu")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--schedule", default="list")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    rows = []
    for model in args.models.split(","):
        for chip in args.chips.split(","):
            for path in args.paths.split(","):
                r = row(model, chip, path, args.dtype, args.schedule)
                rows.append(r)
                print(f"{model:14s} {chip:8s} {path:4s} {r['latency_us']:11.1f} us  bound {r['lower_bound_us']:10.1f}"
                      f"  x{r['over_bound']:<6} {r['wall_s']:6.1f}s", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"dtype": args.dtype, "schedule": args.schedule, "runs": rows}, indent=1) + "\n")
    tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
