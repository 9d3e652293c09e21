"""Constant folding, BatchNormalization folding, alias removal: structure and numerics (onnxruntime
on the original versus onnxruntime on graph_to_onnx(canonical))."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from frontend_util import assert_canonical_matches, kinds
from tpuflow.frontend import folding, load

rng = np.random.default_rng(3)


def model(nodes, inputs, outputs, inits=(), opset=13):
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
                              initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def const(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name))


def test_shape_chain_reshape_target_folds_away():
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape (a torch export of x.view(b, -1))."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), const("zero", np.int64(0)),
             helper.make_node("Gather", ["s", "zero"], ["b"], axis=0), const("ax", np.asarray([0], np.int64)),
             helper.make_node("Unsqueeze", ["b", "ax"], ["b1"]), const("minus1", np.asarray([-1], np.int64)),
             helper.make_node("Concat", ["b1", "minus1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["flat"]), helper.make_node("Relu", ["flat"], ["y"])]
    g = assert_canonical_matches(model(nodes, [("x", [2, 3, 4])], [("y", [2, 12])]))
    assert kinds(g) == ["Reshape", "Relu"]
    reshape = next(g.nodes())
    assert reshape.attrs["shape"] == (2, 12) and reshape.inputs == ("x",)


def test_constant_of_shape_cast_and_expand_fold_into_constants():
    nodes = [const("shape", np.asarray([3, 4], np.int64)),
             helper.make_node("ConstantOfShape", ["shape"], ["ones"],
                              value=numpy_helper.from_array(np.asarray([1.0], np.float32))),
             const("k", np.asarray([2], np.int64)), helper.make_node("Cast", ["k"], ["kf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["ones", "kf"], ["twos"]),
             const("row", np.arange(4, dtype=np.float32)), helper.make_node("Expand", ["row", "shape"], ["rows"]),
             helper.make_node("Add", ["twos", "rows"], ["c"]), helper.make_node("Add", ["x", "c"], ["y"])]
    g = assert_canonical_matches(model(nodes, [("x", [3, 4])], [("y", [3, 4])]))
    assert kinds(g) == ["Add"]
    c = g.tensor(next(g.nodes()).inputs[1]).const
    np.testing.assert_array_equal(c, 2 + np.arange(4, dtype=np.float32)[None].repeat(3, 0))


def test_any_all_constant_node_is_evaluated_by_the_reference_implementation():
    nodes = [const("a", np.asarray([1.0, 2.0, 3.0], np.float32)), const("ax", np.int64(0)),
             helper.make_node("CumSum", ["a", "ax"], ["cs"]), helper.make_node("Mul", ["x", "cs"], ["y"])]
    g = assert_canonical_matches(model(nodes, [("x", [2, 3])], [("y", [2, 3])]))
    np.testing.assert_array_equal(g.tensor(next(g.nodes()).inputs[1]).const, [1, 3, 6])


def test_shapes_unknown_until_folding_take_more_rounds(monkeypatch):
    """CumSum is not data-propagated by shape inference, so Reshape's output (and Shape of it) only
    become known after a first folding round and a re-inference."""
    nodes = [const("dims", np.asarray([1, 1, 4], np.int64)), const("ax", np.int64(0)),
             helper.make_node("CumSum", ["dims", "ax"], ["target"]),          # [1, 2, 6]
             helper.make_node("Reshape", ["x", "target"], ["r"]),
             helper.make_node("Shape", ["r"], ["rs"]), const("two", np.int64(2)),
             helper.make_node("Gather", ["rs", "two"], ["last"]), const("ax0", np.asarray([0], np.int64)),
             helper.make_node("Unsqueeze", ["last", "ax0"], ["last1"]), const("m1", np.asarray([-1], np.int64)),
             helper.make_node("Concat", ["m1", "last1"], ["t2"], axis=0),
             helper.make_node("Reshape", ["r", "t2"], ["y"])]
    rounds = []
    original = folding.fold_pass
    monkeypatch.setattr(folding, "fold_pass", lambda view: rounds.append(1) or original(view))
    g = assert_canonical_matches(model(nodes, [("x", [2, 6])], [("y", [2, 6])]))
    assert len(rounds) >= 2
    # the second Reshape reads x directly (a view of a view is one view)
    assert kinds(g) == ["Reshape"] and g.tensor("y").shape == (2, 6)


def _conv_bn(extra_consumer: bool = False, conv_is_output: bool = False):
    c = 4
    inits = [("w", rng.standard_normal((c, 3, 3, 3)).astype(np.float32)), ("b", rng.standard_normal(c).astype(np.float32)),
             ("gamma", rng.uniform(0.5, 1.5, c).astype(np.float32)), ("beta", rng.standard_normal(c).astype(np.float32)),
             ("mean", rng.standard_normal(c).astype(np.float32)), ("var", rng.uniform(0.5, 1.5, c).astype(np.float32))]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["conv"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("BatchNormalization", ["conv", "gamma", "beta", "mean", "var"], ["bn"], epsilon=1e-3),
             helper.make_node("Relu", ["bn"], ["y"])]
    outputs = [("y", [1, c, 6, 6])]
    if extra_consumer:
        nodes.append(helper.make_node("Add", ["conv", "y"], ["z"]))
        outputs.append(("z", [1, c, 6, 6]))
    if conv_is_output:
        outputs.append(("conv", [1, c, 6, 6]))
    return model(nodes, [("x", [1, 3, 6, 6])], outputs, inits)


def test_batchnorm_folds_into_its_conv():
    g = assert_canonical_matches(_conv_bn(), rtol=1e-4)
    assert kinds(g) == ["Conv", "Relu"]
    conv = next(g.nodes())
    assert conv.name == "conv" and len(conv.inputs) == 3
    assert all(g.tensor(t).is_const for t in conv.inputs[1:])


@pytest.mark.parametrize("variant", [dict(extra_consumer=True), dict(conv_is_output=True)])
def test_batchnorm_stays_mul_add_when_the_conv_output_is_used_elsewhere(variant):
    g = assert_canonical_matches(_conv_bn(**variant), rtol=1e-4)
    assert kinds(g)[:4] == ["Conv", "Mul", "Add", "Relu"]
    mul = [n for n in g.nodes() if n.op_type == "Mul"][0]
    assert g.tensor(mul.inputs[1]).shape == (4, 1, 1)


def test_per_channel_scale_shift_chain_folds_into_conv():
    """DenseNet / Inception-v2 style: Conv -> BN -> Mul(Unsqueeze(s)) -> Add(Unsqueeze(t)) -> Relu, opset 9."""
    c = 3
    inits = [("w", rng.standard_normal((c, 2, 1, 1)).astype(np.float32)),
             *[(n, rng.uniform(0.5, 1.5, c).astype(np.float32)) for n in ("g", "be", "m", "v", "s", "t")]]
    nodes = [helper.make_node("Conv", ["x", "w"], ["conv"]),
             helper.make_node("BatchNormalization", ["conv", "g", "be", "m", "v"], ["bn"]),
             helper.make_node("Unsqueeze", ["s"], ["s3"], axes=[1, 2]), helper.make_node("Mul", ["bn", "s3"], ["scaled"]),
             helper.make_node("Unsqueeze", ["t"], ["t3"], axes=[1, 2]), helper.make_node("Add", ["scaled", "t3"], ["sh"]),
             helper.make_node("Relu", ["sh"], ["y"])]
    g = assert_canonical_matches(model(nodes, [("x", [1, 2, 5, 5])], [("y", [1, c, 5, 5])], inits, opset=9), rtol=1e-4)
    assert kinds(g) == ["Conv", "Relu"]


def test_identity_outputs_keep_their_names():
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Identity", ["r"], ["out"]),
             helper.make_node("Identity", ["x"], ["passthrough"]), helper.make_node("Identity", ["r"], ["again"])]
    g = assert_canonical_matches(model(nodes, [("x", [2, 3])], [("out", [2, 3]), ("passthrough", [2, 3]),
                                                                  ("again", [2, 3])]))
    assert g.outputs == ["out", "passthrough", "again"]
    assert sorted(kinds(g)) == ["Relu", "Reshape", "Reshape"]         # two names for one value need a view copy
    assert g.producer("out").op_type == "Relu"


def test_inputs_with_initializers_are_constants_not_runtime_inputs():
    """Old IR (< 4) lists initializers among graph.input, as the light models do."""
    w = rng.standard_normal((3, 3)).astype(np.float32)
    m = model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", [2, 3]), ("w", [3, 3])], [("y", [2, 3])],
              [("w", w)], opset=9)
    m.ir_version = 3
    g = assert_canonical_matches(m)
    assert g.inputs == ["x"] and g.tensor("w").is_const


def test_loading_is_deterministic():
    m = _conv_bn()

    def fingerprint():
        g = load(m)
        return [(n.name, n.op_type, n.inputs, n.outputs, dict(n.attrs)) for n in g.nodes()], \
            {k: (t.shape, t.dtype, None if t.const is None else t.const.tobytes()) for k, t in g.tensors.items()}
    assert fingerprint() == fingerprint()


def test_input_shapes_fix_symbolic_dims():
    m = model([helper.make_node("Relu", ["x"], ["y"])], [("x", ["batch", 3])], [("y", ["batch", 3])])
    g = assert_canonical_matches(m, input_shapes={"x": (5, 3)})
    assert g.tensor("x").shape == (5, 3) and g.tensor("y").shape == (5, 3)
    onnx.checker.check_model(m)                                      # the caller's model is untouched
    assert m.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
