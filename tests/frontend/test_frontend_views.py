"""1-D layers run as [N, C, L, 1]: elementwise ops move ahead of the views that drop the trailing
unit axis, so the view pairs between consecutive 1-D layers cancel (a chain keeps no Reshape
between its convs) and the canonical graph still computes what the model computes."""

from __future__ import annotations

import sys
from pathlib import Path

from frontend_util import assert_canonical_matches, kinds

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e"))
from onnx_build import ModelBuilder  # noqa: E402


def _conv1d(b, x, name, c=8):
    return b.node("Conv", [x, b.weight(f"w{name}", (c, c, 3)), b.weight(f"b{name}", (c,))], f"c{name}",
                  kernel_shape=[3], pads=[1, 1])


def _between_convs(graph) -> list[str]:
    ops = kinds(graph)
    first, last = ops.index("Conv"), len(ops) - 1 - ops[::-1].index("Conv")
    return ops[first:last + 1]


def test_relu_and_batchnorm_between_1d_convs_leave_no_views():
    b = ModelBuilder(seed=51)
    x = _conv1d(b, b.input("x", (2, 8, 40)), 0)
    x = b.node("BatchNormalization", [x, b.weight("s", (8,), positive=True), b.weight("bb", (8,)),
                                      b.weight("m", (8,)), b.weight("v", (8,), positive=True)], "bn")
    x = _conv1d(b, b.node("Relu", [x], "r"), 1)
    b.output(x)
    graph = assert_canonical_matches(b.model())
    assert _between_convs(graph) == ["Conv", "Relu", "Conv"]        # BatchNorm folded, views cancelled


def test_a_swish_between_1d_convs_leaves_no_views():
    """Sigmoid and Mul both read the conv's output: every runtime operand of the Mul comes through
    the same kind of view, so both move."""
    b = ModelBuilder(seed=52)
    x = _conv1d(b, b.input("x", (1, 8, 33)), 0)
    x = b.node("Mul", [x, b.node("Sigmoid", [x], "sg")], "sw")
    b.output(_conv1d(b, b.node("MaxPool", [x], "p", kernel_shape=[2], strides=[2]), 1))
    graph = assert_canonical_matches(b.model())
    assert "Reshape" not in _between_convs(graph)
    assert all(len(graph.tensor(n.outputs[0]).shape) == 4 for n in graph.nodes() if n.op_type in ("Sigmoid", "Mul"))
