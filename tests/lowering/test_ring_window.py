"""LowerCtx.window: a group's LMEM working window stays inside [the floor, the top its residents leave)."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from tpuflow.chip import load_chip
from tpuflow.lowering.context import LowerCtx
from tpuflow.lowering.layergroup import ResidencyPlan, ResidentTensor
from tpuflow.isa import Prec

CHIP = load_chip("sg2260")
BANK = CHIP.bank_bytes
LANE = CHIP.lmem_bytes_per_lane


def _ctx(resident_at: int | None, previous: tuple[int, int]) -> LowerCtx:
    plan = ResidencyPlan()
    if resident_at is not None:          # a tensor the group makes, kept from it on
        plan.tensors["r"] = ResidentTensor("r", (1, 1, 1, 64), Prec.INT8, resident_at, 64, 1, 2)
    ctx = LowerCtx(None, CHIP, None, None, None, None, residency=plan, group_index=1)
    ctx.previous = previous
    return ctx


@settings(max_examples=300, deadline=None)
@given(st.integers(4, LANE // BANK - 4).map(lambda b: b * BANK) | st.none(),
       st.integers(0, LANE // BANK - 2), st.integers(1, 8))
def test_the_ring_window_never_reaches_past_the_residents(resident_at, prev_bank, prev_banks):
    """Whatever the previous group's buffers (even above where this group's resident result lies: the
    bert_base QOperator case, whose QuantizeLinear's work buffer overwrote its own LMEM result's first rows)."""
    previous = (prev_bank * BANK, min(LANE, (prev_bank + prev_banks) * BANK))
    ctx = _ctx(resident_at, previous)
    top = min(CHIP.tile_window_offset, resident_at if resident_at is not None else CHIP.tile_window_offset)
    for region in ("ring", "full"):
        start, end = ctx.window(region)
        assert ctx.window("full")[0] <= start < end <= top, (region, start, end, top, previous)


def test_previous_buffers_above_the_top_leave_the_space_below_it():
    ctx = _ctx(24 * BANK, (28 * BANK, 60 * BANK))
    assert ctx.window("ring")[1] <= 24 * BANK
