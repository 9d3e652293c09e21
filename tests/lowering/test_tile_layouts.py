"""Tile fills through the tile buffer, on the functional model: a runtime matrix in DDR (row- or
column-major, any row stride) reaches its slots in exactly the Nz (A) / Zn (B) order the CUBE reads,
zero padded, whether tile by tile or as one K panel over neighbouring slots; and the DMA walks the
DDR rows (its DDR side is whole tile rows / columns, not K0 pieces). Hypothesis round trips."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuflow.chip import load_chip
from tpuflow.hwmodel.functional import Machine
from tpuflow.hwmodel.functional.layouts import nz_offsets, round_up, zn_offsets
from tpuflow.hwmodel.timing.segments import transfer_sides
from tpuflow.isa import Prec, TensorDma
from tpuflow.lowering.emitter import Emitter
from tpuflow.lowering.ops.tile_operands import RowsOperand

CHIP = load_chip("sg2260")
PRECS = {"fp32": Prec.FP32, "fp16": Prec.FP16}


def fill(layout: str, matrix: np.ndarray, col_major: bool, extra: int, prec: Prec, blocks, panel: bool):
    """Run a RowsOperand's fills of `blocks` into slots T[0..] (neighbouring lanes) on a Machine;
    (machine, emitted instructions)."""
    rows, cols = matrix.shape
    stride = (rows if col_major else cols) + extra
    stored = np.zeros((cols if col_major else rows, stride), np.float32)
    stored[:, :rows if col_major else cols] = matrix.T if col_major else matrix
    ctx = SimpleNamespace(chip=CHIP, prec=prec, em=Emitter(CHIP))
    op = RowsOperand(ctx, layout, 4096, rows, cols, stride, col_major=col_major)
    slots = [CHIP.tile_slot_address(0, s) for s in range(len(blocks))]
    if panel:
        op.load_slots(slots, blocks)
    else:
        for slot, block in zip(slots, blocks):
            op.load(slot, *block)
    m = Machine(CHIP, 1 << 22, lmem_fill=0x5A)
    m.load_ddr(4096, stored.astype(prec.storage_dtype if prec != Prec.FP32 else np.float32))
    for record in ctx.em.records:
        m.execute(record.instr)
    return m, [r.instr for r in ctx.em.records], op


def read_slot(m, slot: int, nbytes: int, prec: Prec) -> np.ndarray:
    lane, off = divmod(slot, CHIP.lmem_bytes_per_lane)
    return m.lmem.data[lane, off:off + nbytes].view(prec.storage_dtype if prec != Prec.FP32 else np.float32)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["nz", "zn"]), st.sampled_from(["fp32", "fp16"]), st.booleans(), st.integers(0, 5),
       st.integers(1, 40), st.integers(1, 3), st.booleans(), st.data())
def test_fills_round_trip_through_the_cube_layouts(layout, dtype, col_major, extra, other, tiles, panel, data):
    """Blocks of an operand (K tiles of whole K0 fractals, or one ragged tile) land as the CUBE's
    layout formulas say, every padding element zero; values are small integers (exact in fp16)."""
    prec = PRECS[dtype]
    k0 = CHIP.tile.k_fractal_bytes // prec.bytes
    ragged = data.draw(st.booleans()) and tiles == 1
    kt = data.draw(st.integers(1, 2 * k0)) if ragged else k0 * data.draw(st.integers(1, 2))
    cap = CHIP.tile.slot_bytes // prec.bytes
    kt = min(kt, cap // round_up(other, 16) // k0 * k0 or k0)
    k_total = kt * tiles
    shape = (other, k_total) if layout == "nz" else (k_total, other)
    rng = np.random.default_rng(7)
    matrix = rng.integers(-8, 9, size=shape).astype(np.float32)
    blocks = [(0, other, t * kt, kt) if layout == "nz" else (t * kt, kt, 0, other) for t in range(tiles)]
    m, instrs, op = fill(layout, matrix, col_major, extra, prec, blocks, panel)
    for t, (r0, r, c0, c) in enumerate(blocks):
        rp, cp = op.padded(r, c)
        got = read_slot(m, CHIP.tile_slot_address(0, t), rp * cp * prec.bytes, prec).astype(np.float32)
        offsets = nz_offsets(r, c, rp, k0) if layout == "nz" else zn_offsets(r, c, cp, k0)
        assert np.array_equal(got[offsets], matrix[r0:r0 + r, c0:c0 + c])
        padding = np.ones(rp * cp, bool)
        padding[offsets.reshape(-1)] = False
        assert not got[padding].any()
    if panel and tiles > 1 and kt % k0 == 0:
        copies = [i for i in instrs if isinstance(i, TensorDma) and not i.fill_constant_en]
        assert len(copies) == 1 and copies[0].dst_csize == tiles      # one DMA, the tile index on lanes


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(["nz", "zn"]), st.booleans(), st.integers(1, 4))
def test_a_fill_reads_whole_ddr_rows(layout, col_major, row_blocks):
    """The DDR side of a fill runs along the source's contiguous axis: its contiguous runs are whole
    tile rows (row-major) or columns (column-major), never a K0 piece of one."""
    prec, k0 = Prec.FP16, CHIP.tile.k_fractal_bytes // 2
    other, kt = 16 * row_blocks, 4 * k0
    shape = (other, kt) if layout == "nz" else (kt, other)
    matrix = np.zeros(shape, np.float32)
    block = (0, other, 0, kt) if layout == "nz" else (0, kt, 0, other)
    _, instrs, _ = fill(layout, matrix, col_major, 3, prec, [block], False)
    (copy,) = [i for i in instrs if isinstance(i, TensorDma) and not i.fill_constant_en]
    src, _ = transfer_sides(copy, CHIP)
    n, c, h, w = src.shape
    ns, cs, hs, ws = src.strides
    contiguous = w if ws == 1 and not (h > 1 and hs == w) else w * h
    source_axis = shape[0] if col_major else shape[1]
    assert ws == 1 and contiguous >= min(source_axis, k0 * 2) and contiguous % min(source_axis, w) == 0
