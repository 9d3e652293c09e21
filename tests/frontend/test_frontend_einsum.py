"""Einsum rewritten into Transpose / Reshape / ReduceSum / MatMul: random two-operand equations over
every letter role (batch, contracted, free on either side, summed away), ellipses, chains."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from frontend_util import assert_canonical_matches, kinds
from op_models import node_model

from tpuflow.errors import UnsupportedOpError

FAST = settings(max_examples=25, deadline=None, derandomize=True)


@st.composite
def equations(draw):
    letters = iter("abcdefghijkl")
    roles = {role: [next(letters) for _ in range(draw(st.integers(0, hi)))]
             for role, hi in (("batch", 2), ("contract", 2), ("free_a", 2), ("free_b", 2), ("sum_a", 1))}
    a = roles["batch"] + roles["contract"] + roles["free_a"] + roles["sum_a"]
    b = roles["batch"] + roles["contract"] + roles["free_b"]
    out = roles["batch"] + roles["free_a"] + roles["free_b"]
    a, b, out = (draw(st.permutations(x)) for x in (a, b, out))
    sizes = {c: draw(st.integers(1, 4)) for c in "".join(a + b)}
    return "".join(a) + "," + "".join(b) + "->" + "".join(out), [sizes[c] for c in a], [sizes[c] for c in b]


@FAST
@given(eq=equations(), const_b=st.booleans())
def test_two_operand_equations(eq, const_b):
    equation, sa, sb = eq
    if const_b:
        model = node_model("Einsum", {"a": tuple(sa)}, {"b": np.ones(sb, np.float32) * 0.5}, equation=equation)
    else:
        model = node_model("Einsum", {"a": tuple(sa), "b": tuple(sb)}, equation=equation)
    graph = assert_canonical_matches(model, rtol=1e-4, atol=1e-5)
    assert set(kinds(graph)) <= {"Transpose", "Reshape", "ReduceSum", "MatMul"}


@pytest.mark.parametrize("equation,shapes", [
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]), ("bij,bjk,bkl->bil", [(2, 3, 4), (2, 4, 5), (2, 5, 6)]),
    ("ij,jk", [(3, 4), (4, 5)]), ("ijk->i", [(3, 4, 5)]), ("ij->ji", [(3, 4)]), ("i,j->ij", [(3,), (4,)]),
])
def test_ellipsis_implicit_output_chains_and_single_operands(equation, shapes):
    assert_canonical_matches(node_model("Einsum", {f"x{i}": s for i, s in enumerate(shapes)}, equation=equation),
                             rtol=1e-4)


def test_constant_first_operand_is_moved_right():
    w = np.arange(15, dtype=np.float32).reshape(5, 3) / 10
    graph = assert_canonical_matches(node_model("Einsum", {"a": (2, 4, 5)}, {"w": w}, order=["w", "a"],
                                                equation="dh,bld->blh"), rtol=1e-4)
    mm = next(n for n in graph.nodes() if n.op_type == "MatMul")
    assert graph.tensor(mm.inputs[1]).is_const and not graph.tensor(mm.inputs[0]).is_const


@pytest.mark.parametrize("equation,shapes,reason", [("ii->i", [(3, 3)], "repeated subscript (diagonal)"),
                                                    ("ij,ij->ij", [(3, 1), (3, 4)], "broadcast")])
def test_unsupported_equations_name_the_reason(equation, shapes, reason):
    with pytest.raises(UnsupportedOpError, match=re.escape(reason)):
        assert_canonical_matches(node_model("Einsum", {f"x{i}": s for i, s in enumerate(shapes)}, equation=equation))
