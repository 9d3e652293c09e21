"""Random verify inputs in each input's own dtype and in a range valid for its consumers."""

from __future__ import annotations

import numpy as np
import pytest
from control_models import model, vi
from onnx import TensorProto as T, helper

from tpuflow.frontend.graph import Graph, TensorInfo
from tpuflow.frontend.inputs import random_inputs, tolerance_dtype


def graph_of(m, dtypes: dict[str, tuple[tuple[int, ...], str]], outputs=("y",)) -> Graph:
    tensors = {k: TensorInfo(k, s, d) for k, (s, d) in dtypes.items()}
    for o in outputs:
        tensors.setdefault(o, TensorInfo(o, (1,), "float32"))
    return Graph("g", [], tensors, list(dtypes), list(outputs), m, 17)


@pytest.mark.parametrize("rows,high", [(3, 3), (50, 4)])
def test_gather_indices_stay_inside_the_gathered_axis(rows, high):
    m = model([helper.make_node("Gather", ["emb", "ids"], ["y"], axis=0)], [vi("ids", [64], T.INT64)],
              [vi("y", [64, 8])], [("emb", np.zeros((rows, 8), np.float32))])
    ids = random_inputs(graph_of(m, {"ids": ((64,), "int64")}), 0)["ids"]
    assert ids.dtype == np.int64 and ids.min() == 0 and ids.max() == high - 1


def test_divisors_are_never_zero_and_dtypes_are_kept():
    m = model([helper.make_node("Div", ["a", "d"], ["y"])], [vi("a", [256], T.INT32), vi("d", [256], T.INT32)],
              [vi("y", [256], T.INT32)])
    feeds = random_inputs(graph_of(m, {"a": ((256,), "int32"), "d": ((256,), "int32"),
                                       "h": ((4,), "float16"), "b": ((4,), "bool")}), 0)
    assert feeds["d"].min() >= 1 and feeds["a"].min() == 0
    assert [feeds[k].dtype.name for k in "adhb"] == ["int32", "int32", "float16", "bool"]


def test_fp32_inputs_are_the_historic_standard_normal_draws():
    g = graph_of(None, {"x": ((3, 4), "float32"), "z": ((5,), "float32")})
    rng = np.random.default_rng(11)
    feeds = random_inputs(g, 11)
    np.testing.assert_array_equal(feeds["x"], rng.standard_normal((3, 4)).astype(np.float32))
    np.testing.assert_array_equal(feeds["z"], rng.standard_normal(5).astype(np.float32))


def test_tolerance_follows_a_16_bit_model():
    assert tolerance_dtype(graph_of(None, {"x": ((2,), "float32")}), "fp32") == "fp32"
    assert tolerance_dtype(graph_of(None, {"x": ((2,), "float16")}), "fp32") == "fp16"
    assert tolerance_dtype(graph_of(None, {"x": ((2,), "float16")}), "bf16") == "bf16"
