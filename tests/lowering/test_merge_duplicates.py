"""lowering.prepare.merge_duplicates: nodes computing what an earlier node computes are merged into it."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from onnx_build import ModelBuilder  # noqa: E402
from tpuflow.frontend import load  # noqa: E402
from tpuflow.lowering.prepare import merge_duplicates  # noqa: E402
from tpuflow.options import CompileOptions  # noqa: E402
from tpuflow.pipeline import compile_model, verify  # noqa: E402


def twice_reshaped(second_shape=(4, 8), second_value=1.0):
    """x -> Reshape(s1) -> Mul(c1) and x -> Reshape(s2) -> Mul(c2), summed: the two branches compute the
    same thing when the shape and scale constants (separate tensors) hold equal values."""
    b = ModelBuilder(seed=2)
    x = b.input("x", (1, 32))
    left = b.node("Mul", [b.node("Reshape", [x, b.const("s1", np.asarray([4, 8], np.int64))], "r1"),
                          b.const("c1", np.float32(1.0))], "m1")
    right = b.node("Mul", [b.node("Reshape", [x, b.const("s2", np.asarray(second_shape, np.int64))], "r2"),
                           b.const("c2", np.float32(second_value))], "m2")
    if second_shape != (4, 8):
        right = b.node("Reshape", [right, b.const("back", np.asarray([4, 8], np.int64))], "r3")
    b.output(b.node("Add", [left, right], "y"))
    return b.model()


def test_equal_computations_on_equal_constants_merge_into_the_first():
    graph = load(twice_reshaped())
    merged = merge_duplicates(graph)
    kinds = [n.op_type for n in merged.nodes()]
    assert kinds.count("Reshape") == 1 and kinds.count("Mul") == 1, kinds
    add = next(n for n in merged.nodes() if n.op_type == "Add")
    assert add.inputs[0] == add.inputs[1]
    assert set(merged.outputs) == set(graph.outputs)


def test_different_constants_or_shapes_do_not_merge():
    by_value = [n.op_type for n in merge_duplicates(load(twice_reshaped(second_value=2.0))).nodes()]
    assert by_value.count("Reshape") == 1 and by_value.count("Mul") == 2, by_value     # equal Reshapes still merge
    graph = load(twice_reshaped(second_shape=(8, 4)))
    assert len(list(merge_duplicates(graph).nodes())) == len(list(graph.nodes()))


def test_a_merged_program_computes_the_model():
    _, program = compile_model(twice_reshaped(), "sg2260", CompileOptions(dtype="fp32"))
    assert "mul_1" in program.tiu_layers and "mul_3" not in program.tiu_layers
    result = verify(twice_reshaped(), "sg2260", CompileOptions(dtype="fp32"))
    assert result["ok"], result["outputs"]
