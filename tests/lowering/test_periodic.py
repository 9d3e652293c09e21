"""Operands that repeat over leading row axes (a causal mask broadcast over attention heads): the
row view classifies them PERIODIC, the row group that takes them keeps the matrix cut its
neighbours use, and tile rows read operand rows modulo the period, across tile borders."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tpuflow.lowering.ewise import Kind, classify, row_period
from tpuflow.lowering.groups import form_groups
from tpuflow.options import CompileOptions
from tpuflow.pipeline import load_graph, verify

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e"))
from onnx_build import ModelBuilder  # noqa: E402


@given(st.lists(st.integers(1, 5), min_size=2, max_size=4), st.data())
def test_a_periodic_operand_repeats_exactly_every_period_rows(out_shape, data):
    split = data.draw(st.integers(1, len(out_shape) - 1))
    j = data.draw(st.integers(1, split))
    shape = tuple([1] * j + out_shape[j:])
    kind = classify(shape, tuple(out_shape), split)
    rows, cols = int(np.prod(out_shape[:split])), int(np.prod(out_shape[split:]))
    operand = np.arange(int(np.prod(shape))).reshape(shape)
    broadcast = np.broadcast_to(operand, out_shape).reshape(rows, cols)
    if kind is Kind.PERIODIC:
        period = row_period(shape, tuple(out_shape), split)
        flat = operand.reshape(-1, cols)
        assert all((broadcast[r] == flat[r % period]).all() for r in range(rows))
    else:                                    # every other kind it may be is exact too
        assert kind in (Kind.FULL, Kind.COL, Kind.SCALAR, Kind.ROW)


def _masked_softmax(heads: int, seq: int, cols: int):
    b = ModelBuilder(seed=4)
    x = b.input("x", (1, heads, seq, cols))
    mask = b.const("mask", np.random.default_rng(1).random((1, 1, seq, cols)) > 0.3)
    y = b.node("Where", [mask, x, b.const("low", np.float32(-1e4))], "masked")
    b.output(b.node("Softmax", [y], "probs", axis=-1))
    return b.model()


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_a_mask_over_heads_joins_the_softmax_row_group_and_verifies(dtype):
    model = _masked_softmax(3, 48, 40)        # 144 rows: tiles of up to 64 rows cross the 48-row period
    graph = load_graph(model)
    (group,) = form_groups(graph)
    assert group.kind == "row" and [n.op_type for n in group.nodes] == ["Where", "Softmax"] and group.split == 3
    assert classify((1, 1, 48, 40), (1, 3, 48, 40), 3) is Kind.PERIODIC
    assert row_period((1, 1, 48, 40), (1, 3, 48, 40), 3) == 48
    result = verify(model, None, CompileOptions(dtype=dtype), race_check=True)
    assert result["ok"], result["outputs"]
