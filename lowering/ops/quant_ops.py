"""Emitters of the int8 lowering (issue 15): the "quant" groups of lowering/quant.py, DDR to DDR, or
chains of them holding their tensors in LMEM (ChainQuant).

How each kind computes (the canonical meaning out = quantize(op(real(inputs)), out.quant)):

- Requantisation (emit_requant) is onnxruntime's: round_half_even(fp32(x * scale)), then + zp and
  saturate: quant.rq0 with offset 0 into int32, then quant.rq1 by 1 adding the zero point. (rq0 with
  the zero point as offset rounds in fp32 after the add and loses the product's fraction; the 31-bit
  integer rq1 multiplier is closer to the real scale than fp32 but further from onnxruntime: on a
  quantized MobileNetV2 it differed from onnxruntime in 36 of 301056 values of one layer where the
  two-step form differed in none.)
- Conv: CONV with int8 input and weights into an int32 accumulator, the input's zero point as the
  padding value and folded into the int32 bias (bias - zp_x * sum of the channel's weights), then
  the per-channel requantisation (fp32 scale s_x * s_w[c] / s_y as onnxruntime computes it). A fused
  Relu is CONV's relu on the int32 sum (exact: quantize is monotonic and quantize(0) = zp); a fused
  Clip clamps the requantised values to quantize(min) / quantize(max) before narrowing.
- Depthwise Conv: pord.depthwise in fp32 on the exact integers q - zp_x, exact while the sums stay
  below 2**24 (DepthwiseQuant), then the same requantisation.
- MatMul by constant weights (the Gemm form, with its int32 bias Add): MM2 with int32 accumulation
  (GemmQuant); per-column weight scales multiply the fp32 sums as a broadcast row.
- QuantizeLinear: the float input (widened to fp32) requantised by 1 / s. DequantizeLinear:
  quant.dq0 into --dtype. Both per tensor.
- Add / Mul / Relu / Clip of quantized tensors: each input dequantised to fp32 (dq0), the op in
  fp32 on the vector unit, then requantised: the QDQ meaning with fp32 arithmetic (one rounding
  of the real result, as onnxruntime's QLinearAdd computes in float).
- LookupTable (frontend/lookup.py: an elementwise function of one 8-bit tensor, its 256 output codes):
  the table (256 bytes) broadcast once into every lane, then one SG gather (sg.pe_s_gather_d1coor, or
  _hzd when the operands share LMEM banks) per run of each channel group's contiguous bytes
  (emit_lookup): exact by construction, one element per lane and cycle. A held map of fewer channels than
  fill the lane groups (16, 32, 48 ...) has its row blocks copied side by side over the lanes first
  (tsbc.l_copy into staging buffers, lowering.tiling.lane_spread) and back after, where the shared cost
  model finds that faster: the gathers then take every lane.
- MaxPool / AveragePool / GlobalAveragePool: PordTiu has no integer rule, so the input becomes the
  exact fp32 integers q - zp_in (dq0 with scale 1), the pool runs in fp32 (exact for max; the mean
  of integers rounds once in fp32), and the result is requantised by s_in / s_out. A MaxPool whose
  output has its input's Quant gives back exactly the input's integers.

Every emitter tiles its tensors, double-buffers the per-tile buffers when they fit twice, and
plans before it emits (lowering.emitplan).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from tpuflow.errors import LoweringError
from tpuflow.frontend.quant import dequantize, quantize, storage_range
from tpuflow.isa import ConvTiu, CwBcTiu, Mm2Tiu, PordTiu, Prec, StrideMode
from tpuflow.isa.base import LocalTensor
from tpuflow.isa.tiu import (RQ_ROUND_MODES, SG_MAX_DIM, TIU_STRIDE_MAX, RqDqTiu, SgTiu, dq0_scalars,
                             rq0_channel_words, rq0_scalars, rq1_scalars)
from tpuflow.lowering.context import LowerCtx
from tpuflow.lowering.emitplan import FrozenPlan
from tpuflow.lowering.emitter import MAX_DMA_DIM, pool_scale_fields
from tpuflow.lowering.groups import Group
from tpuflow.lowering.layergroup import default_layout
from tpuflow.lowering.ops.conv import ConvGeom, conv_geometry, row_options
from tpuflow.lowering.ops.pool import count_map, pool_geometry
from tpuflow.lowering.ops.movement import MoveEmitter
from tpuflow.lowering.quant import (CUBE_INT8_CHANNELS, MOVES, QuantChain, channel_view_constant, folds_kernel_rows,
                                    held_bytes, held_placement, held_tensors, held_view, row_pattern, tail_boundary,
                                    takes_held, view_source)
from tpuflow.lowering.tensors import DRegion, LTile, make_tile, tile_bytes_per_lane
from tpuflow.lowering.tiling import lane_rows, lane_spread, steps, steps_between
from tpuflow.lowering.weights import pack_conv_weights, to_storage

HALF_TO_EVEN = RQ_ROUND_MODES["half_to_even"]
CHAIN_WORK = "chain member working buffers"
IC_BLOCK = ConvTiu.ALIGNED_IC_BLOCK[int(Prec.INT8)]      # 64 one-byte input channels per weight block


@dataclass(frozen=True)
class QuantPlan(FrozenPlan):
    """A quant group's tiling: `choice` (the emitter's tile sizes), the resident buffers' offsets
    and each double-buffered set's offsets."""

    choice: tuple = ()
    resident: tuple[int, ...] = ()
    sets: tuple[dict, ...] = ()          # per set: {buffer name: offset}


def signed(ctx: LowerCtx, tensor: str) -> int:
    """1 for a signed stored tensor, 0 for uint8 (the instructions' sign flags)."""
    quant = ctx.graph.tensor(tensor).quant
    return 0 if quant is not None and quant.storage == "uint8" else 1


def per_tensor(ctx: LowerCtx, tensor: str) -> tuple[float, int]:
    """(scale, zero point) of a per-tensor quantized tensor."""
    quant = ctx.graph.tensor(tensor).quant
    if quant is None or quant.per_channel:
        raise LoweringError(f"internal: {tensor} is not quantized per tensor")
    return float(quant.scale), int(quant.zero_point)


def emit_requant(ctx: LowerCtx, out: LTile, src: LTile, scale: dict, zero_point: int, out_signed: int,
                 clamp: tuple[int, int] | None = None, in_signed: int = 1) -> None:
    """out = saturate(round(fp32(src) * scale) + zero_point), onnxruntime's requantisation (MLAS: an
    fp32 product rounded half to even, then the zero point added): quant.rq0 with offset 0 into
    src's own bytes as int32 (src is 4-byte: an int32 or fp32 tile, rewritten in place), then
    quant.rq1 by 1 adding the zero point and saturating to out's 8 bits. (One rq0 with the zero
    point as its offset rounds x * scale + zp in fp32, which loses x * scale's fraction: 21.4999969
    - 128 is -106.5 in fp32.) `scale`: rq0 fields (rq0_scalars(s, 0), or per-channel words);
    `clamp`: (lo, hi) bounds of the stored values, applied before the narrowing. With zero point 0
    and no clamp inside the stored range, the one rq0 (offset 0) writes out's 8 bits, saturating: the
    same integers in one instruction."""
    if src.prec.bytes != 4:
        raise LoweringError(f"internal: requantising a {src.prec.dtype_name} tile in place")
    low, high = storage_range("int8" if out_signed else "uint8")
    if zero_point == 0 and (clamp is None or (clamp[0] <= low and clamp[1] >= high)):
        emit_rq(ctx, "rq0", out, src, scale, in_signed=in_signed, out_signed=out_signed)
        return
    wide = src.as_prec(Prec.INT32)
    emit_rq(ctx, "rq0", wide, src, scale, in_signed=in_signed)
    if clamp is not None:
        ctx.em.ar("max", wide, wide, int(clamp[0]) - zero_point)
        ctx.em.ar("min", wide, wide, int(clamp[1]) - zero_point)
    emit_rq(ctx, "rq1", out, wide, rq1_scalars(1, 0, zero_point), out_signed=out_signed)


def emit_rq(ctx: LowerCtx, op: str, out: LTile, inp: LTile, params: dict, in_signed: int = 1,
            out_signed: int = 1) -> None:
    """One quant.rq0 / rq1 / dq0 of `inp` into `out` (same shape), rounding half to even."""
    fields = out.fields("res0", with_shape=True)
    fields.update(inp.fields("opd0"))
    ctx.em.tiu(RqDqTiu(op=op, **fields, opt_opd0_sign=in_signed, opt_opd2_sign=out_signed,
                       opd2_n_str=HALF_TO_EVEN, **params))


class Planned:
    """plan(): the first tile choice (largest first) whose buffers fit the region, double-buffered
    when two sets fit. Subclasses give choices() and sizes(choice) -> (resident, per-set) bytes."""

    def __init__(self, ctx: LowerCtx, group: Group):
        self.ctx, self.group, self.node, self.chip = ctx, group, group.anchor, ctx.chip
        self.sides = {t: r.tile(self.chip) for n in group.nodes for t in (*n.inputs, *n.outputs)
                      if (r := ctx.resident(t)) is not None}   # what layer groups keep in LMEM (_boundary_ports)
        self.lmem: dict[str, LTile] = dict(self.sides)      # and the tensors a chain (ChainQuant) holds
        self.keep: set[str] = set()          # of those, the ones also stored to DDR (read outside)
        self.top: int | None = None          # a chain's resident tensors lie above: buffers stay below
        region = ctx.residency.region_of(ctx.group_index)
        self.slice_buffers = set(region.buffers) if region is not None else set()   # sliced run (lowering.slicing)

    @property
    def sliced(self) -> bool:
        """Whether this emission computes some samples / rows of the group (a slice of a sliced run)."""
        return self.ctx.part.rows is not None or self.ctx.part.samples is not None

    def row_steps(self, height: int, step: int) -> list[tuple[int, int]]:
        """(first output row, rows) of the row steps of the rows this emission computes."""
        return steps_between(*self.ctx.rows_to_emit(height), step)

    def row_choices(self, height: int) -> list[int]:
        """Output rows per step tried, most first, for the rows this emission computes."""
        lo, hi = self.ctx.rows_to_emit(height)
        return row_options(max(1, hi - lo))

    def plan(self, region: str) -> QuantPlan | None:
        for choice in self.choices():
            if not self.usable(choice):
                continue
            resident, per_set = self.sizes(choice)
            arena = self.ctx.planning_arena(region)
            if self.top is not None:
                arena.limit = min(arena.limit, self.top)
            names = [name for name, _ in per_set]
            try:
                res, sets = arena.alloc_plan(resident, [size for _, size in per_set], self.node.name)
            except LoweringError:
                continue
            return QuantPlan(region, self.ctx.window(region), tuple(arena.names), tuple(choice), tuple(res),
                             tuple(dict(zip(names, offs)) for offs in sets))
        return None

    def usable(self, choice) -> bool:
        """Whether the emitter can run `choice` with the tensors it is given held (every choice unless
        an emitter says otherwise)."""
        return True

    def held(self, tensor: str, n: int, c0: int, c: int, r0: int, rows: int) -> LTile | None:
        """Sample n, channels [c0, c0 + c), rows [r0, r0 + rows) of a tensor the chain or a layer
        group holds in LMEM (None when it lives in DDR); a sliced run's buffer takes the global rows
        and sample (it holds those of the current slice)."""
        whole = self.lmem.get(tensor)
        if whole is None:
            return None
        if tensor in self.slice_buffers:
            return self.ctx.resident(tensor).view(self.chip, n, c0, c, r0, rows)
        if (n, c0, c, r0, rows) == (0, 0, whole.c, 0, whole.h) and whole.n == 1:
            return whole
        view = whole.sub_channels(c0, c, self.chip) if (c0, c) != (0, whole.c) else whole
        lane = (view.addr // self.chip.lmem_bytes_per_lane) % self.chip.lanes
        one_group = lane + c <= self.chip.lanes
        strides = (0, 0 if one_group else view.strides[1], view.strides[2], view.strides[3])   # unused: 0
        return LTile(view.addr + (n * view.strides[0] + r0 * view.strides[2]) * view.prec.bytes,
                     (1, c, rows, whole.w), whole.prec, strides, StrideMode.FREE)

    def bytes(self, shape, prec: Prec, compact: bool = False) -> int:
        return tile_bytes_per_lane(self.chip, shape, prec, compact)

    def note(self, plan: QuantPlan, macs: int = 0) -> None:
        for node in self.group.nodes:
            self.ctx.note_layer(node.name, node.op_type, macs if node is self.node else 0, plan.peak, self.group.name)
        self._record_held()

    def _record_held(self) -> None:
        """Note where the quantized tensors the group makes and keeps in LMEM (a chain's, a layer
        group's) lie (Program.held_tensors: verify's stage-wise snapshots)."""
        layers = tuple(n.name for n in self.group.nodes)
        for t in (t for n in self.group.nodes for t in n.outputs if t in self.lmem and t not in self.slice_buffers):
            tile = self.lmem[t]
            if self.ctx.graph.tensor(t).quant is not None:
                self.ctx.held_tensors[t] = (LocalTensor(tile.addr, tile.shape, tile.strides, tile.prec), layers)


# ---------------------------------------------------------------- elementwise


def real_values(info) -> np.ndarray:
    """The real values (fp32) of a constant: dequantised when it is quantized."""
    const = np.asarray(info.const)
    return (dequantize(const, info.quant) if info.quant is not None else const).astype(np.float32)


LOOKUP_TABLE_ENTRIES = 256
# the longest gather run: a multiple of the int8 EU width within the 16-bit res0_w field
LOOKUP_RUN = SG_MAX_DIM // 64 * 64


def _lookup_runs(tile: LTile, chip) -> tuple[int, int, int]:
    """(elements per contiguous run in a lane, runs per channel plane, element stride between runs) of a tile
    whose w stride is 1: the whole h x w plane when its rows follow each other, else one row at a time."""
    n, c, h, w = tile.shape
    if tile.strides[3] != 1 and w > 1:
        raise LoweringError(f"internal: a lookup over a tile with w stride {tile.strides[3]}")
    if h == 1 or tile.strides[2] == w:
        return h * w, 1, 0
    return w, h, tile.strides[2]


def emit_lookup(ctx: LowerCtx, out: LTile, src: LTile, table_offset: int, stage: tuple[int, int] | None = None) -> None:
    """out = table[src's stored bytes] (same shapes), the 256-byte table at per-lane offset `table_offset` on
    every lane: the gathers of _lookup_gathers on the tiles themselves, or, with `stage` (the addresses of two
    int8 staging buffers, lowering.tiling.lane_spread's copies of the rows on lane 0 on), those of
    _spread_lookup when the shared cost model (hwmodel.timing.cost) finds them faster."""
    chosen = _lookup_gathers(ctx.chip, out, src, table_offset)
    spread = _spread_lookup(ctx.chip, out, src, table_offset, stage) if stage is not None else None
    if spread is not None and _tiu_cycles(spread, ctx.chip) < _tiu_cycles(chosen, ctx.chip):
        chosen = spread
    for instr in chosen:
        ctx.em.tiu(instr)


def _tiu_cycles(instrs, chip) -> int:
    """TIU cycles of instructions on the shared cost model (imported here, as lowering/ops/tilemm.py does)."""
    from tpuflow.hwmodel.timing.cost import tiu_cycles
    return sum(tiu_cycles(i, chip) for i in instrs)


def _lookup_gathers(chip, out: LTile, src: LTile, table_offset: int) -> list:
    """The SG gathers (SgTiu) of a lookup on the tiles as they lie: one per sample, channel group, run of
    contiguous bytes (the whole plane, or each row of a row window) and LOOKUP_RUN chunk; pe_s_gather_d1coor
    when table, index and result lie in different banks, else pe_s_gather_hzd (tpu-mlir's choice). A gather
    takes one element per lane and cycle: a map of few channels leaves the other lanes idle."""
    lanes, lb = chip.lanes, chip.lmem_bytes_per_lane
    run_o, rows_o, step_o = _lookup_runs(out, chip)
    run_s, rows_s, step_s = _lookup_runs(src, chip)
    if (run_o, rows_o) != (run_s, rows_s):         # one of them has row gaps: go row by row on both
        run_o = run_s = out.w
        rows_o = rows_s = out.h
        step_o, step_s = out.strides[2], src.strides[2]
    n, c, _, _ = out.shape
    gathers = []
    for k in range(n):
        for c0, count in _lane_groups(out, src, c, lanes, lb):
            o, s = out.sub_channels(c0, count, chip), src.sub_channels(c0, count, chip)
            for r in range(rows_o):
                for w0 in range(0, run_o, LOOKUP_RUN):
                    width = min(LOOKUP_RUN, run_o - w0)
                    res = o.addr + (k * out.strides[0] + r * step_o + w0) * out.prec.bytes
                    idx = s.addr + (k * src.strides[0] + r * step_s + w0) * src.prec.bytes
                    lane = (res // lb) % lanes
                    fields = dict(res0_addr=res, res0_n=1, res0_c=count, res0_w=width, opd1_addr=idx,
                                  opd0_addr=lane * lb + table_offset, opd0_w=LOOKUP_TABLE_ENTRIES,
                                  cmd_id_dep=0)
                    gather = SgTiu(op="pe_s_gather_d1coor", **fields)
                    if not gather.banks_disjoint(chip):
                        gather = SgTiu(op="pe_s_gather_hzd", **fields)
                    gathers.append(gather)
    return gathers


def lookup_stage_shape(chip, channels: int, rows: int, width: int) -> tuple[int, int, int, int] | None:
    """The shape of each staging buffer of a spread lookup over (1, channels, rows, width) tiles (aligned
    int8 from lane 0): lane_spread's copies side by side along the channels, each its rows per copy; None
    when that takes no fewer gather cycles (lane groups x elements per lane) than the tiles themselves."""
    copies, per = lane_spread(channels, rows, chip.lanes)
    groups = lambda c: -(-c // chip.lanes)  # noqa: E731
    return (1, copies * channels, per, width) if groups(copies * channels) * per < groups(channels) * rows else None


def _spread_lookup(chip, out: LTile, src: LTile, table_offset: int, stage: tuple[int, int]) -> list | None:
    """A lookup on a map of few channels with its rows spread over the lanes: per sample, each row block
    of src copied (tsbc.l_copy) into its own lanes of the staging buffer stage[0], the gathers over all
    of them into stage[1] (whole blocks: a shorter last block's other bytes are looked up too, any byte
    being a valid index, and never copied back), each block copied back to its rows of out. Elementwise,
    so exact whatever lane an element sits on; None when spreading saves no gather cycles."""
    n, c, h, w = out.shape
    shape = lookup_stage_shape(chip, c, h, w)
    if shape is None:
        return None
    if any(abs(s) > TIU_STRIDE_MAX for t in (out, src) for s in t.strides[1:]):
        return None                        # the copies could not address these tiles
    per = shape[2]
    blocks = steps(h, per)
    staged = [make_tile(chip, addr, shape, Prec.INT8) for addr in stage]
    instrs = []
    for k in range(n):
        for j, (r0, rows) in enumerate(blocks):
            instrs.append(_lane_copy(_rows_of(staged[0].sub_channels(j * c, c, chip), 0, 0, rows),
                                     _rows_of(src, k, r0, rows)))
        flat = [make_tile(chip, addr, (1, shape[1], 1, per * w), Prec.INT8) for addr in stage]   # same strides
        instrs += _lookup_gathers(chip, flat[1], flat[0], table_offset)
        for j, (r0, rows) in enumerate(blocks):
            instrs.append(_lane_copy(_rows_of(out, k, r0, rows),
                                     _rows_of(staged[1].sub_channels(j * c, c, chip), 0, 0, rows)))
    return instrs


def _rows_of(tile: LTile, k: int, r0: int, rows: int) -> LTile:
    """Rows [r0, r0 + rows) of sample k of a tile, as a one-sample view (its sample stride 0: unused,
    and a whole sample's stride can exceed the instruction's 16-bit stride fields)."""
    _, c, _, w = tile.shape
    addr = tile.addr + (k * tile.strides[0] + r0 * tile.strides[2]) * tile.prec.bytes
    return LTile(addr, (1, c, rows, w), tile.prec, (0, *tile.strides[1:]), StrideMode.FREE)


def _lane_copy(dst: LTile, src: LTile) -> CwBcTiu:
    """tsbc.l_copy of src's elements into dst (views of one shape, any lanes and strides)."""
    fields = dst.fields("res0", with_shape=True)
    fields.update(src.fields("opd0"))
    fields.pop("opt_opd0_prec", None)
    return CwBcTiu(op="l_copy", opd0_c=src.c, opd0_w=src.w, **fields)


def _lane_groups(out: LTile, src: LTile, c: int, lanes: int, lb: int) -> list[tuple[int, int]]:
    """(first channel, channels) of the runs of channels that stay in one lane group of both tiles (the
    gather's channels must not wrap past the last lane: its own channel stride is not the tiles')."""
    starts = [(t.addr // lb) % lanes for t in (out, src)]
    if starts[0] != starts[1]:
        raise LoweringError("internal: a lookup's index and result start on different lanes")
    pieces, c0 = [], 0
    while c0 < c:
        count = min(c - c0, lanes - (starts[0] + c0) % lanes)
        pieces.append((c0, count))
        c0 += count
    return pieces


class ElementwiseQuant(Planned):
    """QuantizeLinear, DequantizeLinear, Add / Mul / Relu / Clip of same-shaped quantized tensors,
    and a Reshape between two quantizations (lowering.quant.requantising_view: dq0, then the
    output's requantisation), over the flat tensor viewed as (lanes, cols) in column steps. A constant operand that
    is neither a scalar nor per channel (a norm gain along the last axis, a bias row) repeats with
    the period lowering.quant.row_pattern gives: the view's rows then divide count / period, so one
    row of the constant (fp32, in DDR) broadcast-loaded on every lane per step serves all rows."""

    def __init__(self, ctx: LowerCtx, group: Group):
        super().__init__(ctx, group)
        g = ctx.graph
        self.inputs = [t for t in self.node.inputs if t and not g.tensor(t).is_const]
        self.out = self.node.outputs[0]
        self.count = math.prod(g.tensor(self.out).shape)
        self.rows = lane_rows(self.count, self.chip.lanes)
        self.cols = self.count // self.rows
        self.direct = self.node.op_type in ("QuantizeLinear", "DequantizeLinear")
        self.lookup = self.node.op_type == "LookupTable"
        self.table = g.tensor(self.node.inputs[1]).const if self.lookup else None   # 256 output codes
        self.code_bounds = self._code_bounds()
        self.stage: tuple[int, int] | None = None      # a lookup's staging buffers (emit_lookup)
        self.shape = held_view(g.tensor(self.out).shape)     # the NCHW view of a chain (lowering.quant.held_view)
        consts = [t for t in self.node.inputs if t and g.tensor(t).is_const] if not (self.direct or self.lookup) \
            else []
        self.constant = real_values(g.tensor(consts[0])).reshape(-1) if consts else None   # scalar or per channel
        self.row = None              # any other constant: one row of the flat view, the same on every lane
        if self.constant is not None and self.constant.size > 1 and not self._channel_constant(g, consts[0]):
            pattern = row_pattern(g, self.node)
            self.rows = lane_rows(self.count // pattern.size, self.chip.lanes)
            self.cols = self.count // self.rows
            self.row = np.tile(pattern, self.cols // pattern.size).astype(np.float32)
            self.held_row = np.tile(pattern, self.shape[3] // pattern.size).astype(np.float32) \
                if self.shape[3] % pattern.size == 0 else None      # one held row's (lowering.quant.takes_held)
            self.constant = None
        self._split_channels()

    def _split_channels(self) -> None:
        """Cores (lowering.cores): this core's channels [lo, hi) of one sample, NCHW tiles of them, or on
        the flat view their contiguous run of the tensor (flat_base: its first element)."""
        self.channel_range = self.ctx.channels_to_emit(self.shape[1])
        self.flat_base = 0
        lo, hi = self.channel_range
        if (lo, hi) == (0, self.shape[1]) or self.nchw:
            return
        if self.row is not None or self.shape[0] != 1:
            raise LoweringError(f"internal: node {self.node.name}: a channel part of a flat view with a row constant "
                                "or several samples")
        plane = self.shape[2] * self.shape[3]
        self.flat_base, self.count = lo * plane, (hi - lo) * plane
        self.rows = lane_rows(self.count, self.chip.lanes)
        self.cols = self.count // self.rows

    def _code_bounds(self) -> tuple[int | None, int | None] | None:
        """A Relu / Clip of a signed 8-bit tensor whose output has its input's Quant: (lowest, highest)
        stored code (None: unbounded) that clamping the codes themselves keeps. quantize is monotonic and
        gives back every in-range code of its own grid, so quantize(clip(real(q))) = clamp(q, quantize(min),
        quantize(max)): two integer instructions at the int8 rate instead of the fp32 round trip (None:
        another op, or another Quant)."""
        g, op = self.ctx.graph, self.node.op_type
        if op not in ("Relu", "Clip") or len(self.inputs) != 1:
            return None
        quant = g.tensor(self.out).quant
        if quant != g.tensor(self.inputs[0]).quant or quant.per_channel or quant.storage != "int8":
            return None
        lo, hi = (0.0, None) if op == "Relu" else (self.node.attr("min"), self.node.attr("max"))
        return tuple(None if v is None else int(quantize(np.float32(v), quant)) for v in (lo, hi))

    def _channel_constant(self, g, const: str) -> bool:
        """One value per channel of the held view (lowering.quant.channel_view_constant): loaded once
        per channel (the NCHW view)."""
        return channel_view_constant(g.tensor(const).shape, g.tensor(self.out).shape)

    @property
    def per_channel_constant(self) -> bool:
        return self.constant is not None and self.constant.size > 1

    @property
    def nchw(self) -> bool:
        """In a chain, or with a per-channel constant operand: (1, C, rows, W) tiles of the (N, C, H, W)
        tensors in row steps (held tensors read and written in place), as in a slice of a sliced run; else
        the flat (lanes, cols) view."""
        return bool(self.lmem) or self.per_channel_constant or self.sliced

    def choices(self):
        if self.nchw:
            return [(rows,) for rows in self.row_choices(self.shape[2])]
        width, out = self.cols, []
        while width >= 1:
            out.append((width,))
            if width == 1:
                break
            width = -(-width // 2)
        return out

    def _tile_shape(self, step: int) -> tuple[tuple[int, int, int, int], bool]:
        """The shape of one step's tiles and whether they are compact (flat view) or aligned (NCHW)."""
        _, _, _, w = self.shape if self.nchw else (0, 0, 0, 0)
        c = self.channel_range[1] - self.channel_range[0]
        return ((1, c, step, w), False) if self.nchw else ((1, self.rows, 1, step), True)

    def _steps(self, step: int) -> list[tuple[int, int, int]]:
        """(sample, first row or column, count) of every step."""
        if self.nchw:
            return [(n, h0, h) for n in self.ctx.samples_to_emit(self.shape[0])
                    for h0, h in self.row_steps(self.shape[2], step)]
        return [(0, c0, cw) for c0, cw in steps(self.cols, step)]

    def sizes(self, choice):
        shape, compact = self._tile_shape(choice[0])
        per_set = [(f"in{i}", self.bytes(shape, self.ctx.tensor_prec(t), compact))
                   for i, t in enumerate(self.inputs) if t not in self.lmem]
        if not self.direct and self.code_bounds is None and not self.lookup:
            per_set += [(f"work{i}", self.bytes(shape, Prec.FP32, compact)) for i in range(len(self.inputs))]
        elif self.node.op_type == "QuantizeLinear" and not self._requantised_in_place():
            per_set.append(("work0", self.bytes(shape, Prec.FP32, compact)))      # the input widened to fp32
        if self.out not in self.lmem:
            per_set.append(("out", self.bytes(shape, self.ctx.tensor_prec(self.out), compact)))
        if self.row is not None:                         # held rows: one lane group's copy (_row_operand)
            row_shape = (1, min(shape[1], self.chip.lanes), 1, shape[3]) if self.nchw else shape
            per_set.append(("row", self.bytes(row_shape, Prec.FP32, compact)))
        resident = [self.bytes((1, self.shape[1], 1, 1), Prec.FP32, True)] if self.per_channel_constant else []
        if self.lookup:                                  # the table, on every lane
            resident.append(self.bytes((1, self.chip.lanes, 1, LOOKUP_TABLE_ENTRIES), Prec.INT8))
            stage = lookup_stage_shape(self.chip, *shape[1:]) if self.nchw else None
            if stage is not None:                        # few channels: the rows spread over the lanes
                per_set += [(name, self.bytes(stage, Prec.INT8)) for name in ("stage_in", "stage_out")]
        return resident, per_set

    def emit(self, plan: QuantPlan) -> None:
        ctx = self.ctx
        ctx.em.layer = self.node.name
        parts = ctx.residency.splits.get(self.out)
        if parts:
            self._emit_parts(plan, parts)
            return
        self.operand = None if self.constant is None else float(self.constant[0])
        if self.per_channel_constant:
            lo, hi = self.channel_range
            name = f"{self.node.name}:constant" + (f":{lo}:{hi}" if (lo, hi) != (0, self.shape[1]) else "")
            tile = make_tile(self.chip, plan.resident[0], (1, hi - lo, 1, 1), Prec.FP32, compact=True)
            ctx.load_const_channels(tile, name, self.constant[lo:hi].reshape(hi - lo, 1), Prec.FP32)
            self.operand = tile
        if self.lookup:
            self.table_tile = make_tile(self.chip, plan.resident[-1], (1, self.chip.lanes, 1, LOOKUP_TABLE_ENTRIES),
                                        Prec.INT8)
            codes = np.asarray(self.table).view(np.int8)        # the stored bytes
            ctx.em.broadcast_load(self.table_tile, ctx.const_addr(f"{self.node.name}:table", codes, Prec.INT8),
                                  Prec.INT8)
        row_addr = None
        if self.row is not None and self.nchw:           # held rows: the constant's one row, on every lane
            row_addr = ctx.const_addr(f"{self.node.name}:constant_held_row", self.held_row, Prec.FP32)
        elif self.row is not None:
            row_addr = ctx.const_addr(f"{self.node.name}:constant_row", self.row, Prec.FP32)
        for index, (n, at, count) in enumerate(self._steps(plan.choice[0])):
            offs = plan.sets[index % len(plan.sets)]
            shape, compact = self._tile_shape(count)
            if row_addr is not None and self.nchw:
                self.operand = self._row_operand(offs["row"], shape, row_addr)
            elif row_addr is not None:                   # the constant's columns of this step, on every lane
                self.operand = make_tile(self.chip, offs["row"], shape, Prec.FP32, compact=compact)
                ctx.em.broadcast_load(self.operand, row_addr + 4 * at, Prec.FP32)
            tiles = []
            for i, t in enumerate(self.inputs):
                tile = self._held(t, n, at, count)
                if tile is None:
                    tile = make_tile(self.chip, offs[f"in{i}"], shape, ctx.tensor_prec(t), compact=compact)
                    ctx.em.load(tile, self._region(t, n, at, count))
                tiles.append(tile)
            out = self._held(self.out, n, at, count) or make_tile(self.chip, offs["out"], shape,
                                                                  ctx.tensor_prec(self.out), compact=compact)
            work = [make_tile(self.chip, offs[f"work{i}"], shape, Prec.FP32, compact=compact)
                    for i in range(len(self.inputs)) if f"work{i}" in offs]
            self.stage = (offs["stage_in"], offs["stage_out"]) if "stage_in" in offs else None
            self._compute(out, tiles, work)
            if self.out not in self.lmem or self.out in self.keep:
                ctx.em.store(out, self._region(self.out, n, at, count))
        self.note(plan)

    def _emit_parts(self, plan: QuantPlan, parts) -> None:
        """A DequantizeLinear whose float result a column Split takes apart in LMEM (layer groups:
        lowering.residency._column_splits): each part's columns dequantised straight into the part's
        buffer, from the held int8 matrix or its columns loaded from DDR."""
        ctx, x, rows, cols = self.ctx, self.inputs[0], self.shape[1], self.shape[3]
        held = self.lmem.get(x)
        s, zp = per_tensor(ctx, x)
        for index, (name, c0, width) in enumerate(parts):
            out = ctx.resident(name).rows_view(self.chip, 0, rows, 0, width)
            if held is not None:          # the held matrix's columns c0.. (the same lanes and row strides)
                src = LTile(held.addr + c0 * held.prec.bytes, (1, rows, 1, width), held.prec, held.strides,
                            StrideMode.FREE)
            else:
                src = make_tile(self.chip, plan.sets[index % len(plan.sets)]["in0"], (1, rows, 1, width), Prec.INT8)
                ctx.em.load(src, ctx.region(x, src.shape, c0, (rows * cols, cols, width, 1)))
            emit_rq(ctx, "dq0", out, src, dq0_scalars(zp, s), in_signed=signed(ctx, x))
        self.note(plan)

    def _clamp_codes(self, out: LTile, src: LTile) -> None:
        """The stored codes clamped to code_bounds (a copy when the Clip bounds nothing)."""
        lo, hi = self.code_bounds
        if lo is None and hi is None:
            self.ctx.em.ar("copy", out, src)
        if lo is not None:
            self.ctx.em.ar("max", out, src, lo)
            src = out
        if hi is not None:
            self.ctx.em.ar("min", out, src, hi)

    def _requantised_in_place(self) -> bool:
        """A QuantizeLinear rounds its fp32 input in its own load buffer; a held or resident input
        (other groups read it later) and an fp16 / bf16 one are widened into a work buffer first."""
        return self.ctx.tensor_prec(self.inputs[0]) == Prec.FP32 and self.inputs[0] not in self.lmem

    def _row_operand(self, at: int, shape, row_addr: int) -> LTile:
        """The constant's row on held rows: broadcast once into the first lane group, read by every
        channel group and row at the same per-lane offset (strides 0)."""
        lanes_row = make_tile(self.chip, at, (1, min(shape[1], self.chip.lanes), 1, shape[3]), Prec.FP32)
        self.ctx.em.broadcast_load(lanes_row, row_addr, Prec.FP32)
        return LTile(lanes_row.addr, tuple(shape), Prec.FP32, (0, 0, 0, 1), StrideMode.FREE)

    def _held(self, tensor: str, n: int, h0: int, rows: int) -> LTile | None:
        lo, hi = self.channel_range
        return self.held(tensor, n, lo, hi - lo, h0, rows) if self.nchw else None

    def _region(self, tensor: str, n: int, at: int, count: int) -> DRegion:
        if self.nchw:
            _, c, h, w = self.shape
            lo, hi = self.channel_range
            return self.ctx.region(tensor, (1, hi - lo, count, w), ((n * c + lo) * h + at) * w,
                                   (c * h * w, h * w, w, 1))
        return self.ctx.region(tensor, (1, self.rows, 1, count), self.flat_base + at, (self.count, self.cols, count, 1))

    def _compute(self, out: LTile, tiles: list[LTile], work: list[LTile]) -> None:
        ctx, op = self.ctx, self.node.op_type
        if self.code_bounds is not None:
            self._clamp_codes(out, tiles[0])
            return
        if self.lookup:
            emit_lookup(ctx, out, tiles[0], self.table_tile.addr % self.chip.lmem_bytes_per_lane, self.stage)
            return
        s_out, zp_out = per_tensor(ctx, self.out) if op != "DequantizeLinear" else (1.0, 0)
        if op == "QuantizeLinear":
            if self._requantised_in_place():
                wide = tiles[0]                            # rewritten in place
            else:
                wide = work[0]
                ctx.em.ar("copy", wide, tiles[0])          # fp16 / bf16 -> fp32, exact
            emit_requant(ctx, out, wide, rq0_scalars(1.0 / s_out, 0.0), zp_out, signed(ctx, self.out))
            return
        if op == "DequantizeLinear":
            s, zp = per_tensor(ctx, self.inputs[0])
            emit_rq(ctx, "dq0", out, tiles[0], dq0_scalars(zp, s), in_signed=signed(ctx, self.inputs[0]))
            return
        for w, tile, t in zip(work, tiles, self.inputs):
            s, zp = per_tensor(ctx, t)
            emit_rq(ctx, "dq0", w, tile, dq0_scalars(zp, s), in_signed=signed(ctx, t))
        acc = work[0]
        if op in ("Add", "Mul"):
            other = work[1] if len(work) > 1 else self.operand
            if isinstance(other, LTile) and other.shape != acc.shape:     # a per-channel constant
                other = other.broadcast(acc.shape, n=True, h=True, w=True)
            ctx.em.ar("add" if op == "Add" else "mul", acc, acc, acc if other is None else other)
        elif op == "Relu":
            ctx.em.ar("max", acc, acc, 0.0)
        elif op == "Clip":
            lo, hi = self.node.attr("min"), self.node.attr("max")
            if lo is not None:
                ctx.em.ar("max", acc, acc, float(lo))
            if hi is not None:
                ctx.em.ar("min", acc, acc, float(hi))
        emit_requant(ctx, out, acc, rq0_scalars(1.0 / s_out, 0.0), zp_out, signed(ctx, self.out))


# ---------------------------------------------------------------- pools


class PoolQuant(Planned):
    """MaxPool / AveragePool / GlobalAveragePool on int8: dq0 to the exact fp32 integers q - zp,
    the fp32 pool, rq0 by s_in / s_out + zp_out; tiled over samples, channel groups and rows (a
    GlobalAveragePool over steps of input rows, each step's share of the mean added up)."""

    def __init__(self, ctx: LowerCtx, group: Group):
        super().__init__(ctx, group)
        self.x, self.out = self.node.inputs[0], self.node.outputs[0]
        self.global_ = self.node.op_type == "GlobalAveragePool"
        if self.global_:
            n, c, h, w = ctx.graph.tensor(self.x).shape
            self.geom = ConvGeom(n, c, h, w, c, h, w, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1)
        else:
            self.geom, _ = pool_geometry(ctx, self.node)
        self.channel_range = ctx.channels_to_emit(self.geom.cin)    # cores: the channels this core pools
        self.inv_count = None                 # an AveragePool whose windows hold different counts: 1 / count
        if self.node.op_type == "AveragePool":
            counts = count_map(self.geom, bool(self.node.attr("count_include_pad", 0)))
            if not np.all(counts == self.geom.kh * self.geom.kw):
                self.inv_count = (1.0 / counts).astype(np.float32)

    def choices(self):
        geo, lanes = self.geom, self.chip.lanes
        count = self.channel_range[1] - self.channel_range[0]
        channels = [count] + [lanes * k for k in (8, 4, 2, 1) if lanes * k < count]
        rows = row_options(geo.h) if self.global_ else self.row_choices(geo.ho)   # global: input rows per step
        return [(c, r) for c in channels for r in rows]

    def sizes(self, choice):
        c, r = choice
        geo = self.geom
        in_shape = (1, c, min(geo.h, geo.halo_rows(r)) if not self.global_ else r, geo.w)
        out_shape = (1, c, 1 if self.global_ else r, geo.wo)
        per_set = [("in_f", self.bytes(in_shape, Prec.FP32)), ("out_f", self.bytes(out_shape, Prec.FP32))]
        if self.global_ and r < geo.h:
            per_set.append(("part_f", self.bytes(out_shape, Prec.FP32)))   # a step's share of the mean
        if self.x not in self.lmem:
            per_set.append(("in_q", self.bytes(in_shape, Prec.INT8)))
        if self.out not in self.lmem:
            per_set.append(("out_q", self.bytes(out_shape, Prec.INT8)))
        if self.inv_count is not None:
            per_set.append(("inv", self.bytes((1, min(c, self.chip.lanes), r, geo.wo), Prec.FP32)))
        return [], per_set

    def emit(self, plan: QuantPlan) -> None:
        ctx, geo = self.ctx, self.geom
        ctx.em.layer = self.node.name
        ct, rt = plan.choice
        index = 0
        for n in self.ctx.samples_to_emit(geo.n):
            for c0, c in steps_between(*self.channel_range, ct):
                if self.global_:
                    self._global_tile(plan.sets[index % len(plan.sets)], n, c0, c, rt)
                    index += 1
                    continue
                for h0, h in self.row_steps(geo.ho, rt):
                    self._tile(plan.sets[index % len(plan.sets)], n, c0, c, h0, h)
                    index += 1
        self.note(plan)

    def _global_tile(self, offs, n: int, c0: int, c: int, rows: int) -> None:
        """The mean of channels [c0, c0 + c) of sample n: each step of `rows` input rows as exact fp32
        integers, its sum times 1 / (H W) added to the mean (the first step writes it)."""
        ctx, geo, chip = self.ctx, self.geom, self.chip
        out_f = make_tile(chip, offs["out_f"], (1, c, 1, 1), Prec.FP32)
        for r0, r in steps(geo.h, rows):
            share = out_f if r0 == 0 else make_tile(chip, offs["part_f"], (1, c, 1, 1), Prec.FP32)
            in_f = self._dequantised_rows(offs, n, c0, c, r0, r)
            ctx.em.row_pool("avgpooling", share, in_f, 1.0 / (geo.h * geo.w))
            if share is not out_f:
                ctx.em.ar("add", out_f, out_f, share)
        self._requantised(offs, out_f, n, c0, c, 0, 1)

    def _dequantised_rows(self, offs, n: int, c0: int, c: int, r0: int, rows: int) -> LTile:
        """Input rows [r0, r0 + rows) of channels [c0, c0 + c) as the fp32 integers q - zp_in."""
        ctx, geo, chip = self.ctx, self.geom, self.chip
        in_f = make_tile(chip, offs["in_f"], (1, c, rows, geo.w), Prec.FP32)
        in_q = self.held(self.x, n, c0, c, r0, rows)
        if in_q is None:
            in_q = make_tile(chip, offs["in_q"], (1, c, rows, geo.w), Prec.INT8)
            ctx.em.load(in_q, ctx.region(self.x, in_q.shape, ((n * geo.cin + c0) * geo.h + r0) * geo.w,
                                         (geo.cin * geo.h * geo.w, geo.h * geo.w, geo.w, 1)))
        _, zp_in = per_tensor(ctx, self.x)
        emit_rq(ctx, "dq0", in_f, in_q, dq0_scalars(zp_in, 1.0), in_signed=signed(ctx, self.x))
        return in_f

    def _requantised(self, offs, out_f: LTile, n: int, c0: int, c: int, h0: int, h: int) -> None:
        """The fp32 pool results requantised by s_in / s_out into the output's rows (held, or stored)."""
        ctx, geo, chip = self.ctx, self.geom, self.chip
        out_q = self.held(self.out, n, c0, c, h0, h) or make_tile(chip, offs["out_q"], (1, c, h, geo.wo), Prec.INT8)
        s_in, _ = per_tensor(ctx, self.x)
        s_out, zp_out = per_tensor(ctx, self.out)
        emit_requant(ctx, out_q, out_f, rq0_scalars(s_in / s_out, 0.0), zp_out, signed(ctx, self.out))
        if self.out in self.lmem and self.out not in self.keep:
            return
        ctx.em.store(out_q, ctx.region(self.out, out_q.shape, ((n * geo.cin + c0) * geo.ho + h0) * geo.wo,
                                       (geo.cin * geo.ho * geo.wo, geo.ho * geo.wo, geo.wo, 1)))

    def _tile(self, offs, n: int, c0: int, c: int, h0: int, h: int) -> None:
        ctx, geo, chip = self.ctx, self.geom, self.chip
        r0, rows, up, dn = geo.input_rows(h0, h)
        in_f = self._dequantised_rows(offs, n, c0, c, r0, rows)
        out_f = make_tile(chip, offs["out_f"], (1, c, h, geo.wo), Prec.FP32)
        is_max = self.node.op_type == "MaxPool"
        op = "maxpooling" if is_max else "avgpooling"
        f = out_f.fields("res0", with_shape=True)
        f.update(in_f.fields("opd0"))
        f.update(pool_scale_fields(op, Prec.FP32, 1.0 if self.inv_count is not None else 1.0 / (geo.kh * geo.kw)))
        ctx.em.tiu(PordTiu(op=op, **f, opd0_h=rows, opd0_w=geo.w, opd1_h=geo.kh, opd1_w=geo.kw,
                           opd0_up_pad=up, opd0_dn_pad=dn, opd0_lf_pad=geo.pl, opd0_rt_pad=geo.pr,
                           res_op_x_str=geo.sx, res_op_y_str=geo.sy, opd1_x_ins0=geo.dx - 1,
                           opd1_y_ins0=geo.dy - 1))
        if self.inv_count is not None:               # window sums times 1 / their element counts
            inv = make_tile(chip, offs["inv"], (1, min(c, chip.lanes), h, geo.wo), Prec.FP32)
            addr = ctx.const_addr(f"{self.node.name}:inverse_counts", self.inv_count, Prec.FP32)
            ctx.em.load(inv, DRegion(addr + h0 * geo.wo * 4, inv.shape, (0, 0, geo.wo, 1), Prec.FP32))
            ctx.em.ar("mul", out_f, out_f, LTile(inv.addr, out_f.shape, Prec.FP32, (0, 0, inv.strides[2], 1),
                                                 StrideMode.FREE))
        self._requantised(offs, out_f, n, c0, c, h0, h)


# ---------------------------------------------------------------- concat


class ConcatQuant(Planned):
    """Concat of quantized tensors: channels of NCHW tensors, or any axis of tensors viewed as
    (before the axis, along it, 1, after it), which is a channel Concat of the same bytes.
    In DDR: an input the DDR plan placed inside the output
    (ddrplan's Concat members: its producer wrote it there) with the output's Quant costs nothing,
    another with that Quant is one DDR -> DDR copy. Otherwise in row steps: the input (held by a
    chain, or loaded), requantised when its Quant is not the output's (dq0 to the exact fp32
    integers q - zp, emit_requant by s_in / s_out), then moved into the output's channels: a GDMA
    LMEM -> LMEM copy into a held output (the channels land on other lanes), or a store."""

    def __init__(self, ctx: LowerCtx, group: Group):
        super().__init__(ctx, group)
        g = ctx.graph
        self.out = self.node.outputs[0]
        shape = tuple(g.tensor(self.out).shape)
        axis = self.node.attr("axis") % len(shape)
        self.shape = shape if (len(shape), axis) == (4, 1) else \
            (math.prod(shape[:axis]), shape[axis], 1, math.prod(shape[axis + 1:]))
        self.parts, c0 = [], 0
        for x in self.node.inputs:
            self.parts.append((x, c0, g.tensor(x).shape[axis]))
            c0 += g.tensor(x).shape[axis]
        quant = g.tensor(self.out).quant
        self.requantised = [p for p in self.parts if g.tensor(p[0]).quant != quant]
        self.placed: set[str] = set()        # inputs a chain's producer wrote into the held output already

    def _stepped(self, part) -> bool:
        """Whether a part goes through LMEM in row steps (else a DDR copy, or nothing)."""
        return part in self.requantised or part[0] in self.lmem or self.out in self.lmem

    def choices(self):
        return [(rows,) for rows in row_options(self.shape[2])] if any(map(self._stepped, self.parts)) else [(0,)]

    def sizes(self, choice):
        stepped = [p for p in self.parts if self._stepped(p)]
        loaded = max((c for x, _, c in stepped if x not in self.lmem), default=0)
        requantised = max((c for _, _, c in self.requantised), default=0)
        per_set = []
        if loaded:
            per_set.append(("in", self.bytes((1, loaded, choice[0], self.shape[3]), Prec.INT8)))
        if requantised:
            shape = (1, requantised, choice[0], self.shape[3])
            per_set += [("f", self.bytes(shape, Prec.FP32)), ("out", self.bytes(shape, Prec.INT8))]
        return [], per_set

    def emit(self, plan: QuantPlan) -> None:
        ctx = self.ctx
        ctx.em.layer = self.node.name
        n_, c_all, h_all, w = self.shape
        index = 0
        for part in self.parts:
            x, c0, c = part
            if not self._stepped(part):
                if ctx.ddr.alias_root(x)[0] != ctx.ddr.alias_root(self.out)[0]:
                    ctx.em.region_copy(self._slice(self.out, c0, c, 0, h_all, c_all),
                                       self._slice(x, 0, c, 0, h_all, c))
                continue
            for n in range(n_):
                for h0, h in steps(h_all, plan.choice[0]):
                    self._step(plan.sets[index % len(plan.sets)], part, n, h0, h)
                    index += 1
        self.note(plan)

    def _step(self, offs: dict, part, n: int, h0: int, h: int) -> None:
        ctx, (x, c0, c) = self.ctx, part
        _, c_all, _, w = self.shape
        src = self.held(x, n, 0, c, h0, h)
        if src is None:
            src = make_tile(self.chip, offs["in"], (1, c, h, w), Prec.INT8)
            ctx.em.load(src, self._slice(x, 0, c, h0, h, c, n))
        if part in self.requantised:
            (s_in, zp_in), (s_out, zp_out) = per_tensor(ctx, x), per_tensor(ctx, self.out)
            f = make_tile(self.chip, offs["f"], (1, c, h, w), Prec.FP32)
            emit_rq(ctx, "dq0", f, src, dq0_scalars(zp_in, 1.0), in_signed=signed(ctx, x))
            src = make_tile(self.chip, offs["out"], (1, c, h, w), Prec.INT8)
            emit_requant(ctx, src, f, rq0_scalars(s_in / s_out, 0.0), zp_out, signed(ctx, self.out))
        dst = self.held(self.out, n, c0, c, h0, h)
        if dst is not None and x not in self.placed:
            ctx.em.lmem_copy(dst, src)
        if dst is None or self.out in self.keep:
            ctx.em.store(src, self._slice(self.out, c0, c, h0, h, c_all, n))

    def _slice(self, tensor: str, c0: int, c: int, h0: int, h: int, channels: int, n: int | None = None) -> DRegion:
        """Channels [c0, c0 + c) and rows [h0, h0 + h) of sample n (all samples when None) of a tensor
        of `channels` channels."""
        n_, _, height, w = self.shape
        strides = (channels * height * w, height * w, w, 1)
        if n is None:
            return self.ctx.region(tensor, (n_, c, h, w), (c0 * height + h0) * w, strides)
        return self.ctx.region(tensor, (1, c, h, w), ((n * channels + c0) * height + h0) * w, strides)


# ---------------------------------------------------------------- products


@dataclass(frozen=True)
class Requant:
    """What follows a product's int32 sum: the per-channel rq0 words, CONV's relu, and the
    quantized Clip bounds (None: no clamp)."""

    words: np.ndarray            # (C, 2) int32
    relu: bool
    clamp: tuple[int, int] | None


def centred_weights(w_info) -> np.ndarray:
    """A Conv's integer weights minus their zero points (per tensor or per output channel), int64:
    w - zw lies in [-255, 255] for int8 or uint8 weights."""
    weights = np.asarray(w_info.const, np.int64)
    zero_points = np.asarray(w_info.quant.zero_point, np.int64).reshape(-1)
    return weights - zero_points.reshape((-1,) + (1,) * (weights.ndim - 1))


def int8_terms(values: np.ndarray) -> list[np.ndarray]:
    """int8 arrays summing to `values` (int64), fewest first: the values clipped to int8, then what is
    left clipped, ...: one array when every value is an int8 (zero points 0, or w - zw within [-128, 127]),
    at most three for [-255, 255] (255 = 127 + 127 + 1)."""
    terms, rest = [], values
    while not terms or rest.any():
        terms.append(np.clip(rest, -128, 127).astype(np.int8))
        rest = rest - terms[-1]
    return terms


class ProductQuant(Planned):
    """Conv: int8 x int8 -> int32 with the folded bias, then the per-channel requantisation. Tiled
    over output channel chunks (weights, bias and requant words loaded once per chunk), samples
    and rows. Weights with zero points zw (uint8, or asymmetric int8; per tensor or per channel):
    the conv by w - zw, exact, whose values may pass int8 (to +-255): it is split into int8_terms,
    the first conv with the folded bias, each further term one more CONV accumulating into the int32
    sums (opt_res_add), on the same zero-point-padded input (one extra CONV where any w - zw leaves
    int8, none when all fit)."""

    def __init__(self, ctx: LowerCtx, group: Group):
        super().__init__(ctx, group)
        g, node = ctx.graph, self.node
        self.x, self.out = node.inputs[0], group.nodes[-1].outputs[0]
        w_info = g.tensor(node.inputs[1])
        self.geom = conv_geometry(ctx, node)
        weights = centred_weights(w_info)
        bias = self._const_bias(node.inputs[2] if len(node.inputs) > 2 else None)
        s_x, zp_x = per_tensor(ctx, self.x)
        self.zp_x = zp_x
        folded = bias - zp_x * weights.reshape(weights.shape[0], -1).sum(axis=1)
        if np.abs(folded).max(initial=0) >= 1 << 31:
            raise LoweringError(f"node {node.name}: the folded int32 bias overflows")
        self.bias = folded.astype(np.int32)
        self.kernels = int8_terms(weights)
        self.packed = pack_conv_weights(self.kernels[0], IC_BLOCK)
        self.extra_packed = [pack_conv_weights(k, IC_BLOCK) for k in self.kernels[1:]]
        self.requant = self._requant(w_info.quant, s_x)
        self.cout_range = ctx.channels_to_emit(self.geom.cout)   # cores: the output channels this core computes

    def _const_bias(self, name: str | None) -> np.ndarray:
        if name is None:
            return np.zeros(self.geom.cout, np.int64)
        return np.asarray(self.ctx.graph.tensor(name).const, np.int64).reshape(-1)

    def _requant(self, w_quant, s_x: float) -> Requant:
        s_y, zp_y = per_tensor(self.ctx, self.out)
        s_w = np.broadcast_to(np.asarray(w_quant.scale, np.float64).reshape(-1), (self.geom.cout,))
        s_xw = np.float32(s_x) * s_w.astype(np.float32)                   # fp32, as onnxruntime's output_scales
        words = rq0_channel_words((s_xw / np.float32(s_y)).astype(np.float32), np.zeros(self.geom.cout, np.float32))
        self.zp_y = zp_y
        acts = [m for m in self.group.nodes[1:] if m.op_type in ("Relu", "Clip")]
        relu = any(m.op_type == "Relu" for m in acts)
        clamp = None
        for m in (m for m in acts if m.op_type == "Clip"):
            quant = self.ctx.graph.tensor(self.out).quant
            lo, hi = m.attr("min"), m.attr("max")
            qlo = int(quantize(np.float32(lo), quant)) if lo is not None else -(1 << 31)
            qhi = int(quantize(np.float32(hi), quant)) if hi is not None else (1 << 31) - 1
            clamp = (qlo, qhi)
        return Requant(words, relu, clamp)

    def choices(self):
        geo, lanes = self.geom, self.chip.lanes
        per_group, count = geo.cout // geo.groups, self._cout_count
        chunks = [count] + [lanes * k for k in (16, 8, 4, 2, 1) if lanes * k < count]
        if 1 < geo.groups and not geo.groups == geo.cin == geo.cout:   # grouped: a chunk never straddles two groups
            chunks = [c for c in [per_group] + chunks if c <= per_group and per_group % c == 0]
        return [(ct, rt) for ct in chunks for rt in self.row_choices(geo.ho)]

    def sizes(self, choice):
        ct, rt = choice
        geo = self.geom
        consts = [self._const_layout(ct)[1]]
        resident = consts * (2 if ct < self._cout_count else 1)
        out_shape = (1, ct, rt, geo.wo)
        per_set = [("acc", self.bytes(out_shape, Prec.INT32))]
        if self.x not in self.lmem:
            per_set.append(("x", self.bytes((1, geo.cin // geo.groups, min(geo.h, geo.halo_rows(rt)), geo.w),
                                            Prec.INT8)))
        if self.out not in self.lmem and not self.int32_result:
            per_set.append(("out", self.bytes(out_shape, Prec.INT8)))
        return resident, per_set

    @property
    def _cout_count(self) -> int:
        """How many output channels this emission computes (all unless split over cores)."""
        lo, hi = getattr(self, "cout_range", (0, self.geom.cout))
        return hi - lo

    @property
    def int32_result(self) -> bool:
        """ConvInteger's form: the int32 sums are the result (no requantisation)."""
        return self.ctx.graph.tensor(self.out).quant.storage == "int32"

    def emit(self, plan: QuantPlan) -> None:
        ctx, geo = self.ctx, self.geom
        ctx.em.layer = self.node.name
        ct, rt = plan.choice
        index = 0
        for chunk, (c0, c) in enumerate(steps_between(*self.cout_range, ct)):
            base = plan.resident[chunk % len(plan.resident)]
            consts = self._load_constants(base, c0, c)
            for n in self.ctx.samples_to_emit(geo.n):
                for h0, h in self.row_steps(geo.ho, rt):
                    self._tile(plan.sets[index % len(plan.sets)], consts, n, c0, c, h0, h)
                    index += 1
        self.note(plan, self.macs())

    def macs(self) -> int:
        geo = self.geom
        return geo.n * geo.cout * geo.ho * geo.wo * geo.cin // geo.groups * geo.kh * geo.kw * len(self.kernels)

    def _const_parts(self) -> list[tuple[np.ndarray, Prec]]:
        """The per-channel constants as (C, k) rows and their precision: weights, bias, requant words, then
        the further weight terms (zero points)."""
        return ([(self.packed, Prec.INT8), (self.bias.reshape(-1, 1), Prec.INT32), (self.requant.words, Prec.INT32)]
                + [(packed, Prec.INT8) for packed in self.extra_packed])

    def _const_layout(self, count: int) -> tuple[list[int], int]:
        """Per-lane byte offsets of a chunk of `count` channels' constants (_const_parts, each compact
        and aligned) in their one LMEM block, and the block's bytes per lane."""
        groups, align = -(-count // self.chip.lanes), self.chip.core.lmem_align_bytes
        offsets, end = [], 0
        for rows, prec in self._const_parts():
            offsets.append(end)
            end = -(-(end + groups * rows.shape[1] * prec.bytes) // align) * align
        return offsets, end

    def _load_constants(self, base: int, c0: int, count: int) -> list[LTile]:
        """DMAs of a channel chunk's constants (one unless a lane's bytes pass MAX_DMA_DIM), lane-major (lane l holds channels l, l + lanes,
        ...: one contiguous run per lane) into one block at `base`; their tiles."""
        lanes = self.chip.lanes
        groups, used = -(-count // lanes), min(count, lanes)
        offsets, size = self._const_layout(count)

        def lane_major(rows: np.ndarray, prec: Prec) -> np.ndarray:   # (count, k) -> (lanes, groups * k) bytes
            rows = np.ascontiguousarray(to_storage(rows, prec)).view(np.int8).reshape(count, -1)
            padded = np.zeros((groups * lanes, rows.shape[1]), np.int8)
            padded[:count] = rows
            return padded.reshape(groups, lanes, -1).transpose(1, 0, 2).reshape(lanes, -1)

        block = np.zeros((lanes, size), np.int8)
        tiles = []
        for at, (rows, prec) in zip(offsets, self._const_parts()):
            data = lane_major(rows[c0:c0 + count], prec)
            block[:, at:at + data.shape[1]] = data
            tiles.append(make_tile(self.chip, base + at, (1, count, 1, rows.shape[1]), prec, compact=True))
        addr = self.ctx.const_addr(f"{self.node.name}:constants:{c0}:{count}", block[:used], Prec.INT8)
        align = self.chip.core.lmem_align_bytes
        piece = MAX_DMA_DIM // align * align            # a lane's bytes in one DMA (weight terms may pass it)
        for at, width in steps(size, piece):
            shape = (1, used, 1, width)
            self.ctx.em.load(make_tile(self.chip, base + at, shape, Prec.INT8, compact=True),
                             DRegion(addr + at, shape, (used * size, size, size, 1), Prec.INT8))
        return tiles

    def _tile(self, offs, consts, n: int, c0: int, c: int, h0: int, h: int) -> None:
        ctx, geo, chip = self.ctx, self.geom, self.chip
        wt, bt, qt, *extra = consts
        r0, rows, up, dn = geo.input_rows(h0, h)
        acc = make_tile(chip, offs["acc"], (1, c, h, geo.wo), Prec.INT32)
        cin = geo.cin // geo.groups           # grouped: the input channels of this chunk's group
        first = c0 // (geo.cout // geo.groups) * cin
        xt = self.held(self.x, n, 0, geo.cin, r0, rows) if geo.groups == 1 else None
        if xt is None:
            xt = make_tile(chip, offs["x"], (1, cin, rows, geo.w), Prec.INT8)
            ctx.em.load(xt, self._x_region(n, r0, rows, first, cin))
        out = None if self.int32_result else (self.held(self.out, n, c0, c, h0, h)
                                              or make_tile(chip, offs["out"], (1, c, h, geo.wo), Prec.INT8))
        fields = acc.fields("res0", with_shape=True)
        fields.update(xt.fields("opd0"))
        self._convs(dict(**fields, opd0_c=cin, opd0_h=rows, opd0_w=geo.w, opd1_h=geo.kh, opd1_w=geo.kw,
                         opt_opd1_prec=int(Prec.INT8), opt_opd2_prec=int(Prec.INT32), opd0_up_pad=up, opd0_dn_pad=dn,
                         opd0_lf_pad=geo.pl, opd0_rt_pad=geo.pr, res_op_x_str=geo.sx, res_op_y_str=geo.sy,
                         opd1_x_ins0=geo.dx - 1, opd1_y_ins0=geo.dy - 1, weight_ic_block=IC_BLOCK,
                         opt_opd0_sign=signed(ctx, self.x), opt_opd1_sign=1, opd3_addr=self.zp_x), wt, bt, extra)
        self._finish(acc, out, qt, n, c0, c, h0, h)

    def _finish(self, acc: LTile, out: LTile | None, qt: LTile, n: int, c0: int, c: int, h0: int, h: int) -> None:
        """Requantise the sums into `out` and store it (an int32 result: the sums stored as they are)."""
        if self.int32_result:
            self.ctx.em.store(acc, self._y_region(n, c0, c, h0, h))
            return
        self._requantise(acc, out, qt)
        if self.out not in self.lmem or self.out in self.keep:
            self.ctx.em.store(out, self._y_region(n, c0, c, h0, h))

    def _convs(self, conv: dict, wt: LTile, bt: LTile, extra: list[LTile]) -> None:
        """The CONV by the first weight term with the folded bias, then one CONV per further term
        (weights with zero points: int8_terms) accumulating into the int32 sums; relu on the last."""
        relu = int(self.requant.relu)
        self.ctx.em.tiu(ConvTiu(**conv, opd1_addr=wt.addr, opd2_addr=bt.addr, opt_opd2_const=0,
                                opt_relu=0 if extra else relu))
        for i, term in enumerate(extra):
            self.ctx.em.tiu(ConvTiu(**conv, opd1_addr=term.addr, opt_opd2_const=1, opt_res_add=1,
                                    opt_relu=relu if i == len(extra) - 1 else 0))

    def _requantise(self, acc: LTile, out: LTile, qt: LTile) -> None:
        """The sums in `acc` (int32, or fp32 integers; rewritten in place) to `out` by the per-channel
        rq0 scales in `qt` (emit_requant), a fused Clip as bounds on the stored values."""
        emit_requant(self.ctx, out, acc, dict(opt_opd1_const=0, opd1_addr=qt.addr), self.zp_y,
                     signed(self.ctx, self.out), self.requant.clamp)

    def _x_region(self, n: int, r0: int, rows: int, c0: int, c: int) -> DRegion:
        geo = self.geom
        return self.ctx.region(self.x, (1, c, rows, geo.w), ((n * geo.cin + c0) * geo.h + r0) * geo.w,
                               (geo.cin * geo.h * geo.w, geo.h * geo.w, geo.w, 1))

    def _y_region(self, n: int, c0: int, c: int, h0: int, h: int) -> DRegion:
        geo = self.geom
        return self.ctx.region(self.out, (1, c, h, geo.wo), ((n * geo.cout + c0) * geo.ho + h0) * geo.wo,
                               (geo.cout * geo.ho * geo.wo, geo.ho * geo.wo, geo.wo, 1))


class FoldedConvQuant(ProductQuant):
    """A Conv with few input channels (lowering.quant.folds_kernel_rows): its input rows for each
    kernel row ky (rows oh * sy + ky * dy - pt) stacked as channels ky * C + c, so the cube runs a
    1 x kw kernel over kh * C channels instead of kh x kw over C; rows above or below the input are
    filled with the zero point (the padding value). One strided DMA per kernel row brings them: from
    DDR, or from the input held in LMEM (a chain's, a layer group's)."""

    def __init__(self, ctx: LowerCtx, group: Group):
        super().__init__(ctx, group)
        if IC_BLOCK != CUBE_INT8_CHANNELS:
            raise LoweringError("internal: the int8 weight block and lowering.quant disagree")
        cout, cin, kh, kw = self.kernels[0].shape

        def folded(w: np.ndarray) -> np.ndarray:
            return pack_conv_weights(w.transpose(0, 2, 1, 3).reshape(cout, kh * cin, 1, kw), IC_BLOCK)

        self.packed, self.extra_packed = folded(self.kernels[0]), [folded(k) for k in self.kernels[1:]]

    def sizes(self, choice):
        resident, per_set = super().sizes(choice)
        geo, rt = self.geom, choice[1]
        per_set = [(name, size) for name, size in per_set if name != "x"]
        per_set.append(("x", self.bytes((1, geo.cin * geo.kh, rt, geo.w), Prec.INT8)))
        return resident, per_set

    def _tile(self, offs, consts, n: int, c0: int, c: int, h0: int, h: int) -> None:
        ctx, geo, chip = self.ctx, self.geom, self.chip
        wt, bt, qt, *extra = consts
        acc = make_tile(chip, offs["acc"], (1, c, h, geo.wo), Prec.INT32)
        xt = make_tile(chip, offs["x"], (1, geo.cin * geo.kh, h, geo.w), Prec.INT8)
        for ky in range(geo.kh):
            self._load_kernel_row(xt.sub_channels(ky * geo.cin, geo.cin, chip), n, ky, h0, h)
        out = None if self.int32_result else (self.held(self.out, n, c0, c, h0, h)
                                              or make_tile(chip, offs["out"], (1, c, h, geo.wo), Prec.INT8))
        fields = acc.fields("res0", with_shape=True)
        fields.update(xt.fields("opd0"))
        self._convs(dict(**fields, opd0_c=geo.cin * geo.kh, opd0_h=h, opd0_w=geo.w, opd1_h=1, opd1_w=geo.kw,
                         opt_opd1_prec=int(Prec.INT8), opt_opd2_prec=int(Prec.INT32), opd0_lf_pad=geo.pl,
                         opd0_rt_pad=geo.pr, res_op_x_str=geo.sx, res_op_y_str=1, opd1_x_ins0=geo.dx - 1,
                         weight_ic_block=IC_BLOCK, opt_opd0_sign=signed(ctx, self.x), opt_opd1_sign=1,
                         opd3_addr=self.zp_x), wt, bt, extra)
        self._finish(acc, out, qt, n, c0, c, h0, h)

    def _load_kernel_row(self, dst: LTile, n: int, ky: int, h0: int, h: int) -> None:
        """Input rows (h0 + i) * sy + ky * dy - pt, i < h, into dst's rows; the zero point outside."""
        geo, em = self.geom, self.ctx.em
        first = [(h0 + i) * geo.sy + ky * geo.dy - geo.pt for i in range(h)]
        inside = [i for i, r in enumerate(first) if 0 <= r < geo.h]
        lo, hi = (inside[0], inside[-1] + 1) if inside else (0, 0)

        def rows(a: int, count: int) -> LTile:
            return LTile(dst.addr + a * dst.strides[2], (1, geo.cin, count, geo.w), Prec.INT8, dst.strides,
                         StrideMode.FREE)

        held = self.held(self.x, n, 0, geo.cin, first[lo], hi - lo) if hi > lo else None
        if held is not None:              # rows of the input held in LMEM, every sy-th: an LMEM -> LMEM copy
            s0, s1, s2, s3 = held.strides
            em.lmem_copy(rows(lo, hi - lo), LTile(held.addr, held.shape, Prec.INT8, (s0, s1, s2 * geo.sy, s3),
                                                  StrideMode.FREE))
        elif hi > lo:
            em.load(rows(lo, hi - lo), self.ctx.region(
                self.x, (1, geo.cin, hi - lo, geo.w), (n * geo.cin * geo.h + first[lo]) * geo.w,
                (geo.cin * geo.h * geo.w, geo.h * geo.w, geo.sy * geo.w, 1)))
        for a, b in ((0, lo), (hi, h)) if hi > lo else ((0, h),):
            if b > a:
                em.fill(rows(a, b - a), self.zp_x)


class GemmQuant(Planned):
    """MatMul by constant int8 weights (the Gemm form, with its int32 bias Add and a Relu / Clip) as
    MM2 (mm2.nn): A (rows x K, rows on lanes) times W (K x N, K on lanes) into an int32 accumulator
    with the folded bias row (bias - zp_a * column sums of W, broadcast to every lane used, added by
    the first K step), K in steps accumulated in int32 (opt_res_add), MM2's relu on the int32 sum.
    uint8 weights are taken as int8 (w - 128, zw - 128: the same products).
    Weights with zero points zw (per tensor or per column, zw > -128): sum (a - za)(w - zw) adds
    -zw[n] * (row sums of A) + K za zw[n]; the constant part goes into the bias row, the other is a
    second MM2 per K step of A by Zw, the K x N matrix whose every row is -zw (one broadcast DMA of
    the row per column chunk): exact, at twice that layer's MACs (a classifier, usually).
    Requantisation: per-tensor weights, emit_requant by s_a * s_w / s_y; per-column weights (their
    scale varies along the row, not per lane), the sums as fp32 (dq0) times a broadcast row of
    per-column scales (the fp32 product onnxruntime rounds) then emit_requant by 1."""

    def __init__(self, ctx: LowerCtx, group: Group):
        super().__init__(ctx, group)
        g, node = ctx.graph, self.node
        self.x, self.out = node.inputs[0], group.nodes[-1].outputs[0]
        w_info = g.tensor(node.inputs[1])
        self.k, self.n = w_info.shape
        self.rows = math.prod(g.tensor(self.x).shape[:-1])
        self.row_range = ctx.view_rows_to_emit(self.rows)     # cores: the rows / columns this core computes
        self.col_range = ctx.view_cols_to_emit(self.n)
        shift = 128 if w_info.quant.storage == "uint8" else 0     # uint8 weights as int8: w - 128, zw - 128
        self.weights = (np.asarray(w_info.const, np.int64) - shift).astype(np.int8)
        adds = [m for m in group.nodes if m.op_type == "Add"]
        bias = (np.asarray(g.tensor(adds[0].inputs[1]).const, np.int64).reshape(-1) if adds
                else np.zeros(self.n, np.int64))
        s_x, zp_x = per_tensor(ctx, self.x)
        zp_w = np.broadcast_to(np.asarray(w_info.quant.zero_point, np.int64).reshape(-1) - shift, (self.n,))
        self.weight_zero_points = np.any(zp_w != 0)
        self.minus_zp_w = (-zp_w).astype(np.int8)      # the K x N matrix of A.Zw: this row on every K lane
        folded = bias - zp_x * self.weights.astype(np.int64).sum(axis=0) + self.k * zp_x * zp_w
        if np.abs(folded).max(initial=0) >= 1 << 31:
            raise LoweringError(f"node {node.name}: the folded int32 bias overflows")
        self.bias = folded.astype(np.int32)
        s_y, self.zp_y = per_tensor(ctx, self.out)
        s_w = np.asarray(w_info.quant.scale, np.float32).reshape(-1)
        self.scales = ((np.float32(s_x) * s_w).astype(np.float32) / np.float32(s_y)).astype(np.float32)
        self.per_column = w_info.quant.per_channel
        acts = [m for m in group.nodes[1:] if m.op_type in ("Relu", "Clip")]
        self.relu = any(m.op_type == "Relu" for m in acts)
        self.clamp = None
        for m in (m for m in acts if m.op_type == "Clip"):
            quant = g.tensor(self.out).quant
            lo, hi = m.attr("min"), m.attr("max")
            self.clamp = (int(quantize(np.float32(lo), quant)) if lo is not None else -(1 << 31),
                          int(quantize(np.float32(hi), quant)) if hi is not None else (1 << 31) - 1)

    def choices(self):
        """Row, column and K steps, the least DDR traffic first (the weights load once per row step,
        the operand once per column step unless held), then the largest; a held operand (rows on
        lanes) is read whole along K and a held result written whole along N (MM2 reads and writes
        compact rows)."""
        lanes = self.chip.lanes
        row_count, col_count = self.row_range[1] - self.row_range[0], self.col_range[1] - self.col_range[0]
        rows = [row_count] + [lanes * k for k in (16, 8, 4, 2, 1) if lanes * k < row_count]
        ks = [self.k] if self.x in self.lmem else halvings(self.k)
        ns = [col_count] if self.out in self.lmem else halvings(col_count)

        def traffic(choice) -> int:
            rt, nt, kt = choice
            operand = 0 if self.x in self.lmem else -(-col_count // nt) * row_count * self.k
            weight_loads = 1 if kt >= self.k else -(-row_count // rt)    # one K step: once per column step
            return weight_loads * self.k * col_count + operand
        return sorted(((rt, nt, kt) for kt in ks for nt in ns for rt in rows),
                      key=lambda c: (traffic(c), -c[2], -c[1], -c[0]))

    def usable(self, choice) -> bool:
        """A held operand whole along K, a held result whole along N, and row steps starting on lane 0
        (MM2's rows of the operand, the accumulator and the result share lanes)."""
        rt, nt, kt = choice
        rows_ok = (rt >= self.rows or rt % self.chip.lanes == 0) and self.row_range[0] % self.chip.lanes == 0
        return (self.x not in self.lmem or (kt >= self.k and rows_ok)) and \
            (self.out not in self.lmem or (self.col_range == (0, self.n) and nt >= self.n and rows_ok))

    def sizes(self, choice):
        rt, nt, kt = choice
        lanes_used = min(rt, self.chip.lanes)
        resident = [self.bytes((1, lanes_used, 1, nt), Prec.INT32), self.bytes((1, lanes_used, 1, nt), Prec.FP32),
                    self.bytes((1, rt, 1, nt), Prec.INT32)]
        if self.out not in self.lmem:
            resident.append(self.bytes((1, rt, 1, nt), Prec.INT8))
        if self.weight_zero_points:
            resident.append(self.bytes((1, kt, 1, nt), Prec.INT8))
        per_set = [("w", self.bytes((1, kt, 1, nt), Prec.INT8))]
        if self.x not in self.lmem:
            per_set.insert(0, ("a", self.bytes((1, rt, 1, kt), Prec.INT8)))
        return resident, per_set

    def emit(self, plan: QuantPlan) -> None:
        ctx, chip = self.ctx, self.chip
        ctx.em.layer = self.node.name
        rt, nt, kt = plan.choice
        lo, hi = self.col_range         # cores: this core's columns of the weights, stored contiguous
        part = f":{lo}:{hi}" if (lo, hi) != (0, self.n) else ""
        self.w_addr = ctx.const_addr(f"{self.node.name}:int8_weights{part}",
                                     np.ascontiguousarray(self.weights[:, lo:hi]), Prec.INT8)
        b_addr = ctx.const_addr(f"{self.node.name}:int32_bias_row", self.bias, Prec.INT32)
        s_addr = ctx.const_addr(f"{self.node.name}:scale_row", self.scales, Prec.FP32)
        bias_at, scale_at, acc_at = plan.resident[:3]
        out_at = None if self.out in self.lmem else plan.resident[3]
        self.zw_at = plan.resident[-1] if self.weight_zero_points else None
        zw_addr = (ctx.const_addr(f"{self.node.name}:minus_weight_zero_points", self.minus_zp_w, Prec.INT8)
                   if self.weight_zero_points else None)
        index = 0
        k_steps = steps(self.k, kt)
        one_k = len(k_steps) == 1          # the column's weights stay, loaded for its first row step only
        for column, (c0, nc) in enumerate(steps_between(*self.col_range, nt)):
            if zw_addr is not None:          # -zw of the chunk's columns on every K lane: Zw's rows
                zw = make_tile(chip, self.zw_at, (1, kt, 1, nc), Prec.INT8)
                for g0, count in steps(kt, chip.lanes):   # one broadcast (the row read once) per lane group
                    ctx.em.broadcast_load(zw.sub_channels(g0, count, chip), zw_addr + c0, Prec.INT8)
            lanes_used = min(rt, chip.lanes)
            bias = make_tile(chip, bias_at, (1, lanes_used, 1, nc), Prec.INT32)
            ctx.em.broadcast_load(bias, b_addr + 4 * c0, Prec.INT32)
            scale = make_tile(chip, scale_at, (1, lanes_used, 1, nc), Prec.FP32)
            if self.per_column:
                ctx.em.broadcast_load(scale, s_addr + 4 * c0, Prec.FP32)
            for r0, rc in steps_between(*self.row_range, rt):
                acc = make_tile(chip, acc_at, (1, rc, 1, nc), Prec.INT32)
                for ks, (k0, kc) in enumerate(k_steps):
                    offs = plan.sets[index % len(plan.sets)]
                    w_at = plan.sets[column % len(plan.sets)]["w"] if one_k else offs["w"]
                    self._k_step(offs, acc, bias, (r0, rc), (c0, nc), (k0, kc), ks == 0, ks == len(k_steps) - 1,
                                 w_at, load_w=not one_k or r0 == self.row_range[0])
                    index += 1
                out = self.held(self.out, 0, r0, rc, 0, 1) or make_tile(chip, out_at, (1, rc, 1, nc), Prec.INT8)
                self._requantise(acc, out, scale, c0)
                if self.out not in self.lmem or self.out in self.keep:
                    ctx.em.store(out, ctx.region(self.out, out.shape, r0 * self.n + c0,
                                                 (self.rows * self.n, self.n, nc, 1)))
        self.note(plan, self.rows * self.n * self.k)

    def _k_step(self, offs: dict, acc: LTile, bias: LTile, rows, cols, ks, first: bool, last: bool,
                w_at: int, load_w: bool) -> None:
        """One MM2 of rows x K step x columns into acc: the bias row on the first step, relu on the last;
        the weights at `w_at`, loaded unless an earlier row step of the column did (`load_w`)."""
        ctx, chip = self.ctx, self.chip
        (r0, rc), (c0, nc), (k0, kc) = rows, cols, ks
        a = self.held(self.x, 0, r0, rc, 0, 1)          # a chain's rows: read in place (kc = K)
        if a is None:
            a = make_tile(chip, offs["a"], (1, rc, 1, kc), Prec.INT8)
            ctx.em.load(a, ctx.region(self.x, a.shape, r0 * self.k + k0, (self.rows * self.k, self.k, kc, 1)))
        w = make_tile(chip, w_at, (1, kc, 1, nc), Prec.INT8)
        if load_w:
            width = self.col_range[1] - self.col_range[0]       # the stored columns (this core's)
            ctx.em.load(w, DRegion(self.w_addr + k0 * width + c0 - self.col_range[0], w.shape,
                                   (self.k * width, width, nc, 1), Prec.INT8))
        ctx.em.tiu(Mm2Tiu(op="nn", res0_addr=acc.addr, res0_c=rc, res0_w=nc, opd0_addr=a.addr, opd0_c=rc,
                          opd0_w=kc, opd1_addr=w.addr, opd1_c=kc, opd1_w=nc,
                          opd2_addr=bias.addr if first else 0, opt_opd2_const=0 if first else 1,
                          opt_res0_prec=int(Prec.INT32), opt_opd0_prec=int(Prec.INT8),
                          opt_opd1_prec=int(Prec.INT8), opt_opd2_prec=int(Prec.INT32),
                          opt_res_add=0 if first else 1,
                          opt_relu=int(self.relu and last and not self.weight_zero_points),
                          opt_opd0_sign=signed(ctx, self.x), opt_opd1_sign=1))
        if self.weight_zero_points:          # + A . Zw = -zw[n] * (the row sums of A), exact in int32
            ctx.em.tiu(Mm2Tiu(op="nn", res0_addr=acc.addr, res0_c=rc, res0_w=nc, opd0_addr=a.addr, opd0_c=rc,
                              opd0_w=kc, opd1_addr=self.zw_at, opd1_c=kc, opd1_w=nc, opt_opd2_const=1,
                              opt_res0_prec=int(Prec.INT32), opt_opd0_prec=int(Prec.INT8),
                              opt_opd1_prec=int(Prec.INT8), opt_opd2_prec=int(Prec.INT32), opt_res_add=1,
                              opt_relu=int(self.relu and last), opt_opd0_sign=signed(ctx, self.x), opt_opd1_sign=1))

    def _requantise(self, acc: LTile, out: LTile, scale: LTile, c0: int) -> None:
        ctx = self.ctx
        if not self.per_column:
            emit_requant(ctx, out, acc, rq0_scalars(float(self.scales[0]), 0.0), self.zp_y, signed(ctx, self.out),
                         self.clamp)
            return
        real = acc.as_prec(Prec.FP32)
        emit_rq(ctx, "dq0", real, acc, dq0_scalars(0, 1.0))            # int32 -> fp32, in place
        row = LTile(scale.addr, acc.shape, Prec.FP32, (0, 0, 0, 1), StrideMode.FREE)   # every lane: its copy
        ctx.em.ar("mul", real, real, row)
        emit_requant(ctx, out, real, rq0_scalars(1.0, 0.0), self.zp_y, signed(ctx, self.out), self.clamp)


class ActMatMulQuant(Planned):
    """MatMul of two quantized activations (attention's Q.K^T and P.V), A (batch, M, K) by B (batch,
    K, N), both per-tensor 8-bit, into a per-tensor 8-bit result, per batch item in row / column / K
    steps on MM2 (int8 x int8 -> int32). The zero points are handled exactly by expanding
    sum_k (a - za)(b - zb) = A.B + Z.B + A.Zb + K za zb, each term an integer:

    - A.B: mm2 of the stored integers (signed or not by their storage);
    - Z.B: mm2 of a constant matrix filled with -za by B, accumulated into the same int32 tile
      (opt_res_add): -za times B's column sums, on every row (-za = 128 is stored as uint8; a uint8
      zero point past 128 takes two fills, -128 and 128 - za: _fills);
    - A.Zb: mm2 of A by a K x 1 column filled with -zb (the same fills): -zb times A's row sums (one
      int32 per lane), added along the row by an int32 arith add (stride 0 along w);

    Operands read through a Transpose the lowering folded into the MatMul (a_perm / b_perm /
    y_perm) are loaded / stored through the permuted strides; B stored transposed (attention's K^T)
    runs as mm2.nt.
    - K za zb: the int32 bias row of the first K step (a constant, broadcast-loaded to every lane).

    Every value stays below 2**31 for K < 2**15 (|a - za|, |b - zb| <= 255). Then onnxruntime's
    requantisation (emit_requant) by fp32(fp32(s_a) * fp32(s_b)) / fp32(s_y) as its QLinearMatMul
    computes the output scale. Z.B costs a second full product: cheap beside the weight matmuls of
    an encoder (attention's two products are ~6% of BERT-base's MACs)."""

    def __init__(self, ctx: LowerCtx, group: Group):
        super().__init__(ctx, group)
        node = self.node
        self.a, self.b, self.out = node.inputs[0], node.inputs[1], node.outputs[0]
        a_shape, self.a_st = self._view(self.a, node.attr("a_perm"))
        b_shape, self.b_st = self._view(self.b, node.attr("b_perm"))
        y_shape, self.y_st = self._view(self.out, node.attr("y_perm"), inverse=True)
        self.m, self.k = a_shape[-2:]
        self.n = b_shape[-1]
        self.batch_shape = tuple(a_shape[:-2])
        if tuple(b_shape[:-2]) != self.batch_shape or tuple(y_shape[:-2]) != self.batch_shape \
                or self.a_st[-1] != 1 or self.y_st[-1] != 1 or 1 not in self.b_st[-2:]:
            raise LoweringError(f"node {node.name}: an int8 product of activations with broadcast batch dims or "
                                f"operands read across their rows")
        self.transposed_b = self.b_st[-1] != 1        # B^T rows in DDR (a folded K Transpose): mm2.nt
        self.batch = math.prod(self.batch_shape)
        s_a, self.za = per_tensor(ctx, self.a)
        s_b, self.zb = per_tensor(ctx, self.b)
        s_y, self.zp_y = per_tensor(ctx, self.out)
        self.scale = float((np.float32(s_a) * np.float32(s_b)).astype(np.float32) / np.float32(s_y))
        self.bias = np.full(self.n, self.k * self.za * self.zb, np.int64)
        if np.abs(self.bias).max(initial=0) >= 1 << 31 or self.k >= 1 << 15:
            raise LoweringError(f"node {node.name}: K = {self.k} is too long for an exact int32 accumulation")

    def _view(self, tensor: str, perm, inverse: bool = False) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(shape, element strides) of the logical operand / result read through a folded Transpose
        (lowering.prepare.fold_matmul_transposes: a_perm / b_perm read the source permuted; y_perm
        writes the result into its permutation: result dim e is dim perm.index(e) of the tensor)."""
        shape = tuple(self.ctx.graph.tensor(tensor).shape)
        st, acc = [0] * len(shape), 1
        for d in reversed(range(len(shape))):
            st[d], acc = acc, acc * shape[d]
        if perm is None:
            return shape, tuple(st)
        if inverse:
            order = [list(perm).index(e) for e in range(len(perm))]
            return tuple(shape[d] for d in order), tuple(st[d] for d in order)
        return tuple(shape[p] for p in perm), tuple(st[p] for p in perm)

    def _offset(self, strides, item: int) -> int:
        """Element offset of batch item `item` in an operand of these strides."""
        index = np.unravel_index(item, self.batch_shape) if self.batch_shape else ()
        return int(sum(int(i) * st for i, st in zip(index, strides)))

    @staticmethod
    def _fills(zero_point: int) -> list[tuple[int, int]]:
        """(stored int8 value, sign flag) of the constant matrices whose products sum to -zero_point times
        the other operand: none for 0, one for -zero_point in [-128, 128] (128 stored as uint8), two for
        a uint8 zero point past 128 (-zero_point = -128 + (128 - zero_point))."""
        v = -zero_point
        if v == 0:
            return []
        if -128 <= v <= 127:
            return [(v, 1)]
        if v == 128:
            return [(-128, 0)]
        return [(-128, 1), (v + 128, 1)]

    def _fill_tiles(self, at: int, shape, zero_point: int) -> dict[int, LTile]:
        """{stored value: its filled tile} of _fills(zero_point), one tile after the other from `at`."""
        tiles = {}
        for value, _ in self._fills(zero_point):
            tiles[value] = make_tile(self.chip, at, shape, Prec.INT8)
            self.ctx.em.fill(tiles[value], value)
            at += self.bytes(shape, Prec.INT8)
        return tiles

    def choices(self):
        lanes = self.chip.lanes
        rows = [self.m] + [lanes * k for k in (16, 8, 4, 2, 1) if lanes * k < self.m]
        return [(rt, nt, kt) for kt in halvings(self.k) for nt in halvings(self.n) for rt in rows]

    def sizes(self, choice):
        rt, nt, kt = choice
        lanes_used = min(rt, self.chip.lanes)
        fills_a, fills_b = max(1, len(self._fills(self.za))), max(1, len(self._fills(self.zb)))
        resident = [self.bytes((1, lanes_used, 1, nt), Prec.INT32), self.bytes((1, rt, 1, nt), Prec.INT32),
                    self.bytes((1, rt, 1, nt), Prec.INT8), self.bytes((1, rt, 1, 1), Prec.INT32),
                    fills_a * self.bytes((1, rt, 1, kt), Prec.INT8), fills_b * self.bytes((1, kt, 1, 1), Prec.INT8)]
        b_shape = (1, nt, 1, kt) if self.transposed_b else (1, kt, 1, nt)
        per_set = [("a", self.bytes((1, rt, 1, kt), Prec.INT8)), ("b", self.bytes(b_shape, Prec.INT8))]
        return resident, per_set

    def emit(self, plan: QuantPlan) -> None:
        ctx, chip = self.ctx, self.chip
        ctx.em.layer = self.node.name
        rt, nt, kt = plan.choice
        bias_at, acc_at, out_at, rows_at, z_at, zb_at = plan.resident
        b_addr = ctx.const_addr(f"{self.node.name}:zero_point_product_row", self.bias.astype(np.int32), Prec.INT32)
        z = self._fill_tiles(z_at, (1, rt, 1, kt), self.za)           # filled once: every view reads the fill
        zb = self._fill_tiles(zb_at, (1, kt, 1, 1), self.zb)
        index = 0
        for item in range(self.batch):
            for c0, nc in steps(self.n, nt):
                bias = make_tile(chip, bias_at, (1, min(rt, chip.lanes), 1, nc), Prec.INT32)
                ctx.em.broadcast_load(bias, b_addr + 4 * c0, Prec.INT32)
                for r0, rc in steps(self.m, rt):
                    acc = make_tile(chip, acc_at, (1, rc, 1, nc), Prec.INT32)
                    sums = make_tile(chip, rows_at, (1, rc, 1, 1), Prec.INT32)
                    k_steps = steps(self.k, kt)
                    for ks, (k0, kc) in enumerate(k_steps):
                        self._k_step(plan.sets[index % len(plan.sets)], (acc, sums, bias, z, zb), item,
                                     (r0, rc), (c0, nc), (k0, kc), ks == 0)
                        index += 1
                    if self.zb:
                        ctx.em.ar("add", acc, acc, sums.broadcast(acc.shape, w=True))
                    out = make_tile(chip, out_at, (1, rc, 1, nc), Prec.INT8)
                    emit_requant(ctx, out, acc, rq0_scalars(self.scale, 0.0), self.zp_y, signed(ctx, self.out))
                    sm, sn = self.y_st[-2:]
                    ctx.em.store(out, ctx.region(self.out, out.shape, self._offset(self.y_st, item) + r0 * sm + c0 * sn,
                                                 (sm * rc, sm, sn * nc, sn)))
        self.note(plan, self.batch * self.m * self.n * self.k)

    def _k_step(self, offs: dict, tiles, item: int, rows, cols, ks, first: bool) -> None:
        """One K step: A.B (+ the bias row on the first step), Z.B, and A.Zb into the row sums."""
        ctx, chip = self.ctx, self.chip
        acc, sums, bias, z, zb = tiles
        (r0, rc), (c0, nc), (k0, kc) = rows, cols, ks
        a = make_tile(chip, offs["a"], (1, rc, 1, kc), Prec.INT8)
        (am, ak), (bk, bn) = self.a_st[-2:], self.b_st[-2:]
        ctx.em.load(a, ctx.region(self.a, a.shape, self._offset(self.a_st, item) + r0 * am + k0 * ak,
                                  (am * rc, am, ak * kc, ak)))
        b_at = self._offset(self.b_st, item) + k0 * bk + c0 * bn
        if self.transposed_b:                          # B^T rows: (nc, kc), K contiguous
            b = make_tile(chip, offs["b"], (1, nc, 1, kc), Prec.INT8)
            ctx.em.load(b, ctx.region(self.b, b.shape, b_at, (bn * nc, bn, bk * kc, bk)))
        else:
            b = make_tile(chip, offs["b"], (1, kc, 1, nc), Prec.INT8)
            ctx.em.load(b, ctx.region(self.b, b.shape, b_at, (bk * kc, bk, bn * nc, bn)))
        sign_a, sign_b = signed(ctx, self.a), signed(ctx, self.b)
        self._mm2(acc, a, sign_a, b, sign_b, accumulate=not first, bias=bias if first else None, depth=kc)
        for value, sign in self._fills(self.za):
            self._mm2(acc, z[value], sign, b, sign_b, accumulate=True, rows=rc, depth=kc)
        for i, (value, sign) in enumerate(self._fills(self.zb)):
            self._mm2(sums, a, sign_a, zb[value], sign, accumulate=not first or i > 0, depth=kc, cols=1, plain=True)

    def _mm2(self, res: LTile, left: LTile, left_sign: int, right: LTile, right_sign: int, accumulate: bool,
             bias: LTile | None = None, rows: int | None = None, depth: int | None = None,
             cols: int | None = None, plain: bool = False) -> None:
        """res (rows x cols, int32) (+)= left (rows x depth) . right (depth x cols), int8 operands; right
        is B (mm2.nt when B's rows are stored transposed) unless `plain` (a K x 1 column: mm2.nn)."""
        rows, cols = rows or res.c, cols or res.w
        nt = self.transposed_b and not plain
        opd1 = (cols, depth) if nt else (depth, cols)
        self.ctx.em.tiu(Mm2Tiu(op="nt" if nt else "nn", res0_addr=res.addr, res0_c=rows, res0_w=cols,
                               opd0_addr=left.addr, opd0_c=rows, opd0_w=depth, opd1_addr=right.addr,
                               opd1_c=opd1[0], opd1_w=opd1[1],
                               opd2_addr=bias.addr if bias is not None else 0,
                               opt_opd2_const=0 if bias is not None else 1, opt_res0_prec=int(Prec.INT32),
                               opt_opd0_prec=int(Prec.INT8), opt_opd1_prec=int(Prec.INT8),
                               opt_opd2_prec=int(Prec.INT32), opt_res_add=int(accumulate),
                               opt_opd0_sign=left_sign, opt_opd1_sign=right_sign))


def halvings(total: int) -> list[int]:
    """total, then halves of it (rounded up) down to 1: step sizes to try, largest first."""
    out = [total]
    while out[-1] > 1:
        out.append(-(-out[-1] // 2))
    return out


class DepthwiseQuant(ProductQuant):
    """Depthwise Conv (group = channels) on int8. A signed input of zero point 0 with int8 weights (symmetric
    quantization) runs PordTiu's integer form: the int8 input and weights, the int32 bias, exact int32
    sums (zero padding is the zero point's), pord's relu, then the per-channel rq0. Otherwise the input
    becomes the exact fp32 integers q - zp_x (dq0, scale 1; the zero padding of pord.depthwise is then the zero
    point's padding), the int8 weights and the int32 bias are fp32 integers, and pord.depthwise sums
    the products in fp32: exact while every partial sum stays below 2**24 (checked), so the result is
    the int32 accumulator; CONV's relu is pord's, and the per-channel rq0 reads the fp32 sums.
    A bias past that (a trained channel of tiny weight scale) is split: pord adds its low byte (the
    sums stay exact), then one fp32 add of the rest (a multiple of 256, exact in fp32) rounds the
    whole sum once, as onnxruntime rounds its int32 accumulator to fp32 (the relu then follows it)."""

    EXACT = 1 << 24                       # fp32 integers are exact below this
    BIAS_LOW = 256                        # the bias part pord adds when the bias is split

    def __init__(self, ctx: LowerCtx, group: Group):
        Planned.__init__(self, ctx, group)
        g, node = ctx.graph, self.node
        self.x, self.out = node.inputs[0], group.nodes[-1].outputs[0]
        self.geom = conv_geometry(ctx, node)
        self.cout_range = ctx.channels_to_emit(self.geom.cout)
        w_info = g.tensor(node.inputs[1])
        weights = centred_weights(w_info).reshape(self.geom.cout, -1)
        bias = self._const_bias(node.inputs[2] if len(node.inputs) > 2 else None)
        s_x, self.zp_x = per_tensor(ctx, self.x)
        # the PorD unit's int8 depthwise (PordTiu's integer form) pads with zeros: exact for a signed input
        # of zero point 0 with int8 weights (symmetric quantization, as tpu-mlir deploys); else fp32 below
        self.integer = (self.zp_x == 0 and signed(ctx, self.x) == 1 and np.abs(weights).max(initial=0) <= 127
                        and np.abs(bias).max(initial=0) < 1 << 31)
        if self.integer:
            self.weights, self.bias, self.bias_high = weights.astype(np.int8), bias.astype(np.int32), None
            self.requant = self._requant(w_info.quant, s_x)
            return
        lo, hi = storage_range(g.tensor(self.x).quant.storage)
        reach = np.abs(weights).sum(axis=1) * max(abs(lo - self.zp_x), abs(hi - self.zp_x))
        self.bias_high = None             # the part of a split bias added after pord (fp32, exact)
        if (reach + np.abs(bias)).max(initial=0) >= self.EXACT:
            high = np.floor_divide(bias, self.BIAS_LOW) * self.BIAS_LOW
            bias, self.bias_high = bias - high, high.astype(np.float32)
            reach = reach + self.BIAS_LOW
        if reach.max(initial=0) >= self.EXACT:
            raise LoweringError(f"node {node.name}: depthwise sums may reach {int(reach.max())}, past fp32's exact "
                                f"integers (2**24)")
        self.weights, self.bias = weights.astype(np.float32), bias.astype(np.float32)
        self.requant = self._requant(w_info.quant, s_x)

    def _const_parts(self) -> list[tuple[np.ndarray, Prec]]:
        weight_prec, bias_prec = self._const_precs()
        parts = [(self.weights, weight_prec), (self.bias.reshape(-1, 1), bias_prec), (self.requant.words, Prec.INT32)]
        return parts + ([(self.bias_high.reshape(-1, 1), Prec.FP32)] if self.bias_high is not None else [])

    def _const_precs(self) -> tuple[Prec, Prec]:
        """The weights' and the bias's precision in LMEM: the integer form's int8 / int32, else fp32."""
        return (Prec.INT8, Prec.INT32) if self.integer else (Prec.FP32, Prec.FP32)

    def sizes(self, choice):
        ct, rt = choice
        geo = self.geom
        resident = [self._const_layout(ct)[1]] * (2 if ct < self._cout_count else 1)
        in_shape, out_shape = (1, ct, min(geo.h, geo.halo_rows(rt)), geo.w), (1, ct, rt, geo.wo)
        per_set = [("acc", self.bytes(out_shape, Prec.FP32))]
        if not self.integer:
            per_set.append(("x_f", self.bytes(in_shape, Prec.FP32)))
        if self.x not in self.lmem:
            per_set.append(("x", self.bytes(in_shape, Prec.INT8)))
        if self.out not in self.lmem:
            per_set.append(("out", self.bytes(out_shape, Prec.INT8)))
        return resident, per_set

    def macs(self) -> int:
        geo = self.geom
        return geo.n * geo.cout * geo.ho * geo.wo * geo.kh * geo.kw

    def _tile(self, offs, consts, n: int, c0: int, c: int, h0: int, h: int) -> None:
        ctx, geo, chip = self.ctx, self.geom, self.chip
        wt, bt, qt = consts[:3]
        relu_in_pord = self.requant.relu and self.bias_high is None
        r0, rows, up, dn = geo.input_rows(h0, h)
        acc = make_tile(chip, offs["acc"], (1, c, h, geo.wo), Prec.INT32 if self.integer else Prec.FP32)
        xt = self.held(self.x, n, c0, c, r0, rows)
        if xt is None:
            xt = make_tile(chip, offs["x"], (1, c, rows, geo.w), Prec.INT8)
            ctx.em.load(xt, self.ctx.region(self.x, xt.shape, ((n * geo.cin + c0) * geo.h + r0) * geo.w,
                                            (geo.cin * geo.h * geo.w, geo.h * geo.w, geo.w, 1)))
        out = self.held(self.out, n, c0, c, h0, h) or make_tile(chip, offs["out"], (1, c, h, geo.wo), Prec.INT8)
        x_f = xt                          # the integer form reads the int8 input as it is
        if not self.integer:
            x_f = make_tile(chip, offs["x_f"], (1, c, rows, geo.w), Prec.FP32)
            emit_rq(ctx, "dq0", x_f, xt, dq0_scalars(self.zp_x, 1.0), in_signed=signed(ctx, self.x))
        const_prec = self._const_precs()
        fields = acc.fields("res0", with_shape=True)
        fields.update(x_f.fields("opd0"))
        ctx.em.tiu(PordTiu(op="depthwise", **fields, opd0_h=rows, opd0_w=geo.w, opd1_addr=wt.addr, opd1_h=geo.kh,
                           opd1_w=geo.kw, opt_opd1_const=0, opt_opd1_prec=int(const_prec[0]), opd2_addr=bt.addr,
                           opt_opd2_const=0, opt_opd2_prec=int(const_prec[1]), opt_relu=int(relu_in_pord),
                           opd0_up_pad=up, opd0_dn_pad=dn, opd0_lf_pad=geo.pl, opd0_rt_pad=geo.pr,
                           res_op_x_str=geo.sx, res_op_y_str=geo.sy, opd1_x_ins0=geo.dx - 1, opd1_y_ins0=geo.dy - 1))
        if self.bias_high is not None:
            ctx.em.ar("add", acc, acc, consts[3].broadcast(acc.shape, n=True, h=True, w=True))
            if self.requant.relu:
                ctx.em.ar("max", acc, acc, 0.0)
        self._requantise(acc, out, qt)
        if self.out not in self.lmem or self.out in self.keep:
            ctx.em.store(out, self._y_region(n, c0, c, h0, h))


# ---------------------------------------------------------------- chains


@dataclass(frozen=True)
class ChainPlan(FrozenPlan):
    """A chain's plan: its held tensors' offsets (at the top of the window) and each member's plan
    below them; `held` empty: the members run one by one, each through DDR."""

    held: tuple[tuple[str, int], ...] = ()
    members: tuple[QuantPlan, ...] = ()
    top: int | None = None
    reused: ClassVar[frozenset[str]] = frozenset({CHAIN_WORK})   # members' buffers: one member at a time


class ChainQuant:
    """A QuantChain (lowering/quant.py): its members in order, every tensor made and read inside it
    held whole in LMEM (aligned NCHW int8) from its producer to its last reader, at the top of the
    window (first fit over their lifetimes), the members' working buffers below; tensors read
    outside the chain (or by a float output's tail: lowering.quant.tail_boundary) are stored as
    well. A Concat input may be written by its producer straight into the held output (_placements).
    When that does not fit, the members run one by one through DDR as unchained groups do."""

    def __init__(self, ctx: LowerCtx, group):
        self.ctx, self.group, self.chip = ctx, group, ctx.chip
        self.members = [single_emitter(ctx, m) for m in group.members]
        self.views = group.views
        self.lifetimes = held_tensors(ctx.graph, group.members, self.views)
        inside = {n.name for n in group.nodes}
        names = {t: [t] + [v for v in self.views if view_source(self.views, v) == t] for t in self.lifetimes}
        boundary = tail_boundary(ctx.graph)
        self.keep = {t for t in self.lifetimes if any(
            v in ctx.graph.outputs or v in boundary or any(c.name not in inside and c.outputs[0] not in self.views
                                                           for c in ctx.graph.consumers(v)) for v in names[t])}
        self.placed = self._placements()

    def _placements(self) -> dict[str, tuple[str, int]]:
        """{input: (held Concat output, first channel)} of the Concat inputs made in the chain that its
        producer writes straight into the output's channels (the Concat then copies nothing): same
        Quant as the output, one sample, and a first channel on lane 0 (a whole channel group further
        on: the input's aligned tile is the output's from that group)."""
        placed: dict[str, tuple[str, int]] = {}
        for member in self.members:
            if not isinstance(member, ConcatQuant) or member.out not in self.lifetimes:
                continue
            inputs = [x for x, _, _ in member.parts]
            for x, c0, _ in member.parts:
                if x in self.lifetimes and inputs.count(x) == 1 and (x, c0, _) not in member.requantised \
                        and c0 % self.chip.lanes == 0 and member.shape[0] == 1 and x not in placed \
                        and not any(target == x for target, _ in placed.values()):
                    placed[x] = (member.out, c0)
        return {x: (out, c0) for x, (out, c0) in placed.items() if out not in placed}

    def plan(self, region: str) -> ChainPlan | None:
        start, end = self.ctx.window(region)
        offsets, size = self._held_offsets()
        top = (end - size) // self.chip.bank_bytes * self.chip.bank_bytes
        plans = self._member_plans(region, offsets, top) if top > start else None
        if plans is None:
            offsets, top = {}, None
            plans = self._member_plans(region, offsets, top)
            if plans is None:
                return None
        buffers = tuple((f"held {t}", top + off, held_bytes(self.ctx.graph, t, self.chip.lanes))
                        for t, off in offsets.items() if t not in self.placed)
        work = tuple((CHAIN_WORK, off, size) for p in plans for _, off, size in p.buffers)
        return ChainPlan(region, (start, end), buffers + work, tuple((t, top + off) for t, off in offsets.items()),
                         tuple(plans), top)

    def wants_wider(self, plan: ChainPlan) -> bool:
        """A plan whose members run one by one through DDR: the whole region may hold the tensors."""
        return bool(self.lifetimes) and not plan.held

    def prefers(self, plan: ChainPlan, other: ChainPlan) -> bool:
        return bool(plan.held) and not other.held

    def _held_offsets(self) -> tuple[dict[str, int], int]:
        """Where the held tensors lie above the chain's base (lowering.quant.held_placement), and their extent."""
        lifetimes = {t: life for t, life in self.lifetimes.items() if t not in self.placed}
        for t, (out, _) in self.placed.items():          # the output's space is taken from its first input on
            lifetimes[out] = (min(lifetimes[out][0], self.lifetimes[t][0]), lifetimes[out][1])
        offsets, extent = held_placement(self.ctx.graph, lifetimes, self.chip)
        for t, (out, c0) in self.placed.items():
            group_bytes = make_tile(self.chip, 0, self.ctx.graph.tensor(out).shape, Prec.INT8).strides[1]
            offsets[t] = offsets[out] + c0 // self.chip.lanes * group_bytes
        return offsets, extent

    def _member_plans(self, region: str, offsets: dict[str, int], top: int | None) -> list[QuantPlan] | None:
        """Each member's plan in the LMEM ring after the previous member's buffers (as groups follow
        each other: its constant loads then need not wait for the previous member's compute), else in
        the whole region; None when a member fits neither."""
        ctx, saved, plans = self.ctx, self.ctx.previous, []
        try:
            for member in self.members:
                self._hand_over(member, {t: top + off for t, off in offsets.items()}, top)
                plan = member.plan(region)
                if plan is None and region == "ring" and ctx.previous != saved:
                    ctx.previous = saved
                    plan = member.plan(region)
                if plan is None:
                    return None
                plans.append(plan)
                if plan.buffers:
                    ctx.previous = (min(off for _, off, _ in plan.buffers), plan.peak)
            return plans
        finally:
            ctx.previous = saved

    def _hand_over(self, member, held: dict[str, int], top: int | None) -> None:
        """Give a member the held tensors it reads or writes (as whole aligned tiles) and its ceiling."""
        g = self.ctx.graph
        mine = {t for n in member.group.nodes for t in (*n.inputs, *n.outputs)
                if t and view_source(self.views, t) in held}
        member.lmem = {t: make_tile(self.chip, held[view_source(self.views, t)], held_view(g.tensor(t).shape),
                                    Prec.INT8) for t in mine} | member.sides
        member.keep = {t for t in mine if view_source(self.views, t) in self.keep}
        member.top = top
        if isinstance(member, ConcatQuant):
            member.placed = {t for t in mine if t in self.placed}

    def emit(self, plan: ChainPlan) -> None:
        for member, member_plan in zip(self.members, plan.members):
            self._hand_over(member, dict(plan.held), plan.top)
            member.emit(member_plan)
        self._record_placed_writers()

    def _record_placed_writers(self) -> None:
        """A Concat output's held record names the layers that wrote inputs straight into it as well
        (Program.held_tensors: verify's snapshot of it waits for their writes too, not only the Concat's
        own copies, which need not wait for them)."""
        held = self.ctx.held_tensors
        for t, (out, _) in self.placed.items():
            if out in held:
                writer = next(m for m in self.members if t in {x for n in m.group.nodes for x in n.outputs})
                tile, layers = held[out]
                held[out] = (tile, layers + tuple(n.name for n in writer.group.nodes if n.name not in layers))


class QuantMove(MoveEmitter):
    """A movement node on 8-bit tensors sharing one per-tensor Quant (lowering.quant.MOVES): the
    float movement emitter (ops/movement.py: DDR -> DDR DMAs, or its LMEM paths) at the storage
    precision, so the stored bytes move unchanged (exact)."""

    def __init__(self, ctx: LowerCtx, group: Group):
        super().__init__(ctx, group)
        self.prec = ctx.tensor_prec(group.anchor.outputs[0])


def single_emitter(ctx: LowerCtx, group: Group):
    """The emitter of one quant group, by its first node's kind."""
    op = group.anchor.op_type
    if op in MOVES:
        return QuantMove(ctx, group)
    groups = group.anchor.attr("group", 1) if op == "Conv" else 1
    if groups > 1 and groups == ctx.graph.tensor(group.anchor.inputs[0]).shape[1] \
            == ctx.graph.tensor(group.anchor.outputs[0]).shape[1]:        # a channel multiplier: grouped
        return DepthwiseQuant(ctx, group)
    if op == "MatMul":
        weights = ctx.graph.tensor(group.anchor.inputs[1]).is_const
        return GemmQuant(ctx, group) if weights else ActMatMulQuant(ctx, group)
    if op == "Conv":
        return (FoldedConvQuant if folds_kernel_rows(ctx.graph, group.anchor) else ProductQuant)(ctx, group)
    if op in ("MaxPool", "AveragePool", "GlobalAveragePool"):
        return PoolQuant(ctx, group)
    if op == "Concat":
        return ConcatQuant(ctx, group)
    return ElementwiseQuant(ctx, group)


def quant_emitter(ctx: LowerCtx, group: Group):
    """The emitter of a "quant" group (lowering/quant.py): a chain, or one group by its first node's kind."""
    return ChainQuant(ctx, group) if isinstance(group, QuantChain) else single_emitter(ctx, group)


def _boundary_ports(graph, group: Group, chip) -> tuple[dict[str, str], dict[str, str]]:
    """Layer groups (lowering/residency.py) keep a quant group's tensors in LMEM where its emitter takes
    them there (a 4-D tensor NCHW, any other as a matrix: the chain's held_view): the float side of a
    QuantizeLinear / DequantizeLinear (in the program's float type), so an int8 <-> float boundary
    costs no float round trip, and the 8-bit inputs and results of the emitters that take held
    tensors (lowering.quant.takes_held), so int8 groups and chains pass them on in LMEM. A chain offers
    its members' ports on the tensors it shares with other groups (not those it holds itself)."""
    if not isinstance(group, QuantChain):
        return _member_ports(graph, group, tail_boundary(graph))
    made = {t for n in group.nodes for t in n.outputs}
    held = set(held_tensors(graph, group.members, group.views))
    boundary = tail_boundary(graph)
    readable, writable, refused = {}, {}, set()
    for member in group.members:
        r, w = _member_ports(graph, member, boundary)
        reads = {t for n in member.nodes for t in n.inputs if t}
        refused |= reads - set(r)            # a member reading it from DDR: it stays there
        readable.update((t, v) for t, v in r.items() if view_source(group.views, t) not in made)
        writable.update((t, v) for t, v in w.items() if t not in held)
    return {t: v for t, v in readable.items() if t not in refused}, writable


def _member_ports(graph, group: Group, boundary: set[str]) -> tuple[dict[str, str], dict[str, str]]:
    """The float side of a lone QuantizeLinear / DequantizeLinear; the 8-bit runtime inputs and results
    of a group that takes held tensors, but those a float output's tail reads (stored for verify:
    lowering.quant.tail_boundary)."""
    node = group.anchor
    readable, writable = {}, {}
    boundary_node = len(group.nodes) == 1 and node.op_type in ("QuantizeLinear", "DequantizeLinear")
    if boundary_node:
        side = node.inputs[0] if node.op_type == "QuantizeLinear" else node.outputs[0]
        (readable if node.op_type == "QuantizeLinear" else writable).update(_held_port(graph, side))
    if not (boundary_node or takes_held(graph, group)):
        return readable, writable
    for t in (t for n in group.nodes for t in n.inputs if t):
        if _eight_bit(graph, t):
            readable.update(_held_port(graph, t))
    for t in (t for n in group.nodes for t in n.outputs if t):
        if _eight_bit(graph, t) and t not in boundary:
            writable.update(_held_port(graph, t))
    return readable, writable


def _eight_bit(graph, tensor: str) -> bool:
    info = graph.tensor(tensor)
    return not info.is_const and info.quant is not None and info.quant.storage != "int32"


def _held_port(graph, tensor: str) -> dict[str, str]:
    """{tensor: the layout of its held_view} (none for a tensor of rank < 2)."""
    shape = graph.tensor(tensor).shape
    return {tensor: default_layout(shape)} if len(shape) >= 2 else {}


quant_emitter.resident_ports = _boundary_ports
