"""`--dtype int8` on a float model: post-training quantization by onnxruntime's quantizer into a QDQ
model (per-channel symmetric int8 weights, per-tensor symmetric int8 activations calibrated on seeded random
inputs or the user's npz files), which the int8 lowering then compiles; the rest of the program runs
in fp16. Also owns the record of that step: the calibration used and which ops stayed float, and why.

Only the op kinds the int8 lowering computes are quantized (INT8_OPS), and of the elementwise ones only
those between quantized producers and quantized readers; everything else stays float between DequantizeLinear and QuantizeLinear. onnxruntime's pre-processing (shape inference and its
graph optimizer: BatchNormalization folded into Conv) runs first."""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tpuflow.errors import InputFileError, ModelError
from tpuflow.lowering.quant import BROADCASTING
from tpuflow.options import CALIBRATION_DEFAULT

INT8_OPS = ("Conv", "MatMul", "Gemm", "Add", "Mul", "Relu", "Clip", "MaxPool", "AveragePool", "GlobalAveragePool",
            "Concat")
FLOAT_REST = "fp16"          # the precision of what stays float in an --dtype int8 program
CALIBRATION_SAMPLES = CALIBRATION_DEFAULT   # seeded random calibration inputs (the default, 8)
CALIBRATION_SEED = 0         # seed of the random calibration inputs
QDQ_OPSET = 13               # per-channel QuantizeLinear / DequantizeLinear (axis) need opset 13
MIN_IR_VERSION = 7           # ONNX IR version of opset 13
QDQ_FILE_MODE = 0o644        # --emit-qdq file permissions (a temporary file is created 0600)
# Data movement and shape ops: a float one moves a float tensor and computes nothing, so the
# "stayed float" report leaves it out.
MOVES = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose", "Shape", "Constant", "Gather",
         "Slice", "Split", "Expand", "Cast", "Tile", "ConstantOfShape")
# ops that make a model a pre-quantized one (QDQ, QOperator, integer ops)
QUANTIZED_MODEL_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul",
                       "MatMulInteger", "ConvInteger", "QLinearAdd", "QLinearMul", "QGemm",
                       "QLinearGlobalAveragePool", "QLinearAveragePool", "QLinearConcat")
MAX_FLOAT_OP_LINES = 16      # text outputs list this many ops left float, then count the rest by kind
NO_INT8_FORM = "no int8 form"
PRODUCT_OF_ACTIVATIONS = "product of two activations"
FLOAT_INPUT = "reads a float op's output"
FLOAT_NEIGHBOURS = "its inputs or outputs stay float"
NOT_EMITTABLE = "the int8 lowering cannot emit it"
# Activations quantized symmetrically (zero point 0), as tpu-mlir deploys int8 by default (its final MLIR
# for our models says `asymmetric = false`: ../shared/peers/tpu-mlir/*/final.mlir, tpu-mlir 1.30.2): each
# requantisation is then one quant.rq0 (quant_ops.emit_requant). Measured on sg2260 against asymmetric:
# squeezenet 158.3 -> 148.0 us, small_cnn 8.1 -> 7.9, bert_layer 33.7 -> 33.0 (cosine to the float
# model 0.99991 -> 0.99995, 0.99993 -> 0.99986, 0.99990 -> 0.99986).
ACTIVATION_SYMMETRIC = True
REQUANTIZE_ROUNDS = 2        # quantize again without the nodes the int8 lowering refused, at most this often


@dataclass(frozen=True)
class Quantization:
    """The QDQ model tpuflow compiles for --dtype int8, and the record of how it was made."""
    model: object                 # onnx.ModelProto (QDQ)
    calibration: dict             # {"source": "random", "samples", "seed"} or {"source": "npz", "files", "samples", "sha256"}
    int8_ops: int                 # compute nodes of the QDQ model between DequantizeLinear and QuantizeLinear
    float_ops: tuple[dict, ...]   # {"node", "op", "reason"} for each compute node left float

    def record(self) -> dict:
        """What outputs record (manifest, estimate --json, verify --json, the reports)."""
        return {"calibration": self.calibration, "float_rest": FLOAT_REST, "int8_ops": self.int8_ops,
                "float_ops": [dict(f) for f in self.float_ops]}


def float_op_lines(record: dict) -> list[str]:
    """The text form of a quantization record: the calibration, then one line per op left float."""
    cal = record["calibration"]
    source = (f"{cal['samples']} seeded random inputs (seed {cal['seed']})" if cal["source"] == "random" else
              f"{cal['samples']} npz files ({', '.join(cal['files'])}; sha256 {cal['sha256'][:16]})")
    lines = [f"int8           post-training quantization calibrated on {source}: {record['int8_ops']} ops int8, "
             f"{len(record['float_ops'])} stayed float ({record['float_rest']})"]
    shown = record["float_ops"][:MAX_FLOAT_OP_LINES]
    lines += [f"  float        {f['op']} {f['node']}: {f['reason']}" for f in shown]
    if len(record["float_ops"]) > len(shown):
        kinds: dict[str, int] = {}
        for f in record["float_ops"][len(shown):]:
            kinds[f["op"]] = kinds.get(f["op"], 0) + 1
        lines.append(f"  float        ... {len(record['float_ops']) - len(shown)} more ("
                     + ", ".join(f"{op} {n}" for op, n in kinds.items()) + "; --json lists all)")
    return lines


def quantize(model, input_shapes=None, samples: int = CALIBRATION_SAMPLES, data_dir: str | os.PathLike = "",
             seed: int = CALIBRATION_SEED) -> Quantization:
    """Quantize a float model: calibrated on `data_dir`'s npz files when given, else on `samples`
    seeded random inputs; the QDQ model with its record."""
    from tpuflow.pipeline import load_graph
    proto = model_proto(model, input_shapes)
    _check_float_model(proto)
    graph = load_graph(model, input_shapes)
    if data_dir:
        files, feeds = calibration_files(graph, Path(data_dir))
        calibration = {"source": "npz", "files": [f.name for f in files], "samples": len(feeds),
                       "sha256": _feeds_digest(graph, feeds)}
    else:
        feeds = _calibration_feeds(graph, samples, seed)
        calibration = {"source": "random", "samples": samples, "seed": seed}
    shapes = {name: graph.tensor(name).shape for name in graph.inputs}
    qdq, excluded, refused = _quantize_emittable(proto, graph.name, feeds, shapes)
    int8_ops, float_ops = float_ops_of(qdq, excluded, refused)
    return Quantization(qdq, calibration, int8_ops, float_ops)


def _quantize_emittable(proto, label: str, feeds: list[dict], shapes: dict):
    """(QDQ model, products of activations kept float, {node kept float: why}): quantize_static, then
    again without the nodes the int8 lowering refuses in the result (a Concat along another axis than
    channels, say), until it refuses none (at most REQUANTIZE_ROUNDS more rounds)."""
    refused: dict[str, str] = {}
    for _ in range(REQUANTIZE_ROUNDS + 1):
        qdq, products, broadcasting = _quantize_static(proto, label, feeds, sorted(refused))
        refused.update((name, BROADCASTING) for name in broadcasting)
        new = {name: why for name, why in _refused_nodes(qdq, shapes).items() if name not in refused}
        if not new:
            break
        refused.update(new)
    return qdq, products, refused


def _refused_nodes(qdq, shapes: dict) -> dict[str, str]:
    """{name: why} of the quantized nodes of a QDQ model (its inputs of `shapes`) that the int8
    lowering cannot emit."""
    from tpuflow.frontend import load
    from tpuflow.lowering.quant import is_quantized, unsupported_reason
    graph = load(qdq, {k: v for k, v in shapes.items() if k in {i.name for i in qdq.graph.input}})
    return {node.name: why for node in graph.nodes()
            if is_quantized(graph, node) and (why := unsupported_reason(graph, node))}


def write_qdq(model, path: str | os.PathLike) -> Path:
    """Write the QDQ model to `path` atomically (a temporary file in its folder, then a rename)."""
    path = Path(path)
    data = model.SerializeToString()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise InputFileError(f"{path}: cannot write the QDQ model ({exc.strerror})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), QDQ_FILE_MODE)
            f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def model_proto(model, input_shapes=None):
    """The ONNX ModelProto of a bundled model name, a file path, a ModelProto or serialized bytes,
    with the inputs `input_shapes` pins (--input-value) as initializers (frontend.pinning)."""
    from tpuflow import models
    from tpuflow.frontend import pinning, reader
    if model is None or (isinstance(model, str) and models.is_bundled(model) and not Path(model).is_file()):
        proto, label = models.build_model(model or models.DEFAULT_MODEL), str(model)
    else:
        proto, label = reader.read_model(model)
    return pinning.pin_inputs(proto, label, pinning.split_inputs(input_shapes)[1])


def quantized_model(model, input_shapes=None, samples: int = CALIBRATION_SAMPLES, seed: int = CALIBRATION_SEED):
    """The QDQ ModelProto of a float model, calibrated on `samples` seeded random inputs shaped as
    the frontend fixes them (`input_shapes`)."""
    return quantize(model, input_shapes, samples, seed=seed).model


def _check_float_model(proto) -> None:
    """A model that is quantized already (QDQ / QOperator nodes) is refused with one line: its
    quantized tensors compile to int8 at any --dtype, which then sets the float rest."""
    from tpuflow.errors import OptionError
    node = next((n for n in proto.graph.node if n.op_type in QUANTIZED_MODEL_OPS), None)
    if node is not None:
        raise OptionError(f"option --dtype int8: {proto.graph.name or 'the model'} is quantized already (node "
                          f"'{node.name or node.output[0]}' is a {node.op_type}); its quantized tensors compile to "
                          "int8 at any --dtype: give --dtype fp16, bf16 or fp32 for the float rest")


def _quantize_static(proto, label: str, feeds: list[dict], refused=()):
    """(QDQ ModelProto, names of the nodes kept float as products of activations, names of the
    broadcasting elementwise nodes kept float) by onnxruntime's quantize_static on the float ModelProto
    `proto`, calibrated on `feeds`. Also kept float: the elementwise ops beside float ops
    (_elementwise_beside_float)."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process
    reader = type("CalibrationFeeds", (CalibrationDataReader,), {"get_next": lambda self: next(self.it, None)})()
    reader.it = iter(feeds)
    logging.getLogger().setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="tpuflow-ptq-") as tmp:
        src, pre, dst = (Path(tmp) / f for f in ("float.onnx", "pre.onnx", "int8.onnx"))
        onnx.save(_sums_as_adds(_initializers_not_inputs(_at_least_qdq_opset(proto))), src)
        excluded: list[str] = []
        try:
            quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
            _batchnorms_as_scale_shift(pre)
            _quantizable_forms(pre)
            products = _products_of_activations(pre)
            broadcasting = _broadcasting_elementwise(pre)
            kept_float = set(products) | set(refused) | set(broadcasting)
            beside = _elementwise_beside_float(pre, kept_float)
            excluded = list(dict.fromkeys([*products, *beside, *broadcasting, *refused]))
            quantize_static(str(pre), str(dst), reader, quant_format=QuantFormat.QDQ, per_channel=True,
                            activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                            op_types_to_quantize=list(INT8_OPS), nodes_to_exclude=excluded,
                            extra_options={"ActivationSymmetric": ACTIVATION_SYMMETRIC})
        except Exception as err:        # the quantizer's own failures, one line (exit 2)
            raise ModelError(f"{label}: onnxruntime's post-training quantizer failed on this model "
                             f"({type(err).__name__}: {err}); quantize it yourself and pass the QDQ model") from None
        quantized = onnx.load(str(dst))
    # an old model (IR < 4) requires initializers to be graph inputs; the quantizer adds some and
    # raises the opset (QuantizeLinear): the IR version of that opset
    quantized.ir_version = max(quantized.ir_version, MIN_IR_VERSION)
    return quantized, products, broadcasting


def _broadcasting_elementwise(path: Path) -> list[str]:
    """Names of the elementwise nodes (ELEMENTWISE_INT8) of the shape-inferred model at `path` that
    broadcast one runtime input against another (an SE block's x + pooled(x)): the int8 lowering has
    no such op (lowering.quant.BROADCASTING), and between quantized neighbours the frontend would
    not absorb it anyway (frontend.imp_quant), so they stay float."""
    import onnx
    model = onnx.load(str(path))
    constants = {i.name for i in model.graph.initializer}
    shapes = {v.name: tuple(d.dim_value if d.HasField("dim_value") else -1 for d in v.type.tensor_type.shape.dim)
              for v in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output)}
    out = []
    for n in model.graph.node:
        runtime = [t for t in n.input if t and t not in constants]
        if n.op_type in ELEMENTWISE_INT8 and len(runtime) > 1 and n.output[0] in shapes and \
                any(shapes.get(t) != shapes[n.output[0]] for t in runtime):
            out.append(n.name)
    return out


ELEMENTWISE_INT8 = ("Add", "Mul", "Relu", "Clip")


def _elementwise_beside_float(path: Path, kept_float: set) -> list[str]:
    """Names of the elementwise nodes (ELEMENTWISE_INT8) beside float ops: one that reads a float op's
    result (an op the int8 lowering does not compute, one of `kept_float`, or an elementwise node
    already kept float; through moves), or whose every reader is an op of the first two kinds (or a
    graph output only). In int8 each would cost a QuantizeLinear and a DequantizeLinear between float
    neighbours, round trips an fp16 elementwise op does not make (a norm's gain, an activation's
    pieces, a residual Add before a layer norm). Repeated until no node changes side; elementwise ops
    between quantized producers and quantized readers stay int8. The reader rule does not run
    backwards through elementwise ops it made float: a tanh-GELU written as elementwise pieces keeps
    its pieces before the Tanh int8 but the last (all in fp16, magika's output left verify's bound by
    2.6%: fp16 against onnxruntime's fp32 through the GELU and a layer norm of primitives)."""
    import onnx
    model = onnx.load(str(path))
    producers = {t: n for n in model.graph.node for t in n.output}
    readers: dict[str, list] = {}
    for n in model.graph.node:
        for t in n.input:
            readers.setdefault(t, []).append(n)
    floating = set(kept_float)

    def is_float(node) -> bool:
        return node.op_type not in INT8_OPS or node.name in floating

    def source(tensor: str):
        node = producers.get(tensor)
        while node is not None and node.op_type in MOVES and node.input:
            node = producers.get(node.input[0])
        return node

    def compute_readers(tensor: str) -> list:
        out = []
        for r in readers.get(tensor, ()):
            out.extend(compute_readers(r.output[0]) if r.op_type in MOVES and r.output else [r])
        return out

    changed = True
    while changed:
        changed = False
        for n in model.graph.node:
            if n.op_type not in ELEMENTWISE_INT8 or n.name in floating:
                continue
            sources = [source(t) for t in n.input if t]
            after = [r for t in n.output for r in compute_readers(t)]
            if any(s is not None and is_float(s) for s in sources) or \
                    all(r.op_type not in INT8_OPS or r.name in kept_float for r in after):
                floating.add(n.name)
                changed = True
    return [n.name for n in model.graph.node if n.name in floating and n.op_type in ELEMENTWISE_INT8]


def float_ops_of(qdq, products_of_activations=(), refused=None) -> tuple[int, tuple[dict, ...]]:
    """(int8 compute nodes, the compute nodes left float with the reason) of a QDQ model. A node is
    int8 when it is of a kind the int8 lowering computes (INT8_OPS: the frontend absorbs those into
    quantized ops), every runtime input is a DequantizeLinear output and every output feeds only
    QuantizeLinear; any other kind between DequantizeLinear and QuantizeLinear (a Tanh between two
    quantized Adds) still computes in float. Data movement (MOVES) is not counted."""
    graph = qdq.graph
    dequantized = {n.output[0] for n in graph.node if n.op_type == "DequantizeLinear"}
    constants = {i.name for i in graph.initializer}
    consumers: dict[str, set[str]] = {}
    for n in graph.node:
        for t in n.input:
            consumers.setdefault(t, set()).add(n.op_type)
    outputs = {o.name for o in graph.output}
    producers = {t: n for n in graph.node for t in n.output}
    int8_ops, float_ops = 0, []
    for n in graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear") or n.op_type in MOVES:
            continue
        inputs_int8 = all(t in dequantized for t in n.input if t and t not in constants)
        outputs_int8 = all(t not in outputs and consumers.get(t, set()) <= {"QuantizeLinear"} and t in consumers
                           for t in n.output)
        if inputs_int8 and outputs_int8 and n.op_type in INT8_OPS and not (refused and n.name in refused):
            int8_ops += 1
            continue
        reason = (PRODUCT_OF_ACTIVATIONS if n.name in products_of_activations else
                  f"{NOT_EMITTABLE} ({refused[n.name]})" if refused and n.name in refused else
                  NO_INT8_FORM if n.op_type not in INT8_OPS else _float_neighbour(n, producers, dequantized, constants))
        float_ops.append({"node": n.name or n.output[0], "op": n.op_type, "reason": reason})
    return int8_ops, tuple(float_ops)


def _at_least_qdq_opset(model):
    """The model converted to opset 13 when older (per-channel DequantizeLinear needs its axis)."""
    from onnx import version_converter
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    return version_converter.convert_version(model, QDQ_OPSET) if opset < QDQ_OPSET else model


def _float_neighbour(node, producers: dict, dequantized: set, constants: set) -> str:
    """Why an op of a kind the int8 lowering computes stayed float: the float op it reads from (the
    quantizer quantizes an op only when its inputs are quantized), else its float output."""
    for t in node.input:
        producer = producers.get(t)
        if t and t not in constants and t not in dequantized and producer is not None:
            return f"{FLOAT_INPUT} ({producer.op_type} {producer.name or producer.output[0]})"
    return FLOAT_NEIGHBOURS


def _quantizable_forms(path: Path) -> None:
    """Rewrite (in the file) ops into forms the quantizer and the int8 lowering take (every node
    named first: _name_nodes): a Div by a constant as a Mul by its reciprocal (a hard-swish's
    x * relu6(x + 3) / 6 between int8 convolutions in MobileNetV3-like models then stays in int8
    instead of round-tripping DDR as a float op), and a Gemm's or MatMul's bias of shape (1, ..., 1, N)
    as (N,) (the same broadcast on a rank-2-or-more result; onnxruntime's quantizer fails on the 2-D
    form: 'truth value of an array ... is ambiguous', onnxruntime 1.32, tf2onnx dense layers)."""
    import onnx
    from onnx import helper, numpy_helper
    model = onnx.load(str(path))
    inits = {i.name: i for i in model.graph.initializer}
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in list(model.graph.value_info) + list(model.graph.input)}
    producers = {t: n for n in model.graph.node for t in n.output}
    nodes, added = [], []
    named = _name_nodes(model)
    for n in model.graph.node:
        name = n.name
        row = _bias_row(n, inits, ranks, producers)
        if row is not None:
            index, values = row
            added.append(numpy_helper.from_array(values, f"{name}/bias_row"))
            n.input[index] = f"{name}/bias_row"
        if n.op_type == "Div" and n.input[1] in inits:
            divisor = numpy_helper.to_array(inits[n.input[1]])
            if divisor.dtype.kind == "f" and np.all(divisor != 0):
                added.append(numpy_helper.from_array((1 / divisor).astype(divisor.dtype), f"{name}/reciprocal"))
                nodes.append(helper.make_node("Mul", [n.input[0], f"{name}/reciprocal"], list(n.output), name=name))
                continue
        nodes.append(n)
    if not added and not named:
        return
    _save_rewritten(model, nodes, added, path)


def _save_rewritten(model, nodes: list, added: list, path: Path) -> None:
    """Write `model` to `path` with `nodes` as its graph and `added` among its initializers (those no
    node reads any more dropped)."""
    import onnx
    used = {t for n in nodes for t in n.input} | {o.name for o in model.graph.output}
    kept = [i for i in model.graph.initializer if i.name in used]
    del model.graph.node[:], model.graph.initializer[:]
    model.graph.node.extend(nodes)
    model.graph.initializer.extend(kept + added)
    onnx.save(model, str(path))


def _bias_row(node, inits: dict, ranks: dict, producers: dict):
    """(input index, the values as (N,)) of a Gemm's constant C of shape (1, N), or of an Add's constant
    (1, ..., 1, N) operand added to a MatMul's result of at least its rank; None otherwise."""
    from onnx import numpy_helper
    if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2] in inits:
        values = numpy_helper.to_array(inits[node.input[2]])
        return (2, values.reshape(-1)) if values.ndim == 2 and values.shape[0] == 1 else None
    if node.op_type != "Add" or len(node.input) != 2:
        return None
    for index in (0, 1):
        const, other = node.input[index], node.input[1 - index]
        producer = producers.get(other)
        if const in inits and producer is not None and producer.op_type == "MatMul":
            values = numpy_helper.to_array(inits[const])
            if values.ndim >= 2 and all(d == 1 for d in values.shape[:-1]) and ranks.get(other, 0) >= values.ndim:
                return index, values.reshape(-1)
    return None


def _name_nodes(model) -> int:
    """Name every unnamed node after its first output (unique in a valid model), so that the quantizer's
    exclusions and the int8 lowering's refusals name the same nodes; how many were named."""
    taken = {n.name for n in model.graph.node if n.name}
    count = 0
    for n in model.graph.node:
        if not n.name and n.output and n.output[0] not in taken:
            n.name = n.output[0]
            taken.add(n.name)
            count += 1
    return count


def _batchnorms_as_scale_shift(path: Path) -> None:
    """Rewrite (in the file) each inference BatchNormalization the pre-processing left (one not
    after a Conv: DenseNet's pre-activation BN) as Mul by its per-channel scale and Add of its
    shift, which the quantizer quantizes and the int8 lowering computes; a BatchNormalization has no
    int8 form of its own."""
    import onnx
    from onnx import helper, numpy_helper
    model = onnx.load(str(path))
    inits = {i.name: i for i in model.graph.initializer}
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in list(model.graph.value_info) + list(model.graph.input)}
    nodes, added = [], []
    for n in model.graph.node:
        params = n.input[1:5]
        if n.op_type != "BatchNormalization" or len(n.output) != 1 or not all(t in inits for t in params) \
                or ranks.get(n.input[0], 0) < 2:
            nodes.append(n)
            continue
        gamma, beta, mean, var = (numpy_helper.to_array(inits[t]).astype(np.float64) for t in params)
        eps = next((a.f for a in n.attribute if a.name == "epsilon"), 1e-5)
        scale = gamma / np.sqrt(var + eps)
        shape = (-1,) + (1,) * (ranks[n.input[0]] - 2)
        name = n.name or n.output[0]
        added += [numpy_helper.from_array(scale.reshape(shape).astype(np.float32), f"{name}/bn_scale"),
                  numpy_helper.from_array((beta - mean * scale).reshape(shape).astype(np.float32), f"{name}/bn_shift")]
        nodes += [helper.make_node("Mul", [n.input[0], f"{name}/bn_scale"], [f"{name}/scaled"], name=f"{name}/scale"),
                  helper.make_node("Add", [f"{name}/scaled", f"{name}/bn_shift"], list(n.output), name=f"{name}/shift")]
    if not added:
        return
    _save_rewritten(model, nodes, added, path)


def _initializers_not_inputs(model):
    """The model without its initializers among the graph inputs, at an IR version that allows it
    (old models, IR < 4, list every weight as an input: onnxruntime's calibration session then
    requires a feed for each)."""
    constants = {i.name for i in model.graph.initializer}
    if not any(i.name in constants for i in model.graph.input):
        return model
    import onnx
    out = onnx.ModelProto()
    out.CopyFrom(model)
    runtime = [i for i in model.graph.input if i.name not in constants]
    del out.graph.input[:]
    out.graph.input.extend(runtime)
    out.ir_version = max(out.ir_version, MIN_IR_VERSION)
    return out


def _sums_as_adds(model):
    """Each Sum as a chain of Adds (the quantizer quantizes Add, not Sum: a float Sum would cut
    the int8 layers around every residual join)."""
    import onnx
    from onnx import helper
    if not any(n.op_type == "Sum" for n in model.graph.node):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = []
    for n in model.graph.node:
        if n.op_type != "Sum" or len(n.input) < 2:
            nodes.append(n)
            continue
        acc = n.input[0]
        for k, term in enumerate(n.input[1:], 1):
            target = n.output[0] if k == len(n.input) - 1 else f"{n.output[0]}/sum{k}"
            nodes.append(helper.make_node("Add", [acc, term], [target], name=f"{n.name or n.output[0]}/add{k}"))
            acc = target
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def _products_of_activations(path: Path) -> list[str]:
    """MatMul / Gemm nodes multiplying two runtime tensors (attention's Q.K^T and P.V): they stay
    float. The int8 lowering computes them since 960b525, but quantized they were no faster
    (measured with `estimate --dtype int8`: bert_layer 119.2 against 119.4 us float, gpt_block 172.0
    against 131.5 us) and no closer to onnxruntime (both miss verify's bound on their float tails)."""
    import onnx
    model = onnx.load(str(path))
    constants = {i.name for i in model.graph.initializer}
    constants |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    return [n.name for n in model.graph.node
            if n.op_type in ("MatMul", "Gemm") and not {n.input[0], n.input[1]} & constants]


def _calibration_feeds(graph, samples: int, seed: int) -> list[dict]:
    """`samples` feeds of standard-normal floats (integer inputs: zeros) for the graph's inputs."""
    rng = np.random.default_rng(seed)
    feeds = []
    for _ in range(samples):
        feed = {}
        for name in graph.inputs:
            info = graph.tensor(name)
            dtype = np.dtype(info.dtype)
            feed[name] = (rng.standard_normal(info.shape).astype(dtype) if dtype.kind == "f"
                          else np.zeros(info.shape, dtype))
        feeds.append(feed)
    return feeds


def calibration_files(graph, folder: Path) -> tuple[list[Path], list[dict]]:
    """(the .npz files of `folder` in name order, one feed per file): each file holds one array per
    runtime input of the model, keyed by the input's name and shaped as the input. Anything else is
    one InputFileError naming the file and the key."""
    if not folder.is_dir():
        raise InputFileError(f"{folder}: --calibration-data expects a folder of .npz files, "
                             f"{'not a file' if folder.exists() else 'no such folder'}")
    files = sorted(folder.glob("*.npz"))
    if not files:
        raise InputFileError(f"{folder}: no .npz files (--calibration-data: one .npz per sample, "
                             f"keyed by the model's inputs {', '.join(graph.inputs)})")
    return files, [_npz_feed(graph, path) for path in files]


def _npz_feed(graph, path: Path) -> dict:
    """One calibration feed from one .npz file, checked against the graph's inputs."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
    except Exception as exc:          # zip, header and pickle errors alike: the file is unreadable
        raise InputFileError(f"{path}: not a readable .npz file ({type(exc).__name__}: {exc})") from None
    names = list(graph.inputs)
    for key in arrays:
        if key not in names:
            raise InputFileError(f"{path}: key '{key}' is not an input of the model (its inputs: {', '.join(names)})")
    feed = {}
    for name in names:
        info = graph.tensor(name)
        if name not in arrays:
            raise InputFileError(f"{path}: no key '{name}' (the model's input {name} {list(info.shape)} {info.dtype})")
        feed[name] = _checked_array(path, name, arrays[name], info)
    return feed


def _checked_array(path: Path, name: str, array: np.ndarray, info) -> np.ndarray:
    """`array` as input `info` takes it: its shape, a numeric kind that casts, finite floats."""
    dtype = np.dtype(info.dtype)
    if tuple(array.shape) != tuple(info.shape):
        raise InputFileError(f"{path}: key '{name}' has shape {list(array.shape)}, the model's input "
                             f"has {list(info.shape)}")
    allowed = "fiub" if dtype.kind == "f" else "iub"
    if array.dtype.kind not in allowed:
        raise InputFileError(f"{path}: key '{name}' holds {array.dtype}, the model's input is {dtype}")
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise InputFileError(f"{path}: key '{name}' holds NaN or infinite values")
    return array.astype(dtype)


def _feeds_digest(graph, feeds: list[dict]) -> str:
    """sha256 over the calibration feeds in order (input names, shapes, dtypes and bytes)."""
    h = hashlib.sha256()
    for feed in feeds:
        for name in graph.inputs:
            a = np.ascontiguousarray(feed[name])
            h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
            h.update(a.tobytes())
    return h.hexdigest()
