"""Verify every bundled model on both matmul paths and in fp32/fp16/bf16 (and int8), timing each run.

    python benchmarks/verify_all.py [--models a,b] [--paths tiu,tile] [--dtypes fp32,fp16,bf16,int8] [--schedule list]
                                    [--no-race] [--out FILE] [--append]

Writes benchmarks/results/verify_all.json (one row per run: ok, max_abs_err, max_rel_err, cosine,
seconds, instruction counts; int8 rows, tpuflow's post-training quantization checked against onnxruntime
on the QDQ model, also the worst error in quantization steps and against the float model; rewritten
after every run so a long sweep keeps what it has done) and
prints a table. --append keeps the rows already in --out and skips the cases they cover. Exit code
1 when any run fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tpuflow.models import names
from tpuflow.options import CompileOptions
from tpuflow.pipeline import verify

RESULTS = Path(__file__).parent / "results" / "verify_all.json"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(names()))
    ap.add_argument("--paths", default="tiu,tile")
    ap.add_argument("--dtypes", default="fp32,fp16,bf16")
    ap.add_argument("--schedule", default="list", help="program | list | cpsat")
    ap.add_argument("--no-race", action="store_true")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--append", action="store_true", help="keep --out's rows and skip the cases they cover")
    args = ap.parse_args()
    rows = json.loads(args.out.read_text())["runs"] if args.append and args.out.exists() else []
    done = {(r["model"], r["matmul"], r["dtype"]) for r in rows}
    failed = 0
    for model in args.models.split(","):
        for path in args.paths.split(","):
            for dtype in args.dtypes.split(","):
                if (model, path, dtype) in done:
                    continue
                t0 = time.perf_counter()
                try:
                    options = CompileOptions(dtype=dtype, matmul=path, schedule=args.schedule)
                    r = verify(model, None, options, race_check=not args.no_race)
                    worst = max(r["outputs"], key=lambda o: o["max_rel_err"])
                    row = {"model": model, "matmul": path, "dtype": dtype, "ok": r["ok"],
                           "max_abs_err": max(o["max_abs_err"] for o in r["outputs"]),
                           "max_rel_err": worst["max_rel_err"], "cosine": worst["cosine"],
                           "instructions": r["instructions"], **_int8_columns(r)}
                except Exception as exc:  # a crash is a failure of this row, the others still run
                    row = {"model": model, "matmul": path, "dtype": dtype, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
                row["seconds"] = round(time.perf_counter() - t0, 2)
                failed += not row["ok"]
                rows.append(row)
                print(f"{model:14s} {path:4s} {dtype:5s} {'ok ' if row['ok'] else 'FAIL'} "
                      f"{row.get('max_rel_err', float('nan')):.2e} {row['seconds']:7.1f}s {row.get('error', '')}", flush=True)
                _write(args, rows)
    return 1 if failed else 0


def _int8_columns(result: dict) -> dict:
    """--dtype int8 on a float model (verify compares with onnxruntime on tpuflow's QDQ model): the
    worst error in quantization steps where the output is quantized, the worst error against the
    float model, how many ops stayed float, and which of verify's rules passed each output (checks;
    stage-wise ones with their worst stage)."""
    quant = result.get("quantization")
    if not quant:
        return {}
    outputs = result["outputs"]
    steps = [o.get("steps", o["max_abs_err"] / o["quant_step"]) for o in outputs if o.get("quant_step")]
    tails = [o["tail_check"] for o in outputs if "tail_check" in o]
    stages = [o["stage_check"] for o in outputs if "stage_check" in o]
    return {"max_quant_steps": max(steps) if steps else None,
            "checks": sorted({o["check"].split(";")[0] for o in outputs}),
            **({"worst_stage_steps": max(s["worst_stage"]["steps"] for s in stages),
                "stages_checked": max(s["stages"] for s in stages)} if stages else {}),
            **({"tail_checks": [{"boundary_values": t["boundary_values"], "ok": t["ok"]} for t in tails]} if tails else {}),
            "references": sorted({o["reference"] for o in outputs}),
            "vs_other_execution_steps": max((o["vs_other_execution"].get("steps", 0.0) for o in outputs), default=None),
            "vs_other_execution_cosine": min(o["vs_other_execution"]["cosine"] for o in outputs),
            "vs_float_max_abs_err": max(o["vs_float"]["max_abs_err"] for o in outputs),
            "vs_float_cosine": min(o["vs_float"]["cosine"] for o in outputs),
            "int8_ops": quant["int8_ops"], "float_ops": len(quant["float_ops"])}


def _write(args, rows: list) -> None:
    """Writes the rows so far (temp file, then rename)."""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"race_check": not args.no_race, "schedule": args.schedule, "runs": rows}, indent=1) + "\n")
    tmp.replace(args.out)


if __name__ == "__main__":
    sys.exit(main())
