"""Data-movement worst cases (transposes and concats that move the innermost axis): simulated latency
against the DRAM bound.

    python benchmarks/movement_bench.py --label after [--chip sg2260] [--dtype fp32]
    python benchmarks/movement_bench.py --label before --baseline

Each case is a one-node model; its estimate gives latency_us and lower_bound_us (the estimator's
bound), and the row records bytes moved (output bytes written + min(input, output) bytes read),
the DRAM bound (those bytes at the chip's peak DRAM bandwidth) and the achieved GB/s. --baseline turns the LMEM paths of
lowering/ops/lmem_move.py off, i.e. measures the plain DDR -> DDR DMAs they replaced. Results are
merged into benchmarks/results/movement.json under the label, so "before" and "after" sit side by
side.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tpuflow.chip import load_chip
from tpuflow.options import CompileOptions
from tpuflow.pipeline import estimate

RESULTS = Path(__file__).parent / "results" / "movement.json"


def _model(op: str, in_shapes: list[tuple], out_shape: tuple, **attrs) -> onnx.ModelProto:
    names = [f"x{i}" for i in range(len(in_shapes))]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in zip(names, in_shapes)]
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))
    node = helper.make_node(op, names, ["y"], name=op.lower(), **attrs)
    graph = helper.make_graph([node], f"move_{op.lower()}", inputs, [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _transpose(shape: tuple, perm: tuple):
    return _model("Transpose", [shape], tuple(shape[p] for p in perm), perm=list(perm))


def _concat(shapes: list[tuple], axis: int):
    out = list(shapes[0])
    out[axis] = sum(s[axis] for s in shapes)
    return _model("Concat", shapes, tuple(out), axis=axis)


def _with_consts(op: str, shape: tuple, consts: dict, outs: dict, **attrs) -> onnx.ModelProto:
    """One `op` node on input x0 plus constant inputs (name -> int64 values, '' = absent)."""
    inits = [numpy_helper.from_array(np.asarray(v, np.int64), n) for n, v in consts.items() if n]
    node = helper.make_node(op, ["x0"] + list(consts), list(outs), name=op.lower(), **attrs)
    graph = helper.make_graph([node], f"move_{op.lower()}", [helper.make_tensor_value_info("x0", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(o)) for n, o in outs.items()], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _slice(shape: tuple, steps):
    out = tuple(len(range(0, d, st)) for d, st in zip(shape, steps))
    return _with_consts("Slice", shape, {"starts": [0] * len(shape), "ends": list(shape), "": None, "steps": steps},
                        {"y": out})


def _split(shape: tuple, axis: int, sizes):
    outs = {f"y{i}": tuple(s if a == axis else d for a, d in enumerate(shape)) for i, s in enumerate(sizes)}
    return _with_consts("Split", shape, {"split": sizes}, outs, axis=axis)


CASES = {
    # the case: a Transpose moving the innermost axis, 1x40x120 fp32 (38 kB)
    "transpose_1x40x120_021": lambda: _transpose((1, 40, 120), (0, 2, 1)),
    "transpose_nchw_nhwc_1x64x56x56": lambda: _transpose((1, 64, 56, 56), (0, 2, 3, 1)),
    "transpose_nhwc_nchw_1x56x56x64": lambda: _transpose((1, 56, 56, 64), (0, 3, 1, 2)),
    "transpose_1x8x128x64_0213": lambda: _transpose((1, 8, 128, 64), (0, 2, 1, 3)),
    # many small planes, each transposed (a Resize / Softmax moving H last)
    "transpose_1x64x80x160_0132": lambda: _transpose((1, 64, 80, 160), (0, 1, 3, 2)),
    # the case: a Concat along a size-1 innermost axis (0.82 MB moved)
    "concat_last_axis_2x1x102400x1": lambda: _concat([(1, 102400, 1), (1, 102400, 1)], 2),
    "concat_last_axis_1x4x8400_and_1x80x8400": lambda: _concat([(1, 8400, 4), (1, 8400, 80)], 2),
    # a strided slice of the innermost axis (YOLOv5 Focus: x[..., ::2, ::2])
    "slice_step2_hw_1x32x320x320": lambda: _slice((1, 32, 320, 320), [1, 1, 2, 2]),
    "split_last_axis_1x8400x84_into_4_80": lambda: _split((1, 8400, 84), 2, [4, 80]),
    # Expand of a live tensor: every element repeated along the innermost axis / whole rows repeated
    "expand_inner_1x256x1_to_1x256x400": lambda: _with_consts("Expand", (1, 256, 1), {"shape": [1, 256, 400]},
                                                              {"y": (1, 256, 400)}),
    "expand_rows_1x1x400_to_1x256x400": lambda: _with_consts("Expand", (1, 1, 400), {"shape": [1, 256, 400]},
                                                             {"y": (1, 256, 400)}),
}


def run_case(name: str, chip: str, dtype: str) -> dict:
    model = CASES[name]()
    began = time.perf_counter()
    report = estimate(model, chip, CompileOptions(dtype=dtype))
    esize = {"fp32": 4, "fp16": 2, "bf16": 2}[dtype]
    # the least DRAM traffic: every output element written once, and read once unless the input is
    # smaller (a broadcast reads only its input)
    size = lambda vs: sum(math.prod(d.dim_value for d in v.type.tensor_type.shape.dim) for v in vs)
    out_elems, in_elems = size(model.graph.output), size(model.graph.input)
    moved = (out_elems + min(in_elems, out_elems)) * esize
    dram_bound = moved / (load_chip(chip).dram.peak_gbps * 1e3)
    lat = report["latency_us"]
    return {"case": name, "latency_us": round(lat, 3), "lower_bound_us": round(report["lower_bound_us"], 3),
            "dram_bound_us": round(dram_bound, 3), "over_dram_bound": round(lat / dram_bound, 2),
            "bytes_moved": moved, "gb_per_s": round(moved / lat / 1e3, 2),
            "instructions": sum(v["instructions"] for v in report["engines"].values()),
            "wall_s": round(time.perf_counter() - began, 2)}


def _disable_lmem_paths() -> None:
    from tpuflow.lowering.ops import lmem_move
    lmem_move.as_batched_transpose = lambda dims: None
    lmem_move.as_strided_rows = lambda dims, prec: None
    lmem_move.fits = lambda ctx, shapes, prec: False        # Expand, Pad and Resize paths check it


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--label", required=True, help="key the rows are stored under (before / after)")
    ap.add_argument("--chip", default="sg2260")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--baseline", action="store_true", help="LMEM movement paths off (the DDR -> DDR DMAs)")
    args = ap.parse_args()
    if args.baseline:
        _disable_lmem_paths()
    rows = []
    for name in args.cases.split(","):
        r = run_case(name, args.chip, args.dtype)
        rows.append(r)
        print(f"{name:42s} {r['latency_us']:10.2f} us  DRAM bound {r['dram_bound_us']:8.2f}  x{r['over_dram_bound']:<7}"
              f" {r['gb_per_s']:7.2f} GB/s  {r['instructions']:6d} instr", flush=True)
    data = json.loads(args.out.read_text()) if args.out.exists() else {}
    data[args.label] = {"chip": args.chip, "dtype": args.dtype, "baseline": args.baseline, "runs": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
