"""Per-op-family importer tests: small one-op models; the canonical graph's shapes agree with
onnxruntime and, exported back to ONNX, it computes what the original computes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from frontend_util import assert_canonical_matches, kinds, one_op

rng = np.random.default_rng(7)
f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
i64 = lambda *v: np.asarray(v, np.int64)  # noqa: E731


def node(graph, kind):
    return next(n for n in graph.nodes() if n.op_type == kind)


# ------------------------------------------------------------------ conv family

CONV_CASES = {
    "basic": (dict(x=(1, 4, 9, 9)), dict(w=f32(8, 4, 3, 3), b=f32(8)), dict(pads=[1, 1, 1, 1])),
    "strided_dilated": (dict(x=(2, 3, 15, 13)), dict(w=f32(5, 3, 3, 3)), dict(strides=[2, 3], dilations=[2, 1])),
    "grouped": (dict(x=(1, 6, 8, 8)), dict(w=f32(4, 3, 3, 3)), dict(group=2, pads=[0, 1, 2, 1])),
    "depthwise": (dict(x=(1, 8, 10, 10)), dict(w=f32(8, 1, 3, 3)), dict(group=8, strides=[2, 2], pads=[1, 1, 1, 1])),
    "same_upper": (dict(x=(1, 2, 7, 7)), dict(w=f32(3, 2, 3, 3)), dict(auto_pad="SAME_UPPER", strides=[2, 2])),
    "same_lower": (dict(x=(1, 2, 8, 8)), dict(w=f32(3, 2, 4, 4)), dict(auto_pad="SAME_LOWER", strides=[2, 2])),
    "valid": (dict(x=(1, 2, 8, 8)), dict(w=f32(3, 2, 3, 3)), dict(auto_pad="VALID")),
}


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv(case):
    inputs, consts, attrs = CONV_CASES[case]
    g = assert_canonical_matches(one_op("Conv", inputs, consts, **attrs), rtol=1e-4)
    assert kinds(g) == ["Conv"]
    conv = node(g, "Conv")
    assert len(conv.attrs["pads"]) == 4 and "auto_pad" not in conv.attrs
    assert conv.attrs["kernel_shape"] == consts["w"].shape[2:]


def test_conv_auto_pad_resolved_to_top_left_bottom_right():
    g = assert_canonical_matches(one_op("Conv", dict(x=(1, 2, 8, 8)), dict(w=f32(3, 2, 4, 4)),
                                        auto_pad="SAME_LOWER", strides=[2, 2]))
    # out 4, total pad (4-1)*2 + 4 - 8 = 2 per axis; SAME_LOWER puts the odd extra at the start
    assert node(g, "Conv").attrs["pads"] == (1, 1, 1, 1)
    g = assert_canonical_matches(one_op("Conv", dict(x=(1, 2, 8, 8)), dict(w=f32(3, 2, 3, 3)),
                                        auto_pad="SAME_LOWER", strides=[2, 2]))
    assert node(g, "Conv").attrs["pads"] == (1, 1, 0, 0)          # total 1: begin 1, end 0


POOL_CASES = {
    "max": ("MaxPool", (1, 3, 9, 9), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    "max_ceil": ("MaxPool", (1, 3, 10, 10), dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    "max_same": ("MaxPool", (1, 3, 9, 9), dict(kernel_shape=[2, 2], strides=[2, 2], auto_pad="SAME_UPPER")),
    "max_dilated": ("MaxPool", (1, 3, 9, 9), dict(kernel_shape=[2, 2], dilations=[2, 2])),
    "avg_excl_pad": ("AveragePool", (1, 3, 8, 8), dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])),
    "avg_incl_pad": ("AveragePool", (1, 3, 8, 8), dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1)),
    "avg_ceil": ("AveragePool", (1, 3, 10, 10), dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    "avg_asymmetric": ("AveragePool", (1, 3, 7, 7), dict(kernel_shape=[7, 7], pads=[0, 0, 1, 1])),
}


@pytest.mark.parametrize("case", POOL_CASES)
def test_pool(case):
    op, shape, attrs = POOL_CASES[case]
    g = assert_canonical_matches(one_op(op, dict(x=shape), opset=13, **attrs))
    pool = node(g, op)
    assert "ceil_mode" not in pool.attrs and "auto_pad" not in pool.attrs
    assert len(pool.attrs["pads"]) == 4


def test_ceil_mode_lives_in_the_output_shape():
    g = assert_canonical_matches(one_op("MaxPool", dict(x=(1, 1, 10, 10)), kernel_shape=[3, 3], strides=[2, 2],
                                        ceil_mode=1))
    assert g.tensor(g.outputs[0]).shape == (1, 1, 5, 5)              # floor mode would give 4x4


@pytest.mark.parametrize("op,attrs", [("GlobalAveragePool", {}),
                                      ("LRN", dict(size=3, alpha=2e-4, beta=0.7, bias=1.5))])
def test_other_conv_family(op, attrs):
    g = assert_canonical_matches(one_op(op, dict(x=(2, 6, 5, 5)), **attrs))
    assert kinds(g) == [op]


def test_batchnorm_without_conv_is_mul_add_with_channel_constants():
    consts = dict(s=rng.uniform(0.5, 1.5, 4).astype(np.float32), b=f32(4), m=f32(4),
                  v=rng.uniform(0.5, 1.5, 4).astype(np.float32))
    g = assert_canonical_matches(one_op("BatchNormalization", dict(x=(2, 4, 3, 3)), consts, epsilon=1e-3))
    assert kinds(g) == ["Mul", "Add"]
    for n in g.nodes():
        assert g.tensor(n.inputs[1]).shape == (4, 1, 1)


# ------------------------------------------------------------------ matmul family

@pytest.mark.parametrize("inputs,consts", [
    (dict(a=(3, 5)), dict(w=f32(5, 7))),
    (dict(a=(2, 3, 4, 5)), dict(w=f32(5, 6))),
    (dict(a=(3, 1, 4, 5), b=(2, 5, 6)), {}),
    (dict(a=(5,), b=(2, 5, 3)), {}),
])
def test_matmul_numpy_semantics(inputs, consts):
    g = assert_canonical_matches(one_op("MatMul", inputs, consts))
    assert kinds(g) == ["MatMul"]
    a, b = (g.tensor(t).shape for t in node(g, "MatMul").inputs)
    assert g.tensor(g.outputs[0]).shape == np.matmul(np.zeros(a), np.zeros(b)).shape


GEMM_CASES = {
    "transB_const_alpha_beta": (dict(a=(4, 6)), dict(b=f32(5, 6), c=f32(5)),
                                dict(transB=1, alpha=0.5, beta=2.0), ["MatMul", "Add"]),
    "runtime_transA": (dict(a=(6, 4)), dict(b=f32(6, 5), c=f32(4, 5)), dict(transA=1), ["Transpose", "MatMul", "Add"]),
    "runtime_both_alpha": (dict(a=(4, 6), b=(5, 6)), {}, dict(transB=1, alpha=3.0),
                           ["Transpose", "MatMul", "Mul"]),
    "runtime_c_beta": (dict(a=(4, 6), c=(4, 5)), dict(b=f32(6, 5)), dict(beta=0.5), ["MatMul", "Mul", "Add"]),
    "no_c": (dict(a=(4, 6)), dict(b=f32(6, 5)), {}, ["MatMul"]),
    "const_a": (dict(b=(6, 5)), dict(a=f32(6, 4)), dict(transA=1, alpha=2.0), ["MatMul"]),
}


@pytest.mark.parametrize("case", GEMM_CASES)
def test_gemm_becomes_matmul(case):
    inputs, consts, attrs, expected = GEMM_CASES[case]
    order = [n for n in ("a", "b", "c") if n in inputs or n in consts]
    g = assert_canonical_matches(one_op("Gemm", inputs, consts, input_order=order, **attrs), rtol=1e-4)
    assert sorted(kinds(g)) == sorted(expected)


def test_gemm_constant_weight_is_pre_transposed_and_scaled():
    b = f32(5, 6)
    g = assert_canonical_matches(one_op("Gemm", dict(a=(4, 6)), dict(b=b), transB=1, alpha=0.5))
    w = g.tensor(node(g, "MatMul").inputs[1]).const
    np.testing.assert_allclose(w, b.T * 0.5, rtol=1e-6)


# ------------------------------------------------------------------ elementwise family

@pytest.mark.parametrize("op", ["Sqrt", "Reciprocal", "Neg", "Abs", "Exp", "Log", "Erf", "Tanh", "Sigmoid",
                                "Relu", "HardSwish"])
def test_unary(op):
    g = assert_canonical_matches(one_op(op, dict(x=(2, 3, 4)), opset=14), positive=op in ("Sqrt", "Log"))
    assert kinds(g) == [op]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_binary_broadcasting(op):
    assert_canonical_matches(one_op(op, dict(x=(2, 1, 4), y=(3, 1))))
    g = assert_canonical_matches(one_op(op, dict(x=(2, 3, 4)), dict(c=f32(4) + 3)))
    assert kinds(g) == [op]


@pytest.mark.parametrize("exponent", [2.0, 3.0, 0.5])
def test_pow_with_constant_exponent(exponent):
    g = assert_canonical_matches(one_op("Pow", dict(x=(2, 5)), dict(e=np.float32(exponent))), positive=True)
    assert g.tensor(node(g, "Pow").inputs[1]).const is not None


def test_activation_attributes():
    g = assert_canonical_matches(one_op("LeakyRelu", dict(x=(3, 4)), alpha=0.2))
    assert node(g, "LeakyRelu").attrs["alpha"] == pytest.approx(0.2)
    g = assert_canonical_matches(one_op("HardSigmoid", dict(x=(3, 4)), alpha=0.3, beta=0.4))
    assert node(g, "HardSigmoid").attrs["beta"] == pytest.approx(0.4)


@pytest.mark.parametrize("opset,consts,order,attrs,bounds", [
    (9, {}, None, dict(min=-0.5, max=0.5), (-0.5, 0.5)),
    (13, dict(lo=np.float32(0), hi=np.float32(6)), None, {}, (0.0, 6.0)),
    (13, dict(lo=np.float32(-1)), None, {}, (-1.0, np.inf)),
    (13, dict(hi=np.float32(1)), ["x", "", "hi"], {}, (-np.inf, 1.0)),
])
def test_clip_bounds_become_attributes(opset, consts, order, attrs, bounds):
    g = assert_canonical_matches(one_op("Clip", dict(x=(3, 8)), consts, opset=opset, input_order=order, **attrs))
    assert kinds(g) == ["Clip"]
    clip = node(g, "Clip")
    assert (clip.attrs["min"], clip.attrs["max"]) == bounds
    assert clip.inputs == ("x",)


def test_cast_to_other_float_kept_same_float_removed():
    g = assert_canonical_matches(one_op("Cast", dict(x=(3, 4)), to=TensorProto.FLOAT16), rtol=1e-3)
    assert node(g, "Cast").attrs["to"] == "float16"
    g = assert_canonical_matches(one_op("Cast", dict(x=(3, 4)), to=TensorProto.FLOAT))
    assert kinds(g) == ["Reshape"] and g.outputs == ["y0"]          # output = input: a view copy keeps both names


def test_sum_becomes_add_chain():
    g = assert_canonical_matches(one_op("Sum", dict(a=(2, 3), b=(2, 3), c=(3,), d=(2, 1))))
    assert kinds(g) == ["Add", "Add", "Add"]
    assert g.outputs == ["y0"]


def test_where_with_constant_condition():
    cond = rng.integers(0, 2, (4, 4)).astype(bool)
    g = assert_canonical_matches(one_op("Where", dict(x=(2, 4, 4)), dict(c=cond, low=np.float32(-1e9)),
                                        input_order=["c", "x", "low"]))
    assert g.tensor(node(g, "Where").inputs[0]).const is not None


# ------------------------------------------------------------------ normalisations and reductions

@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset,axis,expected", [
    (13, 1, ["Transpose", "{op}", "Transpose"]), (13, -1, ["{op}"]), (11, -1, ["{op}"]),
    (11, 1, ["Reshape", "{op}", "Reshape"]), (9, 0, ["Reshape", "{op}", "Reshape"]),
])
def test_softmax_axis_semantics(op, opset, axis, expected):
    g = assert_canonical_matches(one_op(op, dict(x=(2, 3, 4)), opset=opset, axis=axis))
    assert kinds(g) == [k.format(op=op) for k in expected]
    sm = node(g, op)
    assert sm.attrs["axis"] == len(g.tensor(sm.inputs[0]).shape) - 1      # the lowering's row-wise form


@pytest.mark.parametrize("axis", [-1, 1])
def test_layer_norm(axis):
    shape = (2, 3, 8)
    norm = shape[axis:] if axis > 0 else shape[-1:]
    consts = dict(s=rng.uniform(0.5, 1.5, norm).astype(np.float32), b=f32(*norm))
    g = assert_canonical_matches(one_op("LayerNormalization", dict(x=shape), consts, opset=17, axis=axis,
                                        epsilon=1e-3), rtol=1e-4)
    assert node(g, "LayerNormalization").attrs["axis"] == axis % 3


@pytest.mark.parametrize("op,opset,consts,attrs,axes", [
    ("ReduceMean", 13, {}, dict(axes=[-1, 1], keepdims=0), (1, 2)),
    ("ReduceMean", 18, dict(axes=i64(-1)), {}, (2,)),
    ("ReduceSum", 13, dict(axes=i64(0, 2)), dict(keepdims=1), (1,)),   # moved last: (0, 2) -> one axis of 8
    ("ReduceSum", 11, {}, dict(axes=[1]), None),             # a middle axis: MatMul with a row of ones
    ("ReduceMax", 13, {}, {}, (0, 1, 2)),
    ("ReduceMax", 18, dict(axes=i64(1)), dict(keepdims=0), (2,)),
])
def test_reduce_axes(op, opset, consts, attrs, axes):
    """The canonical reduction is over trailing axes (others are moved last by a Transpose)."""
    g = assert_canonical_matches(one_op(op, dict(x=(2, 3, 4)), consts, opset=opset, **attrs))
    if axes is None:
        assert "MatMul" in kinds(g) and op not in kinds(g)
        return
    r = node(g, op)
    assert r.attrs["axes"] == axes
    rank = len(g.tensor(r.inputs[0]).shape)
    assert r.attrs["axes"] == tuple(range(rank - len(axes), rank))


def test_reduce_noop_with_empty_axes_vanishes():
    g = assert_canonical_matches(one_op("ReduceSum", dict(x=(2, 3)), opset=13, noop_with_empty_axes=1))
    assert kinds(g) == ["Reshape"]


# ------------------------------------------------------------------ layout family

@pytest.mark.parametrize("op,inputs,consts,attrs,opset", [
    ("Reshape", dict(x=(2, 3, 4)), dict(s=i64(0, -1, 2)), {}, 13),
    ("Flatten", dict(x=(2, 3, 4, 5)), {}, dict(axis=2), 13),
    ("Squeeze", dict(x=(2, 1, 4, 1)), dict(a=i64(1, 3)), {}, 13),
    ("Unsqueeze", dict(x=(2, 4)), {}, dict(axes=[0, 3]), 11),
])
def test_reshape_likes_become_views(op, inputs, consts, attrs, opset):
    g = assert_canonical_matches(one_op(op, inputs, consts, opset=opset, **attrs))
    assert kinds(g) == ["Reshape"]
    r = node(g, "Reshape")
    assert r.attrs["view"] is True and r.attrs["shape"] == g.tensor(g.outputs[0]).shape
    assert r.inputs == ("x",)


def test_transpose_and_concat():
    g = assert_canonical_matches(one_op("Transpose", dict(x=(2, 3, 4))))
    assert node(g, "Transpose").attrs["perm"] == (2, 1, 0)
    g = assert_canonical_matches(one_op("Concat", dict(a=(2, 3), b=(2, 5)), dict(c=f32(2, 1)), axis=-1))
    assert node(g, "Concat").attrs["axis"] == 1


@pytest.mark.parametrize("opset,consts,attrs,outputs", [
    (13, dict(s=i64(2, 4, 1)), dict(axis=1), 3),
    (11, {}, dict(axis=-1, split=[3, 1]), 2),
    (18, {}, dict(axis=1, num_outputs=3), 3),
])
def test_split_sizes(opset, consts, attrs, outputs):
    shape = (2, 7, 4)
    g = assert_canonical_matches(one_op("Split", dict(x=shape), consts, opset=opset, outputs=outputs, **attrs))
    split = node(g, "Split")
    assert sum(split.attrs["sizes"]) == shape[split.attrs["axis"]] and len(split.attrs["sizes"]) == outputs


@pytest.mark.parametrize("opset,consts,attrs,expected", [
    (9, {}, dict(starts=[1], ends=[3], axes=[1]), ((0, 1, 0), (4, 3, 6), (1, 1, 1))),
    (13, dict(s=i64(-3, 1), e=i64(-1, 9 ** 18), a=i64(2, 0), st=i64(2, 1)), {}, ((1, 0, 3), (4, 5, 5), (1, 1, 2))),
    (13, dict(s=i64(-100), e=i64(2)), {}, ((0, 0, 0), (2, 5, 6), (1, 1, 1))),
])
def test_slice_full_rank_clamped(opset, consts, attrs, expected):
    g = assert_canonical_matches(one_op("Slice", dict(x=(4, 5, 6)), consts, opset=opset, **attrs))
    s = node(g, "Slice")
    assert (s.attrs["starts"], s.attrs["ends"], s.attrs["steps"]) == expected


@pytest.mark.parametrize("indices,axis", [(np.asarray([2, -1, 0], np.int64), 1), (np.asarray(-2, np.int64), 0),
                                          (np.asarray([[0, 1], [3, 3]], np.int64), -1)])
def test_gather_constant_indices_made_non_negative(indices, axis):
    g = assert_canonical_matches(one_op("Gather", dict(x=(4, 5, 4)), dict(i=indices), axis=axis))
    gather = node(g, "Gather")
    assert gather.attrs["axis"] >= 0
    assert (g.tensor(gather.inputs[1]).const >= 0).all()


@pytest.mark.parametrize("opset,consts,attrs,order", [
    (9, {}, dict(pads=[0, 1, 2, 0, 0, 1], value=1.5), None),
    (13, dict(p=i64(0, 0, 1, 2, 0, 0, 3, 1), v=np.float32(-2)), {}, None),
    (18, dict(p=i64(1, 2, 3, 0), a=i64(1, -1)), {}, ["x", "p", "", "a"]),
])
def test_pad_constant_mode(opset, consts, attrs, order):
    shape = (2, 3, 4) if opset == 9 else (1, 2, 3, 4) if opset == 13 else (2, 3, 4)
    g = assert_canonical_matches(one_op("Pad", dict(x=shape), consts, opset=opset, input_order=order, **attrs))
    pad = node(g, "Pad")
    assert len(pad.attrs["pads"]) == 2 * len(shape) and min(pad.attrs["pads"]) >= 0
    assert isinstance(pad.attrs["value"], float)


@pytest.mark.parametrize("op,attrs,outputs", [("Identity", {}, 1), ("Dropout", dict(ratio=0.3), 2)])
def test_identity_and_dropout_vanish(op, attrs, outputs):
    model = one_op(op, dict(x=(2, 3)), opset=11, outputs=outputs, **attrs)
    del model.graph.output[1:]                                      # the Dropout mask is not used
    g = assert_canonical_matches(model)
    assert kinds(g) == ["Reshape"] and g.outputs == ["y0"]          # graph output == graph input: a view copy


@pytest.mark.parametrize("op,shape,attrs,out", [
    ("MaxPool", (1, 1, 2, 2), dict(kernel_shape=[1, 1], strides=[2, 2]), (1, 1, 1, 1)),
    ("MaxPool", (1, 1, 2, 2), dict(kernel_shape=[1, 2], strides=[2, 2], pads=[0, 1, 0, 0]), (1, 1, 1, 2)),
    ("AveragePool", (1, 1, 2, 2), dict(kernel_shape=[1, 2], strides=[2, 2], pads=[0, 1, 0, 0]), (1, 1, 1, 2)),
])
def test_ceil_mode_window_starting_in_the_end_padding_is_dropped(op, shape, attrs, out):
    """onnx shape inference says ceil((2 - 1) / 2) + 1 = 2 rows; onnxruntime drops the second window."""
    g = assert_canonical_matches(one_op(op, dict(x=shape), ceil_mode=1, **attrs))
    assert g.tensor(g.outputs[0]).shape == out


def test_ceil_mode_layout_that_changes_an_average_divisor_is_unsupported():
    from tpuflow.errors import UnsupportedOpError
    from tpuflow.frontend import load
    with pytest.raises(UnsupportedOpError, match="ceil_mode"):
        load(one_op("AveragePool", dict(x=(1, 1, 2, 2)), kernel_shape=[2, 1], strides=[2, 2], pads=[1, 0, 0, 0],
                    ceil_mode=1, count_include_pad=1))
