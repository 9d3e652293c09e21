"""Calibration benchmark: ResNet-50 on BM1684X (default compile) against the public silicon numbers.

    python benchmarks/fidelity.py [--dtypes fp32,fp16,int8] [--chip bm1684x|FILE.toml] [--out benchmarks/results/fidelity.json]

The calibration set is the sophon-demo ResNet sample README's `bmrt_test` TPU time on BM1684X,
batch 1: ResNet-50 fp32 9.14 ms, fp16 1.62 ms, int8 1.10 ms (tpuflow's int8 point is `--dtype int8`:
its own post-training quantization, tpuflow/quantize.py, not the vendor's calibrated model). Each
point is compiled with the default options (only the dtype set), simulated, and printed next to
the measurement with its relative error; tpu-mlir 1.30.2's own static estimate for the same model
(compiler_profile.txt TCYC of ../shared/peers/tpu-mlir/resnet50/bm1684x_*) is shown for reference.
Other models' silicon numbers are deliberately not here: they check that the calibration generalises.

When the corpus is present, each point also simulates tpu-mlir's own ResNet-50 program on the same chip
model: the raw bm1690 command streams of ../shared/peers/tpu-mlir/resnet50/bm1690_<dtype> (the only
vendor binaries in the corpus; tpu-mlir compiled them for the BM1684X's sibling with the same lanes,
LMEM and ISA family, but they are not the exact bmodel that was measured). That separates hardware-model
accuracy (vendor program vs silicon) from compiler quality (our program vs the vendor's).
The vendor program is also simulated in the forms tpu-mlir's BM1684X program (the one measured) gives its
commands, from its own corpus output (`vendor_program_bm1684x_forms_ms`): when the bm1684x final.mlir sets
`use_3ic_optimize` on the 7x7 stem conv (fp16), that conv with its kernel rows folded into the input
channels (3 x 7 = 21 channels, kernel 1 x 7), as tpu-mlir's bm1684x profile costs it (21952 cycles). The FC
needs no rewrite since codegen/vendor.py reads the bm1690 sMM as mm.normal with its N columns on the lanes
(isa.MmTiu); `_fc_on_lanes` only turns an MM2 with a single row, which the vendor programs no longer hold.
--chip takes a chip file instead of the built-in bm1684x (e.g. to try a constant before changing it);
its points are still compared with the BM1684X measurements.
Writes benchmarks/results/fidelity.json (temp file, then rename).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from tpuflow.chip import load_chip
from tpuflow.codegen.vendor import read_stream_dir
from tpuflow.hwmodel.timing import simulate
from tpuflow.isa import ConvTiu, Mm2Tiu
from tpuflow.options import CompileOptions
from tpuflow.pipeline import estimate

RESULTS = Path(__file__).parent / "results" / "fidelity.json"
CORPUS = Path(__file__).resolve().parent.parent.parent / "shared" / "peers" / "tpu-mlir"
VENDOR_STREAMS = {"fp32": "bm1690_f32", "fp16": "bm1690_f16"}
SOURCE = "sophon-demo sample/ResNet README, BM1684X, bmrt_test TPU time, batch 1"
# (model, chip, dtype) -> measured ms on silicon
SILICON_MS = {("resnet50", "bm1684x", "fp32"): 9.14, ("resnet50", "bm1684x", "fp16"): 1.62,
              ("resnet50", "bm1684x", "int8"): 1.10}
# tpu-mlir 1.30.2 compiler_profile.txt TCYC / 1e6 (its static estimate at 1 GHz), peers/tpu-mlir/SUMMARY.md
TPU_MLIR_MS = {("resnet50", "bm1684x", "fp32"): 5.014417, ("resnet50", "bm1684x", "fp16"): 1.450846}


def _fc_on_lanes(instr):
    """An MM2 read from sMM with one row on the lanes -> the same product with its N columns on the lanes."""
    if isinstance(instr, Mm2Tiu) and instr.res0_c == 1:
        m, n, k = instr.mnk
        return dataclasses.replace(instr, res0_c=n, res0_w=m, opd0_c=n, opd0_w=k, opd1_c=k, opd1_w=m)
    return instr


def _stem_3ic(instr):
    """The 3-channel 7x7 stem conv with its kernel rows folded into the input channels (use_3ic_optimize)."""
    if isinstance(instr, ConvTiu) and instr.opd0_c == 3 and instr.opd1_h == 7:
        return dataclasses.replace(instr, opd0_c=3 * instr.opd1_h, opd1_h=1)
    return instr


def bm1684x_forms(program, model_dir: Path, dtype: str):
    """The vendor's bm1690 program with the FC and (if the bm1684x build folds it) the stem conv in the forms
    tpu-mlir's BM1684X program uses (see the module docstring)."""
    folded = model_dir / f"bm1684x_{dtype.replace('fp', 'f')}" / "final.mlir"
    stem = folded.is_file() and re.search(r"use_3ic_optimize = [1-9]", folded.read_text()) is not None
    tiu = [_stem_3ic(_fc_on_lanes(i)) if stem else _fc_on_lanes(i) for i in program.tiu]
    return dataclasses.replace(program, tiu=tiu)


def vendor_forms_ms(streams: Path, chip, dtype: str) -> float:
    program, _ = read_stream_dir(streams, chip if not isinstance(chip, str) else load_chip(chip))
    return simulate(bm1684x_forms(program, streams.parent, dtype), check=False).total_us / 1e3


def point(model: str, chip: str, dtype: str, chip_file: str | None = None) -> dict:
    began = time.perf_counter()
    options = CompileOptions(dtype=dtype)
    report = estimate(model, chip_file or chip, options)
    measured = SILICON_MS[(model, chip, dtype)]
    ours = report["latency_us"] / 1e3
    vendor = TPU_MLIR_MS.get((model, chip, dtype))
    streams = CORPUS / model / VENDOR_STREAMS.get(dtype, "-")
    vendor_sim = estimate(streams, chip_file or chip)["latency_us"] / 1e3 if streams.is_dir() else None
    forms = vendor_forms_ms(streams, chip_file or chip, dtype) if streams.is_dir() else None
    return {"model": model, "chip": chip, "chip_used": report["chip"], "chip_fingerprint": report["chip_fingerprint"],
            "dtype": dtype, "options": options.as_dict(),
            "silicon_ms": measured, "estimate_ms": round(ours, 4), "error": round(ours / measured - 1.0, 4),
            "tpu_mlir_ms": vendor, "tpu_mlir_error": round(vendor / measured - 1.0, 4) if vendor else None,
            "vendor_program_ms": round(vendor_sim, 4) if vendor_sim else None,
            "vendor_program_error": round(vendor_sim / measured - 1.0, 4) if vendor_sim else None,
            "vendor_program": str(streams.relative_to(CORPUS)) if vendor_sim else None,
            "vendor_program_bm1684x_forms_ms": round(forms, 4) if forms else None,
            "vendor_program_bm1684x_forms_error": round(forms / measured - 1.0, 4) if forms else None,
            "busy_us": {k: round(v["busy_us"], 1) for k, v in report["engines"].items()},
            "bounds_us": {k: round(v, 1) for k, v in report["bounds"].items()},
            "wall_s": round(time.perf_counter() - began, 1)}


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).parent, check=False)
        return out.stdout.strip()
    except OSError:
        return ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="fp32,fp16,int8")
    ap.add_argument("--chip", default=None, help="chip name or file (default: the built-in bm1684x)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    rows = []
    print(f"{'model':9s} {'chip':8s} {'dtype':5s} {'silicon ms':>10s} {'ours ms':>8s} {'error':>7s} "
          f"{'tpu-mlir ms':>11s} {'error':>7s} {'vendor prog ms':>14s} {'error':>7s} {'1684x forms':>11s} {'error':>7s}")
    for dtype in args.dtypes.split(","):
        r = point("resnet50", "bm1684x", dtype, args.chip)
        rows.append(r)
        vendor = f"{r['tpu_mlir_ms']:11.3f} {100 * r['tpu_mlir_error']:+6.1f}%" if r["tpu_mlir_ms"] else f"{'-':>19s}"
        program = (f"{r['vendor_program_ms']:14.3f} {100 * r['vendor_program_error']:+6.1f}%"
                   if r["vendor_program_ms"] else f"{'-':>14s}")
        forms = (f"{r['vendor_program_bm1684x_forms_ms']:11.3f} {100 * r['vendor_program_bm1684x_forms_error']:+6.1f}%"
                 if r["vendor_program_bm1684x_forms_ms"] else f"{'-':>11s}")
        print(f"{r['model']:9s} {r['chip']:8s} {dtype:5s} {r['silicon_ms']:10.2f} {r['estimate_ms']:8.3f} "
              f"{100 * r['error']:+6.1f}% {vendor} {program} {forms}", flush=True)
    worst = max(abs(r["error"]) for r in rows)
    forms = [abs(r["vendor_program_bm1684x_forms_error"]) for r in rows if r["vendor_program_bm1684x_forms_ms"]]
    check = max(forms) if forms else None
    print(f"worst |error| {100 * worst:.1f}% (our program: a statement about our compiler)")
    if check is not None:
        print(f"hardware-model check, the measured vendor program (BM1684X forms): worst |error| {100 * check:.1f}%")
    doc = {"source": SOURCE, "commit": git_commit(), "points": rows, "worst_abs_error": worst,
           "vendor_check_worst_abs_error": check}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
