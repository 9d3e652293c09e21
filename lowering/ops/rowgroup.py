"""Row-wise groups: elementwise chains, reductions over the trailing axes, softmax and layer norm,
tiled over rows (rows across lanes) and, for purely elementwise groups, over columns."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tpuflow.errors import LoweringError
from tpuflow.isa import Prec, StrideMode
from tpuflow.lowering import ewise, mathops
from tpuflow.lowering.context import LowerCtx
from tpuflow.lowering.emitplan import FrozenPlan
from tpuflow.lowering.ewise import ROW_NORMALIZE, ROW_REDUCE, SCRATCH_NEED, Kind
from tpuflow.lowering.groups import Group
from tpuflow.lowering.layergroup import MATRIX, NCHW
from tpuflow.lowering.tensors import DRegion, LTile, make_tile, tile_bytes_per_lane
from tpuflow.lowering.tiling import largest_fitting, pipelined, steps_between



def pool_of(kind: Kind) -> Kind:
    """The slot pool of a per-tile value: FULL (a periodic operand is loaded as a full tile) or ROW."""
    return Kind.FULL if kind in (Kind.FULL, Kind.PERIODIC) else kind


@dataclass
class Operand:
    tensor: str
    kind: Kind
    const: np.ndarray | None


@dataclass
class SlotPlan:
    """Which slot each value of one tile lives in (the same for every tile)."""

    slot: dict[str, int] = field(default_factory=dict)      # tensor -> index in its pool
    full_slots: int = 0
    row_slots: int = 0
    loads: list[Operand] = field(default_factory=list)      # per-tile loads (FULL / ROW inputs)
    residents: list[Operand] = field(default_factory=list)  # COL / runtime SCALAR, loaded once


class RowPlanner:
    """Operand kinds, value kinds and slot assignment of a row group."""

    def __init__(self, ctx: LowerCtx, group: Group):
        self.ctx, self.group, self.graph = ctx, group, ctx.graph
        self.view = ewise.view_of(group.full_shape, group.split)
        self.kinds: dict[str, Kind] = {}
        self.operands: dict[tuple[str, int], Operand] = {}
        self._classify()
        self.plan = self._assign_slots()

    def _classify(self) -> None:
        produced = self.group.produced()
        for node in self.group.nodes:
            for i, t in enumerate(node.inputs):
                if not t:
                    continue
                kind = self.kinds.get(t) if t in produced else self.group.kind_of(self.graph.tensor(t).shape)
                if kind is None:
                    raise LoweringError(f"node {node.name}: operand {t} does not broadcast row-wise")
                info = self.graph.tensor(t)
                self.operands[(node.name, i)] = Operand(t, kind, info.const if t not in produced else None)
            out = node.outputs[0]
            if node.op_type in ROW_REDUCE:
                self.kinds[out] = Kind.ROW
            elif node.op_type in ROW_NORMALIZE:
                self.kinds[out] = Kind.FULL
            else:
                self.kinds[out] = self.group.kind_of(self.graph.tensor(out).shape)
            if self.kinds[out] not in (Kind.FULL, Kind.ROW):
                raise LoweringError(f"node {node.name}: computes on constants only (fold it first)")

    def _assign_slots(self) -> SlotPlan:
        plan = SlotPlan()
        last = self._last_uses()
        free = {Kind.FULL: [], Kind.ROW: []}
        counts = {Kind.FULL: 0, Kind.ROW: 0}

        def take(kind: Kind) -> int:
            if free[kind]:
                return free[kind].pop(0)
            counts[kind] += 1
            return counts[kind] - 1

        seen: set[str] = set()
        for (name, i), op in self.operands.items():
            if op.tensor in seen or op.tensor in self.group.produced():
                continue
            seen.add(op.tensor)
            if op.kind in (Kind.FULL, Kind.ROW, Kind.PERIODIC):
                plan.slot[op.tensor] = take(pool_of(op.kind))
                plan.loads.append(op)
            elif op.kind is Kind.COL or (op.kind is Kind.SCALAR and op.const is None):
                plan.residents.append(op)
        for index, node in enumerate(self.group.nodes):
            for t in dict.fromkeys(node.inputs):
                if t in plan.slot and last.get(t) == index:
                    kind = pool_of(self.kinds.get(t) or self._operand_kind(t))
                    free[kind].append(plan.slot[t])
                    free[kind].sort()
            out = node.outputs[0]
            plan.slot[out] = take(self.kinds[out])
            if last.get(out, index) == index:
                free[self.kinds[out]].append(plan.slot[out])
                free[self.kinds[out]].sort()
        plan.full_slots, plan.row_slots = counts[Kind.FULL], counts[Kind.ROW]
        return plan

    def _operand_kind(self, tensor: str) -> Kind:
        return next(op.kind for op in self.operands.values() if op.tensor == tensor)

    def _last_uses(self) -> dict[str, int]:
        last = {}
        for index, node in enumerate(self.group.nodes):
            for t in node.inputs:
                if t:
                    last[t] = index
        return last

    @property
    def scratch_tiles(self) -> int:
        return max([SCRATCH_NEED.get(n.op_type, 0) for n in self.group.nodes] + [0])

    @property
    def column_tileable(self) -> bool:
        return not any(n.op_type in ROW_REDUCE or n.op_type in ROW_NORMALIZE for n in self.group.nodes)


@dataclass(frozen=True)
class SetLayout:
    """Order of the buffers of one tile set: FULL values, scratch, FULL staging, ROW values,
    ROW staging, ROW temporary."""

    full: int
    scratch: int
    stage: int
    row: int
    row_temp: int

    def sizes(self, full_bytes: int, row_bytes: int) -> list[int]:
        return [full_bytes] * (self.full + self.scratch + self.stage) + [row_bytes] * (self.row + self.stage + self.row_temp)

    def names(self) -> list[str]:
        """Names of the buffers `sizes` sizes, in its order."""
        stage = ["stage"] * self.stage
        return ([f"full{i}" for i in range(self.full)] + [f"scratch{i}" for i in range(self.scratch)] + stage
                + [f"row{i}" for i in range(self.row)] + [f"{n}_row" for n in stage] + ["row_temp"] * self.row_temp)

    def full_index(self, i: int) -> int:
        return i

    def scratch_index(self, i: int) -> int:
        return self.full + i

    def stage_full_index(self) -> int:
        return self.full + self.scratch

    def row_index(self, i: int) -> int:
        return self.full + self.scratch + self.stage + i

    def stage_row_index(self) -> int:
        return self.row_index(self.row)

    def row_temp_index(self) -> int:
        return self.row_index(self.row + self.stage)


def rows_layout(shape: tuple[int, ...], full_shape: tuple[int, ...], split: int) -> str | None:
    """The resident layout (layergroup.resident_shape) that is this group's rows x columns view
    of a tensor: NCHW cut after C, or a matrix cut before its last dim; None if neither."""
    if tuple(shape) != tuple(full_shape):
        return None
    if len(shape) == 4 and split == 2:
        return NCHW
    return MATRIX if len(shape) >= 2 and split == len(shape) - 1 else None


@dataclass(frozen=True)
class RowPlan(FrozenPlan):
    """Rows (lanes) and columns per tile, whether a reduction runs in column chunks into an
    accumulator, the resident operands' and accumulator's offsets, and each buffer set's offsets
    (in SetLayout order)."""

    rt: int
    dt: int
    chunked: bool
    residents: tuple[int, ...]
    accumulator: int | None
    sets: tuple[tuple[int, ...], ...]


class RowGroupEmitter:
    @staticmethod
    def resident_ports(graph, group: Group, chip) -> tuple[dict[str, str], dict[str, str]]:
        """Full-size runtime inputs and stored outputs whose resident layout is the group's view
        (none for a flat view: no resident layout holds a tensor as its rows x cols)."""
        if group.flat_shape:
            return {}, {}
        made = group.produced()
        layout = lambda t: rows_layout(graph.tensor(t).shape, group.full_shape, group.split)  # noqa: E731
        readable = {t: layout(t) for n in group.nodes for t in n.inputs
                    if t and t not in made and not graph.tensor(t).is_const and layout(t)}
        return readable, {t: layout(t) for t in group.stored if layout(t)}

    def __init__(self, ctx: LowerCtx, group: Group):
        self.ctx, self.group, self.chip = ctx, group, ctx.chip
        self.planner = RowPlanner(ctx, group)
        self.rows, self.cols = self.planner.view.rows, self.planner.view.cols
        self.col_range = (0, self.cols)
        # NCHW over several samples: row tiles stay inside one sample (a resident tensor holds
        # each sample's channels on the lanes from lane 0)
        self.sample_rows = group.full_shape[1] if len(group.full_shape) == 4 and group.split == 2 \
            and (group.full_shape[0] > 1 or ctx.part.samples is not None) else None
        if ctx.part.rows is not None:      # sliced layer groups: NCHW rows [lo, hi) = columns lo*W .. hi*W
            width = group.full_shape[3]
            self.col_range = (ctx.part.rows[0] * width, ctx.part.rows[1] * width)
        self.chunked = False               # a reduction over rows too long for LMEM, in column chunks
        stage = 1 if ctx.prec != Prec.FP32 and group.stored else 0
        needs_temp = any(n.op_type in ROW_NORMALIZE for n in group.nodes)
        plan = self.planner.plan
        self.layout = SetLayout(plan.full_slots, self.planner.scratch_tiles, stage, plan.row_slots,
                                1 if needs_temp else 0)
        self.feeds_quantizer = any(c.op_type == "QuantizeLinear" for t in group.produced()
                                   for c in ctx.graph.consumers(t))

    # ------------------------------------------------------------ sizing
    def _set_sizes(self, rt: int, dt: int) -> list[int]:
        full = tile_bytes_per_lane(self.chip, (1, rt, 1, dt), Prec.FP32)
        row = tile_bytes_per_lane(self.chip, (1, rt, 1, 1), Prec.FP32)
        return self.layout.sizes(full, row)

    def _resident_sizes(self) -> list[int]:
        lanes = min(self.rows, self.chip.lanes)
        out = []
        for op in self.planner.plan.residents:
            width = self.cols if op.kind is Kind.COL else 1
            out.append(tile_bytes_per_lane(self.chip, (1, lanes, 1, width), self._resident_prec(op)))
        return out

    def _resident_prec(self, op: Operand) -> Prec:
        """A row group computes in fp32 whatever the program's dtype (its value, scratch and row
        tiles are fp32; only what it loads and stores is in the dtype). A constant it reads once
        (LayerNormalization's scale and bias, a per-column Mul / Add operand) is held in fp32 too
        when the group's results feed a quantizer: a weight rounded to fp16 moves values across
        quantization ties (prequantized gpt_block's ln_1 at fp16: 85 of 16384 codes one step off, 0
        with fp32 weights). Elsewhere it stays in the dtype: the broadcast load of an fp32 row to
        every lane costs gpt_block --dtype fp16 2.5% (+1.0 us of DMA) for an error inside the fp16
        bound. A runtime resident stays in the dtype DDR holds it in."""
        return Prec.FP32 if op.const is not None and self.feeds_quantizer else self.ctx.prec

    def _choose_tile(self, arena) -> tuple[int, int, bool] | None:
        """(rows, columns per tile, whether a reduction runs in column chunks), or None when no
        tile fits `arena`."""
        resident = self._resident_sizes()
        lanes = self.chip.lanes

        def fits(rt: int, dt: int) -> bool:
            return arena.fits(resident + self._set_sizes(rt, dt))

        rows = self.sample_rows or self.rows
        row_options = [min(rows, lanes * k) for k in range(1, -(-rows // lanes) + 1)]
        span = self.col_range[1] - self.col_range[0]
        rt = largest_fitting(row_options, lambda r: fits(r, span))
        if rt is not None:
            return rt, span, False
        if not self.planner.column_tileable and not self._reduces_last():
            return None                     # a whole row is needed and does not fit
        chunked = not self.planner.column_tileable
        eu = self.chip.eu_count("fp32")
        rt = row_options[0]
        acc = self._accumulator_sizes(rt, chunked)
        # rows shorter than an EU width (a flat view's rows are at most the lanes): any narrower chunk
        col_options = [eu * k for k in range(1, span // eu + 1)] or list(range(1, span + 1))
        dt = largest_fitting(col_options, lambda d: arena.fits(resident + acc + self._set_sizes(rt, d)))
        return None if dt is None else (rt, dt, chunked)

    def misfit(self) -> str:
        """Why no tile fits (the error when no region holds one)."""
        if not self.planner.column_tileable and not self._reduces_last():
            return f"a row of {self.cols} elements does not fit LMEM"
        return "no tile of rows x columns fits LMEM"

    def _reduces_last(self) -> bool:
        """Elementwise nodes then one reduction: column chunks each reduce into an accumulator."""
        nodes = self.group.nodes
        return nodes[-1].op_type in ROW_REDUCE and all(n.op_type in ewise.ELEMENTWISE for n in nodes[:-1])

    def _accumulator_sizes(self, rt: int, chunked: bool) -> list[int]:
        return [tile_bytes_per_lane(self.chip, (1, rt, 1, 1), Prec.FP32)] if chunked else []

    def plan(self, region: str) -> RowPlan | None:
        """The row/column tile and buffers of the group in `region`, or None when no tile fits."""
        arena = self.ctx.planning_arena(region)
        choice = self._choose_tile(arena)
        if choice is None:
            return None
        rt, dt, chunked = choice
        residents = self._resident_sizes()
        names = ([f"resident:{op.tensor}" for op in self.planner.plan.residents]
                 + (["accumulator"] if chunked else []), self.layout.names())
        res_offsets, sets = arena.alloc_plan(residents + self._accumulator_sizes(rt, chunked), self._set_sizes(rt, dt),
                                             self.group.name, names=names)
        return RowPlan(region, self.ctx.window(region), tuple(arena.names), rt, dt, chunked,
                       tuple(res_offsets[:len(residents)]), res_offsets[-1] if chunked else None,
                       tuple(tuple(x) for x in sets))

    # ------------------------------------------------------------ emission
    def emit(self, plan: RowPlan) -> None:
        ctx = self.ctx
        self.chunked, self.acc_offset = plan.chunked, plan.accumulator
        self.residents = self._load_residents(list(plan.residents))
        sets = plan.sets
        tiles = [(r0, r, d0, d) for r0, r in self._row_steps(plan.rt)
                 for d0, d in steps_between(*self.col_range, plan.dt)]
        pipelined(tiles, len(sets), lambda t, s: self._load_tile(t, sets[s]),
                  lambda t, s: self._compute_tile(t, sets[s]))
        for n in self.group.nodes:
            ctx.note_layer(n.name, n.op_type, lmem_peak=plan.peak, group=self.group.name)

    def _row_steps(self, rt: int) -> list[tuple[int, int]]:
        """(first row, rows) per row tile of the rows to emit: over all of them, or sample by
        sample (sample_rows)."""
        lo, hi = self.ctx.view_rows_to_emit(self.rows)
        if self.sample_rows is None:
            return steps_between(lo, hi, rt)
        c = self.sample_rows
        return [(r0, r) for n in self.ctx.samples_to_emit(self.rows // c)
                for r0, r in steps_between(max(lo, n * c), min(hi, (n + 1) * c), rt)]

    def _value_tile(self, offsets: list[int], kind: Kind, index: int, rt: int, dt: int, prec: Prec) -> LTile:
        if pool_of(kind) is Kind.FULL:
            return make_tile(self.chip, offsets[self.layout.full_index(index)], (1, rt, 1, dt), prec)
        return make_tile(self.chip, offsets[self.layout.row_index(index)], (1, rt, 1, 1), prec)

    def _ddr_of(self, op: Operand, prec: Prec | None = None) -> int:
        if op.const is not None:
            return self.ctx.const_addr(f"row:{op.tensor}", op.const, prec)
        return self.ctx.ddr_addr(op.tensor)

    def _load_residents(self, offsets: list[int]) -> dict[str, LTile]:
        out = {}
        lanes = min(self.rows, self.chip.lanes)
        for op, off in zip(self.planner.plan.residents, offsets):
            width = self.cols if op.kind is Kind.COL else 1
            prec = self._resident_prec(op)
            t = make_tile(self.chip, off, (1, lanes, 1, width), prec)
            self.ctx.em.layer = self._first_user(op.tensor)
            self.ctx.em.broadcast_load(t, self._ddr_of(op, prec), prec)
            out[op.tensor] = t
        return out

    def _load_tile(self, tile, offsets: list[int]) -> None:
        r0, rt, d0, dt = tile
        em, prec = self.ctx.em, self.ctx.prec
        for op in self.planner.plan.loads:
            if self.ctx.resident(op.tensor) is not None:
                continue                       # read in place (layer groups)
            index = self.planner.plan.slot[op.tensor]
            width = dt if pool_of(op.kind) is Kind.FULL else 1
            dst = self._value_tile(offsets, op.kind, index, rt, width, prec)
            em.layer = self._first_user(op.tensor)
            if op.kind is Kind.PERIODIC:
                self._load_periodic(dst, op, tile)
                continue
            em.load(dst, self._rows_region(self._ddr_of(op), op.kind, tile))

    def _load_periodic(self, dst: LTile, op: Operand, tile) -> None:
        """Rows r0.. of an operand that repeats every `period` rows: one load per run of rows
        inside one period (tile row r reads operand row r mod period)."""
        r0, rt, d0, dt = tile
        period = ewise.row_period(self.ctx.graph.tensor(op.tensor).shape, self.group.full_shape, self.group.split)
        addr, r = self._ddr_of(op), r0
        while r < r0 + rt:
            run = min(period - r % period, r0 + rt - r)
            piece = dst.sub_channels(r - r0, run, self.chip)
            self.ctx.em.load(piece, self._rows_region(addr, Kind.FULL, (r % period, run, d0, dt)))
            r += run

    def _rows_region(self, addr: int, kind: Kind, tile) -> DRegion:
        r0, rt, d0, dt = tile
        prec = self.ctx.prec
        if kind is Kind.FULL:
            return DRegion(addr + (r0 * self.cols + d0) * prec.bytes, (1, rt, 1, dt),
                           (rt * self.cols, self.cols, dt, 1), prec)
        return DRegion(addr + r0 * prec.bytes, (1, rt, 1, 1), (rt, 1, 1, 1), prec)

    def _first_user(self, tensor: str) -> str:
        return next(n.name for n in self.group.nodes if tensor in n.inputs)

    def _compute_tile(self, tile, offsets: list[int]) -> None:
        r0, rt, d0, dt = tile
        plan = self.planner.plan
        scratch = mathops.Scratch([make_tile(self.chip, offsets[self.layout.scratch_index(i)], (1, rt, 1, dt),
                                             Prec.FP32) for i in range(self.layout.scratch)])
        loaded = {op.tensor for op in plan.loads}
        for node in self.group.nodes:
            self.ctx.em.layer = node.name
            out = node.outputs[0]
            kind = self.planner.kinds[out]
            dst = self._value_tile(offsets, kind, plan.slot[out], rt, dt if kind is Kind.FULL else 1, Prec.FP32)
            ins = [self._operand(node, i, dst, offsets, tile, loaded) for i in range(len(node.inputs))]
            self._apply(node, dst, ins, scratch, offsets, tile)
            if self.chunked and node is self.group.nodes[-1]:
                self._accumulate(node, dst, offsets, tile)
            elif out in self.group.stored:
                self._store(out, dst, offsets, tile)

    def _accumulate(self, node, partial: LTile, offsets, tile) -> None:
        """Fold one column chunk's reduction into the accumulator; store it after the last chunk
        (averages: each chunk already sums its columns over the whole row's count)."""
        r0, rt, d0, dt = tile
        acc = make_tile(self.chip, self.acc_offset, (1, rt, 1, 1), Prec.FP32)
        if d0 == self.col_range[0]:
            self.ctx.em.ar("copy", acc, partial)
        else:
            pool, _ = ROW_REDUCE[node.op_type]
            self.ctx.em.ar("max" if pool == "maxpooling" else "add", acc, acc, partial)
        if d0 + dt == self.col_range[1] and node.outputs[0] in self.group.stored:
            self._store(node.outputs[0], acc, offsets, tile, complete=True)

    def _operand(self, node, i: int, dst: LTile, offsets, tile, loaded):
        t = node.inputs[i]
        if not t:
            return None
        r0, rt, d0, dt = tile
        op = self.planner.operands[(node.name, i)]
        if op.kind is Kind.SCALAR and op.const is not None:
            return float(np.asarray(op.const).reshape(-1)[0])
        if op.kind is Kind.COL or op.kind is Kind.SCALAR:
            res = self.residents[t]
            st = (0, 0, 0, 1 if op.kind is Kind.COL else 0)
            addr = res.addr + (d0 * res.prec.bytes if op.kind is Kind.COL else 0)
            return LTile(addr, dst.shape, res.prec, st, StrideMode.FREE)
        res = self.ctx.resident(t) if t in loaded else None
        if res is not None:
            return res.rows_view(self.chip, r0, rt, d0, dt)
        prec = self.ctx.prec if t in loaded else Prec.FP32
        width = dt if pool_of(op.kind) is Kind.FULL else 1
        src = self._value_tile(offsets, op.kind, self.planner.plan.slot[t], rt, width, prec)
        if op.kind is Kind.ROW and dst.shape[3] != 1:
            return src.broadcast(dst.shape, h=True, w=True)
        return src

    def _apply(self, node, dst: LTile, ins, scratch, offsets, tile) -> None:
        em, cols = self.ctx.em, self.cols
        if node.op_type in ROW_REDUCE:
            ewise.apply_row_reduce(em, node, dst, ins[0], cols)
        elif node.op_type in ("Softmax", "LogSoftmax"):
            ewise.apply_softmax(em, node, dst, ins[0], self._row_temp(offsets, tile), scratch, cols)
        elif node.op_type == "LayerNormalization":
            gamma = ins[1] if len(ins) > 1 else None
            beta = ins[2] if len(ins) > 2 else None
            ewise.apply_layernorm(em, node, dst, ins[0], self._row_temp(offsets, tile), gamma, beta, scratch, cols)
        else:
            ewise.apply_elementwise(em, node, dst, ins, scratch)

    def _row_temp(self, offsets, tile) -> LTile:
        r0, rt, d0, dt = tile
        return make_tile(self.chip, offsets[self.layout.row_temp_index()], (1, rt, 1, 1), Prec.FP32)

    def _store(self, tensor: str, value: LTile, offsets, tile, complete: bool = False) -> None:
        r0, rt, d0, dt = tile
        kind = self.planner.kinds[tensor]
        if kind is Kind.ROW and d0 and not complete:
            return                      # ROW values are complete after the first column step
        em, prec = self.ctx.em, self.ctx.prec
        res = self.ctx.resident(tensor)
        if res is not None:                    # layer groups: the value stays in LMEM
            em.ar("copy", res.rows_view(self.chip, r0, rt, d0, dt), value)
            return
        src = value
        if self.layout.stage:
            index = self.layout.stage_row_index() if kind is Kind.ROW else self.layout.stage_full_index()
            src = make_tile(self.chip, offsets[index], value.shape, prec)
            em.ar("copy", src, value)
        em.store(src, self._rows_region(self.ctx.ddr_addr(tensor), kind, tile))
