"""Estimate every bundled model on every built-in chip: latency, lower bound, busiest engine.

    python benchmarks/estimate_all.py [--models a,b] [--chips sg2260,bm1684x,sg2262] [--paths tiu,tile]
        [--dtypes fp32,fp16,int8] [--schedule list] [--append]

Writes benchmarks/results/estimate_all.json (one row per model x chip x path x dtype: latency_us,
lower_bound_us, latency / bound, per-engine busy us, instructions, wall seconds; int8 rows, which
are tpuflow's post-training quantization of the float model, also count the ops that ran in int8
and those left float; a model the int8 path refuses is a row with its one-line error) and prints a
table, then int8 against fp16 per model and chip where both ran. --append keeps the rows already
in the results file and skips the cases they cover.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tpuflow.chip import builtin_chip_names
from tpuflow.errors import UserError
from tpuflow.models import names
from tpuflow.options import CompileOptions
from tpuflow.pipeline import estimate

RESULTS = Path(__file__).parent / "results" / "estimate_all.json"


def row(model: str, chip: str, path: str, dtype: str, schedule: str) -> dict:
    began = time.perf_counter()
    case = {"model": model, "chip": chip, "matmul": path, "dtype": dtype, "schedule": schedule}
    try:
        report = estimate(model, chip, CompileOptions(dtype=dtype, matmul=path, schedule=schedule))
    except UserError as exc:          # the int8 path refuses some models with one line
        return {**case, "error": str(exc), "wall_s": round(time.perf_counter() - began, 2)}
    engines = report["engines"]
    quant = report.get("quantization")
    return {**case, "latency_us": report["latency_us"], "lower_bound_us": report["lower_bound_us"],
            "over_bound": round(report["latency_us"] / report["lower_bound_us"], 3),
            "busy_us": {k: v["busy_us"] for k, v in engines.items()},
            "instructions": sum(v["instructions"] for v in engines.values()),
            **({"int8_ops": quant["int8_ops"], "float_ops": len(quant["float_ops"])} if quant else {}),
            "wall_s": round(time.perf_counter() - began, 2)}


def _key(r: dict) -> tuple:
    return r["model"], r["chip"], r["matmul"], r["dtype"]


def _line(r: dict) -> str:
    head = f"{r['model']:14s} {r['chip']:8s} {r['matmul']:4s} {r['dtype']:4s}"
    if "error" in r:
        return f"{head} refused: {r['error'][:100]}"
    return (f"{head} {r['latency_us']:11.1f} us  bound {r['lower_bound_us']:10.1f}  x{r['over_bound']:<6} "
            f"{r['wall_s']:6.1f}s")


def int8_table(rows: list[dict]) -> list[str]:
    """int8 against fp16 for every (model, chip, path) with both rows."""
    by_key = {_key(r): r for r in rows}
    lines = [f"{'model':14s} {'chip':8s} path  {'fp16_us':>10s} {'int8_us':>10s}  int8/fp16  int8 ops / float ops"]
    for (model, chip, path, dtype), r in by_key.items():
        fp16 = by_key.get((model, chip, path, "fp16"))
        if dtype != "int8" or fp16 is None or "error" in fp16:
            continue
        if "error" in r:
            lines.append(f"{model:14s} {chip:8s} {path:4s}  {fp16['latency_us']:10.1f} {'refused':>10s}")
            continue
        lines.append(f"{model:14s} {chip:8s} {path:4s}  {fp16['latency_us']:10.1f} {r['latency_us']:10.1f}  "
                     f"{r['latency_us'] / fp16['latency_us']:9.2f}  {r['int8_ops']} / {r['float_ops']}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(names()))
    ap.add_argument("--chips", default=",".join(builtin_chip_names()))
    ap.add_argument("--paths", default="tiu")
    ap.add_argument("--dtypes", "--dtype", default="fp32", help="comma list of fp32, fp16, bf16, int8")
    ap.add_argument("--schedule", default="list")
    ap.add_argument("--append", action="store_true", help="keep the rows of --out, skip the cases they cover")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    rows = json.loads(args.out.read_text())["runs"] if args.append and args.out.exists() else []
    done = {_key(r) for r in rows}
    for model in args.models.split(","):
        for chip in args.chips.split(","):
            for path in args.paths.split(","):
                for dtype in args.dtypes.split(","):
                    if (model, chip, path, dtype) in done:
                        continue
                    rows.append(row(model, chip, path, dtype, args.schedule))
                    print(_line(rows[-1]), flush=True)
                    _write(args.out, rows, args.schedule)
    print("\n".join(int8_table(rows)))
    return 0


def _write(out: Path, rows: list[dict], schedule: str) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"dtypes": sorted({r["dtype"] for r in rows}), "schedule": schedule, "runs": rows},
                              indent=1) + "\n")
    tmp.replace(out)


if __name__ == "__main__":
    sys.exit(main())
