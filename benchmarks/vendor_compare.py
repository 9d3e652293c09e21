"""Our program next to tpu-mlir's, on the same timing model: the corpus's bm1690 command streams
(../shared/peers/tpu-mlir/<model>/bm1690_<dtype>/) simulated as they are against our compile of the
same model, with both layer-group counts.

    python benchmarks/vendor_compare.py [--dtype fp16] [--chip sg2260] [--corpus PATH]

Writes benchmarks/results/vendor_compare_<dtype>.json and prints a table. tpu-mlir's own static
estimate (TCYC) and group count are read from the corpus files. Skips (saying so) when the corpus
is absent.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from tpuflow.options import CompileOptions
from tpuflow.pipeline import estimate

RESULTS = Path(__file__).parent / "results"
CORPUS = Path(__file__).resolve().parents[2] / "shared" / "peers" / "tpu-mlir"
MODELS = {"resnet50": "resnet50", "mobilenetv2": "mobilenetv2", "inception_v1": "inception_v1",
          "bert_layer": "bert_layer", "gpt_block": "gpt_block", "squeezenet": "squeezenet",
          "llama_mlp_opset17": "llama_mlp"}


def vendor_row(folder: Path, chip: str) -> dict:
    report = estimate(folder, chip)
    profile = (folder / "compiler_profile.txt").read_text()
    tcyc = int(re.search(r"TCYC : (\d+)", profile).group(1))
    groups = (folder / "final.mlir").read_text().count('"tpu.Group"')
    dram = report["dram"]
    return {"latency_us": report["latency_us"], "ddr_bytes": dram["bytes_read"] + dram["bytes_written"],
            "tpu_mlir_estimate_us": tcyc / 1000, "layer_groups": groups}


def our_row(model: str, chip: str, dtype: str) -> dict:
    report = estimate(model, chip, CompileOptions(dtype=dtype))
    dram = report["dram"]
    return {"latency_us": report["latency_us"], "ddr_bytes": dram["bytes_read"] + dram["bytes_written"],
            "layer_groups": len(report["layer_groups"])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--chip", default="sg2260")
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    args = ap.parse_args()
    if not args.corpus.is_dir():
        print(f"no tpu-mlir corpus at {args.corpus}: nothing to compare")
        return 0
    suffix = {"fp16": "f16", "fp32": "f32"}[args.dtype]
    rows = []
    for folder_name, model in MODELS.items():
        folder = args.corpus / folder_name / f"bm1690_{suffix}"
        if folder.is_dir():
            rows.append({"model": model, "vendor": vendor_row(folder, args.chip), "ours": our_row(model, args.chip, args.dtype)})
    out = RESULTS / f"vendor_compare_{args.dtype}.json"
    out.parent.mkdir(exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"chip": args.chip, "dtype": args.dtype, "rows": rows}, indent=1) + "\n")
    tmp.replace(out)
    print(f"{'model':12s} {'ours us':>9s} {'theirs us':>10s} {'ratio':>6s} {'ours MB':>8s} {'theirs MB':>9s} "
          f"{'LGs ours':>8s} {'LGs theirs':>10s} {'their own est. us':>17s}")
    for r in rows:
        o, v = r["ours"], r["vendor"]
        print(f"{r['model']:12s} {o['latency_us']:9.1f} {v['latency_us']:10.1f} {v['latency_us'] / o['latency_us']:6.2f} "
              f"{o['ddr_bytes'] / 1e6:8.2f} {v['ddr_bytes'] / 1e6:9.2f} {o['layer_groups']:8d} {v['layer_groups']:10d} "
              f"{v['tpu_mlir_estimate_us']:17.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
