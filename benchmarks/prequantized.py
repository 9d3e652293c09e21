"""Pre-quantized versions of every bundled model (onnxruntime's quantize_static: QDQ and QOperator), verified
against onnxruntime and estimated at each float dtype.

    python benchmarks/prequantized.py [--models a,b] [--formats qdq,qdq_u8,qdq_uw,qoperator] [--dtypes fp32,fp16]
                                      [--samples 2] [--chip sg2260] [--out FILE]

Each model is quantized once per format, as a deployment flow hands it over (opset 13, BatchNormalization
folded by onnxruntime's pre-processing, Sum as Add; every op kind onnxruntime quantizes; calibrated on
--samples seeded random inputs):

- qdq:       QDQ, per-channel symmetric int8 weights, symmetric int8 activations;
- qdq_u8:    QDQ, per-channel int8 weights, onnxruntime's default asymmetric uint8 activations;
- qdq_uw:    QDQ, onnxruntime's defaults for uint8 weights: per-tensor asymmetric uint8 weights (zero points
             other than 128: Conv weights minus their zero points may leave int8, one more CONV per such Conv),
             uint8 activations;
- qoperator: QOperator (QLinearConv, QLinearMatMul, QGemm, QLinearAdd, ...), per-channel int8 weights,
             asymmetric int8 activations.

The quantized model is then compiled once per --dtype (the precision of what stays float), verified through
tpuflow.pipeline.verify_program (the policy of its docstring) and simulated. Writes
benchmarks/results/prequantized.json, one row per model x format x dtype: ok, ok_end_to_end (false when
an output passed only by verify's stage-wise rule 4; worst_stage_steps then says how close the stages
came; "ok-s" in the printed line), how far onnxruntime's own two executions of the model are from each
other (onnxruntime_executions_apart), the worst error in quantization steps, the lowest cosine, latency_us, instruction counts, the compute ops that stayed float
(a crash or refusal is a row with its one-line error). The rows of the cases run now replace the file's
rows of the same cases; the others are kept, so partial runs merge. Deterministic (seeded calibration and
verify inputs). Exit code 1 when any run fails.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

from tpuflow.models import names
from tpuflow.options import CompileOptions

RESULTS = Path(__file__).parent / "results" / "prequantized.json"
FORMATS = ("qdq", "qdq_u8", "qdq_uw", "qoperator")
CALIBRATION_SEED = 0
# Integer / quantized-operator kinds of a QOperator model: everything else that computes stayed float.
QUANTIZED_KINDS = ("QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "MatMulInteger",
                   "ConvInteger", "QLinearAdd", "QLinearMul", "QGemm", "QLinearGlobalAveragePool",
                   "QLinearAveragePool", "QLinearConcat", "QLinearLeakyRelu", "QLinearSigmoid", "QLinearSoftmax",
                   "DynamicQuantizeLinear")


def quantizer_settings(fmt: str) -> dict:
    """quantize_static's keyword arguments for a format."""
    from onnxruntime.quantization import QuantFormat, QuantType
    if fmt == "qdq":
        return dict(quant_format=QuantFormat.QDQ, per_channel=True, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8, extra_options={"ActivationSymmetric": True, "WeightSymmetric": True})
    if fmt == "qdq_u8":
        return dict(quant_format=QuantFormat.QDQ, per_channel=True, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8)
    if fmt == "qdq_uw":
        return dict(quant_format=QuantFormat.QDQ, per_channel=False, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QUInt8)
    if fmt == "qoperator":
        return dict(quant_format=QuantFormat.QOperator, per_channel=True, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8)
    raise SystemExit(f"unknown format {fmt!r} (one of {', '.join(FORMATS)})")


def prequantize(model: str, fmt: str, samples: int):
    """The bundled model `model` quantized by onnxruntime's quantize_static in format `fmt`."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process
    from tpuflow import quantize as q
    from tpuflow.pipeline import load_graph
    proto = q.model_proto(model)
    feeds = q._calibration_feeds(load_graph(model), samples, CALIBRATION_SEED)
    reader = type("Feeds", (CalibrationDataReader,), {"get_next": lambda self: next(self.it, None)})()
    reader.it = iter(feeds)
    logging.getLogger().setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="tpuflow-prequant-") as tmp:
        src, pre, dst = (Path(tmp) / f for f in ("float.onnx", "pre.onnx", "q.onnx"))
        onnx.save(q._sums_as_adds(q._initializers_not_inputs(q._at_least_qdq_opset(proto))), src)
        quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
        q._batchnorms_as_scale_shift(pre)
        quantize_static(str(pre), str(dst), reader, **quantizer_settings(fmt))
        out = onnx.load(str(dst))
    out.ir_version = max(out.ir_version, q.MIN_IR_VERSION)
    out.graph.name = f"{model}_{fmt}"
    return out


def float_ops(qmodel, fmt: str) -> list[str]:
    """The compute nodes of the quantized model that stayed float, as 'name (op)'."""
    from tpuflow.quantize import MOVES, float_ops_of
    if fmt.startswith("qdq"):
        return [f"{f['node']} ({f['op']})" for f in float_ops_of(qmodel)[1]]
    return [f"{n.name or n.output[0]} ({n.op_type})" for n in qmodel.graph.node
            if n.op_type not in QUANTIZED_KINDS and n.op_type not in MOVES]


def measure(qmodel, chip: str, dtype: str) -> dict:
    """Compile once at `dtype`, verify the program and simulate it."""
    from tpuflow.estimate import estimate_report
    from tpuflow.hwmodel.timing import simulate
    from tpuflow.pipeline import compile_model, verify_program
    graph, program = compile_model(qmodel, chip, CompileOptions(dtype=dtype))
    result = verify_program(graph, program)
    report = estimate_report(program, simulate(program))
    outputs = result["outputs"]
    steps = [o["steps"] for o in outputs if o.get("steps") is not None]
    stage = [o["stage_check"] for o in outputs if "stage_check" in o]
    apart = [o["executions_apart"] for o in outputs if "executions_apart" in o]
    return {"ok": result["ok"], "ok_end_to_end": all(o["ok"] and "stage_check" not in o for o in outputs),
            "worst_stage_steps": max((s["worst_stage"]["steps"] for s in stage), default=None),
            "onnxruntime_executions_apart": {"steps": max((a["steps"] for a in apart if "steps" in a), default=None),
                                             "min_cosine": min((a["cosine"] for a in apart), default=None)},
            "max_steps": max(steps) if steps else None,
            "min_cosine": min(o["cosine"] for o in outputs), "max_rel_err": max(o["max_rel_err"] for o in outputs),
            "references": sorted({o["reference"] for o in outputs if "reference" in o}),
            "latency_us": report["latency_us"], "instructions": program.counts(),
            "instructions_total": program.total_instruction_count}


def run_case(model: str, fmt: str, dtypes: list[str], chip: str, samples: int) -> list[dict]:
    """The rows of one model in one format, one per dtype."""
    began = time.perf_counter()
    try:
        qmodel = prequantize(model, fmt, samples)
    except Exception as exc:      # the quantizer's own failure: one row per dtype
        error = f"quantize_static: {type(exc).__name__}: {exc}"
        return [{"model": model, "format": fmt, "dtype": d, "ok": False, "error": error} for d in dtypes]
    floats = float_ops(qmodel, fmt)
    quantize_s = time.perf_counter() - began
    rows = []
    for dtype in dtypes:
        t0 = time.perf_counter()
        row = {"model": model, "format": fmt, "dtype": dtype}
        try:
            row.update(measure(qmodel, chip, dtype))
        except Exception as exc:  # a refusal or crash is this row's failure, the others still run
            row.update(ok=False, error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        row.update(float_ops=floats, quantize_s=round(quantize_s, 2), seconds=round(time.perf_counter() - t0, 2))
        rows.append(row)
    return rows


def _line(r: dict) -> str:
    verdict = "FAIL" if not r["ok"] else "ok  " if r.get("ok_end_to_end", True) else "ok-s"   # ok-s: by stages
    head = f"{r['model']:13s} {r['format']:9s} {r['dtype']:4s} {verdict}"
    if "latency_us" not in r:
        return f"{head} {r.get('error', '')[:110]}"
    steps = "-" if r["max_steps"] is None else f"{r['max_steps']:g}"
    return (f"{head} steps {steps:>5s} cos {r['min_cosine']:.5f} {r['latency_us']:10.1f} us "
            f"{r['instructions_total']:7d} instr  float ops {len(r['float_ops']):3d} {r['seconds']:6.1f}s")


def _key(r: dict) -> tuple:
    return r["model"], r["format"], r["dtype"]


def merged(out: Path, chip: str, samples: int, rows: list[dict]) -> list[dict]:
    """The file's rows (same chip and calibration) not covered by `rows`, then `rows`, in a fixed order."""
    old = json.loads(out.read_text()) if out.exists() else {}
    kept = old.get("runs", []) if (old.get("chip"), old.get("samples")) == (chip, samples) else []
    fresh = {_key(r) for r in rows}
    order = {m: i for i, m in enumerate(names())}
    every = [r for r in kept if _key(r) not in fresh] + rows
    return sorted(every, key=lambda r: (order.get(r["model"], len(order)), r["model"], FORMATS.index(r["format"]),
                                        r["dtype"]))


def write(out: Path, chip: str, samples: int, rows: list[dict]) -> None:
    """Write the merged rows (temp file, then rename)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"chip": chip, "samples": samples, "calibration_seed": CALIBRATION_SEED,
                               "runs": merged(out, chip, samples, rows)}, indent=1) + "\n")
    tmp.replace(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(names()))
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--dtypes", default="fp32,fp16")
    ap.add_argument("--samples", type=int, default=2, help="seeded random calibration inputs")
    ap.add_argument("--chip", default="sg2260")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    rows: list[dict] = []
    for model in args.models.split(","):
        for fmt in args.formats.split(","):
            quantizer_settings(fmt)
            for row in run_case(model, fmt, args.dtypes.split(","), args.chip, args.samples):
                rows.append(row)
                print(_line(row), flush=True)
            write(args.out, args.chip, args.samples, rows)
    return 1 if any(not r["ok"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
