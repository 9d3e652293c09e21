"""The lowering's rewrites that let strided LMEM views take the short descriptors (sCONV / sPorD / sCMP
hold no result or operand strides): a settled view and the lane-group pieces of a view read exactly the
elements of the original, lane by lane and byte by byte (hardware.md's addressing, worked out here)."""

from __future__ import annotations

import itertools

import numpy as np

from hypothesis import given, settings
from hypothesis import strategies as st

from tpuflow.chip import load_chip
from tpuflow.isa import Prec, StrideMode
from tpuflow.isa.base import aligned_strides, operand_strides
from tpuflow.lowering.emitter import settled
from tpuflow.lowering.ops.conv import lane_group_pieces
from tpuflow.lowering.tensors import LTile

CHIP = load_chip("sg2260")
LANES, LANE_BYTES = CHIP.lanes, CHIP.lmem_bytes_per_lane


def positions(tile: LTile, c_offset: int = 0) -> dict:
    """(n, c + c_offset, h, w) -> (lane, byte offset) of every element, the strides its mode resolves to."""
    strides = operand_strides(tile.mode, tile.shape, tile.strides, tile.prec, CHIP, tile.addr)
    start, base = (tile.addr // LANE_BYTES) % LANES, tile.addr % LANE_BYTES
    out = {}
    for n, c, h, w in itertools.product(*(range(s) for s in tile.shape)):
        group = (start + c) // LANES
        off = base + (n * strides[0] + group * strides[1] + h * strides[2] + w * strides[3]) * tile.prec.bytes
        out[(n, c + c_offset, h, w)] = ((start + c) % LANES, off)
    return out


@st.composite
def views(draw):
    """A FREE view whose strides are the aligned ones or arbitrary, per axis."""
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 140)), draw(st.integers(1, 3)), draw(st.integers(1, 5)))
    prec = draw(st.sampled_from([Prec.FP32, Prec.FP16]))
    lane = draw(st.integers(0, LANES - 1))
    addr = lane * LANE_BYTES + 64 * draw(st.integers(0, 8))
    eu = CHIP.core.eu_bytes_per_lane // prec.bytes
    aligned = aligned_strides(shape, eu, LANES, lane)
    strides = tuple(a if draw(st.booleans()) else draw(st.integers(0, 400)) for a in aligned)
    return LTile(addr, shape, prec, strides, StrideMode.FREE)


@settings(max_examples=150, deadline=None)
@given(views())
def test_a_settled_view_reads_the_same_elements(tile):
    got = settled(tile, CHIP)
    assert positions(got) == positions(tile)
    start = (tile.addr // LANE_BYTES) % LANES
    aligned = aligned_strides(tile.shape, CHIP.core.eu_bytes_per_lane // tile.prec.bytes, LANES, start)
    used = (tile.n > 1, start + tile.c > LANES, tile.h > 1, tile.w > 1)
    if any(tile.strides) and all(s == a for u, s, a in zip(used, tile.strides, aligned) if u):
        assert got.mode == StrideMode.ALIGNED       # only a pure broadcast (all strides 0) is kept as written


@settings(max_examples=150, deadline=None)
@given(views())
def test_lane_group_pieces_cover_the_view_once_in_aligned_pieces(tile):
    pieces = lane_group_pieces([tile], CHIP)
    covered = {}
    for c0, count, (piece,) in pieces:
        assert piece.c == count
        covered.update(positions(piece, c0))
    assert covered == positions(tile)
    assert sum(count for _, count, _ in pieces) == tile.c
    if len(pieces) > 1:
        assert all(piece.mode == StrideMode.ALIGNED for _, _, (piece,) in pieces)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([Prec.FP32, Prec.FP16, Prec.BF16]), st.integers(1, 70), st.integers(1, 9),
       st.floats(-4, 4, width=32), st.integers(0, 2 ** 32 - 1))
def test_lin_mac_as_multiply_then_add_computes_what_lin_mac_computes(prec, c, w, scale, seed):
    """Emitter.lin writes lin.mac (no tpu-mlir converter) as sAR mul + add: fp32 results are bit-identical
    to lin.mac's; a 16-bit result rounds the product once more (within one ulp of the result); a c that
    overlaps dst keeps lin.mac."""
    import numpy as np
    from tpuflow.hwmodel.functional import Machine
    from tpuflow.hwmodel.functional.floats import to_f32
    from tpuflow.isa import ArTiu, LinTiu, LocalTensor
    from tpuflow.lowering.emitter import Emitter
    from tpuflow.lowering.tensors import make_tile
    rng = np.random.default_rng(seed)
    a, acc, dst = (make_tile(CHIP, lane * LANE_BYTES + off, (1, c, 1, w), p)
                   for lane, off, p in ((3, 0, Prec.FP32), (3, 0x2000, Prec.FP32), (3, 0x4000, prec)))
    results = []
    for fused in (True, False):
        em, m = Emitter(CHIP), Machine(CHIP, 64)
        for t in (a, acc):
            m.write_local(LocalTensor(t.addr, t.shape, t.strides, t.prec), rng.standard_normal(t.shape) * 3)
        rng = np.random.default_rng(seed)
        if fused:
            em.tiu(LinTiu(op="mac", **dst.fields("res0", with_shape=True), **a.fields("opd0"),
                          opd1_addr=int(np.float32(scale).view(np.uint32)), opt_opd1_const=1, **acc.fields("opd2")))
        else:
            em.lin("mac", dst, a, float(scale), acc)
            assert [type(r.instr) for r in em.records] == [ArTiu, ArTiu]
        for r in em.records:
            m.execute(r.instr)
        results.append(to_f32(m.read_local(LocalTensor(dst.addr, dst.shape, dst.strides, prec)), prec))
    ulp = {Prec.FP32: 0.0, Prec.FP16: 2.0 ** -10, Prec.BF16: 2.0 ** -7}[prec]
    m = Machine(CHIP, 64)
    m.write_local(LocalTensor(a.addr, a.shape, a.strides, a.prec), rng.standard_normal(a.shape) * 3)
    stored = m.read_local(LocalTensor(a.addr, a.shape, a.strides, a.prec))
    product = np.abs(to_f32(stored, Prec.FP32) * np.float32(scale))
    # the product rounded to the result's precision: within an ulp of the product, plus the result's rounding
    assert np.all(np.abs(results[1] - results[0]) <= ulp * (product + np.abs(results[0])))
    em = Emitter(CHIP)
    em.lin("mac", acc, a, float(scale), acc)
    assert [type(r.instr) for r in em.records] == [LinTiu]


def test_a_compared_scalar_is_written_as_it_is_read():
    """Emitter.cmp writes a float scalar opd1 in a 16-bit opd0's precision when it is exact there (the short
    sCMP then holds it, tpu-mlir reading it in opd0's precision), else as fp32 bits with precision FP32."""
    from tpuflow.codegen.sg2260 import descriptor_form
    from tpuflow.lowering.emitter import Emitter
    from tpuflow.lowering.tensors import make_tile
    dst = make_tile(CHIP, 0x2000, (1, 8, 1, 16), Prec.FP32)     # sCMP's result is in opd2's precision
    cases = []
    for a_prec, value in ((Prec.FP16, 0.5), (Prec.FP16, 0.1), (Prec.FP32, 0.1), (Prec.BF16, 0.5)):
        em = Emitter(CHIP)
        em.cmp("sel_gt", dst, make_tile(CHIP, 0x4000, dst.shape, a_prec), value, 1.0, 0.0)
        ins = em.records[0].instr
        cases.append((ins.opd1_addr, Prec(ins.opt_opd1_prec), descriptor_form(ins)))
    f32 = int(np.float32(0.1).view(np.uint32))
    assert cases == [(0x3800, Prec.FP16, "sCMP"), (f32, Prec.FP32, "CMP"), (f32, Prec.FP32, "sCMP"),
                     (0x3F000000, Prec.BF16, "sCMP")]
