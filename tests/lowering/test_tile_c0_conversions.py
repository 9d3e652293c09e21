"""The NC1HWC0 layout of tile-path activations (issue 16), on the functional model: the NCHW <-> NC1HWC0
conversions in DDR round-trip any shape and float dtype (the last channel block zero padded), the
C0-blocked Zn operand fills its slots as the CUBE's Zn formula says, and its DMAs move contiguous runs of
whole 32-byte channel blocks (hypothesis)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuflow.chip import load_chip
from tpuflow.hwmodel.functional import Machine
from tpuflow.hwmodel.functional.layouts import zn_offsets
from tpuflow.isa import Prec
from tpuflow.lowering.emitter import Emitter
from tpuflow.lowering.ops.tile_operands import C0RowsOperand, c0_elems, c0_to_nchw, nchw_to_c0

CHIP = load_chip("sg2260")
PRECS = {"fp32": Prec.FP32, "fp16": Prec.FP16, "bf16": Prec.BF16}
SRC, DST, BACK = 4096, 1 << 20, 2 << 20


def _np_dtype(prec: Prec):
    return np.float32 if prec == Prec.FP32 else prec.storage_dtype


def _values(shape, prec: Prec, seed: int) -> np.ndarray:
    """Small integers (exact in every float type), stored as the DDR holds them."""
    x = np.random.default_rng(seed).integers(-60, 60, size=shape).astype(np.float32)
    if prec == Prec.BF16:
        return (x.view(np.uint32) >> 16).astype(np.uint16)
    return x.astype(_np_dtype(prec))


def reference_c0(x: np.ndarray, c0: int) -> np.ndarray:
    """numpy's NC1HWC0 of an NCHW array: (N, C1, H, W, C0), the missing channels zero."""
    n, c, h, w = x.shape
    c1 = -(-c // c0)
    padded = np.zeros((n, c1 * c0, h, w), x.dtype)
    padded[:, :c] = x
    return padded.reshape(n, c1, c0, h, w).transpose(0, 1, 3, 4, 2)


def _run(em: Emitter, loads: list[tuple[int, np.ndarray]]) -> Machine:
    m = Machine(CHIP, 4 << 20, lmem_fill=0x5A)
    m.ddr.data[:] = 0xA5            # garbage where nothing is written: padding must be written as zeros
    for addr, data in loads:
        m.load_ddr(addr, data)
    for record in em.records:
        m.execute(record.instr)
    return m


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(PRECS)), st.integers(1, 3), st.integers(1, 70), st.integers(1, 9), st.integers(1, 9),
       st.integers(0, 1 << 16))
def test_nchw_c0_round_trip(dtype, n, c, h, w, seed):
    """NCHW -> NC1HWC0 writes exactly numpy's blocked array (padding zero); NC1HWC0 -> NCHW gives the
    input back."""
    prec = PRECS[dtype]
    c0 = c0_elems(CHIP, prec)
    x = _values((n, c, h, w), prec, seed)
    ctx = SimpleNamespace(chip=CHIP, prec=prec, em=Emitter(CHIP))
    nchw_to_c0(ctx, SRC, DST, x.shape, prec)
    c0_to_nchw(ctx, DST, BACK, x.shape, prec)
    m = _run(ctx.em, [(SRC, x)])
    blocked = reference_c0(x, c0)
    got = m.read_ddr(DST, blocked.nbytes).view(x.dtype).reshape(blocked.shape)
    np.testing.assert_array_equal(got, blocked)
    back = m.read_ddr(BACK, x.nbytes).view(x.dtype).reshape(x.shape)
    np.testing.assert_array_equal(back, x)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(sorted(PRECS)), st.integers(1, 4), st.integers(1, 5), st.integers(1, 6), st.data())
def test_c0_rows_operand_fills_zn_tiles(dtype, blocks, h, w, data):
    """A C0-blocked B tile (channel rows kt, pixel columns pt of one image) lands in its slot in the Zn
    order (off(i, j) = (i // r0) * Np * r0 + j * r0 + i % r0), from one DMA whose DDR side is kt / C0
    runs of pt * C0 contiguous elements (at least 32 bytes each)."""
    prec = PRECS[dtype]
    c0 = c0_elems(CHIP, prec)
    c, hw = blocks * c0, h * w
    x = _values((1, c, h, w), prec, data.draw(st.integers(0, 1 << 16)))
    b0 = data.draw(st.integers(0, blocks - 1))
    kt = data.draw(st.integers(1, blocks - b0)) * c0
    p0 = data.draw(st.integers(0, hw - 1))
    pt = data.draw(st.integers(1, hw - p0))
    ctx = SimpleNamespace(chip=CHIP, prec=prec, em=Emitter(CHIP))
    op = C0RowsOperand(ctx, DST, c, hw, hw)
    slot = CHIP.tile_slot_address(1, 0)
    op.load(slot, b0 * c0, kt, p0, pt)
    dmas = [r.instr for r in ctx.em.records]
    assert len(dmas) == 1
    m = _run(ctx.em, [(DST, reference_c0(x, c0).reshape(-1))])
    _, cp = op.padded(kt, pt)
    lane, off = divmod(slot, CHIP.lmem_bytes_per_lane)
    got = m.lmem.data[lane, off:off + kt * cp * prec.bytes].view(x.dtype)
    expect = x.reshape(c, hw)[b0 * c0:b0 * c0 + kt, p0:p0 + pt]
    np.testing.assert_array_equal(got[zn_offsets(kt, pt, cp, c0)], expect)
    desc = dmas[0]
    assert desc.src_wsize == c0 and desc.src_wstride == 1 and desc.src_hstride == c0    # pixels' C0 runs adjoin
    assert desc.src_hsize == pt and desc.src_nsize == kt // c0 and desc.src_nstride == hw * c0
    assert pt * c0 * prec.bytes >= 32
