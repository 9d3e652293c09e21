"""Numerical comparison of the chip's outputs with onnxruntime: seeded inputs, the reference run,
error metrics and the tolerances per dtype."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Pass bounds, per storage dtype. max_rel_err = max |ours - ref| / max |ref| over an output.
# fp32: the 1e-4. fp16 / bf16 store every tensor between fused groups in 11 / 8 mantissa
# bits and the error grows with depth: measured worst cases over every bundled model on both
# matmul paths (benchmarks/verify_all.py) are 8e-3 (fp16) and 4e-2 (bf16), so the bounds are
# 2e-2 and 8e-2 (about 40 and 20 half-ulps of the storage format), and the direction of the
# output must agree too (cosine similarity, the metric tpu-mlir's npz comparison uses for
# low-precision models; measured worst 0.99998 and 0.9993).
# Every dtype also passes an output whose max_abs_err is at most REFERENCE_ATOL: onnxruntime's own
# Sigmoid and Tanh (MLAS) are accurate to about 1e-7 absolute, not relative, in their tails
# (measured: Sigmoid(-16) = 5.96e-8 against the exact 1.125e-7, 47% off), so an output that is
# tiny everywhere (a saturated sigmoid map on random inputs) is only as exact as that reference;
# 2.4e-7 is two ulps of 1.0 in fp32.
REFERENCE_ATOL = 2.4e-7
TOLERANCES = {
    "fp32": {"rtol": 1e-4, "min_cosine": 0.999999},
    "fp16": {"rtol": 2e-2, "min_cosine": 0.9999},
    "bf16": {"rtol": 8e-2, "min_cosine": 0.999},
}


@dataclass(frozen=True)
class OutputError:
    name: str
    max_abs_err: float
    max_rel_err: float
    cosine: float
    ref_max_abs: float

    def ok(self, dtype: str) -> bool:
        tol = TOLERANCES[dtype]
        if self.max_abs_err <= REFERENCE_ATOL:
            return True
        return self.max_rel_err <= tol["rtol"] and self.cosine >= tol["min_cosine"]

    def as_dict(self) -> dict:
        return {"name": self.name, "max_abs_err": self.max_abs_err, "max_rel_err": self.max_rel_err,
                "cosine": self.cosine, "ref_max_abs": self.ref_max_abs}


def random_inputs(graph, seed: int) -> dict[str, np.ndarray]:
    """Seeded arrays for every runtime input in its own dtype: floats standard-normal (the same
    values as before for fp32 inputs), integers in a range valid for their consumers (indices),
    booleans fair coins (tpuflow.frontend.inputs)."""
    from tpuflow.frontend.inputs import random_inputs as typed_random_inputs
    return typed_random_inputs(graph, seed)


def reference_outputs(graph, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """onnxruntime on the original (un-canonicalised) model."""
    return run_onnxruntime(graph.model, inputs)


def as_float32(array: np.ndarray) -> np.ndarray:
    """Chip outputs as fp32 (bf16 arrives as uint16 bit patterns)."""
    a = np.asarray(array)
    if a.dtype == np.uint16:
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def compare(name: str, ours: np.ndarray, ref: np.ndarray) -> OutputError:
    o = as_float32(ours).astype(np.float64).reshape(-1)
    r = np.asarray(ref, np.float64).reshape(-1)
    abs_err = float(np.max(np.abs(o - r))) if r.size else 0.0
    scale = float(np.max(np.abs(r))) if r.size else 0.0
    rel = abs_err / scale if scale > 0 else abs_err
    denom = np.linalg.norm(o) * np.linalg.norm(r)
    cosine = float(np.dot(o, r) / denom) if denom > 0 else (1.0 if abs_err == 0 else 0.0)
    if not np.all(np.isfinite(o)):
        rel, cosine = float("inf"), 0.0
    return OutputError(name, abs_err, rel, cosine, scale)


# ------------------------------------------------------------------ quantized graphs (issue 15)
# The reference of a quantized graph (verify's bound policy, tpuflow.pipeline.verify_program):
# onnxruntime runs the model with graph optimizations disabled, i.e. as written (DequantizeLinear ->
# float op -> QuantizeLinear, not its fused integer kernels with their own requantization rounding),
# with every float tensor the program stores at its float type rounded to that type.

ROUNDING_CASTS = {"fp16": 10, "bf16": 16}       # onnx TensorProto.FLOAT16 / BFLOAT16


def stored_float_tensors(graph) -> list[str]:
    """The float tensors a program of `graph` computes and stores at its float type, named as in
    the ONNX model: the canonical graph's float runtime tensors (no Quant, not constants, not graph
    inputs: those are rounded when fed) that an ONNX node produces. Not among them: whatever the
    frontend absorbed into an integer op (DequantizeLinear -> Conv -> QuantizeLinear has no float
    tensor in the program; rounding the Conv's float result would move the requantization's ties),
    and DequantizeLinear of a weight (folded into the integer constant)."""
    produced = {o for node in graph.model.graph.node for o in node.output}
    return [t.name for t in graph.tensors.values()
            if t.quant is None and not t.is_const and t.dtype == "float32" and t.name not in graph.inputs
            and t.name in produced]


def integer_readers(graph) -> set[int]:
    """Indices of the ONNX nodes (of graph.model) the program runs as integer ops: every output is
    read only by QuantizeLinear nodes and is no tensor of the canonical graph (DequantizeLinear ->
    Add -> QuantizeLinear becomes one integer op reading the int8 codes, exactly)."""
    model = graph.model
    readers: dict[str, list[str]] = {}
    for node in model.graph.node:
        for t in node.input:
            readers.setdefault(t, []).append(node.op_type)
    outputs = {o.name for o in model.graph.output}
    return {i for i, node in enumerate(model.graph.node)
            if node.op_type != "QuantizeLinear" and node.output
            and all(o not in graph.tensors and o not in outputs and readers.get(o)
                    and all(op == "QuantizeLinear" for op in readers[o]) for o in node.output)}


def rounded_model(model, names, dtype: str, exact_readers=frozenset()):
    """A copy of ONNX `model` in which each tensor of `names` passes through Cast(to dtype) ->
    Cast(to float): its producer writes '<name>/fp32' and every consumer (and the graph output)
    reads the value rounded to `dtype` (round to nearest even, onnxruntime's Cast), but the nodes
    whose indices are in `exact_readers` (integer_readers: they read the codes in the program),
    which read '<name>/fp32'."""
    import onnx
    from onnx import helper
    if dtype not in ROUNDING_CASTS or not names:
        return model
    model, wanted = _copy(model), set(names)
    for i, node in enumerate(model.graph.node):
        if i in exact_readers:
            node.input[:] = [f"{t}/fp32" if t in wanted else t for t in node.input]
    nodes = []
    for node in model.graph.node:
        nodes.append(node)
        for i, out in enumerate(node.output):
            if out in wanted:
                node.output[i] = f"{out}/fp32"
                nodes.append(helper.make_node("Cast", [f"{out}/fp32"], [f"{out}/{dtype}"], f"{out}/round_{dtype}",
                                              to=ROUNDING_CASTS[dtype]))
                nodes.append(helper.make_node("Cast", [f"{out}/{dtype}"], [out], f"{out}/back_fp32",
                                              to=onnx.TensorProto.FLOAT))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def fed_model(model, feeds: dict[str, np.ndarray], outputs: list[str]):
    """A copy of ONNX `model` whose tensors named in `feeds` are graph inputs (their producers'
    results are dropped) and whose graph outputs are `outputs`: runs the part of the model
    after those tensors on given values."""
    from onnx import helper
    model = _copy(model)
    for node in model.graph.node:
        for i, out in enumerate(node.output):
            if out in feeds:
                node.output[i] = f"{out}/replaced"
    for name, value in feeds.items():
        model.graph.input.append(helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(np.asarray(value).dtype), list(np.shape(value))))
    _set_outputs(model, outputs)
    return model


def with_outputs(model, outputs: list[str]):
    """A copy of ONNX `model` whose graph outputs are `outputs` (any tensor of the model)."""
    model = _copy(model)
    _set_outputs(model, outputs)
    return model


def _set_outputs(model, outputs: list[str]) -> None:
    from onnx import ValueInfoProto
    del model.graph.output[:]
    model.graph.output.extend(ValueInfoProto(name=name) for name in outputs)


def _copy(model):
    import onnx
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def signed_activations(model):
    """(model', shifted): a copy of QDQ `model` whose uint8 activations are int8 with zero points
    128 lower (QuantizeLinear gives q - 128, DequantizeLinear reads (q - 128) - (z - 128): the same
    values), and the names of the QuantizeLinear outputs so shifted (add 128 to read them as
    uint8). onnxruntime's fused uint8 x int8 kernels add pairs of products in int16 with saturation
    on x86 CPUs without VNNI; int8 x int8 ones do not (|product pair| <= 2 * 128 * 127), so the
    optimized execution of the copy is exact on every machine. `model` itself and an empty set when
    there is nothing to shift or the rewrite does not apply: uint8 weights (uint8 x uint8 kernels
    are exact), uint8 graph inputs, a uint8 activation read by anything but DequantizeLinear
    (QOperator nodes), zero points not initializers."""
    import onnx
    from onnx import numpy_helper
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    u8 = {name for name, t in inits.items() if t.data_type == onnx.TensorProto.UINT8}
    qdq = ("QuantizeLinear", "DequantizeLinear")
    shifted = {n.output[0] for n in graph.node if n.op_type == "QuantizeLinear" and len(n.input) > 2
               and n.input[2] in u8}
    readers = [n for n in graph.node if set(n.input) & shifted]
    only_dequantized = all(n.op_type == "DequantizeLinear" and n.input[0] in shifted and n.input[2] in u8
                           for n in readers)
    uint8_weights = any(n.op_type == "DequantizeLinear" and n.input[0] in u8 for n in graph.node)
    uint8_inputs = any(i.type.tensor_type.elem_type == onnx.TensorProto.UINT8 for i in graph.input)
    if not shifted or not only_dequantized or uint8_weights or uint8_inputs:
        return model, set()
    model = _copy(model)
    zero_points = {n.input[2] for n in model.graph.node if n.op_type in qdq and len(n.input) > 2 and
                   (n.output[0] in shifted or n.input[0] in shifted)}
    for name in sorted(zero_points):
        value = numpy_helper.to_array(inits[name]).astype(np.int16) - 128
        model.graph.initializer.append(numpy_helper.from_array(value.astype(np.int8), f"{name}/int8"))
    for node in model.graph.node:
        if node.op_type in qdq and len(node.input) > 2 and node.input[2] in zero_points:
            node.input[2] = f"{node.input[2]}/int8"
    for info in list(model.graph.value_info) + list(model.graph.output):
        if info.name in shifted:
            info.type.tensor_type.elem_type = onnx.TensorProto.INT8
    return model, shifted


def unshifted(outputs: dict[str, np.ndarray], shifted: set) -> dict[str, np.ndarray]:
    """onnxruntime's outputs of signed_activations' copy with the shifted tensors read as uint8 again."""
    return {k: (v.astype(np.int16) + 128).astype(np.uint8) if k in shifted else v for k, v in outputs.items()}


def run_onnxruntime(model, feeds: dict[str, np.ndarray], optimize: bool = True) -> dict[str, np.ndarray]:
    """onnxruntime (CPU, 2 threads) on ONNX `model`: every graph output by name. optimize=False
    disables graph optimizations (the model executes node by node as written)."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.log_severity_level = 3
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    wanted = {i.name for i in sess.get_inputs()}
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, {k: v for k, v in feeds.items() if k in wanted})))


def codes(values: np.ndarray, quant, axis_ok: bool = True) -> np.ndarray | None:
    """The integer codes of dequantized `values`: round(y / scale) + zero point (int64), per
    channel along quant.axis; None for a per-channel Quant whose axis does not apply to `values`
    (axis_ok False: moves after the DequantizeLinear). Exact for an output stored at fp16 while
    |code - zero point| < 1024 and scale > 2^-24: fp16 rounds y by at most max(|y| 2^-11, 2^-25),
    under half a step."""
    y = as_float32(values).astype(np.float64)
    scale = np.asarray(quant.scale, np.float64)
    zero = np.asarray(quant.zero_point, np.int64)
    if quant.axis is not None:
        if not axis_ok or y.ndim <= quant.axis or y.shape[quant.axis] != scale.size:
            return None
        shape = [1] * y.ndim
        shape[quant.axis] = scale.size
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    return np.rint(y / scale).astype(np.int64) + zero


def code_steps(ours: np.ndarray, ref: np.ndarray) -> int:
    """max |our code - reference code| over an output (0 for an empty one)."""
    return int(np.max(np.abs(ours - ref))) if np.size(ref) else 0
