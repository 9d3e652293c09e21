"""Schedule quality and speed: makespan / lower bound of the program, list and cpsat orders per model.

    .venv/bin/python benchmarks/schedule_bench.py [--models resnet50,mobilenetv2,bert_layer,gpt_block]
        [--matmul tiu,tile] [--time-limit 20] [--max-instructions 500000] [--out FILE]

Each model is compiled (fp32, schedule "program") and scheduled by every method. Per method:
the DAG-model makespan (the scheduler's own timing: hwmodel.timing's per-instruction cost
estimates, precise hazards), the simulated makespan (hwmodel.timing.simulate of the reordered
program, the real judge), both divided by the lower bound (scheduler.bounds: max of critical path,
per-engine busy time, per-engine heads-and-tails relaxation, compute and DDR roofline), the simulated per-engine busy time and the
simulated makespan over the busiest simulated engine (how much idle the order leaves where the
simulator, not the cost model, says the work is), wall and CPU seconds of the scheduling (the
machine is shared: CPU is the steadier number) and whether the independent checker accepts it.
For programs small enough to be one CP-SAT window, the solver's proven lower bound on the
DAG-model makespan is reported too. Programs above --max-instructions are skipped (ResNet-50's
TILE path is ~430k instructions: each simulation of it takes minutes; the whole run takes about
half an hour on a shared 2-core machine). Results: benchmarks/results/schedule.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

from tpuflow.hwmodel.timing import simulate
from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model
from tpuflow.scheduler import schedule_with_report
from tpuflow.scheduler.bounds import lower_bounds
from tpuflow.scheduler.checker import check_schedule

RESULTS = Path(__file__).resolve().parent / "results" / "schedule.json"


def run_method(program, method: str, time_limit: float, bound: int) -> dict:
    """One method's row (the `program` row gets its DAG-model makespan from the list run)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result, report = schedule_with_report(program, method, time_limit)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    simulated = simulate(result)
    sim = simulated.total_ps
    row = {"method": method, "chosen": report.chosen, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
           "model_us": round(report.result_model_ps / 1e6, 3), "simulated_us": round(sim / 1e6, 3),
           "model_over_bound": round(report.result_model_ps / bound, 4), "simulated_over_bound": round(sim / bound, 4),
           "simulated_busy_us": {k: round(v / 1e6, 3) for k, v in simulated.busy_ps.items()},
           "simulated_over_busiest": round(sim / max(simulated.busy_ps.values()), 4)}
    if method == "program":
        return row
    row["emitted_model_ps"] = report.model_ps["program"]
    if method == "cpsat":
        row.update(windows=report.windows, windows_improved=report.windows_improved,
                   deterministic_time=round(report.deterministic_time, 2),
                   proven_bound_us=round(report.proven_bound_ps / 1e6, 3) if report.proven_bound_ps else None,
                   simulated_candidates_us={k: round(v / 1e6, 3) for k, v in report.simulated_ps.items()})
    began = time.perf_counter()
    row["checker_ok"] = check_schedule(program, result) == []
    row["checker_s"] = round(time.perf_counter() - began, 2)
    return row


def bench_model(model: str, matmul: str, time_limit: float, max_instructions: int) -> dict:
    began = time.perf_counter()
    _, program = compile_model(model, None, CompileOptions(schedule="program", matmul=matmul))
    compile_s = time.perf_counter() - began
    if program.instruction_count > max_instructions:
        return {"model": model, "matmul": matmul, "instructions": program.counts(),
                "skipped": f"more than --max-instructions {max_instructions}"}
    bounds = lower_bounds(program)
    bound = bounds["lower_bound_ps"]
    entry = {"model": model, "matmul": matmul, "instructions": program.counts(), "compile_s": round(compile_s, 2),
             "lower_bound_us": round(bound / 1e6, 3), "binding_bound": bounds["binding"],
             "bounds_us": {"critical_path": round(bounds["critical_path_ps"] / 1e6, 3),
                           "roofline_compute": round(bounds["roofline_compute_ps"] / 1e6, 3),
                           "roofline_ddr": round(bounds["roofline_ddr_ps"] / 1e6, 3),
                           **{f"{k}_busy": round(v / 1e6, 3) for k, v in bounds["engine_busy_ps"].items()},
                           **{f"{k}_relaxation": round(v / 1e6, 3) for k, v in bounds["engine_relaxation_ps"].items()}},
             "methods": {}}
    for method in ("program", "list", "cpsat"):
        entry["methods"][method] = run_method(program, method, time_limit, bound)
    emitted_ps = entry["methods"]["list"].pop("emitted_model_ps")
    entry["methods"]["cpsat"].pop("emitted_model_ps")
    entry["methods"]["program"].update(model_us=round(emitted_ps / 1e6, 3), model_over_bound=round(emitted_ps / bound, 4))
    for method, row in entry["methods"].items():
        print(f"{model:12s} {matmul:4s} {method:7s} " + json.dumps(row), file=sys.stderr, flush=True)
    return entry


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,mobilenetv2,bert_layer,gpt_block")
    ap.add_argument("--matmul", default="tiu,tile")
    ap.add_argument("--time-limit", type=float, default=20.0, help="cpsat budget (deterministic units)")
    ap.add_argument("--max-instructions", type=int, default=500_000, help="skip larger programs")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    rows, skipped = [], []
    for matmul in args.matmul.split(","):
        for model in args.models.split(","):
            row = bench_model(model, matmul, args.time_limit, args.max_instructions)
            (skipped if "skipped" in row else rows).append(row)
    out = {"benchmark": "schedule", "time_limit": args.time_limit, "python": platform.python_version(),
           "machine": platform.machine(), "cpus": os.cpu_count(),
           "command": "python benchmarks/schedule_bench.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "results": rows, "skipped": skipped}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(out, indent=2) + "\n")
    tmp.replace(args.out)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
