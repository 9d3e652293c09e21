"""Matrix-vector products (MatMul with one row, constant weights) on the vector unit: W^T rows
across lanes times the broadcast input row, reduced along each lane, then turned back into a row
with a C<->W transpose. MM2 would keep a single lane busy; this streams the weights at DMA speed."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tpuflow.isa import CwBcTiu, Prec, StrideMode
from tpuflow.lowering.context import LowerCtx
from tpuflow.lowering.emitplan import FrozenPlan
from tpuflow.lowering.groups import Group
from tpuflow.lowering.ops.matmul import MatmulGroup, matmul_geometry
from tpuflow.lowering.tensors import DRegion, LTile, make_tile, tile_bytes_per_lane
from tpuflow.lowering.tiling import largest_fitting, pipelined, steps, steps_between


def is_gemv(ctx: LowerCtx, group: Group) -> bool:
    node = group.anchor
    geo = matmul_geometry(ctx, node)
    weights = ctx.graph.tensor(node.inputs[1])
    return geo.m == 1 and geo.batch_count == 1 and weights.is_const and not geo.b.transposed and geo.n > 1


@dataclass(frozen=True)
class GemvPlan(FrozenPlan):
    """Output lanes (nt) and inner elements (kt) per step, the epilogue's resident operand
    offsets, and each buffer set's offsets (weights, input, products, sums, row, epilogue, stored)."""

    nt: int
    kt: int
    residents: tuple[int, ...]
    sets: tuple[tuple[int, ...], ...]


class GemvEmitter(MatmulGroup):
    def __init__(self, ctx: LowerCtx, group: Group):
        super().__init__(ctx, group)
        k, n = self.geom.k, self.geom.n
        self.wt = np.asarray(ctx.const(self.node.inputs[1]), np.float32).reshape(k, n).T   # [N, K]

    def _weight_blocks(self, work) -> dict[tuple[int, int], int]:
        """Place W^T in the weight image block by block in load order, each (n-tile, k-tile)
        block contiguous, so every weight load is one sequential DDR stream (rows of W^T strided
        by K would each open a DRAM page of their own). Returns the block addresses."""
        blocks = [np.ascontiguousarray(self.wt[n0:n0 + n, k0:k0 + k]).reshape(-1) for n0, n, k0, k, _, _ in work]
        cols = self.ctx.part.view_cols          # a core's columns: its own blob (lowering.cores)
        key = f"gemv:{self.node.name}" + (f":{cols[0]}" if cols is not None else "")
        base = self.ctx.const_addr(key, np.concatenate(blocks))
        addrs, offset = {}, 0
        for (n0, _, k0, _, _, _), block in zip(work, blocks):
            addrs[(n0, k0)] = base + offset * self.ctx.prec.bytes
            offset += block.size
        return addrs

    def _sizes(self, nt: int, kt: int) -> tuple[list[int], list[int]]:
        chip, prec = self.chip, self.ctx.prec
        load = [tile_bytes_per_lane(chip, (1, nt, 1, kt), prec), tile_bytes_per_lane(chip, (1, chip.lanes, 1, kt), prec)]
        work = [tile_bytes_per_lane(chip, (1, nt, 1, kt), Prec.FP32), tile_bytes_per_lane(chip, (1, nt, 1, 1), Prec.FP32),
                tile_bytes_per_lane(chip, (1, nt, 1, 1), Prec.FP32)]
        row = (1, 1, 1, nt)
        outs = [tile_bytes_per_lane(chip, row, Prec.FP32)] + self.epi.set_sizes(row) + [tile_bytes_per_lane(chip, row, prec)]
        return load, work + outs

    def _set_names(self) -> list[str]:
        """Names of the buffers `_sizes` sizes (load + rest), in its order."""
        return ["weights", "input", "products", "partial", "accumulator", "row"] + self.epi.set_names() + ["stored"]

    def plan(self, region: str) -> GemvPlan | None:
        """Output lanes and inner elements per step (largest that fit double-buffered)."""
        geo, lanes, arena = self.geom, self.chip.lanes, self.ctx.planning_arena(region)
        lo, hi = self.ctx.view_cols_to_emit(geo.n)
        res = self.epi.resident_sizes(1, geo.n)
        choice = next(((nt, kt) for nt in sorted({min(hi - lo, lanes * g) for g in (16, 8, 4, 2, 1)}, reverse=True)
                       for kt in [largest_fitting([min(geo.k, 256 * 2 ** i) for i in range(8)],
                                                  lambda kt: arena.fits(res + sum(self._sizes(nt, kt), []) * 2))]
                       if kt), None)
        if choice is None:
            return None
        nt, kt = choice
        load, rest = self._sizes(nt, kt)
        res_offs, sets = arena.alloc_plan(res, load + rest, self.node.name,
                                          names=(self.epi.resident_names(), self._set_names()))
        return GemvPlan(region, self.ctx.window(region), tuple(arena.names), nt, kt, tuple(res_offs),
                        tuple(tuple(s) for s in sets))

    def misfit(self) -> str:
        return "no tiling of the matrix-vector product fits LMEM"

    def emit(self, plan: GemvPlan) -> None:
        ctx, geo, chip, prec = self.ctx, self.geom, self.chip, self.ctx.prec
        ctx.em.layer = self.node.name
        nt, kt, res_offs, sets = plan.nt, plan.kt, list(plan.residents), plan.sets
        self.epi.load_residents(res_offs, 1, geo.n)
        x_addr = self._input_addr()
        k_steps = steps(geo.k, kt)
        work = [(n0, n, k0, k, i == len(k_steps) - 1, i == 0) for n0, n in steps_between(*ctx.view_cols_to_emit(geo.n), nt)
                for i, (k0, k) in enumerate(k_steps)]
        w_addr = self._weight_blocks(work)

        def load_step(w, s):
            n0, n, k0, k, last, first = w
            offs = sets[s]
            ctx.em.layer = self.node.name
            ctx.em.load(make_tile(chip, offs[0], (1, n, 1, k), prec),
                        DRegion(w_addr[(n0, k0)], (1, n, 1, k), (n * k, k, k, 1), prec))
            ctx.em.broadcast_load(make_tile(chip, offs[1], (1, min(n, chip.lanes), 1, k), prec),
                                  x_addr + k0 * prec.bytes, prec)
            if last and self.epi.full:
                self.epi.load_tile(offs[6:], (1, 1, 1, n),
                                   lambda addr: DRegion(addr + n0 * prec.bytes, (1, 1, 1, n), (n, n, n, 1), prec))

        acc_set = sets[0]

        def compute(w, s):
            n0, n, k0, k, last, first = w
            em, offs = ctx.em, sets[s]
            wt = make_tile(chip, offs[0], (1, n, 1, k), prec)
            xb = make_tile(chip, offs[1], (1, min(n, chip.lanes), 1, k), prec)
            prod = make_tile(chip, offs[2], (1, n, 1, k), Prec.FP32)
            part = make_tile(chip, offs[3], (1, n, 1, 1), Prec.FP32)
            acc = make_tile(chip, acc_set[4], (1, n, 1, 1), Prec.FP32)
            em.layer = self.node.name
            em.ar("mul", prod, wt, LTile(xb.addr, prod.shape, prec, (0, 0, 0, 1), StrideMode.FREE))
            em.row_pool("avgpooling", acc if first else part, prod, 1.0)
            if not first:
                em.ar("add", acc, acc, part)
            if last:
                self._finish(acc, offs[5:], n0, n)

        pipelined(work, len(sets), load_step, compute)
        ctx.note_layer(self.node.name, "MatMul", macs=geo.k * geo.n, lmem_peak=plan.peak, group=self.group.name)
        for nd in self.group.epilogue:
            ctx.note_layer(nd.name, nd.op_type, lmem_peak=plan.peak, group=self.group.name)

    def _input_addr(self) -> int:
        info = self.ctx.graph.tensor(self.node.inputs[0])
        if info.is_const:
            return self.ctx.const_addr(f"gemvx:{self.node.name}", np.asarray(info.const))
        return self.ctx.ddr_addr(self.node.inputs[0])

    def _finish(self, acc: LTile, offs: list[int], n0: int, n: int) -> None:
        """Lanes -> a row (cw transpose), the epilogue, the store."""
        ctx, chip, prec, em = self.ctx, self.chip, self.ctx.prec, self.ctx.em
        row = make_tile(chip, offs[0], (1, 1, 1, n), Prec.FP32)
        f = row.fields("res0", with_shape=True)
        f.update(acc.fields("opd0"))
        em.tiu(CwBcTiu(op="cw_ts", opd0_c=n, opd0_w=1, **{k: v for k, v in f.items() if k != "opt_opd0_prec"}))
        value = self.epi.apply(row, offs[1:], 0, n0) if not self.epi.empty else row
        if value.prec != prec:
            stage = make_tile(chip, offs[-1], value.shape, prec)
            em.ar("copy", stage, value)
            value = stage
        em.layer = self.group.nodes[-1].name
        em.store(value, DRegion(ctx.ddr_addr(self.epi.output) + n0 * prec.bytes, (1, 1, 1, n), (n, n, n, 1), prec))
