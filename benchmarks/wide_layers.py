"""Wide and long layers: convs and pools whose rows do not fit LMEM (W slicing) and 1-D conv chains
over long signals (run down H, fused and sliced like images), layer groups on and off side by side.

    python benchmarks/wide_layers.py [--chip sg2260] [--dtype fp16] [--verify]

The models are built here with onnx.helper (seeded weights). Writes
benchmarks/results/wide_layers_<dtype>.json and prints a table: latency, DRAM bytes moved, and
with --verify whether the program matches onnxruntime (race detector on).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

RESULTS = Path(__file__).parent / "results"


def _model(name: str, shape, layers) -> onnx.ModelProto:
    """`layers`: (op, attrs, weight shape or None, bias) applied in turn to input `x` of `shape`."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i, (op, attrs, wshape, bias) in enumerate(layers):
        inputs = [x]
        if wshape is not None:
            inits.append(numpy_helper.from_array((rng.standard_normal(wshape) * 0.1).astype(np.float32), f"w{i}"))
            inputs.append(f"w{i}")
        if bias:
            inits.append(numpy_helper.from_array(rng.standard_normal(wshape[0]).astype(np.float32), f"b{i}"))
            inputs.append(f"b{i}")
        nodes.append(helper.make_node(op, inputs, [f"t{i}"], **attrs))
        x = f"t{i}"
    nodes.append(helper.make_node("Identity", [x], ["y"]))
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


RELU = ("Relu", {}, None, False)


def models() -> dict[str, onnx.ModelProto]:
    conv2d = ("Conv", dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), (16, 16, 3, 3), True)
    conv1d = ("Conv", dict(kernel_shape=[3], pads=[1, 1]), (128, 128, 3), True)
    return {
        "wide_conv_8x40000": _model("wide_conv", [1, 16, 8, 40000], [conv2d, RELU]),
        "wide_conv_pool_4x30000": _model("wide_conv_pool", [1, 16, 4, 30000], [
            conv2d, RELU, ("MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2]), None, False)]),
        "wide_depthwise_3x70000": _model("wide_dw", [1, 128, 3, 70000], [
            ("Conv", dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=128), (128, 1, 3, 3), False), RELU]),
        "wide_avgpool_4x70000": _model("wide_avg", [1, 8, 4, 70000], [
            ("AveragePool", dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=0), None, False)]),
        "conv1d_chain_6x128ch_32000": _model("conv1d_chain", [1, 128, 32000], [conv1d, RELU] * 6),
        "conv1d_pool_300000": _model("conv1d_pool", [1, 32, 300000], [
            ("Conv", dict(kernel_shape=[5], pads=[2, 2]), (32, 32, 5), True), RELU,
            ("MaxPool", dict(kernel_shape=[3], strides=[2], pads=[1, 1]), None, False)]),
    }


def measure(model, chip: str, dtype: str, layer_group: str, check: bool) -> dict:
    from tpuflow.errors import TpuflowError
    from tpuflow.estimate import estimate_report
    from tpuflow.hwmodel.timing import simulate
    from tpuflow.options import CompileOptions
    from tpuflow.pipeline import compile_model, verify
    options = CompileOptions(dtype=dtype, layer_group=layer_group)
    try:
        _, program = compile_model(model, chip, options)
    except TpuflowError as err:
        return {"error": str(err)}
    report = estimate_report(program, simulate(program))
    dram = report["dram"]
    row = {"latency_us": report["latency_us"], "ddr_bytes": dram["bytes_read"] + dram["bytes_written"],
           "lower_bound_us": report["lower_bound_us"]}
    if check:
        row["verified"] = bool(verify(model, chip, options, race_check=True)["ok"])
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chip", default="sg2260")
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--verify", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    print(f"{'model':28s} {'lg':>3s} {'latency_us':>11s} {'DDR MB':>8s} {'bound_us':>9s} verified")
    for name, model in models().items():
        for lg in ("on", "off"):
            row = {"model": name, "layer_group": lg, **measure(model, args.chip, args.dtype, lg, args.verify)}
            rows.append(row)
            if "error" in row:
                print(f"{name:28s} {lg:>3s} error: {row['error']}")
                continue
            print(f"{name:28s} {lg:>3s} {row['latency_us']:11.1f} {row['ddr_bytes'] / 1e6:8.1f} "
                  f"{row['lower_bound_us']:9.1f} {row.get('verified', '')}")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"wide_layers_{args.dtype}.json"
    out.write_text(json.dumps({"chip": args.chip, "dtype": args.dtype, "rows": rows}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
