"""emit_lookup (lowering/ops/quant_ops.py): the SG gathers it emits for a LookupTable tile, run on the functional
model, give numpy's table[codes] on every element of tiles of any shape: more channels than lanes, a start lane
past 0, several samples, row windows of a bigger held tensor (rows not contiguous), runs longer than one
gather's 16-bit width; every gather stays inside one lane group and picks d1coor only on three banks."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuflow.chip import load_chip
from tpuflow.hwmodel.functional import Machine
from tpuflow.isa import LocalTensor, Prec, SgTiu, StrideMode
from tpuflow.lowering.emitter import Emitter
from tpuflow.lowering.ops.quant_ops import LOOKUP_RUN, emit_lookup
from tpuflow.lowering.tensors import LTile, make_tile

CHIP = load_chip("sg2260")
LANES, LANE_BYTES = CHIP.lanes, CHIP.lmem_bytes_per_lane
TABLE_AT = 15 * CHIP.bank_bytes


def _lookup(src: LTile, out: LTile, seed: int):
    rng = np.random.default_rng(seed)
    table = rng.integers(-128, 128, 256).astype(np.int8)
    codes = rng.integers(-128, 128, src.shape).astype(np.int8)
    m = Machine(CHIP, 1 << 16)
    for lane in range(LANES):
        m.write_local(LocalTensor(lane * LANE_BYTES + TABLE_AT, (1, 1, 1, 256), (256, 256, 256, 1), Prec.INT8),
                      table.reshape(1, 1, 1, 256))
    m.write_local(LocalTensor(src.addr, src.shape, src.strides, Prec.INT8), codes)
    ctx = SimpleNamespace(chip=CHIP, em=Emitter(CHIP))
    emit_lookup(ctx, out, src, TABLE_AT)
    gathers = [r.instr for r in ctx.em.records]
    for g in gathers:
        assert isinstance(g, SgTiu) and (g.res0_addr // LANE_BYTES) % LANES + g.res0_c <= LANES
        assert (g.op == "pe_s_gather_d1coor") == g.banks_disjoint(CHIP)
        m.execute(g)
    got = m.read_local(LocalTensor(out.addr, out.shape, out.strides, Prec.INT8))
    np.testing.assert_array_equal(got, table[codes.view(np.uint8)])
    return gathers


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
