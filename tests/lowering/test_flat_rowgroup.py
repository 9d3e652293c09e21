"""Flat views of purely elementwise row groups on tensors too short to fill the lanes: the group
views its elements as lane_rows x cols (lowering.groups._flat_group), computes exactly what the
cut-point view computes, is chosen only where it moves fewer DMA pieces without starving the lanes
and loses no resident layout, and verifies against onnxruntime."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tpuflow.compare import random_inputs
from tpuflow.hwmodel.functional import run
from tpuflow.isa import TensorDma
from tpuflow.lowering import groups as groups_mod
from tpuflow.lowering.ewise import Kind, classify_flat
from tpuflow.lowering.groups import form_groups
from tpuflow.lowering.tiling import lane_rows
from tpuflow.lowering.ops.rowgroup import RowGroupEmitter
from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model, load_chip, load_graph, verify

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e"))
from onnx_build import ModelBuilder  # noqa: E402

LANES = 64    # sg2260


def _chain(shape: tuple[int, ...], scalar: float, seed: int = 0):
    """(x + y) * scalar - z, relu, with z given without the leading 1s: one elementwise row group."""
    b = ModelBuilder(seed=seed)
    x, y = b.input("x", shape), b.input("y", shape)
    z = b.input("z", shape[1:] if len(shape) > 1 and shape[0] == 1 else shape)
    s = b.node("Add", [x, y], "s")
    m = b.node("Mul", [s, b.const("k", np.float32(scalar))], "m")
    d = b.node("Sub", [m, z], "d")
    b.output(b.node("Relu", [d], "out"))
    return b.model()


def _lstm_gate_add(n: int):
    """An LSTM step's gates: the Add of two (1, n) projections (here inputs), Sigmoid, then a
    (1, n) x (n, 16) MatMul."""
    b = ModelBuilder(seed=3)
    xw, hu = b.input("xw", (1, n)), b.input("hu", (1, n))
    gates = b.node("Sigmoid", [b.node("Add", [xw, hu], "sum")], "gates")
    b.output(b.node("MatMul", [gates, b.weight("w", (n, 16))], "out"))
    return b.model()


def _single_group(model):
    graph = load_graph(model)
    rows = [g for g in form_groups(graph, lanes=LANES) if g.kind == "row"]
    assert len(rows) == 1
    return graph, rows[0]


# ------------------------------------------------------------------ classification

@given(st.lists(st.integers(1, 6), min_size=1, max_size=4), st.data())
def test_flat_classification_is_full_for_the_output_shape_and_scalar_for_one_element(out, data):
    out = tuple(out)
    lead = data.draw(st.integers(0, len(out)))
    assert classify_flat(out[lead:], out) is (Kind.FULL if math.prod(out[:lead]) == 1 else
                                              (Kind.SCALAR if math.prod(out[lead:]) == 1 else None))
    assert classify_flat((1,) * data.draw(st.integers(0, len(out))), out) in (Kind.FULL, Kind.SCALAR)
    other = data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=len(out)).map(tuple))
    padded = (1,) * (len(out) - len(other)) + other
    kind = classify_flat(other, out)
    assert kind is (Kind.FULL if padded == out else Kind.SCALAR if math.prod(other) == 1 else None)


# ------------------------------------------------------------------ the choice

def test_a_1x512_add_takes_the_flat_view_of_whole_lanes():
    graph, group = _single_group(_lstm_gate_add(512))
    assert group.flat_shape == (1, 512)
    assert group.full_shape == (lane_rows(512, LANES), 1, 512 // lane_rows(512, LANES)) == (64, 1, 8)
    assert group.kind_of((1, 512)) is Kind.FULL and group.kind_of((512,)) is Kind.FULL
    assert group.kind_of((1, 1)) is Kind.SCALAR and group.kind_of((2, 256)) is None
    chip = load_chip("sg2260")
    assert RowGroupEmitter.resident_ports(graph, group, chip) == ({}, {})


@pytest.mark.parametrize("shape, split", [((64, 64), 1), ((1, 64, 7, 7), 2), ((1, 8, 4, 4), 2), ((16, 512), 1)])
def test_a_cut_view_whose_rows_fill_the_lanes_is_kept(shape, split):
    _, group = _single_group(_chain(shape, 0.5))
    assert group.flat_shape == () and group.split == split and group.full_shape == shape


@pytest.mark.parametrize("n", [509, 5])
def test_no_flat_view_when_it_would_starve_the_lanes(n):
    """509 is prime (a flat view has one row), 5 elements fill 5 lanes either way."""
    _, group = _single_group(_chain((1, n), 2.0))
    assert group.flat_shape == ()


def test_a_broadcasting_operand_keeps_the_cut_view():
    b = ModelBuilder()
    x = b.input("x", (1, 4, 128))
    b.output(b.node("Add", [x, b.input("r", (1, 4, 1))], "out"))     # one value per row: not flat
    _, group = _single_group(b.model())
    assert group.flat_shape == ()


def test_the_flat_view_moves_whole_rows_per_lane():
    _, program = compile_model(_lstm_gate_add(512), "sg2260", CompileOptions(dtype="fp16", schedule="program"))
    dmas = [i for i, layer in zip(program.gdma, program.gdma_layers)
            if isinstance(i, TensorDma) and layer.startswith(("add", "sigmoid"))]
    assert len(dmas) == 3, "two operand loads and one store"
    for i in dmas:       # the LMEM side: 64 lanes of one 8-element row each, 8 contiguous elements in DDR
        sizes = {side: tuple(getattr(i, f"{side}_{d}size") for d in "nchw") for side in ("src", "dst")}
        assert sizes["src"] == sizes["dst"] == (1, 64, 1, 8), sizes


# ------------------------------------------------------------------ exactness against the cut view

def _outputs(model, dtype: str, flat: bool, monkeypatch):
    """(the functional model's outputs, the GDMA stream) of `model` compiled with (or without) flat views."""
    with monkeypatch.context() as m:
        if not flat:
            m.setattr(groups_mod, "_flat_pays", lambda *a: False)
        graph, program = compile_model(model, "sg2260", CompileOptions(dtype=dtype, schedule="program"))
    return run(program, random_inputs(graph, 7)), program.gdma


leading = st.lists(st.integers(1, 3), min_size=0, max_size=2).filter(lambda d: math.prod(d) < 8)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(leading, st.integers(16, 700), st.sampled_from(["fp32", "fp16"]),
       st.floats(0.01, 4.0) | st.floats(-4.0, -0.01))
def test_the_flat_view_computes_exactly_what_the_cut_view_does(monkeypatch, lead, n, dtype, scalar):
    shape = (1, *lead, n)
    model = _chain(shape, scalar, seed=n)
    _, group = _single_group(model)
    assume(group.flat_shape)                    # the property is about flat groups
    flat, flat_dmas = _outputs(model, dtype, True, monkeypatch)
    cut, cut_dmas = _outputs(model, dtype, False, monkeypatch)
    assert flat_dmas != cut_dmas                # two different views were compiled
    assert flat.keys() == cut.keys() == {"out"}
    assert flat["out"].shape == cut["out"].shape
    assert np.array_equal(flat["out"].view(np.uint8), cut["out"].view(np.uint8))


# ------------------------------------------------------------------ end to end

@pytest.mark.parametrize("dtype, cores", [("fp32", 1), ("fp16", 1), ("fp16", 2)])
def test_an_lstm_gate_add_with_a_flat_view_verifies_against_onnxruntime(dtype, cores):
    model = _lstm_gate_add(512)
    _, group = _single_group(model)
    assert group.flat_shape == (1, 512)
    result = verify(model, "sg2260", CompileOptions(dtype=dtype, cores=cores), race_check=True)
    assert result["ok"], result["outputs"]
