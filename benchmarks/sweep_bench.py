"""Benchmark of `tpuflow sweep` (issue 17): a 48-point sweep (2 models x 2 dtypes x 12 timing-only chip
variants) on a Dask LocalCluster with 1 and with 2 single-threaded workers, against the same
estimates run directly in one process (one compile per model and dtype, as the sweep's cache does).
Reports wall times (cluster start apart), the 2-worker / 1-worker ratio, compiles against points,
and the per-point overhead beyond the estimate itself. Writes benchmarks/results/sweep.json.

    python benchmarks/sweep_bench.py [--models a,b] [--repeat N] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from tpuflow import sweep

GRID = {"ife.decode_cycles": [1, 2, 4], "wdc.x2x_fifo_depth": [4, 8, 16, 32]}     # 12 chip variants


def spec_for(models: list[str]) -> sweep.Spec:
    return sweep.load_spec({"models": models, "dtypes": ["fp16", "fp32"], "chip": "sg2260", "grid": GRID})


def direct_seconds(spec: sweep.Spec, cache: bool = True) -> float:
    """The sweep's work done in this process, no Dask: compile once per (model, dtype) (or, without
    the cache, once per point as a loop over `tpuflow estimate` would), simulate each point."""
    chips = sweep.validate(spec)
    base = sweep.base_chip_raw(spec)
    began, compiled = time.perf_counter(), {}
    for point in chips:
        job = sweep.Job(point, "", spec.model_path(point.model), (), *base)
        if point.compile_group not in compiled or not cache:
            compiled[point.compile_group] = sweep.compile_job(job)
        sweep.simulate_jobs(compiled[point.compile_group], [job])
    return time.perf_counter() - began


def dask_seconds(spec: sweep.Spec, workers: int) -> dict:
    import tempfile
    from dask.distributed import Client, LocalCluster, get_task_stream
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch, \
            LocalCluster(n_workers=workers, threads_per_worker=1, dashboard_address=None, local_directory=scratch,
                         silence_logs=50) as cluster, Client(cluster) as client:
        client.wait_for_workers(workers)
        started = time.perf_counter()
        rows: list[dict] = []
        with get_task_stream(client) as stream:
            frame = sweep.run(spec, client=client, on_rows=rows.extend)
        ran = time.perf_counter()
    busy: dict = {}
    for task in stream.data:
        for span in task["startstops"]:
            if span["action"] == "compute":
                busy.setdefault(task["worker"], [0, 0.0])
                busy[task["worker"]][0] += 1
                busy[task["worker"]][1] += span["stop"] - span["start"]
    return {"workers": workers, "cluster_start_s": round(started - began, 3), "sweep_s": round(ran - started, 3),
            "points": len(frame), "compiles": frame.attrs["compiles"], "ok": int((frame["status"] == "ok").sum()),
            "tasks_and_busy_s_per_worker": sorted([n, round(b, 3)] for n, b in busy.values()),
            # the busiest worker's share of all task time: the 2-worker / 1-worker wall ratio an idle
            # machine would show (wall times on a loaded machine also carry the other processes)
            "busiest_worker_share": round(max(b for _, b in busy.values()) / sum(b for _, b in busy.values()), 3),
            "simulate_wall_s": round(sum(r["_seconds"] for r in rows), 3),
            "simulate_cpu_s": round(sum(r["_cpu_seconds"] for r in rows), 3),
            "load_average_1min": round(os.getloadavg()[0], 2), "frame": frame}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mobilenetv2,inception_v1")
    parser.add_argument("--repeat", type=int, default=2, help="runs per worker count (the fastest is kept)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "sweep.json")
    args = parser.parse_args()
    spec = spec_for(args.models.split(","))
    sweep.validate(spec)                               # warm imports and the model builders once
    began = time.perf_counter()
    sweep.validate(spec)                               # part of every sweep (checks every model loads)
    validate = time.perf_counter() - began
    direct, uncached = direct_seconds(spec), direct_seconds(spec, cache=False)
    one = min((dask_seconds(spec, 1) for _ in range(args.repeat)), key=lambda r: r["sweep_s"])
    two = min((dask_seconds(spec, 2) for _ in range(args.repeat)), key=lambda r: r["sweep_s"])
    assert one["frame"].equals(two["frame"]), "1 and 2 workers gave different rows"
    points = one["points"]
    result = {
        "benchmark": "sweep_bench", "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "spec": {"models": list(spec.models), "dtypes": list(spec.dtypes), "grid": GRID, "points": points},
        "direct_in_process_s": round(direct, 3), "direct_compile_every_point_s": round(uncached, 3),
        "validate_s": round(validate, 3),
        "repeat": args.repeat, "dask": [{k: v for k, v in r.items() if k != "frame"} for r in (one, two)],
        "two_over_one_workers": round(two["sweep_s"] / one["sweep_s"], 3),
        "overhead_per_point_s": round((one["sweep_s"] - direct) / points, 4),
        "overhead_per_point_note": "(1-worker sweep - direct in-process estimates) / points; includes validate_s "
                                   "and the Dask tasks; wall times on a shared 2-core machine (see load_average_1min)",
        "compiles_per_point": f"{one['compiles']} compiles for {points} points "
                              f"({points - one['compiles']} cache hits)",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
