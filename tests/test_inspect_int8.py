"""`tpuflow inspect --dtype int8` on a float model summarises the program compile builds: the model
quantized first (int8 where the quantizer put it, the rest fp16), its bound the estimate's model bound."""

from __future__ import annotations

import json

import pytest

from tpuflow.cli import main


def _json(capsys, argv) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("model", ["mlp", "bert_layer"])
def test_inspect_int8_bound_is_the_estimates_model_bound(capsys, model):
    summary = _json(capsys, ["inspect", model, "--dtype", "int8", "--json"])
    estimate = _json(capsys, ["estimate", model, "--dtype", "int8", "--json"])
    assert summary["model_bound_us"] == pytest.approx(estimate["model_bound_us"], rel=1e-12)
    assert summary["dtype"] == "int8" and summary["float_rest"] == "fp16"
    assert summary["quantization"]["float_ops"] == estimate["quantization"]["float_ops"]
    assert 0 < summary["int8_macs"] <= sum(l["macs"] for l in summary["layers"])


def test_inspect_int8_lists_the_ops_left_float(capsys):
    assert main(["inspect", "bert_layer", "--dtype", "int8"]) == 0
    out = capsys.readouterr().out
    assert "dtype int8 (the rest fp16)" in out
    assert "Softmax attention/softmax: no int8 form" in out


def test_inspect_int8_of_a_quantized_model_is_refused(tmp_path, capsys):
    from tpuflow.quantize import quantize, write_qdq
    write_qdq(quantize("mlp").model, tmp_path / "q.onnx")
    assert main(["inspect", str(tmp_path / "q.onnx"), "--dtype", "int8"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "quantized already" in err
