"""The graph verifier names the node, the broken invariant and the fix; OpKind trait sets."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tpuflow.frontend import canonical, load
from tpuflow.frontend.draft import make_node
from tpuflow.frontend.graph import TensorInfo
from tpuflow.frontend.ops import ALL, BINARY, CONTRACTION, ELEMENTWISE, POOL, REDUCE, UNARY, VIEW, OpKind
from tpuflow.frontend.verify import GraphLintError, lint, lint_graph
from tpuflow import models


def conv_graph():
    w = np.zeros((4, 3, 3, 3), np.float32)
    tensors = {"x": TensorInfo("x", (1, 3, 8, 8), "float32"), "w": TensorInfo("w", w.shape, "float32", w),
               "y": TensorInfo("y", (1, 4, 8, 8), "float32"), "z": TensorInfo("z", (1, 4, 8, 8), "float32")}
    nodes = [make_node("conv", "Conv", ("x", "w"), ("y",), dict(kernel_shape=(3, 3), strides=(1, 1),
                                                                 dilations=(1, 1), group=1, pads=(1, 1, 1, 1))),
             make_node("act", "Relu", ("y",), ("z",))]
    return nodes, tensors, ["x"], ["z"]


def broken(mutate):
    nodes, tensors, inputs, outputs = conv_graph()
    mutate(nodes, tensors, inputs, outputs)
    return nodes, tensors, inputs, outputs


def test_a_correct_graph_passes():
    lint(*conv_graph())


@pytest.mark.parametrize("mutate,phrases", [
    (lambda n, t, i, o: n.reverse(), ["node 'act' (Relu)", "neither produced earlier", "topological order"]),
    (lambda n, t, i, o: n.__setitem__(1, replace(n[1], name="conv")), ["node 'conv'", "name used twice"]),
    (lambda n, t, i, o: t.__setitem__("y", TensorInfo("y", (1, 4, 7, 7), "float32")),
     ["node 'conv' (Conv)", "(1, 4, 7, 7)", "(1, 4, 8, 8)"]),
    (lambda n, t, i, o: n.__setitem__(0, replace(n[0], attrs={"group": 1})), ["node 'conv'", "attributes", "missing"]),
    (lambda n, t, i, o: n.__setitem__(1, replace(n[1], op_type="Gelu")), ["node 'act' (Gelu)", "not an OpKind"]),
    (lambda n, t, i, o: (t.__setitem__("w", TensorInfo("w", (4, 3, 3, 3), "float32")), i.append("w")),
     ["node 'conv' (Conv)", "input 1 ('w') must be constant"]),
    (lambda n, t, i, o: t.__setitem__("w", TensorInfo("w", (4, 3, 3, 3), "float16", np.zeros((4, 3, 3, 3), np.float32))),
     ["tensor 'w'", "constant value is float32"]),
    (lambda n, t, i, o: t.__setitem__("x", TensorInfo("x", (1, 3, -1, 8), "float32")), ["tensor 'x'", "not static"]),
    (lambda n, t, i, o: o.append("ghost"), ["graph output 'ghost'", "produced by no node"]),
    (lambda n, t, i, o: n.append(make_node("again", "Relu", ("y",), ("z",))), ["node 'again'", "produced twice"]),
    (lambda n, t, i, o: t.__setitem__("x", TensorInfo("x", (1, 4, 8, 8), "float32")),
     ["node 'conv' (Conv)", "do not fit", "group"]),
])
def test_each_broken_invariant_names_node_and_fix(mutate, phrases):
    with pytest.raises(GraphLintError) as info:
        lint(*broken(mutate), stage="test pass")
    message = str(info.value)
    assert message.startswith("graph check after test pass: ") and "; fix: " in message
    for p in phrases:
        assert p in message, message


def test_all_constant_node_is_flagged():
    nodes, tensors, inputs, outputs = conv_graph()
    c = np.ones((1, 4, 8, 8), np.float32)
    tensors["c"] = TensorInfo("c", c.shape, "float32", c)
    nodes.append(make_node("lonely", "Neg", ("c",), ("n",)))
    tensors["n"] = TensorInfo("n", c.shape, "float32")
    with pytest.raises(GraphLintError, match="all inputs are constant"):
        lint(nodes, tensors, inputs, outputs)


def test_a_pass_that_breaks_the_graph_is_caught_between_passes(monkeypatch):
    def bad_fold(draft):
        draft.nodes = draft.nodes[1:]                       # drops the first node, leaves its consumers dangling
        return 1
    monkeypatch.setattr(canonical, "fold_affine_into_conv", bad_fold)
    with pytest.raises(GraphLintError, match="after BatchNormalization folding"):
        load(models.build_model("small_cnn"))


def test_loaded_bundled_graph_is_clean():
    lint_graph(load(models.build_model("gpt_block")))


def test_opkind_trait_sets_are_membership_tests():
    assert OpKind.RELU in UNARY and "Relu" in UNARY and "Relu" in ELEMENTWISE
    assert OpKind("MaxPool") in POOL and "MatMul" in CONTRACTION and "Reshape" in VIEW
    assert "Add" in BINARY and "Add" not in UNARY and "ReduceSum" in REDUCE
    assert {"Conv"} <= ALL and "BatchNormalization" not in ALL and "Gemm" not in ALL
    assert str(OpKind.CONV) == "Conv" and OpKind.CONV == "Conv"
