"""A lookup over a map of few channels spread over the lanes (lowering/ops/quant_ops.py emit_lookup with staging
buffers, _spread_lookup; lowering.tiling.lane_spread): on the functional model it gives numpy's table[codes] on
every element whatever the channels, rows, start lane, samples and row strides; it is taken exactly when the
shared cost model finds it faster, which on a 16-channel map of many rows it is (about lanes / channels times
fewer gather cycles); lane_spread's copies cover every row once and fill whole lane groups (48 or 96 channels
wrap into more of them)."""

from __future__ import annotations

import math
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from tpuflow.chip import load_chip
from tpuflow.hwmodel.timing.cost import tiu_cycles
from tpuflow.isa import CwBcTiu, Prec, SgTiu, StrideMode
from tpuflow.isa.tiu import TIU_STRIDE_MAX
from tpuflow.lowering.ops.quant_ops import _lookup_gathers, lookup_stage_shape
from tpuflow.lowering.tensors import LTile, make_tile, tile_bytes_per_lane
from tpuflow.lowering.tiling import MAX_SPREAD_COPIES, lane_spread, steps
from lookup_run import run_lookup

CHIP = load_chip("sg2260")
LANES, LANE_BYTES, BANK = CHIP.lanes, CHIP.lmem_bytes_per_lane, CHIP.bank_bytes
TABLE_AT = 15 * BANK
STAGE = (2 * BANK, 6 * BANK)


def _run(src: LTile, out: LTile, seed: int, stage=STAGE):
    """The instructions emit_lookup gives (checked to give table[codes] on the functional model)."""
    return run_lookup(src, out, seed, stage)


def _cycles(instrs) -> int:
    return sum(tiu_cycles(i, CHIP) for i in instrs)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(1, 140), h=st.integers(1, 24), w=st.integers(1, 70),
       start=st.integers(0, LANES - 1), seed=st.integers(0, 1000))
def test_spread_lookup_is_exact_and_never_slower(n, c, h, w, start, seed):
    src = make_tile(CHIP, start * LANE_BYTES + 0x100, (n, c, h, w), Prec.INT8)
    out = make_tile(CHIP, start * LANE_BYTES + 10 * BANK, (n, c, h, w), Prec.INT8)
    shape = lookup_stage_shape(CHIP, c, h, w)
    if shape is not None:
        assert tile_bytes_per_lane(CHIP, shape, Prec.INT8) <= 4 * BANK
    instrs = _run(src, out, seed)
    plain = _lookup_gathers(CHIP, out, src, TABLE_AT)
    spread = any(isinstance(i, CwBcTiu) for i in instrs)
    assert _cycles(instrs) <= _cycles(plain)
    assert spread == (instrs != plain)
    if not spread:
        assert instrs == plain
    else:
        assert shape is not None and all(i.op == "l_copy" for i in instrs if isinstance(i, CwBcTiu))


@settings(max_examples=15, deadline=None)
@given(c=st.sampled_from([8, 16, 24, 32, 48, 96]), rows=st.integers(2, 9), r0=st.integers(0, 3), w=st.integers(20, 90),
       seed=st.integers(0, 1000))
def test_row_windows_of_a_held_tensor_into_itself(c, rows, r0, w, seed):
    """Rows [r0, r0 + rows) of a held (1, c, 12, w) tensor looked up in place (strided FREE views as
    Planned.held gives them)."""
    held = make_tile(CHIP, 0x200, (1, c, 12, w), Prec.INT8)
    view = LTile(held.addr + r0 * w, (1, c, rows, w), Prec.INT8, held.strides, StrideMode.FREE)
    _run(view, view, seed)


def test_sixteen_channels_of_many_rows_take_the_lanes():
    """(1, 16, 64, 300): four copies of 16 rows; the gathers take a quarter of the cycles of gathering in place."""
    src = make_tile(CHIP, 0, (1, 16, 64, 300), Prec.INT8)
    out = make_tile(CHIP, 10 * BANK, (1, 16, 64, 300), Prec.INT8)
    instrs = _run(src, out, 1)
    gathers = [i for i in instrs if isinstance(i, SgTiu)]
    copies = [i for i in instrs if isinstance(i, CwBcTiu)]
    assert len(copies) == 8 and {g.res0_c for g in gathers} == {64} and sum(g.res0_w for g in gathers) == 16 * 300
    plain = _lookup_gathers(CHIP, out, src, TABLE_AT)
    assert _cycles(gathers) * 4 <= _cycles(plain) + 4 * 11 * len(gathers)
    assert _cycles(instrs) * 3 < _cycles(plain)


def test_no_staging_no_spread_and_full_lanes_stay():
    src = make_tile(CHIP, 0, (1, 16, 64, 300), Prec.INT8)
    out = make_tile(CHIP, 10 * BANK, (1, 16, 64, 300), Prec.INT8)
    assert not any(isinstance(i, CwBcTiu) for i in _run(src, out, 2, stage=None))
    assert lookup_stage_shape(CHIP, 64, 64, 300) is None and lookup_stage_shape(CHIP, 128, 64, 300) is None


@given(channels=st.integers(1, 200), rows=st.integers(1, 500), lanes=st.sampled_from([8, 16, 32, 64]))
def test_lane_spread_covers_every_row_once_in_whole_lane_groups(channels, rows, lanes):
    copies, per = lane_spread(channels, rows, lanes)
    blocks = steps(rows, per)
    assert len(blocks) == copies and sum(r for _, r in blocks) == rows
    whole = lanes // math.gcd(channels, lanes)             # copies whose channels fill whole lane groups
    assert copies <= min(whole, MAX_SPREAD_COPIES) and per == -(-rows // min(whole, rows, MAX_SPREAD_COPIES))
    shape = lookup_stage_shape(SimpleNamespace(lanes=lanes), channels, rows, 7)
    groups = lambda c: -(-c // lanes)  # noqa: E731
    if shape is not None:                                  # fewer gather cycles, else no staging
        assert shape == (1, copies * channels, per, 7) and groups(copies * channels) * per < groups(channels) * rows
    else:
        assert groups(copies * channels) * per >= groups(channels) * rows


def test_channels_that_do_not_divide_the_lanes_wrap_into_more_lane_groups():
    """48 channels: four copies of a quarter of the rows fill three lane groups (3/4 of the in-place cycles);
    96: two copies of half (3/4); 64 and 192 fill theirs already."""
    assert lookup_stage_shape(CHIP, 48, 40, 100) == (1, 192, 10, 100)
    assert lookup_stage_shape(CHIP, 96, 40, 100) == (1, 192, 20, 100)
    assert lookup_stage_shape(CHIP, 64, 40, 100) is None and lookup_stage_shape(CHIP, 192, 40, 100) is None
    src = make_tile(CHIP, 0, (1, 48, 40, 100), Prec.INT8)
    out = make_tile(CHIP, 10 * BANK, (1, 48, 40, 100), Prec.INT8)
    instrs = _run(src, out, 3)
    gathers = [i for i in instrs if isinstance(i, SgTiu)]
    assert len([i for i in instrs if isinstance(i, CwBcTiu)]) == 8 and sum(g.res0_w for g in gathers) == 3 * 1000


def test_rows_too_far_apart_for_a_copy_are_gathered_in_place():
    """A row stride past the TIU's 16-bit stride fields (35000 bytes): the copies could not address the
    rows, so the lookup gathers in place (bert_base's fp32 qdq program failed to encode before)."""
    src = make_tile(CHIP, 0, (1, 16, 2, 35000), Prec.INT8)
    out = make_tile(CHIP, 5 * BANK, (1, 16, 2, 35000), Prec.INT8)
    assert src.strides[2] > TIU_STRIDE_MAX
    assert not any(isinstance(i, CwBcTiu) for i in _run(src, out, 3))
