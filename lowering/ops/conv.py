"""Conv groups on the TIU: standard and grouped convolution (conv.normal), depthwise (pord.depthwise),
tiled over output channels, output rows (with input halos) and input channels, plus the fused
epilogue."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tpuflow.errors import LoweringError
from tpuflow.isa import ConvTiu, PordTiu, Prec, StrideMode
from tpuflow.lowering.context import LowerCtx
from tpuflow.lowering.emitplan import FrozenPlan
from tpuflow.lowering.emitter import pool_scale_fields, settled
from tpuflow.lowering.groups import Group
from tpuflow.lowering.layergroup import NCHW
from tpuflow.lowering.ops.epilogue import Epilogue, full_epilogue_operands
from tpuflow.lowering.tensors import DRegion, LTile, make_tile, tile_bytes_per_lane
from tpuflow.lowering.tiling import pipelined, steps, steps_between
from tpuflow.lowering.weights import pack_conv_weights

MAX_PAD = 15        # opd0_*_pad fields are 4 bits
PIPELINE_STEPS = 4  # split a layer that fits LMEM whole into this many row tiles, so GDMA loads and
                    # stores of one tile overlap the compute of the next


MIN_ROW_ELEMENTS = 256   # a row tile keeps at least this many contiguous elements per channel:
                         # smaller DMA segments are latency-bound and cost more than the overlap wins


def row_options(total: int) -> list[int]:
    """Output rows per tile tried, most first: every row, halves of them while more than 64 (tall
    thin layers: a 1-D signal runs down H), then 64, 32, ..., 1."""
    halves, rows = set(), total
    while rows > 64:
        rows = -(-rows // 2)
        halves.add(rows)
    return sorted({total} | halves | {min(total, x) for x in (64, 32, 16, 8, 4, 2, 1)}, reverse=True)


def _pipelined_rows(fitting: int, total: int, width: int = 1) -> int:
    """Rows per tile: at most what fits, few enough that the layer runs as several tiles, and
    never so few that a channel's slice of the tile is a tiny DMA segment."""
    steps_wanted = PIPELINE_STEPS if total >= 2 * PIPELINE_STEPS else 2 if total >= 4 else 1
    rows = -(-total // steps_wanted)
    rows = max(rows, -(-MIN_ROW_ELEMENTS // max(width, 1)))
    return max(1, min(fitting, rows, total))


@dataclass(frozen=True)
class ConvGeom:
    n: int
    cin: int
    h: int
    w: int
    cout: int
    kh: int
    kw: int
    ho: int
    wo: int
    sy: int
    sx: int
    dy: int
    dx: int
    pt: int
    pl: int
    pb: int
    pr: int
    groups: int

    def input_rows(self, oh0: int, count: int) -> tuple[int, int, int, int]:
        """(first loaded row, rows loaded, up pad, down pad) for output rows [oh0, oh0+count)."""
        start = oh0 * self.sy - self.pt
        end = start + (count - 1) * self.sy + (self.kh - 1) * self.dy + 1
        lo, hi = max(start, 0), min(end, self.h)
        return lo, max(hi - lo, 0), lo - start, end - hi

    def halo_rows(self, count: int) -> int:
        return (count - 1) * self.sy + (self.kh - 1) * self.dy + 1

    def input_cols(self, ow0: int, count: int) -> tuple[int, int, int, int]:
        """(first loaded column, columns loaded, left pad, right pad) for output columns [ow0, ow0+count)."""
        start = ow0 * self.sx - self.pl
        end = start + (count - 1) * self.sx + (self.kw - 1) * self.dx + 1
        lo, hi = max(start, 0), min(end, self.w)
        return lo, max(hi - lo, 0), lo - start, end - hi

    def halo_cols(self, count: int) -> int:
        return min(self.w, (count - 1) * self.sx + (self.kw - 1) * self.dx + 1)


@dataclass(frozen=True)
class ColumnWindow:
    """The columns of one output tile: final output columns [out0, out0 + out_n), the conv output
    columns they need (more when a pool is fused, with the pool's left/right pads), and the input
    columns the conv reads with its left/right pads. A layer whose whole rows do not fit LMEM
    runs in several windows (W slicing); otherwise one window covers every column."""

    out0: int
    out_n: int
    conv0: int
    conv_n: int
    in0: int
    in_n: int
    lf: int
    rt: int
    pool_lf: int = 0
    pool_rt: int = 0


def column_windows(geo: ConvGeom, pgeom: ConvGeom | None, step: int | None) -> list[ColumnWindow]:
    """The column windows of a conv (with its fused pool `pgeom`) at `step` final columns per
    window; one window of every column when `step` is None."""
    final_w = pgeom.wo if pgeom is not None else geo.wo
    if step is None:
        return [ColumnWindow(0, final_w, 0, geo.wo, 0, geo.w, geo.pl, geo.pr,
                             *((pgeom.pl, pgeom.pr) if pgeom is not None else (0, 0)))]
    out = []
    for q0, qn in steps(final_w, step):
        c0, cn, plf, prt = pgeom.input_cols(q0, qn) if pgeom is not None else (q0, qn, 0, 0)
        i0, i_n, lf, rt = geo.input_cols(c0, cn)
        if not cn or not i_n:
            raise LoweringError(f"conv tile of output columns [{q0}, {q0 + qn}) reads only padding")
        out.append(ColumnWindow(q0, qn, c0, cn, i0, i_n, lf, rt, plf, prt))
    return out


def window_widths(geo: ConvGeom, pgeom: ConvGeom | None, step: int | None) -> tuple[int, int, int]:
    """(input, conv output, final output) columns a window of `step` final columns spans at most."""
    if step is None:
        return geo.w, geo.wo, pgeom.wo if pgeom is not None else geo.wo
    conv = min(geo.wo, pgeom.halo_cols(step)) if pgeom is not None else step
    return geo.halo_cols(conv), conv, step


def read_amplification(geo: ConvGeom, rows: int, cols: int) -> float:
    """Input elements a tile of `rows` x `cols` conv outputs reads per element its stride covers
    (the row and column halos' overhead): the measure W slicing minimises."""
    return geo.halo_rows(rows) / (rows * geo.sy) * geo.halo_cols(cols) / (cols * geo.sx)


def narrowest_read(options, amplification):
    """The option (whole rows first, then column steps) with the least input re-reading: whole rows
    when they fit, else the window step whose fitting tile reads least; `options` yields (wt,
    choice or None) and amplification(wt, choice) scores a fitting one."""
    best = None
    for wt, choice in options:
        if choice is None:
            continue
        if wt is None:
            return wt, choice
        score = amplification(wt, choice)
        if best is None or score < best[0] - 1e-12:
            best = (score, wt, choice)
    return (best[1], best[2]) if best else (None, None)


def width_steps(final_w: int) -> list[int]:
    """Final output columns per window tried, widest first, when whole rows do not fit (W slicing)."""
    out, step = [], final_w
    while step > 1:
        step = -(-step // 2)
        out.append(step)
    return out


def fold_kernel_rows(geo: ConvGeom) -> ConvGeom:
    """The same conv after stacking the kh row-shifted (strided, padded) copies of each input
    channel as channels: cin*kh input channels, a 1 x kw kernel, no vertical stride or padding.
    A conv with few input channels then fills kh times more lanes; the stacked channels are
    kernel-row-major (channel i * cin + c is row i of channel c), so one copy per kernel row fills
    cin neighbouring lanes, and the weights are reordered to [oc][kh][ic][kw] to match."""
    return ConvGeom(geo.n, geo.cin * geo.kh, geo.ho, geo.w, geo.cout, 1, geo.kw, geo.ho, geo.wo, 1, geo.sx, 1, geo.dx,
                    0, geo.pl, 0, geo.pr, 1)


def conv_geometry(ctx: LowerCtx, node) -> ConvGeom:
    g = ctx.graph
    n, cin, h, w = g.tensor(node.inputs[0]).shape
    cout, _, kh, kw = g.tensor(node.inputs[1]).shape
    _, _, ho, wo = g.tensor(node.outputs[0]).shape
    sy, sx = node.attr("strides", (1, 1))
    dy, dx = node.attr("dilations", (1, 1))
    pt, pl, pb, pr = node.attr("pads", (0, 0, 0, 0))
    geom = ConvGeom(n, cin, h, w, cout, kh, kw, ho, wo, sy, sx, dy, dx, pt, pl, pb, pr, node.attr("group", 1))
    if max(pl, pr, pt, pb) > MAX_PAD or max(sy, sx) > 15 or max(dy, dx) > 16:
        raise LoweringError(f"node {node.name}: pads/strides/dilations exceed the 4-bit descriptor fields")
    return geom


def lane_group_pieces(tiles: list[LTile], chip) -> list[tuple[int, int, list[LTile]]]:
    """Views of one channel range (a result, the operands read per channel) as the short descriptors
    write them (sCONV / sPorD hold no result strides, sPorD no input strides): [(0, c, tiles)] in the
    aligned layout, or, when a view is strided (a window of a larger resident tensor), the channels
    cut at every view's lane-group boundary, each piece's views one channel per lane (their channel
    strides unused) and aligned. Views that stay strided either way come back whole (the long form)."""
    whole = [settled(t, chip) for t in tiles]
    channels = tiles[0].c
    if all(t.mode != StrideMode.FREE for t in whole):
        return [(0, channels, whole)]
    lanes = chip.lanes
    starts = [(t.addr // chip.lmem_bytes_per_lane) % lanes for t in tiles]
    cuts = sorted({0, channels} | {c for c in range(1, channels) for st in starts if (st + c) % lanes == 0})
    pieces = [(c0, c1 - c0, [settled(t.sub_channels(c0, c1 - c0, chip), chip) for t in tiles])
              for c0, c1 in zip(cuts, cuts[1:])]
    if any(t.mode == StrideMode.FREE for _, _, views in pieces for t in views):
        return [(0, channels, list(tiles))]
    return pieces


def emit_pord(em, chip, out: LTile, inp: LTile, per_channel: dict[str, LTile] | None = None, **fields) -> None:
    """A pord instruction over out / inp, one per lane_group_pieces piece; per_channel: operands
    (depthwise weights, bias) addressed per channel like the result."""
    per_channel = per_channel or {}
    for c0, count, (res, src) in lane_group_pieces([out, inp], chip):
        f = res.fields("res0", with_shape=True)
        f.update(src.fields("opd0"))
        for prefix, t in per_channel.items():
            f[f"{prefix}_addr"] = (t if count == out.c else t.sub_channels(c0, count, chip)).addr
        em.tiu(PordTiu(**f, **fields))


@dataclass(frozen=True)
class ConvPlan(FrozenPlan):
    """A conv's tiling: output channels (ct), final output rows (ht) and input channels (ict) per
    step, whether the weights stay resident, the weight channel block, the resident buffers'
    offsets (bias, weights when resident, epilogue residents) and each buffer set's offsets (the
    first `load_count` are the per-step loads: input, streamed weights, raw rows; then the conv
    result, epilogue operands and scratch, the pooled or stored result)."""

    depthwise: bool
    ct: int
    ht: int
    ict: int
    w_res: bool
    ic_block: int
    residents: tuple[int, ...]
    sets: tuple[tuple[int, ...], ...]
    load_count: int
    wt: int | None = None       # final output columns per window (W slicing); None: whole rows


class ConvEmitter:
    def __init__(self, ctx: LowerCtx, group: Group):
        self.ctx, self.group, self.chip = ctx, group, ctx.chip
        self.node = group.anchor
        self.geom = conv_geometry(ctx, self.node)
        out = self.node.outputs[0]
        epilogue = list(group.epilogue)
        # a leading Relu runs inside the conv instruction (opt_relu, after bias and accumulation)
        self.fused_relu = bool(epilogue) and epilogue[0].op_type == "Relu"
        if self.fused_relu:
            out = epilogue.pop(0).outputs[0]
        self.epi = Epilogue(ctx, out, epilogue, ctx.graph.tensor(out).shape, 2)
        self.result = self.epi.output
        self.weights = np.asarray(ctx.const(self.node.inputs[1]), np.float32)
        b = self.node.inputs[2] if len(self.node.inputs) > 2 and self.node.inputs[2] else None
        self.bias = np.asarray(ctx.const(b), np.float32) if b else None
        geo = self.geom
        self.depthwise = geo.groups == geo.cin == geo.cout and geo.groups > 1
        self.pool = group.tail_pool
        if self.pool is not None:
            from tpuflow.lowering.ops.pool import pool_geometry
            self.pgeom, _ = pool_geometry(ctx, self.pool)
            self.result = self.pool.outputs[0]
        self.held = ctx.held_constants()                     # sliced runs: constants held across slices
        self.cout_range = ctx.channels_to_emit(self.geom.cout)   # cores: the output channels this core computes
        self.in_res = ctx.resident(self.node.inputs[0])      # layer groups: input kept in LMEM
        self.out_res = ctx.resident(self.result)             # layer groups: result kept in LMEM
        self.unfolded = None                                 # the original geometry when rows are folded
        # weights in the cube's input-channel-aligned layout, the one the short descriptor (sCONV) means
        self.ic_block = ConvTiu.ALIGNED_IC_BLOCK.get(int(ctx.prec), 1)
        geo = self.geom
        if (self.in_res is None and geo.groups == 1 and geo.kh > 1 and geo.cin * geo.kh <= self.chip.lanes
                and geo.cin * 2 <= self.chip.lanes):
            self.unfolded, self.geom = geo, fold_kernel_rows(geo)
            # folded channel i * cin + c is kernel row i of input channel c (tap-major: one copy per row)
            self.weights = self.weights.transpose(0, 2, 1, 3).reshape(geo.cout, geo.kh * geo.cin, 1, geo.kw)

    @staticmethod
    def resident_ports(graph, group: Group, chip) -> tuple[dict[str, str], dict[str, str]]:
        """Plain and depthwise convs read their input and full-size epilogue operands from LMEM
        and write their result there (every channel tile then starts on lane 0)."""
        node = group.anchor
        cin = graph.tensor(node.inputs[0]).shape[1]
        cout = graph.tensor(node.inputs[1]).shape[0]
        groups = node.attr("group", 1)
        if not (groups == 1 or groups == cin == cout):
            return {}, {}
        readable = {node.inputs[0]} | full_epilogue_operands(graph, group)
        return dict.fromkeys(readable, NCHW), {group.nodes[-1].outputs[0]: NCHW}

    # ------------------------------------------------------------ public
    def plan(self, region: str) -> ConvPlan | None:
        """The tiling and buffers of the conv in `region`, or None when no tiling fits there."""
        arena = self.ctx.planning_arena(region)
        planned = self._plan_depthwise(arena) if self.depthwise else self._plan_standard(arena)
        if planned is None:
            return None
        return ConvPlan(region, self.ctx.window(region), tuple(arena.names), **planned)

    def misfit(self) -> str:
        return f"no tiling of {'depthwise ' if self.depthwise else ''}conv {self.geom} fits LMEM"

    def held_sizes(self) -> list[int] | None:
        """Per-lane sizes of the constants (bias, all weights, epilogue constants) this conv can
        hold in LMEM across the slices of a sliced run; None when it cannot (a grouped conv loads
        each group's weights into one buffer, a runtime epilogue operand changes per slice)."""
        geo = self.geom
        if not self.epi.constants_only() or (geo.groups > 1 and not self.depthwise):
            return None
        return self._depthwise_resident_sizes() if self.depthwise else self._resident_sizes(geo.cin, geo.cout, True)

    def _loads_constants(self) -> bool:
        """Whether this emission loads its constants (not when a previous slice holds them)."""
        return self.held is None or not self.held.loaded

    def _held_offsets(self, sizes: list[int], form) -> tuple[int, ...] | None:
        """The constants' offsets in the held block, None when an earlier slice fixed another form."""
        if self.held.form is not None and self.held.form != form:
            return None
        return tuple(self.held.offsets(sizes, self.chip.core.lmem_align_bytes))

    def wants_wider(self, plan: ConvPlan) -> bool:
        """A plan that streams its weights although one output-channel tile holds them all is
        compared with the next (larger) region's: resident weights matter more than the ring."""
        cout_g = self.geom.cout // self.geom.groups
        return plan.region != "full" and not plan.depthwise and not plan.w_res and plan.ct == cout_g

    def prefers(self, plan: ConvPlan, other: ConvPlan) -> bool:
        return plan.w_res and not other.w_res

    def emit(self, plan: ConvPlan) -> None:
        geo = self.geom
        self.ctx.em.layer = self.node.name
        self.ic_block = plan.ic_block
        if self.held is not None:
            self.held.form = plan.ic_block
        if self.depthwise:
            self._emit_depthwise(plan)
        else:
            cin_g = geo.cin // geo.groups
            self._prepare_standard(plan, cin_g, self._out_channels()[0][1])
            for gi, (oc_base, cout_g) in enumerate(self._out_channels()):
                self._emit_standard(gi * cin_g, oc_base, cin_g, cout_g)
        macs = geo.n * geo.cout * geo.ho * geo.wo * (geo.cin // geo.groups) * geo.kh * geo.kw
        self.ctx.note_layer(self.node.name, "Conv", macs=macs, lmem_peak=plan.peak, group=self.group.name)
        for n in self.group.nodes[1:]:
            self.ctx.note_layer(n.name, n.op_type, lmem_peak=plan.peak, group=self.group.name)

    def _out_channels(self) -> list[tuple[int, int]]:
        """(first output channel, count) per conv group: the core's channel range of a plain
        conv, every group's channels of a grouped one."""
        geo = self.geom
        if geo.groups == 1:
            lo, hi = self.cout_range
            return [(lo, hi - lo)]
        return [(gi * (geo.cout // geo.groups), geo.cout // geo.groups) for gi in range(geo.groups)]

    # ------------------------------------------------------------ sizing
    def _out_prec(self, ic_split: bool) -> Prec:
        return Prec.FP32 if (ic_split or not self.epi.empty) and self.ctx.prec != Prec.FP32 else self.ctx.prec

    def _no_row_traffic(self) -> bool:
        """Input, result and full-size epilogue operands all in LMEM (layer groups): a row tile
        loads and stores nothing, so cutting rows only adds instructions."""
        return (self.in_res is not None and self.out_res is not None
                and all(self.ctx.resident(op.tensor) is not None for op in self.epi.full))

    def _stage(self, ic_split: bool) -> bool:
        return self._out_prec(ic_split) != self.ctx.prec

    def _direct(self, ic_split: bool) -> bool:
        """The conv (and its epilogue) can write the resident result in place."""
        return self.out_res is not None and self.pool is None and not self._stage(ic_split)

    def _conv_rows(self, final_rows: int) -> int:
        """Conv output rows a tile of `final_rows` output rows needs (pool halo when pooled)."""
        return min(self.geom.ho, self.pgeom.halo_rows(final_rows)) if self.pool is not None else final_rows

    def _set_sizes(self, ct: int, ht: int, ict: int, cin_g: int, w_resident: bool,
                   ic_block: int | None = None, wt: int | None = None) -> tuple[list[int], list[int]]:
        """(per-step load buffers, per-output-tile buffers) in bytes per lane; `ht` counts final
        output rows (pool rows when a pool is fused), `wt` final output columns per window (None:
        whole rows); weights in `ic_block`-channel blocks."""
        geo, chip, prec = self.geom, self.chip, self.ctx.prec
        split = ict < cin_g
        conv_rows = self._conv_rows(ht)
        in_w, conv_w, final_w = window_widths(geo, self._pool_geom(), wt)
        load = [0 if self.in_res else tile_bytes_per_lane(chip, (1, ict, geo.halo_rows(conv_rows), in_w), prec)]
        if not w_resident:
            load.append(tile_bytes_per_lane(chip, (1, ct, 1, self._weight_elems(ict, ic_block)), prec, compact=True))
        if self.unfolded is not None:        # the raw input rows the folded rows are copied from
            raw = self.unfolded
            load.append(tile_bytes_per_lane(chip, (1, raw.cin, raw.halo_rows(conv_rows), in_w), prec))
        out_shape = (1, ct, conv_rows, conv_w)
        outs = [0 if self._direct(split) else tile_bytes_per_lane(chip, out_shape, self._out_prec(split))]
        outs += self.epi.set_sizes(out_shape)
        final = 0 if self.out_res else None
        if self.pool is not None:
            outs.append(tile_bytes_per_lane(chip, (1, ct, ht, final_w), prec) if final is None else final)
        elif self._stage(split):
            outs.append(tile_bytes_per_lane(chip, out_shape, prec) if final is None else final)
        return load, outs

    def _set_names(self, w_resident: bool, split: bool) -> tuple[list[str], list[str]]:
        """Names of the buffers `_set_sizes` sizes, in its order."""
        load = ["input"] + ([] if w_resident else ["weights"]) + (["raw_input"] if self.unfolded is not None else [])
        outs = ["conv_out"] + self.epi.set_names()
        if self.pool is not None:
            outs.append("pooled")
        elif self._stage(split):
            outs.append("stored")
        return load, outs

    def _row_range(self) -> tuple[int, int]:
        """Final output rows this emission computes (a slice of them in sliced layer groups)."""
        return self.ctx.rows_to_emit(self.pgeom.ho if self.pool is not None else self.geom.ho)

    def _final_rows(self) -> int:
        lo, hi = self._row_range()
        return hi - lo

    def _row_tiles(self, step: int) -> list[tuple[int, int, tuple | None]]:
        """(conv row start, conv rows, pool part) per tile; the pool part is (first pool row,
        pool rows, up pad, down pad) when a pool is fused."""
        if self.pool is None:
            return [(h0, ht, None) for h0, ht in steps_between(*self._row_range(), step)]
        out = []
        for q0, qt in steps_between(*self._row_range(), step):
            r0, rows, up, dn = self.pgeom.input_rows(q0, qt)
            out.append((r0, rows, (q0, qt, up, dn)))
        return out

    def _resident_sizes(self, cin_g: int, cout_g: int, w_resident: bool, ic_block: int | None = None) -> list[int]:
        geo, chip = self.geom, self.chip
        out = [tile_bytes_per_lane(chip, (1, geo.cout, 1, 1), Prec.FP32, compact=True)]
        if w_resident:
            out.append(tile_bytes_per_lane(chip, (1, cout_g, 1, self._weight_elems(cin_g, ic_block)), self.ctx.prec,
                                           compact=True))
        return out + self.epi.resident_sizes(geo.cout, geo.wo)

    def _fits(self, arena, ct, ht, ict, cin_g, cout_g, w_resident, copies=2, wt=None) -> bool:
        load, outs = self._set_sizes(ct, ht, ict, cin_g, w_resident, wt=wt)
        resident = [] if self.held else self._resident_sizes(cin_g, cout_g, w_resident)
        return arena.fits(resident + (load + outs) * copies)

    def _pool_geom(self) -> ConvGeom | None:
        return self.pgeom if self.pool is not None else None

    def _final_width(self) -> int:
        return self.pgeom.wo if self.pool is not None else self.geom.wo

    def _width_options(self) -> list[int | None]:
        """Whole rows, then (W slicing) ever narrower column windows when the layer's operands
        live in DDR and no epilogue operand is laid out per column."""
        sliceable = (self.in_res is None and self.out_res is None and not self.epi.full_resident()
                     and not self.epi.has_columns())
        return [None] + (width_steps(self._final_width()) if sliceable else [])

    def _choose(self, arena, cin_g: int, cout_g: int):
        """(ct, ht, ict, weights resident, wt) of the first fitting tiling, or None: whole rows
        when any tiling of them fits, else the column windows whose tiles re-read least input."""
        options = ((wt, self._choose_at(arena, cin_g, cout_g, wt)) for wt in self._width_options())
        wt, choice = narrowest_read(options, lambda wt, c: read_amplification(
            self.geom, self._conv_rows(c[1]), window_widths(self.geom, self._pool_geom(), wt)[1]))
        return None if choice is None else choice + (wt,)

    def _choose_at(self, arena, cin_g: int, cout_g: int, wt: int | None):
        """(ct, ht, ict, weights resident) of the first fitting tiling at `wt` columns, or None."""
        lanes = self.chip.lanes
        c_opts = sorted({min(cout_g, lanes * k) for k in range(1, -(-cout_g // lanes) + 1)}, reverse=True)
        final = self._final_rows()
        h_opts = row_options(final)
        ic_opts = sorted({min(cin_g, lanes * k) for k in range(1, -(-cin_g // lanes) + 1)} | {cin_g}, reverse=True)
        for copies in (2, 1):
            for ict in ic_opts:
                for w_res in self._weight_options(ict == cin_g):
                    best = None
                    for ct in c_opts:
                        for ht in h_opts:
                            if self._fits(arena, ct, ht, ict, cin_g, cout_g, w_res, copies, wt):
                                score = ct * ht
                                if best is None or score > best[0]:
                                    best = (score, ct, ht)
                                break
                    if best and wt is not None:          # column windows already pipeline
                        return best[1], best[2], ict, w_res
                    if best:
                        return self._pipelined(best[1], best[2], final, cout_g, w_res, self._final_width()) + (ict, w_res)
        return None

    def _weight_options(self, whole_input: bool) -> tuple[bool, ...]:
        """Whether the weights can stay resident (all input channels per step), and whether they
        can stream; held constants are always resident."""
        if self.held:
            return (True,) if whole_input else ()
        return (True, False) if whole_input else (False,)

    def _pipelined(self, ct: int, ht: int, final: int, cout_g: int, w_res: bool, width: int) -> tuple[int, int]:
        """Cut a layer that fits in one tile into several so loads overlap compute: by rows when
        the weights stay resident, else by output channels (each weight slice is still loaded
        once; the input is re-read per slice)."""
        if w_res and self._no_row_traffic():
            return ct, ht                     # nothing moves per row tile: whole rows, fewest instructions
        if w_res:
            return ct, _pipelined_rows(ht, final, width)
        lanes = self.chip.lanes
        if -(-cout_g // ct) < PIPELINE_STEPS and cout_g >= PIPELINE_STEPS * lanes:
            ct = -(-cout_g // PIPELINE_STEPS // lanes) * lanes
        return ct, ht

    # ------------------------------------------------------------ standard / grouped
    def _plan_standard(self, arena) -> dict | None:
        geo = self.geom
        cin_g, cout_g = geo.cin // geo.groups, self._out_channels()[0][1]
        choice = self._choose(arena, cin_g, cout_g)
        if choice is None:
            return None
        ct, ht, ict, w_res, wt = choice
        # the long CONV form (strided result) holds compact weights only; they are smaller
        ic_block = self.ic_block if self._outputs_fit_short_form(cin_g, cout_g, ct, ht, ict) else 1
        res_sizes = self._resident_sizes(cin_g, cout_g, w_res, ic_block)
        load, outs = self._set_sizes(ct, ht, ict, cin_g, w_res, ic_block, wt)
        load_names, out_names = self._set_names(w_res, ict < cin_g)
        res_names = ["bias"] + (["weights"] if w_res else []) + self.epi.resident_names()
        if self.held:
            res = self._held_offsets(res_sizes, ic_block)
            if res is None:
                return None
            res_sizes, res_names = [], []
        placed, sets = arena.alloc_plan(res_sizes, load + outs, self.node.name, names=(res_names, load_names + out_names))
        return dict(depthwise=False, ct=ct, ht=ht, ict=ict, w_res=w_res, ic_block=ic_block,
                    residents=tuple(res if self.held else placed), sets=tuple(tuple(x) for x in sets),
                    load_count=len(load), wt=wt)

    def _prepare_standard(self, plan: ConvPlan, cin_g: int, cout_g: int) -> None:
        geo, chip, ctx = self.geom, self.chip, self.ctx
        self.ct, self.ht, self.ict, self.w_res, self.wt = plan.ct, plan.ht, plan.ict, plan.w_res, plan.wt
        res = plan.residents
        self.load_sets = [s[:plan.load_count] for s in plan.sets]
        self.out_sets = [s[plan.load_count:] for s in plan.sets]
        self.bias_tile = make_tile(chip, res[0], (1, geo.cout, 1, 1), Prec.FP32, compact=True)
        if self.bias is not None and self._loads_constants():
            ctx.load_const_channels(self.bias_tile, f"bias:{self.node.name}", self.bias.reshape(-1, 1), Prec.FP32)
        self.w_res_offset = res[1] if self.w_res else None
        self.epi.load_residents(list(res[2 if self.w_res else 1:]), geo.cout, geo.wo, self._loads_constants())
        self.w_addr = ctx.const_addr(f"convw:{self.node.name}", pack_conv_weights(self.weights, self.ic_block))

    def _outputs_fit_short_form(self, cin_g: int, cout_g: int, c_step: int, h_step: int, ic_step: int) -> bool:
        """Every conv result view is in the aligned layout sCONV implies (a resident result may be strided)."""
        if not self._direct(ic_step < cin_g):
            return True
        return all(piece.mode != StrideMode.FREE
                   for gi in range(self.geom.groups) for n in self.ctx.samples_to_emit(self.geom.n)
                   for c0, ct in steps(cout_g, c_step)
                   for h0, ht, _ in self._row_tiles(h_step)
                   for _, _, (piece,) in lane_group_pieces([self.out_res.view(self.chip, n, gi * cout_g + c0, ct,
                                                                                          h0, ht)], self.chip))

    def _weight_elems(self, ict: int, ic_block: int | None = None) -> int:
        """Weight elements per output channel for `ict` input channels (the aligned layout pads
        channels to `ic_block`, by default the emitter's)."""
        block = ic_block or self.ic_block
        return -(-ict // block) * block * self.geom.kh * self.geom.kw

    def _emit_standard(self, ic_base: int, oc_base: int, cin_g: int, cout_g: int) -> None:
        geo = self.geom
        if self.w_res:
            self.w_tile = make_tile(self.chip, self.w_res_offset, (1, cout_g, 1, self._weight_elems(cin_g)),
                                    self.ctx.prec, compact=True)
            if self._loads_constants():
                self.ctx.em.load(self.w_tile, self._weight_region(oc_base, cout_g, 0, cin_g, cin_g))
        windows = column_windows(geo, self._pool_geom(), self.wt)
        out_tiles = [(n, c0, ct, h0, ht, pool, cols) for n in self.ctx.samples_to_emit(geo.n)
                     for c0, ct in steps(cout_g, self.ct) for h0, ht, pool in self._row_tiles(self.ht)
                     for cols in windows]
        ic_steps = steps(cin_g, self.ict)
        work = [(ti, t, k) for ti, t in enumerate(out_tiles) for k in range(len(ic_steps))]
        ctx = (ic_base, oc_base, cin_g, ic_steps)
        pipelined(work, len(self.load_sets), lambda w, s: self._load_step(w, s, ctx),
                  lambda w, s: self._compute_step(w, s, ctx))

    def _weight_region(self, oc0: int, ct: int, ic0: int, ict: int, cin_g: int) -> DRegion:
        geo, prec = self.geom, self.ctx.prec
        if ic0 % self.ic_block:
            raise LoweringError(f"layer {self.node.name}: input-channel step {ic0} is not a multiple of the "
                                f"{self.ic_block}-channel weight block")
        row, elems = self._weight_elems(cin_g), self._weight_elems(ict)
        addr = self.w_addr + (oc0 * row + ic0 * geo.kh * geo.kw) * prec.bytes
        return DRegion(addr, (1, ct, 1, elems), (ct * row, row, elems, 1), prec)

    def _input_region(self, n: int, c0: int, ct: int, r0: int, rows: int, cols: ColumnWindow) -> DRegion:
        geo = self.geom
        base = ((n * geo.cin + c0) * geo.h + r0) * geo.w + cols.in0
        return self.ctx.region(self.node.inputs[0], (1, ct, rows, cols.in_n), base,
                               (geo.cin * geo.h * geo.w, geo.h * geo.w, geo.w, 1))

    def _output_region(self, tensor: str, n: int, c0: int, ct: int, h0: int, ht: int, cols: ColumnWindow) -> DRegion:
        geo = self.geom
        base = ((n * geo.cout + c0) * geo.ho + h0) * geo.wo + cols.conv0
        return self.ctx.region(tensor, (1, ct, ht, cols.conv_n), base,
                               (geo.cout * geo.ho * geo.wo, geo.ho * geo.wo, geo.wo, 1))

    def _load_step(self, work, s: int, cctx) -> None:
        ti, (n, c0, ct, h0, ht, pool, cols), k = work
        ic_base, oc_base, cin_g, ic_steps = cctx
        geo, em = self.geom, self.ctx.em
        ic0, ict = ic_steps[k]
        r0, rows, _, _ = geo.input_rows(h0, ht)
        em.layer = self.node.name
        offs = self.load_sets[s]
        if self.unfolded is not None:
            self._load_folded_rows(make_tile(self.chip, offs[0], (1, ict, rows, cols.in_n), self.ctx.prec), offs[-1],
                                   n, h0, ht, cols)
        elif rows and self.in_res is None:
            em.load(make_tile(self.chip, offs[0], (1, ict, rows, cols.in_n), self.ctx.prec),
                    self._input_region(n, ic_base + ic0, ict, r0, rows, cols))
        if not self.w_res:
            w = make_tile(self.chip, offs[1], (1, ct, 1, self._weight_elems(ict)), self.ctx.prec, compact=True)
            em.load(w, self._weight_region(oc_base + c0, ct, ic0, ict, cin_g))
        if k == len(ic_steps) - 1 and self.epi.full:
            out_offs = self.out_sets[ti % len(self.out_sets)]
            self.epi.load_tile(out_offs[1:], (1, ct, ht, cols.conv_n),
                               lambda addr: self._epi_region(addr, n, oc_base + c0, ct, h0, ht, cols))

    def _load_folded_rows(self, dst: LTile, raw_offset: int, n: int, h0: int, ht: int, cols: ColumnWindow) -> None:
        """Channel i*cin + c of `dst`, row k = input row (h0+k)*sy + i*dy - pad_top of channel c
        (zero where that row is padding): the tile's raw input rows arrive in one DMA, then one
        LMEM-to-LMEM strided copy per kernel row i moves every channel (no DRAM traffic)."""
        geo, em, prec, chip = self.unfolded, self.ctx.em, self.ctx.prec, self.chip
        lo, rows, _, _ = geo.input_rows(h0, ht)
        raw = make_tile(chip, raw_offset, (1, geo.cin, rows, cols.in_n), prec)
        em.load(raw, self.ctx.region(self.node.inputs[0], raw.shape, (n * geo.cin * geo.h + lo) * geo.w + cols.in0,
                                     (geo.cin * geo.h * geo.w, geo.h * geo.w, geo.w, 1)))
        for i in range(geo.kh):
            block = dst.sub_channels(i * geo.cin, geo.cin, chip)
            first = next((k for k in range(ht) if (h0 + k) * geo.sy + i * geo.dy - geo.pt >= 0), ht)
            last = next((k for k in range(ht - 1, -1, -1) if (h0 + k) * geo.sy + i * geo.dy - geo.pt < geo.h), -1)
            for k0, k1 in ((0, first), (max(last + 1, first), ht)):
                if k1 > k0:
                    em.fill(self._rows_of(block, k0, k1 - k0), 0.0)
            if last >= first:
                r0 = (h0 + first) * geo.sy + i * geo.dy - geo.pt - lo
                src = LTile(raw.addr + r0 * raw.strides[2] * prec.bytes, (1, geo.cin, last - first + 1, cols.in_n), prec,
                            (raw.strides[0], raw.strides[1], geo.sy * raw.strides[2], 1), StrideMode.FREE)
                em.lmem_copy(self._rows_of(block, first, last - first + 1), src)

    def _rows_of(self, tile: LTile, k0: int, count: int) -> LTile:
        return LTile(tile.addr + k0 * tile.strides[2] * tile.prec.bytes, (1, tile.c, count, tile.w), tile.prec,
                     tile.strides, tile.mode)

    def _epi_region(self, addr: int, n, c0, ct, h0, ht, cols: ColumnWindow) -> DRegion:
        geo, prec = self.geom, self.ctx.prec
        base = ((n * geo.cout + c0) * geo.ho + h0) * geo.wo + cols.conv0
        return DRegion(addr + base * prec.bytes, (1, ct, ht, cols.conv_n),
                       (geo.cout * geo.ho * geo.wo, geo.ho * geo.wo, geo.wo, 1), prec)

    def _compute_step(self, work, s: int, cctx) -> None:
        ti, (n, c0, ct, h0, ht, pool, cols), k = work
        ic_base, oc_base, cin_g, ic_steps = cctx
        geo, chip, em = self.geom, self.chip, self.ctx.em
        ic0, ict = ic_steps[k]
        split = len(ic_steps) > 1
        offs, out_offs = self.load_sets[s], self.out_sets[ti % len(self.out_sets)]
        r0, rows, up, dn = geo.input_rows(h0, ht)
        if self._direct(split):
            out = self.out_res.view(chip, n, oc_base + c0, ct, h0, ht)
        else:
            out = make_tile(chip, out_offs[0], (1, ct, ht, cols.conv_n), self._out_prec(split))
        if not rows:
            raise LoweringError(f"layer {self.node.name}: an output tile reads only padding")
        if self.in_res is not None:
            inp = self.in_res.view(chip, n, ic_base + ic0, ict, r0, rows)
        else:
            inp = make_tile(chip, offs[0], (1, ict, rows, cols.in_n), self.ctx.prec)
        if self.w_res:
            wt = self.w_tile.sub_channels(c0, ct, chip)
            kk = geo.kh * geo.kw
            wt = LTile(wt.addr + ic0 * kk * self.ctx.prec.bytes, (1, ct, 1, self._weight_elems(ict)), wt.prec,
                       wt.strides, wt.mode)
        else:
            wt = make_tile(chip, offs[1], (1, ct, 1, self._weight_elems(ict)), self.ctx.prec, compact=True)
        bias = self.bias_tile.sub_channels(oc_base + c0, ct, chip) if (self.bias is not None and k == 0) else None
        em.layer = self.node.name
        for c_off, count, (piece,) in lane_group_pieces([out], chip):
            sub = (lambda t: t) if count == ct else (lambda t: t.sub_channels(c_off, count, chip))  # noqa: E731
            em.tiu(self._conv(piece, inp, sub(wt), bias if bias is None else sub(bias), (up, dn, cols.lf, cols.rt),
                              first=(k == 0), last=(k == len(ic_steps) - 1)))
        if k == len(ic_steps) - 1:
            self._finish_tile(out, out_offs, n, oc_base + c0, ct, h0, ht, split, pool, cols)

    def _conv(self, out: LTile, inp: LTile, wt: LTile, bias: LTile | None, pads: tuple[int, int, int, int],
              first: bool, last: bool) -> ConvTiu:
        """One conv instruction; `pads` (up, down, left, right) of this tile's input window."""
        geo = self.geom
        f = out.fields("res0", with_shape=True)
        f.update(inp.fields("opd0"))
        f.update(opd0_c=inp.c, opd0_h=inp.h, opd0_w=inp.w, opd1_addr=wt.addr, opd1_h=geo.kh, opd1_w=geo.kw,
                 opt_opd1_prec=int(wt.prec))
        if bias is not None:
            f.update(opd2_addr=bias.addr, opt_opd2_const=0, opt_opd2_prec=int(Prec.FP32))
        relu = last and self.fused_relu
        up, dn, lf, rt = pads
        return ConvTiu(**f, opd0_up_pad=up, opd0_dn_pad=dn, opd0_lf_pad=lf, opd0_rt_pad=rt,
                       res_op_x_str=geo.sx, res_op_y_str=geo.sy, opd1_x_ins0=geo.dx - 1, opd1_y_ins0=geo.dy - 1,
                       opt_res_add=0 if first else 1, opt_relu=int(relu), weight_ic_block=self.ic_block)

    def _finish_tile(self, out: LTile, out_offs, n, c0, ct, h0, ht, split: bool, pool, cols: ColumnWindow) -> None:
        em = self.ctx.em
        window = lambda res: res.view(self.chip, n, c0, ct, h0, ht)      # noqa: E731
        value = self.epi.apply(out, out_offs[1:], c0, 0, window) if not self.epi.empty else out
        if pool is not None:
            self._pool_and_store(value, out_offs[-1], n, c0, ct, pool, cols)
            return
        if self._stage(split):
            if self.out_res is not None:
                stage = self.out_res.view(self.chip, n, c0, ct, h0, ht)
            else:
                stage = make_tile(self.chip, out_offs[-1], value.shape, self.ctx.prec)
            em.layer = self.group.nodes[-1].name
            em.ar("copy", stage, value)
            value = stage
        if self.out_res is not None:
            return
        em.layer = self.group.nodes[-1].name
        em.store(value, self._output_region(self.result, n, c0, ct, h0, ht, cols))

    def _pool_and_store(self, value: LTile, offset: int, n, c0, ct, pool, cols: ColumnWindow) -> None:
        """The fused pooling over the conv tile in LMEM, then the store of the pooled rows."""
        q0, qt, up, dn = pool
        pg, em, prec = self.pgeom, self.ctx.em, self.ctx.prec
        if self.out_res is not None:
            out = self.out_res.view(self.chip, n, c0, ct, q0, qt)
        else:
            out = make_tile(self.chip, offset, (1, ct, qt, cols.out_n), prec)
        src = value          # whole rows (aligned, as sPorD reads them): columns past the windows are not read
        op = "maxpooling" if self.pool.op_type == "MaxPool" else "avgpooling"
        extra = pool_scale_fields(op, src.prec, 1.0 / (pg.kh * pg.kw))
        em.layer = self.pool.name
        emit_pord(em, self.chip, out, src, op=op, opd0_h=value.h, opd0_w=value.w,
                  opd1_h=pg.kh, opd1_w=pg.kw, opd0_up_pad=up, opd0_dn_pad=dn, opd0_lf_pad=cols.pool_lf,
                  opd0_rt_pad=cols.pool_rt, res_op_x_str=pg.sx, res_op_y_str=pg.sy, opd1_x_ins0=pg.dx - 1,
                  opd1_y_ins0=pg.dy - 1, **extra)
        if self.out_res is not None:
            return
        base = ((n * pg.cin + c0) * pg.ho + q0) * pg.wo + cols.out0
        em.store(out, self.ctx.region(self.result, (1, ct, qt, cols.out_n), base,
                                      (pg.cin * pg.ho * pg.wo, pg.ho * pg.wo, pg.wo, 1)))

    # ------------------------------------------------------------ depthwise
    def _plan_depthwise(self, arena) -> dict | None:
        geo, chip, ctx = self.geom, self.chip, self.ctx
        prec = ctx.prec
        res_sizes = [] if self.held else self._depthwise_resident_sizes()
        lanes = chip.lanes

        def sizes(ct, ht, wt):
            in_w, conv_w, _ = window_widths(geo, None, wt)
            out_shape = (1, ct, ht, conv_w)
            s = [0 if self.in_res else tile_bytes_per_lane(chip, (1, ct, geo.halo_rows(ht), in_w), prec),
                 0 if self._direct(False) else tile_bytes_per_lane(chip, out_shape, self._out_prec(False))]
            s += self.epi.set_sizes(out_shape)
            if self._stage(False):
                s.append(0 if self.out_res else tile_bytes_per_lane(chip, out_shape, prec))
            return s

        row_lo, row_hi = self._row_range()
        height = row_hi - row_lo
        c_opts = sorted({min(geo.cout, lanes * k) for k in range(1, -(-geo.cout // lanes) + 1)}, reverse=True)
        h_opts = row_options(height)
        options = ((wt, next(((ct, ht) for ct in c_opts for ht in h_opts if arena.fits(res_sizes + sizes(ct, ht, wt) * 2)),
                             None)) for wt in self._width_options())
        wt, choice = narrowest_read(options, lambda wt, c: read_amplification(geo, c[1], wt))
        if choice is None:
            return None
        ct, ht = choice
        ht = ht if self._no_row_traffic() or wt is not None else _pipelined_rows(ht, height, geo.wo)
        names = ["input", "conv_out"] + self.epi.set_names() + (["stored"] if self._stage(False) else [])
        res_names = [] if self.held else ["bias", "weights"] + self.epi.resident_names()
        res, sets = arena.alloc_plan(res_sizes, sizes(ct, ht, wt), self.node.name, names=(res_names, names))
        if self.held:
            res = self._held_offsets(self._depthwise_resident_sizes(), self.ic_block)
            if res is None:
                return None
        return dict(depthwise=True, ct=ct, ht=ht, ict=geo.cin, w_res=True, ic_block=self.ic_block,
                    residents=tuple(res), sets=tuple(tuple(x) for x in sets), load_count=1, wt=wt)

    def _depthwise_resident_sizes(self) -> list[int]:
        geo, chip = self.geom, self.chip
        return ([tile_bytes_per_lane(chip, (1, geo.cout, 1, 1), Prec.FP32, compact=True),
                 tile_bytes_per_lane(chip, (1, geo.cout, 1, geo.kh * geo.kw), self.ctx.prec, compact=True)]
                + self.epi.resident_sizes(geo.cout, geo.wo))

    def _emit_depthwise(self, plan: ConvPlan) -> None:
        geo, chip, ctx = self.geom, self.chip, self.ctx
        prec, kk = ctx.prec, geo.kh * geo.kw
        ct, ht, res, sets = plan.ct, plan.ht, plan.residents, plan.sets
        row_lo, row_hi = self._row_range()
        bias_tile = make_tile(chip, res[0], (1, geo.cout, 1, 1), Prec.FP32, compact=True)
        w_tile = make_tile(chip, res[1], (1, geo.cout, 1, kk), prec, compact=True)
        if self._loads_constants():
            ctx.load_const_channels(w_tile, f"dww:{self.node.name}", self.weights.reshape(geo.cout, kk), prec)
        if self.bias is not None and self._loads_constants():
            ctx.load_const_channels(bias_tile, f"bias:{self.node.name}", self.bias.reshape(-1, 1), Prec.FP32)
        self.epi.load_residents(list(res[2:]), geo.cout, geo.wo, self._loads_constants())
        windows = column_windows(geo, None, plan.wt)
        tiles = [(n, c0, c, h0, h, cols) for n in ctx.samples_to_emit(geo.n)
                 for c0, c in steps_between(*self.cout_range, ct) for h0, h in steps_between(row_lo, row_hi, ht)
                 for cols in windows]

        def load(t, s):
            n, c0, c, h0, h, cols = t
            r0, rows, _, _ = geo.input_rows(h0, h)
            ctx.em.layer = self.node.name
            if self.in_res is None:
                ctx.em.load(make_tile(chip, sets[s][0], (1, c, rows, cols.in_n), prec),
                            self._input_region(n, c0, c, r0, rows, cols))
            if self.epi.full:
                self.epi.load_tile(sets[s][2:], (1, c, h, cols.conv_n),
                                   lambda addr: self._epi_region(addr, n, c0, c, h0, h, cols))

        def compute(t, s):
            n, c0, c, h0, h, cols = t
            r0, rows, up, dn = geo.input_rows(h0, h)
            if self._direct(False):
                out = self.out_res.view(chip, n, c0, c, h0, h)
            else:
                out = make_tile(chip, sets[s][1], (1, c, h, cols.conv_n), self._out_prec(False))
            if self.in_res is not None:
                inp = self.in_res.view(chip, n, c0, c, r0, rows)
            else:
                inp = make_tile(chip, sets[s][0], (1, c, rows, cols.in_n), prec)
            per_channel = {"opd1": w_tile.sub_channels(c0, c, chip)}
            extra = {}
            if self.bias is not None:
                per_channel["opd2"] = bias_tile.sub_channels(c0, c, chip)
                extra = {"opt_opd2_const": 0}
            ctx.em.layer = self.node.name
            emit_pord(ctx.em, chip, out, inp, per_channel, op="depthwise", opd0_h=rows, opd0_w=inp.w,
                      opd1_h=geo.kh, opd1_w=geo.kw, opt_opd1_const=0, opt_opd1_prec=int(prec),
                      opt_relu=int(self.fused_relu),
                      opd0_up_pad=up, opd0_dn_pad=dn, opd0_lf_pad=cols.lf, opd0_rt_pad=cols.rt,
                      res_op_x_str=geo.sx, res_op_y_str=geo.sy, opd1_x_ins0=geo.dx - 1,
                      opd1_y_ins0=geo.dy - 1, **extra)
            self._finish_tile(out, sets[s][1:], n, c0, c, h0, h, False, None, cols)

        pipelined(tiles, len(sets), load, compute)
