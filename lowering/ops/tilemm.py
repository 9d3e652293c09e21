"""MatMul and Conv on the TILE engine (LinxISA CUBE blocks): A tiles in Nz, B tiles in Zn, pushed
with TPUSH after their slots are filled; TMATMUL then TMATMUL.ACC over K (TMATMUL.BIAS for a
per-column bias, TGEMV when M = 1); ACCCVT NZ2ND; the result leaves its slot for DDR or LMEM, or
for lanes and a TIU epilogue. Conv runs as Y^T = W . P^T with P^T built by im2col DMAs (or the
input's NHWC copy itself for 1x1 stride-1 convolutions); depthwise convs and convs with fewer input
channels per group than K0 stay on the TIU.

How the slots are fed (the tile window is a tile buffer, tpuflow.isa.tile; issue 16):
* runtime operands from DDR: one DMA per K panel (or run of equally spaced tiles) into neighbouring
  slots, the DDR rows walked in order and scattered into Nz / Zn in flight (RowsOperand);
* runtime operands a layer group keeps in LMEM: LMEM -> tile-buffer DMAs (LmemRowsOperand);
* constant operands: pre-arranged tiles, half a queue per DMA (ConstOperand), or, when every tile is
  read once, staged in LMEM by rows of 16 tiles (256 KiB DMAs) and moved into the slots by TIU
  copies, lane to same lane (_StagedStream);
* streams load ahead across output tiles and batches in half-queue batches (_Stream); a residual
  Add enters the ACC as R . I (no TIU pass); results leave in spans of up to OUTPUT_SPAN tiles."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tpuflow.isa import AccCvt, CwBcTiu, Prec, StrideMode, TMatmul, TPush, global_lmem_address, size_code, tile_ref
from tpuflow.hwmodel.timing.cost import tile_load_cycles
from tpuflow.lowering.context import LowerCtx
from tpuflow.lowering.emitplan import FrozenPlan
from tpuflow.lowering.groups import Group
from tpuflow.lowering.ops.conv import conv_geometry
from tpuflow.lowering.ops.epilogue import Epilogue
from tpuflow.lowering.ops.matmul import matmul_geometry
from tpuflow.lowering.ops.movement import copy_nd
from tpuflow.lowering.tensors import DRegion, LTile, make_tile, tile_bytes_per_lane
from tpuflow.lowering.tiling import pipelined, steps
from tpuflow.lowering.weights import to_storage

Q_T, Q_U, Q_M, Q_N = 0, 1, 2, 3
QUEUE_NAMES = ("T", "U", "M", "N")
TILE_DT = {Prec.FP32: "FP32", Prec.FP16: "FP16", Prec.BF16: "BF16"}


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


class QueueCursor:
    """The compiler's copy of the tile queue state (pushes per queue, kept in the LowerCtx so it
    spans the whole program): which slot the next push lands in."""

    def __init__(self, ctx: LowerCtx):
        self.chip = ctx.chip
        self.pushes = ctx.tile_pushes

    def next_slot_addr(self, queue: int, ahead: int = 0) -> int:
        return self.chip.tile_slot_address(queue, (self.pushes[queue] + ahead) % self.chip.tile.queue_slots)

    def push(self, queue: int) -> None:
        self.pushes[queue] += 1


@dataclass(frozen=True)
class TileDims:
    mt: int
    nt: int
    kt: int
    resident: str = ""    # "a": A's K tiles stay in T across the N tiles; "b": B's stay in U across M


TILE_SIDES = (64, 32, 16)      # M and N tile sizes tried (multiples of the 16 x 16 output fractal)
NHWC_BLOCK = 256               # channels and pixels per block of the NHWC staging transpose
OUTPUT_SPAN = 12               # result tiles delivered together at most (M slots: fewer than a queue, so none
                               # is overwritten by the next ACCCVT or identity push before it leaves)
STAGE_ROWS = 2                 # staging rows (queue_slots tiles each) one DMA brings into LMEM at most
STREAM_BATCH = 8               # constant K tiles loaded per DMA (half a queue: the next run loads while this one is read)
# Operand tile loads are priced by hwmodel.timing.cost.tile_load_cycles (the scheduler's per-instruction cost):
# a runtime operand reaches Nz / Zn through K0-element (32 B) or single-element DMA pieces, a constant one
# arrives pre-arranged, STREAM_BATCH tiles per contiguous DMA.


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
        self.ctx.em.general_copy(global_lmem_address(slot_addr, self.ctx.chip), addr, rp * cp, self.prec)

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
        self.ctx.em.region_copy(
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
            ctx.em.region_copy(DRegion(dst, (r, count, full, k0), (k0, slot_elems, rp * k0, 1), self.prec),
                               self._source(r0, r, c0, count * c if count > 1 else full * k0))
        if rest:        # the ragged last chunk of a single tile
            ctx.em.region_copy(DRegion(dst + full * rp * k0 * self.prec.bytes, (r, 1, 1, rest), (k0, 0, k0, 1), self.prec),
                               self._source(r0, r, c0 + full * k0, rest))


class TileGemm:
    """Y (M x N) = A (M x K) . B (K x N) [+ bias row] [+ R] on the TILE engine, tile by tile;
    `deliver` gets the slot holding each row-major result tile. A residual R (M x N, runtime)
    enters the ACC first, as R . I (an extra K step whose B is the identity, exact in the fp32 ACC;
    with .BIAS when there is a bias), so no TIU pass is needed for it."""

    def __init__(self, ctx: LowerCtx, a: Operand, b: Operand, m: int, n: int, k: int, out_prec: Prec,
                 bias: np.ndarray | None = None, bias_key: str = "", residual: Operand | None = None,
                 batches: list[tuple[int, int]] | None = None):
        self.ctx, self.a, self.b, self.m, self.n, self.k = ctx, a, b, m, n, k
        self.batches = batches or [(0, 0)]     # (A offset, B offset) in elements of each batch
        self.out_prec, self.bias, self.bias_key, self.residual = out_prec, bias, bias_key, residual
        self.dims = self._dims()
        self.cursor = QueueCursor(ctx)
        self.dt = TILE_DT[ctx.prec]
        self.stage: int | None = None   # per-lane LMEM offset where a constant stream is staged (stage_need)
        self.panel_base = 0          # queue push index of the resident panel's first tile
        self.sticky: dict[str, tuple[int, tuple]] = {}   # name -> (M push index, (operand key, block))
        self.row_bias: np.ndarray | None = None         # per-row (M) bias added in the ACC (_row_bias_step)

    def _dims(self) -> TileDims:
        """The tiling with the least estimated time: tile sides whose A, B and converted result
        each fit one tile slot, and whether one operand's K tiles stay resident in their queue
        (loaded once per row / column of output tiles, read with .reuse) while the other streams."""
        tile, e, oe = self.ctx.chip.tile, self.ctx.prec.bytes, self.out_prec.bytes
        k0 = self.a.k0
        best = None
        for mt in sorted({min(ceil_to(self.m, tile.fractal_m), side) for side in TILE_SIDES}, reverse=True):
            for nt in sorted({min(ceil_to(self.n, tile.fractal_n), side) for side in TILE_SIDES}, reverse=True):
                if mt * nt * oe > tile.slot_bytes:
                    continue
                if self.residual is not None and max(ceil_to(nt, k0) * ceil_to(nt, 16), ceil_to(mt, 16) * ceil_to(nt, k0)) * e > tile.slot_bytes:
                    continue                     # R (mt x nt) and the identity (nt x nt) of the R . I step fit a slot
                kt = min(tile.slot_bytes // (mt * e), tile.slot_bytes // (nt * e)) // k0 * k0
                kt = max(k0, min(kt, ceil_to(self.k, k0)))
                for resident in ("", "a", "b"):
                    if resident and -(-self.k // kt) > tile.queue_slots:
                        continue
                    dims = TileDims(mt, nt, kt, resident)
                    key = (self._estimate_ns(dims), -mt * nt, resident)
                    if best is None or key < best[0]:
                        best = (key, dims)
        return best[1]

    def _estimate_ns(self, d: TileDims) -> float:
        """max(GDMA time of the operand loads, TILE time of the blocks), roughly."""
        chip, e = self.ctx.chip, self.ctx.prec.bytes
        tm, tn, tk = -(-self.m // d.mt), -(-self.n // d.nt), -(-self.k // d.kt)
        a_loads = tm * tk * (1 if d.resident == "a" else tn)
        b_loads = tn * tk * (1 if d.resident == "b" else tm)
        buffered = chip.tile.buffer_chunk_bytes > 0

        def load_ns(op, rows, cols, resident):   # one tile load, priced by hwmodel.timing.cost
            runtime = isinstance(op, RowsOperand)
            along_k = (op.layout == "nz") != op.col_major if runtime else True
            batch = min(tk, tile.queue_slots if resident else STREAM_BATCH) if buffered or not runtime else 1
            if buffered and runtime:     # DDR runs: a panel row across the batch, or one tile column
                piece = cols * batch if along_k else rows
            else:
                piece = None if along_k else 1
            cycles = tile_load_cycles(chip, rows, cols, e, runtime=runtime, piece_elems=piece, batch=batch)
            return cycles * 1e3 / chip.clocks.gdma_clock_mhz
        tile = chip.tile
        dma_ns = (a_loads * load_ns(self.a, d.mt, d.kt, d.resident == "a")
                  + b_loads * load_ns(self.b, d.nt, d.kt, d.resident == "b"))
        store = tile_load_cycles(chip, d.mt, d.nt, self.out_prec.bytes, runtime=True, piece_elems=d.nt)
        dma_ns += tm * tn * store * 1e3 / chip.clocks.gdma_clock_mhz
        macs = chip.compute.tile_macs_per_cycle[self.ctx.options.dtype]
        block = chip.tile.block_overhead_cycles + chip.tile.fill_latency_cycles + d.mt * d.nt * d.kt / macs
        return max(dma_ns, tm * tn * tk * block * 1e3 / chip.clocks.tile_clock_mhz)

    def run(self, deliver: Callable[[int, int, int, int, int, int], None]) -> None:
        """deliver(slot, batch, m0, mt, n0, nt) for every result tile."""
        k_steps = steps(self.k, self.dims.kt)
        order = self._order()
        streams = self._streams([t[:5] for t in order], k_steps)
        for index, (b, m0, mt, n0, nt, last_use) in enumerate(order):
            first_use = index == 0 or order[index - 1][5]
            if self.dims.resident and first_use:         # the resident operand's K tiles for this row / column
                self.panel_base = self.cursor.pushes[Q_T if self.dims.resident == "a" else Q_U]
                side = self.dims.resident
                self._load_blocks(Q_T if side == "a" else Q_U, self.a if side == "a" else self.b,
                                  [self._block(side, b, m0, mt, n0, nt, k0, kt) for k0, kt in k_steps])
            self._tile(mt, nt, k_steps, streams, keep_panel=not last_use, m0=m0)
            deliver(self.cursor.chip.tile_slot_address(Q_M, (self.cursor.pushes[Q_M] - 1) %
                                                       self.ctx.chip.tile.queue_slots), b, m0, mt, n0, nt)

    def _order(self) -> list[tuple[int, int, int, int, int, bool]]:
        """Output tiles (batch, m0, mt, n0, nt, last use of the resident panel) in emission order:
        batch by batch; rows of tiles (columns when B's panel is resident)."""
        d = self.dims
        m_steps, n_steps = steps(self.m, d.mt), steps(self.n, d.nt)
        out = []
        for b in range(len(self.batches)):
            if d.resident == "b":
                out += [(b, *m, *n, i == len(m_steps) - 1) for n in n_steps for i, m in enumerate(m_steps)]
            else:
                out += [(b, *m, *n, j == len(n_steps) - 1) for m in m_steps for j, n in enumerate(n_steps)]
        return out

    def _block(self, side: str, b: int, m0: int, mt: int, n0: int, nt: int, k0: int, kt: int) -> tuple:
        """The (r0, r, c0, c) block of A (side "a") or B that output tile (m0, n0) of batch b reads
        at K step k0, in the coordinates of the operand's stored matrix (Operand.shift)."""
        a_off, b_off = self.batches[b]
        if side == "a":
            dr, dc = self.a.shift(a_off)
            return m0 + dr, mt, k0 + dc, kt
        dr, dc = self.b.shift(b_off)
        return k0 + dr, kt, n0 + dc, nt

    def _stream_blocks(self, side: str) -> list:
        k_steps = steps(self.k, self.dims.kt)
        return [self._block(side, *t[:5], k0, kt) for t in self._order() for k0, kt in k_steps]

    def stage_need(self) -> tuple[str, int, int] | None:
        """(side, tiles, stride bytes) of the constant operand that streams with every tile read once
        (so each can be staged in the lane of the slot it will occupy), None when there is none."""
        for side, op in (("a", self.a), ("b", self.b)):
            if side == self.dims.resident or not isinstance(op, ConstOperand):
                continue
            blocks = self._stream_blocks(side)
            if len(set(blocks)) != len(blocks) or len(blocks) < 2 * STREAM_BATCH:
                continue
            stride = max(ceil_to(op.padded(r, c)[0] * op.padded(r, c)[1] * self.ctx.prec.bytes, 64)
                         for _, r, _, c in blocks)
            return side, len(blocks), stride
        return None

    def stage_bytes(self) -> int:
        """Per-lane LMEM a staged stream needs (its rows of queue_slots tiles, the first one offset by
        up to queue_slots - 1 positions), 0 when nothing is staged."""
        need = self.stage_need()
        if need is None or not self.ctx.chip.tile.buffer_chunk_bytes:
            return 0
        _, count, stride = need
        return -(-(count + self.ctx.chip.tile.queue_slots - 1) // self.ctx.chip.tile.queue_slots) * stride

    def _streams(self, tiles, k_steps) -> dict[str, "_Stream"]:
        """The streaming operands' tiles (and the bias rows) in the order the blocks read them,
        across output tiles: each loads a batch of upcoming tiles when it runs dry."""
        out = {}
        for side, queue, op in (("a", Q_T, self.a), ("b", Q_U, self.b)):
            if side != self.dims.resident:
                blocks = [self._block(side, *t, k0, kt) for t in tiles for k0, kt in k_steps]
                load = lambda b, q=queue, o=op: self._load_blocks(q, o, b)  # noqa: E731
                need = self.stage_need() if self.stage is not None else None
                if need is not None and need[0] == side:
                    load = _StagedStream(self, queue, op, blocks, self.stage, need[2]).load
                out[side] = _Stream(blocks, self._batch(side), load, lambda q=queue: self.cursor.pushes[q])
        n_batch = STREAM_BATCH // 2 if self.bias is not None and self.residual is not None else STREAM_BATCH
        if self.bias is not None:
            out["bias"] = _Stream([(n0, nt) for _, _, _, n0, nt in tiles], n_batch, self._load_bias,
                                  lambda: self.cursor.pushes[Q_N])
        if self.residual is not None:
            out["res"] = _Stream([t[1:] for t in tiles], n_batch if self.ctx.chip.tile.buffer_chunk_bytes else 1,
                                 lambda b: self._load_blocks(Q_N, self.residual, b), lambda: self.cursor.pushes[Q_N])
        return out

    def _push(self, queue: int, nbytes: int) -> None:
        self.ctx.em.tile(TPush(dst_queue=queue, dst_size=size_code(nbytes), dt=self.dt))
        self.cursor.push(queue)

    def _load_blocks(self, queue: int, op: Operand, blocks) -> None:
        op.load_slots([self.cursor.next_slot_addr(queue, j) for j in range(len(blocks))], blocks)
        e = self.ctx.prec.bytes
        for r0, r, c0, c in blocks:
            self._push(queue, r * c * e)

    def _batch(self, side: str) -> int:
        """Tiles of a streaming operand loaded and pushed together (half a queue, so the next batch
        loads while this one is read): constant tiles in runs (one DMA each), runtime tiles too
        through a tile buffer (RowsOperand.load_slots, one DMA per K panel), one by one without."""
        op = self.a if side == "a" else self.b
        return STREAM_BATCH if isinstance(op, ConstOperand) or self.ctx.chip.tile.buffer_chunk_bytes else 1

    def _tile(self, mt: int, nt: int, k_steps, streams: dict[str, "_Stream"], keep_panel: bool, m0: int = 0) -> None:
        em, res = self.ctx.em, self.dims.resident
        gemv = "TGEMV" if mt == 1 else "TMATMUL"
        acc_size = size_code(ceil_to(mt, 16) * ceil_to(nt, 16) * 4)
        ref = (lambda queue, index: tile_ref(QUEUE_NAMES[queue], self.cursor.pushes[queue] - index))  # noqa: E731
        first = True
        if self.row_bias is not None:
            self._row_bias_step(m0, mt, nt, gemv, acc_size)
            first = False                    # (a column bias needs .BIAS on the first block: not both)
        if "res" in streams:                 # ACC = R . I (+ bias)
            r_index = streams["res"].take()
            bias_index = streams["bias"].take() if "bias" in streams else None
            eye = self._identity(nt)
            em.tile(TMatmul(fn=gemv + (".BIAS" if bias_index is not None else "" if first else ".ACC"), dt=self.dt, m=mt, n=nt, k=nt,
                            src0=ref(Q_N, r_index), src1=ref(*eye), reuse1=1, acc_size=acc_size,
                            bias_src=-1 if bias_index is None else ref(Q_N, bias_index)))
            first = False
        for i, (k0, kt) in enumerate(k_steps):
            index = {side: self.panel_base + i if side == res else streams[side].take() for side in ("a", "b")}
            bias_index = streams["bias"].take() if first and "bias" in streams else None
            fn = gemv + (".BIAS" if bias_index is not None else "" if first else ".ACC")
            first = False
            em.tile(TMatmul(fn=fn, dt=self.dt, m=mt, n=nt, k=kt,
                            src0=ref(Q_T, index["a"]), src1=ref(Q_U, index["b"]),
                            reuse0=int(res == "a" and keep_panel), reuse1=int(res == "b" and keep_panel),
                            acc_size=acc_size, bias_src=-1 if bias_index is None else ref(Q_N, bias_index)))
        em.tile(AccCvt(layout="NZ2ND", row=mt, col=nt, dst_queue=Q_M, dst_size=size_code(mt * nt * self.out_prec.bytes),
                       dst_dt=TILE_DT[self.out_prec]))
        self.cursor.push(Q_M)

    def _sticky(self, name: str, op: "ConstOperand", block: tuple[int, int, int, int]) -> tuple[int, int]:
        """(queue, push index) of a constant tile read by many blocks with .reuse: pushed onto M
        (whose only other pushes are the results, one per output tile, so A's or B's resident
        panel keeps its whole queue), again when its block changes or its slot would be reused."""
        queue, held = Q_M, self.sticky.get(name)
        if held is None or held[1] != (op.key, block) or self.cursor.pushes[queue] - held[0] >= self.ctx.chip.tile.queue_slots:
            op.load(self.cursor.next_slot_addr(queue), *block)
            rp, cp = op.padded(block[1], block[3])
            self._push(queue, rp * cp * self.ctx.prec.bytes)
            self.sticky[name] = held = (self.cursor.pushes[queue] - 1, (op.key, block))
        return queue, held[0]

    def _identity(self, nt: int) -> tuple[int, int]:
        """The nt x nt identity B tile (Zn) of the R . I step."""
        eye = ConstOperand(self.ctx, "zn", np.eye(nt, dtype=np.float32), f"tile:identity:{nt}", 0, 0)
        return self._sticky("identity", eye, (0, nt, 0, nt))

    def _row_bias_step(self, m0: int, mt: int, nt: int, gemv: str, acc_size: int) -> None:
        """ACC = [bias_hi | bias_lo] (mt x 2) . ones (2 x nt): a per-row bias as two terms in the
        model's dtype whose fp32 sum is the fp32 bias to ~2 x the dtype's precision (exact for
        fp32), so only rounding-exact ops (Relu) are left for the TIU."""
        hi = _round_to(self.row_bias, self.ctx.prec)
        pair = np.stack([hi, _round_to(self.row_bias - hi, self.ctx.prec)], axis=1)
        bias = ConstOperand(self.ctx, "nz", pair, f"{self.bias_key}:rowbias2", 0, 0)
        ones = ConstOperand(self.ctx, "zn", np.ones((2, nt), np.float32), f"tile:ones2:{nt}", 0, 0)
        a, b = self._sticky("row_bias", bias, (m0, mt, 0, 2)), self._sticky("ones", ones, (0, 2, 0, nt))
        ref = (lambda queue, index: tile_ref(QUEUE_NAMES[queue], self.cursor.pushes[queue] - index))  # noqa: E731
        self.ctx.em.tile(TMatmul(fn=gemv, dt=self.dt, m=mt, n=nt, k=2, src0=ref(*a), src1=ref(*b), reuse0=1, reuse1=1,
                                 acc_size=acc_size))

    def _load_bias(self, blocks) -> None:
        """Bias rows (1 x N fp32, N padded to 16) for `blocks` ((n0, nt) each) into the next N slots:
        runs of equal rows bound for neighbouring lanes in one DMA from one constant."""
        chip, lane_bytes = self.ctx.chip, self.ctx.chip.lmem_bytes_per_lane
        slots = [self.cursor.next_slot_addr(Q_N, j) for j in range(len(blocks))]
        i = 0
        while i < len(blocks):
            j = i + 1
            while j < len(blocks) and slots[j] == slots[j - 1] + lane_bytes and blocks[j][1] == blocks[i][1]:
                j += 1
            width = ceil_to(blocks[i][1], 16)
            rows = np.zeros((j - i, width), np.float32)
            for r, (n0, nt) in enumerate(blocks[i:j]):
                rows[r, :nt] = self.bias[n0:n0 + nt]
            key = f"{self.bias_key}:tilebias:" + ";".join(f"{n0}:{nt}" for n0, nt in blocks[i:j])
            addr = self.ctx.const_addr(key, rows.reshape(-1), Prec.FP32)
            shape, strides = (1, j - i, 1, width), ((j - i) * width, width, width, 1)
            self.ctx.em.region_copy(DRegion(global_lmem_address(slots[i], chip), shape,
                                            ((j - i) * chip.tile.slot_bytes // 4, chip.tile.slot_bytes // 4, width, 1),
                                            Prec.FP32),
                                    DRegion(addr, shape, strides, Prec.FP32))
            i = j
        for _, nt in blocks:
            self._push(Q_N, ceil_to(nt, 16) * 4)


class _StagedStream:
    """A constant operand streamed through LMEM: its tiles (each padded to `stride` bytes) arrive
    a row of queue_slots at a time, one DMA per row (128 KiB of 8 KiB tiles, issued a row ahead),
    each tile in the lane of the slot it will be pushed to; then one TIU copy per batch moves them
    into their slots (the vector unit's port into the tile buffer: lane to same lane). Fewer, larger
    DMAs than filling slots from DDR in half-queue batches."""

    def __init__(self, gemm: TileGemm, queue: int, op: ConstOperand, blocks: list, offset: int, stride: int):
        self.gemm, self.queue, self.op, self.blocks = gemm, queue, op, blocks
        self.offset, self.stride = offset, stride
        self.base: int | None = None       # slot of the stream's first tile
        self.position = 0
        self.staged: set[int] = set()

    def _address(self, slot: int, row: int) -> int:
        """Flat LMEM address of staging row `row` in the lane of `slot`."""
        chip = self.gemm.ctx.chip
        lane_start = chip.tile_slot_address(self.queue, slot) // chip.lmem_bytes_per_lane * chip.lmem_bytes_per_lane
        return lane_start + self.offset + row * self.stride

    def load(self, chunk: list) -> None:
        ctx, slots = self.gemm.ctx, self.gemm.ctx.chip.tile.queue_slots
        if self.base is None:
            self.base = self.gemm.cursor.pushes[self.queue] % slots
        row, first = divmod(self.base + self.position, slots)
        if first + len(chunk) > slots:
            raise AssertionError("a staged batch wraps the queue")      # _Stream aligns batches
        for r in (row, row + 1):
            self._stage(r)
        elems = self.stride // ctx.prec.bytes
        shape = (1, len(chunk), 1, elems)
        ctx.em.ar("copy", make_tile(ctx.chip, ctx.chip.tile_slot_address(self.queue, first), shape, ctx.prec),
                  make_tile(ctx.chip, self._address(first, row), shape, ctx.prec))
        self.position += len(chunk)
        e = ctx.prec.bytes
        for r0, r, c0, c in chunk:
            self.gemm._push(self.queue, r * c * e)

    def _span(self, row: int) -> tuple[int, int]:
        """Stream positions [lo, hi) of staging row `row`."""
        slots = self.gemm.ctx.chip.tile.queue_slots
        return max(0, row * slots - self.base), min(len(self.blocks), (row + 1) * slots - self.base)

    def _stage(self, row: int) -> None:
        """One DMA: the stream's tiles of staging row `row` into their lanes, with the next rows
        too (up to STAGE_ROWS) while they are full rows not staged yet."""
        lo, hi = self._span(row)
        if row in self.staged or lo >= hi:
            return
        slots = self.gemm.ctx.chip.tile.queue_slots
        rows = [row]
        while (hi - lo == slots and len(rows) < STAGE_ROWS and rows[-1] + 1 not in self.staged
               and self._span(rows[-1] + 1)[1] - self._span(rows[-1] + 1)[0] == slots):
            rows.append(rows[-1] + 1)
        self.staged.update(rows)
        hi = self._span(rows[-1])[1]
        ctx, op, elems = self.gemm.ctx, self.op, self.stride // self.gemm.ctx.prec.bytes
        key = (f"{op.key}:{op.layout}:stage:{self.stride}:" + ";".join(f"{b}" for b in self.blocks[lo:hi]),)
        addr = ctx.weights.lookup(key, ctx.prec)
        if addr is None:
            image = np.zeros((hi - lo, elems), np.float32)
            layout = nz_layout if op.layout == "nz" else zn_layout
            for i, (r0, r, c0, c) in enumerate(self.blocks[lo:hi]):
                flat = layout(op.matrix[r0:r0 + r, c0:c0 + c], *op.padded(r, c), op.k0)
                image[i, :flat.size] = flat
            addr = ctx.weights.add(key, image.reshape(-1), ctx.prec)
        count, first = (hi - lo) // len(rows), (self.base + lo) % slots
        dst = make_tile(ctx.chip, self._address(first, row), (len(rows), count, 1, elems), ctx.prec)
        assert len(rows) == 1 or dst.strides[0] == elems, "staging rows are `stride` bytes apart"
        ctx.em.load(dst, DRegion(addr, dst.shape, (count * elems, elems, elems, 1), ctx.prec))


class _Stream:
    """The tiles of one streaming operand in the order TMATMULs read them: `take` gives the next
    tile's queue push index (its queue may carry other pushes too), loading (and pushing) the next
    batch first when none is left. Batches end on multiples of `batch` pushes of their queue
    (`queue_pushes()`), so with a batch dividing the queue depth a batch never wraps from the last
    slot (lane) to the first: one DMA each."""

    def __init__(self, blocks: list, batch: int, load: Callable[[list], None], queue_pushes: Callable[[], int]):
        self.blocks, self.batch, self.load, self.queue_pushes = blocks, batch, load, queue_pushes
        self.index: list[int] = []         # queue push index of every loaded tile
        self.used = 0

    def take(self) -> int:
        """Queue push index of the next tile."""
        if self.used == len(self.index):
            size = self.batch - self.queue_pushes() % self.batch
            chunk = self.blocks[len(self.index):len(self.index) + size]
            base = self.queue_pushes()
            self.load(chunk)
            self.index += range(base, base + len(chunk))
        self.used += 1
        return self.index[self.used - 1]


def _round_to(values: np.ndarray, prec: Prec) -> np.ndarray:
    """fp32 values rounded to `prec` (as stored in DDR) and back."""
    stored = to_storage(np.asarray(values, np.float32), prec)
    if prec == Prec.BF16:
        return (stored.astype(np.uint32) << 16).view(np.float32)
    return stored.astype(np.float32)


class _TileOutput:
    """Stores result tiles from their slots, or moves them to lanes for a TIU epilogue first.
    Result tiles of one row of output tiles sit in neighbouring M slots (lanes): up to `group` of
    them leave together (one store, or one copy to lanes and one epilogue pass over the row span)."""

    def __init__(self, ctx: LowerCtx, epi: Epilogue, extra_row_bias: np.ndarray | None, label: str,
                 y_resident=None, value_prec: Prec = Prec.FP32):
        self.ctx, self.epi, self.label = ctx, epi, label
        self.value_prec = value_prec      # of the result tiles a TIU epilogue works on (fp32 unless exact)
        self.row_bias = extra_row_bias
        self.needs_tiu = not epi.empty or extra_row_bias is not None
        self.group = OUTPUT_SPAN
        self.pending: list | None = None
        self.y_resident = y_resident      # the result kept in LMEM by a layer group (MATRIX), or None

    def _sizes(self, mt: int, nt: int, rows_total: int, cols_total: int) -> tuple[list[int], list[int]]:
        """(resident buffers, per-span buffers) in bytes per lane for the TIU epilogue."""
        chip, shape = self.ctx.chip, (1, mt, 1, nt)
        res = self.epi.resident_sizes(rows_total, cols_total)
        if self.row_bias is not None:
            res = res + [tile_bytes_per_lane(chip, (1, rows_total, 1, 1), Prec.FP32, compact=True)]
        per = [tile_bytes_per_lane(chip, shape, self.value_prec)] + self.epi.set_sizes(shape) + [
            tile_bytes_per_lane(chip, shape, self.ctx.prec)]
        return res, per

    def plan(self, arena, mt: int, nt: int, rows_total: int, cols_total: int):
        """(resident offsets, buffer sets, tiles per span) allocated from `arena`, ((), (),
        OUTPUT_SPAN) when no TIU epilogue runs, None when they do not fit. The span is the widest
        of OUTPUT_SPAN, 8, 4, 2, 1 tiles (at most a row of them) whose buffers fit."""
        if not self.needs_tiu:
            return (), (), OUTPUT_SPAN
        names = (self.epi.resident_names() + (["row_bias"] if self.row_bias is not None else []),
                 ["value"] + self.epi.set_names() + ["stored"])
        row_tiles = -(-cols_total // nt)
        for group in (g for g in (OUTPUT_SPAN, 8, 4, 2, 1) if g <= OUTPUT_SPAN and (g == 1 or g <= row_tiles)):
            res, per = self._sizes(mt, min(group * nt, cols_total) if group > 1 else nt, rows_total, cols_total)
            if arena.fits(res + per):
                res_offs, sets = arena.alloc_plan(res, per, self.label, names=names)
                return tuple(res_offs), tuple(tuple(x) for x in sets), group
        return None

    def load(self, res_offs, sets, rows_total: int, cols_total: int, group: int) -> None:
        """Take the buffers and load the resident epilogue operands (and the row bias)."""
        chip = self.ctx.chip
        self.sets, self.group = sets, group
        self.epi.load_residents(list(res_offs[:len(self.epi.resident)]), rows_total, cols_total)
        if self.row_bias is not None:
            self.bias_tile = make_tile(chip, res_offs[-1], (1, rows_total, 1, 1), Prec.FP32, compact=True)
            addr = self.ctx.const_addr(f"{self.label}:rowbias", self.row_bias, Prec.FP32)
            self.ctx.em.load(self.bias_tile, DRegion(addr, (1, rows_total, 1, 1), (rows_total, 1, 1, 1), Prec.FP32))
        self.count = 0

    def deliver(self, slot: int, row0: int, mt: int, col0: int, nt: int, regions) -> None:
        """Result tile (row0, mt) x (col0, nt) is in `slot`; `regions(col0, width)` gives the DDR
        destination of those rows and columns and the epilogue's full-operand region function."""
        p, lane_bytes = self.pending, self.ctx.chip.lmem_bytes_per_lane
        if p is not None and not (p["row0"] == row0 and p["mt"] == mt and p["nt"] == nt and len(p["slots"]) < self.group
                                  and col0 == p["col0"] + len(p["slots"]) * nt and slot == p["slots"][-1] + lane_bytes):
            self.flush()
        if self.pending is None:
            self.pending = {"row0": row0, "mt": mt, "col0": col0, "nt": nt, "slots": [slot], "regions": regions}
        else:
            self.pending["slots"].append(slot)
        if len(self.pending["slots"]) == self.group:
            self.flush()

    def flush(self) -> None:
        """Deliver the pending span of result tiles."""
        p, self.pending = self.pending, None
        if p is None:
            return
        em, chip = self.ctx.em, self.ctx.chip
        row0, mt, col0, nt, slots = p["row0"], p["mt"], p["col0"], p["nt"], p["slots"]
        count, width = len(slots), len(slots) * nt
        dst, full_region = p["regions"](col0, width)
        src_prec = self.value_prec if self.needs_tiu else self.ctx.prec
        slot_elems = chip.tile.slot_bytes // src_prec.bytes
        slot_view = DRegion(global_lmem_address(slots[0], chip), (1, count, mt, nt),
                            (count * slot_elems, slot_elems, nt, 1), src_prec)
        if not self.needs_tiu:      # tile j -> columns j * nt.. of the same rows, walked row by row
            rows_view = DRegion(slot_view.addr, (mt, count, 1, nt), (nt, slot_elems, nt, 1), src_prec)
            if self.y_resident is not None:     # into the LMEM rows: lane i takes row i of every tile
                view = self.y_resident.rows_view(chip, row0, mt, col0, width)
                em.region_copy(DRegion(global_lmem_address(view.addr, chip), view.shape, view.strides, src_prec), rows_view)
                return
            em.region_copy(DRegion(dst.addr, (mt, count, 1, nt), (dst.strides[1], nt, nt, 1), dst.prec), rows_view)
            return
        offs = self.sets[self.count % len(self.sets)]
        self.count += 1
        value = make_tile(chip, offs[0], (1, mt, 1, width), src_prec)
        em.region_copy(DRegion(global_lmem_address(value.addr, chip), (count, mt, 1, nt),
                               (nt, value.strides[1], nt, 1), src_prec), slot_view)
        if self.epi.full:
            self.epi.load_tile(offs[1:], value.shape, full_region)
        if self.row_bias is not None:
            sub = self.bias_tile.sub_channels(row0, mt, chip)
            em.ar("add", value, value, LTile(sub.addr, value.shape, Prec.FP32, (0, sub.strides[1], 0, 0), StrideMode.FREE))
        window = lambda res: res.rows_view(chip, row0, mt, col0, width)      # noqa: E731
        value = self.epi.apply(value, offs[1:], row0, col0, window) if not self.epi.empty else value
        if self.y_resident is not None:
            em.ar("copy", self.y_resident.rows_view(chip, row0, mt, col0, width), value)
            return
        if value.prec != self.ctx.prec:
            stage = make_tile(chip, offs[-1], value.shape, self.ctx.prec)
            em.ar("copy", stage, value)
            value = stage
        em.store(value, dst)


@dataclass(frozen=True)
class TilePlan(FrozenPlan):
    """A TILE MatMul: the TILE tiling (its own estimate picks it; its slots are the tile window,
    not the arena) and the TIU epilogue's resident and per-tile buffers (value, epilogue
    operands and scratch, stored), empty when the result is copied out as it is."""

    dims: TileDims
    residents: tuple[int, ...]
    sets: tuple[tuple[int, ...], ...]
    out_group: int = 1
    stage: int | None = None       # per-lane offset of the staged constant stream (TileGemm.stage_bytes)


class TileMatmulEmitter:
    """MatMul (+ bias + epilogue) groups on the TILE engine."""

    @staticmethod
    def resident_ports(graph, group: Group, chip) -> tuple[dict[str, str], dict[str, str]]:
        """Layer groups: an unbatched product reads a runtime A kept in LMEM as a matrix (rows on
        lanes; LMEM -> tile-buffer DMAs, LmemRowsOperand); any product reads its epilogue's full
        operands in place and writes its (untransposed) result there, batches stacked as rows
        (slots -> lanes DMA, or the TIU epilogue's copy)."""
        from tpuflow.lowering.layergroup import MATRIX
        from tpuflow.lowering.ops.epilogue import full_epilogue_operands
        node = group.anchor
        a, out = node.inputs[0], group.nodes[-1].outputs[0]
        a_shape = graph.tensor(a).shape
        if len(a_shape) < 2 or node.attr("y_perm") is not None or a_shape[-2] == 1:
            return {}, {}
        readable = dict.fromkeys(full_epilogue_operands(graph, group), MATRIX)
        if graph.tensor(a).const is None and math.prod(a_shape[:-2]) == 1 and node.attr("a_perm") is None:
            readable[a] = MATRIX
        return readable, {out: MATRIX}      # batches stacked: row b * M + m of the [..., M, N] result

    def __init__(self, ctx: LowerCtx, group: Group):
        self.ctx, self.group = ctx, group
        self.node = group.anchor
        self.geom = matmul_geometry(ctx, self.node)
        epilogue = list(group.epilogue)
        self.bias = None
        if epilogue and _is_col_bias(ctx, epilogue[0], self.node.outputs[0], self.geom.n):
            bias_node = epilogue.pop(0)
            other = next(t for t in bias_node.inputs if t != self.node.outputs[0])
            self.bias = np.asarray(ctx.const(other), np.float32).reshape(-1)
            anchor_out = bias_node.outputs[0]
        else:
            anchor_out = self.node.outputs[0]
        self.residual = None
        if epilogue and self.geom.batch_count == 1 and _is_residual(ctx, epilogue[0], anchor_out):
            add = epilogue.pop(0)
            self.residual = next(t for t in add.inputs if t != anchor_out)
            anchor_out = add.outputs[0]
        out_shape = ctx.graph.tensor(anchor_out).shape
        self.epi = Epilogue(ctx, anchor_out, epilogue, out_shape, group.split)
        self.a_res = ctx.resident(self.node.inputs[0]) if self.geom.batch_count == 1 else None
        self.y_res = ctx.resident(self.epi.output)

    def _batched(self) -> bool:
        """Whether all batches run as one TileGemm (runtime operands: a batch is a shift of the
        stored matrix, so K panels and result spans continue across batches)."""
        return (self.geom.batch_count > 1 and self.residual is None and self.a_res is None
                and all(self.ctx.graph.tensor(t).const is None for t in self.node.inputs[:2]))

    def _gemm(self, out: _TileOutput, batches: list[int]) -> TileGemm:
        geo = self.geom
        b = batches[0]
        a_off, b_off, _ = geo.offsets(b)
        rel = [(x - a_off, y - b_off) for x, y, _ in map(geo.offsets, batches)]
        if self.a_res is not None:
            a = LmemRowsOperand(self.ctx, "nz", self.a_res, geo.m, geo.k)
        else:
            a = self._operand(self.node.inputs[0], "nz", geo.m, geo.k, a_off, geo.a, f"{self.node.name}:A{b}")
        bop = self._operand(self.node.inputs[1], "zn", geo.k, geo.n, b_off, geo.b, f"{self.node.name}:B{b}")
        residual = None
        if self.residual is not None and self.ctx.resident(self.residual) is not None:
            residual = LmemRowsOperand(self.ctx, "nz", self.ctx.resident(self.residual), geo.m, geo.n)
        elif self.residual is not None:
            residual = RowsOperand(self.ctx, "nz", self.ctx.ddr_addr(self.residual), geo.m, geo.n, geo.n)
        return TileGemm(self.ctx, a, bop, geo.m, geo.n, geo.k, Prec.FP32 if out.needs_tiu else self.ctx.prec,
                        self.bias, self.node.name, residual, rel)

    def plan(self, region: str) -> TilePlan | None:
        """The LMEM buffers of the TIU epilogue (the tile sides are the TILE tiling's, chosen
        by its own estimate), or None when they do not fit `region`."""
        geo, arena = self.geom, self.ctx.planning_arena(region)
        out = _TileOutput(self.ctx, self.epi, None, self.node.name)
        dims = self._gemm(out, [0]).dims
        planned = out.plan(arena, dims.mt, dims.nt, geo.batch_count * geo.m, geo.n)
        if planned is None:
            return None
        stage = None
        need = self._gemm(out, [0]).stage_bytes() if geo.batch_count == 1 else 0
        if need and arena.fits([need]):
            stage = arena.alloc_plan([need], [], f"{self.node.name}:stage", names=(["tile_stage"], []))[0][0]
        return TilePlan(region, self.ctx.window(region), tuple(arena.names), dims, *planned[:2], out_group=planned[2],
                        stage=stage)

    def emit(self, plan: TilePlan) -> None:
        ctx, geo = self.ctx, self.geom
        ctx.em.layer = self.node.name
        out = _TileOutput(ctx, self.epi, None, self.node.name, self.y_res)
        result_addr = ctx.ddr_addr(self.epi.output) if self.y_res is None else 0
        prec = ctx.prec
        runs = [list(range(geo.batch_count))] if self._batched() else [[b] for b in range(geo.batch_count)]
        rs = geo.y.row_stride
        for batches in runs:
            gemm = self._gemm(out, batches)
            gemm.stage = plan.stage
            if batches[0] == 0 and out.needs_tiu:
                out.load(plan.residents, plan.sets, geo.batch_count * geo.m, geo.n, plan.out_group)

            def deliver(slot, i, m0, mt, n0, nt, batches=batches):
                b = batches[i]
                y_off = geo.offsets(b)[2]
                if not out.needs_tiu:    # stored-matrix coordinates: spans continue across batches
                    dr, dc = divmod(y_off, rs)
                    y_off, m0_ddr, n0 = 0, m0 + dr, n0 + dc
                else:
                    m0_ddr = m0

                def regions(c0, width, y_off=y_off, m0=m0_ddr):
                    dst = DRegion(result_addr + (y_off + m0 * rs + c0) * prec.bytes, (1, mt, 1, width),
                                  (mt * rs, rs, width, 1), prec)
                    full = lambda addr: DRegion(addr + (y_off + m0 * geo.n + c0) * prec.bytes,   # noqa: E731
                                                (1, mt, 1, width), (mt * geo.n, geo.n, width, 1), prec)
                    return dst, full
                out.deliver(slot, m0_ddr if not out.needs_tiu else b * geo.m + m0, mt, n0, nt, regions)

            gemm.run(deliver)
            out.flush()
        ctx.note_layer(self.node.name, "MatMul", macs=geo.batch_count * geo.m * geo.n * geo.k,
                       lmem_peak=plan.peak, group=self.group.name)
        for n in self.group.epilogue:
            ctx.note_layer(n.name, n.op_type, group=self.group.name)

    def _operand(self, tensor: str, layout: str, rows: int, cols: int, offset: int, view, key: str) -> Operand:
        info = self.ctx.graph.tensor(tensor)
        if info.const is not None:
            flat = np.asarray(info.const, np.float32).reshape(-1)[offset:]
            shape = (cols, rows) if view.transposed else (rows, cols)
            full = np.lib.stride_tricks.as_strided(flat, shape, (view.row_stride * 4, 4))
            return ConstOperand(self.ctx, layout, np.ascontiguousarray(full.T if view.transposed else full), key, 0, 0)
        addr = self.ctx.ddr_addr(tensor) + offset * self.ctx.prec.bytes
        return RowsOperand(self.ctx, layout, addr, rows, cols, view.row_stride, col_major=view.transposed)


def _is_residual(ctx: LowerCtx, node, value: str) -> bool:
    """Whether `node` adds a runtime tensor (in DDR, or kept in LMEM as a matrix) of exactly
    `value`'s shape to it (a residual the CUBE can accumulate: TileGemm's R . I step)."""
    if node.op_type != "Add" or len(node.inputs) != 2 or list(node.inputs).count(value) != 1:
        return False
    other = next(t for t in node.inputs if t != value)
    info = ctx.graph.tensor(other)
    return info.const is None and tuple(info.shape) == tuple(ctx.graph.tensor(value).shape)


def _is_col_bias(ctx: LowerCtx, node, value: str, n: int) -> bool:
    if node.op_type != "Add":
        return False
    other = [t for t in node.inputs if t != value]
    if len(other) != 1 or ctx.graph.tensor(other[0]).const is None:
        return False
    shape = ctx.graph.tensor(other[0]).shape
    return math.prod(shape) == n and (not shape or shape[-1] == n)


@dataclass(frozen=True)
class TileConvPlan(FrozenPlan):
    """A TILE conv: the TILE tiling, the TIU epilogue's resident and per-tile buffers (the
    first `output_buffers` buffers), then the NHWC staging blocks (channels x pixels) and their
    buffer sets (input block, transposed block) above them. Only the epilogue's buffers are
    reported as the layer's LMEM peak and to the ring, as before the protocol (the staging
    buffers of a conv without a TIU epilogue are reported to the ring)."""

    dims: TileDims
    residents: tuple[int, ...]
    sets: tuple[tuple[int, ...], ...]
    nhwc_ct: int
    nhwc_pt: int
    nhwc_sets: tuple[tuple[int, ...], ...]
    output_buffers: int
    out_group: int = 1

    @property
    def peak(self) -> int:
        return max((off + size for _, off, size in self.buffers[:self.output_buffers]), default=0)

    @property
    def ring_buffers(self) -> tuple[tuple[str, int, int], ...]:
        return self.buffers[:self.output_buffers] if self.output_buffers else self.buffers


class TileConvEmitter:
    """Conv groups on the TILE engine: per image and group, Y^T (Cout x Ho*Wo) = W . P^T."""

    def __init__(self, ctx: LowerCtx, group: Group):
        self.ctx, self.group = ctx, group
        self.node = group.anchor
        self.geom = conv_geometry(ctx, self.node)
        out = self.node.outputs[0]
        epilogue = list(group.epilogue)
        b = self.node.inputs[2] if len(self.node.inputs) > 2 and self.node.inputs[2] else None
        self.bias = np.asarray(ctx.const(b), np.float32).reshape(-1) if b else None
        # a residual Add in the ACC (R . I) and the bias too (TileGemm._row_bias_step) when only Relu
        # follows: Relu commutes with rounding, so the result leaves the ACC in the model's dtype
        self.residual = None
        add = epilogue[0] if epilogue and _is_residual(ctx, epilogue[0], out) else None
        other = next(t for t in add.inputs if t != out) if add is not None else None
        if add is not None and ctx.resident(other) is not None:
            add = None
        tail = epilogue[1:] if add is not None else epilogue
        self.bias_in_acc = all(n.op_type == "Relu" for n in tail)     # everything but Relu in the ACC
        if self.bias_in_acc and add is not None:
            self.residual, out, epilogue = other, add.outputs[0], tail
        self.epi = Epilogue(ctx, out, epilogue, ctx.graph.tensor(out).shape, 2)

    def _output(self) -> "_TileOutput":
        """Result tiles in the model's dtype when only Relu is left for the TIU, else fp32 (and the
        bias added on the TIU)."""
        if self.bias_in_acc:
            return _TileOutput(self.ctx, self.epi, None, self.node.name, value_prec=self.ctx.prec)
        return _TileOutput(self.ctx, self.epi, self.bias, self.node.name)

    @staticmethod
    def scratch_bytes(graph, group: Group, options) -> int:
        node = group.anchor
        n, cin, h, w = graph.tensor(node.inputs[0]).shape
        cout, cin_g, kh, kw = graph.tensor(node.inputs[1]).shape
        _, _, ho, wo = graph.tensor(node.outputs[0]).shape
        esize = {"fp32": 4, "fp16": 2, "bf16": 2}[options.dtype]
        return _nhwc_offset(cin_g * kh * kw * ho * wo * esize) + cin_g * h * w * esize

    def _gemm(self, out: _TileOutput, weights: np.ndarray, gi: int, n: int = 0) -> TileGemm:
        ctx, geo = self.ctx, self.geom
        cin_g, cout_g = geo.cin // geo.groups, geo.cout // geo.groups
        kdim, pix, oc0 = cin_g * geo.kh * geo.kw, geo.ho * geo.wo, gi * cout_g
        a = ConstOperand(ctx, "nz", weights[oc0:oc0 + cout_g], f"{self.node.name}:W{gi}", 0, 0)
        bop = RowsOperand(ctx, "zn", self._p_address(cin_g), kdim, pix, kdim, col_major=True)
        residual = None
        if self.residual is not None:
            r_addr = ctx.ddr_addr(self.residual) + (n * geo.cout + oc0) * pix * ctx.prec.bytes
            residual = RowsOperand(ctx, "nz", r_addr, cout_g, pix, pix)
        gemm = TileGemm(ctx, a, bop, cout_g, pix, kdim, out.value_prec if out.needs_tiu else ctx.prec,
                        bias_key=f"{self.node.name}:{gi}", residual=residual)
        if self.bias_in_acc and self.bias is not None:
            gemm.row_bias = self.bias[oc0:oc0 + cout_g]
        return gemm

    def _weights(self) -> np.ndarray:
        """(Cout x K) with K running (kh, kw, c), so im2col copies runs of channels from the NHWC copy."""
        geo = self.geom
        cin_g = geo.cin // geo.groups
        return np.asarray(self.ctx.const(self.node.inputs[1]), np.float32).reshape(
            geo.cout, cin_g, geo.kh, geo.kw).transpose(0, 2, 3, 1).reshape(geo.cout, cin_g * geo.kh * geo.kw)

    def plan(self, region: str) -> TileConvPlan | None:
        """The TIU epilogue's buffers, then the NHWC staging buffers above them (every image and
        group still needs the epilogue's residents), or None when they do not fit `region`."""
        geo, ctx, chip = self.geom, self.ctx, self.ctx.chip
        arena = ctx.planning_arena(region)
        out = self._output()
        dims = self._gemm(out, self._weights(), 0).dims
        planned = out.plan(arena, dims.mt, dims.nt, geo.cout, geo.ho * geo.wo)
        if planned is None:
            return None
        output_buffers, pix_in = len(arena.names), geo.h * geo.w
        sizes = lambda ct, pt: [tile_bytes_per_lane(chip, (1, ct, 1, pt), ctx.prec),      # noqa: E731
                                tile_bytes_per_lane(chip, (1, pt, 1, ct), ctx.prec)]
        ct = min(geo.cin // geo.groups, NHWC_BLOCK)
        pt = next((p for p in (NHWC_BLOCK, NHWC_BLOCK // 2, NHWC_BLOCK // 4, chip.lanes)
                   if arena.fits(sizes(ct, min(p, pix_in)) * 2)), chip.lanes)
        pt = min(pt, pix_in)
        if not arena.fits(sizes(ct, pt)):
            return None
        _, sets = arena.alloc_plan([], sizes(ct, pt), f"{self.node.name}:nhwc", names=([], ["nhwc_in", "nhwc_out"]))
        return TileConvPlan(region, ctx.window(region), tuple(arena.names), dims, *planned[:2], ct, pt,
                            tuple(tuple(x) for x in sets), output_buffers, out_group=planned[2])

    def emit(self, plan: TileConvPlan) -> None:
        ctx, geo = self.ctx, self.geom
        ctx.em.layer = self.node.name
        cin_g, cout_g = geo.cin // geo.groups, geo.cout // geo.groups
        kdim, pix = cin_g * geo.kh * geo.kw, geo.ho * geo.wo
        weights = self._weights()
        out = self._output()
        for n in range(geo.n):
            for gi in range(geo.groups):
                ic0, oc0 = gi * cin_g, gi * cout_g
                gemm = self._gemm(out, weights, gi, n)
                if n == 0 and gi == 0 and out.needs_tiu:
                    out.load(plan.residents, plan.sets, geo.cout, pix, plan.out_group)
                self._im2col(n, ic0, cin_g, plan)

                def deliver(slot, _batch, m0, mt, n0, nt, n=n, oc0=oc0):
                    def regions(p0, width, c=oc0 + m0):
                        return (self._y_region(ctx.ddr_addr(self.epi.output), n, c, mt, p0, width),
                                lambda addr: self._y_region(addr, n, c, mt, p0, width))
                    out.deliver(slot, oc0 + m0, mt, n0, nt, regions)

                gemm.run(deliver)
                out.flush()
        macs = geo.n * geo.cout * pix * kdim
        ctx.note_layer(self.node.name, "Conv", macs=macs, lmem_peak=plan.peak, group=self.group.name)
        for nd in self.group.epilogue:
            ctx.note_layer(nd.name, nd.op_type, group=self.group.name)

    def _y_region(self, addr: int, n: int, c0: int, ct: int, p0: int, pt: int) -> DRegion:
        geo, prec = self.geom, self.ctx.prec
        pix = geo.ho * geo.wo
        return DRegion(addr + ((n * geo.cout + c0) * pix + p0) * prec.bytes, (1, ct, 1, pt), (ct * pix, pix, pt, 1), prec)

    def _nhwc_address(self, cin_g: int) -> int:
        geo = self.geom
        p_bytes = cin_g * geo.kh * geo.kw * geo.ho * geo.wo * self.ctx.prec.bytes
        return self.ctx.ddr.scratch_base + _nhwc_offset(p_bytes)

    def _p_address(self, cin_g: int) -> int:
        """Where P lives: the scratch area, or the NHWC copy itself when im2col is the identity."""
        geo = self.geom
        if geo.kh * geo.kw == 1 and geo.sy == geo.sx == 1 and not any((geo.pt, geo.pl, geo.pb, geo.pr)):
            return self._nhwc_address(cin_g)
        return self.ctx.ddr.scratch_base

    def _im2col(self, n: int, ic0: int, cin_g: int, plan: TileConvPlan) -> int:
        """P[(oh, ow), (kh, kw, c)] in the scratch area (K contiguous, so B = P^T loads into Zn
        tiles in runs of K0 elements), built from an NHWC copy of the input: zero fill when the
        taps reach padding, then one DMA per (kh, kw) copying runs of cin_g channels. A 1x1
        stride-1 unpadded convolution uses the NHWC copy itself."""
        ctx, geo, prec = self.ctx, self.geom, self.ctx.prec
        pix = geo.ho * geo.wo
        kk = geo.kh * geo.kw
        rows = cin_g * kk
        base = ctx.scratch_region(0, (1, 1, rows, pix)).addr
        nhwc = self._to_nhwc(n, ic0, cin_g, self._nhwc_address(cin_g), plan)
        padded = any((geo.pt, geo.pl, geo.pb, geo.pr))
        if self._p_address(cin_g) == nhwc:
            return nhwc
        total = rows * pix
        if padded:
            width = next(w for w in range(min(total, 65535), 0, -1) if total % w == 0)
            ctx.em.fill(DRegion(base, (1, 1, total // width, width), (total, total, width, 1), prec), 0.0)
        for i in range(geo.kh):
            oh_lo, oh_hi = _valid(geo.ho, geo.sy, i * geo.dy - geo.pt, geo.h)
            for j in range(geo.kw):
                ow_lo, ow_hi = _valid(geo.wo, geo.sx, j * geo.dx - geo.pl, geo.w)
                if oh_hi <= oh_lo or ow_hi <= ow_lo:
                    continue
                src = nhwc + ((oh_lo * geo.sy + i * geo.dy - geo.pt) * geo.w + ow_lo * geo.sx + j * geo.dx - geo.pl) * cin_g * prec.bytes
                dst = base + ((oh_lo * geo.wo + ow_lo) * rows + (i * geo.kw + j) * cin_g) * prec.bytes
                copy_nd(ctx, src, (geo.sy * geo.w * cin_g, geo.sx * cin_g, 1), dst, (geo.wo * rows, rows, 1),
                        (oh_hi - oh_lo, ow_hi - ow_lo, cin_g), prec)
        return base

    def _to_nhwc(self, n: int, ic0: int, cin_g: int, dst_addr: int, plan: TileConvPlan) -> int:
        """Channels [ic0, ic0 + cin_g) of image n, transposed to pixel-major (NHWC) at dst_addr
        through LMEM: load (channels on lanes, pixels along W), TIU C<->W transpose, store runs
        of channels per pixel. Double-buffered over (channel, pixel) blocks."""
        ctx, geo, chip, prec = self.ctx, self.geom, self.ctx.chip, self.ctx.prec
        pix_in = geo.h * geo.w
        ct, pt, sets = plan.nhwc_ct, plan.nhwc_pt, plan.nhwc_sets
        x_addr = ctx.ddr_addr(self.node.inputs[0]) + (n * geo.cin + ic0) * pix_in * prec.bytes
        blocks = [(c0, c, p0, p) for c0, c in steps(cin_g, ct) for p0, p in steps(pix_in, pt)]

        def load(block, s):
            c0, c, p0, p = block
            ctx.em.load(make_tile(chip, sets[s][0], (1, c, 1, p), prec),
                        DRegion(x_addr + (c0 * pix_in + p0) * prec.bytes, (1, c, 1, p), (cin_g * pix_in, pix_in, p, 1), prec))

        def transpose_store(block, s):
            c0, c, p0, p = block
            src = make_tile(chip, sets[s][0], (1, c, 1, p), prec)
            out = make_tile(chip, sets[s][1], (1, p, 1, c), prec)
            f = out.fields("res0", with_shape=True)
            f.update(src.fields("opd0"))
            ctx.em.tiu(CwBcTiu(op="cw_ts", opd0_c=c, opd0_w=p, **{k: v for k, v in f.items() if k != "opt_opd0_prec"}))
            ctx.em.store(out, DRegion(dst_addr + (p0 * cin_g + c0) * prec.bytes, (1, p, 1, c), (pix_in * cin_g, cin_g, c, 1), prec))

        pipelined(blocks, len(sets), load, transpose_store)
        return dst_addr


def _nhwc_offset(p_bytes: int) -> int:
    """Scratch offset of the NHWC staging copy: after P, 4 KiB aligned."""
    return -(-p_bytes // 4096) * 4096


def _valid(out: int, stride: int, offset: int, size: int) -> tuple[int, int]:
    """Output positions o in [lo, hi) with 0 <= o*stride + offset < size."""
    lo = max(0, -(-(-offset) // stride)) if offset < 0 else 0
    hi = min(out, (size - 1 - offset) // stride + 1) if size - 1 - offset >= 0 else 0
    return lo, max(lo, hi)


def tile_conv_emitter(ctx: LowerCtx, group: Group):
    """A conv group with the TILE engine. On the TIU instead: a depthwise conv (not a matmul), and a
    conv with fewer input channels per group than one K fractal row (K0 elements, e.g. an RGB stem):
    its im2col would move runs of a few bytes and its K fractals would be mostly padding."""
    geo = conv_geometry(ctx, group.anchor)
    k0 = ctx.chip.tile.k_fractal_bytes // ctx.prec.bytes
    if (geo.groups == geo.cin == geo.cout and geo.groups > 1) or geo.cin // geo.groups < k0:
        from tpuflow.lowering.ops.conv import ConvEmitter
        return ConvEmitter(ctx, group)
    return TileConvEmitter(ctx, group)


tile_conv_emitter.scratch_bytes = TileConvEmitter.scratch_bytes

TILE_EMITTERS = {"matmul": TileMatmulEmitter, "conv": tile_conv_emitter}
