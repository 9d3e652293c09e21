"""The emitter protocol (lowering.emitplan): frozen plans that name their LMEM buffers inside
their region without overlaps, and one clear error (no retry) when a group fits no region. The
data-movement emitter (ops.movement) on every path: planning is pure, the emission puts its
buffers exactly where the plan says, an LMEM-only path that fits no region plans None, and a
path with a DDR fallback falls back."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import tpuflow.lowering.compiler as compiler
from tpuflow.errors import LoweringError
from tpuflow.lowering.context import LowerCtx
from tpuflow.lowering.emitplan import REGIONS, FrozenPlan, NoBuffersPlan, PlannedEmission
from tpuflow.lowering.mathops import CONST_REGION_BYTES
from tpuflow.lowering.ops import lmem_move
from tpuflow.lowering.ops.gather import GatherTiling
from tpuflow.lowering.ops.movement import MoveEmitter, MovePlan
from tpuflow.options import CompileOptions
from tpuflow.pipeline import load_graph, verify
from tpuflow.chip import load_chip

sys.path.insert(0, str(Path(__file__).parents[1] / "frontend"))
from op_models import node_model  # noqa: E402

# (model, dtype, matmul path): together they exercise every converted emitter
CASES = [("small_cnn", "fp16", "tiu"), ("alexnet", "fp32", "tiu"), ("squeezenet", "fp16", "tiu"),
         ("mobilenetv2", "fp16", "tiu"), ("bert_layer", "fp16", "tiu"), ("mlp", "fp32", "tile"),
         ("gpt_block", "fp32", "tile"), ("small_cnn", "fp32", "tile")]


def _plans_of(model: str, dtype: str, matmul: str, monkeypatch) -> list[tuple[str, FrozenPlan, dict]]:
    """Every plan _emit_group chose while lowering `model`: (emitter kind, plan, region windows)."""
    seen = []
    choose = compiler.choose_plan

    def recording(emission, ctx, group):
        plan = choose(emission, ctx, group)
        seen.append((group.kind, plan, {r: ctx.window(r) for r in REGIONS}))
        return plan

    monkeypatch.setattr(compiler, "choose_plan", recording)
    options = CompileOptions(dtype=dtype, matmul=matmul)
    compiler.lower(load_graph(model), load_chip("sg2260"), options)
    return seen


@pytest.fixture(scope="module")
def plans():
    out = []
    with pytest.MonkeyPatch.context() as mp:
        for case in CASES:
            out += [(case,) + p for p in _plans_of(*case, mp)]
    return out


def _overlaps(buffers, reused) -> list[tuple]:
    spans = sorted((off, off + size, name) for name, off, size in buffers if size > 0)
    return [(a, b) for a, b in zip(spans, spans[1:]) if b[0] < a[1] and not {a[2], b[2]} & reused]


def test_plans_are_frozen_hashable_and_named(plans):
    assert plans, "no emitter ran"
    for _, _, plan, _ in plans:
        assert dataclasses.is_dataclass(plan) and type(plan).__dataclass_params__.frozen
        hash(plan)
        with pytest.raises(dataclasses.FrozenInstanceError):
            plan.region = "elsewhere"
        assert all(isinstance(name, str) and name for name, _, _ in plan.buffers)
        assert plan.region in REGIONS


def test_plan_buffers_lie_in_their_region_without_overlaps(plans):
    for case, kind, plan, windows in plans:
        start, end = windows[plan.region]
        assert plan.window == (start, end), (case, kind)
        for name, off, size in plan.buffers:
            assert start <= off and off + size <= end, (case, kind, name, off, size, plan.window)
        assert not _overlaps(plan.buffers, type(plan).reused), (case, kind, _overlaps(plan.buffers, type(plan).reused))


def test_every_converted_emitter_is_exercised(plans):
    kinds = {type(p).__name__ for _, _, p, _ in plans}
    assert {"PoolPlan", "LrnPlan", "GemvPlan", "NoBuffersPlan", "ConvPlan", "RowPlan", "TilePlan", "TileConvPlan", "MatmulPlan"} <= kinds, kinds


class _NeverFits:
    """A protocol emitter that fits no region."""
    calls: list[str] = []

    def __init__(self, ctx, group):
        pass

    def plan(self, region):
        _NeverFits.calls.append(region)
        return None

    def emit(self, plan):
        raise AssertionError("nothing to emit")


class _Unsupported(_NeverFits):
    def plan(self, region):
        _NeverFits.calls.append(region)
        raise LoweringError("node X: an unsupported shape")


def _lower_small_cnn_with(emitter, monkeypatch):
    _NeverFits.calls = []
    monkeypatch.setattr(compiler, "emitter_for", lambda group, options: emitter)
    options = CompileOptions(dtype="fp32", layer_group="off")
    with pytest.raises(LoweringError) as err:
        compiler.lower(load_graph("small_cnn"), load_chip("sg2260"), options)
    return str(err.value)


def test_a_group_fitting_no_region_gives_one_error_naming_the_layer(monkeypatch):
    graph = load_graph("small_cnn")
    message = _lower_small_cnn_with(_NeverFits, monkeypatch)
    first = compiler.form_groups(compiler.materialize_broadcasts(compiler.fold_matmul_transposes(graph)))[0]
    assert message.startswith(f"layer {first.anchor.name} ")
    assert "does not fit LMEM: no tiling fits in any region (per lane: ring " in message
    assert _NeverFits.calls == list(REGIONS)       # each region planned once, nothing emitted


def test_an_error_that_is_not_about_space_is_not_retried(monkeypatch):
    message = _lower_small_cnn_with(_Unsupported, monkeypatch)
    assert message == "node X: an unsupported shape"
    assert _NeverFits.calls == [REGIONS[0]]


class _FakeEmission:
    """Plans per region (None: does not fit); the ring plan asks for a comparison with the next."""

    def __init__(self, plans: dict, wider: bool):
        self.plans, self.wider, self.asked = plans, wider, []

    def plan(self, region):
        self.asked.append(region)
        return self.plans.get(region)

    def prefers(self, plan, other):
        return plan.buffers > other.buffers        # the fake's stand-in for "weights resident"

    def wants_wider(self, plan):
        return self.wider and plan.region == "ring"


def _fake_plan(region: str, size: int) -> FrozenPlan:
    return FrozenPlan(region, (0, 1 << 20), (("weights", 0, size),) if size else ())


@pytest.mark.parametrize("ring, full, wider, chosen, asked", [
    (1, 2, False, "ring", ["ring"]),                 # the first fitting region wins
    (None, 2, False, "full", ["ring", "full"]),      # nothing fits the ring
    (1, 2, True, "full", ["ring", "full"]),          # compared, and the full plan is preferred
    (2, 1, True, "ring", ["ring", "full"]),          # compared, the ring plan stays
    (1, None, True, "ring", ["ring", "full"]),
])
def test_plans_are_chosen_region_by_region(ring, full, wider, chosen, asked):
    plans = {r: _fake_plan(r, s) for r, s in (("ring", ring), ("full", full)) if s is not None}
    emission = _FakeEmission(plans, wider)
    assert compiler.choose_plan(emission, None, None).region == chosen
    assert emission.asked == asked


def _wide_pointwise_conv(cin: int, cout: int):
    """x (1, cin, 2, 2) -> Relu -> 1x1 Conv to cout channels: weights of cin elements per
    output lane; the Relu's buffers sit low in LMEM, so the conv's ring window is above them."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    w = numpy_helper.from_array((np.arange(cout * cin, dtype=np.float32) % 7 - 3).reshape(cout, cin, 1, 1) / 64, "w")
    relu = helper.make_node("Relu", ["x"], ["r"])
    node = helper.make_node("Conv", ["r", "w"], ["y"], kernel_shape=[1, 1])
    graph = helper.make_graph([relu, node], "wide_conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, 2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, 2, 2])], [w])
    return onnx.helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_conv_takes_all_of_lmem_when_that_keeps_its_weights_resident(monkeypatch):
    """Weights of 32500 fp32 per lane fit the whole working area but not the ring's window: the
    ring plan streams them, so the full region's plan (weights resident) is chosen, and the
    program still computes the conv exactly."""
    from tpuflow.pipeline import verify
    model = _wide_pointwise_conv(32500, 64)
    seen = []
    choose = compiler.choose_plan

    def recording(emission, ctx, group):
        plan = choose(emission, ctx, group)
        if group.kind == "conv":
            seen.append((emission.plan("ring"), plan))
        return plan

    monkeypatch.setattr(compiler, "choose_plan", recording)
    options = CompileOptions(dtype="fp32", layer_group="off")
    compiler.lower(load_graph(model), load_chip("sg2260"), options)
    (ring, chosen), = seen
    assert ring is not None and not ring.w_res and ring.ct == 64
    assert chosen.region == "full" and chosen.w_res
    monkeypatch.undo()
    assert verify(model, "sg2260", options)["ok"]


# ---------------------------------------------------------------- the data-movement emitter

def _i64(*values):
    return np.asarray(values, np.int64)


def _behind_neg(op: str, shape, out_shape, consts: dict, **attrs):
    """x -> Neg -> op (so the op reads a live tensor, not a graph input a view could alias)."""
    from onnx import numpy_helper
    nodes = [helper.make_node("Neg", ["x"], ["nx"], name="neg"),
             helper.make_node(op, ["nx", *consts], ["y"], name=f"the_{op.lower()}", **attrs)]
    graph = helper.make_graph(nodes, op, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))],
                              [numpy_helper.from_array(v, k) for k, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def movement_models() -> dict:
    """One model per movement path: {name: (model, the tiling class its movement plans, or None
    for the DDR -> DDR path)}."""
    nearest = {"s": np.asarray([1, 1, 2, 3], np.float32)}
    return {
        "transpose_inner": (node_model("Transpose", {"x": (2, 40, 120)}, perm=[0, 2, 1]), lmem_move.TransposeTiling),
        "transpose_outer": (node_model("Transpose", {"x": (2, 3, 4, 5)}, perm=[1, 0, 2, 3]), None),
        "concat_short": (node_model("Concat", {"a": (1, 700, 1), "b": (1, 700, 3)}, axis=2), lmem_move.RowTiling),
        "concat_long": (node_model("Concat", {"a": (2, 3, 64), "b": (2, 5, 64)}, axis=1), None),
        "split_short": (node_model("Split", {"x": (1, 500, 7)}, {"s": _i64(2, 5)}, outputs=2, axis=2),
                        lmem_move.RowTiling),
        "slice_strided": (node_model("Slice", {"x": (1, 4, 30, 30)}, {"st": _i64(0, 1), "en": _i64(30, 30),
                                                                       "ax": _i64(2, 3), "sp": _i64(2, 2)}),
                          lmem_move.RowTiling),
        "slice_rows": (node_model("Slice", {"x": (1, 4, 30, 30)}, {"st": _i64(1), "en": _i64(20), "ax": _i64(2)}), None),
        "pad_reflect": (node_model("Pad", {"x": (1, 3, 10, 12)}, {"p": _i64(0, 0, 1, 2, 0, 0, 2, 1)}, mode="reflect"),
                        lmem_move.PlaneTiling),
        "pad_constant": (node_model("Pad", {"x": (2, 3, 10, 12)}, {"p": _i64(0, 0, 1, 2, 0, 0, 2, 1),
                                                                   "v": np.asarray(0.5, np.float32)}), lmem_move.PlaneTiling),
        "pad_rows_only": (node_model("Pad", {"x": (1, 3, 10, 12)}, {"p": _i64(0, 0, 1, 0, 0, 0, 2, 0)}), None),
        "resize_nearest": (node_model("Resize", {"x": (1, 4, 6, 8)}, nearest, order=["x", "", "s"], mode="nearest"),
                           lmem_move.PlaneTiling),
        "resize_linear": (node_model("Resize", {"x": (1, 4, 6, 8)}, {"s": np.asarray([1, 1, 2, 2], np.float32)},
                                     order=["x", "", "s"], mode="linear"), lmem_move.RowTiling),
        "expand_inner": (_behind_neg("Expand", (1, 256, 1), (1, 256, 400), {"s": _i64(1, 256, 400)}), lmem_move.PlaneTiling),
        "expand_rows": (_behind_neg("Expand", (1, 1, 400), (3, 256, 400), {"s": _i64(3, 256, 400)}), lmem_move.LmemTiling),
        "gather_runtime": (node_model("Gather", {"i": (2, 128)}, {"t": np.ones((300, 64), np.float32)}, order=["t", "i"],
                                      elem=TensorProto.INT64, out_elem=TensorProto.FLOAT), GatherTiling),
        "gather_const": (node_model("Gather", {"x": (5, 6, 7)}, {"i": _i64(4, 0, 1)}, axis=1), None),
    }


MOVES = movement_models()


def _movement_emissions(model, monkeypatch, dtype: str = "fp32") -> list[tuple]:
    """(chosen plan, each region planned twice more, its emitted records, the group's windows) of
    every movement group while lowering `model` (layer groups off: the DDR movement emitter)."""
    seen = []
    emit_into = PlannedEmission.emit_into

    def recording(self, trial, plan):
        replans = {r: (self.planner.plan(r), self.planner.plan(r)) for r in REGIONS}   # the state it chose in
        start = len(trial.em.records)
        emit_into(self, trial, plan)
        if isinstance(self.planner, MoveEmitter):
            seen.append((plan, replans, trial.em.records[start:], {r: trial.window(r) for r in REGIONS}))

    monkeypatch.setattr(PlannedEmission, "emit_into", recording)
    compiler.lower(load_graph(model), load_chip("sg2260"), CompileOptions(dtype=dtype, layer_group="off"))
    monkeypatch.undo()
    assert seen, "no movement group was emitted"
    return seen


@pytest.mark.parametrize("name", list(MOVES))
def test_movement_plans_are_pure_frozen_and_take_their_path(name, monkeypatch):
    model, tiling = MOVES[name]
    for plan, replans, _, windows in _movement_emissions(model, monkeypatch):
        assert replans[plan.region][0] == plan                    # planning again gives the same plan
        for region, (first, second) in replans.items():
            assert first == second and first.window == windows[region]
        hash(plan)
        if tiling is None:
            assert type(plan) is NoBuffersPlan and plan.buffers == ()
            continue
        assert type(plan) is MovePlan and type(plan.tiling) is tiling, (name, plan)
        start, end = windows[plan.region]
        assert plan.buffers and all(start <= off and off + size <= end for _, off, size in plan.buffers)
        assert not _overlaps(plan.buffers, frozenset())
        offsets = [off for _, off, _ in plan.buffers]
        assert sorted(offsets) == sorted(o for s in plan.tiling.sets for o in s)   # the tiling's buffers, no others


def _lmem_ranges(records, chip):
    out = []
    for record in records:
        acc = record.instr.accesses(chip)
        out += [(r.lo, r.hi) for r in acc.lmem_reads + acc.lmem_writes if r.hi > CONST_REGION_BYTES]
    return out


@pytest.mark.parametrize("name", [n for n, (_, tiling) in MOVES.items() if tiling is not None])
def test_movement_emission_uses_exactly_the_planned_buffers(name, monkeypatch):
    """Every LMEM byte the emitted instructions touch lies inside one planned buffer, and the
    first set's buffers are used at their planned offsets."""
    chip = load_chip("sg2260")
    for plan, _, records, _ in _movement_emissions(MOVES[name][0], monkeypatch):
        ranges = _lmem_ranges(records, chip)
        assert ranges
        for lo, hi in ranges:
            assert any(off <= lo and hi <= off + size for _, off, size in plan.buffers), (name, lo, hi, plan.buffers)
        used = {lo for lo, _ in ranges}
        first = plan.tiling.sets[0]
        assert first[0] in used and first[-1] in used, (name, first, sorted(used))


def _tiny_lmem(monkeypatch, regions=REGIONS, room: int = 16):
    """Planning arenas of `room` bytes per lane in `regions` (the real windows elsewhere)."""
    real = LowerCtx.planning_arena

    def tiny(self, region):
        arena = real(self, region)
        if region in regions:
            arena.limit = arena.used + room
        return arena

    monkeypatch.setattr(LowerCtx, "planning_arena", tiny)


@pytest.mark.parametrize("name", ["transpose_inner", "gather_runtime", "resize_linear"])
def test_an_lmem_only_movement_that_fits_no_region_plans_none(name, monkeypatch):
    _tiny_lmem(monkeypatch)
    graph = load_graph(MOVES[name][0])
    group = next(g for g in compiler.form_groups(compiler.materialize_broadcasts(graph)) if g.kind == "move")
    with pytest.raises(LoweringError) as err:
        compiler.lower(graph, load_chip("sg2260"), CompileOptions(dtype="fp32", layer_group="off"))
    node = group.anchor
    assert str(err.value).startswith(f"layer {node.name} ({node.op_type}): no block of {node.op_type} {node.name} "
                                     f"fits LMEM in any region (per lane: ring ")


@pytest.mark.parametrize("name", ["transpose_inner", "gather_runtime"])
def test_a_movement_that_does_not_fit_the_ring_is_planned_in_all_of_lmem(name, monkeypatch):
    _tiny_lmem(monkeypatch, regions=("ring",))
    (plan, _, _, _), = _movement_emissions(MOVES[name][0], monkeypatch)
    assert plan.region == "full" and isinstance(plan, MovePlan)
    _tiny_lmem(monkeypatch, regions=("ring",))
    assert verify(MOVES[name][0], "sg2260", CompileOptions(dtype="fp32", layer_group="off"))["ok"]


@pytest.mark.parametrize("name", ["concat_short", "split_short", "slice_strided", "pad_reflect", "resize_nearest",
                                  "expand_inner", "expand_rows"])
def test_a_movement_with_a_ddr_path_falls_back_to_it_when_lmem_is_full(name, monkeypatch):
    _tiny_lmem(monkeypatch)
    emissions = _movement_emissions(MOVES[name][0], monkeypatch)
    assert all(type(plan) is NoBuffersPlan for plan, _, _, _ in emissions)
    _tiny_lmem(monkeypatch)
    result = verify(MOVES[name][0], "sg2260", CompileOptions(dtype="fp32", layer_group="off"))
    assert result["ok"] and result["outputs"][0]["max_abs_err"] == 0.0
