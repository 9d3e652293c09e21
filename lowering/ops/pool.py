"""MaxPool / AveragePool on the TIU (pord.maxpooling / avgpooling), tiled over channels and output
rows with halos; average pools whose window counts vary (padding excluded, ceil mode) multiply by
a per-position reciprocal-count map."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tpuflow.errors import LoweringError
from tpuflow.lowering.emitplan import FrozenPlan
from tpuflow.isa import Prec, StrideMode
from tpuflow.lowering.context import LowerCtx
from tpuflow.lowering.emitter import pool_scale_fields
from tpuflow.lowering.groups import Group
from tpuflow.lowering.layergroup import NCHW
from tpuflow.lowering.ops.conv import (ColumnWindow, ConvGeom, _pipelined_rows, column_windows, emit_pord,
                                       narrowest_read, read_amplification, row_options, width_steps)
from tpuflow.lowering.tensors import DRegion, LTile, make_tile, tile_bytes_per_lane
from tpuflow.lowering.tiling import pipelined, steps, steps_between


def pool_geometry(ctx: LowerCtx, node) -> tuple[ConvGeom, int]:
    """The window geometry as a ConvGeom, and how many input columns the windows reach."""
    g = ctx.graph
    n, c, h, w = g.tensor(node.inputs[0]).shape
    _, _, ho, wo = g.tensor(node.outputs[0]).shape
    kh, kw = node.attr("kernel_shape")
    sy, sx = node.attr("strides", (1, 1))
    dy, dx = node.attr("dilations", (1, 1))
    pt, pl, pb, pr = node.attr("pads", (0, 0, 0, 0))
    need_w = (wo - 1) * sx + (kw - 1) * dx + 1 - pl
    geom = ConvGeom(n, c, h, w, c, kh, kw, ho, wo, sy, sx, dy, dx, pt, pl, pb, max(0, need_w - w), 1)
    if max(pt, pl, geom.pr) > 15 or max(sy, sx) > 15:
        raise LoweringError(f"node {node.name}: pool padding exceeds the 4-bit descriptor fields")
    return geom, min(w, need_w)


def count_map(geom: ConvGeom, include_pad: bool) -> np.ndarray:
    """Window element counts per output position (ONNX AveragePool semantics)."""
    def axis(size, out, k, s, d, p0, p1):
        lo, hi = (-p0, size + p1) if include_pad else (0, size)
        starts = np.arange(out) * s - p0
        taps = starts[:, None] + np.arange(k)[None, :] * d
        return ((taps >= lo) & (taps < hi)).sum(axis=1)
    rows = axis(geom.h, geom.ho, geom.kh, geom.sy, geom.dy, geom.pt, geom.pb)
    cols = axis(geom.w, geom.wo, geom.kw, geom.sx, geom.dx, geom.pl, geom.pr)
    return np.outer(rows, cols).astype(np.float32)


@dataclass(frozen=True)
class PoolPlan(FrozenPlan):
    """Channels, output rows and output columns (None: whole rows) per tile; `sets` holds each
    buffer set's offsets (input, output[, inv_count]) — one set, or two that alternate so loads
    overlap compute."""

    ct: int
    ht: int
    sets: tuple[tuple[int, ...], ...]
    wt: int | None = None


class PoolEmitter:
    def __init__(self, ctx: LowerCtx, group: Group):
        self.ctx, self.group, self.chip = ctx, group, ctx.chip
        self.node = group.anchor
        self.geom, self.in_w = pool_geometry(ctx, self.node)
        self.is_max = self.node.op_type == "MaxPool"
        self.inv_count = None
        if not self.is_max:
            counts = count_map(self.geom, bool(self.node.attr("count_include_pad", 0)))
            if np.all(counts == counts.flat[0]):
                self.scale = 1.0 / float(counts.flat[0])
            else:
                self.scale = 1.0
                self.inv_count = 1.0 / counts
        self.in_res = ctx.resident(self.node.inputs[0])      # layer groups: operands kept in LMEM
        self.out_res = ctx.resident(self.node.outputs[0])

    @staticmethod
    def resident_ports(graph, group: Group, chip) -> tuple[dict[str, str], dict[str, str]]:
        return {group.anchor.inputs[0]: NCHW}, {group.anchor.outputs[0]: NCHW}

    def _windows(self, wt: int | None) -> list[ColumnWindow]:
        """The tiles' column windows: every column the windows reach, or `wt` output columns each."""
        geo = self.geom
        if wt is None:
            return [ColumnWindow(0, geo.wo, 0, geo.wo, 0, self.in_w, geo.pl, geo.pr)]
        return column_windows(geo, None, wt)

    def _width_options(self) -> list[int | None]:
        """Whole rows, then (W slicing, operands in DDR) ever narrower column windows."""
        sliceable = self.in_res is None and self.out_res is None
        return [None] + (width_steps(self.geom.wo) if sliceable else [])

    def _sizes(self, ct: int, ht: int, wt: int | None = None) -> list[int]:
        geo, chip, prec = self.geom, self.chip, self.ctx.prec
        in_w, out_w = (self.in_w, geo.wo) if wt is None else (geo.halo_cols(wt), wt)
        s = [0 if self.in_res else tile_bytes_per_lane(chip, (1, ct, geo.halo_rows(ht), in_w), prec),
             0 if self.out_res else tile_bytes_per_lane(chip, (1, ct, ht, out_w), prec)]
        if self.inv_count is not None:
            s.append(tile_bytes_per_lane(chip, (1, chip.lanes, ht, out_w), Prec.FP32))
        return s

    def _buffer_names(self) -> list[str]:
        return ["input", "output"] + (["inv_count"] if self.inv_count is not None else [])

    def plan(self, region: str) -> PoolPlan | None:
        """Channel and row tiles (largest that fit, double-buffered when possible) in `region`."""
        geo, chip, ctx = self.geom, self.chip, self.ctx
        arena = ctx.planning_arena(region)
        row_lo, row_hi = ctx.rows_to_emit(geo.ho)
        height = row_hi - row_lo
        c_opts = sorted({min(geo.cin, chip.lanes * k) for k in range(1, -(-geo.cin // chip.lanes) + 1)}, reverse=True)
        h_opts = row_options(height)
        options = ((wt, next(((ct, ht, copies) for copies in (2, 1) for ct in c_opts for ht in h_opts
                              if arena.fits(self._sizes(ct, ht, wt) * copies)), None))
                   for wt in self._width_options())
        wt, choice = narrowest_read(options, lambda wt, c: read_amplification(geo, c[1], wt))
        if choice is None:
            return None
        in_lmem = self.in_res is not None and self.out_res is not None and self.inv_count is None
        ct, ht, copies = choice
        ht = ht if in_lmem or wt is not None else _pipelined_rows(ht, height, geo.wo)
        _, sets = arena.alloc_plan([], self._sizes(ct, ht, wt), self.node.name, copies,
                                   names=([], self._buffer_names()))
        return PoolPlan(region, ctx.window(region), tuple(arena.names), ct, ht, tuple(tuple(s) for s in sets), wt)

    def misfit(self) -> str:
        return "no tiling of the pool fits LMEM"

    def emit(self, plan: PoolPlan) -> None:
        geo, ctx = self.geom, self.ctx
        row_lo, row_hi = ctx.rows_to_emit(geo.ho)
        if self.inv_count is not None:
            self.map_addr = ctx.const_addr(f"poolcount:{self.node.name}", self.inv_count, Prec.FP32)
        windows = self._windows(plan.wt)
        tiles = [(n, c0, c, h0, h, cols) for n in ctx.samples_to_emit(geo.n) for c0, c in steps(geo.cin, plan.ct)
                 for h0, h in steps_between(row_lo, row_hi, plan.ht) for cols in windows]
        sets = plan.sets
        pipelined(tiles, len(sets), lambda t, s: self._load(t, sets[s]), lambda t, s: self._compute(t, sets[s]))
        ctx.note_layer(self.node.name, self.node.op_type, lmem_peak=plan.peak, group=self.group.name)

    def _load(self, tile, offs) -> None:
        n, c0, c, h0, h, cols = tile
        geo, ctx, prec = self.geom, self.ctx, self.ctx.prec
        r0, rows, _, _ = geo.input_rows(h0, h)
        ctx.em.layer = self.node.name
        base = ((n * geo.cin + c0) * geo.h + r0) * geo.w + cols.in0
        if self.in_res is None:
            src = ctx.region(self.node.inputs[0], (1, c, rows, cols.in_n), base,
                             (geo.cin * geo.h * geo.w, geo.h * geo.w, geo.w, 1))
            ctx.em.load(make_tile(self.chip, offs[0], (1, c, rows, cols.in_n), prec), src)
        if self.inv_count is not None:
            t = make_tile(self.chip, offs[2], (1, min(c, self.chip.lanes), h, cols.out_n), Prec.FP32)
            ctx.em.load(t, DRegion(self.map_addr + (h0 * geo.wo + cols.out0) * 4, t.shape, (0, 0, geo.wo, 1),
                                   Prec.FP32))

    def _compute(self, tile, offs) -> None:
        n, c0, c, h0, h, cols = tile
        geo, ctx, prec, chip = self.geom, self.ctx, self.ctx.prec, self.chip
        r0, rows, up, dn = geo.input_rows(h0, h)
        if self.out_res is not None:
            out = self.out_res.view(chip, n, c0, c, h0, h)
        else:
            out = make_tile(chip, offs[1], (1, c, h, cols.out_n), prec)
        if self.in_res is not None:
            inp = self.in_res.view(chip, n, c0, c, r0, rows, geo.w)   # whole rows (aligned, for sPorD)
        else:
            inp = make_tile(chip, offs[0], (1, c, rows, cols.in_n), prec)
        op = "maxpooling" if self.is_max else "avgpooling"
        extra = pool_scale_fields(op, inp.prec, self.scale if not self.is_max else 1.0)
        ctx.em.layer = self.node.name
        emit_pord(ctx.em, chip, out, inp, op=op, opd0_h=rows, opd0_w=inp.w,
                  opd1_h=geo.kh, opd1_w=geo.kw, opd0_up_pad=up, opd0_dn_pad=dn, opd0_lf_pad=cols.lf,
                  opd0_rt_pad=cols.rt, res_op_x_str=geo.sx, res_op_y_str=geo.sy,
                  opd1_x_ins0=geo.dx - 1, opd1_y_ins0=geo.dy - 1, **extra)
        if self.inv_count is not None:
            m = make_tile(chip, offs[2], (1, min(c, chip.lanes), h, cols.out_n), Prec.FP32)
            ctx.em.ar("mul", out, out, LTile(m.addr, out.shape, Prec.FP32, (0, 0, m.strides[2], 1), StrideMode.FREE))
        if self.out_res is not None:
            return
        base = ((n * geo.cin + c0) * geo.ho + h0) * geo.wo + cols.out0
        ctx.em.store(out, ctx.region(self.node.outputs[0], (1, c, h, cols.out_n), base,
                                     (geo.cin * geo.ho * geo.wo, geo.ho * geo.wo, geo.wo, 1)))
