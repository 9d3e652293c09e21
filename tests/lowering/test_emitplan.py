"""The emitter protocol (lowering.emitplan): frozen plans that name their LMEM buffers inside
their region without overlaps, and one clear error (no retry) when a group fits no region."""

from __future__ import annotations

import dataclasses

import pytest

import tpuflow.lowering.compiler as compiler
from tpuflow.errors import LoweringError
from tpuflow.lowering.emitplan import REGIONS, FrozenPlan, LegacyPlan
from tpuflow.options import CompileOptions
from tpuflow.pipeline import load_graph
from tpuflow.chip import load_chip

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


def test_converted_plans_are_frozen_hashable_and_named(plans):
    converted = [p for _, _, p, _ in plans if not isinstance(p, LegacyPlan)]
    assert converted, "no converted emitter ran"
    for plan in converted:
        assert dataclasses.is_dataclass(plan) and type(plan).__dataclass_params__.frozen
        hash(plan)
        with pytest.raises(dataclasses.FrozenInstanceError):
            plan.region = "elsewhere"
        assert all(isinstance(name, str) and name for name, _, _ in plan.buffers)
        assert plan.region in REGIONS


def test_plan_buffers_lie_in_their_region_without_overlaps(plans):
    for case, kind, plan, windows in plans:
        if isinstance(plan, LegacyPlan):
            continue
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
