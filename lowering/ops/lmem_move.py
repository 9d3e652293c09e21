"""Data movement through LMEM for the cases a DDR -> DDR DMA would do element by element: transposes
that move the innermost axis (load rows, TIU C<->W transpose, store rows) and concats whose pieces
are short runs (load each input's rows, TIU strided copy into the interleaved row, store the rows).
Both keep every DMA segment a long run, so they run near DRAM bandwidth. Every path has a planner
(plan_*: block sizes and buffer offsets from a planning arena, frozen in an LmemTiling; None when
one block does not fit) and an emitter that emits a tiling and decides nothing."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tpuflow.isa import CwBcTiu, Prec, StrideMode
from tpuflow.lowering.context import LowerCtx
from tpuflow.lowering.lmem import GroupArena
from tpuflow.lowering.tensors import DRegion, LTile, make_tile, tile_bytes_per_lane
from tpuflow.lowering.tiling import largest_fitting, pipelined, steps

BLOCK_OPTIONS = (1024, 512, 256, 128, 64, 32, 16)   # transpose block edges tried, largest first
SHORT_RUN_BYTES = 128                               # DMA runs shorter than this go through LMEM
MAX_DMA = 65535


@dataclass(frozen=True)
class LmemTiling:
    """What a movement path through LMEM planned: each buffer set's per-lane offsets (two sets
    when they fit twice, so loads run ahead of compute)."""

    sets: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class TransposeTiling(LmemTiling):
    """Rows, columns and batch items of one transposed block."""

    rows: int
    cols: int
    batch: int


@dataclass(frozen=True)
class RowTiling(LmemTiling):
    """q consecutive rows per lane in a block (row interleaves, strided rows, interpolation along
    the last axis), or output rows per chunk (interpolation along the axis before it)."""

    q: int


@dataclass(frozen=True)
class PlaneTiling(LmemTiling):
    """Planes (one per lane) and rows of each in one block (upsampling, padding)."""

    planes: int
    rows: int


def fits(arena: GroupArena, shapes: list[tuple[int, int, int, int]], prec: Prec) -> bool:
    """Whether one set of tiles of these shapes fits the (empty) planning arena (the LMEM paths'
    smallest blocks; callers fall back to plain DMAs otherwise)."""
    return arena.fits([tile_bytes_per_lane(arena.chip, s, prec) for s in shapes])


def allocate(arena: GroupArena, per_set: list[int], names: list[str], max_copies: int = 2
             ) -> tuple[tuple[int, ...], ...] | None:
    """Up to `max_copies` sets of buffers of `per_set` bytes per lane allocated from `arena`
    (named `names`), or None when one set does not fit."""
    if not arena.fits(per_set):
        return None
    _, sets = arena.alloc_plan([], per_set, names[0], max_copies, names=([], names))
    return tuple(tuple(s) for s in sets)


def cw_transpose(ctx: LowerCtx, dst: LTile, src: LTile) -> None:
    """dst (1, W, 1, C) = src (1, C, 1, W) with C and W swapped (tsbc.cw_ts)."""
    f = dst.fields("res0", with_shape=True)
    f.update(src.fields("opd0"))
    f.pop("opt_opd0_prec", None)
    ctx.em.tiu(CwBcTiu(op="cw_ts", opd0_c=src.c, opd0_w=src.w, **f))


def plan_transpose(arena: GroupArena, rows: int, cols: int, count: int, prec: Prec) -> TransposeTiling | None:
    """Blocks of transpose_2d: the largest rows x cols block (of the block edges) whose buffers
    fit twice, then as many whole planes per block as fit (when a block is a whole plane)."""
    chip = arena.chip
    sizes = lambda rt, ct, kt=1: [tile_bytes_per_lane(chip, (1, rt, kt, ct), prec),  # noqa: E731
                                  tile_bytes_per_lane(chip, (1, ct, kt, rt), prec)]
    rt = largest_fitting([min(rows, b) for b in BLOCK_OPTIONS], lambda r: arena.fits(sizes(r, min(cols, r)) * 2))
    rt = rt or min(rows, chip.lanes)
    ct = largest_fitting([min(cols, b) for b in BLOCK_OPTIONS], lambda c: arena.fits(sizes(rt, c) * 2)) or min(cols, chip.lanes)
    kt = 1
    if rt == rows and ct == cols and count > 1:          # whole planes: several per block
        kt = largest_fitting(list(range(1, min(count, MAX_DMA) + 1)), lambda k: arena.fits(sizes(rt, ct, k) * 2)) or 1
    sets = allocate(arena, sizes(rt, ct, kt), ["rows", "transposed"])
    return None if sets is None else TransposeTiling(sets, rt, ct, kt)


def transpose_2d(ctx: LowerCtx, tiling: TransposeTiling, src: int, src_row: int, dst: int, dst_row: int,
                 rows: int, cols: int, prec: Prec, batch: tuple[int, int, int] = (1, 0, 0)) -> None:
    """dst[k, c, r] = src[k, r, c] for r < rows, c < cols, k < batch count; element (k, r, c) of src
    at src + k*src_batch + r*src_row + c, element (k, c, r) of dst at dst + k*dst_batch +
    c*dst_row + r (element strides; batch = (count, src_batch, dst_batch)). Blocks of the
    tiling's rows x cols (x batch items along H) go DDR -> LMEM (rows on lanes), through one CW
    transpose and back, double-buffered."""
    chip = ctx.chip
    count, src_batch, dst_batch = batch
    sets = tiling.sets
    blocks = [(k0, k, r0, r, c0, c) for k0, k in steps(count, tiling.batch) for r0, r in steps(rows, tiling.rows)
              for c0, c in steps(cols, tiling.cols)]
    b = prec.bytes

    def load(block, s):
        k0, k, r0, r, c0, c = block
        ctx.em.load(make_tile(chip, sets[s][0], (1, r, k, c), prec),
                    DRegion(src + (k0 * src_batch + r0 * src_row + c0) * b, (1, r, k, c),
                            (r * src_row, src_row, src_batch, 1), prec))

    def transpose_store(block, s):
        k0, k, r0, r, c0, c = block
        out = make_tile(chip, sets[s][1], (1, c, k, r), prec)
        cw_transpose(ctx, out, make_tile(chip, sets[s][0], (1, r, k, c), prec))
        ctx.em.store(out, DRegion(dst + (k0 * dst_batch + c0 * dst_row + r0) * b, (1, c, k, r),
                                  (c * dst_row, dst_row, dst_batch, 1), prec))

    pipelined(blocks, len(sets), load, transpose_store)


def as_batched_transpose(dims: list[list[int]]) -> tuple[list[list[int]], tuple[int, int, int, int]] | None:
    """A merged copy (see movement.merge_dims: [size, src stride, dst stride] in dst order) that is
    a batch of 2-D transposes moving the innermost axis: (outer dims, (rows, src_row, cols,
    dst_row)), or None. The last dim is dst-contiguous with a src stride; the one before is
    src-contiguous."""
    if len(dims) < 2:
        return None
    (cols, a1, b1), (rows, a2, b2) = dims[-2], dims[-1]
    if b2 != 1 or a1 != 1 or a2 == 1 or a2 < cols or b1 < rows:
        return None
    return dims[:-2], (rows, a2, cols, b1)


def plan_batched_transpose(arena: GroupArena, outer: list[list[int]], geometry: tuple[int, int, int, int],
                           prec: Prec) -> TransposeTiling | None:
    """The tiling of emit_batched_transpose (the innermost outer dim is its batch)."""
    rows, _, cols, _ = geometry
    return plan_transpose(arena, rows, cols, outer[-1][0] if outer else 1, prec)


def emit_batched_transpose(ctx: LowerCtx, tiling: TransposeTiling, src: int, dst: int, outer: list[list[int]],
                           geometry: tuple[int, int, int, int], prec: Prec) -> None:
    rows, src_row, cols, dst_row = geometry
    batch = (1, 0, 0)
    if outer:                                  # the innermost outer dim rides along H in LMEM
        (count, sb, db), outer = outer[-1], outer[:-1]
        batch = (count, sb, db)
    for s_off, d_off in _outer_offsets(outer):
        transpose_2d(ctx, tiling, src + s_off * prec.bytes, src_row, dst + d_off * prec.bytes, dst_row,
                     rows, cols, prec, batch)


def plan_row_blocks(arena: GroupArena, rows: int, per_set, q_limit: int, names: list[str]) -> RowTiling | None:
    """Buffer sets of per_set(q) bytes (double-buffered when that fits) for blocks of q rows per
    lane, q as large as LMEM and `q_limit` allow; None when one set of one row does not fit."""
    q_max = max(1, min(-(-rows // arena.chip.lanes), q_limit))
    options = sorted({max(1, q_max >> k) for k in range(16)}, reverse=True)
    q = largest_fitting(options, lambda v: arena.fits(per_set(v) * 2)) or 1
    sets = allocate(arena, per_set(q), names)
    return None if sets is None else RowTiling(sets, q)


def row_blocks(ctx: LowerCtx, rows: int, q: int) -> list[tuple[int, int, int]]:
    """The blocks of rows a row tiling processes: (first row, lanes, q rows per lane)."""
    blocks = []
    for r0, r in steps(rows, ctx.chip.lanes * q):
        full, rem = divmod(r, q)
        if full:
            blocks.append((r0, full, q))
        if rem:
            blocks.append((r0 + full * q, 1, rem))
    return blocks


def plan_interleave(arena: GroupArena, rows: int, widths: list[int], prec: Prec) -> RowTiling | None:
    """The tiling of interleave_rows (one buffer per input width and one for the output rows)."""
    total = sum(widths)
    per_set = lambda q: [tile_bytes_per_lane(arena.chip, (1, 1, 1, q * w), prec) for w in widths + [total]]  # noqa: E731
    return plan_row_blocks(arena, rows, per_set, MAX_DMA // total, [f"piece{k}" for k in range(len(widths))] + ["rows"])


def plan_deinterleave(arena: GroupArena, rows: int, widths: list[int], prec: Prec) -> RowTiling | None:
    """The tiling of deinterleave_rows (one buffer for the input rows and one per output width)."""
    total = sum(widths)
    per_set = lambda q: [tile_bytes_per_lane(arena.chip, (1, 1, 1, q * w), prec) for w in [total] + widths]  # noqa: E731
    return plan_row_blocks(arena, rows, per_set, MAX_DMA // total, ["rows"] + [f"piece{k}" for k in range(len(widths))])


def interleave_rows(ctx: LowerCtx, tiling: RowTiling, srcs: list[tuple[int, int]], dst: int, rows: int,
                    prec: Prec) -> None:
    """Concat of row-major (rows, width_k) matrices along their columns into dst (rows, sum width):
    blocks of rows spread over lanes (q consecutive rows per lane, so every DMA run is a lane's q
    rows), each input loaded contiguously, TIU-copied into its columns of the output block, and the
    block stored in one run per lane. `srcs` are (address, width) in column order."""
    chip, em = ctx.chip, ctx.em
    total = sum(w for _, w in srcs)
    sets, blocks = tiling.sets, row_blocks(ctx, rows, tiling.q)
    b = prec.bytes

    def load(block, s):
        r0, lanes, qq = block
        for (addr, w), off in zip(srcs, sets[s]):
            em.load(make_tile(chip, off, (1, lanes, 1, qq * w), prec),
                    DRegion(addr + r0 * w * b, (1, lanes, 1, qq * w), (lanes * qq * w, qq * w, qq * w, 1), prec))

    def copy_store(block, s):
        r0, lanes, qq = block
        out = make_tile(chip, sets[s][-1], (1, lanes, 1, qq * total), prec)
        col = 0
        for (addr, w), off in zip(srcs, sets[s]):
            piece = make_tile(chip, off, (1, lanes, 1, qq * w), prec)
            src_view = LTile(piece.addr, (1, lanes, qq, w), prec, (0, piece.strides[1], w, 1), StrideMode.FREE)
            dst_view = LTile(out.addr + col * b, (1, lanes, qq, w), prec, (0, out.strides[1], total, 1), StrideMode.FREE)
            em.ar("copy", dst_view, src_view)
            col += w
        em.store(out, DRegion(dst + r0 * total * b, out.shape, (lanes * qq * total, qq * total, qq * total, 1), prec))

    pipelined(blocks, len(sets), load, copy_store)


def _load_plane_rows(ctx: LowerCtx, offset: int, src: int, block, h: int, w: int, prec: Prec) -> None:
    """Rows [y0, y0+y) of planes [p0, p0+p) of (planes, h, w) at `src`, one plane per lane."""
    p0, p, y0, y = block
    ctx.em.load(make_tile(ctx.chip, offset, (1, p, y, w), prec),
                DRegion(src + (p0 * h * w + y0 * w) * prec.bytes, (1, p, y, w), (p * h * w, h * w, w, 1), prec))


def plan_upsample(arena: GroupArena, rows: int, h: int, w: int, rh: int, rw: int, prec: Prec) -> PlaneTiling | None:
    """The tiling of upsample_nearest: up to 8 lanes' worth of whole planes per block when they fit
    twice, else a lane's worth of planes and as many of their rows as fit."""
    chip = arena.chip
    sizes = lambda rt, ht: [tile_bytes_per_lane(chip, (1, rt, ht, w), prec),  # noqa: E731
                            tile_bytes_per_lane(chip, (1, rt, ht * rh, w * rw), prec)]
    row_options = [min(rows, chip.lanes * k) for k in (8, 4, 2, 1)]
    rt = largest_fitting(row_options, lambda r: arena.fits(sizes(r, h) * 2))
    if rt is None:
        rt = min(rows, chip.lanes)
        ht = largest_fitting(list(range(1, h + 1)), lambda t: arena.fits(sizes(rt, t) * 2)) or 1
    else:
        ht = h
    sets = allocate(arena, sizes(rt, ht), ["rows", "repeated"])
    return None if sets is None else PlaneTiling(sets, rt, ht)


def upsample_nearest(ctx: LowerCtx, tiling: PlaneTiling, src: int, dst: int, rows: int, h: int, w: int, rh: int,
                     rw: int, prec: Prec) -> None:
    """dst[r, y, x] = src[r, y // rh, x // rw] for `rows` planes of h x w: blocks of planes on lanes
    (and of their rows), loaded in one run per plane, replicated by rh TIU copies whose source
    strides repeat each element rw times, stored in one run per plane."""
    chip, em, b = ctx.chip, ctx.em, prec.bytes
    ho, wo = h * rh, w * rw
    sets = tiling.sets
    blocks = [(r0, r, h0, hh) for r0, r in steps(rows, tiling.planes) for h0, hh in steps(h, tiling.rows)]

    def load(block, s):
        _load_plane_rows(ctx, sets[s][0], src, block, h, w, prec)

    def replicate_store(block, s):
        r0, r, h0, hh = block
        inp = make_tile(chip, sets[s][0], (1, r, hh, w), prec)
        out = make_tile(chip, sets[s][1], (1, r, hh * rh, wo), prec)
        src_view = LTile(inp.addr, (hh, r, w, rw), prec, (w, inp.strides[1], 1, 0), StrideMode.FREE)
        for dy in range(rh):
            dst_view = LTile(out.addr + dy * wo * b, (hh, r, w, rw), prec, (rh * wo, out.strides[1], rw, 1),
                             StrideMode.FREE)
            em.ar("copy", dst_view, src_view)
        em.store(out, DRegion(dst + (r0 * ho * wo + h0 * rh * wo) * b, (1, r, hh * rh, wo),
                              (r * ho * wo, ho * wo, wo, 1), prec))

    pipelined(blocks, len(sets), load, replicate_store)


def as_strided_rows(dims: list[list[int]], prec: Prec) -> tuple[list[list[int]], tuple[int, int, int, int, int]] | None:
    """A merged copy (movement.merge_dims form) whose innermost dim reads every step-th element
    (step > 1, an element-granular DMA): (outer dims, (rows, src_row, step, width, dst_row)) with
    the innermost dim (width, step, 1) and the one before it the rows, or None."""
    width, step, dstep = dims[-1]
    if dstep != 1 or step <= 1:
        return None
    rows, src_row, dst_row = dims[-2] if len(dims) >= 2 else (1, (width - 1) * step + 1, width)
    if rows == 1 or src_row < (width - 1) * step + 1 or dst_row < width:
        return None
    return dims[:-2], (rows, src_row, step, width, dst_row)


def deinterleave_rows(ctx: LowerCtx, tiling: RowTiling, src: int, dsts: list[tuple[int, int]], rows: int,
                      prec: Prec) -> None:
    """Split of a row-major (rows, sum width) matrix along its columns into (rows, width_k) matrices
    at `dsts` ((address, width) in column order): the inverse of interleave_rows (blocks of q rows
    per lane loaded in one run, each piece's columns TIU-copied out, stored in one run per lane)."""
    chip, em = ctx.chip, ctx.em
    total = sum(w for _, w in dsts)
    sets, blocks = tiling.sets, row_blocks(ctx, rows, tiling.q)
    b = prec.bytes

    def load(block, s):
        r0, lanes, qq = block
        em.load(make_tile(chip, sets[s][0], (1, lanes, 1, qq * total), prec),
                DRegion(src + r0 * total * b, (1, lanes, 1, qq * total), (lanes * qq * total, qq * total, qq * total, 1), prec))

    def copy_store(block, s):
        r0, lanes, qq = block
        whole = make_tile(chip, sets[s][0], (1, lanes, 1, qq * total), prec)
        col = 0
        for (addr, w), off in zip(dsts, sets[s][1:]):
            piece = make_tile(chip, off, (1, lanes, 1, qq * w), prec)
            src_view = LTile(whole.addr + col * b, (1, lanes, qq, w), prec, (0, whole.strides[1], total, 1), StrideMode.FREE)
            dst_view = LTile(piece.addr, (1, lanes, qq, w), prec, (0, piece.strides[1], w, 1), StrideMode.FREE)
            em.ar("copy", dst_view, src_view)
            em.store(piece, DRegion(addr + r0 * w * b, piece.shape, (lanes * qq * w, qq * w, qq * w, 1), prec))
            col += w

    pipelined(blocks, len(sets), load, copy_store)


def strided_min_tiles(geometry: tuple[int, int, int, int, int]) -> list[tuple[int, int, int, int]]:
    """The smallest tile set of strided_rows (one row per lane)."""
    rows, src_row, step, width, dst_row = geometry
    return [(1, 1, 1, (width - 1) * step + 1), (1, 1, 1, width)]


def plan_strided_rows(arena: GroupArena, geometry: tuple[int, int, int, int, int], prec: Prec) -> RowTiling | None:
    """The tiling of strided_rows: q rows' spans and their compact rows per lane."""
    rows, src_row, step, width, dst_row = geometry
    span = (width - 1) * step + 1
    per_set = lambda q: [tile_bytes_per_lane(arena.chip, (1, 1, q, span), prec),  # noqa: E731
                         tile_bytes_per_lane(arena.chip, (1, 1, 1, q * width), prec)]
    return plan_row_blocks(arena, rows, per_set, MAX_DMA // max(span, width), ["spans", "picked"])


def emit_strided_rows(ctx: LowerCtx, tiling: RowTiling, src: int, dst: int, outer: list[list[int]],
                      geometry: tuple[int, int, int, int, int], prec: Prec) -> None:
    for s_off, d_off in _outer_offsets(outer):
        strided_rows(ctx, tiling, src + s_off * prec.bytes, dst + d_off * prec.bytes, geometry, prec)


def _outer_offsets(outer: list[list[int]]):
    """(src, dst) element offsets of every index of the outer dims ([size, src stride, dst stride])."""
    for index in range(math.prod(d[0] for d in outer)):
        s_off = d_off = 0
        rest = index
        for size, a, b in reversed(outer):
            rest, i = divmod(rest, size)
            s_off, d_off = s_off + i * a, d_off + i * b
        yield s_off, d_off


def strided_rows(ctx: LowerCtx, tiling: RowTiling, src: int, dst: int, geometry: tuple[int, int, int, int, int],
                 prec: Prec) -> None:
    """dst[r*dst_row + j] = src[r*src_row + j*step] for r < rows, j < width: each row's span
    ((width-1)*step + 1 elements) loaded in one run (q consecutive rows per lane), the columns picked
    by a TIU copy with source stride `step`, the compact rows stored in one run per lane."""
    rows, src_row, step, width, dst_row = geometry
    chip, em, b = ctx.chip, ctx.em, prec.bytes
    span = (width - 1) * step + 1
    sets, blocks = tiling.sets, row_blocks(ctx, rows, tiling.q)

    def load(block, s):
        r0, lanes, qq = block
        em.load(make_tile(chip, sets[s][0], (1, lanes, qq, span), prec),
                DRegion(src + r0 * src_row * b, (1, lanes, qq, span), (lanes * qq * src_row, qq * src_row, src_row, 1), prec))

    def pick_store(block, s):
        r0, lanes, qq = block
        rows_in = make_tile(chip, sets[s][0], (1, lanes, qq, span), prec)
        out = make_tile(chip, sets[s][1], (1, lanes, 1, qq * width), prec)
        picked = LTile(rows_in.addr, (1, lanes, qq, width), prec, (0, rows_in.strides[1], span, step), StrideMode.FREE)
        packed = LTile(out.addr, (1, lanes, qq, width), prec, (0, out.strides[1], width, 1), StrideMode.FREE)
        em.ar("copy", packed, picked)
        em.store(packed, DRegion(dst + r0 * dst_row * b, (1, lanes, qq, width),
                                 (lanes * qq * dst_row, qq * dst_row, dst_row, 1), prec))

    pipelined(blocks, len(sets), load, pick_store)


def plan_pad(arena: GroupArena, planes: int, h: int, w: int, wo: int, prec: Prec) -> PlaneTiling | None:
    """The tiling of pad_last_axis: a lane's worth of planes and as many of their rows as fit twice."""
    chip = arena.chip
    sizes = lambda pt, ht: [tile_bytes_per_lane(chip, (1, pt, ht, w), prec),  # noqa: E731
                            tile_bytes_per_lane(chip, (1, pt, ht, wo), prec)]
    pt = min(planes, chip.lanes)
    ht = largest_fitting(list(range(1, h + 1)), lambda t: arena.fits(sizes(pt, t) * 2)) or 1
    sets = allocate(arena, sizes(pt, ht), ["rows", "padded"])
    return None if sets is None else PlaneTiling(sets, pt, ht)


def pad_last_axis(ctx: LowerCtx, tiling: PlaneTiling, src: int, dst: int, planes: int, h: int, w: int, pl: int,
                  pr: int, mode: str, dst_plane: int, dst_row: int, prec: Prec, value: float = 0.0) -> None:
    """Rows padded along the last axis in LMEM (constant `value`, reflect or edge): planes of h x w (planes on lanes,
    contiguous in src) become h x (w + pl + pr) rows at dst + p*dst_plane + y*dst_row; the interior
    and each pad column are TIU copies, so both DMAs move whole rows."""
    chip, em, b = ctx.chip, ctx.em, prec.bytes
    wo = w + pl + pr
    sets = tiling.sets
    blocks = [(p0, p, y0, y) for p0, p in steps(planes, tiling.planes) for y0, y in steps(h, tiling.rows)]

    def source_column(j: int) -> int:
        """Input column that output column j (of the padded row) takes."""
        i = j - pl
        if mode == "reflect":
            return -i if i < 0 else (2 * (w - 1) - i if i >= w else i)
        return min(max(i, 0), w - 1)

    def load(block, s):
        _load_plane_rows(ctx, sets[s][0], src, block, h, w, prec)

    def pad_store(block, s):
        p0, p, y0, y = block
        rows = make_tile(chip, sets[s][0], (1, p, y, w), prec)
        out = make_tile(chip, sets[s][1], (1, p, y, wo), prec)
        view = lambda t, col, width, row: LTile(t.addr + col * b, (1, p, y, width), prec, (0, t.strides[1], row, 1),
                                                StrideMode.FREE)
        em.ar("copy", view(out, pl, w, wo), view(rows, 0, w, w))
        if mode == "constant":
            for col, width in ((0, pl), (pl + w, pr)):
                if width:
                    em.ar("copy", view(out, col, width, wo), value)
        else:
            for j in list(range(pl)) + list(range(pl + w, wo)):
                em.ar("copy", view(out, j, 1, wo), view(rows, source_column(j), 1, w))
        em.store(out, DRegion(dst + p0 * dst_plane * b + y0 * dst_row * b, (1, p, y, wo), (p * dst_plane, dst_plane, dst_row, 1),
                              prec))

    pipelined(blocks, len(sets), load, pad_store)


# ---------------------------------------------------------------- two-tap interpolation (linear Resize)

def tap_groups(taps, lo: int, o0: int, o1: int) -> list[tuple]:
    """Outputs [o0, o1) of a two-tap interpolation (taps[o] = (i0, w0, i1, w1)) as runs that one
    strided TIU pair computes: (first output - o0, count, output step, i0 - lo, i1 - lo, input
    step, w0, w1). A run takes every p-th output (p the period of the pattern) while the weights
    stay equal and both inputs advance by the same step."""
    out, done = [], set()
    period = _period(taps)
    for o in range(o0, o1):
        if o in done:
            continue
        i0, w0, i1, w1 = taps[o]
        count, step = 1, 0
        if o + period < o1:
            n = taps[o + period]
            if (n[1], n[3]) == (w0, w1) and n[0] >= i0 and n[2] - n[0] == i1 - i0:
                step, count = n[0] - i0, 2
                while o + count * period < o1:
                    n = taps[o + count * period]
                    if (n[1], n[3]) != (w0, w1) or n[0] != i0 + count * step or n[2] != i1 + count * step:
                        break
                    count += 1
        done.update(o + k * period for k in range(count))
        out.append((o - o0, count, period, i0 - lo, i1 - lo, step, w0, w1))
    return out


def _period(taps) -> int:
    """The smallest p whose shift maps the interior taps onto themselves (weights equal)."""
    n = len(taps)
    for p in range(1, min(n, 64) + 1):
        mid = range(min(2 * p, n), max(min(2 * p, n), n - 2 * p))
        if all(taps[o][1] == taps[o - p][1] and taps[o][3] == taps[o - p][3] for o in mid):
            return p
    return 1


def _tap_span(taps, o0: int, o1: int) -> tuple[int, int]:
    """The input rows [lo, hi) outputs [o0, o1) of a two-tap interpolation read."""
    return min(taps[o][0] for o in range(o0, o1)), max(taps[o][2] for o in range(o0, o1)) + 1


def plan_interpolation(arena: GroupArena, planes: int, inner_axis_w: bool, n_in: int, n_out: int, other: int,
                       taps, prec: Prec) -> RowTiling | None:
    """The tiling of interpolate_axis (input, fp32 accumulator and output buffers): q rows per
    lane along the last axis, or chunks of q output rows (with the input rows they read) along
    the axis before it; as large as fit twice."""
    chip = arena.chip
    if inner_axis_w:
        per = lambda q: [tile_bytes_per_lane(chip, (1, 1, q, n_in), prec),  # noqa: E731
                         tile_bytes_per_lane(chip, (1, 1, q, n_out), Prec.FP32),
                         tile_bytes_per_lane(chip, (1, 1, q, n_out), prec)]
        q_max = max(1, min(-(-planes // chip.lanes), MAX_DMA))
        options = sorted({max(1, q_max >> k) for k in range(16)})
    else:
        lanes = min(planes, chip.lanes)
        need = lambda oc: max(hi - lo for lo, hi in (_tap_span(taps, o, min(o + oc, n_out))  # noqa: E731
                                                      for o in range(0, n_out, oc)))
        per = lambda oc: [tile_bytes_per_lane(chip, (1, lanes, need(oc), other), prec),  # noqa: E731
                          tile_bytes_per_lane(chip, (1, lanes, oc, other), Prec.FP32),
                          tile_bytes_per_lane(chip, (1, lanes, oc, other), prec)]
        options = sorted({max(1, n_out >> k) for k in range(12)})
    q = largest_fitting(options, lambda v: arena.fits(per(v) * 2)) or 1
    sets = allocate(arena, per(q), ["input", "accumulator", "output"])
    return None if sets is None else RowTiling(sets, q)


def interpolate_axis(ctx: LowerCtx, tiling: RowTiling, src: int, dst: int, planes: int, inner_axis_w: bool,
                     n_in: int, n_out: int, other: int, taps, prec: Prec) -> None:
    """Two-tap interpolation along one axis in LMEM. inner_axis_w: the axis is the last one (rows of
    n_in -> n_out, `planes` rows, q per lane); else it is the one before the last (`planes` planes
    on lanes, each n_in x other -> n_out x other, in chunks of q output rows with their input rows)."""
    chip, em, b = ctx.chip, ctx.em, prec.bytes
    sets = tiling.sets
    if inner_axis_w:
        blocks = [(r0, lanes, qq, 0, n_out) for r0, lanes, qq in row_blocks(ctx, planes, tiling.q)]
    else:
        lanes = min(planes, chip.lanes)
        blocks = [(p0, p, 1, o0, o0 + c) for p0, p in steps(planes, lanes) for o0, c in steps(n_out, tiling.q)]

    def rows_of(block):
        p0, p, q, o0, o1 = block
        return (0, n_in) if inner_axis_w else _tap_span(taps, o0, o1)

    def load(block, s):
        p0, p, q, o0, o1 = block
        lo, hi = rows_of(block)
        if inner_axis_w:
            em.load(make_tile(chip, sets[s][0], (1, p, q, n_in), prec),
                    DRegion(src + p0 * n_in * b, (1, p, q, n_in), (p * q * n_in, q * n_in, n_in, 1), prec))
        else:
            em.load(make_tile(chip, sets[s][0], (1, p, hi - lo, other), prec),
                    DRegion(src + (p0 * n_in + lo) * other * b, (1, p, hi - lo, other),
                            (p * n_in * other, n_in * other, other, 1), prec))

    def compute_store(block, s):
        p0, p, q, o0, o1 = block
        lo, hi = rows_of(block)
        if inner_axis_w:
            inp = make_tile(chip, sets[s][0], (1, p, q, n_in), prec)
            acc = make_tile(chip, sets[s][1], (1, p, q, n_out), Prec.FP32)
            view = lambda t, start, count, step: LTile(t.addr + start * t.prec.bytes, (1, p, q, count), t.prec,
                                                       (0, t.strides[1], t.strides[2], step), StrideMode.FREE)
        else:
            inp = make_tile(chip, sets[s][0], (1, p, hi - lo, other), prec)
            acc = make_tile(chip, sets[s][1], (1, p, o1 - o0, other), Prec.FP32)
            view = lambda t, start, count, step: LTile(t.addr + start * other * t.prec.bytes, (1, p, count, other), t.prec,
                                                       (0, t.strides[1], step * other, 1), StrideMode.FREE)
        for first, count, ostep, a, c, istep, w0, w1 in tap_groups(taps, lo, o0, o1):
            out_v = view(acc, first, count, ostep)
            em.ar("mul", out_v, view(inp, a, count, istep), float(w0))
            if w1:
                em.lin("mac", out_v, view(inp, c, count, istep), float(w1), out_v)
        out = make_tile(chip, sets[s][2], acc.shape, prec)
        em.ar("copy", out, acc)
        if inner_axis_w:
            em.store(out, DRegion(dst + p0 * n_out * b, (1, p, q, n_out), (p * q * n_out, q * n_out, n_out, 1), prec))
        else:
            em.store(out, DRegion(dst + (p0 * n_out + o0) * other * b, (1, p, o1 - o0, other),
                                  (p * n_out * other, n_out * other, other, 1), prec))

    pipelined(blocks, len(sets), load, compute_store)


def plan_replicate_row(arena: GroupArena, width: int, prec: Prec) -> LmemTiling | None:
    """The one buffer of replicate_row (the row)."""
    sets = allocate(arena, [tile_bytes_per_lane(arena.chip, (1, 1, 1, width), prec)], ["row"], max_copies=1)
    return None if sets is None else LmemTiling(sets)


def replicate_row(ctx: LowerCtx, tiling: LmemTiling, src: int, dst: int, rows: int, width: int, prec: Prec) -> None:
    """dst (rows, width) = the row at src repeated: the row loaded once into LMEM and stored with a
    zero row stride on the LMEM side, so DDR is read once (not `rows` times from the same few
    interleave granules) and written in one contiguous stream."""
    chip, em, b = ctx.chip, ctx.em, prec.bytes
    row = make_tile(chip, tiling.sets[0][0], (1, 1, 1, width), prec)
    em.load(row, DRegion(src, (1, 1, 1, width), (width, width, width, 1), prec))
    for r0, r in steps(rows, MAX_DMA):
        repeated = LTile(row.addr, (1, 1, r, width), prec, (0, row.strides[1], 0, 1), StrideMode.FREE)
        em.store(repeated, DRegion(dst + r0 * width * b, (1, 1, r, width), (r * width, r * width, width, 1), prec))
