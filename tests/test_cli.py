"""The command line as a new user meets it: errors as JSON with --json, inspect of a model with unsupported ops."""

from __future__ import annotations

import json

import onnx
import pytest
from onnx import TensorProto, helper

from tpuflow import cli, pipeline
from tpuflow.errors import ModelError


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def unsupported_model(tmp_path_factory) -> str:
    """x -> Relu -> com.acme.Frobnicate (an op no tpuflow will ever know) -> Relu -> y, with a weight."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [1, 4], [0.5] * 4)
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="first_relu"),
             helper.make_node("Add", ["a", "w"], ["b"], name="bias"),
             helper.make_node("Frobnicate", ["b"], ["c"], name="mystery", domain="com.acme"),
             helper.make_node("Relu", ["c"], ["y"], name="last_relu")]
    graph = helper.make_graph(nodes, "frob", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.acme", 1)])
    path = tmp_path_factory.mktemp("models") / "frob.onnx"
    onnx.save(model, path)
    return str(path)


JSON_COMMANDS = [
    ("inspect", "no_such_model.onnx"),
    ("estimate", "no_such_model.onnx"),
    ("verify", "no_such_model.onnx"),
    ("chips", "no_such_chip"),
    ("estimate", "mlp", "--dtype", "int3"),
    ("models", "--no-such-flag"),
]


@pytest.mark.parametrize("argv", JSON_COMMANDS, ids=lambda a: " ".join(a))
def test_json_error_is_a_document_on_stdout_and_one_line_on_stderr(capsys, argv):
    code, out, err = run(capsys, *argv, "--json")
    doc = json.loads(out)
    assert code == 2 and doc["ok"] is False and doc["error"]["code"] == 2
    error_lines = [line for line in err.splitlines() if line.startswith("tpuflow: ")]
    assert error_lines == [f"tpuflow: error: {doc['error']['message']}"]
    assert set(doc["error"]) >= {"code", "message", "node"}


@pytest.mark.parametrize("argv", JSON_COMMANDS[:3], ids=lambda a: " ".join(a))
def test_without_json_an_error_prints_nothing_on_stdout(capsys, argv):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and err.startswith("tpuflow: error: ")


def test_json_error_of_an_unsupported_model_names_its_node(capsys, unsupported_model):
    for command in ("estimate", "verify"):
        code, out, err = run(capsys, command, unsupported_model, "--json")
        error = json.loads(out)["error"]
        assert code == 2 and error["node"] == "mystery"
        assert error["unsupported"] == {"com.acme.Frobnicate": ["mystery"]}
        assert "com.acme.Frobnicate (mystery)" in err


def test_json_error_takes_the_node_a_message_names(capsys, monkeypatch):
    def broken(as_json):
        raise ModelError("m.onnx: node 'conv_7' has a kernel larger than its padded input")
    monkeypatch.setattr(pipeline, "cmd_models", broken)
    code, out, _ = run(capsys, "models", "--json")
    assert code == 2 and json.loads(out)["error"]["node"] == "conv_7"


def test_internal_error_is_exit_code_1_and_a_json_document(capsys, monkeypatch):
    def broken(as_json):
        raise RuntimeError("boom")
    monkeypatch.setattr(pipeline, "cmd_models", broken)
    code, out, err = run(capsys, "models", "--json")
    doc = json.loads(out)
    assert code == 1 and doc["error"]["code"] == 1 and doc["error"]["message"].startswith("RuntimeError: boom")
    assert err.startswith("tpuflow: internal error: RuntimeError: boom")


def test_compile_rejects_an_unsupported_model_up_front(capsys, unsupported_model, tmp_path):
    code, out, err = run(capsys, "compile", unsupported_model, "-o", str(tmp_path / "out"))
    assert code == 2 and "com.acme.Frobnicate (mystery)" in err and not (tmp_path / "out").exists()


def test_inspect_of_an_unsupported_model_prints_its_summary_with_the_node_marked(capsys, unsupported_model):
    code, out, err = run(capsys, "inspect", unsupported_model)
    assert code == 2 and err == "tpuflow: error: unsupported operators: com.acme.Frobnicate (mystery)\n"
    rows = {line.split()[0]: line for line in out.splitlines() if line.split() and line.split()[0] in
            ("first_relu", "bias", "mystery", "last_relu")}
    assert set(rows) == {"first_relu", "bias", "mystery", "last_relu"}
    assert "UNSUPPORTED" in rows["mystery"] and not any("UNSUPPORTED" in rows[n] for n in ("first_relu", "bias", "last_relu"))
    assert "1x4" in rows["bias"] and "total: 4 params" in out


def test_inspect_json_of_an_unsupported_model_is_the_error_document_with_the_summary(capsys, unsupported_model):
    code, out, _ = run(capsys, "inspect", unsupported_model, "--json")
    s = json.loads(out)             # one document: the error, and the summary's keys beside it
    assert code == 2 and s["ok"] is False and s["error"]["node"] == "mystery" and s["error"]["code"] == 2
    assert s["supported"] is False and s["macs"] is None and s["lower_bound_us"] is None
    assert s["unsupported"] == {"com.acme.Frobnicate": ["mystery"]}
    by_name = {r["name"]: r for r in s["layers"]}
    assert [n for n, r in by_name.items() if not r["supported"]] == ["mystery"]
    assert by_name["bias"]["params"] == 4 and by_name["bias"]["output_shape"] == [1, 4]
    assert s["inputs"] == [{"name": "x", "shape": [1, 4], "dtype": "float32"}]
    assert s["ops"] == {"Relu": 2, "Add": 1, "com.acme.Frobnicate": 1}


def test_inspect_json_of_a_supported_model_says_so(capsys):
    code, out, _ = run(capsys, "inspect", "mlp", "--json")
    s = json.loads(out)
    assert code == 0 and s["supported"] is True and s["unsupported"] == {} and s["macs"] > 0
