"""Softmax / LogSoftmax over rows too long for a lane: the lowering decomposes them into a
ReduceMax, Exp of the shifted row, ReduceSum and a division (or a Log and a subtraction), each
running in column chunks, only when the whole-row form fits no LMEM region; the programs match
onnxruntime, and a group that still fits nowhere keeps its one-line error."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tpuflow.errors import LoweringError
from tpuflow.frontend import load
from tpuflow.lowering.long_rows import split_long_rows
from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model, verify

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e"))
from onnx_build import ModelBuilder  # noqa: E402


def _chip(folder: Path, lmem: int = 16384) -> str:
    path = folder / "small.toml"
    path.write_text(f'base = "sg2260"\n[core]\nlmem_bytes_per_lane = {lmem}\n')
    return str(path)


def _softmax(op: str, shape):
    b = ModelBuilder(seed=41)
    b.output(b.node(op, [b.node("Relu", [b.input("x", shape)], "r")], "sm", axis=-1))
    return b.model()


def _name(model, op: str) -> str:
    return next(n.name for n in load(model).nodes() if n.op_type == op)


def test_the_decomposition_has_the_column_chunkable_pieces():
    model = _softmax("Softmax", (2, 3000))
    graph = load(model)
    split = split_long_rows(graph, [_name(model, "Softmax")])
    assert [n.op_type for n in split.nodes()] == ["Relu", "ReduceMax", "Sub", "Exp", "ReduceSum", "Div"]
    assert split.outputs == graph.outputs and split.tensor(graph.outputs[0]).shape == (2, 3000)
    assert split_long_rows(graph, [_name(model, "Relu")]) is None


@pytest.mark.parametrize("op,shape,dtype", [("Softmax", (4, 3000), "fp16"), ("LogSoftmax", (2, 3, 2500), "fp32"),
                                            ("Softmax", (3, 5000), "bf16")])
def test_rows_too_long_for_a_lane_run_decomposed_and_match_onnxruntime(tmp_path, op, shape, dtype):
    model, chip = _softmax(op, shape), _chip(tmp_path)
    _, program = compile_model(model, chip, CompileOptions(dtype=dtype))
    name = _name(model, op)
    assert f"{name}/max" in program.layers and name not in program.layers
    result = verify(model, chip, CompileOptions(dtype=dtype), race_check=True)
    assert result["ok"], result["outputs"]


def test_rows_that_fit_keep_the_whole_row_softmax():
    model = _softmax("Softmax", (4, 3000))
    _, program = compile_model(model, None, CompileOptions(dtype="fp16"))
    name = _name(model, "Softmax")
    assert name in program.layers and f"{name}/max" not in program.layers


def test_a_group_that_fits_nowhere_without_a_softmax_keeps_its_error(tmp_path):
    b = ModelBuilder(seed=42)
    b.output(b.node("LRN", [b.input("x", (1, 1024, 4, 4))], "lrn", size=5))
    with pytest.raises(LoweringError, match=r"\(LRN\).*does not fit LMEM"):
        compile_model(b.model(), _chip(tmp_path), CompileOptions(dtype="fp16"))
