"""Data movement as GDMA DDR -> DDR transfers: Transpose, Concat, Split, Slice, Gather (constant
indices; runtime ones in ops/gather.py), Pad, Resize, Expand, Cast, and copies for views that must
own their buffer (innermost-axis moves go through LMEM, ops/lmem_move.py). MoveEmitter follows
the emitter protocol (lowering.emitplan): plan(region) picks a node's path (DDR -> DDR DMAs, or
through LMEM with its blocks and buffers) and emit(plan) emits that path."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tpuflow.errors import LoweringError
from tpuflow.isa import Prec
from tpuflow.lowering.context import LowerCtx
from tpuflow.lowering.emitplan import FrozenPlan, NoBuffersPlan, no_buffers
from tpuflow.lowering.groups import Group
from tpuflow.lowering.lmem import GroupArena
from tpuflow.lowering.ops import lmem_move
from tpuflow.lowering.ops.gather import GatherTiling, gather_rows, plan_gather, runtime_gather
from tpuflow.lowering.ops.lmem_move import LmemTiling
from tpuflow.lowering.tensors import DRegion

MAX_DIM = 65535


def contiguous_strides(shape) -> tuple[int, ...]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


def merge_dims(shape, src_st, dst_st):
    """Drop size-1 dims and merge neighbours that are contiguous on both sides."""
    dims = [(s, a, b) for s, a, b in zip(shape, src_st, dst_st) if s != 1]
    merged: list[list[int]] = []
    for s, a, b in dims:
        if merged and merged[-1][1] == a * s and merged[-1][2] == b * s:
            merged[-1] = [merged[-1][0] * s, a, b]
        else:
            merged.append([s, a, b])
    return merged or [[1, 1, 1]]


def _split_dim(dims):
    """Cut dims whose size exceeds the 16-bit DMA size field into (outer, inner) pairs."""
    out = []
    for s, a, b in dims:
        if s <= MAX_DIM:
            out.append([s, a, b])
            continue
        inner = next((f for f in range(MAX_DIM, 0, -1) if s % f == 0), 1)
        out += [[s // inner, a * inner, b * inner], [inner, a, b]]
    return out


def copy_nd(ctx: LowerCtx, src_addr: int, src_st, dst_addr: int, dst_st, shape, prec: Prec) -> None:
    """dst[i] = src[i] over an N-d index space with element strides on both sides."""
    dims = merge_dims(shape, src_st, dst_st)
    if len(dims) == 1 and dims[0][1] == 1 and dims[0][2] == 1:
        ctx.em.general_copy(dst_addr, src_addr, dims[0][0], prec)
        return
    dims = _split_dim(dims)
    if len(dims) <= 4:
        dims = [[1, 0, 0]] * (4 - len(dims)) + dims
        shape4 = tuple(d[0] for d in dims)
        ctx.em.region_copy(DRegion(dst_addr, shape4, tuple(d[2] for d in dims), prec),
                        DRegion(src_addr, shape4, tuple(d[1] for d in dims), prec))
        return
    (s, a, b), rest = dims[0], dims[1:]
    for i in range(s):
        copy_nd(ctx, src_addr + i * a * prec.bytes, [d[1] for d in rest], dst_addr + i * b * prec.bytes,
                [d[2] for d in rest], [d[0] for d in rest], prec)


def fill_nd(ctx: LowerCtx, addr: int, strides, shape, prec: Prec, value: float) -> None:
    """Every element of a strided N-d DDR region set to `value` (GDMA constant fills)."""
    dims = _split_dim(merge_dims(shape, strides, strides))
    if len(dims) > 4:
        (s, a, _), rest = dims[0], dims[1:]
        for i in range(s):
            fill_nd(ctx, addr + i * a * prec.bytes, [d[1] for d in rest], [d[0] for d in rest], prec, value)
        return
    dims = [[1, 0, 0]] * (4 - len(dims)) + dims
    ctx.em.fill(DRegion(addr, tuple(d[0] for d in dims), tuple(d[1] for d in dims), prec), value)


@dataclass(frozen=True)
class MovePlan(FrozenPlan):
    """A movement through LMEM: the tiling of its path (lmem_move / gather; its class names the
    path where a node has two). A movement with no LMEM path (DDR -> DDR DMAs only) plans a
    NoBuffersPlan."""

    tiling: LmemTiling


NO_ROOM = object()          # a planner's answer when the node's LMEM path does not fit and it has no other


class MoveEmitter:
    """Plans (_plan_<op>: None for the DDR -> DDR path, an LmemTiling, or NO_ROOM) and emits
    (_emit_<op>(tiling)) one movement node."""

    def __init__(self, ctx: LowerCtx, group: Group):
        self.ctx, self.group = ctx, group
        self.node = group.anchor
        self.prec = ctx.prec

    def shape(self, tensor: str) -> tuple[int, ...]:
        return self.ctx.graph.tensor(tensor).shape

    def src_addr(self, tensor: str) -> int:
        info = self.ctx.graph.tensor(tensor)
        if info.const is not None:
            return self.ctx.const_addr(f"move:{tensor}", np.asarray(info.const))
        return self.ctx.ddr_addr(tensor)

    def _handler(self, kind: str):
        op = self.node.op_type.lower()
        if getattr(self, f"_emit_{op}", None) is None:
            raise LoweringError(f"node {self.node.name}: no lowering for {self.node.op_type} with these operand shapes")
        return getattr(self, f"_{kind}_{op}", None)

    def plan(self, region: str) -> FrozenPlan | None:
        """The node's path and, for a path through LMEM, its tiling in `region` (None: it has only
        that path and it does not fit)."""
        planner = self._handler("plan")
        arena = self.ctx.planning_arena(region)
        tiling = planner(arena) if planner is not None else None
        if tiling is NO_ROOM:
            return None
        if tiling is None:
            return no_buffers(self.ctx, region)
        return MovePlan(region, self.ctx.window(region), tuple(arena.names), tiling)

    def misfit(self) -> str:
        return f"no block of {self.node.op_type} {self.node.name} fits LMEM"

    def emit(self, plan: FrozenPlan) -> None:
        self.ctx.em.layer = self.node.name
        self._handler("emit")(getattr(plan, "tiling", None))
        self.ctx.note_layer(self.node.name, self.node.op_type, lmem_peak=plan.peak, group=self.group.name)

    def _copy_whole(self, src: str, dst: str) -> None:
        shape = self.shape(dst)
        copy_nd(self.ctx, self.src_addr(src), contiguous_strides(shape), self.ctx.ddr_addr(dst),
                contiguous_strides(shape), shape, self.prec)

    def _emit_cast(self, tiling: None) -> None:
        self._copy_whole(self.node.inputs[0], self.node.outputs[0])

    _emit_identity = _emit_reshape = _emit_cast

    # ------------------------------------------------------------------ Transpose

    def _transpose_dims(self):
        x, y = self.node.inputs[0], self.node.outputs[0]
        perm = self.node.attr("perm")
        in_st = contiguous_strides(self.shape(x))
        out_shape = self.shape(y)
        src_st, dst_st = [in_st[p] for p in perm], contiguous_strides(out_shape)
        return out_shape, src_st, dst_st, lmem_move.as_batched_transpose(merge_dims(out_shape, src_st, dst_st))

    def _plan_transpose(self, arena: GroupArena):
        batched = self._transpose_dims()[3]
        if batched is None:
            return None
        tiling = lmem_move.plan_batched_transpose(arena, *batched, self.prec)
        return NO_ROOM if tiling is None else tiling

    def _emit_transpose(self, tiling: lmem_move.TransposeTiling | None) -> None:
        x, y = self.node.inputs[0], self.node.outputs[0]
        out_shape, src_st, dst_st, batched = self._transpose_dims()
        if tiling is not None:          # the innermost axis moves: through LMEM, long DMA runs
            lmem_move.emit_batched_transpose(self.ctx, tiling, self.src_addr(x), self.ctx.ddr_addr(y), *batched,
                                             self.prec)
            return
        copy_nd(self.ctx, self.src_addr(x), src_st, self.ctx.ddr_addr(y), dst_st, out_shape, self.prec)

    # ------------------------------------------------------------------ Concat, Split

    def _row_widths(self, whole: str, pieces, axis: int) -> tuple[int, list[int]] | None:
        """(rows, widths) of a concat / split along `axis` whose pieces are short runs (e.g. along
        a small innermost axis), rows interleaved in LMEM; None when it is not one."""
        shape = self.shape(whole)
        rows, inner = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
        widths = [self.shape(t)[axis] * inner for t in pieces]
        if rows <= 1 or min(widths) * self.prec.bytes >= lmem_move.SHORT_RUN_BYTES or sum(widths) > lmem_move.MAX_DMA:
            return None
        return rows, widths

    def _plan_rows(self, arena: GroupArena, whole: str, pieces, plan_path):
        """The tiling of a concat / split through LMEM when it is one and its smallest blocks fit."""
        found = self._row_widths(whole, pieces, self.node.attr("axis"))
        if found is None:
            return None
        rows, widths = found
        if not lmem_move.fits(arena, [(1, 1, 1, w) for w in widths] + [(1, 1, 1, sum(widths))], self.prec):
            return None
        return plan_path(arena, rows, widths, self.prec)

    def _plan_concat(self, arena: GroupArena):
        return self._plan_rows(arena, self.node.outputs[0], self.node.inputs, lmem_move.plan_interleave)

    def _emit_concat(self, tiling: lmem_move.RowTiling | None) -> None:
        y = self.node.outputs[0]
        axis = self.node.attr("axis")
        out_st = contiguous_strides(self.shape(y))
        if tiling is not None:
            rows, widths = self._row_widths(y, self.node.inputs, axis)
            srcs = [(self.src_addr(x), w) for x, w in zip(self.node.inputs, widths)]
            lmem_move.interleave_rows(self.ctx, tiling, srcs, self.ctx.ddr_addr(y), rows, self.prec)
            return
        offset = 0
        for x in self.node.inputs:
            shape = self.shape(x)
            dst = self.ctx.ddr_addr(y) + offset * out_st[axis] * self.prec.bytes
            offset += shape[axis]
            src = self.src_addr(x)
            if src == dst:
                continue                      # its producer wrote it in place (ddrplan)
            copy_nd(self.ctx, src, contiguous_strides(shape), dst, out_st, shape, self.prec)

    def _plan_split(self, arena: GroupArena):
        return self._plan_rows(arena, self.node.inputs[0], self.node.outputs, lmem_move.plan_deinterleave)

    def _emit_split(self, tiling: lmem_move.RowTiling | None) -> None:
        x = self.node.inputs[0]
        axis = self.node.attr("axis")
        in_st = contiguous_strides(self.shape(x))
        if tiling is not None:          # a split into short runs de-interleaves rows in LMEM
            rows, widths = self._row_widths(x, self.node.outputs, axis)
            dsts = [(self.ctx.ddr_addr(y), w) for y, w in zip(self.node.outputs, widths)]
            lmem_move.deinterleave_rows(self.ctx, tiling, self.src_addr(x), dsts, rows, self.prec)
            return
        offset = 0
        for y in self.node.outputs:
            shape = self.shape(y)
            copy_nd(self.ctx, self.src_addr(x) + offset * in_st[axis] * self.prec.bytes, in_st,
                    self.ctx.ddr_addr(y), contiguous_strides(shape), shape, self.prec)
            offset += shape[axis]

    # ------------------------------------------------------------------ Slice

    def _slice_dims(self):
        """(element offset of the first element, src strides, dst strides, out shape, strided rows
        geometry or None)."""
        x, y = self.node.inputs[0], self.node.outputs[0]
        in_st = contiguous_strides(self.shape(x))
        starts, steps_ = self.node.attr("starts"), self.node.attr("steps")
        if any(s < 0 for s in steps_):
            raise LoweringError(f"node {self.node.name}: negative Slice steps are not supported")
        base = sum(s * st for s, st in zip(starts, in_st))
        out_shape = self.shape(y)
        src_st, dst_st = [st * k for st, k in zip(in_st, steps_)], contiguous_strides(out_shape)
        return base, src_st, dst_st, out_shape, lmem_move.as_strided_rows(merge_dims(out_shape, src_st, dst_st), self.prec)

    def _plan_slice(self, arena: GroupArena):
        strided = self._slice_dims()[4]
        if strided is None or not lmem_move.fits(arena, lmem_move.strided_min_tiles(strided[1]), self.prec):
            return None
        return lmem_move.plan_strided_rows(arena, strided[1], self.prec)

    def _emit_slice(self, tiling: lmem_move.RowTiling | None) -> None:
        x, y = self.node.inputs[0], self.node.outputs[0]
        base, src_st, dst_st, out_shape, strided = self._slice_dims()
        src = self.src_addr(x) + base * self.prec.bytes
        if tiling is not None:           # every step-th element of the innermost axis: via LMEM
            lmem_move.emit_strided_rows(self.ctx, tiling, src, self.ctx.ddr_addr(y), *strided, self.prec)
            return
        copy_nd(self.ctx, src, src_st, self.ctx.ddr_addr(y), dst_st, out_shape, self.prec)

    # ------------------------------------------------------------------ Gather

    def _plan_gather(self, arena: GroupArena):
        if self.ctx.graph.tensor(self.node.inputs[1]).is_const:
            return None
        tiling = plan_gather(arena, self.node.name, runtime_gather(self.ctx, self.node), self.prec)
        return NO_ROOM if tiling is None else tiling

    def _emit_gather(self, tiling: GatherTiling | None) -> None:
        x, idx_name = self.node.inputs[0], self.node.inputs[1]
        if tiling is not None:          # runtime indices
            gather_rows(self.ctx, tiling, self.src_addr(x), runtime_gather(self.ctx, self.node),
                        self.ctx.ddr_addr(idx_name), self.ctx.ddr_addr(self.node.outputs[0]))
            return
        y = self.node.outputs[0]
        axis = self.node.attr("axis", 0)
        x_shape = self.shape(x)
        idx = np.asarray(self.ctx.const(idx_name)).reshape(-1).astype(np.int64)
        idx = np.where(idx < 0, idx + x_shape[axis], idx)
        outer, inner = math.prod(x_shape[:axis]), math.prod(x_shape[axis + 1:])
        count = len(idx)
        pos = 0
        while pos < count:
            run = 1
            while pos + run < count and idx[pos + run] == idx[pos] + run:
                run += 1
            src = self.src_addr(x) + int(idx[pos]) * inner * self.prec.bytes
            dst = self.ctx.ddr_addr(y) + pos * inner * self.prec.bytes
            copy_nd(self.ctx, src, (x_shape[axis] * inner, 1), dst, (count * inner, 1), (outer, run * inner), self.prec)
            pos += run

    # ------------------------------------------------------------------ Pad

    def _pad_geometry(self):
        """(channels, rows, width, padded width) of the planes the last axis's pads are applied to in
        LMEM, or None when the last axis has no pads (or the tensor is 1-D)."""
        x, y = self.node.inputs[0], self.node.outputs[0]
        in_shape, out_shape, pads = self.shape(x), self.shape(y), self.node.attr("pads")
        rank = len(out_shape)
        if rank < 2 or not (pads[rank - 1] or pads[2 * rank - 1]):
            return None
        return in_shape[-3] if rank >= 3 else 1, in_shape[-2], in_shape[-1], out_shape[-1]

    def _plan_pad(self, arena: GroupArena):
        geometry = self._pad_geometry()
        if geometry is None:
            return None
        channels, h, w, wo = geometry
        planes = min(channels, self.ctx.chip.lanes)
        if not lmem_move.fits(arena, [(1, planes, 1, w), (1, planes, 1, wo)], self.prec):
            return None
        return lmem_move.plan_pad(arena, channels, h, w, wo, self.prec)

    def _emit_pad(self, tiling: lmem_move.PlaneTiling | None) -> None:
        x, y = self.node.inputs[0], self.node.outputs[0]
        pads = self.node.attr("pads")
        value = float(self.node.attr("value", 0.0))
        self._pad_from_inside(x, y, pads, self.node.attr("mode", "constant"), value, tiling)

    def _pad_from_inside(self, x: str, y: str, pads, mode: str, value: float, tiling) -> None:
        """The input into the middle (with the last axis's pads, through LMEM, when it has a
        tiling), then axis by axis (innermost first) each pad slab filled with `value` (constant),
        or copied from the output position it mirrors (reflect) or repeats (edge); a slab spans the
        padded extent of the inner axes and the interior of the outer ones."""
        in_shape, out_shape = self.shape(x), self.shape(y)
        rank = len(out_shape)
        out_st = contiguous_strides(out_shape)
        dst, b = self.ctx.ddr_addr(y), self.prec.bytes
        base = sum(pads[i] * out_st[i] for i in range(rank))
        first = rank - 1
        if tiling is not None:
            self._pad_rows_in_lmem(x, y, pads, mode, base, value, tiling)    # the interior and the last axis's pads
            first = rank - 2
        else:
            copy_nd(self.ctx, self.src_addr(x), contiguous_strides(in_shape), dst + base * b, out_st, in_shape, self.prec)
        for axis in range(first, -1, -1):
            begin, end, d = pads[axis], pads[rank + axis], in_shape[axis]
            slab = [in_shape[j] if j < axis else out_shape[j] for j in range(rank)]
            slab[axis] = 1
            outer = sum(pads[j] * out_st[j] for j in range(axis))
            if mode == "constant":
                for start, count in ((0, begin), (begin + d, end)):
                    if count:
                        slab[axis] = count
                        fill_nd(self.ctx, dst + (outer + start * out_st[axis]) * b, out_st, slab, self.prec, value)
                continue
            for o in list(range(begin)) + list(range(begin + d, begin + d + end)):
                i = o - begin
                if mode == "reflect":
                    src_i = -i if i < 0 else 2 * (d - 1) - i
                else:
                    src_i = min(max(i, 0), d - 1)
                src = dst + (outer + (begin + src_i) * out_st[axis]) * b
                copy_nd(self.ctx, src, out_st, dst + (outer + o * out_st[axis]) * b, out_st, slab, self.prec)

    def _pad_rows_in_lmem(self, x: str, y: str, pads, mode: str, base: int, value: float,
                          tiling: lmem_move.PlaneTiling) -> None:
        """The input's rows padded along the last axis in LMEM and stored at their padded place
        (`base`: the interior's first element)."""
        in_shape, out_shape = self.shape(x), self.shape(y)
        rank = len(in_shape)
        out_st = contiguous_strides(out_shape)
        h, w = in_shape[-2], in_shape[-1]
        channels = in_shape[-3] if rank >= 3 else 1
        plane_stride = out_st[-3] if rank >= 3 else 0
        lead = [[d, hw, o] for d, hw, o in zip(in_shape[:-3], contiguous_strides(in_shape)[:-3], out_st[:-3])]
        for s_off, d_off in lmem_move._outer_offsets(lead):
            lmem_move.pad_last_axis(self.ctx, tiling, self.src_addr(x) + s_off * self.prec.bytes,
                                    self.ctx.ddr_addr(y) + (base - pads[rank - 1] + d_off) * self.prec.bytes, channels, h, w,
                                    pads[rank - 1], pads[2 * rank - 1], mode, plane_stride, out_st[-2], self.prec,
                                    value)

    # ------------------------------------------------------------------ Resize, Resample, Expand, ScatterND

    def _resize_geometry(self) -> tuple[int, int, int, int, int]:
        """(planes, h, w, rh, rw) of a nearest upsampling by integer repeats of the last two axes."""
        repeats = tuple(self.node.attr("repeats"))
        in_shape = self.shape(self.node.inputs[0])
        if any(r != 1 for r in repeats[:-2]):
            raise LoweringError(f"node {self.node.name}: Resize repeats {repeats} on a leading axis")
        return math.prod(in_shape[:-2]), in_shape[-2], in_shape[-1], repeats[-2], repeats[-1]

    def _plan_resize(self, arena: GroupArena):
        rows, h, w, rh, rw = self._resize_geometry()
        lanes = min(rows, self.ctx.chip.lanes)
        if not lmem_move.fits(arena, [(1, lanes, 1, w), (1, lanes, rh, w * rw)], self.prec):
            return None
        return lmem_move.plan_upsample(arena, rows, h, w, rh, rw, self.prec)

    def _emit_resize(self, tiling: lmem_move.PlaneTiling | None) -> None:
        """Nearest-neighbour upsampling by integer repeats of the last two axes (lmem_move)."""
        x, y = self.node.inputs[0], self.node.outputs[0]
        rows, h, w, rh, rw = self._resize_geometry()
        if tiling is None:
            # rows too long for LMEM: a stride-0 DMA repeats every element (element-granular, slow)
            copy_nd(self.ctx, self.src_addr(x), (h * w, w, 0, 1, 0), self.ctx.ddr_addr(y),
                    contiguous_strides((rows, h, rh, w, rw)), (rows, h, rh, w, rw), self.prec)
            return
        lmem_move.upsample_nearest(self.ctx, tiling, self.src_addr(x), self.ctx.ddr_addr(y), rows, h, w, rh, rw,
                                   self.prec)

    def _emit_scatternd(self, tiling: None) -> None:
        """data copied to the output, then each run of consecutive update rows copied over its rows."""
        data, updates = self.node.inputs
        y = self.node.outputs[0]
        rows = list(self.node.attr("rows"))
        inner = math.prod(self.shape(updates)) // len(rows) if rows else 0
        self._copy_whole(data, y)
        dst, src, b = self.ctx.ddr_addr(y), self.src_addr(updates), self.prec.bytes
        i = 0
        while i < len(rows):
            run = 1
            while i + run < len(rows) and rows[i + run] == rows[i] + run:
                run += 1
            copy_nd(self.ctx, src + i * inner * b, (1,), dst + rows[i] * inner * b, (1,), (run * inner,), self.prec)
            i += run

    def _resample_geometry(self):
        """(planes, along the last axis, input length, taps, other) of a two-tap interpolation."""
        axis, taps = self.node.attr("axis"), self.node.attr("taps")
        in_shape = self.shape(self.node.inputs[0])
        rank = len(in_shape)
        if axis == rank - 1:
            return math.prod(in_shape[:-1]), True, in_shape[axis], taps, 1
        return math.prod(in_shape[:axis]), False, in_shape[axis], taps, math.prod(in_shape[axis + 1:])

    def _plan_resample(self, arena: GroupArena):
        planes, last, n_in, taps, other = self._resample_geometry()
        tiling = lmem_move.plan_interpolation(arena, planes, last, n_in, len(taps), other, taps, self.prec)
        return NO_ROOM if tiling is None else tiling

    def _emit_resample(self, tiling: lmem_move.RowTiling) -> None:
        """Two-tap interpolation along one of the last two axes (lmem_move.interpolate_axis)."""
        planes, last, n_in, taps, other = self._resample_geometry()
        lmem_move.interpolate_axis(self.ctx, tiling, self.src_addr(self.node.inputs[0]),
                                   self.ctx.ddr_addr(self.node.outputs[0]), planes, last, n_in, len(taps), other, taps,
                                   self.prec)

    def _expand_dims(self):
        """(src strides, dst strides, merged dims) of the broadcast copy."""
        out_shape = self.shape(self.node.outputs[0])
        x_shape = self.shape(self.node.inputs[0])
        in_shape = (1,) * (len(out_shape) - len(x_shape)) + tuple(x_shape)
        in_st = contiguous_strides(in_shape)
        src_st = [0 if d == 1 and o != 1 else s for d, o, s in zip(in_shape, out_shape, in_st)]
        dst_st = contiguous_strides(out_shape)
        return src_st, dst_st, merge_dims(out_shape, src_st, dst_st)

    def _plan_expand(self, arena: GroupArena):
        """Each element repeated along the innermost axis: rows replicated in LMEM (stride-0 TIU
        copies, a PlaneTiling); whole rows repeated: the row read once, its repeats written from
        LMEM (an LmemTiling of one buffer); else plain DMAs (None)."""
        dims = self._expand_dims()[2]
        if len(dims) >= 2 and dims[-1][1:] == [0, 1] and dims[-2][1] == 1 and dims[-2][2] == dims[-1][0]:
            rows, width = dims[-2][0], dims[-1][0]
            lanes = min(rows, self.ctx.chip.lanes)
            if lmem_move.fits(arena, [(1, lanes, 1, 1), (1, lanes, 1, width)], self.prec):
                return lmem_move.plan_upsample(arena, rows, 1, 1, 1, width, self.prec)
        if len(dims) >= 2 and dims[-1][1:] == [1, 1] and dims[-2][1] == 0 and dims[-2][2] == dims[-1][0] \
                and lmem_move.fits(arena, [(1, 1, 1, dims[-1][0])], self.prec):
            return lmem_move.plan_replicate_row(arena, dims[-1][0], self.prec)
        return None

    def _emit_expand(self, tiling: lmem_move.LmemTiling | None) -> None:
        x, y = self.node.inputs[0], self.node.outputs[0]
        src_st, dst_st, dims = self._expand_dims()
        b = self.prec.bytes
        if isinstance(tiling, lmem_move.PlaneTiling):
            rows, width = dims[-2][0], dims[-1][0]
            for s_off, d_off in lmem_move._outer_offsets(dims[:-2]):
                lmem_move.upsample_nearest(self.ctx, tiling, self.src_addr(x) + s_off * b, self.ctx.ddr_addr(y) + d_off * b,
                                           rows, 1, 1, 1, width, self.prec)
            return
        if tiling is not None:
            for s_off, d_off in lmem_move._outer_offsets(dims[:-2]):
                lmem_move.replicate_row(self.ctx, tiling, self.src_addr(x) + s_off * b, self.ctx.ddr_addr(y) + d_off * b,
                                        dims[-2][0], dims[-1][0], self.prec)
            return
        copy_nd(self.ctx, self.src_addr(x), src_st, self.ctx.ddr_addr(y), dst_st, self.shape(y), self.prec)


class ViewEmitter:
    """Reshape views cost nothing; one that must own its buffer (a graph output) is copied."""

    def __init__(self, ctx: LowerCtx, group: Group):
        self.ctx, self.group = ctx, group

    def plan(self, region: str) -> NoBuffersPlan:
        return no_buffers(self.ctx, region)        # at most a DDR -> DDR copy

    def emit(self, plan: NoBuffersPlan) -> None:
        node = self.group.anchor
        src, dst = self.ctx.ddr.tensors[node.inputs[0]], self.ctx.ddr.tensors[node.outputs[0]]
        if src.addr != dst.addr:
            MoveEmitter(self.ctx, self.group)._copy_whole(node.inputs[0], node.outputs[0])
        self.ctx.note_layer(node.name, node.op_type, group=self.group.name)
