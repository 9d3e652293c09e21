"""One spec per op kind (frontend/ops.py SPECS): every OpKind has a complete entry, and every
kind's shape function agrees with the shapes import recorded (ONNX shape inference / onnxruntime
on the original model) and with ONNX shape inference run on the exported canonical graph, on every
bundled model and on one-node op models (tests/frontend/op_models.py) that together contain every
OpKind."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T

from frontend_util import assert_canonical_matches
from op_models import node_model
from tpuflow import models
from tpuflow.frontend import load
from tpuflow.frontend import shapes
from tpuflow.frontend.export import graph_to_onnx
from tpuflow.frontend.graph import Graph, TensorInfo
from tpuflow.frontend.draft import make_node
from tpuflow.frontend.ops import (ALL, CATEGORIES, GROUPS, REQUIRED_ATTRS, ROW_AXES, ROW_ROLES, SLICING, SPECS,
                                  OpKind, expected_shapes, spec)
from tpuflow.frontend.verify import GraphLintError, lint

i64 = lambda *v: np.asarray(v, np.int64)  # noqa: E731
X, XY = {"x": (2, 3, 4)}, {"x": (2, 3, 4), "y": (3, 4)}
NO_ROI = np.zeros(0, np.float32)

# name -> (ONNX op, runtime inputs, constants, attributes; elem / out_elem / order go to node_model)
OP_CASES = {
    **{op: (op, X, {}, {}) for op in ("Abs", "Neg", "Reciprocal", "Exp", "Log", "Floor", "Ceil", "Round", "Sign",
                                       "Sin", "Cos", "HardSwish")},
    "HardSigmoid": ("HardSigmoid", X, {}, dict(alpha=0.3, beta=0.4)),
    "LeakyRelu": ("LeakyRelu", X, {}, dict(alpha=0.2)),
    "ThresholdedRelu": ("ThresholdedRelu", X, {}, dict(alpha=0.5)),
    "Clip": ("Clip", X, {"lo": np.float32(-0.5), "hi": np.float32(0.5)}, {}),
    "Cast": ("Cast", X, {}, dict(to=T.INT32, out_elem=T.INT32)),
    **{op: (op, XY, {}, {}) for op in ("Sub", "Max", "Min")},
    **{op: (op, XY, {}, dict(out_elem=T.BOOL)) for op in ("Equal", "Less", "Greater", "LessOrEqual",
                                                           "GreaterOrEqual")},
    **{op: (op, XY, {}, dict(elem=T.BOOL)) for op in ("And", "Or", "Xor")},
    "Not": ("Not", X, {}, dict(elem=T.BOOL)),
    "Mod": ("Mod", XY, {}, dict(fmod=1)),
    "LogSoftmax": ("LogSoftmax", X, {}, dict(axis=-1)),
    "ReduceMax": ("ReduceMax", X, {}, dict(axes=[2], keepdims=1)),
    "ReduceSum": ("ReduceSum", X, {"axes": i64(2)}, dict(keepdims=0)),
    "Expand": ("Expand", {"x": (3, 1)}, {"shape": i64(2, 3, 4)}, {}),
    "Pad": ("Pad", X, {"pads": i64(0, 1, 0, 0, 2, 1)}, {}),
    "Slice": ("Slice", X, {"starts": i64(1), "ends": i64(3), "axes": i64(2)}, {}),
    "Gather": ("Gather", {"x": (5, 4), "i": (3,)}, {}, dict(axis=0)),
    "Resize": ("Resize", {"x": (1, 2, 3, 4)}, {"roi": NO_ROI, "scales": np.asarray([1, 1, 2, 2], np.float32)},
               dict(mode="nearest")),
    "Resample": ("Resize", {"x": (1, 2, 3, 4)}, {"roi": NO_ROI, "scales": np.asarray([1, 1, 2, 1.5], np.float32)},
                 dict(mode="linear")),
    "ConvTranspose": ("ConvTranspose", {"x": (1, 4, 3, 5)},
                      {"w": np.random.default_rng(0).standard_normal((4, 8, 2, 2)).astype(np.float32)},
                      dict(strides=[2, 2])),
    "ScatterND": ("ScatterND", {"x": (4, 3), "u": (2, 3)}, {"i": i64(1, 3).reshape(2, 1)}, dict(order=["x", "i", "u"])),
    "QuantizeLinear": ("QuantizeLinear", X, {"s": np.float32(0.1), "z": np.uint8(3)}, dict(out_elem=T.UINT8)),
    "DequantizeLinear": ("DequantizeLinear", X, {"s": np.float32(0.1), "z": np.int8(-2)},
                         dict(elem=T.INT8, out_elem=T.FLOAT)),
}
LARGE = ("alexnet", "vgg19", "zfnet512", "bert_base")   # hundreds of MB of weights, no kind the others lack
SOURCES = [f"model:{n}" for n in models.names() if n not in LARGE] + [f"op:{n}" for n in OP_CASES] + \
    ["qdq:hard_swish"]        # a QDQ chain the frontend collapses into a LookupTable (frontend/lookup.py)


def op_model(name: str) -> onnx.ModelProto:
    op, inputs, consts, attrs = OP_CASES[name]
    attrs = dict(attrs)
    model = node_model(op, inputs, consts, elem=attrs.pop("elem", T.FLOAT), out_elem=attrs.pop("out_elem", None),
                       order=attrs.pop("order", None), **attrs)
    for vi in model.graph.input:
        if op == "Gather" and vi.name == "i":
            vi.type.tensor_type.elem_type = T.INT64          # runtime indices
    return model


def weightless(graph: Graph) -> Graph:
    """`graph` with its large float constants turned into shaped runtime inputs (shape inference
    needs their shapes only; small and integer constants such as shapes and pads stay)."""
    big = {k for k, t in graph.tensors.items() if t.is_const and t.const.dtype.kind == "f" and t.size > 16}
    tensors = {k: TensorInfo(k, t.shape, t.dtype) if k in big else t for k, t in graph.tensors.items()}
    return Graph(graph.name, list(graph.nodes()), tensors, graph.inputs + sorted(big), graph.outputs)


def onnx_inferred(graph: Graph) -> dict[str, tuple[int, ...]] | None:
    """Shapes ONNX shape inference gives the tensors of the exported canonical graph (its output
    shapes cleared first), or None when the graph has a kind without an ONNX export."""
    try:
        model = graph_to_onnx(weightless(graph))
    except NotImplementedError:
        return None
    for o in model.graph.output:
        o.type.tensor_type.ClearField("shape")
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True).graph
    return {vi.name: tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
            for vi in [*inferred.value_info, *inferred.output] if vi.type.tensor_type.HasField("shape")}


@functools.lru_cache(maxsize=None)
def checked_kinds(source: str) -> frozenset[str]:
    """Load `source`, check every node's shapes against its spec and ONNX inference; its kinds."""
    kind, name = source.split(":")
    if kind == "qdq":
        import lookup_models
        graph = load(getattr(lookup_models, name)())
    else:
        graph = load(models.build_model(name) if kind == "model" else op_model(name))
    inferred = onnx_inferred(graph)
    for node in graph.nodes():
        ins = [graph.tensor(t).shape for t in node.inputs]
        allowed = expected_shapes(node, ins)
        assert len(allowed) == len(node.outputs), node.name
        for t, shapes_ok in zip(node.outputs, allowed):
            assert graph.tensor(t).shape in shapes_ok, (node.name, t, graph.tensor(t).shape, shapes_ok)
            if inferred is not None:
                assert inferred[t] == graph.tensor(t).shape, (node.name, t, inferred[t])
    return frozenset(n.op_type for n in graph.nodes())


@pytest.mark.parametrize("source", SOURCES + [pytest.param(f"model:{n}", marks=pytest.mark.slow) for n in LARGE])
def test_shape_functions_agree_with_recorded_and_onnx_inferred_shapes(source):
    assert checked_kinds(source)


def test_the_checked_models_contain_every_op_kind():
    seen = frozenset().union(*(checked_kinds(s) for s in SOURCES))
    assert {k.value for k in OpKind} - seen == set()


def test_every_op_kind_has_a_complete_spec():
    assert set(SPECS) == set(ALL)
    for kind, s in SPECS.items():
        assert spec(kind.value) is s
        assert s.category in CATEGORIES and s.group in GROUPS and s.row_role in ROW_ROLES, kind
        assert s.slicing in SLICING and s.row_axes in ROW_AXES, kind
        assert callable(s.shape) and s.shape.__module__ == shapes.__name__, kind
        assert all(isinstance(a, str) for a in s.attrs) and all(isinstance(p, int) for p in s.const_inputs), kind
        assert not (s.import_same and s.attrs), kind        # a 1:1 import carries no attributes
        assert s.ceil_mode == (s.category == "pool" and s.slicing == "window"), kind


def test_required_attrs_and_const_inputs_are_views_of_the_specs():
    assert REQUIRED_ATTRS == {k: s.attrs for k, s in SPECS.items() if s.attrs}
    assert REQUIRED_ATTRS[OpKind.CONV] == ("kernel_shape", "strides", "dilations", "group", "pads")
    assert spec("LayerNormalization").const_inputs == (1, 2)


def one_node_graph(op: str, in_shape, out_shape, **attrs):
    tensors = {"x": TensorInfo("x", in_shape, "float32"), "y": TensorInfo("y", out_shape, "float32")}
    return [make_node("n", op, ("x",), ("y",), attrs)], tensors, ["x"], ["y"]


@pytest.mark.parametrize("op,attrs,good,bad", [
    ("Resize", dict(repeats=(1, 1, 2, 3)), (1, 2, 6, 12), (1, 2, 6, 8)),
    ("Resample", dict(axis=3, taps=((0, 1.0, 0, 0.0),) * 5), (1, 2, 3, 5), (1, 2, 3, 4)),
    ("ScatterND", dict(rows=(0,)), (1, 2, 3, 4), (1, 2, 3, 5)),
    ("MaxPool", dict(kernel_shape=(2, 2), strides=(2, 2), dilations=(1, 1), pads=(0, 0, 0, 0)),
     (1, 2, 2, 2), (1, 2, 1, 1)),
])
def test_the_verifier_checks_every_kind_with_its_shape_function(op, attrs, good, bad):
    lint(*one_node_graph(op, (1, 2, 3, 4) if op != "MaxPool" else (1, 2, 5, 5), good, **attrs))
    if op == "MaxPool":
        lint(*one_node_graph(op, (1, 2, 5, 5), (1, 2, 3, 3), **attrs))       # ceil mode is allowed
    with pytest.raises(GraphLintError, match=f"node 'n' \\({op}\\).*output 'y' has shape"):
        lint(*one_node_graph(op, (1, 2, 3, 4) if op != "MaxPool" else (1, 2, 5, 5), bad, **attrs))


@pytest.mark.parametrize("name", ["Floor", "Ceil", "Round", "Sign", "Sin", "Cos", "ThresholdedRelu", "Mod"])
def test_same_name_export_computes_what_the_model_computes(name):
    """Kinds whose spec says export_same (with their attributes: Mod's fmod) run in onnxruntime."""
    assert spec(name).export_same
    assert_canonical_matches(op_model(name))
