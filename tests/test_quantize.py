"""--dtype int8 on a float model: onnxruntime's post-training quantizer (QDQ, seeded random
calibration or the user's npz files, only the kinds the int8 lowering computes) then the int8
lowering; the program holds int8 convolutions, verifies against onnxruntime on the quantized model,
and compiles deterministically; what the int8 lowering cannot compute is one clear error; the
record says how it was calibrated and which ops stayed float and why."""

from __future__ import annotations

import pytest

from tpuflow.errors import UserError
from tpuflow.isa import ConvTiu, Prec
from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model, verify


def test_a_float_cnn_at_int8_runs_int8_convolutions_and_verifies():
    result = verify("small_cnn", None, CompileOptions(dtype="int8"))
    assert result["ok"], result["outputs"]
    _, program = compile_model("small_cnn", None, CompileOptions(dtype="int8"))
    convs = [i for i in program.tiu if isinstance(i, ConvTiu)]
    assert convs and any(i.opt_opd0_prec == int(Prec.INT8) for i in convs)


def test_int8_compilation_is_deterministic(tmp_path):
    from tpuflow.codegen import write_program
    outputs = []
    for k in range(2):
        _, program = compile_model("mlp", None, CompileOptions(dtype="int8"))
        folder = tmp_path / str(k)
        write_program(program, folder, name="mlp")
        outputs.append({p.name: p.read_bytes() for p in folder.iterdir() if p.suffix != ".json"})
    assert outputs[0] == outputs[1]


def test_what_the_int8_lowering_cannot_compute_is_one_clear_error(monkeypatch):
    """An int8 lowering without MaxPool (what it refuses changes as it grows: the refusal rule
    itself is tested with the lowering) refuses the quantized pool by name, before lowering."""
    from tpuflow.lowering import quant
    monkeypatch.setattr(quant, "SUPPORTED", tuple(k for k in quant.SUPPORTED if k != "MaxPool"))
    with pytest.raises(UserError, match="node 'pool1' \\(MaxPool\\) on quantized tensors: the int8 lowering has no MaxPool"):
        compile_model("small_cnn", None, CompileOptions(dtype="int8"))


def _conv_times_pinned_scale():
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent / "e2e"))
    from onnx_build import ModelBuilder
    b = ModelBuilder(seed=61)
    x = b.node("Conv", [b.input("x", (1, 8, 12, 12)), b.weight("w", (8, 8, 3, 3))], "c", kernel_shape=[3, 3],
               pads=[1, 1, 1, 1])
    b.output(b.node("Mul", [b.node("Relu", [x], "r"), b.input("k", (1,))], "m"))
    return b.model()


def test_inputs_pinned_by_value_are_constants_of_the_quantized_model():
    from tpuflow.frontend.pinning import InputValue
    result = verify(_conv_times_pinned_scale(), None, CompileOptions(dtype="int8"),
                    input_shapes={"k": InputValue.parse("0.5")})
    assert result["ok"], result["outputs"]


def test_a_failure_of_the_quantizer_is_one_model_error(monkeypatch):
    import onnxruntime.quantization as ortq
    from tpuflow.errors import ModelError

    def broken(*args, **kwargs):
        raise ValueError("some internal quantizer failure")
    monkeypatch.setattr(ortq, "quantize_static", broken)
    with pytest.raises(ModelError, match="post-training quantizer failed.*some internal quantizer failure"):
        compile_model("mlp", None, CompileOptions(dtype="int8"))


# ------------------------------------------------------------------ calibration

import numpy as np  # noqa: E402

from tpuflow.errors import InputFileError, OptionError  # noqa: E402
from tpuflow.quantize import NO_INT8_FORM, PRODUCT_OF_ACTIVATIONS, quantize  # noqa: E402

IMAGE = (1, 3, 32, 32)       # small_cnn's input


def _npz_folder(folder, samples: int, scale: float = 1.0, seed: int = 0):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for k in range(samples):
        np.savez(folder / f"sample{k}.npz", image=(scale * rng.uniform(0, 1, IMAGE)).astype(np.float32))
    return folder


def _activation_scale(qdq, tensor: str) -> float:
    """The scale of the QuantizeLinear that quantizes `tensor` in a QDQ model."""
    from onnx import numpy_helper
    inits = {i.name: numpy_helper.to_array(i) for i in qdq.graph.initializer}
    node = next(n for n in qdq.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == tensor)
    return float(inits[node.input[1]])


def test_calibration_data_sets_the_activation_scales(tmp_path):
    """Inputs 4x larger give an input scale 4x larger (activations are asymmetric int8: the range
    [0, max] over 255 steps); the record names the files and hashes their contents."""
    small = quantize("small_cnn", data_dir=_npz_folder(tmp_path / "a", 3))
    large = quantize("small_cnn", data_dir=_npz_folder(tmp_path / "b", 3, scale=4.0))
    assert _activation_scale(large.model, "image") == pytest.approx(4 * _activation_scale(small.model, "image"),
                                                                    rel=1e-5)
    assert small.calibration["source"] == "npz" and small.calibration["samples"] == 3
    assert small.calibration["files"] == ["sample0.npz", "sample1.npz", "sample2.npz"]
    assert small.calibration["sha256"] != large.calibration["sha256"]


def test_the_number_of_random_samples_changes_the_scales():
    one, eight = quantize("small_cnn", samples=1), quantize("small_cnn")
    assert one.calibration == {"source": "random", "samples": 1, "seed": 0}
    assert _activation_scale(one.model, "image") != _activation_scale(eight.model, "image")


def _bad_folder(tmp_path, case: str):
    folder = tmp_path / case
    folder.mkdir()
    good = np.zeros(IMAGE, np.float32)
    arrays = {"missing_key": {}, "extra_key": {"image": good, "label": good},
              "wrong_shape": {"image": np.zeros((1, 3, 16, 16), np.float32)},
              "not_finite": {"image": np.full(IMAGE, np.nan, np.float32)},
              "text": {"image": np.full(IMAGE, "a")}}
    if case == "unreadable":
        (folder / "s.npz").write_bytes(b"not a zip file")
    elif case != "empty":
        np.savez(folder / "s.npz", **arrays[case])
    return folder


@pytest.mark.parametrize("case, pattern", [
    ("missing_key", r"s\.npz: no key 'image'"), ("extra_key", r"s\.npz: key 'label' is not an input"),
    ("wrong_shape", r"s\.npz: key 'image' has shape \[1, 3, 16, 16\], the model's input has \[1, 3, 32, 32\]"),
    ("not_finite", r"s\.npz: key 'image' holds NaN"), ("text", r"s\.npz: key 'image' holds <U1"),
    ("unreadable", r"s\.npz: not a readable \.npz file"), ("empty", r"empty: no \.npz files")])
def test_bad_calibration_data_is_one_error_naming_the_file_and_key(tmp_path, case, pattern):
    with pytest.raises(InputFileError, match=pattern) as info:
        quantize("small_cnn", data_dir=_bad_folder(tmp_path, case))
    assert "\n" not in str(info.value)


def test_calibration_options_only_with_int8_and_one_at_a_time():
    with pytest.raises(OptionError, match="--calibration: only with --dtype int8"):
        CompileOptions(dtype="fp16", calibration=4)
    with pytest.raises(OptionError, match="--calibration-data: only with --dtype int8"):
        CompileOptions(calibration_data="cal")
    with pytest.raises(OptionError, match="give one of them"):
        CompileOptions(dtype="int8", calibration=4, calibration_data="cal")
    with pytest.raises(OptionError, match="positive integer"):
        CompileOptions(dtype="int8", calibration=0)


def test_float_programs_record_the_options_they_always_did():
    """Calibration options appear in outputs only at --dtype int8, so float manifests and option
    fingerprints are what they were."""
    assert set(CompileOptions(dtype="fp16").as_dict()) == {"dtype", "matmul", "dep_mode", "schedule",
                                                           "time_limit_s", "layer_group"}
    assert CompileOptions(dtype="int8", calibration=4).as_dict()["calibration"] == 4
    assert "calibration" not in CompileOptions(dtype="int8", calibration_data="d").as_dict()


def test_npz_calibrated_compilation_is_deterministic_and_recorded(tmp_path):
    from tpuflow.codegen import read_program, write_program
    folder = _npz_folder(tmp_path / "cal", 2)
    outputs = []
    for k in range(2):
        _, program = compile_model("small_cnn", None, CompileOptions(dtype="int8", calibration_data=str(folder)))
        write_program(program, tmp_path / str(k), name="small_cnn")
        outputs.append({p.name: p.read_bytes() for p in (tmp_path / str(k)).iterdir()})
    assert outputs[0] == outputs[1]
    assert read_program(tmp_path / "0").quantization == program.quantization
    assert program.quantization["calibration"]["files"] == ["sample0.npz", "sample1.npz"]


# ------------------------------------------------------------------ which ops stay float

def _attention_like():
    """x -> MatMul(w) -> Softmax, and the product of two activations x @ x^T -> Tanh -> Add."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent / "e2e"))
    from onnx_build import ModelBuilder
    b = ModelBuilder(seed=5)
    x = b.input("x", (1, 8, 16))
    h = b.node("MatMul", [x, b.weight("w", (16, 16))], "h")
    b.output(b.node("Softmax", [h], "probs", axis=-1))
    xt = b.node("Transpose", [x], "xt", perm=[0, 2, 1])
    s = b.node("MatMul", [x, xt], "s")
    t = b.node("Tanh", [b.node("Add", [s, b.const("one", np.ones((1,), np.float32))], "s1")], "t")
    b.output(b.node("Add", [t, s], "y"))
    return b.model()


def test_the_ops_left_float_are_named_with_the_reason():
    result = quantize(_attention_like())
    reasons = {(f["op"], f["node"]): f["reason"] for f in result.float_ops}
    assert reasons == {("Softmax", "softmax_1"): NO_INT8_FORM, ("MatMul", "matmul_3"): PRODUCT_OF_ACTIVATIONS,
                       ("Tanh", "tanh_5"): NO_INT8_FORM, ("Add", "add_4"): "reads a float op's output (MatMul matmul_3)",
                       ("Add", "add_6"): "reads a float op's output (Tanh tanh_5)"}
    assert result.int8_ops == 1      # the weight MatMul


def test_the_quantized_model_is_deterministic():
    assert quantize("mlp", samples=2).model.SerializeToString() == quantize("mlp", samples=2).model.SerializeToString()


def test_int8_layers_are_measured_against_the_int8_rate():
    from tpuflow.chip import load_chip
    from tpuflow.pipeline import estimate
    report = estimate("small_cnn", None, CompileOptions(dtype="int8"))
    conv = next(r for r in report["layers"] if r["name"] == "block2/conv")
    peak = load_chip("sg2260").peak_macs_per_second("int8") / 1e6
    assert conv["utilisation"] == pytest.approx(conv["macs"] / (conv["time_us"] * peak), rel=1e-3)


@pytest.mark.slow
def test_an_old_model_listing_its_weights_as_inputs_quantizes():
    """DenseNet-121 of the ONNX model zoo: IR 3, every initializer also a graph input; its opset-9
    Unsqueezes of weights get Constant axes at opset 13, and onnxruntime's calibration session
    asked for a feed of each (\'Required inputs ... are missing\')."""
    result = quantize("densenet121", samples=1)
    assert result.int8_ops > 100
    assert [i.name for i in result.model.graph.input] == ["data_0"]


def _preactivation_block():
    """x -> BatchNormalization -> Relu -> Conv: a BN no Conv before it can absorb (DenseNet's)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent / "e2e"))
    from onnx_build import ModelBuilder
    b = ModelBuilder(seed=11)
    bn = b.node("BatchNormalization", [b.input("x", (1, 8, 10, 10)), b.weight("g", (8,), positive=True),
                                       b.weight("beta", (8,)), b.weight("mean", (8,)),
                                       b.weight("var", (8,), positive=True)], "bn", epsilon=1e-3)
    b.output(b.node("Conv", [b.node("Relu", [bn], "r"), b.weight("w", (8, 8, 3, 3))], "y", kernel_shape=[3, 3],
                    pads=[1, 1, 1, 1]))
    return b.model()


def test_a_batchnorm_without_a_conv_before_it_runs_in_int8_and_verifies():
    result = quantize(_preactivation_block())
    assert result.float_ops == ()
    ops = {n.name: n.op_type for n in result.model.graph.node}
    assert ops["batchnormalization_0/scale"] == "Mul" and ops["batchnormalization_0/shift"] == "Add"
    assert "BatchNormalization" not in ops.values()
    checked = verify(_preactivation_block(), None, CompileOptions(dtype="int8"))
    assert checked["ok"], checked["outputs"]
    assert checked["outputs"][0]["vs_float"]["cosine"] > 0.999


def test_an_op_left_float_by_a_float_input_names_that_input():
    """AlexNet's x -> LRN -> MaxPool -> Conv: the MaxPool reads the float LRN, so it stays float."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent / "e2e"))
    from onnx_build import ModelBuilder
    b = ModelBuilder(seed=13)
    lrn = b.node("LRN", [b.input("x", (1, 8, 8, 8))], "l", size=3)
    pool = b.node("MaxPool", [lrn], "p", kernel_shape=[2, 2], strides=[2, 2])
    b.output(b.node("Conv", [pool, b.weight("w", (8, 8, 3, 3))], "y", kernel_shape=[3, 3]))
    result = quantize(b.model())
    assert [(f["op"], f["node"], f["reason"]) for f in result.float_ops] == [
        ("LRN", "lrn_0", NO_INT8_FORM), ("MaxPool", "maxpool_1", "reads a float op's output (LRN lrn_0)")]
    assert result.int8_ops == 1


def test_long_float_op_lists_are_cut_in_text_and_counted_by_kind():
    from tpuflow.quantize import MAX_FLOAT_OP_LINES, float_op_lines
    ops = [{"op": "Softmax" if k % 3 else "LRN", "node": f"n{k}", "reason": NO_INT8_FORM}
           for k in range(MAX_FLOAT_OP_LINES + 5)]
    lines = float_op_lines({"calibration": {"source": "random", "samples": 8, "seed": 0}, "float_rest": "fp16",
                            "int8_ops": 2, "float_ops": ops})
    assert len(lines) == 1 + MAX_FLOAT_OP_LINES + 1
    kinds = [f["op"] for f in ops[MAX_FLOAT_OP_LINES:]]
    first, other = kinds[0], "LRN" if kinds[0] == "Softmax" else "Softmax"
    assert lines[-1].endswith(f"... 5 more ({first} {kinds.count(first)}, {other} {kinds.count(other)}; "
                              "--json lists all)")
    assert f"{len(ops)} stayed float" in lines[0]


def _gain_after_a_float_op():
    """x -> Sigmoid -> Mul(gain) -> MatMul -> Add(bias): the gain reads the float Sigmoid, the bias Add a
    quantized MatMul."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent / "e2e"))
    from onnx_build import ModelBuilder
    b = ModelBuilder(seed=5)
    s = b.node("Sigmoid", [b.input("x", (4, 32))], "s")
    g = b.node("Mul", [s, b.weight("gain", (32,))], "g")
    m = b.node("MatMul", [g, b.weight("w", (32, 16))], "m")
    b.output(b.node("Add", [m, b.weight("bias", (16,))], "y"))
    return b.model()


def test_an_elementwise_op_reading_a_float_result_stays_float():
    """In int8 the gain would need a QuantizeLinear of the Sigmoid's output and buy nothing (the float
    neighbour stays float): it is left float, named with its float input; the bias Add after the
    quantized MatMul stays int8 (the quantizer fuses the two into one Gemm), and the model verifies."""
    result = quantize(_gain_after_a_float_op())
    floats = {f["op"]: f for f in result.float_ops}
    assert set(floats) == {"Sigmoid", "Mul"}
    assert floats["Mul"]["reason"].startswith("reads a float op's output (Sigmoid")
    assert result.int8_ops == 1 and "Gemm" in [n.op_type for n in result.model.graph.node]
    checked = verify(_gain_after_a_float_op(), None, CompileOptions(dtype="int8"))
    assert checked["ok"], checked["outputs"]


def test_the_tile_path_says_which_int8_products_ran_on_the_tiu(capsys):
    """--matmul tile --dtype int8: the quantized products run on the TIU; estimate says so, in JSON and text."""
    from tpuflow import cli
    from tpuflow.estimate import matmul_path
    _, program = compile_model("small_cnn", "sg2260", CompileOptions(dtype="int8", matmul="tile"))
    path = matmul_path(program)
    assert path["int8_on_tiu"] == ["block1/conv", "block2/conv", "block3/conv", "fc"] and path["on_tile"] == []
    assert not program.tile
    assert matmul_path(compile_model("small_cnn", "sg2260", CompileOptions(dtype="fp16", matmul="tile"))[1]) == {}
    assert cli.main(["estimate", "small_cnn", "--dtype", "int8", "--matmul", "tile"]) == 0
    assert "matmul path    tile requested: 4 int8 product layers ran on the TIU, 0 on the TILE engine" in capsys.readouterr().out


def _rows_concat():
    """x (1, 4, 16) -> two MatMuls -> Concat along the last axis -> MatMul."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent / "e2e"))
    from onnx_build import ModelBuilder
    b = ModelBuilder(seed=9)
    x = b.input("x", (1, 4, 16))
    a = b.node("MatMul", [x, b.weight("wa", (16, 8))], "a")
    c = b.node("MatMul", [x, b.weight("wc", (16, 8))], "c")
    j = b.node("Concat", [a, c], "j", axis=2)
    b.output(b.node("MatMul", [j, b.weight("wy", (16, 10))], "y"))
    return b.model()


def test_a_concat_along_the_last_axis_runs_in_int8_and_verifies():
    """Its inputs have their own scales: requantised and placed along the axis (the tensors viewed as
    (rows, length, 1, 1): a channel Concat of the same bytes); was refused ('only channel Concat')."""
    result = quantize(_rows_concat())
    assert result.float_ops == () and result.int8_ops == 4
    checked = verify(_rows_concat(), None, CompileOptions(dtype="int8"))
    assert checked["ok"], checked["outputs"]


def _broadcast_add_before_a_float_op():
    """x -> Conv -> (its GlobalAveragePool broadcast back) Add -> Conv -> Sigmoid: an int8 Add (between
    int8 producers and an int8 reader) the lowering cannot emit (broadcasting)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent / "e2e"))
    from onnx_build import ModelBuilder
    b = ModelBuilder(seed=11)
    c = b.node("Conv", [b.input("x", (1, 4, 6, 6)), b.weight("w", (8, 4, 3, 3))], "c", kernel_shape=[3, 3])
    g = b.node("GlobalAveragePool", [c], "g")
    s = b.node("Add", [c, g], "s")
    b.output(b.node("Sigmoid", [b.node("Conv", [s, b.weight("w2", (4, 8, 1, 1))], "c2")], "y"))
    return b.model()


def test_a_node_the_int8_lowering_refuses_is_quantized_again_as_float():
    """The broadcasting Add the int8 lowering refuses stays float (excluded from onnxruntime's quantizer, and
    the frontend does not absorb it between its quantized neighbours), reported with the lowering's reason;
    the model compiles and verifies with its Convs and pool in int8."""
    from tpuflow.quantize import NOT_EMITTABLE
    result = quantize(_broadcast_add_before_a_float_op())
    (add,) = [f for f in result.float_ops if f["op"] == "Add"]
    assert add["reason"] == f"{NOT_EMITTABLE} (broadcasting elementwise int8 ops are not supported yet)"
    assert result.int8_ops == 3
    checked = verify(_broadcast_add_before_a_float_op(), None, CompileOptions(dtype="int8"))
    assert checked["ok"], checked["outputs"]


def _division_between_convs(named: bool = True):
    """x -> Conv -> Div by 6 -> Conv (the tail of a hard-swish); `named` False: the nodes have no names."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent / "e2e"))
    from onnx_build import ModelBuilder
    b = ModelBuilder(seed=12)
    c = b.node("Conv", [b.input("x", (1, 4, 8, 8)), b.weight("w1", (8, 4, 3, 3))], "c", kernel_shape=[3, 3])
    d = b.node("Div", [c, b.const("six", np.array(6.0, np.float32))], "d")
    b.output(b.node("Conv", [d, b.weight("w2", (4, 8, 3, 3))], "y", kernel_shape=[3, 3]))
    model = b.model()
    if not named:
        for n in model.graph.node:
            n.name = ""
    return model


@pytest.mark.parametrize("named", [True, False])
def test_a_division_by_a_constant_runs_in_int8_as_a_product(named):
    """Div has no int8 form; by a constant it is a Mul by the reciprocal, which has: the model runs
    wholly in int8 (no float op, no Div left) and verifies; unnamed nodes are named after their output."""
    result = quantize(_division_between_convs(named))
    ops = [n.op_type for n in result.model.graph.node]
    assert "Div" not in ops and ops.count("Mul") == 1 and result.float_ops == () and result.int8_ops == 3
    assert all(n.name for n in result.model.graph.node)
    checked = verify(_division_between_convs(named), None, CompileOptions(dtype="int8"))
    assert checked["ok"], checked["outputs"]


def _dense_with_a_row_bias():
    """x (4, 16) -> MatMul -> Add of a (1, 8) bias: a dense layer as tf2onnx writes it."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent / "e2e"))
    from onnx_build import ModelBuilder
    b = ModelBuilder(seed=3)
    m = b.node("MatMul", [b.input("x", (4, 16)), b.weight("w", (16, 8))], "m")
    b.output(b.node("Add", [m, b.const("bias", np.random.RandomState(0).randn(1, 8).astype(np.float32))], "y"))
    return b.model()


def test_a_dense_layers_row_bias_quantizes():
    """onnxruntime's quantizer fails on the (1, N) bias of the Gemm it fuses ('truth value of an array ...
    is ambiguous'); tpuflow hands it the bias as (N,), the same broadcast: int8, verifies."""
    result = quantize(_dense_with_a_row_bias())
    assert result.int8_ops == 1 and result.float_ops == ()
    checked = verify(_dense_with_a_row_bias(), None, CompileOptions(dtype="int8"))
    assert checked["ok"], checked["outputs"]


def _elementwise_between():
    """x -> Conv -> Mul(0.5) -> Erf -> Conv(a) and Conv -> Add(1) -> Relu -> Conv(b): the Mul's only reader
    is a float op (Erf), the Add and Relu sit between int8 Convs."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent / "e2e"))
    from onnx_build import ModelBuilder
    b = ModelBuilder(seed=4)
    c = b.node("Conv", [b.input("x", (1, 4, 6, 6)), b.weight("w", (8, 4, 1, 1))], "c")
    e = b.node("Erf", [b.node("Mul", [c, b.const("half", np.float32(0.5))], "m")], "e")
    b.output(b.node("Conv", [e, b.weight("wa", (4, 8, 1, 1))], "ya"))
    r = b.node("Relu", [b.node("Add", [c, b.const("one", np.float32(1.0))], "a")], "r")
    b.output(b.node("Conv", [r, b.weight("wb", (4, 8, 1, 1))], "yb"))
    return b.model()


def test_elementwise_ops_beside_float_ops_stay_float_and_between_int8_ops_stay_int8():
    """An elementwise op whose only reader is a float op would cost a QuantizeLinear / DequantizeLinear
    pair around it: it stays float; the Add and the Relu between int8 Convs stay int8."""
    result = quantize(_elementwise_between())
    floats = {f["op"]: f["reason"] for f in result.float_ops}
    assert floats == {"Erf": NO_INT8_FORM, "Mul": "its inputs or outputs stay float"}, floats
    assert result.int8_ops == 5         # three Convs, the Add and the Relu
    checked = verify(_elementwise_between(), None, CompileOptions(dtype="int8"))
    assert checked["ok"], checked["outputs"]


def _tanh_gelu_between_products():
    """x -> MatMul -> tanh-GELU written as elementwise pieces (0.5 x (1 + tanh(c (x + k x**3)))) -> MatMul."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent / "e2e"))
    from onnx_build import ModelBuilder
    b = ModelBuilder(seed=8)
    h = b.node("MatMul", [b.input("x", (1, 8, 16)), b.weight("w1", (16, 32))], "h")
    cube = b.node("Mul", [b.node("Mul", [h, h], "sq"), h], "cube")
    inner = b.node("Add", [h, b.node("Mul", [cube, b.const("k", np.float32(0.044715))], "kc")], "inner")
    t = b.node("Tanh", [b.node("Mul", [inner, b.const("c", np.float32(0.7978845))], "scaled")], "t")
    g = b.node("Mul", [b.node("Mul", [h, b.const("half", np.float32(0.5))], "hh"),
                       b.node("Add", [t, b.const("one", np.float32(1.0))], "t1")], "gelu")
    b.output(b.node("MatMul", [g, b.weight("w2", (32, 16))], "y"))
    return b.model()


def test_the_reader_rule_does_not_run_back_through_an_activations_pieces():
    """Only the piece a float op (Tanh) reads leaves int8 by the reader rule, and the pieces after the Tanh
    by the source rule; the pieces before it stay int8."""
    result = quantize(_tanh_gelu_between_products())
    floats = sorted(f["op"] for f in result.float_ops)
    assert floats == ["Add", "Mul", "Mul", "Tanh"], result.float_ops     # scaled, t1, gelu (and the Tanh)
    assert result.int8_ops == 7                                        # 2 MatMuls, sq, cube, kc, inner, hh
