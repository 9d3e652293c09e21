"""emit_lookup (lowering/ops/quant_ops.py): the SG gathers it emits for a LookupTable tile, run on the functional
model, give numpy's table[codes] on every element of tiles of any shape: more channels than lanes, a start lane
past 0, several samples, row windows of a bigger held tensor (rows not contiguous), runs longer than one
gather's 16-bit width; every gather stays inside one lane group and picks d1coor only on three banks."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tpuflow.isa import Prec, SgTiu, StrideMode
from tpuflow.lowering.ops.quant_ops import LOOKUP_RUN
from tpuflow.lowering.tensors import LTile, make_tile
from lookup_run import CHIP, LANE_BYTES, LANES, run_lookup


def _gather_ok(g) -> None:
    assert isinstance(g, SgTiu) and (g.res0_addr // LANE_BYTES) % LANES + g.res0_c <= LANES
    assert (g.op == "pe_s_gather_d1coor") == g.banks_disjoint(CHIP)


def _lookup(src: LTile, out: LTile, seed: int):
    return run_lookup(src, out, seed, check=_gather_ok)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(1, 140), h=st.integers(1, 6), w=st.integers(1, 40),
       start=st.integers(0, LANES - 1), same_bank=st.booleans(), seed=st.integers(0, 1000))
def test_whole_tiles(n, c, h, w, start, same_bank, seed):
    src = make_tile(CHIP, start * LANE_BYTES + 0x100, (n, c, h, w), Prec.INT8)
    out = make_tile(CHIP, start * LANE_BYTES + (0x4000 if same_bank else 5 * CHIP.bank_bytes), (n, c, h, w), Prec.INT8)
    gathers = _lookup(src, out, seed)
    pieces, c0 = 0, 0                   # channel runs that stay in one lane group
    while c0 < c:
        c0 += LANES - (start + c0) % LANES
        pieces += 1
    assert len(gathers) == n * pieces


@settings(max_examples=15, deadline=None)
@given(c=st.integers(1, 100), rows=st.integers(1, 5), r0=st.integers(0, 3), w=st.integers(2, 30),
       seed=st.integers(0, 1000))
def test_row_windows_of_a_held_tensor(c, rows, r0, w, seed):
    """Rows [r0, r0 + rows) of a held (1, c, 12, w) tensor, strided FREE views as Planned.held gives them; the
    result into a plain tile: row by row on both."""
    held = make_tile(CHIP, 0x200, (1, c, 12, w), Prec.INT8)
    src = LTile(held.addr + r0 * w, (1, c, rows, w), Prec.INT8, held.strides, StrideMode.FREE)
    out = make_tile(CHIP, 9 * CHIP.bank_bytes, (1, c, rows, w), Prec.INT8, compact=True)
    _lookup(src, out, seed)


def test_long_runs_are_cut_at_the_16_bit_width():
    src = make_tile(CHIP, 0, (1, 2, 1, LOOKUP_RUN + 100), Prec.INT8)
    out = make_tile(CHIP, 8 * CHIP.bank_bytes, (1, 2, 1, LOOKUP_RUN + 100), Prec.INT8)
    gathers = _lookup(src, out, 0)
    assert [g.res0_w for g in gathers] == [LOOKUP_RUN, 100]
