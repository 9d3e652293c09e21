"""lowering.prepare.fold_reduction_scales: a row sum's scalar scale is applied before the sum is stored."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from onnx_build import ModelBuilder  # noqa: E402
from tpuflow.frontend import load  # noqa: E402
from tpuflow.lowering.prepare import fold_reduction_scales  # noqa: E402
from tpuflow.options import CompileOptions  # noqa: E402
from tpuflow.pipeline import verify  # noqa: E402


def mean_square(reader: str = "Mul", count: int = 512):
    """sqrt(sum((20 x)**2) / count) over a row of `count` (keepdims 0, as magika's: a new view after the
    sum, so it is stored between two groups): the sum alone (about 400 * count) passes fp16's
    largest value (65504), the mean does not; `reader` Mul by 1 / count, Div by count, or Div of count by the sum."""
    b = ModelBuilder(seed=3)
    x = b.node("Mul", [b.input("x", (1, count)), b.const("twenty", np.float32(20.0))], "x20")
    total = b.node("ReduceSum", [b.node("Mul", [x, x], "sq"), b.const("axes", np.asarray([1], np.int64))], "sum",
                   keepdims=0)
    if reader == "Mul":
        scaled = b.node("Mul", [total, b.const("inv", np.float32(1.0 / count))], "mean")
    elif reader == "Div":
        scaled = b.node("Div", [total, b.const("n", np.float32(count))], "mean")
    else:
        scaled = b.node("Div", [b.const("n", np.float32(count)), total], "mean")
    b.output(b.node("Sqrt", [scaled], "y"))
    return b.model()


def test_a_scalar_reader_of_a_row_sum_becomes_its_scale():
    for reader, scale in (("Mul", 1.0 / 512), ("Div", 1.0 / 512)):
        graph = fold_reduction_scales(load(mean_square(reader)))
        (reduce,) = [n for n in graph.nodes() if n.op_type == "ReduceSum"]
        assert np.isclose(reduce.attr("scale"), scale) and not any(n.name == "mean" for n in graph.nodes())
        assert graph.consumers(reduce.outputs[0])[0].op_type == "Sqrt"


def test_a_scalar_divided_by_a_row_sum_is_not_a_scale():
    graph = load(mean_square("DivBy"))
    assert fold_reduction_scales(graph) is graph


def test_a_sum_past_fp16s_range_before_its_scale_verifies_at_fp16():
    """Stored unscaled in fp16 the sum would be inf (magika's layer norm gave NaN at --dtype fp16)."""
    result = verify(mean_square(), "sg2260", CompileOptions(dtype="fp16"))
    assert result["ok"], result["outputs"]
