"""Data movement as GDMA DDR -> DDR transfers: Transpose, Concat, Split, Slice, Gather (constant
indices; runtime ones in ops/gather.py), Pad, Resize, Expand, Cast, and copies for views that must
own their buffer (innermost-axis moves go through LMEM, ops/lmem_move.py)."""

from __future__ import annotations

import math

import numpy as np

from tpuflow.errors import LoweringError
from tpuflow.isa import Prec
from tpuflow.lowering.context import LowerCtx
from tpuflow.lowering.emitplan import NoBuffersPlan, no_buffers
from tpuflow.lowering.groups import Group
from tpuflow.lowering.ops import lmem_move
from tpuflow.lowering.ops.gather import emit_runtime_gather
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


class MoveEmitter:
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

    def emit(self) -> None:
        self.ctx.em.layer = self.node.name
        handler = getattr(self, f"_emit_{self.node.op_type.lower()}", None)
        if handler is None:
            raise LoweringError(f"node {self.node.name}: no lowering for {self.node.op_type} with these operand shapes")
        handler()
        self.ctx.note_layer(self.node.name, self.node.op_type, group=self.group.name)

    def _copy_whole(self, src: str, dst: str) -> None:
        shape = self.shape(dst)
        copy_nd(self.ctx, self.src_addr(src), contiguous_strides(shape), self.ctx.ddr_addr(dst),
                contiguous_strides(shape), shape, self.prec)

    _emit_cast = _emit_identity = _emit_reshape = lambda self: self._copy_whole(self.node.inputs[0], self.node.outputs[0])

    def _emit_transpose(self) -> None:
        x, y = self.node.inputs[0], self.node.outputs[0]
        perm = self.node.attr("perm")
        in_st = contiguous_strides(self.shape(x))
        out_shape = self.shape(y)
        src_st, dst_st = [in_st[p] for p in perm], contiguous_strides(out_shape)
        batched = lmem_move.as_batched_transpose(merge_dims(out_shape, src_st, dst_st))
        if batched is not None:          # the innermost axis moves: through LMEM, long DMA runs
            lmem_move.emit_batched_transpose(self.ctx, self.node.name, self.src_addr(x), self.ctx.ddr_addr(y),
                                             *batched, self.prec)
            return
        copy_nd(self.ctx, self.src_addr(x), src_st, self.ctx.ddr_addr(y), dst_st, out_shape, self.prec)

    def _emit_concat(self) -> None:
        y = self.node.outputs[0]
        axis = self.node.attr("axis")
        out_shape = self.shape(y)
        out_st = contiguous_strides(out_shape)
        if self._concat_through_lmem(axis, out_shape):
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

    def _concat_through_lmem(self, axis: int, out_shape) -> bool:
        """A concat whose pieces are short runs (e.g. along a small innermost axis) interleaves
        rows in LMEM; True when it did."""
        rows = math.prod(out_shape[:axis])
        inner = math.prod(out_shape[axis + 1:])
        widths = [self.shape(x)[axis] * inner for x in self.node.inputs]
        if rows <= 1 or min(widths) * self.prec.bytes >= lmem_move.SHORT_RUN_BYTES:
            return False
        if sum(widths) > lmem_move.MAX_DMA or not lmem_move.fits(
                self.ctx, [(1, 1, 1, w) for w in widths] + [(1, 1, 1, sum(widths))], self.prec):
            return False
        srcs = [(self.src_addr(x), w) for x, w in zip(self.node.inputs, widths)]
        lmem_move.interleave_rows(self.ctx, self.node.name, srcs, self.ctx.ddr_addr(self.node.outputs[0]),
                                  rows, self.prec)
        return True

    def _emit_split(self) -> None:
        x = self.node.inputs[0]
        axis = self.node.attr("axis")
        in_st = contiguous_strides(self.shape(x))
        if self._split_through_lmem(x, axis):
            return
        offset = 0
        for y in self.node.outputs:
            shape = self.shape(y)
            copy_nd(self.ctx, self.src_addr(x) + offset * in_st[axis] * self.prec.bytes, in_st,
                    self.ctx.ddr_addr(y), contiguous_strides(shape), shape, self.prec)
            offset += shape[axis]

    def _split_through_lmem(self, x: str, axis: int) -> bool:
        """A split into short runs (e.g. along a small innermost axis) de-interleaves rows in LMEM."""
        shape = self.shape(x)
        rows, inner = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
        widths = [self.shape(y)[axis] * inner for y in self.node.outputs]
        if rows <= 1 or min(widths) * self.prec.bytes >= lmem_move.SHORT_RUN_BYTES or sum(widths) > lmem_move.MAX_DMA:
            return False
        if not lmem_move.fits(self.ctx, [(1, 1, 1, w) for w in widths] + [(1, 1, 1, sum(widths))], self.prec):
            return False
        dsts = [(self.ctx.ddr_addr(y), w) for y, w in zip(self.node.outputs, widths)]
        lmem_move.deinterleave_rows(self.ctx, self.node.name, self.src_addr(x), dsts, rows, self.prec)
        return True

    def _emit_slice(self) -> None:
        x, y = self.node.inputs[0], self.node.outputs[0]
        in_st = contiguous_strides(self.shape(x))
        starts, steps_ = self.node.attr("starts"), self.node.attr("steps")
        if any(s < 0 for s in steps_):
            raise LoweringError(f"node {self.node.name}: negative Slice steps are not supported")
        base = sum(s * st for s, st in zip(starts, in_st))
        out_shape = self.shape(y)
        src, src_st, dst_st = self.src_addr(x) + base * self.prec.bytes, [st * k for st, k in zip(in_st, steps_)], \
            contiguous_strides(out_shape)
        strided = lmem_move.as_strided_rows(merge_dims(out_shape, src_st, dst_st), self.prec)
        if strided is not None and lmem_move.fits(self.ctx, lmem_move.strided_min_tiles(strided[1]), self.prec):           # every step-th element of the innermost axis: via LMEM
            lmem_move.emit_strided_rows(self.ctx, self.node.name, src, self.ctx.ddr_addr(y), *strided, self.prec)
            return
        copy_nd(self.ctx, src, src_st, self.ctx.ddr_addr(y), dst_st, out_shape, self.prec)

    def _emit_gather(self) -> None:
        x, idx_name = self.node.inputs[0], self.node.inputs[1]
        if not self.ctx.graph.tensor(idx_name).is_const:
            emit_runtime_gather(self.ctx, self.node, self.src_addr(x))
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

    def _emit_pad(self) -> None:
        x, y = self.node.inputs[0], self.node.outputs[0]
        pads = self.node.attr("pads")
        value = float(self.node.attr("value", 0.0))
        self._pad_from_inside(x, y, pads, self.node.attr("mode", "constant"), value)

    def _pad_from_inside(self, x: str, y: str, pads, mode: str, value: float = 0.0) -> None:
        """The input into the middle (with the last axis's pads, through LMEM, when it has any),
        then axis by axis (innermost first) each pad slab filled with `value` (constant), or copied
        from the output position it mirrors (reflect) or repeats (edge); a slab spans the padded
        extent of the inner axes and the interior of the outer ones."""
        in_shape, out_shape = self.shape(x), self.shape(y)
        rank = len(out_shape)
        out_st = contiguous_strides(out_shape)
        dst, b = self.ctx.ddr_addr(y), self.prec.bytes
        base = sum(pads[i] * out_st[i] for i in range(rank))
        first = rank - 1
        w, wo = in_shape[-1], out_shape[-1]
        planes = min(in_shape[-3] if rank >= 3 else 1, self.ctx.chip.lanes)
        if rank >= 2 and (pads[rank - 1] or pads[2 * rank - 1]) and \
                lmem_move.fits(self.ctx, [(1, planes, 1, w), (1, planes, 1, wo)], self.prec):
            self._pad_rows_in_lmem(x, y, pads, mode, base, value)    # the interior and the last axis's pads
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

    def _pad_rows_in_lmem(self, x: str, y: str, pads, mode: str, base: int, value: float) -> None:
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
            lmem_move.pad_last_axis(self.ctx, self.node.name, self.src_addr(x) + s_off * self.prec.bytes,
                                    self.ctx.ddr_addr(y) + (base - pads[rank - 1] + d_off) * self.prec.bytes, channels, h, w,
                                    pads[rank - 1], pads[2 * rank - 1], mode, plane_stride, out_st[-2], self.prec,
                                    value)

    def _emit_resize(self) -> None:
        """Nearest-neighbour upsampling by integer repeats of the last two axes (lmem_move)."""
        x, y = self.node.inputs[0], self.node.outputs[0]
        repeats = tuple(self.node.attr("repeats"))
        in_shape = self.shape(x)
        if any(r != 1 for r in repeats[:-2]):
            raise LoweringError(f"node {self.node.name}: Resize repeats {repeats} on a leading axis")
        rows, h, w = math.prod(in_shape[:-2]), in_shape[-2], in_shape[-1]
        lanes = min(rows, self.ctx.chip.lanes)
        if not lmem_move.fits(self.ctx, [(1, lanes, 1, w), (1, lanes, repeats[-2], w * repeats[-1])], self.prec):
            # rows too long for LMEM: a stride-0 DMA repeats every element (element-granular, slow)
            rh, rw = repeats[-2], repeats[-1]
            copy_nd(self.ctx, self.src_addr(x), (h * w, w, 0, 1, 0), self.ctx.ddr_addr(y),
                    contiguous_strides((rows, h, rh, w, rw)), (rows, h, rh, w, rw), self.prec)
            return
        lmem_move.upsample_nearest(self.ctx, self.node.name, self.src_addr(x), self.ctx.ddr_addr(y),
                                   math.prod(in_shape[:-2]), in_shape[-2], in_shape[-1], repeats[-2], repeats[-1],
                                   self.prec)

    def _emit_scatternd(self) -> None:
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

    def _emit_resample(self) -> None:
        """Two-tap interpolation along one of the last two axes (lmem_move.interpolate_axis)."""
        x, y = self.node.inputs[0], self.node.outputs[0]
        axis, taps = self.node.attr("axis"), self.node.attr("taps")
        in_shape = self.shape(x)
        rank = len(in_shape)
        if axis == rank - 1:
            planes, other = math.prod(in_shape[:-1]), 1
        else:
            planes, other = math.prod(in_shape[:axis]), math.prod(in_shape[axis + 1:])
        lmem_move.interpolate_axis(self.ctx, self.node.name, self.src_addr(x), self.ctx.ddr_addr(y), planes,
                                   axis == rank - 1, in_shape[axis], len(taps), other, taps, self.prec)

    def _emit_expand(self) -> None:
        x, y = self.node.inputs[0], self.node.outputs[0]
        out_shape = self.shape(y)
        in_shape = (1,) * (len(out_shape) - len(self.shape(x))) + tuple(self.shape(x))
        in_st = contiguous_strides(in_shape)
        src_st = [0 if d == 1 and o != 1 else s for d, o, s in zip(in_shape, out_shape, in_st)]
        dst_st = contiguous_strides(out_shape)
        dims = merge_dims(out_shape, src_st, dst_st)
        if len(dims) >= 2 and dims[-1][1:] == [0, 1] and dims[-2][1] == 1 and dims[-2][2] == dims[-1][0]:
            # each element repeated along the innermost axis: replicate rows in LMEM (stride-0 TIU copies)
            rows, width = dims[-2][0], dims[-1][0]
            lanes = min(rows, self.ctx.chip.lanes)
            if lmem_move.fits(self.ctx, [(1, lanes, 1, 1), (1, lanes, 1, width)], self.prec):
                for s_off, d_off in lmem_move._outer_offsets(dims[:-2]):
                    lmem_move.upsample_nearest(self.ctx, self.node.name, self.src_addr(x) + s_off * self.prec.bytes,
                                               self.ctx.ddr_addr(y) + d_off * self.prec.bytes, rows, 1, 1, 1, width,
                                               self.prec)
                return
        if len(dims) >= 2 and dims[-1][1:] == [1, 1] and dims[-2][1] == 0 and dims[-2][2] == dims[-1][0] \
                and lmem_move.fits(self.ctx, [(1, 1, 1, dims[-1][0])], self.prec):
            # whole rows repeated: read the row once, write the repeats from LMEM
            for s_off, d_off in lmem_move._outer_offsets(dims[:-2]):
                lmem_move.replicate_row(self.ctx, self.node.name, self.src_addr(x) + s_off * self.prec.bytes,
                                        self.ctx.ddr_addr(y) + d_off * self.prec.bytes, dims[-2][0], dims[-1][0],
                                        self.prec)
            return
        copy_nd(self.ctx, self.src_addr(x), src_st, self.ctx.ddr_addr(y), dst_st, out_shape, self.prec)


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
