"""`--dtype int8` on the command line: --calibration / --calibration-data / --emit-qdq on compile,
estimate, verify and report; the emitted QDQ model is the one compiled and the one verify compares
against; the ops left float appear in every output; bad input is one line and exit 2."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from tpuflow import cli

IMAGE = (1, 3, 32, 32)       # small_cnn's input


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _onnxruntime(model, inputs: dict) -> dict:
    import onnxruntime as ort
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, inputs)))


def _npz_folder(folder, scale: float):
    folder.mkdir()
    rng = np.random.default_rng(3)
    for k in range(2):
        np.savez(folder / f"s{k}.npz", image=(scale * rng.uniform(0, 1, IMAGE)).astype(np.float32))
    return folder


def _input_scale(path) -> float:
    from onnx import numpy_helper
    model = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    node = next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "image")
    return float(inits[node.input[1]])


def test_calibration_data_changes_the_scales_of_the_emitted_model(capsys, tmp_path):
    for name, scale in (("a", 1.0), ("b", 3.0)):
        code, _, err = run(capsys, "compile", "small_cnn", "--dtype", "int8", "-o", tmp_path / f"out_{name}",
                           "--calibration-data", _npz_folder(tmp_path / name, scale), "--emit-qdq", tmp_path / f"{name}.onnx")
        assert code == 0, err
    assert _input_scale(tmp_path / "b.onnx") == pytest.approx(3 * _input_scale(tmp_path / "a.onnx"), rel=1e-5)
    manifest = json.loads((tmp_path / "out_b" / "manifest.json").read_text())
    assert manifest["quantization"]["calibration"]["files"] == ["s0.npz", "s1.npz"]


def test_calibration_count_reaches_the_manifest_and_changes_the_program(capsys, tmp_path):
    for n in ("1", "8"):
        assert run(capsys, "compile", "small_cnn", "--dtype", "int8", "--calibration", n, "-o", tmp_path / n)[0] == 0
    one, eight = (json.loads((tmp_path / n / "manifest.json").read_text()) for n in ("1", "8"))
    assert one["quantization"]["calibration"] == {"samples": 1, "seed": 0, "source": "random"}
    assert one["files"]["weights"]["sha256"] != eight["files"]["weights"]["sha256"]   # other scales, other biases


def test_the_emitted_model_is_the_one_compiled(capsys, tmp_path):
    """Compiling the emitted QDQ model (at the float rest's dtype) gives the same binaries."""
    assert run(capsys, "compile", "small_cnn", "--dtype", "int8", "-o", tmp_path / "int8",
               "--emit-qdq", tmp_path / "q.onnx")[0] == 0
    assert run(capsys, "compile", tmp_path / "q.onnx", "--dtype", "fp16", "-o", tmp_path / "qdq")[0] == 0
    ours, theirs = (sorted(p for p in (tmp_path / d).iterdir() if p.suffix != ".json") for d in ("int8", "qdq"))
    assert len(ours) == len(theirs) == 4
    assert [p.read_bytes() for p in ours] == [p.read_bytes() for p in theirs]


@pytest.mark.parametrize("model, output, int8_ops", [("small_cnn", "logits", 10), ("mlp", "probs", 5)])
def test_verify_compares_against_the_emitted_model_and_reports_the_float_error(capsys, tmp_path, model, output,
                                                                              int8_ops):
    """onnxruntime on the emitted file as written (optimizations off), fed verify's inputs as the chip
    reads them and with the float tensors the program stores rounded to the fp16 of the float rest
    (quantized output or float softmax alike), reproduces verify's reference: its error against the
    float model is exactly verify's `qdq_vs_float`."""
    from tpuflow.compare import compare, random_inputs, rounded_model, run_onnxruntime, stored_float_tensors
    from tpuflow.pipeline import _in_program_floats, load_graph
    code, out, err = run(capsys, "verify", model, "--dtype", "int8", "--json", "--emit-qdq", tmp_path / "q.onnx")
    assert code == 0, err
    result = json.loads(out)
    (row,) = result["outputs"]
    float_graph = load_graph(model)
    inputs = random_inputs(float_graph, 0)
    float_ref = _onnxruntime(float_graph.model, inputs)[output]
    qdq = onnx.load(str(tmp_path / "q.onnx"))
    reference = rounded_model(qdq, stored_float_tensors(load_graph(qdq)), "fp16")
    emitted = run_onnxruntime(reference, _in_program_floats(inputs, "fp16"), optimize=False)[output]
    assert compare(output, emitted, float_ref).max_abs_err == pytest.approx(row["qdq_vs_float"]["max_abs_err"],
                                                                            rel=1e-12)
    assert 0.99 < row["vs_float"]["cosine"] <= 1.0 and row["vs_float"]["max_abs_err"] > 0
    assert result["quantization"]["int8_ops"] == int8_ops


def test_verify_text_shows_the_float_model_error(capsys):
    code, out, _ = run(capsys, "verify", "mlp", "--dtype", "int8", "--calibration", "2")
    assert code == 0
    assert "(fingerprint" in out and "int8, the rest fp16" in out
    assert "calibrated on 2 seeded random inputs (seed 0): 5 ops int8, 1 stayed float (fp16)" in out
    assert "Softmax probs: no int8 form" in out
    assert "against onnxruntime on the float model" in out


SOFTMAX_FLOAT = {"node": "probs", "op": "Softmax", "reason": "no int8 form"}


def test_the_ops_left_float_in_estimate_report_and_manifest(capsys, tmp_path):
    code, out, _ = run(capsys, "estimate", "mlp", "--dtype", "int8", "--json")
    assert code == 0 and json.loads(out)["quantization"]["float_ops"] == [SOFTMAX_FLOAT]
    code, out, _ = run(capsys, "estimate", "mlp", "--dtype", "int8")
    assert code == 0 and "  float        Softmax probs: no int8 form" in out.splitlines()
    assert run(capsys, "report", "mlp", "--dtype", "int8", "-o", tmp_path / "r.html")[0] == 0
    html = (tmp_path / "r.html").read_text()
    assert 'id="float-ops-table"' in html and "<td class=\"l\">Softmax</td><td class=\"l\">probs</td>" in html
    code, out, _ = run(capsys, "compile", "mlp", "--dtype", "int8", "-o", tmp_path / "c")
    assert code == 0 and "Softmax probs: no int8 form" in out
    assert json.loads((tmp_path / "c" / "manifest.json").read_text())["quantization"]["float_ops"] == [SOFTMAX_FLOAT]


def test_float_runs_carry_no_quantization_record(capsys, tmp_path):
    code, out, _ = run(capsys, "estimate", "mlp", "--dtype", "fp16", "--json")
    assert code == 0 and "quantization" not in json.loads(out)
    assert run(capsys, "report", "mlp", "-o", tmp_path / "r.html")[0] == 0
    assert 'id="int8"' not in (tmp_path / "r.html").read_text()


def _bad_npz(tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    np.savez(folder / "one.npz", image=np.zeros((1, 3, 8, 8), np.float32))
    return folder


ERRORS = [
    (lambda t: ["estimate", "small_cnn", "--dtype", "int8", "--calibration-data", _bad_npz(t)],
     "one.npz: key 'image' has shape [1, 3, 8, 8]"),
    (lambda t: ["estimate", "small_cnn", "--dtype", "int8", "--calibration-data", t / "nowhere"], "no such folder"),
    (lambda t: ["compile", "small_cnn", "--dtype", "int8", "--calibration", "2", "--calibration-data", t, "-o", t / "o"],
     "give one of them"),
    (lambda t: ["verify", "small_cnn", "--calibration", "2"], "--calibration: only with --dtype int8"),
    (lambda t: ["report", "small_cnn", "--emit-qdq", t / "q.onnx", "-o", t / "r.html"], "--emit-qdq: only with --dtype int8"),
    (lambda t: ["estimate", "small_cnn", "--dtype", "int8", "--calibration", "0"], "must be a positive integer"),
    (lambda t: ["estimate", "small_cnn", "--dtype", "int8", "--emit-qdq", t / "no" / "q.onnx"], "its folder does not exist"),
]


@pytest.mark.parametrize("argv, message", ERRORS)
def test_bad_int8_options_are_one_line_and_exit_2(capsys, tmp_path, argv, message):
    code, out, err = run(capsys, *argv(tmp_path))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("tpuflow: error: ") and message in err
    assert not (tmp_path / "o").exists() and not (tmp_path / "r.html").exists()


def test_bad_calibration_data_with_json_is_an_error_document(capsys, tmp_path):
    code, out, err = run(capsys, "estimate", "small_cnn", "--dtype", "int8", "--calibration-data", _bad_npz(tmp_path),
                         "--json")
    doc = json.loads(out)
    assert code == 2 and doc["ok"] is False and err.count("\n") == 1
    assert doc["error"]["type"] == "InputFileError" and "one.npz: key 'image'" in doc["error"]["message"]


def test_inspect_counts_quantized_products_at_the_int8_rate(capsys, tmp_path):
    from tpuflow.chip import load_chip
    assert run(capsys, "estimate", "small_cnn", "--dtype", "int8", "--emit-qdq", tmp_path / "q.onnx")[0] == 0
    code, out, _ = run(capsys, "inspect", tmp_path / "q.onnx", "--dtype", "fp16", "--json")
    quantized = json.loads(out)
    code, out, _ = run(capsys, "inspect", "small_cnn", "--dtype", "fp16", "--json")
    float_model = json.loads(out)
    chip = load_chip("sg2260")
    assert quantized["int8_macs"] == quantized["macs"] == float_model["macs"] and float_model["int8_macs"] == 0
    assert quantized["compute_bound_us"] == pytest.approx(quantized["macs"] / chip.peak_macs_per_second("int8") * 1e6)
    assert float_model["compute_bound_us"] == pytest.approx(float_model["macs"] / chip.peak_macs_per_second("fp16") * 1e6)
    assert quantized["weight_bytes"] < 0.6 * float_model["weight_bytes"]     # int8 weights (and int32 biases)
    code, out, _ = run(capsys, "estimate", "small_cnn", "--dtype", "int8", "--json")
    assert json.loads(out)["model_bounds"]["compute_us"] == pytest.approx(quantized["compute_bound_us"], rel=1e-12)


def test_report_and_estimate_name_the_calibration_files(capsys, tmp_path):
    folder = _npz_folder(tmp_path / "cal", 1.0)
    assert run(capsys, "report", "small_cnn", "--dtype", "int8", "--calibration-data", folder, "-o", tmp_path / "r.html")[0] == 0
    assert "2 npz\nfiles (s0.npz, s1.npz; sha256" in (tmp_path / "r.html").read_text()
    code, out, _ = run(capsys, "estimate", "small_cnn", "--dtype", "int8", "--calibration-data", folder)
    assert code == 0 and "calibrated on 2 npz files (s0.npz, s1.npz; sha256 " in out


def test_int8_of_a_model_quantized_already_is_one_line(capsys, tmp_path):
    assert run(capsys, "estimate", "mlp", "--dtype", "int8", "--emit-qdq", tmp_path / "q.onnx")[0] == 0
    code, out, err = run(capsys, "estimate", tmp_path / "q.onnx", "--dtype", "int8")
    assert code == 2 and err.count("\n") == 1
    assert "is quantized already" in err and "give --dtype fp16, bf16 or fp32 for the float rest" in err


@pytest.mark.parametrize("cores", [1, 2])
def test_program_bound_counts_int8_products_at_the_int8_rate(capsys, cores):
    """The scheduler's roofline (program bound) and the model bound count int8 CONV / MM2 MACs alike,
    on every core; at the float rate the program's compute roofline was twice the model's."""
    code, out, _ = run(capsys, "estimate", "small_cnn", "--dtype", "int8", "--cores", str(cores), "--json")
    report = json.loads(out)
    assert report["bounds"]["roofline_compute_us"] == pytest.approx(report["model_bounds"]["compute_us"], rel=1e-5)
    assert report["latency_us"] >= report["lower_bound_us"]
