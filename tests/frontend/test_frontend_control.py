"""If / Loop removed at compile time, pinned inputs (--input-value), and the one error that lists
unsupported ops inside every subgraph."""

from __future__ import annotations

import numpy as np
import pytest
from control_models import counting_loop, sample_rate_if, scan_model
from frontend_util import kinds, random_feeds, run_ort

from tpuflow import cli
from tpuflow.errors import OptionError, UnsupportedOpError
from tpuflow.frontend import InputValue, load
from tpuflow.frontend.export import graph_to_onnx
from tpuflow.frontend.legality import PIN_HINT


def matches_reference(graph, rtol=1e-5):
    """The canonical graph computes what onnxruntime computes on the graph's (pinned) model."""
    feeds = random_feeds(graph)
    expected = run_ort(graph.model, feeds)
    actual = run_ort(graph_to_onnx(graph), dict(feeds))
    for e, a in zip(expected, actual):
        np.testing.assert_allclose(a, e, rtol=rtol, atol=1e-6)


def test_runtime_if_is_rejected_with_the_ops_of_both_branches():
    with pytest.raises(UnsupportedOpError) as info:
        load(sample_rate_if())
    assert info.value.unsupported == {PIN_HINT: ["rate_if"], "Shrink": ["rate_if/else_branch/else_op"]}
    assert "--input-value" in PIN_HINT


@pytest.mark.parametrize("nested", [False, True])
def test_pinned_input_inlines_the_taken_branch(nested):
    graph = load(sample_rate_if(nested=nested), {"sr": InputValue(np.array(16000))})
    assert "sr" not in graph.inputs
    assert kinds(graph) == (["Mul", "Sigmoid"] if nested else ["Mul"])
    matches_reference(graph)


def test_branch_taken_is_checked_after_inlining():
    with pytest.raises(UnsupportedOpError, match=r"Shrink \(rate_if/else/else_op\)"):
        load(sample_rate_if(), input_values={"sr": 8000})
    graph = load(sample_rate_if("Softsign"), input_values={"sr": 8000})
    assert kinds(graph) == ["Abs", "Add", "Div"]
    matches_reference(graph)


def test_other_problems_list_removable_branches_too():
    """Fixing one error never reveals the next: a top-level problem lists the branch problems too."""
    m = sample_rate_if()
    m.graph.node.append(m.graph.node[0].__class__())
    m.graph.node[-1].CopyFrom(__import__("onnx").helper.make_node("NonZero", ["x"], ["nz"], name="nz"))
    with pytest.raises(UnsupportedOpError) as info:
        load(m, {"sr": InputValue(np.array(16000))})
    assert info.value.unsupported == {"NonZero": ["nz"], "Shrink": ["rate_if/else_branch/else_op"]}


@pytest.mark.parametrize("trip", [1, 4])
def test_loop_with_constant_trip_count_is_unrolled(trip):
    graph = load(counting_loop(trip))
    assert kinds(graph).count("Add") == trip and "Concat" in kinds(graph)
    matches_reference(graph)


@pytest.mark.parametrize("kw,reason", [(dict(runtime_cond=True), "Loop[runtime condition]"),
                                       (dict(body_cond="data"), "Loop[condition computed in the body]")])
def test_loops_that_cannot_be_unrolled_are_rejected(kw, reason):
    with pytest.raises(UnsupportedOpError) as info:
        load(counting_loop(**kw))
    assert info.value.unsupported[reason] == ["the_loop"]


def test_scan_body_problems_are_listed_with_the_rest_in_one_error():
    with pytest.raises(UnsupportedOpError) as info:
        load(scan_model())
    assert info.value.unsupported == {"NonZero": ["the_scan/body/nonzero_in_scan"], "Unique": ["top_unique"]}


@pytest.mark.parametrize("in_axis,in_dir,out_axis,out_dir", [(0, 0, 0, 0), (1, 1, 0, 0), (0, 0, 1, 1), (-1, 0, -1, 0)])
def test_scan_is_unrolled(in_axis, in_dir, out_axis, out_dir):
    from control_models import model, vi
    from onnx import helper
    body = helper.make_graph([helper.make_node("Add", ["s", "xi"], ["s_out"]),
                              helper.make_node("Tanh", ["s_out"], ["o"])], "scan_body",
                             [vi("s", [3]), vi("xi", [3])], [vi("s_out", [3]), vi("o", [3])])
    x_shape = [4, 3] if in_axis == 0 else [3, 4]
    out_shape = [4, 3] if out_axis == 0 else [3, 4]
    nodes = [helper.make_node("Scan", ["s0", "x"], ["sf", "ys"], body=body, num_scan_inputs=1,
                              scan_input_axes=[in_axis], scan_input_directions=[in_dir],
                              scan_output_axes=[out_axis], scan_output_directions=[out_dir])]
    graph = load(model(nodes, [vi("s0", [3]), vi("x", x_shape)], [vi("sf", [3]), vi("ys", out_shape)]))
    assert kinds(graph).count("Tanh") == 4 and "Scan" not in kinds(graph)
    matches_reference(graph)


def test_input_value_errors():
    with pytest.raises(OptionError, match="'rate', which is not a runtime graph input"):
        load(sample_rate_if(), input_values={"rate": 16000})
    with pytest.raises(OptionError, match="is int64, the value"):
        load(sample_rate_if(), input_values={"sr": 0.5})
    with pytest.raises(OptionError, match=r"has shape \[2, 3\], the value has 2 element"):
        load(sample_rate_if("Softsign"), input_values={"x": [1, 2], "sr": 1})


@pytest.mark.parametrize("text,value", [("16000", 16000.0), ("1,2,3", [1.0, 2.0, 3.0]), ("true", True),
                                        ("-0.5", -0.5)])
def test_input_value_parsing(text, value):
    assert np.asarray(InputValue.parse(text).value).tolist() == value


def test_cli_input_value(tmp_path, capsys):
    path = tmp_path / "vad.onnx"
    path.write_bytes(sample_rate_if().SerializeToString())
    assert cli.main(["inspect", str(path), "--input-value", "sr=16000", "--json"]) == 0
    assert '"Mul"' in capsys.readouterr().out
    assert cli.main(["verify", str(path), "--input-value", "sr=16000", "--no-race-check"]) == 0
    capsys.readouterr()
    assert cli.main(["estimate", str(path), "--input-value", "sr=bad=1"]) == 2
    assert "--input-value" in capsys.readouterr().err


def test_a_branch_reading_another_if_output_is_ordered_after_it():
    """silero-vad: If_1's branch reads If_0's output (an outer-scope read, not a node input)."""
    from control_models import model, vi
    from onnx import TensorProto as T, helper
    first = helper.make_graph([helper.make_node("Relu", ["x"], ["a_out"])], "a", [], [vi("a_out", [2, 3])])
    second = helper.make_graph([helper.make_node("Neg", ["first_out"], ["b_out"])], "b", [], [vi("b_out", [2, 3])])
    nodes = [helper.make_node("Equal", ["sr", "k16"], ["c"], name="eq"),
             helper.make_node("If", ["c"], ["first_out"], name="if0", then_branch=first, else_branch=first),
             helper.make_node("If", ["always"], ["y"], name="if1", then_branch=second, else_branch=second)]
    m = model(nodes, [vi("x", [2, 3]), vi("sr", [], T.INT64)], [vi("y", [2, 3])],
              [("k16", np.array(16000)), ("always", np.array(True))])
    graph = load(m, {"sr": InputValue(np.array(16000))})
    assert kinds(graph) == ["Relu", "Neg"]
    matches_reference(graph)


def test_branch_passing_an_outer_tensor_or_using_a_constant_and_a_loop_inside_a_branch():
    from control_models import model, vi
    from onnx import TensorProto as T, helper, numpy_helper
    passthrough = helper.make_graph([helper.make_node("Identity", ["x"], ["x_out"])], "pass", [], [vi("x_out", [2, 3])])
    const_branch = helper.make_graph(
        [helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.full((2, 3), 0.5, np.float32))),
         helper.make_node("Mul", ["x", "k"], ["scaled"])], "const", [], [vi("scaled", [2, 3])])
    loop_body = helper.make_graph([helper.make_node("Identity", ["cin"], ["cout"]),
                                   helper.make_node("Add", ["acc", "x"], ["acc2"])], "body",
                                  [vi("i", [], T.INT64), vi("cin", [], T.BOOL), vi("acc", [2, 3])],
                                  [vi("cout", [], T.BOOL), vi("acc2", [2, 3])])
    loop_branch = helper.make_graph([helper.make_node("Loop", ["three", "", "x"], ["looped"], body=loop_body)],
                                    "loop", [], [vi("looped", [2, 3])])
    nodes = [helper.make_node("If", ["t"], ["a"], then_branch=passthrough, else_branch=const_branch),
             helper.make_node("If", ["f"], ["b"], then_branch=passthrough, else_branch=const_branch),
             helper.make_node("If", ["t"], ["c"], then_branch=loop_branch, else_branch=passthrough),
             helper.make_node("Sum", ["a", "b", "c"], ["y"])]
    m = model(nodes, [vi("x", [2, 3])], [vi("y", [2, 3])],
              [("t", np.array(True)), ("f", np.array(False)), ("three", np.array(3))])
    graph = load(m)
    assert kinds(graph).count("Add") == 3 + 2 and "Mul" in kinds(graph)
    matches_reference(graph)
