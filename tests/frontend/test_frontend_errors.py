"""Bad inputs give one-line user errors (exit code 2 through `tpuflow.cli.main`), never tracebacks."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tpuflow import cli
from tpuflow.errors import InputFileError, ModelError, OptionError, UnsupportedOpError
from tpuflow.frontend import folding, load, reader


def make(nodes, inputs, outputs, inits=(), opset=13, domains=()):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
                              initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits])
    imports = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, 1) for d in domains)]
    return helper.make_model(graph, opset_imports=imports, ir_version=8)


def relu_model(shape=(2, 3)):
    return make([helper.make_node("Relu", ["x"], ["y"], name="r")], [("x", list(shape))], [("y", list(shape))])


def run_cli(capsys, *argv) -> tuple[int, str]:
    code = cli.main(["inspect", *map(str, argv)])
    err = capsys.readouterr().err
    return code, err


def expect_user_error(capsys, path, *phrases, extra=()):
    code, err = run_cli(capsys, path, *extra)
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("tpuflow: error: ") and "Traceback" not in err
    for p in phrases:
        assert p in err, err
    return err


def write(tmp_path, name, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_missing_file(capsys, tmp_path):
    expect_user_error(capsys, tmp_path / "absent.onnx", "absent.onnx: no such file")
    expect_user_error(capsys, "no_such_model", "not a bundled model", "resnet50")
    with pytest.raises(InputFileError):
        load(tmp_path / "absent.onnx")


def test_directory_empty_truncated_and_non_onnx_files(capsys, tmp_path):
    expect_user_error(capsys, tmp_path, "is a directory")
    expect_user_error(capsys, write(tmp_path, "empty.onnx", b""), "empty file")
    data = relu_model().SerializeToString()
    expect_user_error(capsys, write(tmp_path, "cut.onnx", data[: len(data) // 2]), "cut.onnx", "truncated")
    expect_user_error(capsys, write(tmp_path, "text.onnx", b"this is not a model\n" * 4), "not an ONNX model")
    with pytest.raises(InputFileError, match="truncated"):
        load(data[:-7])


def test_dangling_tensor_name(capsys, tmp_path):
    m = make([helper.make_node("Add", ["x", "ghost"], ["y"], name="add1")], [("x", [2])], [("y", [2])])
    expect_user_error(capsys, write(tmp_path, "d.onnx", m.SerializeToString()), "node 'add1' (Add)", "'ghost'")
    m = make([helper.make_node("Relu", ["x"], ["y"], name="r")], [("x", [2])], [("nowhere", [2])])
    with pytest.raises(ModelError, match="graph output 'nowhere'"):
        load(m)


def test_unsorted_nodes_are_sorted_not_rejected():
    m = make([helper.make_node("Relu", ["a"], ["y"], name="second"), helper.make_node("Neg", ["x"], ["a"], name="first")],
             [("x", [2])], [("y", [2])])
    assert [n.name for n in load(m).nodes()] == ["first", "second"]


def test_contradictory_shapes(capsys, tmp_path):
    m = make([helper.make_node("Add", ["x", "z"], ["y"], name="add1")], [("x", [2, 3]), ("z", [4, 5])], [("y", [2, 3])])
    expect_user_error(capsys, write(tmp_path, "c.onnx", m.SerializeToString()), "contradictory", "add1")
    declared_wrong = relu_model()
    declared_wrong.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 7
    with pytest.raises(ModelError, match="contradictory"):
        load(declared_wrong)
    bad_reshape = make([helper.make_node("Reshape", ["x", "s"], ["y"], name="rs")], [("x", [2, 3])], [("y", [4, 2])],
                       [("s", np.asarray([4, 2], np.int64))])
    with pytest.raises(ModelError):
        load(bad_reshape)


def test_symbolic_dims_need_input_shapes(capsys, tmp_path):
    m = make([helper.make_node("Relu", ["x"], ["y"], name="r")], [("x", ["batch", 3, "h"])], [("y", ["batch", 3, "h"])])
    path = write(tmp_path, "s.onnx", m.SerializeToString())
    err = expect_user_error(capsys, path, "input 'x'", "'batch'", "'h'", "--input-shape x=N,3,N")
    assert "dimension 0" in err
    code, _ = run_cli(capsys, path, "--input-shape", "x=2,3,5")
    assert code == 0
    expect_user_error(capsys, path, "dimension 1 is 3", extra=("--input-shape", "x=2,4,5"))
    expect_user_error(capsys, path, "not a runtime graph input", extra=("--input-shape", "w=2,4,5"))
    expect_user_error(capsys, path, "rank 3", extra=("--input-shape", "x=2,3"))
    with pytest.raises(OptionError):
        load(m, {"x": (2, 3, 0)})


def test_opset_outside_range():
    m = relu_model()
    m.opset_import[0].version = 7
    with pytest.raises(ModelError, match="opset 7"):
        load(m)


def unsupported_zoo():
    """Ops no importer takes (the frontend and the kernels grew: LSTM, Resize, runtime Gather, Pad
    reflect and 1-D Conv are supported now)."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="r"),
             helper.make_node("LpPool", ["a"], ["b"], name="lp1", kernel_shape=[2, 2]),
             helper.make_node("Shrink", ["a"], ["c"], name="shrink1"),
             helper.make_node("Shrink", ["a"], ["c2"], name="shrink2"),
             helper.make_node("NonZero", ["a"], ["d"], name="nonzero_rt"),
             helper.make_node("Pad", ["a", "pads_rt"], ["e"], name="pad_rt"),
             helper.make_node("Conv", ["x6", "w4"], ["f"], name="conv4d"),
             helper.make_node("MaxPool", ["a"], ["g", "gi"], name="pool_idx", kernel_shape=[2, 2]),
             helper.make_node("Relu", ["gi"], ["gi2"], name="use_indices"),
             helper.make_node("FusedGemm", ["a"], ["h"], name="fused", domain="com.microsoft"),
             helper.make_node("Add", ["x", "q"], ["bad"], name="contradiction")]
    inputs = [("x", [1, 2, 4, 4]), ("x6", [1, 2, 3, 3, 3, 3]), ("q", [3, 3])]
    outputs = [(o, None) for o in ("b", "c", "c2", "d", "e", "f", "g", "gi2", "h", "bad")]
    inits = [("w4", np.zeros((2, 2, 1, 1, 1, 1), np.float32))]
    m = make(nodes, inputs, [], inits, domains=("com.microsoft",))
    m.graph.input.append(helper.make_tensor_value_info("pads_rt", TensorProto.INT64, [8]))
    m.graph.output.extend(helper.make_empty_tensor_value_info(o) for o, _ in outputs)
    return m


def test_unsupported_ops_listed_together_before_any_other_work(monkeypatch):
    def never(*args):
        raise AssertionError("work started before the legality check")
    monkeypatch.setattr(reader, "run_checker", never)
    monkeypatch.setattr(folding, "fold_constants", never)
    with pytest.raises(UnsupportedOpError) as info:
        load(unsupported_zoo())
    assert info.value.unsupported == {
        "Conv[4-D convolution]": ["conv4d"], "NonZero": ["nonzero_rt"], "LpPool": ["lp1"],
        "MaxPool[indices output used]": ["pool_idx"], "Pad[runtime pads]": ["pad_rt"],
        "Shrink": ["shrink1", "shrink2"], "com.microsoft.FusedGemm": ["fused"]}


def test_unsupported_ops_on_the_command_line(capsys, tmp_path):
    err = expect_user_error(capsys, write(tmp_path, "u.onnx", unsupported_zoo().SerializeToString()),
                            "unsupported operators:", "LpPool (lp1)", "Shrink (shrink1, shrink2)", "nonzero_rt")
    assert "contradict" not in err                                    # reported before shape inference ran


def test_ops_that_only_fold_are_unsupported_when_their_inputs_are_runtime():
    m = make([helper.make_node("Range", ["x", "x", "x"], ["y"], name="range_rt")], [("x", [])], [("y", None)])
    m.graph.output[0].CopyFrom(helper.make_empty_tensor_value_info("y"))
    with pytest.raises(UnsupportedOpError, match=r"Range \(range_rt\)"):
        load(m)


def test_bad_dtype_and_chip_options(capsys):
    code, err = run_cli(capsys, "small_cnn", "--dtype", "int4")
    assert code == 2 and "--dtype" in err
    code, err = run_cli(capsys, "small_cnn", "--chip", "no_such_chip")
    assert code == 2 and "no_such_chip" in err


def test_the_callers_proto_is_not_modified():
    m = unsupported_zoo()
    before = m.SerializeToString()
    with pytest.raises(UnsupportedOpError):
        load(m)
    m2 = relu_model()
    before2 = m2.SerializeToString()
    load(m2)
    assert m.SerializeToString() == before and m2.SerializeToString() == before2
    onnx.checker.check_model(m2)
