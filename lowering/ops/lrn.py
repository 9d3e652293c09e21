"""LRN on the TIU: the cross-channel window sum of squares as a 1x1 convolution with a banded
weight matrix (the cube does the channel reduction), then x * (bias + alpha/size * S) ** -beta."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tpuflow.isa import ConvTiu, Prec
from tpuflow.lowering import mathops
from tpuflow.lowering.context import LowerCtx
from tpuflow.lowering.emitplan import FrozenPlan
from tpuflow.lowering.groups import Group
from tpuflow.lowering.layergroup import NCHW
from tpuflow.lowering.tensors import DRegion, make_tile, tile_bytes_per_lane
from tpuflow.lowering.tiling import pipelined, steps

SCRATCH = 6


def band_matrix(channels: int, size: int) -> np.ndarray:
    """W[oc, ic] = 1 where ic is in oc's LRN window (ONNX: floor((size-1)/2) before, ceil after)."""
    before, after = (size - 1) // 2, -(-(size - 1) // 2)
    oc = np.arange(channels)[:, None]
    ic = np.arange(channels)[None, :]
    return ((ic >= oc - before) & (ic <= oc + after)).astype(np.float32)


@dataclass(frozen=True)
class LrnPlan(FrozenPlan):
    """Rows per tile, the band matrix's offset, and each buffer set's offsets (input, output,
    square, sum, scratch...)."""

    ht: int
    band: int
    sets: tuple[tuple[int, ...], ...]


class LrnEmitter:
    def __init__(self, ctx: LowerCtx, group: Group):
        self.ctx, self.group, self.chip = ctx, group, ctx.chip
        self.node = group.anchor
        self.n, self.c, self.h, self.w = ctx.graph.tensor(self.node.inputs[0]).shape
        self.in_res = ctx.resident(self.node.inputs[0])      # layer groups: operands kept in LMEM
        self.out_res = ctx.resident(self.node.outputs[0])

    @staticmethod
    def resident_ports(graph, group: Group, chip) -> tuple[dict[str, str], dict[str, str]]:
        return {group.anchor.inputs[0]: NCHW}, {group.anchor.outputs[0]: NCHW}

    def _sizes(self, ht: int) -> list[int]:
        shape = (1, self.c, ht, self.w)
        io = tile_bytes_per_lane(self.chip, shape, self.ctx.prec)
        return ([0 if self.in_res else io, 0 if self.out_res else io]
                + [tile_bytes_per_lane(self.chip, shape, Prec.FP32)] * (2 + SCRATCH))

    def plan(self, region: str) -> LrnPlan | None:
        """Rows per tile (largest that fit, double-buffered when possible) beside the band matrix."""
        arena = self.ctx.planning_arena(region)
        w_size = tile_bytes_per_lane(self.chip, (1, self.c, 1, self.c), Prec.FP32, compact=True)
        options = sorted({min(self.h, x) for x in (self.h, 32, 16, 8, 4, 2, 1)}, reverse=True)
        choice = next(((ht, k) for k in (2, 1) for ht in options if arena.fits([w_size] + self._sizes(ht) * k)), None)
        if choice is None:
            return None
        ht, copies = choice
        names = (["band"], ["input", "output", "square", "sum"] + [f"scratch{i}" for i in range(SCRATCH)])
        (w_off,), sets = arena.alloc_plan([w_size], self._sizes(ht), self.node.name, copies, names=names)
        return LrnPlan(region, self.ctx.window(region), tuple(arena.names), ht, w_off, tuple(tuple(s) for s in sets))

    def misfit(self) -> str:
        return f"LRN over {self.c} channels does not fit LMEM"

    def emit(self, plan: LrnPlan) -> None:
        ctx, chip = self.ctx, self.chip
        self.sets = plan.sets
        self.w_tile = make_tile(chip, plan.band, (1, self.c, 1, self.c), Prec.FP32, compact=True)
        size = int(self.node.attr("size"))
        addr = ctx.const_addr(f"lrnband:{self.node.name}", band_matrix(self.c, size), Prec.FP32)
        ctx.em.layer = self.node.name
        ctx.em.load(self.w_tile, DRegion(addr, (1, self.c, 1, self.c), (self.c * self.c, self.c, self.c, 1), Prec.FP32))
        tiles = [(n, h0, h) for n in range(self.n) for h0, h in steps(self.h, plan.ht)]
        pipelined(tiles, len(plan.sets), self._load, self._compute)
        ctx.note_layer(self.node.name, "LRN", macs=self.n * self.c * self.c * self.h * self.w, lmem_peak=plan.peak,
                       group=self.group.name)

    def _region(self, tensor: str, n: int, h0: int, h: int) -> DRegion:
        base = (n * self.c * self.h + h0) * self.w
        return self.ctx.region(tensor, (1, self.c, h, self.w), base,
                               (self.c * self.h * self.w, self.h * self.w, self.w, 1))

    def _load(self, tile, s: int) -> None:
        n, h0, h = tile
        if self.in_res is not None:
            return
        self.ctx.em.layer = self.node.name
        x = make_tile(self.chip, self.sets[s][0], (1, self.c, h, self.w), self.ctx.prec)
        self.ctx.em.load(x, self._region(self.node.inputs[0], n, h0, h))

    def _compute(self, tile, s: int) -> None:
        n, h0, h = tile
        em, chip, offs = self.ctx.em, self.chip, self.sets[s]
        shape = (1, self.c, h, self.w)
        x = (self.in_res.view(chip, n, 0, self.c, h0, h) if self.in_res is not None
             else make_tile(chip, offs[0], shape, self.ctx.prec))
        y = (self.out_res.view(chip, n, 0, self.c, h0, h) if self.out_res is not None
             else make_tile(chip, offs[1], shape, self.ctx.prec))
        sq = make_tile(chip, offs[2], shape, Prec.FP32)
        acc = make_tile(chip, offs[3], shape, Prec.FP32)
        scratch = mathops.Scratch([make_tile(chip, o, shape, Prec.FP32) for o in offs[4:]])
        em.layer = self.node.name
        em.ar("mul", sq, x, x)
        f = acc.fields("res0", with_shape=True)
        f.update(sq.fields("opd0"))
        em.tiu(ConvTiu(**f, opd0_c=self.c, opd0_h=h, opd0_w=self.w, opd1_addr=self.w_tile.addr, opd1_h=1, opd1_w=1))
        alpha, beta, bias = (float(self.node.attr(k, d)) for k, d in (("alpha", 1e-4), ("beta", 0.75), ("bias", 1.0)))
        size = int(self.node.attr("size"))
        em.lin("mac", acc, acc, alpha / size, bias)
        mathops.emit_pow_const(em, acc, acc, -beta, scratch)
        em.ar("mul", y, x, acc)
        if self.out_res is None:
            em.store(y, self._region(self.node.outputs[0], n, h0, h))
