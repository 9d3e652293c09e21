"""Pre-quantized models compile through the int8 lowering and verify against onnxruntime running the same
model (issue 15): the small CNN of tests/frontend/quant_models.py (conv + relu + maxpool + conv + residual
add + global average pool + gemm) quantized in the test by onnxruntime's quantize_static (QDQ and QOperator,
per-channel and per-tensor weights, int8 and uint8 activations, seeded random calibration), and the
hand-written QDQ models of the frontend tests; an unsupported quantized op is one line naming the node."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "frontend"))

from quant_models import quantized  # noqa: E402
from test_quant_handwritten import opset13_conv_chain, opset21_matmul  # noqa: E402
from tpuflow import cli  # noqa: E402
from tpuflow.frontend.quant import dequantize  # noqa: E402
from tpuflow.options import CompileOptions  # noqa: E402
from tpuflow.pipeline import QUANT_MIN_COSINE, QUANT_STEPS_ALLOWED, compile_model, verify  # noqa: E402

CNN_CASES = list(itertools.product(("QDQ", "QOperator"), (True, False), ("QInt8", "QUInt8")))
CNN_IDS = [f"{f}-{'channel' if c else 'tensor'}-{a}" for f, c, a in CNN_CASES]


@pytest.mark.parametrize("case", CNN_CASES, ids=CNN_IDS)
def test_quantized_cnn_verifies_within_two_output_steps(case):
    result = verify(quantized("cnn", *case), "sg2260", CompileOptions(dtype="fp16"))
    (out,) = result["outputs"]
    assert result["ok"], out
    assert out["quant_step"] > 0 and out["max_abs_err"] <= QUANT_STEPS_ALLOWED * out["quant_step"]
    assert out["cosine"] >= QUANT_MIN_COSINE
    assert result["instructions"]["tiu"] > 0


@pytest.mark.parametrize("case", CNN_CASES[:4:3], ids=CNN_IDS[:4:3])
def test_fp32_program_gives_onnxruntimes_integers(case):
    """With fp32 float tensors the only float rounding left is the final dequantisation: the chip's
    int8 output equals onnxruntime's (its requantisation is the same fp32 multiply and nearest-even round)."""
    result = verify(quantized("cnn", *case), "sg2260", CompileOptions(dtype="fp32"))
    assert result["ok"] and result["outputs"][0]["max_abs_err"] == 0.0, result["outputs"]


@pytest.mark.parametrize("build", [opset13_conv_chain, opset21_matmul])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_handwritten_qdq_models_verify(build, dtype):
    """Conv with float bias -> Relu (fused) -> Clip (standalone, requantised) -> MaxPool; uint8 MatMul with
    per-column weights and its int32 bias."""
    result = verify(build(), "sg2260", CompileOptions(dtype=dtype))
    assert result["ok"], result["outputs"]


def test_quantized_tensors_are_one_byte_in_ddr_and_float_ones_keep_dtype():
    graph, program = compile_model(quantized("cnn", "QDQ", True, "QUInt8"), "sg2260", CompileOptions(dtype="fp16"))
    tensors = program.memory.tensors
    assert tensors["x"].dtype == "fp16" and tensors["y"].dtype == "fp16"
    q = [t for name, t in tensors.items() if name in graph.tensors and graph.tensor(name).quant is not None]
    assert q and all(t.dtype == "uint8" and t.nbytes == int(np.prod(t.shape)) for t in q)


def concat_with_constant():
    """A QDQ Concat of an int8 activation and an int8 constant (both dequantized, the result quantized):
    an int8 Concat the lowering refuses (it concatenates activations only)."""
    from onnx import TensorProto as T, helper, numpy_helper
    n = helper.make_node
    inits = [numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(np.int8(0), "z"),
             numpy_helper.from_array(np.arange(8, dtype=np.int8).reshape(1, 2, 2, 2), "c")]
    nodes = [n("QuantizeLinear", ["x", "s", "z"], ["xq"]), n("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             n("DequantizeLinear", ["c", "s", "z"], ["cd"]),
             n("Concat", ["xd", "cd"], ["j"], name="const_concat", axis=1),
             n("QuantizeLinear", ["j", "s", "z"], ["jq"]), n("DequantizeLinear", ["jq", "s", "z"], ["y"])]
    graph = helper.make_graph(nodes, "const_concat", [helper.make_tensor_value_info("x", T.FLOAT, [1, 2, 2, 2])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [1, 4, 2, 2])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_unsupported_quantized_op_is_one_line_naming_the_node(tmp_path, capsys):
    import onnx
    path = tmp_path / "const_concat_qdq.onnx"
    onnx.save(concat_with_constant(), path)
    for argv in (["compile", str(path), "-o", str(tmp_path / "out")], ["estimate", str(path)]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert "node 'const_concat' (Concat) on quantized tensors" in err, err
    assert not (tmp_path / "out").exists()


def broadcast_add():
    """Add of a (1, 4, 8) and a (1, 1, 8) activation, then Relu: a broadcasting Add between quantized tensors."""
    from onnx import TensorProto as T, helper
    n = helper.make_node
    graph = helper.make_graph([n("Add", ["x", "z"], ["a"], name="broadcast_add"), n("Relu", ["a"], ["y"], name="relu")],
                              "broadcast_add", [helper.make_tensor_value_info("x", T.FLOAT, [1, 4, 8]),
                                                helper.make_tensor_value_info("z", T.FLOAT, [1, 1, 8])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [1, 4, 8])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_broadcasting_add_between_quantized_tensors_stays_float_and_verifies():
    """The frontend leaves a broadcasting Add float between its DequantizeLinears and QuantizeLinear (the int8
    lowering has no broadcasting form): the model compiles and verifies instead of being refused."""
    model = quantize_ops(broadcast_add(), ["Add", "Relu"])
    add = next(n for n in load_graph_of(model).nodes() if n.op_type == "Add")
    assert load_graph_of(model).tensor(add.outputs[0]).quant is None
    result = verify(model, "sg2260", CompileOptions(dtype="fp32"))
    assert result["ok"], result["outputs"]


def test_requantised_maxpool_keeps_the_inputs_integers(monkeypatch):
    """The cnn's MaxPool has its input's Quant: through dq0 (q - zp), the fp32 pool and rq0 (scale 1) the
    pooled integers are exactly the window maxima of the stored integers."""
    from tpuflow.hwmodel.functional.run import Machine, execute_program, load_inputs, storage_dtype
    import tpuflow.lowering.ddrplan as ddrplan
    import tpuflow.lowering.quant as quant
    model = quantized("cnn", "QDQ", False, "QInt8")
    monkeypatch.setattr(ddrplan.FirstFit, "release", lambda *a: None)   # keep every intermediate in DDR
    monkeypatch.setattr(quant, "CHAIN_RESIDENT_SHARE", 0)               # and write it there (no chains,
    graph, program = compile_model(model, "sg2260", CompileOptions(dtype="fp32", layer_group="off"))   # no layer groups)
    machine = Machine(program.chip, program.memory.ddr_bytes_used)
    load_inputs(machine, program, {"x": np.random.default_rng(3).standard_normal((1, 3, 12, 12)).astype(np.float32)})
    execute_program(machine, program)
    pool = next(n for n in graph.nodes() if n.op_type == "MaxPool")

    def read(name):
        t = program.memory.tensors[name]
        dt = storage_dtype(t)
        return machine.read_ddr(t.addr, int(np.prod(t.shape)) * dt.itemsize).view(dt).reshape(t.shape)

    x, y = read(pool.inputs[0]), read(pool.outputs[0])
    assert graph.tensor(pool.inputs[0]).quant == graph.tensor(pool.outputs[0]).quant
    want = x.reshape(1, 8, 6, 2, 6, 2).max(axis=(3, 5))
    assert np.array_equal(y, want) and len(np.unique(want)) > 20
    assert np.allclose(dequantize(y, graph.tensor(pool.outputs[0]).quant).max(), dequantize(want, graph.tensor(
        pool.outputs[0]).quant).max())


def wide_cnn(channels: int = 64, side: int = 28):
    """Three 3x3 convs of `channels` channels on a side x side map (relu, residual), global average pool,
    gemm: compute-bound enough that int8's rates show."""
    from onnx import TensorProto as T, helper, numpy_helper
    rng = np.random.default_rng(7)
    n = helper.make_node

    def w(name, shape, scale=0.1):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    nodes = [n("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             n("Relu", ["c1"], ["r1"], name="relu1"),
             n("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             n("Relu", ["c2"], ["r2"], name="relu2"),
             n("Conv", ["r2", "w3", "b3"], ["c3"], name="conv3", pads=[1, 1, 1, 1]),
             n("Add", ["c3", "r1"], ["a"], name="residual"), n("GlobalAveragePool", ["a"], ["g"], name="gap"),
             n("Flatten", ["g"], ["f"], name="flatten"), n("Gemm", ["f", "fw", "fb"], ["y"], name="fc", transB=1)]
    c = channels
    inits = [w("w1", (c, c, 3, 3), 0.05), w("b1", (c,)), w("w2", (c, c, 3, 3), 0.05), w("b2", (c,)),
             w("w3", (c, c, 3, 3), 0.05), w("b3", (c,)), w("fw", (10, c)), w("fb", (10,))]
    graph = helper.make_graph(nodes, "wide_cnn", [helper.make_tensor_value_info("x", T.FLOAT, [1, c, side, side])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [1, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def quantize_float(model, count: int = 4):
    """`model` quantized by quantize_static (QDQ, per-channel int8 weights, int8 activations, seeded reader)."""
    import logging
    import tempfile
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from quant_models import RandomReader
    logging.getLogger().setLevel(logging.ERROR)
    reader = type("Reader", (RandomReader, CalibrationDataReader), {})(model, count=count)
    with tempfile.TemporaryDirectory(prefix="tpuflow_int8_") as tmp:
        onnx.save(model, Path(tmp) / "float.onnx")
        quantize_static(str(Path(tmp) / "float.onnx"), str(Path(tmp) / "q.onnx"), reader, quant_format=QuantFormat.QDQ,
                        per_channel=True, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
        return onnx.load(str(Path(tmp) / "q.onnx"))


def quantize_ops(model, ops: list[str] | None, count: int = 4, activation: str = "QInt8", per_channel: bool = True,
                 extra: dict | None = None):
    """`model` quantized by quantize_static (QDQ, int8 weights, seeded reader), only the op kinds `ops`."""
    import logging
    import tempfile
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from quant_models import RandomReader
    logging.getLogger().setLevel(logging.ERROR)
    reader = type("Reader", (RandomReader, CalibrationDataReader), {})(model, count=count)
    with tempfile.TemporaryDirectory(prefix="tpuflow_int8_") as tmp:
        onnx.save(model, Path(tmp) / "float.onnx")
        quantize_static(str(Path(tmp) / "float.onnx"), str(Path(tmp) / "q.onnx"), reader, quant_format=QuantFormat.QDQ,
                        per_channel=per_channel, activation_type=getattr(QuantType, activation),
                        weight_type=QuantType.QInt8, op_types_to_quantize=ops, extra_options=extra or {})
        return onnx.load(str(Path(tmp) / "q.onnx"))


def latency_us(model, dtype: str = "fp16") -> float:
    from tpuflow.hwmodel.timing import simulate
    _, program = compile_model(model, "sg2260", CompileOptions(dtype=dtype))
    return simulate(program).total_ps / 1e6


def test_int8_program_is_cheaper_than_fp16_on_a_compute_bound_cnn():
    """The quantized chain (int8 CONV at twice the fp16 rate, one byte per element in DDR, tensors held in
    LMEM) against the float model compiled at fp16; and it verifies."""
    model = wide_cnn()
    q = quantize_float(model)
    assert latency_us(q) < 0.85 * latency_us(model)
    assert verify(q, "sg2260", CompileOptions(dtype="fp16"))["ok"]


def deployable(model):
    """A bundled float model as deployment flows hand it to quantize_static: opset 13, BatchNormalization folded
    into the Conv before it, two-input Sum as Add (onnxruntime quantizes Add, not Sum)."""
    from onnx import numpy_helper, version_converter
    model = version_converter.convert_version(model, 13)
    model.ir_version = max(model.ir_version, 8)
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    readers = {}
    for node in g.node:
        for t in node.input:
            readers[t] = readers.get(t, 0) + 1
    for bn in [n for n in g.node if n.op_type == "BatchNormalization"]:
        conv = producer.get(bn.input[0])
        if conv is None or conv.op_type != "Conv" or readers[conv.output[0]] != 1:
            continue
        scale, beta, mean, var = (numpy_helper.to_array(inits[t]).astype(np.float64) for t in bn.input[1:5])
        eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        k = scale / np.sqrt(var + eps)
        w = numpy_helper.to_array(inits[conv.input[1]]).astype(np.float64)
        b = (numpy_helper.to_array(inits[conv.input[2]]).astype(np.float64) if len(conv.input) > 2 and conv.input[2]
             else np.zeros(w.shape[0]))
        inits[conv.input[1]].CopyFrom(numpy_helper.from_array((w * k.reshape(-1, 1, 1, 1)).astype(np.float32),
                                                              conv.input[1]))
        g.initializer.append(numpy_helper.from_array(((b - mean) * k + beta).astype(np.float32), bn.output[0] + "_b"))
        del conv.input[2:]
        conv.input.append(bn.output[0] + "_b")
        conv.output[0] = bn.output[0]
        g.node.remove(bn)
    for node in g.node:
        if node.op_type == "Sum" and len(node.input) == 2:
            node.op_type = "Add"
    return model


@pytest.mark.slow
def test_resnet50_qdq_verifies_and_beats_fp16():
    from tpuflow import models
    float_model = models.build_model("resnet50")
    q = quantize_float(deployable(float_model), count=2)
    result = verify(q, "sg2260", CompileOptions(dtype="fp16"))
    assert result["ok"], result["outputs"]
    assert latency_us(q) < latency_us(float_model)


def _weight_maker(rng):
    """name, shape -> a seeded random fp32 initializer (standard normal x scale)."""
    from onnx import numpy_helper

    def w(name, shape, scale=0.2):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)
    return w


def _fire_nodes():
    """A SqueezeNet fire module x -> cat: squeeze 1x1 + Relu, expand 1x1 and 3x3 + Relu, channel Concat."""
    from onnx import helper
    n = helper.make_node
    return [n("Conv", ["x", "ws", "bs"], ["s"], name="squeeze"), n("Relu", ["s"], ["sr"], name="squeeze_relu"),
            n("Conv", ["sr", "we1", "be1"], ["e1"], name="expand1x1"), n("Relu", ["e1"], ["e1r"], name="e1_relu"),
            n("Conv", ["sr", "we3", "be3"], ["e3"], name="expand3x3", pads=[1, 1, 1, 1]),
            n("Relu", ["e3"], ["e3r"], name="e3_relu"), n("Concat", ["e1r", "e3r"], ["cat"], name="concat", axis=1)]


def fire_and_depthwise_cnn():
    """A SqueezeNet fire module (squeeze 1x1, expand 1x1 and 3x3, channel Concat) then MaxPool, a MobileNet
    block (depthwise 3x3 with Relu6, pointwise 1x1), a padded 3x3 AveragePool (border windows average fewer
    elements: count_include_pad 0) and global average pool + gemm."""
    from onnx import TensorProto as T, helper, numpy_helper
    rng = np.random.default_rng(11)
    n = helper.make_node

    w = _weight_maker(rng)
    nodes = [*_fire_nodes(),
             n("MaxPool", ["cat"], ["p"], name="pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             n("Conv", ["p", "wd", "bd"], ["d"], name="depthwise", pads=[1, 1, 1, 1], group=32),
             n("Clip", ["d", "lo", "hi"], ["dr"], name="relu6"),
             n("Conv", ["dr", "wp", "bp"], ["pw"], name="pointwise"),
             n("AveragePool", ["pw"], ["ap"], name="avgpool", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             n("GlobalAveragePool", ["ap"], ["g"], name="gap"), n("Flatten", ["g"], ["f"], name="flatten"),
             n("Gemm", ["f", "fw", "fb"], ["y"], name="fc", transB=1)]
    inits = [w("ws", (8, 16, 1, 1)), w("bs", (8,), 0.1), w("we1", (16, 8, 1, 1)), w("be1", (16,), 0.1),
             w("we3", (16, 8, 3, 3), 0.1), w("be3", (16,), 0.1), w("wd", (32, 1, 3, 3), 0.3), w("bd", (32,), 0.1),
             numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi"),
             w("wp", (24, 32, 1, 1)), w("bp", (24,), 0.1), w("fw", (10, 24)), w("fb", (10,), 0.1)]
    graph = helper.make_graph(nodes, "fire_dw", [helper.make_tensor_value_info("x", T.FLOAT, [1, 16, 20, 20])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [1, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_concat_and_depthwise_verify(dtype):
    q = quantize_float(fire_and_depthwise_cnn())
    ops = [n.op_type for n in load_graph_of(q).nodes()]
    assert "Concat" in ops and "AveragePool" in ops and ops.count("Conv") == 5
    result = verify(q, "sg2260", CompileOptions(dtype=dtype))
    assert result["ok"], result["outputs"]
    if dtype == "fp32":
        assert result["outputs"][0]["max_abs_err"] <= result["outputs"][0]["quant_step"]


def load_graph_of(model):
    from tpuflow.frontend import load
    return load(model)


def gemm_model(rows: int = 130, k: int = 300, n: int = 70):
    """Gemm (transB) + Relu, then a second Gemm: activations of `rows` rows (more than the lanes)."""
    from onnx import TensorProto as T, helper, numpy_helper
    rng = np.random.default_rng(13)
    node = helper.make_node
    nodes = [node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1", transB=1), node("Relu", ["h"], ["hr"], name="relu"),
             node("Gemm", ["hr", "w2", "b2"], ["y"], name="fc2")]
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.1).astype(np.float32), name)
             for name, s in (("w1", (n, k)), ("b1", (n,)), ("w2", (n, 9)), ("b2", (9,)))]
    graph = helper.make_graph(nodes, "gemms", [helper.make_tensor_value_info("x", T.FLOAT, [rows, k])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [rows, 9])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("steps", [None, (64, 32, 100)], ids=["whole", "row-column-k-steps"])
def test_gemm_on_mm2_verifies_whole_and_in_steps(steps, monkeypatch):
    """MM2 int8 x int8 -> int32 with the folded bias row on the first K step, K steps accumulated in int32,
    rows past the lanes, column steps of per-column scales; fp32: onnxruntime's integers."""
    from tpuflow.lowering.ops import quant_ops
    if steps is not None:
        monkeypatch.setattr(quant_ops.GemmQuant, "choices", lambda self: [steps])
    q = quantize_float(gemm_model())
    result = verify(q, "sg2260", CompileOptions(dtype="fp32"))
    assert result["ok"] and result["outputs"][0]["max_abs_err"] <= result["outputs"][0]["quant_step"], result["outputs"]
    _, program = compile_model(q, "sg2260", CompileOptions(dtype="fp32"))
    mm2 = [i for i in program.tiu if type(i).__name__ == "Mm2Tiu"]
    assert all(i.opt_opd0_prec == 0 and i.opt_res0_prec == 4 for i in mm2)
    assert (len(mm2) > 2) == (steps is not None) and any(i.opt_res_add for i in mm2) == (steps is not None)


def test_quantized_groups_run_on_the_tiu_with_matmul_tile():
    result = verify(quantized("cnn", "QDQ", True, "QInt8"), "sg2260", CompileOptions(dtype="fp16", matmul="tile"))
    assert result["ok"], result["outputs"]


def test_batch_of_three_verifies_exactly_at_fp32():
    """Samples past the first: held tensors' views and DDR offsets per sample."""
    import onnx
    model = onnx.ModelProto()
    model.CopyFrom(quantized("cnn", "QDQ", True, "QUInt8"))
    del model.graph.value_info[:]
    for value in (model.graph.input[0], model.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_param = "N"
    result = verify(model, "sg2260", CompileOptions(dtype="fp32"), input_shapes={"x": (3, 3, 12, 12)})
    assert result["ok"] and result["outputs"][0]["max_abs_err"] == 0.0, result["outputs"]


def test_int8_compilation_is_deterministic(tmp_path):
    model = quantize_float(fire_and_depthwise_cnn())
    outs = []
    for k in range(2):
        (tmp_path / f"in{k}").mkdir()
        assert cli_compile(model, tmp_path / f"in{k}" / "model.onnx", tmp_path / f"out{k}") == 0
        outs.append({p.name: p.read_bytes() for p in sorted((tmp_path / f"out{k}").iterdir())})
    assert outs[0] == outs[1] and any(name.endswith(".BD.0") for name in outs[0])


def cli_compile(model, path, out) -> int:
    import onnx
    onnx.save(model, path)
    return cli.main(["compile", str(path), "-o", str(out), "--dtype", "fp16"])


def grouped_cnn():
    """A grouped 3x3 conv (4 groups of 8 -> 12 channels) between two plain convs, then GAP + gemm."""
    from onnx import TensorProto as T, helper, numpy_helper
    rng = np.random.default_rng(17)
    n = helper.make_node

    def w(name, shape, scale=0.2):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    nodes = [n("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]), n("Relu", ["c1"], ["r1"]),
             n("Conv", ["r1", "wg", "bg"], ["cg"], name="grouped", pads=[1, 1, 1, 1], group=4),
             n("Relu", ["cg"], ["rg"]),
             n("Conv", ["rg", "w3", "b3"], ["c3"], name="conv3"), n("GlobalAveragePool", ["c3"], ["g"]),
             n("Flatten", ["g"], ["f"]), n("Gemm", ["f", "fw", "fb"], ["y"], transB=1)]
    inits = [w("w1", (32, 3, 3, 3)), w("b1", (32,), 0.1), w("wg", (48, 8, 3, 3), 0.15), w("bg", (48,), 0.1),
             w("w3", (16, 48, 1, 1)), w("b3", (16,), 0.1), w("fw", (10, 16)), w("fb", (10,), 0.1)]
    graph = helper.make_graph(nodes, "grouped", [helper.make_tensor_value_info("x", T.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [1, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_grouped_conv_verifies_exactly_at_fp32():
    q = quantize_float(grouped_cnn())
    assert any(n.op_type == "Conv" and n.attr("group", 1) == 4 for n in load_graph_of(q).nodes())
    result = verify(q, "sg2260", CompileOptions(dtype="fp32"))
    assert result["ok"] and result["outputs"][0]["max_abs_err"] <= result["outputs"][0]["quant_step"], result["outputs"]


def lrn_cnn():
    """conv (3 -> 96, 11x11 stride 4, relu) -> LRN (stays float between DequantizeLinear and QuantizeLinear)
    -> maxpool -> conv -> GAP -> gemm: AlexNet's stem, small."""
    from onnx import TensorProto as T, helper, numpy_helper
    rng = np.random.default_rng(19)
    n = helper.make_node

    def w(name, shape, scale=0.1):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    nodes = [n("Conv", ["x", "w1", "b1"], ["c1"], strides=[4, 4], pads=[2, 2, 2, 2]), n("Relu", ["c1"], ["r1"]),
             n("LRN", ["r1"], ["l1"], size=5, alpha=1e-4, beta=0.75, bias=1.0),
             n("MaxPool", ["l1"], ["p1"], kernel_shape=[3, 3], strides=[2, 2]),
             n("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]), n("Relu", ["c2"], ["r2"]),
             n("GlobalAveragePool", ["r2"], ["g"]), n("Flatten", ["g"], ["f"]), n("Gemm", ["f", "fw", "fb"], ["y"], transB=1)]
    inits = [w("w1", (96, 3, 11, 11), 0.05), w("b1", (96,)), w("w2", (32, 96, 3, 3), 0.03), w("b2", (32,)),
             w("fw", (10, 32)), w("fb", (10,))]
    graph = helper.make_graph(nodes, "lrn_cnn", [helper.make_tensor_value_info("x", T.FLOAT, [1, 3, 111, 111])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [1, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_float_op_between_quantized_chains_verifies(dtype):
    """A float LRN between DequantizeLinear and QuantizeLinear (the DequantizeLinear is kept out of chains:
    lowering.quant.CHAINABLE)."""
    q = quantize_float(lrn_cnn())
    assert "LRN" in [n.op_type for n in load_graph_of(q).nodes()]
    result = verify(q, "sg2260", CompileOptions(dtype=dtype))
    assert result["ok"], result["outputs"]


# ---------------------------------------------------------------- data movement on quantized tensors


def moves_net():
    """conv + relu -> Transpose (NCHW -> NHWC) -> Slice of the last axis -> Slice of rows -> 1x1 conv,
    then a channel shuffle (Reshape to 5-D, Transpose, Reshape) -> conv: the moves of
    transformer heads and ShuffleNet on int8 tensors."""
    from onnx import TensorProto as T, helper, numpy_helper
    rng = np.random.default_rng(11)
    n = helper.make_node

    def c(name, a):
        return numpy_helper.from_array(np.asarray(a), name)

    def w(name, shape, scale=0.3):
        return c(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    nodes = [n("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]), n("Relu", ["c"], ["r"], name="relu"),
             n("Transpose", ["r"], ["t"], name="to_nhwc", perm=[0, 2, 3, 1]),
             n("Slice", ["t", "starts", "ends", "axes"], ["s"], name="slice"),
             n("Slice", ["s", "bot0", "bot1", "rows"], ["cat"], name="bottom_rows"),
             n("Conv", ["cat", "w2", "b2"], ["c2"], name="conv2"),
             n("Reshape", ["c2", "groups"], ["g5"], name="split_groups"),
             n("Transpose", ["g5"], ["gt"], name="shuffle", perm=[0, 2, 1, 3, 4]),
             n("Reshape", ["gt", "flat"], ["sh"], name="merge_groups"),
             n("Conv", ["sh", "w3"], ["y"], name="conv3")]
    inits = [w("w", (8, 3, 3, 3)), w("b", (8,), 0.1), c("starts", np.array([1], np.int64)),
             c("ends", np.array([7], np.int64)), c("axes", np.array([3], np.int64)), c("rows", np.array([2], np.int64)),
             c("bot0", np.array([1], np.int64)),
             c("bot1", np.array([6], np.int64)), w("w2", (12, 6, 1, 1)), w("b2", (12,), 0.1),
             c("groups", np.array([1, 3, 4, 5, 6], np.int64)), c("flat", np.array([1, 12, 5, 6], np.int64)),
             w("w3", (4, 12, 1, 1))]
    graph = helper.make_graph(nodes, "moves", [helper.make_tensor_value_info("x", T.FLOAT, [1, 3, 6, 8])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [1, 4, 5, 6])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


MOVE_OPS = ["Conv", "Relu", "Transpose", "Slice", "Reshape"]


def test_moves_on_quantized_tensors_stay_int8():
    graph = load_graph_of(quantize_ops(moves_net(), MOVE_OPS))
    moves = [node for node in graph.nodes() if node.op_type in ("Transpose", "Slice")]
    assert len(moves) == 4
    assert all(graph.tensor(t).quant is not None for node in moves for t in (*node.inputs, *node.outputs))


@pytest.mark.parametrize("matmul", ["tiu", "tile"])
def test_moves_on_quantized_tensors_are_exact(matmul):
    """At fp32 the program's int8 output equals onnxruntime's: the moves copy stored bytes."""
    result = verify(quantize_ops(moves_net(), MOVE_OPS), "sg2260", CompileOptions(dtype="fp32", matmul=matmul))
    assert result["ok"] and result["outputs"][0]["max_abs_err"] == 0.0, result["outputs"]


def test_moves_on_quantized_tensors_verify_at_fp16():
    result = verify(quantize_ops(moves_net(), MOVE_OPS), "sg2260", CompileOptions(dtype="fp16"))
    assert result["ok"], result["outputs"]


def test_a_move_between_two_quantizations_is_refused(tmp_path):
    """A Transpose whose output has another Quant than its input is not a byte move: one line naming it."""
    from tpuflow.errors import LoweringError
    from tpuflow.lowering.quant import check_supported
    graph = load_graph_of(quantize_ops(moves_net(), MOVE_OPS))
    node = next(n for n in graph.nodes() if n.name == "to_nhwc")
    out = graph.tensor(node.outputs[0])
    other = type(out.quant)(out.quant.scale * 2, out.quant.zero_point, None, out.quant.storage)
    graph.tensors[node.outputs[0]] = type(out)(out.name, out.shape, out.dtype, out.const, other)
    with pytest.raises(LoweringError, match="node 'to_nhwc' .Transpose. on quantized tensors: moves only of 8-bit"):
        check_supported(graph)


# ---------------------------------------------------------------- constants along rows


@pytest.mark.parametrize("case", [("QDQ", True, "QUInt8"), ("QDQ", False, "QInt8"), ("QOperator", True, "QInt8")],
                         ids=["QDQ-channel-QUInt8", "QDQ-tensor-QInt8", "QOperator-channel-QInt8"])
def test_last_axis_constants_are_exact_at_fp32(case):
    """matmul_chain: a MatMul without the Gemm form, then Add of a (24,) bias and Mul by a (12,) gain along
    the last axis (one row of the flat view repeated on every lane), then a Transpose: onnxruntime's integers."""
    result = verify(quantized("matmul_chain", *case), "sg2260", CompileOptions(dtype="fp32"))
    assert result["ok"] and result["outputs"][0]["max_abs_err"] == 0.0, result["outputs"]


def test_row_pattern_is_the_constants_repeating_unit():
    from tpuflow.frontend.graph import Graph
    from tpuflow.lowering.quant import row_pattern
    graph = load_graph_of(quantized("matmul_chain", "QDQ", False, "QInt8"))
    node = next(n for n in graph.nodes() if n.name == "gain_mul")
    gain = next(graph.tensor(t) for t in node.inputs if graph.tensor(t).is_const)
    assert isinstance(graph, Graph) and gain.shape == (12,)
    assert np.array_equal(row_pattern(graph, node), dequantize(gain.const, gain.quant))


def test_llama_mlp_qdq_is_exact_at_fp32():
    """The bundled LLaMA MLP quantized (RMSNorm's gain: a last-axis int8 Mul; SwiGLU's products of two
    activations by Mul): onnxruntime's integers with the float rest in fp32."""
    from tpuflow import models
    model = quantize_ops(models.build_model("llama_mlp"), None, count=2)
    result = verify(model, "sg2260", CompileOptions(dtype="fp32"))
    assert result["ok"] and result["outputs"][0]["max_abs_err"] == 0.0, result["outputs"]


# ---------------------------------------------------------------- a Reshape between two quantizations


def cnn_with_requantised_flatten(zero_shift: int = 3, scale_ratio: float = 0.7):
    """The quantized cnn with the Flatten before its Gemm given its own scale and zero point (as
    onnxruntime's quantizer does on ResNet-50 and Inception v1): Flatten is then no view."""
    import onnx
    from onnx import numpy_helper
    model = onnx.ModelProto()
    model.CopyFrom(quantized("cnn", "QDQ", True, "QInt8"))
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    model.graph.initializer.extend([
        numpy_helper.from_array((inits["g_scale"] * np.float32(scale_ratio)).astype(np.float32), "f_scale"),
        numpy_helper.from_array(np.asarray(inits["g_zero_point"] + zero_shift, np.int8), "f_zero_point")])
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") and node.input[0] in ("f", "f_QuantizeLinear_Output"):
            node.input[1], node.input[2] = "f_scale", "f_zero_point"
    return model


def test_a_reshape_between_two_quantizations_is_requantised():
    """At fp32 the requantised Flatten's integers and the output equal onnxruntime's (was: the flattened
    bytes read with the new scale). The Flatten's output is a graph output here: onnxruntime's graph
    optimizer otherwise rewrites DequantizeLinear -> Flatten -> QuantizeLinear -> Gemm and its result
    moves by a step or two from the model's QDQ meaning (which it computes with optimizations off)."""
    import onnx
    from onnx import helper
    from tpuflow.lowering.quant import requantising_view
    model = cnn_with_requantised_flatten()
    model.graph.output.append(helper.make_tensor_value_info("f_QuantizeLinear_Output", onnx.TensorProto.INT8, [1, 8]))
    graph = load_graph_of(model)
    assert [n.name for n in graph.nodes() if requantising_view(graph, n)] == ["flatten"]
    result = verify(model, "sg2260", CompileOptions(dtype="fp32"))
    assert result["ok"] and all(o["max_abs_err"] == 0.0 for o in result["outputs"]), result["outputs"]



# ---------------------------------------------------------------- products of two activations (attention)


@pytest.mark.parametrize("matmul", ["tiu", "tile"])
@pytest.mark.parametrize("case", [("QDQ", False, "QInt8"), ("QDQ", True, "QUInt8"), ("QOperator", False, "QInt8"),
                                  ("QOperator", True, "QUInt8")],
                         ids=["QDQ-QInt8", "QDQ-QUInt8", "QOperator-QInt8", "QOperator-QUInt8"])
def test_attention_scores_run_in_int8(case, matmul):
    """quant_models.attention: Q.K^T of two activations (ActMatMulQuant), Softmax in float, P.V by weights.
    QOperator (onnxruntime's QLinearMatMul kernel) gives exactly its integers at fp32; QDQ within a step."""
    from tpuflow.lowering.quant import product_of_activations
    model = quantized("attention", *case)
    graph = load_graph_of(model)
    assert any(product_of_activations(graph, n) for n in graph.nodes())
    result = verify(model, "sg2260", CompileOptions(dtype="fp32", matmul=matmul))
    (out,) = result["outputs"]
    assert result["ok"] and out["max_abs_err"] <= (0.0 if case[0] == "QOperator" else 1.001 * out["quant_step"]), out


def quantized_product_model(batch: tuple[int, ...], m: int, k: int, n: int, qa, qb, qy, transpose_b: bool = False):
    """Graph inputs A (batch, m, k) and B (batch, k, n) already quantized (int8 / uint8 by their Quant's
    (scale, zero point, storage)), DequantizeLinear -> MatMul -> QuantizeLinear: the int8 output y."""
    from onnx import TensorProto as T, helper, numpy_helper
    types = {"int8": (T.INT8, np.int8), "uint8": (T.UINT8, np.uint8)}
    n_ = helper.make_node
    inits, nodes = [], []
    for name, (scale, zp, storage) in (("a", qa), ("b", qb), ("y", qy)):
        inits += [numpy_helper.from_array(np.float32(scale), f"{name}_s"),
                  numpy_helper.from_array(np.asarray(zp, types[storage][1]), f"{name}_z")]
    b_shape = (*batch, n, k) if transpose_b else (*batch, k, n)
    nodes += [n_("DequantizeLinear", ["a", "a_s", "a_z"], ["af"]), n_("DequantizeLinear", ["b", "b_s", "b_z"], ["bf"])]
    if transpose_b:
        perm = list(range(len(batch))) + [len(batch) + 1, len(batch)]
        nodes.append(n_("Transpose", ["bf"], ["bt"], perm=perm))
    nodes += [n_("MatMul", ["af", "bt" if transpose_b else "bf"], ["yf"], name="product"),
              n_("QuantizeLinear", ["yf", "y_s", "y_z"], ["y"])]
    graph = helper.make_graph(nodes, "product", [helper.make_tensor_value_info("a", types[qa[2]][0], [*batch, m, k]),
                                                  helper.make_tensor_value_info("b", types[qb[2]][0], list(b_shape))],
                              [helper.make_tensor_value_info("y", types[qy[2]][0], [*batch, m, n])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def run_on_chip(model, inputs: dict, **options):
    import tempfile
    from tpuflow.codegen import read_program, write_program
    from tpuflow.hwmodel.functional import run
    graph, program = compile_model(model, "sg2260", CompileOptions(**options))
    with tempfile.TemporaryDirectory() as tmp:
        write_program(program, Path(tmp), name=graph.name)
        decoded = read_program(Path(tmp), program.chip)
    return run(decoded, inputs, race_check=True)


def product_rule(a, b, qa, qb, qy) -> np.ndarray:
    """The QDQ meaning with onnxruntime's requantisation: int64 sum of (a - za)(b - zb), times the fp32
    scale fp32(s_a * s_b) / s_y, rounded half to even, plus zy, saturated."""
    acc = np.matmul(a.astype(np.int64) - qa[1], b.astype(np.int64) - qb[1])
    scale = np.float32(np.float32(qa[0]) * np.float32(qb[0])) / np.float32(qy[0])
    lo, hi = np.iinfo(qy[2]).min, np.iinfo(qy[2]).max
    return np.clip(np.rint(acc.astype(np.float32) * np.float32(scale)) + qy[1], lo, hi).astype(qy[2])


def _quant_param(storage: str):
    lo, hi = np.iinfo(storage).min, np.iinfo(storage).max
    return st.tuples(st.floats(0.00390625, 0.0625, width=32), st.integers(lo, hi), st.just(storage))


@settings(max_examples=12, deadline=None)
@given(batch=st.sampled_from([(), (2,), (1, 3)]), m=st.integers(1, 70), k=st.integers(1, 80), n=st.integers(1, 40),
       qa=st.one_of(_quant_param("int8"), _quant_param("uint8")),
       qb=st.one_of(_quant_param("int8"), _quant_param("uint8")),
       transpose_b=st.booleans(), step=st.sampled_from([None, (16, 8, 24)]), seed=st.integers(0, 2 ** 16))
def test_product_of_activations_is_exact(batch, m, k, n, qa, qb, transpose_b, step, seed):
    """Any zero points (int8 / uint8, including -128 and uint8 ones past 128), batch dims, a Transpose of B
    folded into the product (mm2.nt), K / row / column steps: the chip's integers equal the int64 rule."""
    rng = np.random.default_rng(seed)
    a = rng.integers(np.iinfo(qa[2]).min, np.iinfo(qa[2]).max + 1, (*batch, m, k)).astype(qa[2])
    b_stored = rng.integers(np.iinfo(qb[2]).min, np.iinfo(qb[2]).max + 1, (*batch, n, k) if transpose_b
                            else (*batch, k, n)).astype(qb[2])
    b = np.swapaxes(b_stored, -1, -2) if transpose_b else b_stored
    # the output scale calibrated on this result: its values spread over about +-100 steps (no saturation)
    reach = np.abs(np.matmul(a.astype(np.int64) - qa[1], b.astype(np.int64) - qb[1])).max()
    qy = (float(max(reach, 1)) * float(qa[0]) * float(qb[0]) / 100.0, 3, "int8")
    model = quantized_product_model(batch, m, k, n, qa, qb, qy, transpose_b)
    with pytest.MonkeyPatch.context() as patch:
        if step is not None:
            from tpuflow.lowering.ops import quant_ops
            patch.setattr(quant_ops.ActMatMulQuant, "choices", lambda self: [step])
        ours = run_on_chip(model, {"a": a, "b": b_stored}, dtype="fp32")["y"]
    assert np.array_equal(ours, product_rule(a, b, qa, qb, qy))


# ---------------------------------------------------------------- weights with zero points


def weight_product_model(m: int, k: int, n: int, qa, weights: np.ndarray, w_scale, w_zp, qy):
    """A (m, k) int8 / uint8 graph input, constant int8 weights (k, n) with scales / zero points per tensor
    (scalars) or per column (arrays, axis 1), DequantizeLinear -> MatMul -> QuantizeLinear into int8 y."""
    from onnx import TensorProto as T, helper, numpy_helper
    types = {"int8": (T.INT8, np.int8), "uint8": (T.UINT8, np.uint8)}
    n_ = helper.make_node
    per_column = np.ndim(w_scale) == 1
    inits = [numpy_helper.from_array(np.float32(qa[0]), "a_s"),
             numpy_helper.from_array(np.asarray(qa[1], types[qa[2]][1]), "a_z"),
             numpy_helper.from_array(weights.astype(np.int8), "w"),
             numpy_helper.from_array(np.asarray(w_scale, np.float32), "w_s"),
             numpy_helper.from_array(np.asarray(w_zp, np.int8), "w_z"),
             numpy_helper.from_array(np.float32(qy[0]), "y_s"), numpy_helper.from_array(np.int8(qy[1]), "y_z")]
    nodes = [n_("DequantizeLinear", ["a", "a_s", "a_z"], ["af"]),
             n_("DequantizeLinear", ["w", "w_s", "w_z"], ["wf"], **({"axis": 1} if per_column else {})),
             n_("MatMul", ["af", "wf"], ["yf"], name="fc"), n_("QuantizeLinear", ["yf", "y_s", "y_z"], ["y"])]
    graph = helper.make_graph(nodes, "weights", [helper.make_tensor_value_info("a", types[qa[2]][0], [m, k])],
                              [helper.make_tensor_value_info("y", T.INT8, [m, n])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@settings(max_examples=10, deadline=None)
@given(m=st.integers(1, 70), k=st.integers(1, 90), n=st.integers(1, 40), qa=st.one_of(_quant_param("int8"),
       _quant_param("uint8")), per_column=st.booleans(), step=st.sampled_from([None, (16, 8, 24)]),
       seed=st.integers(0, 2 ** 16))
def test_weights_with_zero_points_are_exact(m, k, n, qa, per_column, step, seed):
    """MatMul by int8 weights whose zero points are not 0 (onnxruntime's quantizer gives Inception v1's
    classifier per-tensor weights of zero point -3): the chip's integers equal the int64 rule."""
    rng = np.random.default_rng(seed)
    a = rng.integers(np.iinfo(qa[2]).min, np.iinfo(qa[2]).max + 1, (m, k)).astype(qa[2])
    w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    w_zp = rng.integers(-127, 128, n).astype(np.int8) if per_column else np.int8(rng.integers(-127, 128))
    w_scale = (rng.uniform(0.5, 2.0, n) * 0.01).astype(np.float32) if per_column else np.float32(0.01)
    acc = np.matmul(a.astype(np.int64) - qa[1], w.astype(np.int64) - np.asarray(w_zp, np.int64))
    s_y = float(max(np.abs(acc).max(), 1)) * float(qa[0]) * 0.02 / 100.0
    scale = (np.float32(qa[0]) * np.asarray(w_scale, np.float32)).astype(np.float32) / np.float32(s_y)
    want = np.clip(np.rint(acc.astype(np.float32) * np.asarray(scale, np.float32)) + 3, -128, 127).astype(np.int8)
    model = weight_product_model(m, k, n, qa, w, w_scale, w_zp, (s_y, 3))
    with pytest.MonkeyPatch.context() as patch:
        if step is not None:
            from tpuflow.lowering.ops import quant_ops
            patch.setattr(quant_ops.GemmQuant, "choices", lambda self: [step])
        ours = run_on_chip(model, {"a": a}, dtype="fp32")["y"]
    assert np.array_equal(ours, want)


@pytest.mark.slow
def test_inception_v1_qdq_with_zero_point_classifier_weights_verifies():
    """The deployment-style QDQ Inception v1 (per-tensor classifier weights of zero point -3)."""
    from tpuflow import models
    q = quantize_float(deployable(models.build_model("inception_v1")), count=2)
    graph = load_graph_of(q)
    fc = next(n for n in graph.nodes() if n.op_type == "MatMul")
    assert (graph.tensor(fc.inputs[1]).quant.zero_point != 0).any()
    result = verify(q, "sg2260", CompileOptions(dtype="fp32"))
    assert result["ok"], result["outputs"]


@pytest.mark.slow
def test_fully_quantized_bert_layer_matches_the_qdq_meaning():
    """The bundled BERT layer with every MatMul quantized (attention's Q.K^T and P.V in int8, head Transposes
    and LayerNorm-gain rows on int8 tensors), float rest in fp32, against onnxruntime executing the QDQ
    model as written (graph optimizations off): within two output steps. (onnxruntime's optimized
    execution is 4.00 steps from its own unoptimized one on this model.)"""
    import onnxruntime as ort
    from tpuflow import models
    from tpuflow.compare import random_inputs
    from tpuflow.lowering.quant import product_of_activations
    from tpuflow.pipeline import quantized_output_steps
    q = quantize_ops(models.build_model("bert_layer"), None, count=2)
    graph = load_graph_of(q)
    products = [n for n in graph.nodes() if product_of_activations(graph, n)]
    assert len(products) == 2 and all(graph.tensor(t).quant is not None for n in products for t in n.inputs)
    inputs = random_inputs(graph, 0)
    ours = run_on_chip(q, inputs, dtype="fp32")["output"].astype(np.float64)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = ort.InferenceSession(q.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(
        None, inputs)[0].astype(np.float64)
    step = quantized_output_steps(graph)["output"]
    cosine = (ours * ref).sum() / np.linalg.norm(ours) / np.linalg.norm(ref)
    assert np.abs(ours - ref).max() <= 2 * step * 1.0001 and cosine >= QUANT_MIN_COSINE


def qoperator(model, count: int = 2):
    """`model` quantized by quantize_static in QOperator format (QLinearConv / QLinearMatMul / QLinearAdd
    ...; per-channel int8 weights, int8 activations, seeded reader)."""
    import logging
    import tempfile
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from quant_models import RandomReader
    logging.getLogger().setLevel(logging.ERROR)
    reader = type("Reader", (RandomReader, CalibrationDataReader), {})(model, count=count)
    with tempfile.TemporaryDirectory(prefix="tpuflow_int8_") as tmp:
        onnx.save(model, Path(tmp) / "float.onnx")
        quantize_static(str(Path(tmp) / "float.onnx"), str(Path(tmp) / "q.onnx"), reader,
                        quant_format=QuantFormat.QOperator, per_channel=True, activation_type=QuantType.QInt8,
                        weight_type=QuantType.QInt8)
        return onnx.load(str(Path(tmp) / "q.onnx"))


def test_qoperator_gpt_block_splits_int8_tensors_and_verifies():
    """QOperator leaves GPT's qkv Split on the int8 tensor between QLinear ops (no QLinearSplit): the frontend
    carries the Quant to each part, the lowering moves the bytes (QuantMove)."""
    from tpuflow import models
    q = qoperator(models.build_model("gpt_block"))
    graph = load_graph_of(q)
    split = next(n for n in graph.nodes() if n.op_type == "Split")
    assert all(graph.tensor(t).quant == graph.tensor(split.inputs[0]).quant is not None for t in split.outputs)
    result = verify(q, "sg2260", CompileOptions(dtype="fp32"))
    assert result["ok"], result["outputs"]


def heads_product_model(m: int, h: int, k: int, n: int, qa, qb, qy):
    """Attention's layout: A stored (1, m, h, k) and read through Transpose (0, 2, 1, 3), B stored (1, m, h, n)...
    here B (1, h, k, n) direct, the product (1, h, m, n) written through Transpose (0, 2, 1, 3) as (1, m, h, n):
    the lowering folds both Transposes into the MatMul (a_perm, y_perm)."""
    from onnx import TensorProto as T, helper, numpy_helper
    types = {"int8": (T.INT8, np.int8), "uint8": (T.UINT8, np.uint8)}
    n_ = helper.make_node
    inits = []
    for name, (scale, zp, storage) in (("a", qa), ("b", qb), ("y", qy)):
        inits += [numpy_helper.from_array(np.float32(scale), f"{name}_s"),
                  numpy_helper.from_array(np.asarray(zp, types[storage][1]), f"{name}_z")]
    nodes = [n_("DequantizeLinear", ["a", "a_s", "a_z"], ["af"]), n_("DequantizeLinear", ["b", "b_s", "b_z"], ["bf"]),
             n_("Transpose", ["af"], ["at"], perm=[0, 2, 1, 3]), n_("MatMul", ["at", "bf"], ["yf"], name="product"),
             n_("QuantizeLinear", ["yf", "y_s", "y_z"], ["yq"]), n_("DequantizeLinear", ["yq", "y_s", "y_z"], ["yd"]),
             n_("Transpose", ["yd"], ["yt"], perm=[0, 2, 1, 3]), n_("QuantizeLinear", ["yt", "y_s", "y_z"], ["y"])]
    graph = helper.make_graph(nodes, "heads", [helper.make_tensor_value_info("a", types[qa[2]][0], [1, m, h, k]),
                                               helper.make_tensor_value_info("b", types[qb[2]][0], [1, h, k, n])],
                              [helper.make_tensor_value_info("y", types[qy[2]][0], [1, m, h, n])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("qa, qb", [((0.02, 7, "int8"), (0.03, -128, "int8")),
                                    ((0.01, 200, "uint8"), (0.02, 0, "uint8"))], ids=["int8", "uint8"])
def test_product_of_head_layouts_is_exact(qa, qb):
    """The Transposes around an attention product (query heads in, context heads out) folded into it: the
    operands are read and the result written through the permuted strides; integers equal the int64 rule."""
    from tpuflow.lowering.prepare import fold_matmul_transposes
    m, h, k, n = 20, 3, 16, 12
    rng = np.random.default_rng(5)
    a = rng.integers(np.iinfo(qa[2]).min, np.iinfo(qa[2]).max + 1, (1, m, h, k)).astype(qa[2])
    b = rng.integers(np.iinfo(qb[2]).min, np.iinfo(qb[2]).max + 1, (1, h, k, n)).astype(qb[2])
    a_heads = a.transpose(0, 2, 1, 3)
    reach = np.abs(np.matmul(a_heads.astype(np.int64) - qa[1], b.astype(np.int64) - qb[1])).max()
    qy = (float(reach) * qa[0] * qb[0] / 100.0, 3, "int8")
    model = heads_product_model(m, h, k, n, qa, qb, qy)
    folded = next(node for node in fold_matmul_transposes(load_graph_of(model)).nodes() if node.op_type == "MatMul")
    assert folded.attr("a_perm") is not None and folded.attr("y_perm") is not None
    ours = run_on_chip(model, {"a": a, "b": b}, dtype="fp32")["y"]
    assert np.array_equal(ours, product_rule(a_heads, b, qa, qb, qy).transpose(0, 2, 1, 3))


# ---------------------------------------------------------------- transformer chains (tensors held as rows)


def layer_ddr_bytes(program) -> dict[str, list[int]]:
    """{layer: [DDR bytes read, DDR bytes written]} of the program's GDMA instructions (distinct bytes per
    side: a broadcast row counts once)."""
    from tpuflow.estimate import _ddr_sides
    from tpuflow.isa.gdma import is_lmem
    moved: dict[str, list[int]] = {}
    for instr, layer in zip(program.gdma, program.gdma_layers):
        if not hasattr(instr, "src_start_addr"):
            continue                                # no data (SYS)
        writes = is_lmem(instr.src_start_addr, program.chip)
        for _, nbytes in _ddr_sides(instr, program.chip):
            moved.setdefault(layer, [0, 0])[1 if writes else 0] += nbytes
    return moved


def test_int8_mlp_chain_moves_one_byte_per_weight_and_nothing_between_layers():
    """Gemm + Relu + Gemm quantized: QuantizeLinear, both MM2 products and the DequantizeLinear form one
    chain holding the activations as rows; each layer's DDR traffic is its compulsory part only: the
    fp16 input read once, each product's int8 weights (one byte per element) and its int32 bias and
    fp32 scale rows (one broadcast each), the fp16 result written once; the int8 result the output's
    DequantizeLinear reads (the float tail's boundary: lowering.quant.tail_boundary) is stored as well."""
    from tpuflow.lowering.quant import QuantChain
    rows, k, n = 130, 300, 70
    q = quantize_float(gemm_model(rows, k, n))
    graph, program = compile_model(q, "sg2260", CompileOptions(dtype="fp16"))
    moved = layer_ddr_bytes(program)
    products = sorted(name for name in moved if name in ("fc1", "fc2") or name.endswith("MatMul"))
    assert len(products) == 2, moved
    first, second = products
    quantize = next(name for name in moved if name.endswith("QuantizeLinear") and "Dequantize" not in name)
    dequantize_ = next(name for name in moved if name.endswith("DequantizeLinear"))
    assert moved[quantize] == [rows * k * 2, 0]
    assert moved[first] == [k * n + 4 * n + 4 * n, 0]
    assert moved[second] == [n * 9 + 4 * 9 + 4 * 9, rows * 9]      # the float tail's boundary, stored for verify
    assert moved[dequantize_] == [0, rows * 9 * 2]
    from tpuflow.lowering.groups import form_groups
    from tpuflow.lowering.prepare import fold_matmul_transposes, materialize_broadcasts
    from tpuflow.lowering.quant import quantized_groups
    from tpuflow.chip import load_chip
    g = materialize_broadcasts(fold_matmul_transposes(load_graph_of(q)))
    chains = [x for x in quantized_groups(g, form_groups(g), load_chip("sg2260")) if isinstance(x, QuantChain)]
    assert [[m.anchor.op_type for m in c.members] for c in chains] == [
        ["QuantizeLinear", "MatMul", "MatMul", "DequantizeLinear"]]


@pytest.mark.parametrize("name", ["llama_mlp", "bert_layer"])
def test_transformer_chains_give_the_unchained_integers(name, monkeypatch):
    """The bundled transformer blocks quantized whole: chained (operands and results held as rows, views
    inside chains, a norm's gain on held rows) and unchained programs give the same outputs bit for bit at
    fp32 (unchained, layer groups keep what they can in LMEM), and without layer groups the chained one
    moves fewer DDR bytes than the unchained one (every quant group through DDR)."""
    import tpuflow.lowering.quant as quant
    from tpuflow import models
    from tpuflow.frontend import load
    model = quantize_ops(models.build_model(name), None, count=2)
    rng = np.random.default_rng(3)
    graph = load(model)
    inputs = {t: rng.standard_normal(graph.tensor(t).shape).astype(np.float32) for t in graph.inputs}
    chained = run_on_chip(model, inputs, dtype="fp32")
    _, program = compile_model(model, "sg2260", CompileOptions(dtype="fp32", layer_group="off"))
    monkeypatch.setattr(quant, "CHAIN_RESIDENT_SHARE", 0)
    unchained = run_on_chip(model, inputs, dtype="fp32")
    _, flat = compile_model(model, "sg2260", CompileOptions(dtype="fp32", layer_group="off"))
    assert chained.keys() == unchained.keys()
    assert all(np.array_equal(chained[k], unchained[k]) for k in chained)
    total = lambda p: sum(sum(v) for v in layer_ddr_bytes(p).values())  # noqa: E731
    assert total(program) < total(flat)


def wide_fire_cnn(expand: int = 64):
    """A fire module whose expands are whole lane groups wide (the 3x3 expand's input too wide to fold
    its kernel rows), then MaxPool, global average pool and a Gemm: one chain through the Concat."""
    from onnx import TensorProto as T, helper
    rng = np.random.default_rng(17)
    n = helper.make_node

    w = _weight_maker(rng)
    nodes = [*_fire_nodes(),
             n("MaxPool", ["cat"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
             n("GlobalAveragePool", ["p"], ["g"], name="gap"), n("Flatten", ["g"], ["f"], name="flatten"),
             n("Gemm", ["f", "fw", "fb"], ["y"], name="fc", transB=1)]
    inits = [w("ws", (32, 16, 1, 1)), w("bs", (32,), 0.1), w("we1", (expand, 32, 1, 1)), w("be1", (expand,), 0.1),
             w("we3", (expand, 32, 3, 3), 0.1), w("be3", (expand,), 0.1), w("fw", (10, 2 * expand)), w("fb", (10,), 0.1)]
    graph = helper.make_graph(nodes, "wide_fire", [helper.make_tensor_value_info("x", T.FLOAT, [1, 16, 10, 10])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [1, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_concat_inputs_are_written_into_the_held_output(monkeypatch):
    """An expand with the Concat's Quant, starting on lane 0 of a channel group of the Concat's held
    output, is written straight into it (the other, requantised, is still copied): the Concat moves fewer
    bytes than with no input placed, and the integers equal those of the program with no placement and
    of the unchained one (every group through DDR) at fp32; it verifies."""
    import tpuflow.lowering.quant as quant
    from tpuflow.lowering.ops import quant_ops
    q = quantize_float(wide_fire_cnn())
    graph = load_graph_of(q)
    cat = next(n for n in graph.nodes() if n.op_type == "Concat")
    same = [x for x in cat.inputs if graph.tensor(x).quant == graph.tensor(cat.outputs[0]).quant]
    assert same == [cat.inputs[1]]                      # the 3x3 expand (channels 64..127) shares the Quant
    rng = np.random.default_rng(4)
    inputs = {"x": rng.standard_normal((1, 16, 10, 10)).astype(np.float32)}

    def concat_dmas():
        _, program = compile_model(q, "sg2260", CompileOptions(dtype="fp32"))
        return sum(1 for layer in program.gdma_layers if layer == "concat")
    placed, placed_y = concat_dmas(), run_on_chip(q, inputs, dtype="fp32")["y"]
    result = verify(q, "sg2260", CompileOptions(dtype="fp32"))
    assert result["ok"] and result["outputs"][0]["max_abs_err"] <= result["outputs"][0]["quant_step"]
    monkeypatch.setattr(quant_ops.ChainQuant, "_placements", lambda self: {})
    assert placed < concat_dmas()
    assert np.array_equal(placed_y, run_on_chip(q, inputs, dtype="fp32")["y"])
    monkeypatch.setattr(quant, "CHAIN_RESIDENT_SHARE", 0)
    assert np.array_equal(placed_y, run_on_chip(q, inputs, dtype="fp32")["y"])


def matmul_bias_row_model(rows: int = 130, k: int = 40, n: int = 48):
    """MatMul, then a bias row Add (a separate node, as in bert_base's quantized graph), then a MatMul:
    more rows than lanes."""
    from onnx import TensorProto as T, helper, numpy_helper
    rng = np.random.default_rng(23)
    node = helper.make_node
    nodes = [node("MatMul", ["x", "w1"], ["h"], name="mm1"), node("Add", ["h", "b1"], ["hb"], name="bias"),
             node("MatMul", ["hb", "w2"], ["y"], name="mm2")]
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.2).astype(np.float32), name)
             for name, s in (("w1", (k, n)), ("b1", (n,)), ("w2", (n, 8)))]
    graph = helper.make_graph(nodes, "bias_row", [helper.make_tensor_value_info("x", T.FLOAT, [1, rows, k])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [1, rows, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_bias_row_on_held_rows_reads_its_row_once(monkeypatch):
    """A bias row Add between two int8 MatMuls joins their chain (rows held past the lanes): its DDR
    traffic is the fp32 row, read once into one lane group and read by every channel group at stride 0;
    the integers equal the unchained program's at fp32."""
    import tpuflow.lowering.quant as quant
    rows, n = 130, 48
    q = quantize_ops(matmul_bias_row_model(rows, 40, n), ["MatMul", "Add"], count=2)
    graph = load_graph_of(q)
    assert any(node.op_type == "Add" and any(graph.tensor(t).is_const for t in node.inputs) for node in graph.nodes())
    _, program = compile_model(q, "sg2260", CompileOptions(dtype="fp32"))
    assert layer_ddr_bytes(program)["bias"] == [4 * n, 0]
    (dma,) = [i for i, layer in zip(program.gdma, program.gdma_layers) if layer == "bias"]
    assert dma.op == "broadcast" and dma.dst_csize == 64      # one lane group, not one row per held row
    x = {"x": np.random.default_rng(2).standard_normal((1, rows, 40)).astype(np.float32)}
    chained = run_on_chip(q, x, dtype="fp32")["y"]
    result = verify(q, "sg2260", CompileOptions(dtype="fp32"))
    assert result["ok"] and result["outputs"][0]["max_abs_err"] <= result["outputs"][0]["quant_step"]
    monkeypatch.setattr(quant, "CHAIN_RESIDENT_SHARE", 0)
    assert np.array_equal(chained, run_on_chip(q, x, dtype="fp32")["y"])


def _depthwise_with_a_dead_channel():
    """A float depthwise Conv (8 channels, 3x3) whose channel 0 has weights of 1e-7 and a bias of 0.5:
    quantized per channel, that channel's int32 bias is about 0.5 / (s_x * s_w), far past 2**24."""
    from onnx_build import ModelBuilder
    b = ModelBuilder(seed=4)
    w = b.weight("w", (8, 1, 3, 3))
    b.inits[-1] = onnx_numpy_scaled(b.inits[-1], 0, 1e-7)
    bias = b.const("bias", np.array([0.5] + [0.1] * 7, np.float32))
    b.output(b.node("Conv", [b.input("x", (1, 8, 10, 10)), w, bias], "y", group=8, kernel_shape=[3, 3],
                    pads=[1, 1, 1, 1]))
    return b.model()


def onnx_numpy_scaled(init, channel: int, factor: float):
    from onnx import numpy_helper
    values = numpy_helper.to_array(init).copy()
    values[channel] *= factor
    return numpy_helper.from_array(values, init.name)


def test_a_depthwise_bias_past_fp32s_integers_is_split_and_exact(monkeypatch):
    """With an asymmetric input (the fp32 form) pord adds the bias's low byte, one fp32 add the rest: the
    program verifies (was refused: 'depthwise sums may reach ..., past fp32's exact integers') and the big
    channel gets its own add."""
    import tpuflow.quantize
    from tpuflow.isa import ArTiu, Engine
    from tpuflow.lowering.ops.quant_ops import DepthwiseQuant
    monkeypatch.setattr(tpuflow.quantize, "ACTIVATION_SYMMETRIC", False)
    model = _depthwise_with_a_dead_channel()
    graph, program = compile_model(model, "sg2260", CompileOptions(dtype="int8"))
    conv = next(n for n in graph.nodes() if n.op_type == "Conv")
    q = graph.tensor(conv.inputs[2]).const
    assert np.abs(q).max() >= DepthwiseQuant.EXACT
    adds = [i for i, layer in zip(program.tiu, program.layer_names(Engine.TIU))
            if layer == conv.name and isinstance(i, ArTiu) and i.op == "add"]
    assert adds
    result = verify(model, "sg2260", CompileOptions(dtype="int8"))
    assert result["ok"], result["outputs"]


def test_a_symmetric_int8_depthwise_runs_pords_integer_form_and_is_exact():
    """Zero point 0 and int8 weights (--dtype int8 quantizes symmetrically): one pord.depthwise reads the
    int8 input and weights and the int32 bias (the bias past 2**24 needs no split) into int32 sums, no
    dequantisation to fp32; the program gives onnxruntime's integers."""
    from tpuflow.isa import ArTiu, Engine, PordTiu, Prec, RqDqTiu
    model = _depthwise_with_a_dead_channel()
    graph, program = compile_model(model, "sg2260", CompileOptions(dtype="int8"))
    conv = next(n for n in graph.nodes() if n.op_type == "Conv")
    mine = [i for i, layer in zip(program.tiu, program.layer_names(Engine.TIU)) if layer == conv.name]
    pords = [i for i in mine if isinstance(i, PordTiu)]
    assert pords and all((i.opt_opd0_prec, i.opt_opd1_prec, i.opt_opd2_prec, i.opt_res0_prec) ==
                         (Prec.INT8, Prec.INT8, Prec.INT32, Prec.INT32) for i in pords)
    assert not any(isinstance(i, ArTiu) and i.op == "add" for i in mine)
    assert not any(isinstance(i, RqDqTiu) and i.op == "dq0" for i in mine)
    result = verify(model, "sg2260", CompileOptions(dtype="int8"))
    (out,) = result["outputs"]
    assert result["ok"] and out["steps"] == 0, out


def _float_activation_between_convs():
    """x -> Conv -> HardSigmoid (no int8 form) -> Conv -> y: the quantizer puts a DequantizeLinear before the
    float op and a QuantizeLinear after it."""
    from onnx_build import ModelBuilder
    b = ModelBuilder(seed=6)
    c = b.node("Conv", [b.input("x", (1, 8, 12, 12)), b.weight("w1", (16, 8, 3, 3))], "c", kernel_shape=[3, 3],
               pads=[1, 1, 1, 1])
    s = b.node("HardSigmoid", [c], "s")
    b.output(b.node("Conv", [s, b.weight("w2", (8, 16, 3, 3))], "y", kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
    return b.model()


def test_a_float_op_between_int8_layers_keeps_its_float_tensors_in_lmem(monkeypatch):
    """The DequantizeLinear reads the Conv's int8 result and writes its fp16 result in LMEM, the QuantizeLinear
    reads its input there and writes its int8 result there (layer groups; the second Conv folds its kernel
    rows, copying them from LMEM): the first Conv, the DequantizeLinear, the float op and the QuantizeLinear
    move nothing over DDR; with layer groups off each float side round-trips DDR at 2 bytes an element (and
    the DequantizeLinear reads 16 x 12 x 12 int8 bytes). Both verify. (The HardSigmoid, kept float and not
    collapsed into a lookup table here, stands for any float op between int8 layers.)"""
    import tpuflow.frontend.lookup as lookup
    monkeypatch.setattr(lookup, "collapse_lookup_tables", lambda graph: graph)
    model = _float_activation_between_convs()
    graph, program = compile_model(model, "sg2260", CompileOptions(dtype="int8"))
    assert [n.name for n in graph.nodes() if n.op_type in ("DequantizeLinear", "HardSigmoid", "QuantizeLinear")] == [
        "x_QuantizeLinear", "c_DequantizeLinear", "hardsigmoid_1", "s_QuantizeLinear", "y_DequantizeLinear"]
    moved = layer_ddr_bytes(program)
    dq, q = "c_DequantizeLinear", "s_QuantizeLinear"
    assert dq not in moved and q not in moved and moved["conv_0"][1] == 0
    assert "hardsigmoid_1" not in moved
    _, separate = compile_model(model, "sg2260", CompileOptions(dtype="int8", layer_group="off"))
    assert layer_ddr_bytes(separate)[dq] == [16 * 144, 2 * 16 * 144]
    for options in (CompileOptions(dtype="int8"), CompileOptions(dtype="int8", layer_group="off")):
        result = verify(model, "sg2260", options)
        assert result["ok"], result["outputs"]


# ---------------------------------------------------------------- int8 <-> float boundaries in layer groups


def test_int8_float_boundaries_of_a_transformer_stay_in_lmem():
    """bert_layer at --dtype int8: every DequantizeLinear (alone or in a chain) writes its float result into
    LMEM for the float layer group that reads it (no DDR bytes written), every QuantizeLinear reads its
    float input there unless that is the graph input, and the quantizer's three QuantizeLinears of the
    input (one per projection, each after its own Reshape) run as one; the projections' int8 results stay
    in LMEM (one byte an element) for the DequantizeLinears; the program verifies."""
    from tpuflow import models
    from tpuflow.quantize import quantize
    qdq = quantize(models.build_model("bert_layer")).model
    graph, program = compile_model(qdq, "sg2260", CompileOptions(dtype="fp16"))
    moved = layer_ddr_bytes(program)
    boundaries = [n for n in graph.nodes() if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    of_input = [n.name for n in boundaries if n.op_type == "QuantizeLinear" and
                graph.producer(n.inputs[0]) is not None and graph.producer(n.inputs[0]).inputs[0] in graph.inputs]
    assert len(of_input) == 3 and sum(name in moved for name in of_input) == 1
    for node in boundaries:
        read, written = moved.get(node.name, [0, 0])
        assert written == 0 or node.op_type == "QuantizeLinear", (node.name, moved[node.name])
        assert read == 0 or node.name in of_input or node.op_type == "DequantizeLinear", (node.name, moved[node.name])
    projections = [n for n in graph.nodes() if n.op_type == "MatMul" and any(
        f"/{p}/" in n.name for p in ("query", "key", "value"))]
    assert len(projections) == 3 and all(moved[n.name][1] == 0 for n in projections)
    (group,) = program.layer_groups
    results = {graph.consumers(n.outputs[0])[0].outputs[0] for n in projections}      # after the bias Add
    assert results <= set(group["resident"]) and all(graph.tensor(t).quant.storage == "int8" for t in results)
    result = verify(qdq, "sg2260", CompileOptions(dtype="fp16"))
    assert result["ok"], result["outputs"]


def heads_of_a_quantized_projection():
    """x (1, 8, 32) -> Q/DQ -> Reshape (1, 8, 2, 16) -> Transpose (0, 2, 1, 3) -> MatMul by a float
    (1, 2, 16, 8) activation -> output: the Transpose of a dequantized tensor only a float MatMul reads."""
    from onnx import TensorProto as T, helper, numpy_helper
    n = helper.make_node
    inits = [numpy_helper.from_array(np.float32(0.02), "s"), numpy_helper.from_array(np.int8(3), "z"),
             numpy_helper.from_array(np.asarray([1, 8, 2, 16], np.int64), "shape")]
    nodes = [n("QuantizeLinear", ["x", "s", "z"], ["xq"]), n("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             n("Reshape", ["xd", "shape"], ["heads"]), n("Transpose", ["heads"], ["ht"], perm=[0, 2, 1, 3]),
             n("MatMul", ["ht", "b"], ["y"], name="scores")]
    graph = helper.make_graph(nodes, "heads", [helper.make_tensor_value_info("x", T.FLOAT, [1, 8, 32]),
                                               helper.make_tensor_value_info("b", T.FLOAT, [1, 2, 16, 8])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [1, 2, 8, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_transpose_only_a_float_matmul_reads_stays_float_and_folds_into_it():
    """The DequantizeLinear is not moved below that Transpose (the Reshape still runs on the integers): the
    lowering reads the MatMul's operand through the permutation instead of moving integers in DDR first."""
    from tpuflow.lowering.prepare import fold_matmul_transposes
    model = heads_of_a_quantized_projection()
    graph = load_graph_of(model)
    transpose = next(n for n in graph.nodes() if n.op_type == "Transpose")
    reshape = next(n for n in graph.nodes() if n.op_type == "Reshape")
    assert graph.tensor(transpose.outputs[0]).quant is None and graph.tensor(reshape.outputs[0]).quant is not None
    folded = next(n for n in fold_matmul_transposes(graph).nodes() if n.op_type == "MatMul")
    assert folded.attr("a_perm") == (0, 2, 1, 3)
    for dtype in ("fp32", "fp16"):
        result = verify(model, "sg2260", CompileOptions(dtype=dtype))
        assert result["ok"], result["outputs"]


def squeeze_then_folded_expand():
    """x -> 3x3 Conv -> squeeze 1x1 (16 channels) -> expand 3x3 (16 x 3 rows fold into one int8 weight block:
    it reads its input from DDR) and expand 1x1 -> channel Concat: the squeeze's result is read by a chain
    member that takes it from LMEM and one that reads it from DDR."""
    from onnx import TensorProto as T, helper
    rng = np.random.default_rng(23)
    w = _weight_maker(rng)
    n = helper.make_node
    nodes = [n("Conv", ["x", "w0", "b0"], ["c0"], name="stem", pads=[1, 1, 1, 1]), n("Relu", ["c0"], ["c0r"]),
             n("Conv", ["c0r", "ws", "bs"], ["s"], name="squeeze"), n("Relu", ["s"], ["sr"], name="squeeze_relu"),
             n("Conv", ["sr", "we3", "be3"], ["e3"], name="expand3x3", pads=[1, 1, 1, 1]),
             n("Conv", ["sr", "we1", "be1"], ["e1"], name="expand1x1"),
             n("Concat", ["e3", "e1"], ["y"], name="concat", axis=1)]
    inits = [w("w0", (32, 32, 3, 3), 0.1), w("b0", (32,), 0.1), w("ws", (16, 32, 1, 1)), w("bs", (16,), 0.1),
             w("we3", (32, 16, 3, 3), 0.1), w("be3", (32,), 0.1), w("we1", (32, 16, 1, 1)), w("be1", (32,), 0.1)]
    graph = helper.make_graph(nodes, "squeeze_fold", [helper.make_tensor_value_info("x", T.FLOAT, [1, 32, 12, 12])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [1, 64, 12, 12])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_folded_conv_copies_its_kernel_rows_from_its_held_input():
    """The 3x3 expand folds its kernel rows (16 channels x 3 rows in one int8 weight block): the chain it
    joins gives it the squeeze's result in LMEM, its row-shifted copies are LMEM -> LMEM DMAs (no DMA reads
    that tensor's DDR buffer); the integers are exact."""
    from tpuflow.lowering.quant import folds_kernel_rows
    model = quantize_float(squeeze_then_folded_expand())
    graph = load_graph_of(model)
    expand = next(n for n in graph.nodes() if n.name == "expand3x3")
    assert folds_kernel_rows(graph, expand)
    graph, program = compile_model(model, "sg2260", CompileOptions(dtype="fp32"))
    mine = [i for i, layer in zip(program.gdma, program.gdma_layers) if layer == expand.name]
    assert sum(is_lmem_to_lmem(i, program.chip) for i in mine) == 3          # one per kernel row
    buffer = program.memory.tensors.get(expand.inputs[0])
    if buffer is not None:
        assert not any(buffer.addr <= i.src_start_addr < buffer.addr + buffer.nbytes for i in mine)
    result = verify(model, "sg2260", CompileOptions(dtype="fp32"))
    assert result["ok"] and result["outputs"][0]["max_abs_err"] == 0.0, result["outputs"]


def is_lmem_to_lmem(instr, chip) -> bool:
    from tpuflow.isa.gdma import is_lmem
    return hasattr(instr, "dst_start_addr") and is_lmem(instr.src_start_addr, chip) and is_lmem(instr.dst_start_addr, chip)


def test_a_dequantized_matrix_a_column_split_takes_apart_is_written_in_parts():
    """gpt_block at --dtype int8: the fused QKV projection's DequantizeLinear writes each column part of its
    float result straight into the Split output's LMEM buffer (lowering.residency._column_splits), so the
    Split moves nothing; the program verifies."""
    from tpuflow import models
    from tpuflow.quantize import quantize
    qdq = quantize(models.build_model("gpt_block")).model
    graph, program = compile_model(qdq, "sg2260", CompileOptions(dtype="fp16"))
    split = next(n for n in graph.nodes() if n.op_type == "Split")
    assert graph.producer(split.inputs[0]).op_type == "DequantizeLinear"
    moved = layer_ddr_bytes(program)
    assert split.name not in moved and graph.producer(split.inputs[0]).name not in moved
    (group,) = program.layer_groups
    assert set(split.outputs) <= set(group["resident"])
    result = verify(qdq, "sg2260", CompileOptions(dtype="fp16"))
    assert result["ok"], result["outputs"]


def test_symmetric_activations_requantise_in_one_instruction():
    """Activations quantized symmetrically (zero point 0, as tpu-mlir deploys int8): each requantisation
    with no clamp inside the stored range is one quant.rq0 writing the saturated 8 bits (no rq1); at fp32
    the program still gives onnxruntime's integers."""
    model = quantized("cnn", "QDQ", True, "QInt8", (("ActivationSymmetric", True),))
    graph = load_graph_of(model)
    assert all(not np.any(graph.tensor(t).quant.zero_point) for t in graph.tensors
               if graph.tensor(t).quant is not None and not graph.tensor(t).is_const)
    _, program = compile_model(model, "sg2260", CompileOptions(dtype="fp32"))
    ops = [getattr(i, "op", None) for i in program.tiu if type(i).__name__ == "RqDqTiu"]
    assert ops.count("rq0") > 0 and ops.count("rq1") == 0, ops
    result = verify(model, "sg2260", CompileOptions(dtype="fp32"))
    assert result["ok"] and result["outputs"][0]["max_abs_err"] == 0.0, result["outputs"]


def test_a_product_whose_rows_take_several_steps_loads_its_weights_once():
    """4096 rows x 512 columns: the rows run in steps, and with K in one step each column step's weights are
    loaded once and kept for every row step (the weights' DDR bytes are read once, not once per row step,
    as BERT-base's FFN did: 5.7 times); the program verifies."""
    rows, k, n = 4096, 256, 512
    model = quantize_float(gemm_model(rows, k, n), count=2)
    graph, program = compile_model(model, "sg2260", CompileOptions(dtype="fp32"))
    first = next(node.name for node in graph.nodes() if node.op_type == "MatMul")
    weights = [i for i, layer in zip(program.gdma, program.gdma_layers) if layer == first and
               hasattr(i, "src_start_addr") and getattr(i, "dst_csize", 0) == k]
    assert sum(i.dst_wsize * i.dst_csize for i in weights) == k * n, [(i.dst_csize, i.dst_wsize) for i in weights]
    products = [i for i, layer in zip(program.tiu, program.tiu_layers) if layer == first and type(i).__name__ == "Mm2Tiu"]
    assert len(products) > len(weights) >= 1          # several row steps per loaded column of weights
    result = verify(model, "sg2260", CompileOptions(dtype="fp32"))
    assert result["ok"], result["outputs"]


def test_a_concat_output_held_by_a_chain_is_snapshot_after_its_placed_inputs_writers():
    """The fire module's 3x3 expand writes its result straight into the held Concat output: the held record
    (verify's stage-wise snapshot point) names that writer as well as the Concat, whose own copies need not
    wait for it (chain members overlap in the LMEM ring), so the snapshot holds both parts."""
    from tpuflow.compare import random_inputs
    from tpuflow.hwmodel.functional import run
    from tpuflow.stagewise import snapshot_points
    model = quantize_float(wide_fire_cnn())
    graph, program = compile_model(model, "sg2260", CompileOptions(dtype="fp32"))
    cat = next(n for n in graph.nodes() if n.op_type == "Concat")
    out = cat.outputs[0]
    _, layers = program.held_tensors[out]
    placed = [t for t in cat.inputs if graph.producer(t) is not None and graph.producer(t).name in layers]
    assert cat.name in layers and placed, layers
    points = snapshot_points(graph, program, [out, *placed])
    ours = run(program, random_inputs(graph, 0), race_check=False, snapshots=points)
    start = 0
    for t in cat.inputs:
        width = graph.tensor(t).shape[1]
        if t in placed:
            got = np.asarray(ours[out]).reshape(graph.tensor(out).shape)[:, start:start + width]
            assert np.array_equal(got, np.asarray(ours[t]).reshape(graph.tensor(t).shape)), t
        start += width
