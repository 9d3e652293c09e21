"""TIMG2COL in the functional model (issue 16): a C0-blocked halo tile expanded into Zn window tiles,
checked against a numpy im2col of the same image and against a direct convolution (so the K order
(channel block, kernel row, kernel column, c0) is the one a weight matrix must follow), over random
halo sizes, kernels, strides, dilations, K ranges and tile splits; the encoding round trip; errors."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from functional_helpers import CHIP
from tpuflow.codegen.linx import decode_blocks, encode_blocks
from tpuflow.hwmodel.functional import ExecutionError, Machine
from tpuflow.hwmodel.functional.layouts import round_up, zn_offsets
from tpuflow.isa import TImg2Col
from tpuflow.isa.base import Prec

DT_PREC = {"FP32": Prec.FP32, "FP16": Prec.FP16, "BF16": Prec.BF16}
LANE = CHIP.lmem_bytes_per_lane


def numpy_im2col(image: np.ndarray, kh: int, kw: int, sy: int, sx: int, dy: int, dx: int, oh: int, ow: int):
    """(C * kh * kw) x (oh * ow) columns of an unpadded C x H x W image, rows in (c, i, j) order (numpy's
    sliding windows, then the dilation and stride picked by slicing)."""
    c = image.shape[0]
    span_h, span_w = (kh - 1) * dy + 1, (kw - 1) * dx + 1
    win = np.lib.stride_tricks.sliding_window_view(image, (span_h, span_w), axis=(1, 2))   # C, H', W', span_h, span_w
    win = win[:, :(oh - 1) * sy + 1:sy, :(ow - 1) * sx + 1:sx, ::dy, ::dx]                   # C, oh, ow, kh, kw
    return win.transpose(0, 3, 4, 1, 2).reshape(c * kh * kw, oh * ow)


@st.composite
def cases(draw):
    dt = draw(st.sampled_from(["FP32", "FP16", "BF16"]))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    sy, sx, dy, dx = (draw(st.integers(1, 2)) for _ in range(4))
    oh, ow = draw(st.integers(1, 3)), draw(st.integers(1, 6))
    in_h = (oh - 1) * sy + (kh - 1) * dy + 1 + draw(st.integers(0, 1))
    in_w = (ow - 1) * sx + (kw - 1) * dx + 1 + draw(st.integers(0, 2))
    c1 = draw(st.integers(1, 2))
    blocks = c1 * kh * kw
    tiles = draw(st.sampled_from([t for t in (1, 2, 3) if blocks % t == 0]))
    per = draw(st.sampled_from([d for d in range(1, blocks // tiles + 1) if (blocks // tiles) % d == 0]))
    k_count = per * tiles
    k_start = draw(st.integers(0, blocks - k_count))
    return TImg2Col(dt=dt, src_addr=5 * LANE + 1024, dst_addr=CHIP.tile_slot_address(1, 3), c1=c1, in_h=in_h,
                    in_w=in_w, kh=kh, kw=kw, out_h=oh, out_w=ow, k_start=k_start, k_count=k_count, tiles=tiles,
                    sy=sy, sx=sx, dy=dy, dx=dx)


def _run(ins: TImg2Col, seed: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """(the C x H x W image the halo holds, the window tiles read back from their slots as K x N)."""
    prec, c0 = DT_PREC[ins.dt], ins.c0(CHIP)
    rng = np.random.default_rng(seed)
    image = rng.integers(-8, 8, (ins.c1 * c0, ins.in_h, ins.in_w)).astype(np.float32)       # exact in every dtype
    halo = image.reshape(ins.c1, c0, ins.in_h, ins.in_w).transpose(0, 3, 2, 1)              # (c1, w, h, c0)
    m = Machine(CHIP, 4096)
    stored = np.zeros(halo.size, prec.storage_dtype)
    stored[:] = _encode(halo.reshape(-1), prec)
    lane, off = divmod(ins.src_addr, LANE)
    m.lmem.data[lane, off:off + stored.nbytes] = stored.view(np.uint8)
    m.execute(ins)
    n = ins.out_h * ins.out_w
    rows = ins.k_count // ins.tiles * c0
    tiles = []
    for t in range(ins.tiles):
        lane, off = divmod(ins.dst_addr + t * LANE, LANE)
        data = m.lmem.data[lane, off:off + ins.tile_bytes(CHIP)].view(prec.storage_dtype)
        tiles.append(_decode(data[zn_offsets(rows, n, round_up(n, CHIP.tile.fractal_n), c0)], prec))
    return image, tiles


def _encode(values: np.ndarray, prec: Prec) -> np.ndarray:
    from tpuflow.hwmodel.functional.floats import encode
    return encode(values, prec)


def _decode(values: np.ndarray, prec: Prec) -> np.ndarray:
    from tpuflow.hwmodel.functional.floats import to_f32
    return to_f32(values, prec)


@settings(max_examples=60, deadline=None)
@given(cases(), st.integers(0, 2**31))
def test_timg2col_is_numpy_im2col_in_the_c1_kh_kw_c0_order(ins, seed):
    assume(ins.tile_bytes(CHIP) <= CHIP.tile.slot_bytes)          # the instruction refuses a tile past a slot
    image, tiles = _run(ins, seed)
    c0 = ins.c0(CHIP)
    ref = numpy_im2col(image, ins.kh, ins.kw, ins.sy, ins.sx, ins.dy, ins.dx, ins.out_h, ins.out_w)
    # numpy's rows run (c, i, j) with c = b * c0 + c'; TIMG2COL's run (b, i, j, c')
    ref = ref.reshape(ins.c1, c0, ins.kh, ins.kw, -1).transpose(0, 2, 3, 1, 4).reshape(ref.shape)
    got = np.concatenate(tiles, axis=0)
    assert np.array_equal(got, ref[ins.k_start * c0:(ins.k_start + ins.k_count) * c0])
    assert TImg2Col in {type(b) for b in decode_blocks(encode_blocks([ins]))} and decode_blocks(encode_blocks([ins]))[0] == ins


@settings(max_examples=20, deadline=None)
@given(cases(), st.integers(0, 2**31))
def test_weights_in_the_same_k_order_give_the_direct_convolution(ins, seed):
    """W (Cout x C1*kh*kw*C0, K in TIMG2COL's order) . window == the convolution summed tap by tap."""
    full = replace(ins, k_start=0, k_count=ins.c1 * ins.kh * ins.kw, tiles=ins.c1)     # a tile per channel block
    assume(full.tile_bytes(CHIP) <= CHIP.tile.slot_bytes)
    image, tiles = _run(full, seed)
    window = np.concatenate(tiles, axis=0)
    c, c0 = image.shape[0], full.c0(CHIP)
    w = np.random.default_rng(seed + 1).integers(-3, 4, (5, c, full.kh, full.kw)).astype(np.float64)
    w_k = w.reshape(5, full.c1, c0, full.kh, full.kw).transpose(0, 1, 3, 4, 2).reshape(5, -1)
    direct = np.zeros((5, full.out_h, full.out_w))
    for i in range(full.kh):
        for j in range(full.kw):
            patch = image[:, i * full.dy::full.sy, j * full.dx::full.sx][:, :full.out_h, :full.out_w]
            direct += np.einsum("oc,chw->ohw", w[:, :, i, j], patch)
    assert np.array_equal(w_k @ window.astype(np.float64), direct.reshape(5, -1))


def test_bad_geometry_and_oversized_tiles_are_refused():
    base = dict(dt="FP16", src_addr=0, dst_addr=CHIP.tile_slot_address(1, 0), c1=1, in_h=3, in_w=10, kh=3, kw=3,
                out_h=1, out_w=8, k_start=0, k_count=9)
    TImg2Col(**base)
    with pytest.raises(ValueError, match="beyond the halo"):
        TImg2Col(**{**base, "out_w": 9})
    with pytest.raises(ValueError, match="equal tiles"):
        TImg2Col(**{**base, "tiles": 2})
    big = TImg2Col(**{**base, "c1": 4, "in_h": 34, "out_h": 32, "k_count": 36})    # 36 * 16 x 256 fp16: 288 KiB
    with pytest.raises(ExecutionError, match="a slot holds"):
        Machine(CHIP, 4096).execute(big)
