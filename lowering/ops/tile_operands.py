"""Where the operand tiles of a TILE matmul come from, and how they reach their slots: the Nz / Zn
layouts, constant operands pre-arranged in the weight image, runtime operands in DDR (converted in
flight by the tile buffer, or C0-blocked already: NC1HWC0) or kept in LMEM by a layer group; and the
NCHW <-> NC1HWC0 layout conversions in DDR."""

from __future__ import annotations

import numpy as np

import math

from tpuflow.isa import Prec, TensorDma, TImg2Col, TMove, global_lmem_address, is_lmem
from tpuflow.lowering.context import LowerCtx
from tpuflow.lowering.emitter import MAX_DMA_DIM, _sizes, _split_big_dims
from tpuflow.lowering.tensors import DRegion


def tile_copy(ctx: LowerCtx, dst: DRegion, src: DRegion) -> None:
    """A copy between LMEM and the tile window: one TMOVE per descriptor on the tile buffer's DMA port
    (the TILE queue) when the chip has one (tile.move_port_bytes_per_cycle > 0), else GDMA commands.
    A side in DDR always goes on the GDMA: the lowering keeps DDR traffic on one queue (so DDR hazards
    need no waits), and the GDMA, a queue of its own, runs ahead of the TILE blocks where a move would
    wait for the TILE queue to reach it (measured: weights DDR -> slots on the port were slower)."""
    chip = ctx.chip
    window = any(is_lmem(a, chip) and (a - chip.core.gdma_lmem_base_address) % chip.lmem_bytes_per_lane
                 >= chip.tile_window_offset for a in (src.addr, dst.addr))
    if not chip.tile.move_port_bytes_per_cycle or not window or not (is_lmem(src.addr, chip) and is_lmem(dst.addr, chip)):
        ctx.em.region_copy(dst, src)
        return
    pieces = (list(_split_big_dims(src, dst)) if src.shape == dst.shape
              else [(src.addr, src.shape, src.strides, dst.addr, dst.shape, dst.strides)])
    for piece in pieces:
        if len(piece) == 5:
            s_addr, d_addr, shape, s_st, d_st = piece
            s_shape = d_shape = shape
        else:
            s_addr, s_shape, s_st, d_addr, d_shape, d_st = piece
        if math.prod(s_shape) != math.prod(d_shape) or max(s_shape + d_shape) > MAX_DMA_DIM:
            ctx.em.region_copy(dst, src)          # the GDMA path reports the error
            return
        ctx.em.tile(TMove(desc=TensorDma(src_start_addr=s_addr, dst_start_addr=d_addr, **_sizes("src", s_shape, s_st),
                                         **_sizes("dst", d_shape, d_st), src_data_format=int(src.prec))))


def ceil_to(x: int, m: int) -> int:
    return -(-x // m) * m


def nz_layout(block: np.ndarray, rows_p: int, cols_p: int, c0: int) -> np.ndarray:
    """A (rows x cols) block as flat Nz: off(i,j) = (j//c0)*rows_p*c0 + i*c0 + j%c0 (zero padded)."""
    padded = np.zeros((rows_p, cols_p), block.dtype)
    padded[:block.shape[0], :block.shape[1]] = block
    return padded.reshape(rows_p, cols_p // c0, c0).transpose(1, 0, 2).reshape(-1)


def zn_layout(block: np.ndarray, rows_p: int, cols_p: int, r0: int) -> np.ndarray:
    """A (rows x cols) block as flat Zn: off(i,j) = (i//r0)*cols_p*r0 + j*r0 + i%r0 (zero padded)."""
    padded = np.zeros((rows_p, cols_p), block.dtype)
    padded[:block.shape[0], :block.shape[1]] = block
    return padded.reshape(rows_p // r0, r0, cols_p).transpose(0, 2, 1).reshape(-1)


class Operand:
    """Where the A (Nz) or B (Zn) tiles of a matmul come from."""

    def __init__(self, ctx: LowerCtx, layout: str, rows: int, cols: int):
        self.ctx, self.layout, self.rows, self.cols = ctx, layout, rows, cols
        self.prec = ctx.prec
        self.k0 = ctx.chip.tile.k_fractal_bytes // self.prec.bytes
        self.fm = ctx.chip.tile.fractal_m

    def shift(self, offset: int) -> tuple[int, int]:
        """(rows, columns) by which `offset` elements move a block of the stored matrix (batches of a
        batched matmul are such shifts of one matrix); only offset 0 outside RowsOperand."""
        if offset:
            raise ValueError("a constant operand is not batched by offsets")
        return 0, 0

    def padded(self, r: int, c: int) -> tuple[int, int]:
        if self.layout == "nz":
            return ceil_to(r, self.fm), ceil_to(c, self.k0)
        return ceil_to(r, self.k0), ceil_to(c, self.fm)

    def load(self, slot_addr: int, r0: int, r: int, c0: int, c: int) -> None:
        raise NotImplementedError

    def load_slots(self, slot_addrs: list[int], blocks: list[tuple[int, int, int, int]]) -> None:
        """Fill slot_addrs[i] with block (r0, r, c0, c) i."""
        for addr, block in zip(slot_addrs, blocks):
            self.load(addr, *block)


class ConstOperand(Operand):
    """A constant matrix pre-arranged tile by tile in the weight image (one contiguous copy each)."""

    def __init__(self, ctx, layout, matrix: np.ndarray, key: str, tile_rows: int, tile_cols: int):
        super().__init__(ctx, layout, *matrix.shape)
        self.matrix, self.key, self.tile_rows, self.tile_cols = matrix, key, tile_rows, tile_cols

    def load(self, slot_addr, r0, r, c0, c) -> None:
        rp, cp = self.padded(r, c)
        key = (f"{self.key}:{self.layout}:{r0}:{c0}:{r}:{c}",)
        addr = self.ctx.weights.lookup(key, self.prec)
        if addr is None:
            block = self.matrix[r0:r0 + r, c0:c0 + c]
            flat = nz_layout(block, rp, cp, self.k0) if self.layout == "nz" else zn_layout(block, rp, cp, self.k0)
            addr = self.ctx.weights.add(key, flat, self.prec)
        n = rp * cp
        tile_copy(self.ctx, DRegion(global_lmem_address(slot_addr, self.ctx.chip), (1, 1, 1, n), (n, n, n, 1), self.prec),
                  DRegion(addr, (1, 1, 1, n), (n, n, n, 1), self.prec))

    def load_slots(self, slot_addrs, blocks) -> None:
        """Runs of equal-sized tiles bound for neighbouring lanes' slots come from one contiguous
        stretch of the weight image in one DMA (one lane per tile): a single tile is too small
        to spread over the DRAM interleave, a run of them is not."""
        lane_bytes, i = self.ctx.chip.lmem_bytes_per_lane, 0
        while i < len(blocks):
            j = i + 1
            while (j < len(blocks) and slot_addrs[j] == slot_addrs[j - 1] + lane_bytes
                   and self.padded(*blocks[j][1::2]) == self.padded(*blocks[i][1::2])):
                j += 1
            if j - i == 1:
                self.load(slot_addrs[i], *blocks[i])
            else:
                self._load_run(slot_addrs[i], blocks[i:j])
            i = j

    def _load_run(self, slot_addr: int, blocks) -> None:
        rp, cp = self.padded(*blocks[0][1::2])
        key = (f"{self.key}:{self.layout}:run:" + ";".join(f"{r0}:{r}:{c0}:{c}" for r0, r, c0, c in blocks),)
        addr = self.ctx.weights.lookup(key, self.prec)
        if addr is None:
            layout = nz_layout if self.layout == "nz" else zn_layout
            flat = np.concatenate([layout(self.matrix[r0:r0 + r, c0:c0 + c], rp, cp, self.k0) for r0, r, c0, c in blocks])
            addr = self.ctx.weights.add(key, flat, self.prec)
        elems, count = rp * cp, len(blocks)
        tile_copy(self.ctx,
                  DRegion(global_lmem_address(slot_addr, self.ctx.chip), (1, count, 1, elems), (count * elems, elems, elems, 1), self.prec),
                  DRegion(addr, (1, count, 1, elems), (count * elems, elems, elems, 1), self.prec))


class RowsOperand(Operand):
    """A runtime matrix in DDR (row-major with `row_stride`, or column-major when `col_major`:
    element (i, j) at i + j * row_stride), rearranged into Nz / Zn by one DMA per tile (two when
    the chunked axis has a ragged end).

    The DMA walks the source in its own order (its innermost axis is the one contiguous in DDR, so
    DDR sees runs of a whole tile row or column) and scatters into the slot's fractal order: the tile
    buffer's port converts ND / DN -> Nz / Zn in flight (tile.buffer_chunk_bytes, segments.py). With
    no tile buffer (buffer_chunk_bytes = 0) the walk follows the slot instead: contiguous K0-element
    pieces on the LMEM side."""

    def __init__(self, ctx, layout, addr: int, rows: int, cols: int, row_stride: int, col_major: bool = False):
        super().__init__(ctx, layout, rows, cols)
        self.addr, self.row_stride, self.col_major = addr, row_stride, col_major

    def shift(self, offset: int) -> tuple[int, int]:
        slow, fast = divmod(offset, self.row_stride)
        return (fast, slow) if self.col_major else (slow, fast)

    def load(self, slot_addr, r0, r, c0, c) -> None:
        ctx, e = self.ctx, self.prec.bytes
        rp, cp = self.padded(r, c)
        dst = global_lmem_address(slot_addr, ctx.chip)
        if (rp, cp) != (r, c):
            ctx.em.fill(DRegion(dst, (1, 1, 1, rp * cp), (rp * cp, rp * cp, rp * cp, 1), self.prec), 0.0)
        rs, cs = (1, self.row_stride) if self.col_major else (self.row_stride, 1)
        src = self.addr + (r0 * rs + c0 * cs) * e
        if self.layout == "nz":      # chunked axis: columns (K), c0 per fractal row; rows k0 apart
            self._scatter(dst, src, (c, cs), (r, rs), rp)
        else:                        # Zn: chunked axis rows (K), r0 per fractal column; columns r0 apart
            self._scatter(dst, src, (r, rs), (c, cs), cp)

    def load_slots(self, slot_addrs, blocks) -> None:
        """Through a tile buffer, runs of equal tiles of whole fractals bound for neighbouring lanes'
        slots, each the same distance after the previous one in DDR (a K panel; tiles of
        consecutive batches), come in one DMA (the tile index walks the lanes); otherwise tile by
        tile."""
        lane_bytes, i = self.ctx.chip.lmem_bytes_per_lane, 0
        while i < len(blocks):
            j = i + 1
            if self.ctx.chip.tile.buffer_chunk_bytes and self._whole(blocks[i]):
                delta = self._delta(blocks[i], blocks[i + 1]) if i + 1 < len(blocks) else 0
                while (j < len(blocks) and delta > 0 and slot_addrs[j] == slot_addrs[j - 1] + lane_bytes
                       and blocks[j][1::2] == blocks[i][1::2] and self._delta(blocks[j - 1], blocks[j]) == delta):
                    j += 1
            if j - i == 1:
                self.load(slot_addrs[i], *blocks[i])
            else:
                self._load_panel(slot_addrs[i], blocks[i:j])
            i = j

    def _whole(self, block) -> bool:
        """Whether the block's chunked (K) extent is whole fractals."""
        return (block[3] if self.layout == "nz" else block[1]) % self.k0 == 0

    def _delta(self, prev, block) -> int:
        """Elements from `prev`'s first element to `block`'s in DDR."""
        rs, cs = (1, self.row_stride) if self.col_major else (self.row_stride, 1)
        return (block[0] - prev[0]) * rs + (block[2] - prev[2]) * cs

    def _load_panel(self, slot_addr: int, blocks) -> None:
        """`blocks` (equal tiles of whole fractals, equally spaced in DDR) into consecutive lanes'
        slots, one DMA: c walks the tiles (lanes), n / h / w the fractal scatter inside each slot."""
        ctx, e, k0 = self.ctx, self.prec.bytes, self.k0
        r0, r, c0, c = blocks[0]
        rp, cp = self.padded(r, c)
        count, slot_elems = len(blocks), ctx.chip.tile.slot_bytes // e
        dst = global_lmem_address(slot_addr, ctx.chip)
        if (rp, cp) != (r, c):
            ctx.em.fill(DRegion(dst, (1, count, 1, rp * cp), (count * slot_elems, slot_elems, rp * cp, 1), self.prec), 0.0)
        rs, cs = (1, self.row_stride) if self.col_major else (self.row_stride, 1)
        src = self.addr + (r0 * rs + c0 * cs) * e
        (ch, ch_src), (ot, ot_src), other_pad = ((c, cs), (r, rs), rp) if self.layout == "nz" else ((r, rs), (c, cs), cp)
        tile_src = self._delta(blocks[0], blocks[1])
        if ch_src == 1:     # n = other, c = tile, h = chunk, w = inner: DDR runs of a panel row
            shape = (ot, count, ch // k0, k0)
            s_st, d_st = (ot_src, tile_src, k0, 1), (k0, slot_elems, other_pad * k0, 1)
        else:               # n = chunk, c = tile, h = inner, w = other: DDR runs of a tile column
            shape = (ch // k0, count, k0, ot)
            s_st, d_st = (k0 * ch_src, tile_src, ch_src, 1), (other_pad * k0, slot_elems, 1, k0)
        ctx.em.region_copy(DRegion(dst, shape, d_st, self.prec), DRegion(src, shape, s_st, self.prec))

    def _scatter(self, dst: int, src: int, chunked: tuple[int, int], other: tuple[int, int], other_pad: int) -> None:
        """Copy an (extent, source stride) `chunked` axis cut into K0 chunks (fractal stride
        other_pad * K0, element stride 1 in the slot) and an `other` axis (stride K0 in the slot)."""
        k0, e = self.k0, self.prec.bytes
        (ch, ch_src), (ot, ot_src) = chunked, other
        full, rest = divmod(ch, k0)
        buffered = self.ctx.chip.tile.buffer_chunk_bytes > 0
        for count, width, offset in ((full, k0, 0), (1 if rest else 0, rest, full * k0)):
            if not count:
                continue
            s0, d0 = src + offset * ch_src * e, dst + offset * other_pad * e
            dims = {"chunk": (count, k0 * ch_src, other_pad * k0), "inner": (width, ch_src, 1), "other": (ot, ot_src, k0)}
            if not buffered:
                order = ("chunk", "other", "inner")
            elif ch_src == 1:
                order = ("other", "chunk", "inner")
            else:
                order = ("chunk", "inner", "other")
            shape = tuple(dims[o][0] for o in order)
            self.ctx.em.region_copy(
                DRegion(d0, (shape[0], 1, shape[1], shape[2]), (dims[order[0]][2], 0, dims[order[1]][2], dims[order[2]][2]), self.prec),
                DRegion(s0, (shape[0], 1, shape[1], shape[2]), (dims[order[0]][1], 0, dims[order[1]][1], dims[order[2]][1]), self.prec))


class LmemRowsOperand(Operand):
    """A runtime matrix kept in LMEM by a layer group (rows on lanes, the MATRIX layout), moved into
    Nz tiles by LMEM -> tile-buffer DMAs (no DDR): one per K panel of whole fractals, the source
    walked row by row (a row is one lane), the slot side scattered into fractal order in flight."""

    def __init__(self, ctx, layout, resident, rows: int, cols: int):
        super().__init__(ctx, layout, rows, cols)
        if layout != "nz":
            raise ValueError("LmemRowsOperand: only the A (Nz) side is read from LMEM")
        self.resident = resident

    def _source(self, r0: int, r: int, c0: int, c: int) -> DRegion:
        view = self.resident.rows_view(self.ctx.chip, r0, r, c0, c)
        return DRegion(global_lmem_address(view.addr, self.ctx.chip), view.shape, view.strides, self.prec)

    def load(self, slot_addr, r0, r, c0, c) -> None:
        self._copy(slot_addr, [(r0, r, c0, c)])

    def load_slots(self, slot_addrs, blocks) -> None:
        """Runs of K-consecutive equal tiles of whole fractals bound for neighbouring lanes' slots
        in one DMA; others one by one."""
        lane_bytes, i = self.ctx.chip.lmem_bytes_per_lane, 0
        while i < len(blocks):
            j = i + 1
            while (j < len(blocks) and slot_addrs[j] == slot_addrs[j - 1] + lane_bytes and blocks[j][1::2] == blocks[i][1::2]
                   and blocks[j][0] == blocks[i][0] and blocks[j][2] == blocks[j - 1][2] + blocks[i][3]
                   and blocks[i][3] % self.k0 == 0):
                j += 1
            self._copy(slot_addrs[i], blocks[i:j])
            i = j

    def _copy(self, slot_addr: int, blocks) -> None:
        ctx, k0 = self.ctx, self.k0
        r0, r, c0, c = blocks[0]
        rp, cp = self.padded(r, c)
        count, slot_elems = len(blocks), ctx.chip.tile.slot_bytes // self.prec.bytes
        dst = global_lmem_address(slot_addr, ctx.chip)
        if (rp, cp) != (r, c):
            ctx.em.fill(DRegion(dst, (1, count, 1, rp * cp), (count * slot_elems, slot_elems, rp * cp, 1), self.prec), 0.0)
        full, rest = divmod(c, k0)
        if full:        # n = row, c = tile, h = chunk, w = element: row i of every tile is lane i's run
            tile_copy(ctx, DRegion(dst, (r, count, full, k0), (k0, slot_elems, rp * k0, 1), self.prec),
                      self._source(r0, r, c0, count * c if count > 1 else full * k0))
        if rest:        # the ragged last chunk of a single tile
            tile_copy(ctx, DRegion(dst + full * rp * k0 * self.prec.bytes, (r, 1, 1, rest), (k0, 0, k0, 1), self.prec),
                      self._source(r0, r, c0 + full * k0, rest))


def c0_elems(chip, prec) -> int:
    """C0: the channels of one 32-byte block of the NC1HWC0 layout (tile.k_fractal_bytes of elements)."""
    return chip.tile.k_fractal_bytes // prec.bytes


def nchw_to_c0(ctx: LowerCtx, src_addr: int, dst_addr: int, shape, prec) -> None:
    """Layout conversion in DDR (GDMA): the NCHW tensor at src_addr into NC1HWC0 at dst_addr (C1 = ceil(C /
    C0) blocks of H x W x C0, the last one's missing channels zero). One DMA for the whole blocks (runs of C0
    elements written, each element read from its channel's plane), one zero fill and one DMA for a part block."""
    n, c, h, w = shape
    c0, hw = c0_elems(ctx.chip, prec), h * w
    c1, full, rest = -(-c // c0), c // c0, c % c0
    e = prec.bytes
    if full:
        ctx.em.region_copy(DRegion(dst_addr, (n, full, hw, c0), (c1 * hw * c0, hw * c0, c0, 1), prec),
                           DRegion(src_addr, (n, full, hw, c0), (c * hw, c0 * hw, 1, hw), prec))
    if rest:
        last = dst_addr + full * hw * c0 * e
        for i in range(n):       # the part block's padding zero (a fill per sample: DMA sizes are 16-bit)
            for p0, pixels in _spans(hw, MAX_DMA_DIM):
                ctx.em.fill(DRegion(last + (i * c1 * hw + p0) * c0 * e, (1, 1, pixels, c0), (0, 0, c0, 1), prec), 0.0)
        ctx.em.region_copy(DRegion(last, (n, 1, hw, rest), (c1 * hw * c0, 0, c0, 1), prec),
                           DRegion(src_addr + full * c0 * hw * e, (n, 1, hw, rest), (c * hw, 0, 1, hw), prec))


def c0_to_nchw(ctx: LowerCtx, src_addr: int, dst_addr: int, shape, prec) -> None:
    """Layout conversion in DDR (GDMA): the NC1HWC0 tensor at src_addr into NCHW at dst_addr (a part last
    block's padding is not copied). One DMA per whole-blocks run and one for a part block."""
    n, c, h, w = shape
    c0, hw = c0_elems(ctx.chip, prec), h * w
    c1, full, rest = -(-c // c0), c // c0, c % c0
    e = prec.bytes
    if full:
        ctx.em.region_copy(DRegion(dst_addr, (n, full, hw, c0), (c * hw, c0 * hw, 1, hw), prec),
                           DRegion(src_addr, (n, full, hw, c0), (c1 * hw * c0, hw * c0, c0, 1), prec))
    if rest:
        ctx.em.region_copy(DRegion(dst_addr + full * c0 * hw * e, (n, 1, hw, rest), (c * hw, 0, 1, hw), prec),
                           DRegion(src_addr + full * hw * c0 * e, (n, 1, hw, rest), (c1 * hw * c0, 0, c0, 1), prec))


def _spans(total: int, most: int) -> list[tuple[int, int]]:
    return [(i, min(most, total - i)) for i in range(0, total, most)]


class C0RowsOperand(Operand):
    """A Zn B operand whose K rows are channels and N columns pixels of one image of an NC1HWC0 tensor in
    DDR (the residual R of an I . R step): a Zn tile's K fractal rows are C0 blocks, each of its columns
    one pixel's C0 channels, so tile (k0, kt, p0, pt) is kt / C0 contiguous runs of pt * C0 elements: one
    DMA, converted to nothing in flight (the slot side is the same runs)."""

    def __init__(self, ctx, addr: int, rows: int, cols: int, pixels: int):
        super().__init__(ctx, "zn", rows, cols)
        self.addr, self.pixels = addr, pixels        # the image's first channel block; its H * W

    def load(self, slot_addr, r0, r, c0, c) -> None:
        k0, e = self.k0, self.prec.bytes
        if r0 % k0 or r % k0:
            raise ValueError(f"C0-blocked rows {r0}..{r0 + r} are not whole blocks of {k0}")
        _, cp = self.padded(r, c)
        src = DRegion(self.addr + ((r0 // k0) * self.pixels + c0) * k0 * e, (r // k0, 1, c, k0),
                      (self.pixels * k0, 0, k0, 1), self.prec)      # blocks on n: an LMEM side's c walks lanes
        tile_copy(self.ctx, DRegion(global_lmem_address(slot_addr, self.ctx.chip), src.shape, (cp * k0, 0, k0, 1),
                                    self.prec), src)


class PhaseImages:
    """Where a conv input kept in LMEM for an implicit GEMM lives: the zero-padded image (H + pt +
    pb) x (W + pl + pr) cut into stride x stride phases (phase (a, b) holds padded pixels (a + s*u,
    b + s*v)), each pixel-major: padded column v on lane v, row u at `row_bytes` steps in the lane,
    its channels contiguous. A tap (i, j) of output (oh, ow) then reads phase (i*dy % sy, j*dx % sx)
    at (oh + i*dy // sy, ow + j*dx // sx): output rows are lane runs, channels in-lane runs, so a
    B tile of whole output rows is one LMEM -> tile-buffer DMA and no im2col copy exists."""

    def __init__(self, geo, channels: int, esize: int):
        self.geo, self.channels, self.esize = geo, channels, esize
        self.padded = (geo.h + geo.pt + geo.pb, geo.w + geo.pl + geo.pr)
        self.row_bytes = ceil_to(channels * esize, 4)
        self.rows = [-(-(self.padded[0] - a) // geo.sy) for a in range(geo.sy)]
        self.cols = [-(-(self.padded[1] - b) // geo.sx) for b in range(geo.sx)]
        self.base: dict[tuple[int, int], int] = {}
        offset = 0
        for a in range(geo.sy):
            for b in range(geo.sx):
                self.base[(a, b)] = offset
                offset += self.rows[a] * self.row_bytes
        self.bytes_per_lane = offset
        self.lanes_used = max(self.cols)

    def tap(self, t: int) -> tuple[tuple[int, int], int, int]:
        """(phase, row offset u0, column offset v0) of tap t (t = j * kh + i: taps of one kernel column
        are neighbours in K, so they can share a DMA: WindowOperand)."""
        geo = self.geo
        j, i = divmod(t, geo.kh)
        di, dj = i * geo.dy, j * geo.dx
        return (di % geo.sy, dj % geo.sx), di // geo.sy, dj // geo.sx

    def scatter(self, phase: tuple[int, int]) -> tuple[int, int, int, int, int, int] | None:
        """(first input row, rows, first input column, columns, phase row, phase column) of the
        input pixels that land in `phase`, None when none do."""
        geo = self.geo
        a, b = phase
        ih0, iw0 = (a - geo.pt) % geo.sy, (b - geo.pl) % geo.sx
        if ih0 >= geo.h or iw0 >= geo.w:
            return None
        rows, cols = -(-(geo.h - ih0) // geo.sy), -(-(geo.w - iw0) // geo.sx)
        return ih0, rows, iw0, cols, (ih0 + geo.pt) // geo.sy, (iw0 + geo.pl) // geo.sx


class WindowOperand(Operand):
    """B = P^T (K x pixels) of a convolution, K running (kw, kh, channel), read straight from the
    input's PhaseImages in LMEM (implicit GEMM). A Zn tile of P^T is an Nz tile of P (pixel rows,
    channel columns), so one LMEM -> tile-buffer DMA per run of K tiles of one pixel tile: channel
    blocks of one tap, or whole taps of one kernel column in one phase (equally many rows apart): the
    source walks output rows (in-lane steps), output columns (lanes), [taps (in-lane steps)] and
    channels (in-lane runs); the slot side is scattered into Zn in flight. Pixel tiles are whole
    output rows (`TileGemm(n_tile=...)`), K tiles divide the channel count (`k_unit`)."""

    def __init__(self, ctx, images: PhaseImages, lmem_offset: int, out_width: int):
        kdim = images.channels * images.geo.kh * images.geo.kw
        super().__init__(ctx, "zn", kdim, images.geo.ho * images.geo.wo)
        self.images, self.offset, self.out_width = images, lmem_offset, out_width

    def _source(self, k0: int, kt: int, p0: int, pt: int) -> DRegion:
        img, chip, e = self.images, self.ctx.chip, self.prec.bytes
        tap, ch = divmod(k0, img.channels)
        if ch + kt > img.channels or p0 % self.out_width or pt % self.out_width:
            raise ValueError(f"window block {(k0, kt, p0, pt)} crosses a tap or an output row")
        phase, u0, v0 = img.tap(tap)
        oh0, rows = p0 // self.out_width, pt // self.out_width
        addr = v0 * chip.lmem_bytes_per_lane + self.offset + img.base[phase] + (oh0 + u0) * img.row_bytes + ch * e
        shape = (rows, self.out_width, 1, kt)
        strides = (img.row_bytes // e, img.bytes_per_lane // e, kt, 1)
        return DRegion(global_lmem_address(addr, chip), shape, strides, self.prec)

    def load(self, slot_addr, r0, r, c0, c) -> None:
        self._copy(slot_addr, [(r0, r, c0, c)])

    def load_slots(self, slot_addrs, blocks) -> None:
        """Runs of K-consecutive tiles of one pixel tile bound for neighbouring lanes' slots in one DMA
        (channel blocks of one tap, or whole taps a fixed number of rows apart), or runs of the same K
        tile of consecutive pixel tiles (a stream whose output tiles need one K tile each); others one
        by one."""
        lane_bytes, i = self.ctx.chip.lmem_bytes_per_lane, 0
        while i < len(blocks):
            j = i + 1
            while (j < len(blocks) and slot_addrs[j] == slot_addrs[j - 1] + lane_bytes and blocks[j][1::2] == blocks[i][1::2]
                   and blocks[j][2] == blocks[i][2] and blocks[j][0] == blocks[j - 1][0] + blocks[i][1]
                   and self._tap_step(blocks[i], blocks[j], j - i) is not None):
                j += 1
            if j == i + 1:
                while (j < len(blocks) and slot_addrs[j] == slot_addrs[j - 1] + lane_bytes
                       and blocks[j][:2] == blocks[i][:2] and blocks[j][3] == blocks[i][3]
                       and blocks[j][2] == blocks[j - 1][2] + blocks[i][3]):
                    j += 1
                if j > i + 1:
                    self._copy_pixel_tiles(slot_addrs[i], blocks[i:j])
                    i = j
                    continue
            self._copy(slot_addrs[i], blocks[i:j])
            i = j

    def _copy_pixel_tiles(self, slot_addr: int, blocks) -> None:
        """One K tile of consecutive pixel tiles (whole output rows each) into neighbouring lanes' slots:
        the source is the run of their output rows, tile j lands in slot j."""
        ctx, k0 = self.ctx, self.k0
        r0, r, c0, c = blocks[0]
        if r % k0:
            raise ValueError(f"window K tile {r} is not whole fractals of {k0}")
        _, cp = self.padded(r, c)
        count, slot_elems, e = len(blocks), ctx.chip.tile.slot_bytes // self.prec.bytes, self.prec.bytes
        dst = DRegion(global_lmem_address(slot_addr, ctx.chip), (c, count, r // k0, k0), (k0, slot_elems, cp * k0, 1),
                      self.prec)
        src = self._source(r0, r, c0, c)        # (rows, out_width, 1, r): tile j is j * rows rows further in-lane
        rows = src.shape[0]
        tile_copy(ctx, dst, DRegion(src.addr, (rows, src.shape[1], count, r),
                                    (src.strides[0], src.strides[1], rows * self.images.row_bytes // e, 1), self.prec))

    def _tap_step(self, first, block, distance: int) -> int | None:
        """Rows (in-lane row steps) between the K tiles of a run: 0 within one tap, the taps' row
        distance for whole-tap tiles of one kernel column in one phase; None when `block` cannot join
        the run started by `first` (`distance` tiles after it)."""
        img, channels = self.images, self.images.channels
        t0, t1 = first[0] // channels, block[0] // channels
        if t0 == t1:
            return 0 if first[0] % channels + (distance + 1) * first[1] <= channels else None
        if first[1] != channels or t1 != t0 + distance or t1 // img.geo.kh != t0 // img.geo.kh:
            return None
        (p0, u0, v0), (p1, u1, v1) = img.tap(t0), img.tap(t1)
        step = img.tap(t0 + 1)[1] - u0
        return step if (p0, v0) == (p1, v1) and u1 - u0 == distance * step and step > 0 else None

    def _copy(self, slot_addr: int, blocks) -> None:
        ctx, k0 = self.ctx, self.k0
        r0, r, c0, c = blocks[0]
        if r % k0:
            raise ValueError(f"window K tile {r} is not whole fractals of {k0}")
        _, cp = self.padded(r, c)
        count, slot_elems = len(blocks), ctx.chip.tile.slot_bytes // self.prec.bytes
        dst = DRegion(global_lmem_address(slot_addr, ctx.chip), (c, count, r // k0, k0), (k0, slot_elems, cp * k0, 1), self.prec)
        step = self._tap_step(blocks[0], blocks[-1], count - 1) if count > 1 else 0
        if not step:        # channel blocks of one tap: one in-lane run of count * r channels
            tile_copy(ctx, dst, self._source(r0, count * r, c0, c))
            return
        src = self._source(r0, r, c0, c)     # whole taps `step` rows apart: h walks the taps
        e = self.prec.bytes
        tile_copy(ctx, dst, DRegion(src.addr, (src.shape[0], src.shape[1], count, r),
                                    (src.strides[0], src.strides[1], step * self.images.row_bytes // e, 1), self.prec))


class HaloOperand(Operand):
    """B = P^T (K x pixels) of a convolution, K in (channel block, kh, kw, c0) order (TIMG2COL's, Ascend
    Load3D's K = C1 * kh * kw * C0), expanded on chip (issue 16): for each pixel tile (whole output rows)
    and group of `group` channel blocks, the halo (the padded input rows and columns its windows reach,
    those channel blocks) crosses the tile buffer's DMA port once, one TMOVE from the padded image in LMEM
    (`images`: one phase, column v on lane v, channels in-lane; the move writes it C0-blocked, pixels
    column-major) into a halo slot (a ring over the N queue's slots, which a halo GEMM leaves to it), and
    TIMG2COLs expand it into the B tiles (runs of K-consecutive tiles bound for neighbouring slots in one
    block). K tiles divide a group's K (`TileGemm(k_unit=k_unit)`), pixel tiles are whole output rows.
    Given the stream's block order (`stream`, `ahead`), each fill also moves the halos of the next `ahead`
    blocks, so a TIMG2COL rarely waits for its halo's move (the ring holds the last queue_slots halos)."""

    def __init__(self, ctx, images: PhaseImages, lmem_offset: int, geo, group: int, rows: int):
        kdim = images.channels * geo.kh * geo.kw
        super().__init__(ctx, "zn", kdim, geo.ho * geo.wo)
        self.images, self.offset, self.geo, self.group, self.out_rows = images, lmem_offset, geo, group, rows
        self.k_unit = group * geo.kh * geo.kw * self.k0
        slots = ctx.chip.tile.queue_slots
        self.ring = [ctx.chip.tile_slot_address(3, i) for i in range(slots)]     # the N queue's slots
        self.next = 0
        self.held: dict[tuple[int, int, int], int] = {}    # (first output row, rows, group) -> halo slot address
        self.stream: list = []          # the B blocks in the order fills take them (TileGemm._streams), if known
        self.position = 0               # blocks of `stream` filled so far
        self.ahead = 0                  # blocks past `position` whose halos are prefetched (set with `stream`)

    @staticmethod
    def halo_shape(geo, rows: int) -> tuple[int, int]:
        """(rows, columns) of padded input the windows of `rows` whole output rows reach."""
        return (rows - 1) * geo.sy + (geo.kh - 1) * geo.dy + 1, (geo.wo - 1) * geo.sx + (geo.kw - 1) * geo.dx + 1

    @classmethod
    def group_for(cls, chip, geo, channels: int, rows: int, esize: int) -> int:
        """Channel blocks per halo: the most (dividing the channel blocks) whose halo fits a slot, 0: none."""
        k0 = chip.tile.k_fractal_bytes // esize
        hh, ww = cls.halo_shape(geo, rows)
        blocks = channels // k0
        return max((g for g in range(1, blocks + 1) if blocks % g == 0 and g * hh * ww * k0 * esize <= chip.tile.slot_bytes),
                   default=0)

    def halo_bytes(self) -> int:
        hh, ww = self.halo_shape(self.geo, self.out_rows)
        return self.group * hh * ww * self.k0 * self.prec.bytes

    def load(self, slot_addr, r0, r, c0, c) -> None:
        self.load_slots([slot_addr], [(r0, r, c0, c)])

    def load_slots(self, slot_addrs, blocks) -> None:
        """Runs of K-consecutive tiles of one pixel tile and channel group, bound for neighbouring lanes'
        slots: their halo (moved in unless it is the one held), then one TIMG2COL."""
        lane_bytes, i = self.ctx.chip.lmem_bytes_per_lane, 0
        while i < len(blocks):
            j = i + 1
            while (j < len(blocks) and slot_addrs[j] == slot_addrs[j - 1] + lane_bytes and blocks[j][1:] == blocks[i][1:]
                   and blocks[j][0] == blocks[j - 1][0] + blocks[i][1]
                   and blocks[j][0] // self.k_unit == blocks[i][0] // self.k_unit):
                j += 1
            self._expand(slot_addrs[i], blocks[i:j])
            i = j
        self.position += len(blocks)
        for block in self.stream[self.position:self.position + self.ahead]:    # the next fill's halos, moved now
            self._halo(*self._key(block))

    def _key(self, block) -> tuple[int, int, int]:
        k0, _, p0, pt = block
        return p0 // self.geo.wo, pt // self.geo.wo, k0 // self.k_unit

    def _expand(self, slot_addr: int, blocks) -> None:
        k0, kt, p0, pt = blocks[0]
        geo, wo = self.geo, self.geo.wo
        if kt % self.k0 or p0 % wo or pt != min(self.out_rows * wo, self.cols - p0) or self.k_unit % kt:
            raise ValueError(f"halo block {blocks[0]} is not whole K fractals of a group and whole output rows")
        _, rows, group = self._key(blocks[0])
        halo = self._halo(p0 // wo, rows, group)
        hh, ww = self.halo_shape(geo, rows)
        self.ctx.em.tile(TImg2Col(dt=_TILE_DT[self.prec], src_addr=halo, dst_addr=slot_addr, c1=self.group, in_h=hh,
                                  in_w=ww, kh=geo.kh, kw=geo.kw, out_h=rows, out_w=wo,
                                  k_start=(k0 % self.k_unit) // self.k0, k_count=len(blocks) * kt // self.k0,
                                  tiles=len(blocks), sy=geo.sy, sx=geo.sx, dy=geo.dy, dx=geo.dx))

    def _halo(self, oh0: int, rows: int, group: int) -> int:
        """Flat address of the halo slot holding the windows of output rows [oh0, oh0 + rows) over channel
        group `group` (moved in now unless it is the halo held)."""
        key = (oh0, rows, group)
        if key in self.held:
            return self.held[key]
        ctx, img, geo, e = self.ctx, self.images, self.geo, self.prec.bytes
        addr = self.ring[self.next % len(self.ring)]
        self.next += 1
        self.held = {k: a for k, a in self.held.items() if a != addr}      # the halo this slot held is gone
        self.held[key] = addr
        hh, ww = self.halo_shape(geo, rows)
        src = self.offset + img.base[(0, 0)] + oh0 * geo.sy * img.row_bytes + group * self.group * self.k0 * e
        count = self.group * ww * hh * self.k0
        tile_copy(ctx, DRegion(global_lmem_address(addr, ctx.chip), (1, 1, 1, count), (count, count, count, 1), self.prec),
                  DRegion(global_lmem_address(src, ctx.chip), (self.group, ww, hh, self.k0),
                          (self.k0, img.bytes_per_lane // e, img.row_bytes // e, 1), self.prec))
        return addr


_TILE_DT = {Prec.FP32: "FP32", Prec.FP16: "FP16", Prec.BF16: "BF16"}


class IdentityOperand(ConstOperand):
    """The size x size identity tile of the residual step (Zn B of R . I, or Nz A of I . R). With a
    tile-buffer DMA port it is written in its slot by two constant fills on the port (zeros, then ones
    on the diagonal: element (a * k0 + b) of it sits at a * (P * k0 + k0 * k0) + b * (k0 + 1), P the
    padded other side), no DDR read; else loaded from the weight image like any constant."""

    def __init__(self, ctx, layout: str, size: int, key: str):
        super().__init__(ctx, layout, np.eye(size, dtype=np.float32), key, 0, 0)
        self.size = size

    def load(self, slot_addr, r0, r, c0, c) -> None:
        ctx, k0 = self.ctx, self.k0
        in_window = slot_addr % ctx.chip.lmem_bytes_per_lane >= ctx.chip.tile_window_offset
        if not ctx.chip.tile.move_port_bytes_per_cycle or (r0, r, c0, c) != (0, self.size, 0, self.size) \
                or self.size % k0 or not in_window:      # (a StickyCache copy in LMEM: loaded as a constant)
            super().load(slot_addr, r0, r, c0, c)
            return
        from tpuflow.lowering.emitter import const_bits
        rp, cp = self.padded(r, c)
        other = cp if self.layout == "zn" else rp
        dst = global_lmem_address(slot_addr, ctx.chip)
        for value, shape, strides in ((0.0, (1, 1, 1, rp * cp), (rp * cp, rp * cp, rp * cp, 1)),
                                      (1.0, (1, 1, self.size // k0, k0), (0, 0, other * k0 + k0 * k0, k0 + 1))):
            ctx.em.tile(TMove(desc=TensorDma(src_start_addr=0, dst_start_addr=dst, **_sizes("src", shape, strides),
                                             **_sizes("dst", shape, strides), src_data_format=int(self.prec),
                                             fill_constant_en=1, constant_value=const_bits(value, self.prec))))


class StagedConstOperand(ConstOperand):
    """A constant matrix tiled on a fixed (tile_rows x tile_cols) grid whose tiles are staged in LMEM by
    large DMAs and moved into their slots by LMEM -> tile-buffer copies (no DDR latency per fill).

    Tile t (row-major over the grid) sits in lane t % lanes of staging chunk t // lanes (one DMA of up
    to `lanes` tiles, `stride` bytes each, one per lane: the weight image holds them in that order);
    chunk c lives in ring slot c % ring_chunks at `lmem_offset` + slot * stride per lane. A chunk is
    loaded when a fill first needs it, with the next one ahead; a chunk evicted from the ring is
    loaded again when needed (GDMA runs in order, so no fill reads a ring slot being reloaded).
    `level_bytes` (0: stride) spaces the ring slots: one dependency chunk (chip.chunk_bytes_per_lane)
    from the first chunk boundary at or after `lmem_offset` (spread_bytes) puts every ring slot in a
    chunk of its own, so the moves out of one staged chunk do not wait for the DMA of the next one,
    loaded ahead (LMEM dependencies are tracked per lane and chunk: two 8 KiB slots in one 16 KiB
    chunk made a conv's first moves wait for two staging DMAs)."""

    def __init__(self, ctx, layout, matrix: np.ndarray, key: str, tile_rows: int, tile_cols: int,
                 lmem_offset: int, ring_chunks: int, level_bytes: int = 0):
        super().__init__(ctx, layout, matrix, key, tile_rows, tile_cols)
        self.grid = (-(-self.rows // tile_rows), -(-self.cols // tile_cols))
        self.tiles = self.grid[0] * self.grid[1]
        rp, cp = self.padded(tile_rows, tile_cols)
        self.stride = self.chunk_stride(rp * cp, self.prec)
        self.chunk_tiles = ctx.chip.lanes
        self.lmem_offset, self.ring_chunks = lmem_offset, ring_chunks
        self.level_bytes = level_bytes or self.stride
        self.level_base = ceil_to(lmem_offset, level_bytes) if level_bytes else lmem_offset
        self.ring: dict[int, int] = {}          # ring slot -> chunk held
        self.image: int | None = None           # DDR address of the staged image

    @staticmethod
    def spread_bytes(chunks: int, stride: int, level_bytes: int) -> int:
        """Per-lane bytes of a ring of `chunks` slots `level_bytes` apart from the first multiple of
        level_bytes at or after its (any 64-byte aligned) offset."""
        return (chunks - 1) * level_bytes + stride + level_bytes - 64

    @staticmethod
    def chunk_stride(padded_elems: int, prec) -> int:
        """Bytes per lane of one staging chunk of tiles of `padded_elems` elements."""
        return ceil_to(padded_elems * prec.bytes, 64)

    def _tile_index(self, block) -> int | None:
        r0, r, c0, c = block
        if r0 % self.tile_rows or c0 % self.tile_cols or r != min(self.tile_rows, self.rows - r0) \
                or c != min(self.tile_cols, self.cols - c0):
            return None
        return r0 // self.tile_rows * self.grid[1] + c0 // self.tile_cols

    def _image(self) -> int:
        if self.image is None:
            key = (f"{self.key}:{self.layout}:staged:{self.tile_rows}x{self.tile_cols}:{self.stride}",)
            addr = self.ctx.weights.lookup(key, self.prec)
            if addr is None:
                elems = self.stride // self.prec.bytes
                image = np.zeros((self.tiles, elems), np.float32)
                layout = nz_layout if self.layout == "nz" else zn_layout
                for t in range(self.tiles):
                    i, j = divmod(t, self.grid[1])
                    r0, c0 = i * self.tile_rows, j * self.tile_cols
                    block = self.matrix[r0:r0 + self.tile_rows, c0:c0 + self.tile_cols]
                    flat = layout(block, *self.padded(*block.shape), self.k0)
                    image[t, :flat.size] = flat
                addr = self.ctx.weights.add(key, image.reshape(-1), self.prec)
            self.image = addr
        return self.image

    def _stage(self, chunk: int) -> None:
        """Chunk `chunk` into its ring slot (one DMA), unless it is there."""
        slot = chunk % self.ring_chunks
        t0 = chunk * self.chunk_tiles
        if self.ring.get(slot) == chunk or t0 >= self.tiles:
            return
        self.ring[slot] = chunk
        count, elems = min(self.chunk_tiles, self.tiles - t0), self.stride // self.prec.bytes
        dst = self.level_base + slot * self.level_bytes
        shape = (1, count, 1, elems)
        self.ctx.em.region_copy(DRegion(global_lmem_address(dst, self.ctx.chip), shape, (count * elems, elems, elems, 1), self.prec),
                                DRegion(self._image() + t0 * self.stride, shape, (count * elems, elems, elems, 1), self.prec))

    def _staged_address(self, t: int) -> int:
        chunk, lane = divmod(t, self.chunk_tiles)
        return lane * self.ctx.chip.lmem_bytes_per_lane + self.level_base + (chunk % self.ring_chunks) * self.level_bytes

    def load(self, slot_addr, r0, r, c0, c) -> None:
        self.load_slots([slot_addr], [(r0, r, c0, c)])

    def load_slots(self, slot_addrs, blocks) -> None:
        """Runs of consecutive grid tiles of one chunk bound for neighbouring lanes' slots: one LMEM ->
        tile-buffer copy each (their chunk staged first, the next one ahead)."""
        lane_bytes, i = self.ctx.chip.lmem_bytes_per_lane, 0
        index = [self._tile_index(b) for b in blocks]
        if any(t is None for t in index):
            super().load_slots(slot_addrs, blocks)
            return
        while i < len(blocks):
            j = i + 1
            while (j < len(blocks) and slot_addrs[j] == slot_addrs[j - 1] + lane_bytes and index[j] == index[j - 1] + 1
                   and index[j] // self.chunk_tiles == index[i] // self.chunk_tiles
                   and self.padded(*blocks[j][1::2]) == self.padded(*blocks[i][1::2])):
                j += 1
            chunk = index[i] // self.chunk_tiles
            self._stage(chunk)
            if self.ring_chunks > 1:
                self._stage(chunk + 1)
            rp, cp = self.padded(*blocks[i][1::2])
            elems, count = rp * cp, j - i
            shape = (1, count, 1, elems)
            tile_copy(self.ctx,
                      DRegion(global_lmem_address(slot_addrs[i], self.ctx.chip), shape, (count * elems, elems, elems, 1), self.prec),
                      DRegion(global_lmem_address(self._staged_address(index[i]), self.ctx.chip), shape,
                              (count * elems, self.stride // self.prec.bytes, elems, 1), self.prec))
            i = j


class LaneRowsOperand(StagedConstOperand):
    """A constant A operand read pass by pass (each output tile reads the K tiles of one row of the
    grid, rows in order: TileGemm._aligned_pass), staged a grid row at a time in the lanes of the T
    slots it will fill: K tile j of a row in the lane of T slot j % queue_slots, at (j // queue_slots)
    * stride, in a ring of two rows (the next row is loaded ahead). Every pass starts on a multiple of
    queue_slots pushes, so the slots are filled by TIU copies lane to same lane (the vector unit's
    port into the tile buffer), not by GDMA: the GDMA only loads each row once, in large DMAs."""

    aligned_passes = True

    def __init__(self, ctx, layout, matrix, key, tile_rows, tile_cols, lmem_offset: int):
        super().__init__(ctx, layout, matrix, key, tile_rows, tile_cols, lmem_offset, 2)
        self.slots = ctx.chip.tile.queue_slots

    @staticmethod
    def row_bytes(k_tiles: int, queue_slots: int, stride: int) -> int:
        """Per-lane bytes of one staged grid row."""
        return -(-k_tiles // queue_slots) * stride

    def _lane_address(self, queue_slot_address: int) -> int:
        lane_bytes = self.ctx.chip.lmem_bytes_per_lane
        return queue_slot_address // lane_bytes * lane_bytes

    def _row_address(self, row: int, j: int, slot0: int) -> int:
        """Flat LMEM address of K tile j of grid row `row` (slot0: address of T slot 0)."""
        lane_bytes = self.ctx.chip.lmem_bytes_per_lane
        lane = (slot0 // lane_bytes + j % self.slots) % self.ctx.chip.lanes
        per_row = self.row_bytes(self.grid[1], self.slots, self.stride)
        return lane * lane_bytes + self.lmem_offset + (row % 2) * per_row + (j // self.slots) * self.stride

    def _stage_row(self, row: int, slot0: int) -> None:
        """Grid row `row` into ring slot row % 2 (one DMA per queue_slots K tiles... as one strided DMA
        for the whole multiples of queue_slots, one for the rest), unless it is there."""
        if row >= self.grid[0] or self.ring.get(row % 2) == row:
            return
        self.ring[row % 2] = row
        ctx, kt_count, elems = self.ctx, self.grid[1], self.stride // self.prec.bytes
        full, rest = divmod(kt_count, self.slots)
        src = self._image() + row * kt_count * self.stride
        for j0, shape in ((0, (full, self.slots, 1, elems)), (full * self.slots, (1, rest, 1, elems))):
            if not shape[0] or not shape[1]:
                continue
            dst = self._row_address(row, j0, slot0)
            ctx.em.region_copy(DRegion(global_lmem_address(dst, ctx.chip), shape, (elems, elems, elems, 1), self.prec),
                               DRegion(src + j0 * self.stride, shape, (self.slots * elems, elems, elems, 1), self.prec))

    def load_slots(self, slot_addrs, blocks) -> None:
        """One TIU copy for the batch (K-consecutive tiles of one row, slots in consecutive lanes)."""
        from tpuflow.lowering.tensors import LTile
        from tpuflow.isa import StrideMode
        ctx = self.ctx
        slot0 = ctx.chip.tile_slot_address(0, 0)
        index = [self._tile_index(b) for b in blocks]
        row, j0 = divmod(index[0], self.grid[1])
        lane_bytes = ctx.chip.lmem_bytes_per_lane
        if (any(t != index[0] + i for i, t in enumerate(index)) or (index[-1] // self.grid[1]) != row
                or any(a != slot_addrs[0] + i * lane_bytes for i, a in enumerate(slot_addrs))
                or slot_addrs[0] // lane_bytes != self._row_address(row, j0, slot0) // lane_bytes):
            raise AssertionError("an aligned A pass batch is not K-consecutive tiles bound for their own lanes")
        self._stage_row(row, slot0)
        self._stage_row(row + 1, slot0)
        rp, cp = self.padded(*blocks[0][1::2])
        shape = (1, len(blocks), 1, rp * cp)
        ctx.em.ar("copy", LTile(slot_addrs[0], shape, self.prec, (0, 0, 0, 1), StrideMode.FREE),
                  LTile(self._row_address(row, j0, slot0), shape, self.prec, (0, 0, 0, 1), StrideMode.FREE))
