"""Epilogue: the elementwise chain fused after a Conv or MatMul, applied to the result tile in LMEM
(residual adds, per-channel scale/shift, bias rows, activations)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from tpuflow.frontend.graph import Graph, OpNode
from tpuflow.isa import Prec, StrideMode
from tpuflow.lowering import ewise, mathops
from tpuflow.lowering.context import LowerCtx
from tpuflow.lowering.ewise import SCRATCH_NEED, Kind, classify
from tpuflow.lowering.tensors import DRegion, LTile, make_tile, tile_bytes_per_lane


@dataclass
class EpiOperand:
    node: str
    index: int
    tensor: str
    kind: Kind
    const: np.ndarray | None


def full_epilogue_operands(graph: Graph, group) -> set[str]:
    """Runtime operands of a group's epilogue that have the full output shape (loaded per tile,
    or read in place when they are resident in LMEM)."""
    out, value = set(), group.anchor.outputs[0]
    for n in group.nodes[1:]:
        shape = graph.tensor(n.outputs[0]).shape
        for t in n.inputs:
            if t and t != value and not graph.tensor(t).is_const and graph.tensor(t).shape == shape:
                out.add(t)
        value = n.outputs[0]
    return out


class Epilogue:
    """Plan and emission of an epilogue chain. The anchor result tile (n, c, h, w) is the chain's
    value; nodes write their result over it. FULL operands are loaded per tile; ROW (one value
    per channel / row) and COL (one per column) operands are loaded once, whole."""

    def __init__(self, ctx: LowerCtx, anchor_output: str, nodes: list[OpNode], out_shape: tuple[int, ...],
                 split: int):
        self.ctx, self.nodes, self.split = ctx, nodes, split
        graph: Graph = ctx.graph
        self.operands: list[EpiOperand] = []
        value = anchor_output
        for n in nodes:
            for i, t in enumerate(n.inputs):
                if t and t != value:
                    info = graph.tensor(t)
                    kind = classify(info.shape, out_shape, split)
                    self.operands.append(EpiOperand(n.name, i, t, kind, info.const))
            value = n.outputs[0]
        self.output = value
        self.full = [op for op in self.operands if op.kind is Kind.FULL]
        self.resident = [op for op in self.operands if op.kind in (Kind.ROW, Kind.COL)
                         or (op.kind is Kind.SCALAR and op.const is None)]
        self.scratch = max([SCRATCH_NEED.get(n.op_type, 0) for n in nodes] + [0])
        self.rows = int(np.prod(out_shape[:split]))
        self.cols = int(np.prod(out_shape[split:]))
        self.res_tiles: dict[str, LTile] = {}

    @property
    def empty(self) -> bool:
        return not self.nodes

    # ------------------------------------------------------------ sizing
    def set_sizes(self, tile_shape) -> list[int]:
        """Per-lane bytes of the per-tile buffers (FULL operands, scratch, staging)."""
        chip, prec = self.ctx.chip, self.ctx.prec
        full = [0 if self.ctx.resident(op.tensor) else tile_bytes_per_lane(chip, tile_shape, prec)
                for op in self.full]
        scratch = [tile_bytes_per_lane(chip, tile_shape, Prec.FP32)] * self.scratch
        return full + scratch

    def set_names(self) -> list[str]:
        """Names of the buffers `set_sizes` sizes, in its order."""
        return [f"epilogue:{op.tensor}" for op in self.full] + [f"epilogue.scratch{i}" for i in range(self.scratch)]

    def resident_names(self) -> list[str]:
        """Names of the buffers `resident_sizes` sizes, in its order."""
        return [f"epilogue:{op.tensor}" for op in self.resident]

    def resident_sizes(self, row_count: int, col_count: int) -> list[int]:
        chip, prec = self.ctx.chip, self.ctx.prec
        out = []
        for op in self.resident:
            if op.kind is Kind.ROW:
                out.append(tile_bytes_per_lane(chip, (1, row_count, 1, 1), prec, compact=True))
            else:
                width = col_count if op.kind is Kind.COL else 1
                out.append(tile_bytes_per_lane(chip, (1, chip.lanes, 1, width), prec))
        return out

    def full_resident(self) -> bool:
        """Some FULL operand is resident in LMEM (read in place as a view of its rows)."""
        return any(self.ctx.resident(op.tensor) is not None for op in self.full)

    def has_columns(self) -> bool:
        """Some operand holds one value per column (a COL operand, loaded whole)."""
        return any(op.kind is Kind.COL for op in self.operands)

    # ------------------------------------------------------------ emission
    def constants_only(self) -> bool:
        """Every resident operand is a constant (the same in every slice of a sliced run)."""
        return all(op.const is not None for op in self.resident)

    def load_residents(self, offsets: list[int], row_count: int, col_count: int, load: bool = True) -> None:
        """The resident operands' tiles at `offsets`, loaded unless `load` is False (already there)."""
        ctx, chip, prec = self.ctx, self.ctx.chip, self.ctx.prec
        for op, off in zip(self.resident, offsets):
            ctx.em.layer = op.node
            if op.kind is Kind.ROW:
                t = make_tile(chip, off, (1, row_count, 1, 1), prec, compact=True)
                if load and op.const is not None:
                    ctx.load_const_channels(t, f"epi:{op.tensor}", np.asarray(op.const).reshape(row_count, 1), prec)
                elif load:
                    ctx.em.load(t, DRegion(self._ddr(op), (1, row_count, 1, 1), (row_count, 1, 1, 1), prec))
            else:
                width = col_count if op.kind is Kind.COL else 1
                t = make_tile(chip, off, (1, chip.lanes, 1, width), prec)
                if load:
                    ctx.em.broadcast_load(t, self._ddr(op), prec)
            self.res_tiles[op.tensor] = t

    def _ddr(self, op: EpiOperand) -> int:
        if op.const is not None:
            return self.ctx.const_addr(f"epi:{op.tensor}", op.const)
        return self.ctx.ddr_addr(op.tensor)

    def load_tile(self, offsets: list[int], tile_shape, region_of: Callable[[str, int], DRegion]) -> None:
        """Per-tile loads of FULL operands; region_of(ddr_addr, elem_bytes) gives the tile's DDR view.
        Operands resident in LMEM (layer groups) are not loaded: apply() reads them in place."""
        for op, off in zip(self.full, offsets):
            if self.ctx.resident(op.tensor) is not None:
                continue
            self.ctx.em.layer = op.node
            dst = make_tile(self.ctx.chip, off, tile_shape, self.ctx.prec)
            self.ctx.em.load(dst, region_of(self._ddr(op)))

    def apply(self, value: LTile, offsets: list[int], row0: int, col0: int, window=None) -> LTile:
        """Run the chain over `value` (updated in place); returns the final value tile. `window`
        maps a resident FULL operand (a ResidentTensor) to its view at this tile."""
        ctx = self.ctx
        full_tiles = {op.tensor: self._full_tile(op, off, value, window) for op, off in zip(self.full, offsets)}
        base = len(self.full)
        scratch = mathops.Scratch([make_tile(ctx.chip, offsets[base + i], value.shape, Prec.FP32)
                                   for i in range(self.scratch)])
        for n in self.nodes:
            ctx.em.layer = n.name
            ins = []
            for i, t in enumerate(n.inputs):
                op = next((o for o in self.operands if o.node == n.name and o.index == i), None)
                ins.append(value if op is None else self._operand(op, value, full_tiles, row0, col0))
            ewise.apply_elementwise(ctx.em, n, value, ins, scratch)
        return value

    def _full_tile(self, op: EpiOperand, offset: int, value: LTile, window) -> LTile:
        res = self.ctx.resident(op.tensor)
        if res is None:
            return make_tile(self.ctx.chip, offset, value.shape, self.ctx.prec)
        return window(res)

    def _operand(self, op: EpiOperand, value: LTile, full_tiles, row0: int, col0: int):
        if op.kind is Kind.SCALAR and op.const is not None:
            return float(np.asarray(op.const).reshape(-1)[0])
        if op.kind is Kind.FULL:
            return full_tiles[op.tensor]
        res = self.res_tiles[op.tensor]
        if op.kind is Kind.ROW:
            sub = res.sub_channels(row0, value.c, self.ctx.chip)
            return LTile(sub.addr, value.shape, res.prec, (0, sub.strides[1], 0, 0), StrideMode.FREE)
        if op.kind is Kind.COL:
            return LTile(res.addr + col0 * res.prec.bytes, value.shape, res.prec, (0, 0, value.w, 1), StrideMode.FREE)
        return LTile(res.addr, value.shape, res.prec, (0, 0, 0, 0), StrideMode.FREE)

