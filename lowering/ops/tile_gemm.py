"""One TILE-engine GEMM: its tiling, the queue bookkeeping, the streams that keep the slots fed
(batches ahead of use, staged constants, sticky constant tiles) and the CUBE blocks it emits."""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tpuflow.isa import AccCvt, Prec, TMatmul, TPush, global_lmem_address, size_code, tile_ref
from tpuflow.hwmodel.timing.cost import tile_load_cycles
from tpuflow.lowering.context import LowerCtx
from tpuflow.lowering.ops.tile_operands import (ConstOperand, HaloOperand, IdentityOperand, Operand, RowsOperand, ceil_to,
                                                 nz_layout, tile_copy, zn_layout)
from tpuflow.lowering.tensors import DRegion, make_tile
from tpuflow.lowering.tiling import steps
from tpuflow.lowering.weights import to_storage

Q_T, Q_U, Q_M, Q_N = 0, 1, 2, 3
QUEUE_NAMES = ("T", "U", "M", "N")
TILE_DT = {Prec.FP32: "FP32", Prec.FP16: "FP16", Prec.BF16: "BF16"}


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
OUTPUT_SPAN = 12               # result tiles delivered together at most (M slots: fewer than a queue, so none
                               # is overwritten by the next ACCCVT or identity push before it leaves)
STAGE_ROWS = 2                 # staging rows (queue_slots tiles each) one DMA brings into LMEM at most
STAGE_DMA_BYTES = 1024 * 1024  # a staging DMA's bytes at most with a tile-buffer DMA port (stage_rows)
STAGE_TAIL_TILES = 16          # with the port: the last staging row of a stream (stage_rows)
STREAM_BATCH = 8               # constant K tiles loaded per DMA (half a queue: the next run loads while this one is read)
# Operand tile loads are priced by hwmodel.timing.cost.tile_load_cycles (the scheduler's per-instruction cost):
# through the tile buffer a runtime operand costs its DDR rows, without it its K0-element (32 B) or
# single-element pieces; a constant one arrives pre-arranged, STREAM_BATCH tiles per contiguous DMA.


class TileGemm:
    """Y (M x N) = A (M x K) . B (K x N) [+ bias row] [+ R] on the TILE engine, tile by tile;
    `deliver` gets the slot holding each row-major result tile. A residual R (M x N, runtime)
    enters the ACC first, as R . I (an extra K step whose B is the identity, exact in the fp32 ACC;
    with .BIAS when there is a bias), so no TIU pass is needed for it. With two ACCs, a streamed constant
    A and a halo B (an implicit-GEMM conv), output tiles go in pairs that share each A tile (_run_pairs)."""

    def __init__(self, ctx: LowerCtx, a: Operand, b: Operand, m: int, n: int, k: int, out_prec: Prec,
                 bias: np.ndarray | None = None, bias_key: str = "", residual: Operand | None = None,
                 batches: list[tuple[int, int]] | None = None, n_tile: int | None = None, k_unit: int | None = None):
        self.ctx, self.a, self.b, self.m, self.n, self.k = ctx, a, b, m, n, k
        self.n_tile, self.k_unit = n_tile, k_unit     # a forced N tile side; K tiles dividing k_unit
        self.batches = batches or [(0, 0)]     # (A offset, B offset) in elements of each batch
        self.out_prec, self.bias, self.bias_key, self.residual = out_prec, bias, bias_key, residual
        self.dims = self._dims()
        self.cursor = QueueCursor(ctx)
        self.dt = TILE_DT[ctx.prec]
        self.stage: int | None = None   # per-lane LMEM offset where a constant stream is staged (stage_need)
        self.stage_tail = True          # the staged stream's last STAGE_TAIL_TILES tiles in a DMA of their own
        self.panel_base = 0          # queue push index of the resident panel's first tile
        self.sticky: dict[str, tuple[int, tuple]] = {}   # name -> (M push index, (operand key, block))
        self.row_bias: np.ndarray | None = None         # per-row (M) bias added in the ACC (_row_bias_step)
        self.sticky_cache: StickyCache | None = None    # LMEM copies of the sticky constant tiles, or None
        self.relu = False           # ACCCVT applies a Relu on the way out of the ACC (_TileOutput.cvt_relu)
        self.acc_layout = "NZ2ND"   # ACCCVT's layout: NZ2DN (column-major) for a result stored C0-blocked

    def _dims(self) -> TileDims:
        """The tiling with the least estimated time: tile sides whose A, B and converted result
        each fit one tile slot, and whether one operand's K tiles stay resident in their queue
        (loaded once per row / column of output tiles, read with .reuse) while the other streams."""
        tile, e, oe = self.ctx.chip.tile, self.ctx.prec.bytes, self.out_prec.bytes
        k0 = self.a.k0
        best = None
        for mt in sorted({min(ceil_to(self.m, tile.fractal_m), side) for side in TILE_SIDES}, reverse=True):
            for nt in self._n_sides():
                if mt * nt * oe > tile.slot_bytes:
                    continue
                if self.residual is not None and self._residual_bytes(mt, nt) > tile.slot_bytes:
                    continue                     # R (mt x nt) and the identity of the R . I / I . R step fit a slot
                kt = min(tile.slot_bytes // (mt * e), tile.slot_bytes // (ceil_to(nt, tile.fractal_n) * e)) // k0 * k0
                kt = max(k0, min(kt, ceil_to(self.k, k0)))
                if self.k_unit:
                    kt = max((d for d in range(k0, kt + 1, k0) if self.k_unit % d == 0), default=0)
                    if not kt:
                        continue
                for resident in ("", "a", "b"):
                    if resident and -(-self.k // kt) > tile.queue_slots:
                        continue
                    if resident == "b" and isinstance(self.b, HaloOperand):    # (its row-bias stream would take N)
                        continue
                    dims = TileDims(mt, nt, kt, resident)
                    key = (self._estimate_ns(dims), -mt * nt, resident)
                    if best is None or key < best[0]:
                        best = (key, dims)
        if best is None:
            raise ValueError(f"no TILE tiling with N tile {self.n_tile} (residual: {self.residual is not None})")
        return best[1]

    def _residual_bytes(self, mt: int, nt: int) -> int:
        """The larger of R's tile and the identity's: R . I (R an Nz A tile, I nt x nt) or, for a residual
        given as a Zn operand, I . R (I mt x mt)."""
        k0, e = self.a.k0, self.ctx.prec.bytes
        if self.residual.layout == "zn":
            return max(ceil_to(mt, 16) * ceil_to(mt, k0), ceil_to(mt, k0) * ceil_to(nt, 16)) * e
        return max(ceil_to(nt, k0) * ceil_to(nt, 16), ceil_to(mt, 16) * ceil_to(nt, k0)) * e

    def _n_sides(self) -> list[int]:
        if self.n_tile:
            return [self.n_tile]
        return sorted({min(ceil_to(self.n, self.ctx.chip.tile.fractal_n), side) for side in TILE_SIDES}, reverse=True)

    def _estimate_ns(self, d: TileDims) -> float:
        """max(GDMA time of the operand loads, TILE time of the blocks), roughly."""
        chip, e = self.ctx.chip, self.ctx.prec.bytes
        tm, tn, tk = -(-self.m // d.mt), -(-self.n // d.nt), -(-self.k // d.kt)
        a_loads = tm * tk * (1 if d.resident == "a" else -(-tn // 2) if self._pairable() and not d.resident else tn)
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
        port_ns = self._port_cycles(d, a_loads, b_loads, tk) * 1e3 / chip.clocks.tile_clock_mhz
        expand_ns = self._expand_cycles(d, b_loads, tk) * 1e3 / chip.clocks.tile_clock_mhz
        return max(dma_ns, port_ns, expand_ns, tm * tn * tk * block * 1e3 / chip.clocks.tile_clock_mhz)

    def _expand_cycles(self, d: TileDims, b_loads: int, tk: int) -> float:
        """Tile cycles of the TIMG2COLs that make a HaloOperand's B tiles (one per run of up to STREAM_BATCH
        tiles of a channel group: engines.unit_cycles), 0 for other operands."""
        tile = self.ctx.chip.tile
        if not isinstance(self.b, HaloOperand):
            return 0.0
        runs = b_loads / max(1, min(STREAM_BATCH, self.b.k_unit // d.kt, tk))
        return runs * tile.img2col_latency_cycles + b_loads * ceil_to(d.nt, tile.fractal_n) * d.kt * self.ctx.prec.bytes \
            / max(1, tile.img2col_bytes_per_cycle)

    def _port_cycles(self, d: TileDims, a_loads: int, b_loads: int, tk: int) -> float:
        """Tile cycles the tile buffer's DMA port spends on the operand tiles it moves from LMEM (a
        constant staged in LMEM, a window or rows kept there): one TMOVE per run of K tiles (a resident
        panel, or up to STREAM_BATCH), each move_port_latency_cycles plus its bytes at the port's rate
        (tpuflow.hwmodel.timing.engines.TilePort); 0 without a port. Without this term the tiling
        re-read the weights once per pixel tile (ResNet-50 fp16: 160 MB through the port)."""
        tile, e = self.ctx.chip.tile, self.ctx.prec.bytes
        if not tile.move_port_bytes_per_cycle:
            return 0.0
        total = 0.0
        for op, loads, rows, resident in ((self.a, a_loads, d.mt, d.resident == "a"),
                                          (self.b, b_loads, d.nt, d.resident == "b")):
            if isinstance(op, RowsOperand):          # from DDR: on the GDMA
                continue
            if isinstance(op, HaloOperand):          # a halo per pixel tile and channel group, not the windows
                halos = loads * d.kt / op.k_unit
                total += halos * (tile.move_port_latency_cycles + op.halo_bytes() / tile.move_port_bytes_per_cycle)
                continue
            run = min(tk, tile.queue_slots if resident else STREAM_BATCH)
            total += loads / run * tile.move_port_latency_cycles + loads * rows * d.kt * e / tile.move_port_bytes_per_cycle
        return total

    def run(self, deliver: Callable[[int, int, int, int, int, int], None]) -> None:
        """deliver(slot, batch, m0, mt, n0, nt) for every result tile."""
        k_steps = steps(self.k, self.dims.kt)
        order = self._order()
        if self._paired():
            self._run_pairs(order, k_steps, deliver)
            return
        streams = self._streams([t[:5] for t in order], k_steps)
        if self.row_bias is not None and self.sticky_cache is not None:
            self.sticky_cache.preload(self._row_bias_operand(), [(m0, mt, 0, 2) for m0, mt in steps(self.m, self.dims.mt)])
        for index, (b, m0, mt, n0, nt, last_use) in enumerate(order):
            first_use = index == 0 or order[index - 1][5]
            if self.dims.resident and first_use:         # the resident operand's K tiles for this row / column
                self.panel_base = self.cursor.pushes[Q_T if self.dims.resident == "a" else Q_U]
                side = self.dims.resident
                self._load_blocks(Q_T if side == "a" else Q_U, self.a if side == "a" else self.b,
                                  [self._block(side, b, m0, mt, n0, nt, k0, kt) for k0, kt in k_steps])
            if self._aligned_passes():
                streams["a"] = self._aligned_pass(b, m0, mt, n0, nt, k_steps)
            self._tile(mt, nt, k_steps, streams, keep_panel=not last_use, m0=m0)
            deliver(self.cursor.chip.tile_slot_address(Q_M, (self.cursor.pushes[Q_M] - 1) %
                                                       self.ctx.chip.tile.queue_slots), b, m0, mt, n0, nt)

    def _pairable(self) -> bool:
        """Whether output tiles can go in pairs sharing their A tiles (_run_pairs): two ACCs, a constant
        A (the weights) streamed against a halo B (an implicit-GEMM conv, whose large-K weight panel
        cannot stay resident in a queue)."""
        return (self.ctx.chip.tile.acc_buffers >= 2 and isinstance(self.a, ConstOperand)
                and isinstance(self.b, HaloOperand))

    def _paired(self) -> bool:
        return self._pairable() and not self.dims.resident and not self._aligned_passes()

    def _pair_groups(self, order) -> list[list[tuple]]:
        """Neighbouring output tiles of one batch and row of A (same m0) two by two (the last one alone
        when a row has an odd count)."""
        groups: list[list[tuple]] = []
        for t in order:
            if groups and len(groups[-1]) == 1 and groups[-1][0][:3] == t[:3]:
                groups[-1].append(t)
            else:
                groups.append([t])
        return groups

    def _pair_chunks(self, groups, k_steps, t_pushes: int) -> list[list[list]]:
        """Per group, its K steps cut where A's batches end (A's tiles get T push indices from
        `t_pushes` on, batches end on multiples of _batch("a")), so a chunk's A tiles are live together:
        the first tile of the pair reads them with .reuse, the second releases them before the next
        batch is filled into their slots."""
        batch, pos, out = self._batch("a"), t_pushes, []
        for _ in groups:
            chunks, cur = [], []
            for ks in k_steps:
                cur.append(ks)
                pos += 1
                if pos % batch == 0:
                    chunks.append(cur)
                    cur = []
            out.append(chunks + ([cur] if cur else []))
        return out

    def _pair_blocks(self, side: str, groups, chunks) -> list:
        """A's tiles once per group; B's chunk by chunk, the first tile's then the second's."""
        if side == "a":
            return [self._block("a", *g[0][:5], k0, kt) for g, cs in zip(groups, chunks) for c in cs for k0, kt in c]
        return [self._block("b", *t[:5], k0, kt) for g, cs in zip(groups, chunks) for c in cs for t in g for k0, kt in c]

    def _run_pairs(self, order, k_steps, deliver) -> None:
        """Output tiles two by two in ACCs 0 and 1, K chunk by K chunk: each A tile (a weight tile) is
        moved into its slot once for both (half the weight traffic on the tile buffer's DMA port)."""
        groups = self._pair_groups(order)
        chunks = self._pair_chunks(groups, k_steps, self.cursor.pushes[Q_T])
        streams = self._streams([t[:5] for t in order], k_steps,
                                {side: self._pair_blocks(side, groups, chunks) for side in ("a", "b")})
        if self.row_bias is not None and self.sticky_cache is not None:
            self.sticky_cache.preload(self._row_bias_operand(), [(m0, mt, 0, 2) for m0, mt in steps(self.m, self.dims.mt)])
        for group, group_chunks in zip(groups, chunks):
            self._pair(group, group_chunks, streams, deliver)

    def _pair(self, group, chunks, streams, deliver) -> None:
        em, last = self.ctx.em, len(group) - 1
        ref = (lambda queue, index: tile_ref(QUEUE_NAMES[queue], self.cursor.pushes[queue] - index))  # noqa: E731
        sizes = [size_code(ceil_to(t[2], 16) * ceil_to(t[4], 16) * 4) for t in group]
        gemv = "TGEMV" if group[0][2] == 1 else "TMATMUL"
        fresh = [True] * len(group)
        if self.row_bias is not None:
            for j, (_, m0, mt, _, nt, _) in enumerate(group):
                self._row_bias_step(m0, mt, nt, gemv, sizes[j], streams, acc=j)
                fresh[j] = False
        for chunk in chunks:
            a_index = [streams["a"].take() for _ in chunk]
            for j, (_, _, mt, _, nt, _) in enumerate(group):
                for (_, kt), ai in zip(chunk, a_index):
                    em.tile(TMatmul(fn=gemv + ("" if fresh[j] else ".ACC"), dt=self.dt, m=mt, n=nt, k=kt,
                                    src0=ref(Q_T, ai), src1=ref(Q_U, streams["b"].take()), reuse0=int(j < last),
                                    acc_size=sizes[j], acc=j))
                    fresh[j] = False
        for j, (b, m0, mt, n0, nt, _) in enumerate(group):
            em.tile(AccCvt(layout=self.acc_layout, row=mt, col=nt, dst_queue=Q_M, dst_size=size_code(mt * nt * self.out_prec.bytes),
                           dst_dt=TILE_DT[self.out_prec], relu=int(self.relu), acc=j))
            self.cursor.push(Q_M)
            deliver(self.cursor.chip.tile_slot_address(Q_M, (self.cursor.pushes[Q_M] - 1) % self.ctx.chip.tile.queue_slots),
                    b, m0, mt, n0, nt)

    def _aligned_passes(self) -> bool:
        """Whether A streams pass by pass from a lane-staged operand (LaneRowsOperand): every output
        tile's K tiles start on a multiple of queue_slots T pushes, so K tile j always lands in the
        slot (lane) j % queue_slots and is moved there by a TIU copy from the same lane."""
        return not self.dims.resident and getattr(self.a, "aligned_passes", False)

    def _aligned_pass(self, b: int, m0: int, mt: int, n0: int, nt: int, k_steps) -> "_Stream":
        """The A stream of one output tile, after a TPUSH of the unused slots up to the next multiple of
        queue_slots T pushes (the queue's slots are written only by these passes)."""
        pad = -self.cursor.pushes[Q_T] % self.ctx.chip.tile.queue_slots
        if pad:
            self.ctx.em.tile(TPush(dst_queue=Q_T, dst_size=size_code(self.a.stride), dt=self.dt, count=pad))
            for _ in range(pad):
                self.cursor.push(Q_T)
        blocks = [self._block("a", b, m0, mt, n0, nt, k0, kt) for k0, kt in k_steps]
        return _Stream(blocks, STREAM_BATCH, lambda chunk: self._load_blocks(Q_T, self.a, chunk),
                       lambda: self.cursor.pushes[Q_T])

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
        if self._paired():
            groups = self._pair_groups(self._order())
            return self._pair_blocks(side, groups, self._pair_chunks(groups, k_steps, 0))
        return [self._block(side, *t[:5], k0, kt) for t in self._order() for k0, kt in k_steps]

    def stage_need(self) -> tuple[str, int, int] | None:
        """(side, distinct tiles, stride bytes) of the streaming constant operand staged in LMEM, None
        when there is none. Without a tile-buffer DMA port only a stream reading every tile once (each
        is staged in the lane of the slot it will occupy); with it also one reading tiles again (a
        weight read once per row of output tiles is loaded from DDR once, moved into slots each time)."""
        port = self.ctx.chip.tile.move_port_bytes_per_cycle > 0
        for side, op in (("a", self.a), ("b", self.b)):
            if side == self.dims.resident or not isinstance(op, ConstOperand):
                continue
            blocks = self._stream_blocks(side)
            distinct = len(set(blocks))
            if (distinct != len(blocks) and not port) or len(blocks) < 2 * STREAM_BATCH:
                continue
            stride = max(ceil_to(op.padded(r, c)[0] * op.padded(r, c)[1] * self.ctx.prec.bytes, 64)
                         for _, r, _, c in blocks)
            return side, distinct, stride
        return None

    def stage_bytes(self) -> int:
        """Per-lane LMEM a staged stream needs (its rows of queue_slots tiles, the first one offset by
        up to queue_slots - 1 positions), 0 when nothing is staged."""
        need = self.stage_need()
        if need is None or not self.ctx.chip.tile.buffer_chunk_bytes:
            return 0
        _, count, stride = need
        chip = self.ctx.chip
        if chip.tile.move_port_bytes_per_cycle:        # _StagedStream._address: lanes wide, count // lanes deep
            return -(-count // chip.lanes) * stride
        return max(len(stage_rows(chip, count, stride, base)) - 1 for base in range(chip.tile.queue_slots)) * stride

    def _streams(self, tiles, k_steps, given: dict | None = None) -> dict[str, "_Stream"]:
        """The streaming operands' tiles (and the bias rows) in the order the blocks read them,
        across output tiles (`given`: A's and B's orders when not one output tile after another):
        each loads a batch of upcoming tiles when it runs dry."""
        out = {}
        for side, queue, op in (("a", Q_T, self.a), ("b", Q_U, self.b)):
            if side != self.dims.resident:
                blocks = (given or {}).get(side) or [self._block(side, *t, k0, kt) for t in tiles for k0, kt in k_steps]
                load = lambda b, q=queue, o=op: self._load_blocks(q, o, b)  # noqa: E731
                need = self.stage_need() if self.stage is not None else None
                fill = push = None
                if self._prefetch(side):     # the next batch's moves go ahead of this batch's blocks
                    fill = lambda b, q=queue, o=op: self._fill_blocks(q, o, b)  # noqa: E731
                    push = lambda b, q=queue: self._push_blocks(q, b)  # noqa: E731
                if isinstance(op, HaloOperand):      # it moves the next batch's halos ahead of their TIMG2COLs
                    op.stream, op.ahead = blocks, self._batch(side)
                if need is not None and need[0] == side:
                    staged = _StagedStream(self, queue, op, blocks, self.stage, need[2])
                    load = staged.load
                    fill = staged.fill if fill is not None else None
                out[side] = _Stream(blocks, self._batch(side), load, lambda q=queue: self.cursor.pushes[q], fill, push)
        row_stream = self.row_bias is not None and self.dims.resident == "b"     # m changes every output tile
        n_streams = (self.bias is not None) + (self.residual is not None) + row_stream
        n_batch = STREAM_BATCH // 2 if n_streams > 1 else STREAM_BATCH
        if row_stream:
            row_op = self._row_bias_operand()
            out["row_bias"] = _Stream([(m0, mt, 0, 2) for _, m0, mt, _, _ in tiles], n_batch,
                                      lambda b: self._load_cached(Q_N, row_op, b), lambda: self.cursor.pushes[Q_N])
        if self.bias is not None:
            out["bias"] = _Stream([(n0, nt) for _, _, _, n0, nt in tiles], n_batch, self._load_bias,
                                  lambda: self.cursor.pushes[Q_N])
        if self.residual is not None:
            out["res"] = _Stream([t[1:] for t in tiles], n_batch if self.ctx.chip.tile.buffer_chunk_bytes else 1,
                                 lambda b: self._load_blocks(Q_N, self.residual, b), lambda: self.cursor.pushes[Q_N])
        return out

    def _push(self, queue: int, nbytes: int) -> None:
        self._push_all(queue, [nbytes])

    def _push_all(self, queue: int, sizes: list[int]) -> None:
        """TPUSH the next len(sizes) slots of `queue`: one block per run of equal size codes."""
        i = 0
        while i < len(sizes):
            j = i + 1
            while j < len(sizes) and size_code(sizes[j]) == size_code(sizes[i]):
                j += 1
            self.ctx.em.tile(TPush(dst_queue=queue, dst_size=size_code(sizes[i]), dt=self.dt, count=j - i))
            for _ in range(j - i):
                self.cursor.push(queue)
            i = j

    def _load_blocks(self, queue: int, op: Operand, blocks) -> None:
        self._fill_blocks(queue, op, blocks)
        self._push_blocks(queue, blocks)

    def _load_cached(self, queue: int, op: "ConstOperand", blocks) -> None:
        """Load and push constant tiles that the StickyCache holds in LMEM (staged there once, by one DMA
        per run of lanes) by LMEM -> tile-buffer copies, one per run of neighbouring lanes on both sides;
        from DDR when there is no cache or it is full. A conv whose B panel stays resident streams its
        row-bias pairs this way: before, each batch came from DDR (ResNet-50 fp16: 155 DDR -> tile DMAs
        of 8 KiB, ~1 us each on the GDMA)."""
        cache = self.sticky_cache
        addrs = [cache.address(op, b) for b in blocks] if cache is not None else [None]
        if None in addrs:
            self._load_blocks(queue, op, blocks)
            return
        chip, prec = self.ctx.chip, self.ctx.prec
        slots = [self.cursor.next_slot_addr(queue, j) for j in range(len(blocks))]
        i = 0
        while i < len(blocks):
            j = i + 1
            while (j < len(blocks) and blocks[j][1::2] == blocks[i][1::2] and slots[j] == slots[j - 1] + chip.lmem_bytes_per_lane
                   and addrs[j] == addrs[j - 1] + chip.lmem_bytes_per_lane):
                j += 1
            rp, cp = op.padded(blocks[i][1], blocks[i][3])
            shape = (1, j - i, 1, rp * cp)
            dst, src = make_tile(chip, slots[i], shape, prec), make_tile(chip, addrs[i], shape, prec)
            tile_copy(self.ctx, DRegion(global_lmem_address(dst.addr, chip), shape, dst.strides, prec),
                      DRegion(global_lmem_address(src.addr, chip), shape, src.strides, prec))
            i = j
        self._push_blocks(queue, blocks)

    def _fill_blocks(self, queue: int, op: Operand, blocks) -> None:
        """Fill the next len(blocks) slots of `queue` (not pushed yet)."""
        op.load_slots([self.cursor.next_slot_addr(queue, j) for j in range(len(blocks))], blocks)

    def _push_blocks(self, queue: int, blocks) -> None:
        e = self.ctx.prec.bytes
        self._push_all(queue, [r * c * e for _, r, _, c in blocks])

    def _prefetch(self, side: str) -> bool:
        """Whether a streaming operand's next batch is filled while this one is read (its moves emitted
        before this batch's blocks, its TPUSH after them): with a tile-buffer DMA port the fills are TILE
        blocks, which would otherwise start only when the queue reaches them. Its queue (T for A, U for
        B) takes no other pushes meanwhile, and a batch is at most half the queue, so the filled slots are
        those of the batch before, already released."""
        if not self.ctx.chip.tile.move_port_bytes_per_cycle or self._aligned_passes():
            return False
        return 2 * self._batch(side) <= self.ctx.chip.tile.queue_slots

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
            self._row_bias_step(m0, mt, nt, gemv, acc_size, streams)
            first = False                    # (a column bias needs .BIAS on the first block: not both)
        if "res" in streams:                 # ACC = R . I (+ bias)
            r_index = streams["res"].take()
            bias_index = streams["bias"].take() if "bias" in streams else None
            fn = gemv + (".BIAS" if bias_index is not None else "" if first else ".ACC")
            bias_src = -1 if bias_index is None else ref(Q_N, bias_index)
            if self.residual.layout == "zn":     # ACC = I . R: R a B tile (K = mt rows, whole fractals)
                eye = self._identity(mt, "nz")
                em.tile(TMatmul(fn=fn, dt=self.dt, m=mt, n=nt, k=mt, src0=ref(*eye), src1=ref(Q_N, r_index), reuse0=1,
                                acc_size=acc_size, bias_src=bias_src))
            else:
                eye = self._identity(nt)
                em.tile(TMatmul(fn=fn, dt=self.dt, m=mt, n=nt, k=nt, src0=ref(Q_N, r_index), src1=ref(*eye), reuse1=1,
                                acc_size=acc_size, bias_src=bias_src))
            first = False
        for i, (k0, kt) in enumerate(k_steps):
            bias_index = streams["bias"].take() if first and "bias" in streams else None   # before A / B prefetch
            index = {side: self.panel_base + i if side == res else streams[side].take() for side in ("a", "b")}
            fn = gemv + (".BIAS" if bias_index is not None else "" if first else ".ACC")
            first = False
            em.tile(TMatmul(fn=fn, dt=self.dt, m=mt, n=nt, k=kt,
                            src0=ref(Q_T, index["a"]), src1=ref(Q_U, index["b"]),
                            reuse0=int(res == "a" and keep_panel), reuse1=int(res == "b" and keep_panel),
                            acc_size=acc_size, bias_src=-1 if bias_index is None else ref(Q_N, bias_index)))
        em.tile(AccCvt(layout=self.acc_layout, row=mt, col=nt, dst_queue=Q_M, dst_size=size_code(mt * nt * self.out_prec.bytes),
                       dst_dt=TILE_DT[self.out_prec], relu=int(self.relu)))
        self.cursor.push(Q_M)

    def _sticky(self, name: str, op: "ConstOperand", block: tuple[int, int, int, int]) -> tuple[int, int]:
        """(queue, push index) of a constant tile read by many blocks with .reuse: pushed onto M
        (whose only other pushes are the results, one per output tile, so A's or B's resident
        panel keeps its whole queue), again when its block changes or its slot would be reused."""
        queue, held = Q_M, self.sticky.get(name)
        if held is None or held[1] != (op.key, block) or self.cursor.pushes[queue] - held[0] >= self.ctx.chip.tile.queue_slots:
            staged = self.sticky_cache.address(op, block) if self.sticky_cache is not None else None
            if staged is None:
                op.load(self.cursor.next_slot_addr(queue), *block)
            else:                      # LMEM -> tile buffer: no DDR latency per reload
                elems = op.padded(block[1], block[3])[0] * op.padded(block[1], block[3])[1]
                tile_copy(
                    self.ctx,
                    DRegion(global_lmem_address(self.cursor.next_slot_addr(queue), self.ctx.chip), (1, 1, 1, elems),
                            (elems, elems, elems, 1), self.ctx.prec),
                    DRegion(global_lmem_address(staged, self.ctx.chip), (1, 1, 1, elems), (elems, elems, elems, 1),
                            self.ctx.prec))
            rp, cp = op.padded(block[1], block[3])
            self._push(queue, rp * cp * self.ctx.prec.bytes)
            self.sticky[name] = held = (self.cursor.pushes[queue] - 1, (op.key, block))
        return queue, held[0]

    def _identity(self, size: int, layout: str = "zn") -> tuple[int, int]:
        """The size x size identity: the B tile (Zn) of the R . I step, or the A tile (Nz) of I . R."""
        key = f"tile:identity:{size}" if layout == "zn" else f"tile:identity:{layout}:{size}"
        eye = IdentityOperand(self.ctx, layout, size, key)
        return self._sticky("identity", eye, (0, size, 0, size))

    def _row_bias_operand(self) -> ConstOperand:
        """[bias_hi | bias_lo] (M x 2): the row bias as two terms in the model's dtype."""
        hi = _round_to(self.row_bias, self.ctx.prec)
        pair = np.stack([hi, _round_to(self.row_bias - hi, self.ctx.prec)], axis=1)
        return ConstOperand(self.ctx, "nz", pair, f"{self.bias_key}:rowbias2", 0, 0)

    def _row_bias_step(self, m0: int, mt: int, nt: int, gemv: str, acc_size: int, streams: dict, acc: int = 0) -> None:
        """ACC = [bias_hi | bias_lo] (mt x 2) . ones (2 x nt): a per-row bias as two terms in the
        model's dtype whose fp32 sum is the fp32 bias to ~2 x the dtype's precision (exact for
        fp32), so only rounding-exact ops (Relu) are left for the TIU. The bias tile is sticky (read
        with .reuse by a row of output tiles) or, when every output tile has another row, streamed
        on N in batches (one DMA each)."""
        ones = ConstOperand(self.ctx, "zn", np.ones((2, nt), np.float32), f"tile:ones2:{nt}", 0, 0)
        ref = (lambda queue, index: tile_ref(QUEUE_NAMES[queue], self.cursor.pushes[queue] - index))  # noqa: E731
        if "row_bias" in streams:
            a, reuse0 = (Q_N, streams["row_bias"].take()), 0
        else:
            a, reuse0 = self._sticky("row_bias", self._row_bias_operand(), (m0, mt, 0, 2)), 1
        b = self._sticky("ones", ones, (0, 2, 0, nt))
        self.ctx.em.tile(TMatmul(fn=gemv, dt=self.dt, m=mt, n=nt, k=2, src0=ref(*a), src1=ref(*b), reuse0=reuse0, reuse1=1,
                                 acc_size=acc_size, acc=acc))

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
        self._push_all(Q_N, [ceil_to(nt, 16) * 4 for _, nt in blocks])


class StickyCache:
    """Sticky constant tiles (identity, ones, row-bias pairs) staged once in LMEM, one tile per lane at
    `offset` (`rows` tiles deep), so reloading one into an M slot is an LMEM -> tile-buffer copy."""

    def __init__(self, ctx: LowerCtx, offset: int, rows: int):
        self.ctx, self.offset, self.rows = ctx, offset, rows
        self.held: dict[tuple, int] = {}

    def address(self, op: ConstOperand, block: tuple) -> int | None:
        """Flat LMEM address of `op`'s tile `block` (staged now if new), None when the cache is full."""
        key = (op.key, op.layout, block)
        if key not in self.held:
            chip = self.ctx.chip
            index = len(self.held)
            if index >= self.rows * chip.lanes:
                return None
            row, lane = divmod(index, chip.lanes)
            self.held[key] = lane * chip.lmem_bytes_per_lane + self.offset + row * chip.tile.slot_bytes
            op.load(self.held[key], *block)
        return self.held[key]

    def preload(self, op: ConstOperand, blocks: list) -> None:
        """Stage the new ones of `blocks` now (as many as the cache holds): tiles in neighbouring lanes
        come in one DMA per run (ConstOperand.load_slots), not one each when first needed (a conv's row
        bias pairs: ResNet-50 staged 206 of 2 KiB one by one)."""
        chip = self.ctx.chip
        fresh = [b for b in dict.fromkeys(blocks) if (op.key, op.layout, b) not in self.held]
        fresh = fresh[:max(0, self.rows * chip.lanes - len(self.held))]
        addrs = []
        for block in fresh:
            row, lane = divmod(len(self.held), chip.lanes)
            addrs.append(lane * chip.lmem_bytes_per_lane + self.offset + row * chip.tile.slot_bytes)
            self.held[(op.key, op.layout, block)] = addrs[-1]
        if fresh:
            op.load_slots(addrs, fresh)


def stage_rows(chip, count: int, stride: int, base: int = 0, tail: bool = True) -> list[int]:
    """Stream positions where the staging rows of a stream of `count` tiles of `stride` bytes start,
    and `count` (one lane per tile of a row; a row is one DMA, or a few consecutive full rows).
    Without a tile-buffer DMA port rows are the queue's slots from slot `base` (a TIU copy keeps each
    tile in the lane of its slot). With the port (its moves change lanes) the last STAGE_TAIL_TILES tiles
    are a row of their own (the blocks after the last DMA are few) and the rest is cut into equal rows
    of at most STAGE_DMA_BYTES and `lanes` tiles (few, large DMAs). `tail` False (the product is not
    the model's last one with weights: the next product's weight DMA overlaps its last blocks) drops
    the tail row unless the stream fills a whole row of lanes (a DMA long enough to show; measured on
    the transformer blocks)."""
    if not chip.tile.move_port_bytes_per_cycle:
        slots = chip.tile.queue_slots
        return [0] + list(range(slots - base, count, slots)) + [count]
    tail = (min(count, STAGE_TAIL_TILES) if count > 2 * STAGE_TAIL_TILES else count) if tail or count >= chip.lanes else 0
    head = count - tail
    rows = -(-head * stride // STAGE_DMA_BYTES) if head else 0
    rows = max(rows, -(-head // chip.lanes))
    cuts = [head * i // rows for i in range(rows)] if rows else []
    return cuts + ([head] if tail else []) + [count]


class _StagedStream:
    """A constant operand streamed through LMEM: its tiles (each padded to `stride` bytes) arrive a
    staging row at a time (stage_rows: one DMA per row, issued a row ahead); then one move per batch
    (two where the batch crosses a staging row) puts them into their slots: a TMOVE on the tile
    buffer's DMA port (any lane to any lane), or without the port a TIU copy (lane to same lane: each
    tile staged in the lane of the slot it will be pushed to). Fewer, larger DMAs than filling slots
    from DDR in half-queue batches."""

    def __init__(self, gemm: TileGemm, queue: int, op: ConstOperand, blocks: list, offset: int, stride: int):
        self.gemm, self.queue, self.op, self.blocks = gemm, queue, op, blocks
        self.tiles = list(dict.fromkeys(blocks))       # distinct tiles, staged once each, in first-read order
        index = {block: i for i, block in enumerate(self.tiles)}
        self.order = [index[b] for b in blocks]         # staged tile of every stream position
        self.offset, self.stride = offset, stride
        self.port = bool(gemm.ctx.chip.tile.move_port_bytes_per_cycle)
        self.base: int | None = None       # slot of the stream's first tile
        self.bounds: list[int] = []        # stage_rows (set with base)
        self.position = 0
        self.staged: set[int] = set()

    def _address(self, position: int, row: int) -> int:
        """Flat LMEM address where stream position `position` (in staging row `row`) is staged. With a
        tile-buffer DMA port: lane position % lanes, position // lanes tiles deep (a run of tiles is one
        LMEM tensor whose channels wrap the lanes, so staging rows and DMAs need no lane alignment and
        a DMA and the moves reading the rows before it touch different lanes). Without: the lane of the
        tile's queue slot, row `row` deep."""
        chip = self.gemm.ctx.chip
        if self.port:
            level, lane = divmod(position, chip.lanes)
            return lane * chip.lmem_bytes_per_lane + self.offset + level * self.stride
        slot = (self.base + position) % chip.tile.queue_slots
        lane_start = chip.tile_slot_address(self.queue, slot) // chip.lmem_bytes_per_lane * chip.lmem_bytes_per_lane
        return lane_start + self.offset + row * self.stride

    def load(self, chunk: list) -> None:
        self.fill(chunk)
        self.gemm._push_blocks(self.queue, chunk)

    def _row_of(self, position: int) -> int:
        return bisect_right(self.bounds, position) - 1

    def fill(self, chunk: list) -> None:
        """The moves of `chunk` into its slots (staging its rows first), not pushed."""
        ctx, slots = self.gemm.ctx, self.gemm.ctx.chip.tile.queue_slots
        if self.base is None:
            self.base = self.gemm.cursor.pushes[self.queue] % slots
            self.bounds = stage_rows(ctx.chip, len(self.tiles), self.stride, self.base, self.gemm.stage_tail)
        first = (self.base + self.position) % slots
        if first + len(chunk) > slots:
            raise AssertionError("a staged batch wraps the queue")      # _Stream aligns batches
        tiles = self.order[self.position:self.position + len(chunk)]
        for r in sorted({self._row_of(t) for t in tiles} | {self._row_of(max(tiles)) + 1}):
            self._stage(r)
        elems = self.stride // ctx.prec.bytes
        done = 0
        while done < len(chunk):        # runs of consecutive staged tiles (inside one staging row without the port)
            position = tiles[done]
            srow = self._row_of(position)
            count = 1
            while done + count < len(chunk) and tiles[done + count] == position + count and (
                    self.port or position + count < self.bounds[srow + 1]):
                count += 1
            shape = (1, count, 1, elems)
            dst = make_tile(ctx.chip, ctx.chip.tile_slot_address(self.queue, first + done), shape, ctx.prec)
            src = make_tile(ctx.chip, self._address(position, srow), shape, ctx.prec)
            if self.port:               # the tile buffer's DMA port (any lane to any lane)
                tile_copy(ctx, DRegion(global_lmem_address(dst.addr, ctx.chip), shape, dst.strides, ctx.prec),
                          DRegion(global_lmem_address(src.addr, ctx.chip), shape, src.strides, ctx.prec))
            else:                       # a TIU copy: lane to same lane
                ctx.em.ar("copy", dst, src)
            done += count
        self.position += len(chunk)

    def _span(self, row: int) -> tuple[int, int]:
        """Staged tiles [lo, hi) of staging row `row`."""
        if row >= len(self.bounds) - 1:
            return len(self.tiles), len(self.tiles)
        return self.bounds[row], self.bounds[row + 1]

    def _stage(self, row: int) -> None:
        """One DMA: the stream's tiles of staging row `row` into their lanes, with the next rows too
        (up to STAGE_ROWS without the port) while they are full rows not staged yet."""
        lo, hi = self._span(row)
        if row in self.staged or lo >= hi:
            return
        slots = self.gemm.ctx.chip.tile.queue_slots
        rows = [row]
        while (not self.port and hi - lo == slots and len(rows) < STAGE_ROWS and rows[-1] + 1 not in self.staged
               and self._span(rows[-1] + 1)[1] - self._span(rows[-1] + 1)[0] == slots):
            rows.append(rows[-1] + 1)
        self.staged.update(rows)
        hi = self._span(rows[-1])[1]
        ctx, op, elems = self.gemm.ctx, self.op, self.stride // self.gemm.ctx.prec.bytes
        key = (f"{op.key}:{op.layout}:stage:{self.stride}:" + ";".join(f"{b}" for b in self.tiles[lo:hi]),)
        addr = ctx.weights.lookup(key, ctx.prec)
        if addr is None:
            image = np.zeros((hi - lo, elems), np.float32)
            layout = nz_layout if op.layout == "nz" else zn_layout
            for i, (r0, r, c0, c) in enumerate(self.tiles[lo:hi]):
                flat = layout(op.matrix[r0:r0 + r, c0:c0 + c], *op.padded(r, c), op.k0)
                image[i, :flat.size] = flat
            addr = ctx.weights.add(key, image.reshape(-1), ctx.prec)
        count = (hi - lo) // len(rows)
        dst = make_tile(ctx.chip, self._address(lo, row), (len(rows), count, 1, elems), ctx.prec)
        assert len(rows) == 1 or dst.strides[0] == elems, "staging rows are `stride` bytes apart"
        ctx.em.load(dst, DRegion(addr, dst.shape, (count * elems, elems, elems, 1), ctx.prec))


class _Stream:
    """The tiles of one streaming operand in the order TMATMULs read them: `take` gives the next
    tile's queue push index (its queue may carry other pushes too), loading (and pushing) the next
    batch first when none is left. Batches end on multiples of `batch` pushes of their queue
    (`queue_pushes()`), so with a batch dividing the queue depth a batch never wraps from the last
    slot (lane) to the first: one DMA each."""

    def __init__(self, blocks: list, batch: int, load: Callable[[list], None], queue_pushes: Callable[[], int],
                 fill: Callable[[list], None] | None = None, push: Callable[[list], None] | None = None):
        self.blocks, self.batch, self.load, self.queue_pushes = blocks, batch, load, queue_pushes
        self.fill, self.push = fill, push      # prefetch: fill the next batch when this one is pushed
        self.index: list[int] = []         # queue push index of every loaded tile
        self.used = 0
        self.next = 0                      # blocks handed out to loads or fills so far
        self.filled: list | None = None    # the batch filled ahead, not pushed yet

    def _chunk(self, pushes: int) -> list:
        size = self.batch - pushes % self.batch
        chunk = self.blocks[self.next:self.next + size]
        self.next += len(chunk)
        return chunk

    def take(self) -> int:
        """Queue push index of the next tile."""
        if self.used == len(self.index):
            base = self.queue_pushes()
            if self.fill is None:
                chunk = self._chunk(base)
                self.load(chunk)
            else:
                chunk, self.filled = self.filled, None
                if chunk is None:
                    chunk = self._chunk(base)
                    self.fill(chunk)
                self.push(chunk)
                if self.next < len(self.blocks):
                    self.filled = self._chunk(base + len(chunk))
                    self.fill(self.filled)
            self.index += range(base, base + len(chunk))
        self.used += 1
        return self.index[self.used - 1]


def _round_to(values: np.ndarray, prec: Prec) -> np.ndarray:
    """fp32 values rounded to `prec` (as stored in DDR) and back."""
    stored = to_storage(np.asarray(values, np.float32), prec)
    if prec == Prec.BF16:
        return (stored.astype(np.uint32) << 16).view(np.float32)
    return stored.astype(np.float32)
