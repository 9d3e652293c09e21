"""Layer groups on and off, side by side in one run: DDR traffic over the compulsory bytes, latency,
compile time.

    python benchmarks/layergroup_bench.py [--models resnet50,mobilenetv2,...] [--chip sg2260] [--dtype fp16]

Compulsory bytes are those of `tpuflow inspect --json` (weights + graph inputs + outputs at the
compute dtype). Writes benchmarks/results/layergroup_<dtype>.json and prints a table; the
geometric means of DDR / compulsory are over the issue's five target models (ResNet-50,
MobileNetV2, Inception v1, BERT layer, GPT block) when they were run, and over all models run.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from tpuflow.frontend.stats import graph_stats, layer_stats
from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model, load_graph

RESULTS = Path(__file__).parent / "results"
TARGETS = ("resnet50", "mobilenetv2", "inception_v1", "bert_layer", "gpt_block")


COMPILE_REPEATS = 2     # compile time is the least of these (the first compile of a model warms caches)


def measure(model: str, chip: str, dtype: str, layer_group: str) -> dict:
    from tpuflow.estimate import estimate_report
    from tpuflow.hwmodel.timing import simulate
    compile_s = None
    for _ in range(COMPILE_REPEATS):
        began = time.process_time()
        _, program = compile_model(model, chip, CompileOptions(dtype=dtype, layer_group=layer_group))
        spent = time.process_time() - began
        compile_s = spent if compile_s is None else min(compile_s, spent)
    report = estimate_report(program, simulate(program))
    dram = report["dram"]
    return {"latency_us": report["latency_us"], "ddr_bytes": dram["bytes_read"] + dram["bytes_written"],
            "layer_groups": len(program.layer_groups), "compile_cpu_s": round(compile_s, 3)}


def row(model: str, chip: str, dtype: str) -> dict:
    graph = load_graph(model)
    compulsory = graph_stats(graph, layer_stats(graph, dtype), dtype).compulsory_bytes
    on, off = measure(model, chip, dtype, "on"), measure(model, chip, dtype, "off")
    return {"model": model, "chip": chip, "dtype": dtype, "compulsory_bytes": compulsory,
            "on": on, "off": off,
            "ddr_over_compulsory_on": round(on["ddr_bytes"] / compulsory, 3),
            "ddr_over_compulsory_off": round(off["ddr_bytes"] / compulsory, 3),
            "speedup": round(off["latency_us"] / on["latency_us"], 3),
            "compile_time_ratio": round(on["compile_cpu_s"] / max(off["compile_cpu_s"], 1e-9), 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from tpuflow.models import names
    ap.add_argument("--models", default=",".join(names()))
    ap.add_argument("--chip", default="sg2260")
    ap.add_argument("--dtype", default="fp16")
    args = ap.parse_args()
    rows = [row(m, args.chip, args.dtype) for m in args.models.split(",")]
    targets = [r for r in rows if r["model"] in TARGETS]
    geo, geo_off = _geomean(rows, "on"), _geomean(rows, "off")
    doc = {"chip": args.chip, "dtype": args.dtype, "rows": rows,
           "geomean_ddr_over_compulsory_on": geo, "geomean_ddr_over_compulsory_off": geo_off,
           "target_models": [r["model"] for r in targets],
           "target_geomean_ddr_over_compulsory_on": _geomean(targets, "on") if targets else None,
           "target_geomean_ddr_over_compulsory_off": _geomean(targets, "off") if targets else None}
    out = RESULTS / f"layergroup_{args.dtype}.json"
    RESULTS.mkdir(exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(out)
    print(f"{'model':14s} {'DDR/comp on':>11s} {'off':>6s} {'lat on us':>10s} {'off us':>9s} {'speedup':>7s} "
          f"{'LGs':>4s} {'compile x':>9s}")
    for r in rows:
        print(f"{r['model']:14s} {r['ddr_over_compulsory_on']:11.3f} {r['ddr_over_compulsory_off']:6.2f} "
              f"{r['on']['latency_us']:10.1f} {r['off']['latency_us']:9.1f} {r['speedup']:7.2f} "
              f"{r['on']['layer_groups']:4d} {r['compile_time_ratio']:9.2f}")
    print(f"geomean DDR/compulsory over all: on {geo:.3f}, off {geo_off:.3f}")
    if targets:
        print(f"geomean over {', '.join(r['model'] for r in targets)}: on {doc['target_geomean_ddr_over_compulsory_on']:.3f}, "
              f"off {doc['target_geomean_ddr_over_compulsory_off']:.3f}")
    return 0


def _geomean(rows: list[dict], which: str) -> float:
    return round(math.exp(sum(math.log(r[f"ddr_over_compulsory_{which}"]) for r in rows) / len(rows)), 3)


if __name__ == "__main__":
    sys.exit(main())
