"""verify's bound for quantized programs (issue 15, deliverable 5; tpuflow.pipeline.verify_program): the
reference is the quantized model as written with the program's float tensors rounded to its float type,
steps are counted on integer codes, and a float tail after quantized tensors is checked decomposed."""

from __future__ import annotations

import logging
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings, strategies as st
from onnx import TensorProto, helper, numpy_helper

import tpuflow.hwmodel.functional as functional
from tpuflow.compare import code_steps, codes, rounded_model, run_onnxruntime, stored_float_tensors
from tpuflow.frontend.quant import Quant
from tpuflow.options import CompileOptions
from tpuflow.pipeline import QUANT_STEPS_ALLOWED, REFERENCE_EXECUTIONS, load_graph, verify

sys.path[:0] = [str(Path(__file__).parent / "frontend"), str(Path(__file__).parent / "e2e")]


# ------------------------------------------------------------------ models

def halving_model():
    """x -> Div(2) -> QuantizeLinear(scale 1/64) -> DequantizeLinear -> y: the Div result is a float
    tensor the program stores at fp16, feeding a QuantizeLinear."""
    nodes = [helper.make_node("Div", ["x", "two"], ["half"]),
             helper.make_node("QuantizeLinear", ["half", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(1 / 64, np.float32), "s"),
             numpy_helper.from_array(np.array(0, np.int8), "z")]
    graph = helper.make_graph(nodes, "halving", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def mlp(softmax: bool, gain: float = 1.0, gemm: bool = False):
    """Float x(4,16) -> MatMul -> Relu -> MatMul, or Gemm with a bias (-> Softmax) -> y(4,10), seeded weights."""
    rng = np.random.RandomState(0)
    w1 = numpy_helper.from_array((rng.randn(16, 32) / 4).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.randn(32, 10) * gain / 4).astype(np.float32), "w2")
    b2 = numpy_helper.from_array((rng.randn(10) / 4).astype(np.float32), "b2")
    second = helper.make_node("Gemm", ["r", "w2", "b2"], ["logits" if softmax else "y"], name="fc") if gemm else \
        helper.make_node("MatMul", ["r", "w2"], ["logits" if softmax else "y"])
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]), second]
    if softmax:
        nodes.append(helper.make_node("Softmax", ["logits"], ["y"], axis=-1))
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 10])],
                              [w1, w2] + ([b2] if gemm else []))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def quantized(model):
    """`model` through onnxruntime's quantize_static: QDQ, int8, MatMul and Relu only (Softmax stays float)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{"x": np.random.RandomState(i).randn(4, 16).astype(np.float32)} for i in range(4)])

        def get_next(self):
            return next(self.batches, None)

    logging.getLogger().setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="tpuflow_verify_int8_") as tmp:
        onnx.save(model, Path(tmp) / "float.onnx")
        quantize_static(str(Path(tmp) / "float.onnx"), str(Path(tmp) / "q.onnx"), Reader(), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                        op_types_to_quantize=["MatMul", "Gemm", "Relu"])
        return onnx.load(str(Path(tmp) / "q.onnx"))


def corrupting_run(monkeypatch, change):
    """Make verify's functional-model run hand `change(outputs)` its outputs (a dict it edits)."""
    real = functional.run

    def run(program, inputs, **kwargs):
        outputs = real(program, inputs, **kwargs)
        change(outputs)
        return outputs
    monkeypatch.setattr(functional, "run", run)


# ------------------------------------------------------------------ 1. the reference

def test_reference_rounds_a_stored_float_tensor_before_its_quantizelinear():
    """Hand-checked: x = 3.14122 -> Div(2) = 1.57061 in fp32 (code round(100.519) = 101); at fp16 the
    Div result is 1.5703125 (spacing 2^-10 there), exactly 100.5 steps, a tie that rounds to even: 100.
    The reference with the Div output rounded gives 100 / 64, the fp32 model 101 / 64."""
    model = halving_model()
    graph = load_graph(model)
    assert stored_float_tensors(graph) == ["half", "y"]          # y: the dequantized output, written at fp16
    x = {"x": np.array([[3.14122, 1.0, -0.5, 0.25]], np.float32)}
    rounded = run_onnxruntime(rounded_model(model, ["half"], "fp16"), x, optimize=False)["y"]
    plain = run_onnxruntime(model, x, optimize=False)["y"]
    assert np.float16(np.float32(3.14122) / 2) == np.float16(1.5703125)
    assert rounded[0, 0] == np.float32(100 / 64) and plain[0, 0] == np.float32(101 / 64)
    assert np.array_equal(rounded[0, 1:], plain[0, 1:])           # representable values: no change


def test_reference_rounding_is_onnxruntimes_fp16_cast():
    """Every rounded tensor equals onnxruntime computing the op and casting the result to fp16."""
    model = halving_model()
    x = np.random.RandomState(1).uniform(-3, 3, (1, 4)).astype(np.float32)
    half = run_onnxruntime(rounded_model(model, ["half"], "fp16"), {"x": x}, optimize=False)
    from tpuflow.compare import with_outputs
    got = run_onnxruntime(with_outputs(rounded_model(model, ["half"], "fp16"), ["half"]), {"x": x}, optimize=False)["half"]
    assert np.array_equal(got, (x / np.float32(2)).astype(np.float16).astype(np.float32))
    codes_ref = np.clip(np.rint(got.astype(np.float64) * 64), -128, 127) / 64
    assert np.array_equal(half["y"], codes_ref.astype(np.float32))


def test_integer_ops_keep_their_float_results_unrounded():
    """DequantizeLinear -> MatMul -> QuantizeLinear runs in integers on the chip: no float tensor of
    it is rounded (only the dequantized output, which the program writes at fp16); the float Softmax
    tail after the int8 logits is."""
    assert stored_float_tensors(load_graph(quantized(mlp(softmax=False)))) == ["y"]     # the dequantized output
    tail = stored_float_tensors(load_graph(quantized(mlp(softmax=True))))
    assert "y" in tail and all("MatMul" not in name and name not in ("h", "r") for name in tail)


def residual_model():
    """x -> QuantizeLinear -> DequantizeLinear -> d; d -> Softmax (a float op: d is stored at the float
    type) and d + d -> QuantizeLinear (an integer Add reading the codes) -> two dequantized outputs."""
    s, z = numpy_helper.from_array(np.array(0.0123, np.float32), "s"), numpy_helper.from_array(np.array(0, np.int8), "z")
    so = numpy_helper.from_array(np.array(0.0311, np.float32), "so")
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
             helper.make_node("Softmax", ["d"], ["f"], axis=-1),
             helper.make_node("QuantizeLinear", ["f", "s", "z"], ["fq"]),
             helper.make_node("DequantizeLinear", ["fq", "s", "z"], ["y1"]),
             helper.make_node("Add", ["d", "d"], ["sum"]),
             helper.make_node("QuantizeLinear", ["sum", "so", "z"], ["sq"]),
             helper.make_node("DequantizeLinear", ["sq", "so", "z"], ["y2"])]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 64]) for n in ("y1", "y2")]
    graph = helper.make_graph(nodes, "residual", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              outs, [s, z, so])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_integer_op_reads_the_unrounded_value_of_a_stored_float_tensor():
    """d is stored at fp16 for the Softmax, but the Add between DequantizeLinear and QuantizeLinear
    runs on the int8 codes: the reference feeds the Softmax the rounded d and the Add the exact one,
    and verify at fp16 passes end to end with equal codes."""
    from tpuflow.compare import integer_readers
    model = residual_model()
    graph = load_graph(model)
    assert "d" in stored_float_tensors(graph)
    assert integer_readers(graph) == {5}                                  # the Add, not the Softmax
    rounded = rounded_model(model, ["d"], "fp16", integer_readers(graph))
    reads = {n.op_type: list(n.input) for n in rounded.graph.node if n.op_type in ("Softmax", "Add")}
    assert reads == {"Softmax": ["d"], "Add": ["d/fp32", "d/fp32"]}
    result = verify(model, "sg2260", CompileOptions(dtype="fp16"))
    row = {r["name"]: r for r in result["outputs"]}["y2"]
    assert result["ok"] and row["steps"] == 0 and "stage-wise" not in row["check"]


# ------------------------------------------------------------------ 2. steps on integer codes

@settings(max_examples=300, deadline=None)
@given(scale_exp=st.floats(-23.5, 8.0), zero=st.integers(-128, 127), q=st.integers(-128, 127),
       delta=st.integers(-5, 5))
def test_codes_of_an_fp16_dequantized_output_are_its_integers(scale_exp, zero, q, delta):
    """code = round(y / scale) + zero point recovers the integer from the fp16-rounded dequantized value
    (scale > 2^-24, |y| within fp16), and integers k apart count k steps."""
    scale = np.float32(2.0 ** scale_exp)
    quant = Quant(np.array(scale, np.float32), np.array(zero, np.int8), None, "int8")
    other = int(np.clip(q + delta, -128, 127))
    values = [np.float32(scale) * np.float32(v - zero) for v in (q, other)]
    if max(abs(v) for v in values) > 65504:
        return
    y16 = np.array([values[0]], np.float32).astype(np.float16)
    assert codes(y16, quant)[0] == q
    theirs = codes(np.array([values[1]], np.float32), quant)
    assert code_steps(codes(y16, quant), theirs) == abs(other - q)


@settings(max_examples=100, deadline=None)
@given(scales=st.lists(st.floats(2.0 ** -20, 4.0), min_size=3, max_size=3),
       zeros=st.lists(st.integers(0, 255), min_size=3, max_size=3), seed=st.integers(0, 2 ** 16))
def test_per_channel_codes_use_each_channels_scale(scales, zeros, seed):
    quant = Quant(np.array(scales, np.float32), np.array(zeros, np.uint8), 1, "uint8")
    q = np.random.RandomState(seed).randint(0, 256, (2, 3, 4))
    y = ((q - np.array(zeros).reshape(1, 3, 1)) * np.array(scales, np.float32).reshape(1, 3, 1)).astype(np.float32)
    y16 = y.astype(np.float16)
    if np.all(np.isfinite(y16)):
        assert np.array_equal(codes(y16, quant), q)
    assert codes(y16, quant, axis_ok=False) is None


# ------------------------------------------------------------------ verify on quantized programs

@pytest.fixture(scope="module")
def qdq_mlp():
    return quantized(mlp(softmax=False))


@pytest.fixture(scope="module")
def qdq_softmax():
    return quantized(mlp(softmax=True, gain=8.0))


def test_quantized_mlp_verifies_on_codes(qdq_mlp):
    result = verify(qdq_mlp, "sg2260", CompileOptions(dtype="fp16"))
    (out,) = result["outputs"]
    assert result["ok"] and out["steps_counted_on"] == "integer codes" and out["steps"] <= QUANT_STEPS_ALLOWED
    assert out["check"] == "steps on integer codes"
    assert {"vs_qdq_fp32", "vs_other_execution"} <= set(out)
    assert {out["reference"], out["vs_other_execution"]["reference"]} == set(REFERENCE_EXECUTIONS.values())


@pytest.mark.parametrize("flip, ok", [(3, False), (-3, False), (1, True)])
def test_an_output_integer_moved_by_three_fails(qdq_mlp, monkeypatch, flip, ok):
    """One output integer moved by `flip` codes in the functional model's result: 3 fails the
    2-step bound, 1 passes (the program is otherwise exact on this model)."""
    step = verify(qdq_mlp, "sg2260", CompileOptions(dtype="fp16"))["outputs"][0]["quant_step"]

    def change(outputs):
        y = outputs["y"].astype(np.float32)
        y[1, 2] += flip * step
        outputs["y"] = y.astype(outputs["y"].dtype)
    corrupting_run(monkeypatch, change)
    result = verify(qdq_mlp, "sg2260", CompileOptions(dtype="fp16"))
    (out,) = result["outputs"]
    assert out["steps"] == abs(flip) and result["ok"] is ok and out["ok"] is ok


@pytest.mark.parametrize("moved", [(True,), (False,), (False, True)])
def test_an_output_passes_against_either_onnxruntime_execution_not_neither(qdq_mlp, monkeypatch, moved):
    """onnxruntime's executions with `moved` optimize flags return the output moved by 3 codes: the
    program passes against the other one (named in the row), and fails when both are moved."""
    import tpuflow.compare as compare_module
    step = verify(qdq_mlp, "sg2260", CompileOptions(dtype="fp16"))["outputs"][0]["quant_step"]
    real = compare_module.run_onnxruntime

    def shifted(model, feeds, optimize=True):
        outputs = real(model, feeds, optimize)
        if optimize in moved and "y" in outputs:
            outputs["y"] = outputs["y"] + np.float32(3 * step)
        return outputs
    monkeypatch.setattr(compare_module, "run_onnxruntime", shifted)
    result = verify(qdq_mlp, "sg2260", CompileOptions(dtype="fp16"))
    (out,) = result["outputs"]
    assert result["ok"] is (len(moved) == 1)
    if len(moved) == 1:
        assert out["reference"] == REFERENCE_EXECUTIONS[not moved[0]]
        # 3 codes from ours, or more where that execution already differed (a machine's integer kernels)
        assert out["vs_other_execution"]["ok"] is False and out["vs_other_execution"]["steps"] >= 3
        assert out["executions_apart"]["steps"] >= 3            # onnxruntime against itself


def test_a_boundary_stored_by_its_fused_group_is_read_from_ddr():
    """The quantized logits of a Gemm with a bias are made by a fused group whose instructions carry
    the anchor's name, not the bias node's: verify still reads them from DDR (was: 'kept out of DDR')."""
    from tpuflow.pipeline import _ddr_readable, _float_tails, compile_model
    graph, program = compile_model(quantized(mlp(softmax=True, gemm=True)), "sg2260", CompileOptions(dtype="fp16"))
    (boundary,) = _float_tails(graph)["y"]
    producer = graph.producer(boundary).name
    assert producer not in set(program.gdma_layers)          # stored under another name of its group
    assert _ddr_readable(graph, program, {boundary}) == {boundary}


def _softmax16(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float16)


def _boundary(qdq_softmax):
    graph = load_graph(qdq_softmax)
    (name,) = [t.name for t in graph.tensors.values() if t.quant is not None and "logits" in t.name and not t.is_const]
    return name, graph.tensor(name).quant


@pytest.mark.parametrize("codes_moved, ok", [(2, True), (3, False)])
def test_float_tail_is_checked_from_the_programs_boundary(qdq_softmax, monkeypatch, codes_moved, ok):
    """The int8 logit whose probability is nearest 0.5 moved by 2 codes, and the Softmax recomputed from
    the moved logits: the probabilities fail the fp16 bound directly (dp = p (1 - p) dz), but the
    boundary is within 2 steps and the tail on it is right, so the output passes decomposed; moved
    by 3 the boundary fails."""
    name, quant = _boundary(qdq_softmax)

    def change(outputs):
        logits = outputs[name].astype(np.int64)
        probs = outputs["y"].astype(np.float32)
        row, col = np.unravel_index(np.argmin(np.abs(probs - 0.5)), probs.shape)     # the most sensitive one
        logits[row, col] = min(127, logits[row, col] + codes_moved) if logits[row, col] + codes_moved <= 127 \
            else logits[row, col] - codes_moved
        outputs[name] = logits.astype(outputs[name].dtype)
        real = (logits - int(quant.zero_point)) * np.float32(quant.scale)
        outputs["y"] = _softmax16(real.astype(np.float32).astype(np.float16)).astype(outputs["y"].dtype)
    corrupting_run(monkeypatch, change)
    (out,) = verify(qdq_softmax, "sg2260", CompileOptions(dtype="fp16"))["outputs"]
    tail = out["tail_check"]
    assert tail["boundary_values"] == "program (read from DDR)" and "boundary read from the program's DDR" in out["check"]
    assert out["max_rel_err"] > 2e-2                     # the direct check fails
    assert tail["tail"]["ok"] and tail["boundary"][0]["steps"] == codes_moved
    assert out["ok"] is ok and tail["ok"] is ok


def test_a_wrong_float_tail_fails(qdq_softmax, monkeypatch):
    """The program's logits untouched, its probabilities 5% off on one row: the direct check and the
    decomposed one both fail (the tail fed with the program's own boundary disagrees)."""
    def change(outputs):
        y = outputs["y"].astype(np.float32)
        y[0] *= 1.05
        outputs["y"] = y.astype(outputs["y"].dtype)
    corrupting_run(monkeypatch, change)
    result = verify(qdq_softmax, "sg2260", CompileOptions(dtype="fp16"))
    (out,) = result["outputs"]
    assert not result["ok"] and not out["tail_check"]["tail"]["ok"]
    assert all(b["ok"] for b in out["tail_check"]["boundary"])


# ------------------------------------------------------------------ 5. uint8 activations in the optimized execution

def full_range_uint8_cnn():
    """quant_models' CNN by quantize_static: per-channel int8 weights of the full range [-127, 127] and
    uint8 activations (no reduce_range), the form whose uint8 x int8 kernels saturate without VNNI."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from quant_models import MODELS, RandomReader
    logging.getLogger().setLevel(logging.ERROR)
    reader = type("Reader", (RandomReader, CalibrationDataReader), {})(MODELS["cnn"]())
    with tempfile.TemporaryDirectory(prefix="tpuflow_u8_") as tmp:
        onnx.save(MODELS["cnn"](), Path(tmp) / "float.onnx")
        quantize_static(str(Path(tmp) / "float.onnx"), str(Path(tmp) / "q.onnx"), reader, quant_format=QuantFormat.QDQ,
                        per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
        return onnx.load(str(Path(tmp) / "q.onnx"))


def test_signed_activations_keep_every_value():
    """The int8 copy computes what the uint8 model computes, as written (float DequantizeLinear -> op ->
    QuantizeLinear: no integer kernel), every output and every shifted tensor read back as uint8."""
    from tpuflow.compare import random_inputs, signed_activations, unshifted, with_outputs
    model = full_range_uint8_cnn()
    signed, shifted = signed_activations(model)
    assert shifted and all(t.data_type == TensorProto.INT8 for t in signed.graph.initializer if t.name.endswith("/int8"))
    names = [o.name for o in model.graph.output] + sorted(shifted)
    feeds = random_inputs(load_graph(model), 3)
    plain = run_onnxruntime(with_outputs(model, names), feeds, optimize=False)
    moved = unshifted(run_onnxruntime(with_outputs(signed, names), feeds, optimize=False), shifted)
    for name in names:
        assert plain[name].dtype == moved[name].dtype and np.array_equal(plain[name], moved[name]), name
    assert any(plain[name].dtype == np.uint8 for name in shifted)


def test_signed_activations_leave_uint8_weights_and_qoperator_models_alone():
    from quant_models import quantized as quantized_model
    from tpuflow.compare import signed_activations
    qoperator = quantized_model("cnn", "QOperator", True, "QUInt8")
    assert signed_activations(qoperator) == (qoperator, set())
    from test_conv_weight_zero_points import quantize_uint8_weights, small_cnn
    uint8_weights = quantize_uint8_weights(small_cnn(), "QDQ", False, False)
    assert signed_activations(uint8_weights) == (uint8_weights, set())


def test_full_range_uint8_model_matches_the_optimized_execution_exactly():
    """The program's integers equal onnxruntime's fused kernels run on the int8 copy (exact on any x86)."""
    result = verify(full_range_uint8_cnn(), "sg2260", CompileOptions(dtype="fp32"))
    (out,) = result["outputs"]
    rows = [out, out["vs_other_execution"]]
    optimized = next(r for r in rows if r["reference"] == REFERENCE_EXECUTIONS[True])
    assert result["ok"] and optimized["steps"] == 0, out


# ------------------------------------------------------------------ 6. rule 4: stage-wise (teacher-forced) check

SEPARATE = CompileOptions(dtype="fp32")


@pytest.fixture(scope="module")
def qdq_cnn():
    """quant_models' CNN (two Conv + pool stages, a Gemm) as a QDQ int8 model: 4 of its 8 quantized tensors
    are stored in DDR, 3 are held in LMEM by an int8 chain."""
    from quant_models import quantized as quantized_model
    return quantized_model("cnn", "QDQ", True, "QInt8")


def _stages(model, options=SEPARATE):
    from tpuflow.compare import random_inputs
    from tpuflow.pipeline import _quantized_produced, compile_model
    from tpuflow.stagewise import as_onnx_tensor, snapshot_points
    graph, program = compile_model(model, "sg2260", options)
    inputs = random_inputs(graph, 0)
    points = snapshot_points(graph, program, _quantized_produced(graph))
    ran = functional.run(program, inputs, snapshots=points)
    return graph, inputs, points, {k: as_onnx_tensor(graph, k, v) if k in points else v for k, v in ran.items()}


def test_snapshots_are_the_stored_quantized_tensors(qdq_cnn):
    """Each snapshot is the tensor the program stored in DDR or its int8 chain holds in LMEM (this
    program is exact on the CNN: onnxruntime's integers, 0 steps), taken when its producer finished,
    whether or not a later tensor reuses the memory."""
    from tpuflow.compare import with_outputs
    from tpuflow.pipeline import _ddr_readable, _in_program_floats, _quantized_produced, compile_model
    graph, inputs, points, ours = _stages(qdq_cnn)
    from tpuflow.isa import LocalTensor
    assert len(points) == 7 and set(points) <= set(_quantized_produced(graph))
    assert sum(isinstance(target, LocalTensor) for _, target in points.values()) == 5      # held by the chain
    _, program = compile_model(qdq_cnn, "sg2260", SEPARATE)
    assert set(points) - _ddr_readable(graph, program, set(points))     # one is overwritten by the end
    ref = run_onnxruntime(with_outputs(qdq_cnn, list(points)), _in_program_floats(inputs, "fp32"), optimize=True)
    for name in points:
        assert ours[name].dtype == ref[name].dtype and np.array_equal(ours[name], ref[name]), name


def _move_end_to_end_references(monkeypatch, codes: int, step: float):
    """onnxruntime's full runs (not the teacher-forced ones, whose outputs end in '/stage') return y moved."""
    import tpuflow.compare as compare_module
    real = compare_module.run_onnxruntime

    def moved(model, feeds, optimize=True):
        outputs = real(model, feeds, optimize)
        if "y" in outputs and not any(o.name.endswith("/stage") for o in model.graph.output):
            outputs["y"] = outputs["y"] + np.float32(codes * step)
        return outputs
    monkeypatch.setattr(compare_module, "run_onnxruntime", moved)


def test_rule4_passes_an_output_whose_every_stage_is_within_bound(qdq_cnn, monkeypatch):
    """Both executions end 3 codes from the program (as compounded one-step differences do), while every
    stored stage recomputed from the program's own inputs to it is exact: the row passes by rule 4 and
    keeps its end-to-end numbers."""
    step = verify(qdq_cnn, "sg2260", SEPARATE)["outputs"][0]["quant_step"]
    _move_end_to_end_references(monkeypatch, 3, step)
    result = verify(qdq_cnn, "sg2260", SEPARATE)
    (out,) = result["outputs"]
    assert result["ok"] and out["ok"] and out["steps"] == 3
    assert out["check"].startswith("stage-wise") and out["stage_check"]["ok"]
    assert out["stage_check"]["stages"] >= 2 and out["stage_check"]["worst_stage"]["steps"] == 0
    assert out["stage_check"]["output_from_stages"]["steps"] == 0


def test_rule4_fails_and_names_a_stage_three_codes_off(qdq_cnn, monkeypatch):
    """The same, with one stored intermediate tensor 3 codes off in the program: rule 4 names it and fails."""
    from tpuflow.pipeline import STAGE_PREFIX
    graph, _, points, _ = _stages(qdq_cnn)
    inner = next(t for t in points if t not in graph.outputs and graph.consumers(t))
    step = verify(qdq_cnn, "sg2260", SEPARATE)["outputs"][0]["quant_step"]
    _move_end_to_end_references(monkeypatch, 3, step)

    def change(outputs):
        key = STAGE_PREFIX + inner
        outputs[key] = np.clip(outputs[key].astype(np.int16) + 3, -128, 127).astype(outputs[key].dtype)
    corrupting_run(monkeypatch, change)
    result = verify(qdq_cnn, "sg2260", SEPARATE)
    (out,) = result["outputs"]
    assert not result["ok"] and not out["stage_check"]["ok"]
    assert inner in out["stage_check"]["stages_over_bound"]
    assert out["stage_check"]["worst_stage"]["steps"] >= 3
