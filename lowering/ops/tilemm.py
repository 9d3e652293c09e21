"""MatMul and Conv on the TILE engine (LinxISA CUBE blocks): A tiles in Nz, B tiles in Zn, pushed
with TPUSH after their slots are filled; TMATMUL then TMATMUL.ACC over K (TMATMUL.BIAS for a
per-column bias, TGEMV when M = 1); ACCCVT NZ2ND; the result leaves its slot for DDR or LMEM, or
for lanes and a TIU epilogue. Conv runs as Y^T = W . P^T, as an implicit GEMM when it can (issue 16):
the input is loaded into LMEM once and turned into pixel-major phase images by TIU transposes
(PhaseImages: a stride-s conv is a stride-1 one over s x s phases), and every B tile of P^T is one
LMEM -> tile-buffer DMA of whole output rows x channels (WindowOperand; taps of a kernel column
share one), so no im2col matrix exists; the weights are pre-arranged in the weight image (K runs
(kw, kh, c)) and staged in LMEM (StagedConstOperand, or LaneRowsOperand: TIU copies into the T
slots when the tile buffer has no DMA port). A conv of more than one tap (one group, no residual in the
ACC) keeps one padded pixel-major image instead and its B tiles are expanded on chip (HaloOperand): per
pixel tile and group of channel blocks one halo crosses the DMA port and TIMG2COLs write the window
tiles (K in (c1, kh, kw, c0) order), so the input crosses the port once per halo, not once per tap;
the residual of a bias + Add + Relu tail enters the ACC as I . R from a pixel-major image
too; a Relu-only epilogue leaves with the ACCCVT (its relu field; in place on the result slots on a
chip without it). Otherwise (channels per group not whole
K fractals, output rows wider than a tile, buffers that do not fit) P^T is built by im2col DMAs in
DDR (or is the input's NHWC copy for 1x1 stride-1 convolutions). Depthwise convs, convs with
fewer input channels per group than K0 and (ENGINE_CHOICE "fit") convs whose TIU plan the shared cost
model times faster (TileEngineChoice._faster) stay on the TIU; so do MatMuls whose TIU plan it times faster
(TileEngineChoice.matmul: e.g. BERT-base's 128-row projections, where the cube's blocks outlast MM2) and
the attention core (_on_tiu).

How the slots are fed (the tile window is a tile buffer, tpuflow.isa.tile; issue 16):
* runtime operands from DDR: one DMA per K panel (or run of equally spaced tiles) into neighbouring
  slots, the DDR rows walked in order and scattered into Nz / Zn in flight (RowsOperand);
* runtime operands a layer group keeps in LMEM: LMEM -> tile-buffer DMAs (LmemRowsOperand);
* constant operands: pre-arranged tiles, half a queue per DMA (ConstOperand), or, when every tile is
  read once, staged in LMEM by rows of 16 tiles (256 KiB DMAs) and moved into the slots by TIU
  copies, lane to same lane;
* streams load ahead across output tiles and batches in half-queue batches; a residual Add (and a
  conv bias followed only by Relu) enters the ACC (no TIU pass); results leave in spans of up to
  OUTPUT_SPAN tiles.
The operands live in tile_operands.py, the GEMM (tiling, queues, streams, blocks) in tile_gemm.py.

Layout across layers (issue 16 deliverable 1; plan_c0_layouts, decided once per compile by
tile_pool_fusion): an activation a cube conv leaves finished in the ACC and only cube implicit-GEMM convs
read may live NC1HWC0 in DDR (ddrplan.TENSOR_LAYOUTS, DdrTensor.layout): ACCCVT NZ2DN and one store per span
of whole C0-block runs; the reader's phase images by one DMA per phase (no TIU transposes) or its residual's
Zn tiles straight from DDR (C0RowsOperand); a TIU conv meeting such a tensor converts it in scratch
(_ConvertedTiu). Kept only where the shared cost model says it is not slower: on sg2260 never (a pixel-major
image from NC1HWC0 is one 32-byte GDMA piece per pixel and block, the NCHW one a load of whole rows plus
cheap TIU transposes), and with layer groups on, the activations between convs are LMEM-resident anyway
(channels on lanes, the phase images transposed from there)."""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, replace
from types import SimpleNamespace

import numpy as np

from tpuflow.isa import CwBcTiu, Prec, StrideMode, global_lmem_address
from tpuflow.isa.tiu import TIU_STRIDE_MAX
from tpuflow.lowering.context import LowerCtx
from tpuflow.lowering.emitplan import FrozenPlan
from tpuflow.lowering.groups import Group
from tpuflow.lowering.ops.conv import conv_geometry
from tpuflow.lowering.ops.epilogue import Epilogue
from tpuflow.lowering.ops.matmul import matmul_geometry
from tpuflow.lowering.ops.movement import copy_nd
from tpuflow.lowering.ops.tile_gemm import OUTPUT_SPAN, TILE_SIDES, StickyCache, TileDims, TileGemm
from tpuflow.lowering.ddrplan import C0_BLOCKED, TENSOR_LAYOUTS
from tpuflow.lowering.ops.tile_operands import (C0RowsOperand, ConstOperand, HaloOperand, LaneRowsOperand, LmemRowsOperand,
                                                 Operand, PhaseImages, RowsOperand, StagedConstOperand, WindowOperand,
                                                 c0_elems, c0_to_nchw, ceil_to, nchw_to_c0, tile_copy)
from tpuflow.lowering.tensors import DRegion, LTile, make_tile, tile_bytes_per_lane
from tpuflow.lowering.tiling import pipelined, steps

MATMUL_OUTPUT_SPAN = 1         # a MatMul's result tiles leave one by one as they are converted (each move or
                               # store overlaps the next tiles' blocks; measured on the transformer blocks);
                               # a conv's leave in spans of up to OUTPUT_SPAN (many small tiles: fewer commands)
NHWC_BLOCK = 256               # channels and pixels per block of the NHWC staging transpose


class _TileOutput:
    """Stores result tiles from their slots, or moves them to lanes for a TIU epilogue first.
    Result tiles of one row of output tiles sit in neighbouring M slots (lanes): up to `group` of
    them leave together (one store, or one copy to lanes and one epilogue pass over the row span)."""

    def __init__(self, ctx: LowerCtx, epi: Epilogue, extra_row_bias: np.ndarray | None, label: str,
                 y_resident=None, value_prec: Prec = Prec.FP32, span: int = OUTPUT_SPAN):
        self.ctx, self.epi, self.label = ctx, epi, label
        self.value_prec = value_prec      # of the result tiles a TIU epilogue works on (fp32 unless exact)
        self.row_bias = extra_row_bias
        self.needs_tiu = not epi.empty or extra_row_bias is not None
        # a Relu-only epilogue on results already in the model's dtype runs in place on the result slots
        # (the tile buffer's vector-unit port), which then leave as they are: no copy to lanes and back
        self.in_slot = (self.needs_tiu and extra_row_bias is None and value_prec == ctx.prec and not epi.full
                        and not epi.resident and all(n.op_type == "Relu" for n in epi.nodes))
        if self.in_slot:
            self.needs_tiu = False
        # ... and better still in the ACCCVT that drains the ACC (its relu field, Fixpipe-like): no TIU pass
        self.cvt_relu = self.in_slot and ctx.chip.tile.acccvt_relu
        if self.cvt_relu:
            self.in_slot = False
        self.span = span                  # result tiles delivered together at most
        self.group = span
        self.pending: list | None = None
        self.y_resident = y_resident      # the result kept in LMEM by a layer group (MATRIX), or None
        self.c0_store = None              # stores a span of NZ2DN result tiles C0-blocked (TileConvEmitter), or None

    def _sizes(self, mt: int, nt: int, rows_total: int, cols_total: int) -> tuple[list[int], list[int]]:
        """(resident buffers, per-span buffers) in bytes per lane for the TIU epilogue."""
        chip, shape = self.ctx.chip, (1, mt, 1, nt)
        res = self.epi.resident_sizes(rows_total, cols_total)
        if self.row_bias is not None:
            res = res + [tile_bytes_per_lane(chip, (1, rows_total, 1, 1), Prec.FP32, compact=True)]
        per = [tile_bytes_per_lane(chip, shape, self.value_prec)] + self.epi.set_sizes(shape) + [
            tile_bytes_per_lane(chip, shape, self.ctx.prec)]
        return res, per

    def plan(self, arena, mt: int, nt: int, rows_total: int, cols_total: int):
        """(resident offsets, buffer sets, tiles per span) allocated from `arena`, ((), (),
        OUTPUT_SPAN) when no TIU epilogue runs, None when they do not fit. The span is the widest
        of OUTPUT_SPAN, 8, 4, 2, 1 tiles (at most a row of them) whose buffers fit."""
        if not self.needs_tiu:
            return (), (), self.span
        names = (self.epi.resident_names() + (["row_bias"] if self.row_bias is not None else []),
                 ["value"] + self.epi.set_names() + ["stored"])
        row_tiles = -(-cols_total // nt)
        for group in (g for g in (OUTPUT_SPAN, 8, 4, 2, 1) if g <= self.span and (g == 1 or g <= row_tiles)):
            res, per = self._sizes(mt, min(group * nt, cols_total) if group > 1 else nt, rows_total, cols_total)
            if arena.fits(res + per):
                res_offs, sets = arena.alloc_plan(res, per, self.label, names=names)
                return tuple(res_offs), tuple(tuple(x) for x in sets), group
        return None

    def load(self, res_offs, sets, rows_total: int, cols_total: int, group: int) -> None:
        """Take the buffers and load the resident epilogue operands (and the row bias)."""
        chip = self.ctx.chip
        self.sets, self.group = sets, group
        self.epi.load_residents(list(res_offs[:len(self.epi.resident)]), rows_total, cols_total)
        if self.row_bias is not None:
            self.bias_tile = make_tile(chip, res_offs[-1], (1, rows_total, 1, 1), Prec.FP32, compact=True)
            addr = self.ctx.const_addr(f"{self.label}:rowbias", self.row_bias, Prec.FP32)
            self.ctx.em.load(self.bias_tile, DRegion(addr, (1, rows_total, 1, 1), (rows_total, 1, 1, 1), Prec.FP32))
        self.count = 0

    def deliver(self, slot: int, row0: int, mt: int, col0: int, nt: int, regions) -> None:
        """Result tile (row0, mt) x (col0, nt) is in `slot`; `regions(col0, width)` gives the DDR
        destination of those rows and columns and the epilogue's full-operand region function."""
        p, lane_bytes = self.pending, self.ctx.chip.lmem_bytes_per_lane
        if p is not None:
            joins = p["mt"] == mt and p["nt"] == nt and len(p["slots"]) < self.group and slot == p["slots"][-1] + lane_bytes
            if isinstance(self.y_resident, _SplitResult):     # a span stays inside one part
                joins = joins and self.y_resident.part_of(col0) == self.y_resident.part_of(p["col0"])
            along = self._along(p, row0, col0)
            if not joins or along is None or (p["along"] and along != p["along"]):
                self.flush()
            else:
                p["along"] = along
        if self.pending is None:
            self.pending = {"row0": row0, "mt": mt, "col0": col0, "nt": nt, "slots": [slot], "regions": regions, "along": ""}
        else:
            self.pending["slots"].append(slot)
        if len(self.pending["slots"]) == self.group:
            self.flush()

    def _along(self, p: dict, row0: int, col0: int) -> str | None:
        """How tile (row0, col0) continues the pending span: "cols" (the next tile of its row of tiles),
        "rows" (the next tile down its column of tiles: results stored to DDR as they are only), None."""
        count = len(p["slots"])
        if p["row0"] == row0 and col0 == p["col0"] + count * p["nt"]:
            return "cols"
        if p["col0"] == col0 and row0 == p["row0"] + count * p["mt"] and not self.needs_tiu and self.y_resident is None:
            return "rows"
        return None

    def flush(self) -> None:
        """Deliver the pending span of result tiles."""
        p, self.pending = self.pending, None
        if p is None:
            return
        if self.c0_store is not None:
            self.c0_store(p)
            return
        em, chip = self.ctx.em, self.ctx.chip
        row0, mt, col0, nt, slots = p["row0"], p["mt"], p["col0"], p["nt"], p["slots"]
        count = len(slots)
        if p["along"] == "rows":
            self._flush_rows(p)
            return
        width = count * nt
        dst, full_region = p["regions"](col0, width)
        src_prec = self.value_prec if self.needs_tiu else self.ctx.prec
        slot_elems = chip.tile.slot_bytes // src_prec.bytes
        slot_view = DRegion(global_lmem_address(slots[0], chip), (1, count, mt, nt),
                            (count * slot_elems, slot_elems, nt, 1), src_prec)
        if self.in_slot and self.y_resident is None:
            span = LTile(slots[0], (1, count, 1, mt * nt), src_prec, (0, 0, 0, 1), StrideMode.FREE)   # one slot per lane
            self.epi.apply(span, [], row0, col0)
        if not self.needs_tiu:      # tile j -> columns j * nt.. of the same rows, walked row by row
            rows_view = DRegion(slot_view.addr, (mt, count, 1, nt), (nt, slot_elems, nt, 1), src_prec)
            if self.y_resident is not None:     # into the LMEM rows: lane i takes row i of every tile
                view = self.y_resident.rows_view(chip, row0, mt, col0, width)
                tile_copy(self.ctx, DRegion(global_lmem_address(view.addr, chip), view.shape, view.strides, src_prec), rows_view)
                if self.in_slot:        # the Relu there, so the TILE queue never waits for the TIU
                    self.epi.apply(view, [], row0, col0)
                return
            em.region_copy(DRegion(dst.addr, (mt, count, 1, nt), (dst.strides[1], nt, nt, 1), dst.prec), rows_view)
            return
        offs = self.sets[self.count % len(self.sets)]
        self.count += 1
        value = make_tile(chip, offs[0], (1, mt, 1, width), src_prec)
        tile_copy(self.ctx, DRegion(global_lmem_address(value.addr, chip), (count, mt, 1, nt),
                                    (nt, value.strides[1], nt, 1), src_prec), slot_view)
        if self.epi.full:
            self.epi.load_tile(offs[1:], value.shape, full_region)
        if self.row_bias is not None:
            sub = self.bias_tile.sub_channels(row0, mt, chip)
            em.ar("add", value, value, LTile(sub.addr, value.shape, Prec.FP32, (0, sub.strides[1], 0, 0), StrideMode.FREE))
        window = lambda res: res.rows_view(chip, row0, mt, col0, width)      # noqa: E731
        value = self.epi.apply(value, offs[1:], row0, col0, window) if not self.epi.empty else value
        if self.y_resident is not None:
            em.ar("copy", self.y_resident.rows_view(chip, row0, mt, col0, width), value)
            return
        if value.prec != self.ctx.prec:
            stage = make_tile(chip, offs[-1], value.shape, self.ctx.prec)
            em.ar("copy", stage, value)
            value = stage
        em.store(value, dst)


    def _flush_rows(self, p: dict) -> None:
        """A span of tiles down one column of tiles (row0, row0 + mt, ...): one DMA, tile j's rows to
        rows row0 + j * mt of the DDR destination (after the in-slot Relu, if any)."""
        em, chip, prec = self.ctx.em, self.ctx.chip, self.ctx.prec
        mt, nt, slots, count = p["mt"], p["nt"], p["slots"], len(p["slots"])
        slot_elems = chip.tile.slot_bytes // prec.bytes
        if self.in_slot:
            span = LTile(slots[0], (1, count, 1, mt * nt), prec, (0, 0, 0, 1), StrideMode.FREE)
            self.epi.apply(span, [], p["row0"], p["col0"])
        dst, _ = p["regions"](p["col0"], nt)
        row_stride = dst.strides[1]
        em.region_copy(DRegion(dst.addr, (1, count, mt, nt), (0, mt * row_stride, row_stride, 1), dst.prec),
                       DRegion(global_lmem_address(slots[0], chip), (1, count, mt, nt), (0, slot_elems, nt, 1), prec))


class _SplitResult:
    """A result whose columns a Split cuts into parts, each kept in LMEM as its own buffer (layer
    groups): views of column ranges inside one part. Output tiles never straddle parts (n_tile)."""

    def __init__(self, ctx: LowerCtx, parts):
        self.parts = [(ctx.resident(name), c0, width) for name, c0, width in parts]
        if any(res is None for res, _, _ in self.parts):
            raise ValueError("a Split part of a TILE result is not resident")

    def part_of(self, col: int) -> int:
        return next(i for i, (_, c0, width) in enumerate(self.parts) if c0 <= col < c0 + width)

    def n_tile(self, n: int) -> int:
        """The widest TILE N side dividing every part's start and width."""
        unit = math.gcd(*[c0 for _, c0, _ in self.parts], *[w for _, _, w in self.parts])
        return next((side for side in TILE_SIDES if unit % side == 0), 16)

    def rows_view(self, chip, r0: int, rows: int, col0: int, cols: int):
        res, c0, width = self.parts[self.part_of(col0)]
        if col0 + cols > c0 + width:
            raise ValueError(f"columns {col0}..{col0 + cols} straddle a Split part")
        return res.rows_view(chip, r0, rows, col0 - c0, cols)


@dataclass(frozen=True)
class TilePlan(FrozenPlan):
    """A TILE MatMul: the TILE tiling (its own estimate picks it; its slots are the tile window,
    not the arena) and the TIU epilogue's resident and per-tile buffers (value, epilogue
    operands and scratch, stored), empty when the result is copied out as it is."""

    dims: TileDims
    residents: tuple[int, ...]
    sets: tuple[tuple[int, ...], ...]
    out_group: int = 1
    stage: int | None = None       # per-lane offset of the staged constant stream (TileGemm.stage_bytes)


class TileMatmulEmitter:
    """MatMul (+ bias + epilogue) groups on the TILE engine."""

    @staticmethod
    def resident_ports(graph, group: Group, chip) -> tuple[dict[str, str], dict[str, str]]:
        """Layer groups: an unbatched product reads a runtime A kept in LMEM as a matrix (rows on
        lanes; LMEM -> tile-buffer DMAs, LmemRowsOperand); any product reads its epilogue's full
        operands in place and writes its (untransposed) result there, batches stacked as rows
        (slots -> lanes DMA, or the TIU epilogue's copy)."""
        from tpuflow.lowering.layergroup import MATRIX
        from tpuflow.lowering.ops.epilogue import full_epilogue_operands
        node = group.anchor
        a, out = node.inputs[0], group.nodes[-1].outputs[0]
        a_shape = graph.tensor(a).shape
        if len(a_shape) < 2 or node.attr("y_perm") is not None or a_shape[-2] == 1:
            return {}, {}
        readable = dict.fromkeys(full_epilogue_operands(graph, group), MATRIX)
        if graph.tensor(a).const is None and math.prod(a_shape[:-2]) == 1 and node.attr("a_perm") is None:
            readable[a] = MATRIX
        return readable, {out: MATRIX}      # batches stacked: row b * M + m of the [..., M, N] result

    def __init__(self, ctx: LowerCtx, group: Group):
        self.ctx, self.group = ctx, group
        self.node = group.anchor
        self.geom = matmul_geometry(ctx, self.node)
        epilogue = list(group.epilogue)
        self.bias = None
        if epilogue and _is_col_bias(ctx, epilogue[0], self.node.outputs[0], self.geom.n):
            bias_node = epilogue.pop(0)
            other = next(t for t in bias_node.inputs if t != self.node.outputs[0])
            self.bias = np.asarray(ctx.const(other), np.float32).reshape(-1)
            anchor_out = bias_node.outputs[0]
        else:
            anchor_out = self.node.outputs[0]
        self.residual = None
        if epilogue and self.geom.batch_count == 1 and _is_residual(ctx, epilogue[0], anchor_out):
            add = epilogue.pop(0)
            self.residual = next(t for t in add.inputs if t != anchor_out)
            anchor_out = add.outputs[0]
        out_shape = ctx.graph.tensor(anchor_out).shape
        self.epi = Epilogue(ctx, anchor_out, epilogue, out_shape, group.split)
        self.a_res = ctx.resident(self.node.inputs[0]) if self.geom.batch_count == 1 else None
        self.y_res = ctx.resident(self.epi.output)
        parts = ctx.residency.splits.get(self.epi.output)
        if parts:                            # a Split of the result's columns: each part its own LMEM buffer
            self.y_res = _SplitResult(ctx, parts)

    def _batched(self) -> bool:
        """Whether all batches run as one TileGemm (runtime operands: a batch is a shift of the
        stored matrix, so K panels and result spans continue across batches)."""
        return (self.geom.batch_count > 1 and self.residual is None and self.a_res is None
                and all(self.ctx.graph.tensor(t).const is None for t in self.node.inputs[:2]))

    def _gemm(self, out: _TileOutput, batches: list[int]) -> TileGemm:
        geo = self.geom
        b = batches[0]
        a_off, b_off, _ = geo.offsets(b)
        rel = [(x - a_off, y - b_off) for x, y, _ in map(geo.offsets, batches)]
        if self.a_res is not None:
            a = LmemRowsOperand(self.ctx, "nz", self.a_res, geo.m, geo.k)
        else:
            a = self._operand(self.node.inputs[0], "nz", geo.m, geo.k, a_off, geo.a, f"{self.node.name}:A{b}")
        bop = self._operand(self.node.inputs[1], "zn", geo.k, geo.n, b_off, geo.b, f"{self.node.name}:B{b}")
        residual = None
        if self.residual is not None and self.ctx.resident(self.residual) is not None:
            residual = LmemRowsOperand(self.ctx, "nz", self.ctx.resident(self.residual), geo.m, geo.n)
        elif self.residual is not None:
            residual = RowsOperand(self.ctx, "nz", self.ctx.ddr_addr(self.residual), geo.m, geo.n, geo.n)
        n_tile = self.y_res.n_tile(geo.n) if isinstance(self.y_res, _SplitResult) else None
        gemm = TileGemm(self.ctx, a, bop, geo.m, geo.n, geo.k, Prec.FP32 if out.needs_tiu else self.ctx.prec,
                        self.bias, self.node.name, residual, rel, n_tile=n_tile)
        gemm.relu = out.cvt_relu
        return gemm

    def plan(self, region: str) -> TilePlan | None:
        """The LMEM buffers of the TIU epilogue (the tile sides are the TILE tiling's, chosen
        by its own estimate), or None when they do not fit `region`."""
        geo, arena = self.geom, self.ctx.planning_arena(region)
        out = _TileOutput(self.ctx, self.epi, None, self.node.name, span=MATMUL_OUTPUT_SPAN)
        dims = self._gemm(out, [0]).dims
        planned = out.plan(arena, dims.mt, dims.nt, geo.batch_count * geo.m, geo.n)
        if planned is None:
            return None
        stage = None
        need = self._gemm(out, [0]).stage_bytes() if geo.batch_count == 1 else 0
        if need and arena.fits([need]):
            stage = arena.alloc_plan([need], [], f"{self.node.name}:stage", names=(["tile_stage"], []))[0][0]
        return TilePlan(region, self.ctx.window(region), tuple(arena.names), dims, *planned[:2], out_group=planned[2],
                        stage=stage)

    def emit(self, plan: TilePlan) -> None:
        ctx, geo = self.ctx, self.geom
        ctx.em.layer = self.node.name
        out = _TileOutput(ctx, self.epi, None, self.node.name, self.y_res, span=MATMUL_OUTPUT_SPAN)
        result_addr = ctx.ddr_addr(self.epi.output) if self.y_res is None else 0
        prec = ctx.prec
        runs = [list(range(geo.batch_count))] if self._batched() else [[b] for b in range(geo.batch_count)]
        rs = geo.y.row_stride
        for batches in runs:
            gemm = self._gemm(out, batches)
            gemm.stage = plan.stage
            gemm.stage_tail = self.node.name == _last_weight_product(ctx.graph)
            if batches[0] == 0 and out.needs_tiu:
                out.load(plan.residents, plan.sets, geo.batch_count * geo.m, geo.n, plan.out_group)

            def deliver(slot, i, m0, mt, n0, nt, batches=batches):
                b = batches[i]
                y_off = geo.offsets(b)[2]
                if not out.needs_tiu:    # stored-matrix coordinates: spans continue across batches
                    dr, dc = divmod(y_off, rs)
                    y_off, m0_ddr, n0 = 0, m0 + dr, n0 + dc
                else:
                    m0_ddr = m0

                def regions(c0, width, y_off=y_off, m0=m0_ddr):
                    dst = DRegion(result_addr + (y_off + m0 * rs + c0) * prec.bytes, (1, mt, 1, width),
                                  (mt * rs, rs, width, 1), prec)
                    full = lambda addr: DRegion(addr + (y_off + m0 * geo.n + c0) * prec.bytes,   # noqa: E731
                                                (1, mt, 1, width), (mt * geo.n, geo.n, width, 1), prec)
                    return dst, full
                out.deliver(slot, m0_ddr if not out.needs_tiu else b * geo.m + m0, mt, n0, nt, regions)

            gemm.run(deliver)
            out.flush()
        ctx.note_layer(self.node.name, "MatMul", macs=geo.batch_count * geo.m * geo.n * geo.k,
                       lmem_peak=plan.peak, group=self.group.name)
        for n in self.group.epilogue:
            ctx.note_layer(n.name, n.op_type, group=self.group.name)

    def _operand(self, tensor: str, layout: str, rows: int, cols: int, offset: int, view, key: str) -> Operand:
        info = self.ctx.graph.tensor(tensor)
        if info.const is not None:
            flat = np.asarray(info.const, np.float32).reshape(-1)[offset:]
            shape = (cols, rows) if view.transposed else (rows, cols)
            full = np.lib.stride_tricks.as_strided(flat, shape, (view.row_stride * 4, 4))
            return ConstOperand(self.ctx, layout, np.ascontiguousarray(full.T if view.transposed else full), key, 0, 0)
        addr = self.ctx.ddr_addr(tensor) + offset * self.ctx.prec.bytes
        return RowsOperand(self.ctx, layout, addr, rows, cols, view.row_stride, col_major=view.transposed)


def _last_weight_product(graph) -> str | None:
    """The last MatMul / Conv with a constant second input in the model's (topological) order: the
    only product whose staged weight stream ends in a DMA of its own (TileGemm.stage_tail); every
    earlier one's last blocks overlap the next product's weight DMA anyway."""
    last = None
    for node in graph.nodes():
        if node.op_type in ("MatMul", "Conv") and len(node.inputs) > 1 and graph.tensor(node.inputs[1]).const is not None:
            last = node.name
    return last


def _is_residual(ctx: LowerCtx, node, value: str) -> bool:
    """Whether `node` adds a runtime tensor (in DDR, or kept in LMEM as a matrix) of exactly
    `value`'s shape to it (a residual the CUBE can accumulate: TileGemm's R . I step)."""
    if node.op_type != "Add" or len(node.inputs) != 2 or list(node.inputs).count(value) != 1:
        return False
    other = next(t for t in node.inputs if t != value)
    info = ctx.graph.tensor(other)
    return info.const is None and tuple(info.shape) == tuple(ctx.graph.tensor(value).shape)


def _is_col_bias(ctx: LowerCtx, node, value: str, n: int) -> bool:
    if node.op_type != "Add":
        return False
    other = [t for t in node.inputs if t != value]
    if len(other) != 1 or ctx.graph.tensor(other[0]).const is None:
        return False
    shape = ctx.graph.tensor(other[0]).shape
    return math.prod(shape) == n and (not shape or shape[-1] == n)


@dataclass(frozen=True)
class TileConvPlan(FrozenPlan):
    """A TILE conv: the TILE tiling, the TIU epilogue's resident and per-tile buffers (the
    first `output_buffers` buffers), then the NHWC staging blocks (channels x pixels) and their
    buffer sets (input block, transposed block) above them. Only the epilogue's buffers are
    reported as the layer's LMEM peak and to the ring, as before the protocol (the staging
    buffers of a conv without a TIU epilogue are reported to the ring)."""

    dims: TileDims
    residents: tuple[int, ...]
    sets: tuple[tuple[int, ...], ...]
    nhwc_ct: int
    nhwc_pt: int
    nhwc_sets: tuple[tuple[int, ...], ...]
    output_buffers: int
    out_group: int = 1
    window_stage: int | None = None     # implicit GEMM: per-lane offset of the staged input (channels on lanes)
    window_images: int | None = None    # ... and of its PhaseImages (pixels on lanes); None: im2col in DDR
    n_tile: int = 0                     # ... and the pixel tile (whole output rows)
    weight_stage: int | None = None     # per-lane offset of the weights' staging ring (StagedConstOperand), or None
    weight_ring: int = 0                # ... its chunks (0 with weight_lanes)
    weight_level: int = 0               # ... the bytes its slots are apart (0: the tile stride; StagedConstOperand)
    weight_lanes: bool = False          # weight_stage holds two grid rows staged in the T slots' lanes (LaneRowsOperand)
    residual_images: int | None = None  # per-lane offset of the residual's pixel-major image (I . R from LMEM), or None
    sticky_stage: int | None = None     # per-lane offset of one slot's bytes for sticky constant tiles (StickyCache)

    @property
    def peak(self) -> int:
        return max((off + size for _, off, size in self.buffers[:self.output_buffers]), default=0)

    @property
    def ring_buffers(self) -> tuple[tuple[str, int, int], ...]:
        return self.buffers[:self.output_buffers] if self.output_buffers else self.buffers


class TileConvEmitter:
    """Conv groups on the TILE engine: per image and group, Y^T (Cout x Ho*Wo) = W . P^T."""

    def __init__(self, ctx: LowerCtx, group: Group):
        self.ctx, self.group = ctx, group
        self.node = group.anchor
        self.geom = conv_geometry(ctx, self.node)
        out = self.node.outputs[0]
        epilogue = list(group.epilogue)
        b = self.node.inputs[2] if len(self.node.inputs) > 2 and self.node.inputs[2] else None
        self.bias = np.asarray(ctx.const(b), np.float32).reshape(-1) if b else None
        # a residual Add in the ACC (R . I) and the bias too (TileGemm._row_bias_step) when only Relu
        # follows: Relu commutes with rounding, so the result leaves the ACC in the model's dtype
        self.residual = None
        add = epilogue[0] if epilogue and _is_residual(ctx, epilogue[0], out) else None
        self.halo = add is None and _expands_on_chip(ctx.chip, self.geom)    # B tiles by TIMG2COL from halo tiles
        other = next(t for t in add.inputs if t != out) if add is not None else None
        if add is not None and ctx.resident(other) is not None and not self._lmem_residual_ok():
            add = None
        tail = epilogue[1:] if add is not None else epilogue
        self.bias_in_acc = all(n.op_type == "Relu" for n in tail)     # everything but Relu in the ACC
        if self.bias_in_acc and add is not None:
            self.residual, out, epilogue = other, add.outputs[0], tail
        self.epi = Epilogue(ctx, out, epilogue, ctx.graph.tensor(out).shape, 2)
        # layer groups: the input, the residual and the result kept in LMEM (NCHW, channels on lanes)
        self.in_res = ctx.resident(self.node.inputs[0])
        self.residual_res = ctx.resident(self.residual) if self.residual is not None else None
        self.out_res = ctx.resident(self.epi.output)
        # NC1HWC0 tensors in DDR (plan_c0_layouts): the input and the residual read C0-blocked, the result
        # written so (ACCCVT NZ2DN, runs of whole C0 blocks)
        layouts = ctx.ddr.layouts
        self.in_c0 = self.in_res is None and layouts.get(self.node.inputs[0]) == C0_BLOCKED
        self.res_c0 = self.residual is not None and self.residual_res is None and layouts.get(self.residual) == C0_BLOCKED
        self.out_c0 = self.out_res is None and layouts.get(self.epi.output) == C0_BLOCKED

    def c0_unserved(self) -> bool:
        """Whether the group reads or writes an NC1HWC0 tensor in DDR in a way this conv does not serve: an
        epilogue operand, a result a TIU epilogue finishes, or channels not whole C0 blocks (the TIU conv
        with its layout conversions then runs it: _ConvertedTiu)."""
        layouts, geo = self.ctx.ddr.layouts, self.geom
        touched = {t for n in self.group.nodes for t in n.inputs if t and layouts.get(t) == C0_BLOCKED}
        touched |= {t for t in self.group.produced() if layouts.get(t) == C0_BLOCKED}
        served = {t for t, ok in ((self.node.inputs[0], self.in_c0), (self.residual, self.res_c0),
                                  (self.epi.output, self.out_c0)) if ok}
        c0 = c0_elems(self.ctx.chip, self.ctx.prec)
        out = self._output()
        whole = geo.cin % c0 == 0 and geo.cout % c0 == 0 and (geo.cin // geo.groups) % c0 == 0 \
            and (geo.cout // geo.groups) % c0 == 0
        return bool(touched - served) or (bool(served) and not whole) or \
            (self.out_c0 and (out.needs_tiu or out.in_slot))

    def _lmem_residual_ok(self) -> bool:
        """Whether a residual kept in LMEM can enter the ACC (I . R from its pixel-major image, built
        by TIU transposes from the resident channels): an implicit GEMM of one image and one group."""
        geo = self.geom
        return geo.n == 1 and geo.groups == 1 and self._images() is not None and self._residual_layout(True) == "zn"

    def reads_lmem(self) -> bool:
        """Whether an operand or the result lives in LMEM (a layer group): then only the implicit GEMM
        of one image and group serves (TileEngineChoice hands anything else to the TIU conv)."""
        return (self.in_res is not None or self.residual_res is not None or self.out_res is not None
                or self.epi.full_resident())

    def _output(self) -> "_TileOutput":
        """Result tiles in the model's dtype when only Relu is left for the TIU, else fp32 (and the
        bias added on the TIU); written into the result's LMEM buffer when a layer group keeps it."""
        if self.bias_in_acc:
            return _TileOutput(self.ctx, self.epi, None, self.node.name, self.out_res, value_prec=self.ctx.prec)
        return _TileOutput(self.ctx, self.epi, self.bias, self.node.name, self.out_res)

    @staticmethod
    def scratch_bytes(graph, group: Group, options) -> int:
        node = group.anchor
        n, cin, h, w = graph.tensor(node.inputs[0]).shape
        cout, cin_g, kh, kw = graph.tensor(node.inputs[1]).shape
        _, _, ho, wo = graph.tensor(node.outputs[0]).shape
        esize = {"fp32": 4, "fp16": 2, "bf16": 2}[options.dtype]
        return _nhwc_offset(cin_g * kh * kw * ho * wo * esize) + cin_g * h * w * esize

    def _gemm(self, out: _TileOutput, weights: np.ndarray, gi: int, n: int = 0,
              window: tuple[int, int] | None = None, residual_images: int | None = None) -> TileGemm:
        """The GEMM of image n, group gi; `window` = (PhaseImages offset, pixel tile) reads B from the
        input's phase images in LMEM (implicit GEMM), else from the im2col matrix in DDR."""
        ctx, geo = self.ctx, self.geom
        cin_g, cout_g = geo.cin // geo.groups, geo.cout // geo.groups
        kdim, pix, oc0 = cin_g * geo.kh * geo.kw, geo.ho * geo.wo, gi * cout_g
        a = ConstOperand(ctx, "nz", weights[oc0:oc0 + cout_g], f"{self.node.name}:W{gi}", 0, 0)
        k_unit = cin_g
        if window is not None and self.halo:
            rows = window[1] // geo.wo
            group = HaloOperand.group_for(ctx.chip, geo, cin_g, rows, ctx.prec.bytes)
            if not group:
                raise ValueError(f"no halo of {rows} output rows fits a tile slot")
            bop = HaloOperand(ctx, self._images(), window[0], geo, group, rows)
            k_unit = bop.k_unit
        elif window is not None:
            bop = WindowOperand(ctx, self._images(), window[0], geo.wo)
        else:
            bop = RowsOperand(ctx, "zn", self._p_address(cin_g), kdim, pix, kdim, col_major=True)
        residual = None
        if self.res_c0:     # Zn tiles of R straight from its NC1HWC0 image (I . R)
            c0 = c0_elems(ctx.chip, ctx.prec)
            r_addr = ctx.ddr_addr(self.residual) + (n * -(-geo.cout // c0) + oc0 // c0) * pix * c0 * ctx.prec.bytes
            residual = C0RowsOperand(ctx, r_addr, cout_g, pix, pix)
        elif self.residual is not None and (residual_images is not None or self.residual_res is not None):
            residual = WindowOperand(ctx, self._residual_images(), residual_images or 0, geo.wo)
        elif self.residual is not None:
            r_addr = ctx.ddr_addr(self.residual) + (n * geo.cout + oc0) * pix * ctx.prec.bytes
            layout = self._residual_layout(window is not None)
            residual = RowsOperand(ctx, layout, r_addr, cout_g, pix, pix)     # zn: I . R, channel rows whole fractals
        gemm = TileGemm(ctx, a, bop, cout_g, pix, kdim, out.value_prec if out.needs_tiu else ctx.prec,
                        bias_key=f"{self.node.name}:{gi}", residual=residual,
                        n_tile=window[1] if window else None, k_unit=k_unit if window else None)
        if self.bias_in_acc and self.bias is not None:
            gemm.row_bias = self.bias[oc0:oc0 + cout_g]
        gemm.relu = out.cvt_relu
        return gemm

    def _weights(self, implicit: bool = False) -> np.ndarray:
        """(Cout x K) with K running (kh, kw, c), so im2col copies runs of channels from the NHWC copy;
        (kw, kh, c) for an implicit GEMM (PhaseImages.tap: taps of a kernel column share a DMA); (c1, kh, kw,
        c0) for a halo GEMM (TIMG2COL's order)."""
        geo = self.geom
        cin_g = geo.cin // geo.groups
        w = np.asarray(self.ctx.const(self.node.inputs[1]), np.float32).reshape(geo.cout, cin_g, geo.kh, geo.kw)
        if implicit and self.halo:       # (c1, kh, kw, c0): TIMG2COL's K order
            k0 = self.ctx.chip.tile.k_fractal_bytes // self.ctx.prec.bytes
            return w.reshape(geo.cout, cin_g // k0, k0, geo.kh, geo.kw).transpose(0, 1, 3, 4, 2).reshape(geo.cout, -1)
        order = (0, 3, 2, 1) if implicit else (0, 2, 3, 1)
        return w.transpose(order).reshape(geo.cout, cin_g * geo.kh * geo.kw)

    def plan(self, region: str) -> TileConvPlan | None:
        """The TIU epilogue's buffers, then the NHWC staging buffers above them (every image and
        group still needs the epilogue's residents), or None when they do not fit `region`."""
        geo, ctx, chip = self.geom, self.ctx, self.ctx.chip
        if self.c0_unserved():
            return None
        implicit = self._plan_implicit(region)
        if implicit is not None or self.reads_lmem() or self.in_c0 or self.res_c0:
            return implicit         # a C0-blocked input or residual is read by the implicit GEMM only
        if ctx.ddr.scratch_bytes < self.scratch_bytes(ctx.graph, self.group, ctx.options):
            return None             # no im2col scratch planned: this conv runs on the TIU (_tile_conv_scratch)
        arena = ctx.planning_arena(region)
        out = self._output()
        dims = self._gemm(out, self._weights(), 0).dims
        planned = out.plan(arena, dims.mt, dims.nt, geo.cout, geo.ho * geo.wo)
        if planned is None:
            return None
        output_buffers, pix_in = len(arena.names), geo.h * geo.w
        sizes = lambda ct, pt: [tile_bytes_per_lane(chip, (1, ct, 1, pt), ctx.prec),      # noqa: E731
                                tile_bytes_per_lane(chip, (1, pt, 1, ct), ctx.prec)]
        ct = min(geo.cin // geo.groups, NHWC_BLOCK)
        pt = next((p for p in (NHWC_BLOCK, NHWC_BLOCK // 2, NHWC_BLOCK // 4, chip.lanes)
                   if arena.fits(sizes(ct, min(p, pix_in)) * 2)), chip.lanes)
        pt = min(pt, pix_in)
        if not arena.fits(sizes(ct, pt)):
            return None
        _, sets = arena.alloc_plan([], sizes(ct, pt), f"{self.node.name}:nhwc", names=([], ["nhwc_in", "nhwc_out"]))
        return TileConvPlan(region, ctx.window(region), tuple(arena.names), dims, *planned[:2], ct, pt,
                            tuple(tuple(x) for x in sets), output_buffers, out_group=planned[2])

    def emit(self, plan: TileConvPlan) -> None:
        ctx, geo = self.ctx, self.geom
        ctx.em.layer = self.node.name
        cin_g, cout_g = geo.cin // geo.groups, geo.cout // geo.groups
        kdim, pix = cin_g * geo.kh * geo.kw, geo.ho * geo.wo
        weights = self._weights(implicit=plan.window_images is not None)
        out = self._output()
        staged = sticky = None
        for n in range(geo.n):
            if self.out_c0:
                out.c0_store = lambda p, n=n: self._store_c0(n, p)      # noqa: E731
            for gi in range(geo.groups):
                ic0, oc0 = gi * cin_g, gi * cout_g
                window = (plan.window_images, plan.n_tile) if plan.window_images is not None else None
                gemm = self._gemm(out, weights, gi, n, window, plan.residual_images)
                if self.out_c0:
                    gemm.acc_layout = "NZ2DN"
                if plan.weight_stage is not None:       # one staging ring per conv, kept across images
                    if staged is None and plan.weight_lanes:
                        staged = LaneRowsOperand(ctx, "nz", gemm.a.matrix, gemm.a.key, gemm.dims.mt, gemm.dims.kt,
                                                 plan.weight_stage)
                    elif staged is None:
                        staged = StagedConstOperand(ctx, "nz", gemm.a.matrix, gemm.a.key, gemm.dims.mt, gemm.dims.kt,
                                                    plan.weight_stage, plan.weight_ring, plan.weight_level)
                    gemm.a = staged
                if plan.sticky_stage is not None:
                    if sticky is None:
                        sticky = StickyCache(ctx, plan.sticky_stage, 1)
                    gemm.sticky_cache = sticky
                if n == 0 and gi == 0 and out.needs_tiu:
                    out.load(plan.residents, plan.sets, geo.cout, pix, plan.out_group)
                if window is not None:
                    self._phase_images(n, ic0, cin_g, plan, zero=n == 0 and gi == 0)
                else:
                    self._im2col(n, ic0, cin_g, plan)
                if plan.residual_images is not None and self.residual_res is not None:
                    source = self.residual_res.view(ctx.chip, n, oc0, cout_g, 0, geo.ho)
                    self._build_images(self._residual_images(), None, plan.window_stage, plan.residual_images, False,
                                       source)
                elif plan.residual_images is not None:
                    pix_bytes = geo.ho * geo.wo * ctx.prec.bytes
                    self._build_images(self._residual_images(), ctx.ddr_addr(self.residual) + (n * geo.cout + oc0) * pix_bytes,
                                       plan.window_stage, plan.residual_images, False)

                def deliver(slot, _batch, m0, mt, n0, nt, n=n, oc0=oc0):
                    def regions(p0, width, c=oc0 + m0):
                        if self.out_res is not None:        # written into the LMEM buffer (rows_view)
                            return None, lambda addr: self._y_region(addr, n, c, mt, p0, width)
                        return (self._y_region(ctx.ddr_addr(self.epi.output), n, c, mt, p0, width),
                                lambda addr: self._y_region(addr, n, c, mt, p0, width))
                    out.deliver(slot, oc0 + m0, mt, n0, nt, regions)

                gemm.run(deliver)
                out.flush()
        macs = geo.n * geo.cout * pix * kdim
        ctx.note_layer(self.node.name, "Conv", macs=macs, lmem_peak=plan.peak, group=self.group.name)
        for nd in self.group.epilogue:
            ctx.note_layer(nd.name, nd.op_type, group=self.group.name)

    def _images(self) -> PhaseImages | None:
        """The input's phase images of an implicit GEMM, None when this conv cannot use one: channels
        per group not whole K fractals, output rows wider than a pixel tile, phases wider than the lanes.
        A halo GEMM keeps one phase (the padded image: TIMG2COL applies the stride)."""
        geo, chip = self.geom, self.ctx.chip
        cin_g = geo.cin // geo.groups
        if cin_g % (chip.tile.k_fractal_bytes // self.ctx.prec.bytes) or geo.wo > max(TILE_SIDES):
            return None
        if tile_bytes_per_lane(chip, (1, 1, geo.h, geo.w), self.ctx.prec) // self.ctx.prec.bytes > TIU_STRIDE_MAX:
            return None             # the transposes' source channel stride is a 16-bit TIU field
        if self.halo:
            geo = replace(geo, sy=1, sx=1)
        images = PhaseImages(geo, cin_g, self.ctx.prec.bytes)
        return images if images.lanes_used <= chip.lanes else None

    def _plan_implicit(self, region: str) -> TileConvPlan | None:
        """The implicit-GEMM plan: the epilogue's buffers, then the staged input and its phase images;
        the pixel tile is the most whole output rows a TILE tiling takes. None when the conv cannot
        use one or its buffers do not fit (the im2col plan is tried next)."""
        geo, ctx, chip = self.geom, self.ctx, self.ctx.chip
        images = self._images()
        if images is None:
            return None
        arena = ctx.planning_arena(region)
        out = self._output()
        for rows in range(min(geo.ho, max(TILE_SIDES) // geo.wo), 0, -1):
            try:
                dims = self._gemm(out, self._weights(), 0, 0, (0, rows * geo.wo)).dims
                break
            except ValueError:
                continue
        else:
            return None
        planned = out.plan(arena, dims.mt, dims.nt, geo.cout, geo.ho * geo.wo)
        if planned is None:
            return None
        output_buffers = len(arena.names)
        if self.reads_lmem() and (geo.n > 1 or geo.groups > 1):
            return None
        stage = chip.core.lmem_align_bytes      # DDR images pass through it (none when the sources are resident)
        if self.in_res is None and not self.in_c0:      # an NC1HWC0 input goes straight into its images
            stage = tile_bytes_per_lane(chip, (1, images.channels, geo.h, geo.w), ctx.prec)
        res_images = self._residual_images()
        if res_images is not None and self.residual_res is None:   # the residual passes through it too
            stage = max(stage, tile_bytes_per_lane(chip, (1, res_images.channels, geo.ho, geo.wo), ctx.prec))
        if not arena.fits([stage, images.bytes_per_lane]):
            return None
        sizes, names, ring, lanes, level = [stage, images.bytes_per_lane], ["window_stage", "window_images"], 0, False, 0
        if geo.groups == 1:         # the weights staged in LMEM: as many chunks as fit, all of them at most
            k_tiles = -(-images.channels * geo.kh * geo.kw // dims.kt)
            tiles = -(-geo.cout // dims.mt) * k_tiles
            stride = StagedConstOperand.chunk_stride(ceil_to(dims.mt, chip.tile.fractal_m) * dims.kt, ctx.prec)
            lane_rows = 2 * LaneRowsOperand.row_bytes(k_tiles, chip.tile.queue_slots, stride)
            if not chip.tile.move_port_bytes_per_cycle and not dims.resident and arena.fits(sizes + [lane_rows]):
                # A streams pass by pass and the tile buffer has no DMA port of its own: TIU copies fill the
                # slots (with the port, staged tiles moved by TMOVEs are faster since its moves pipeline)
                sizes, names, lanes = sizes + [lane_rows], names + ["weight_stage"], True
            else:
                chunks = -(-tiles // chip.lanes)          # a ring of one chunk only when there is one
                bank = chip.chunk_bytes_per_lane          # each ring slot in a dependency chunk of its own
                spread = next((r for r in range(chunks, 1, -1) if stride <= bank
                               and arena.fits(sizes + [StagedConstOperand.spread_bytes(r, stride, bank)])), 0)
                if spread:
                    ring, level = spread, bank
                    sizes, names = sizes + [StagedConstOperand.spread_bytes(ring, stride, bank)], names + ["weight_stage"]
                else:
                    ring = next((r for r in range(chunks, 1 if chunks > 1 else 0, -1) if arena.fits(sizes + [r * stride])), 0)
                    if ring:
                        sizes, names = sizes + [ring * stride], names + ["weight_stage"]
        residual = res_images is not None and arena.fits(sizes + [res_images.bytes_per_lane])
        if self.residual_res is not None and not residual:
            return None
        if residual:
            sizes, names = sizes + [res_images.bytes_per_lane], names + ["residual_images"]
        sticky = arena.fits(sizes + [chip.tile.slot_bytes])
        if sticky:
            sizes, names = sizes + [chip.tile.slot_bytes], names + ["sticky_stage"]
        offs, _ = arena.alloc_plan(sizes, [], f"{self.node.name}:window", names=(names, []))
        if sticky:
            offs, sticky = offs[:-1], offs[-1]
        else:
            sticky = None
        staged = ring or lanes
        return TileConvPlan(region, ctx.window(region), tuple(arena.names), dims, *planned[:2], 0, 0, (), output_buffers,
                            out_group=planned[2], window_stage=offs[0], window_images=offs[1], n_tile=dims.nt,
                            weight_stage=offs[2] if staged else None, weight_ring=ring, weight_lanes=lanes,
                            weight_level=level,
                            residual_images=offs[-1] if residual else None, sticky_stage=sticky)

    def _phase_images(self, n: int, ic0: int, cin_g: int, plan: TileConvPlan, zero: bool) -> None:
        """Image n's channels [ic0, ic0 + cin_g) into the phase images (_build_images)."""
        geo, e = self.geom, self.ctx.prec.bytes
        zero = zero and any((geo.pt, geo.pl, geo.pb, geo.pr))
        if self.in_res is not None:
            source = self.in_res.view(self.ctx.chip, n, ic0, cin_g, 0, geo.h)
            self._build_images(self._images(), None, plan.window_stage, plan.window_images, zero, source)
            return
        if self.in_c0:
            c0 = c0_elems(self.ctx.chip, self.ctx.prec)
            x_addr = self.ctx.ddr_addr(self.node.inputs[0]) + (n * -(-geo.cin // c0) + ic0 // c0) * geo.h * geo.w * c0 * e
            self._build_images_c0(self._images(), x_addr, plan.window_images, zero)
            return
        x_addr = self.ctx.ddr_addr(self.node.inputs[0]) + (n * geo.cin + ic0) * geo.h * geo.w * e
        self._build_images(self._images(), x_addr, plan.window_stage, plan.window_images, zero)

    def _residual_layout(self, implicit: bool) -> str:
        """Zn (I . R, R's channel rows whole K fractals) for an implicit GEMM whose output channels per
        group are whole fractals, else Nz (R . I)."""
        k0 = self.ctx.chip.tile.k_fractal_bytes // self.ctx.prec.bytes
        return "zn" if implicit and (self.geom.cout // self.geom.groups) % k0 == 0 else "nz"

    def _residual_images(self) -> PhaseImages | None:
        """The residual of an I . R step kept as a pixel-major image (a 1x1 stride-1 window over the
        output), so its Zn tiles arrive by LMEM -> tile-buffer DMAs of output rows x channels; None
        when there is no such residual."""
        geo = self.geom
        if self.residual is None or self.res_c0 or self._residual_layout(True) != "zn":
            return None
        out = SimpleNamespace(h=geo.ho, w=geo.wo, ho=geo.ho, wo=geo.wo, pt=0, pb=0, pl=0, pr=0, sy=1, sx=1, dy=1, dx=1,
                              kh=1, kw=1)
        return PhaseImages(out, geo.cout // geo.groups, self.ctx.prec.bytes)

    def _build_images(self, images: PhaseImages, x_addr: int | None, stage_offset: int, images_offset: int, zero: bool,
                      source: LTile | None = None) -> None:
        """An NCHW image at x_addr (images.channels channels, images.geo.h x w) into `images`: one load
        (channels on lanes; none when `source`, the image kept in LMEM by a layer group, is given), a zero
        fill when the conv pads (once: only the border stays zero), then one TIU C<->W transpose per phase
        (pixels onto lanes, the stride taken by the source's steps)."""
        ctx, chip, prec = self.ctx, self.ctx.chip, self.ctx.prec
        geo, channels, e, lane_bytes = images.geo, images.channels, prec.bytes, chip.lmem_bytes_per_lane
        stage = source
        if stage is None:
            stage = make_tile(chip, stage_offset, (1, channels, geo.h, geo.w), prec)
            pix_in = geo.h * geo.w
            ctx.em.load(stage, DRegion(x_addr, stage.shape, (channels * pix_in, pix_in, geo.w, 1), prec))
        row = images.row_bytes // e
        if zero:
            self._zero_images(images, images_offset)
        for phase, (ih0, rows, iw0, cols, u0, v0) in _scatters(images):
            src = LTile(stage.addr + (ih0 * stage.strides[2] + iw0 * stage.strides[3]) * e, (1, channels, rows, cols), prec,
                        (0, stage.strides[1], geo.sy * stage.strides[2], geo.sx * stage.strides[3]), StrideMode.FREE)
            dst = LTile(v0 * lane_bytes + images_offset + images.base[phase] + u0 * images.row_bytes,
                        (1, cols, rows, channels), prec, (0, 0, row, 1), StrideMode.FREE)    # columns never wrap the lanes
            f = dst.fields("res0", with_shape=True)
            f.update(src.fields("opd0"))
            ctx.em.tiu(CwBcTiu(op="cw_ts", opd0_c=channels, opd0_w=cols, **{k: v for k, v in f.items() if k != "opt_opd0_prec"}))

    def _zero_images(self, images: PhaseImages, images_offset: int) -> None:
        """Zero every phase's rows of `images` (one lane per column): the padding a conv reads."""
        prec = self.ctx.prec
        row = images.row_bytes // prec.bytes
        rows = images.bytes_per_lane // images.row_bytes
        self.ctx.em.ar("copy", LTile(images_offset, (1, images.lanes_used, rows, row), prec, (0, 0, row, 1),
                                     StrideMode.FREE), 0.0)

    def _build_images_c0(self, images: PhaseImages, x_addr: int, images_offset: int, zero: bool) -> None:
        """An NC1HWC0 image at x_addr (images.channels channels in whole C0 blocks) into `images`: a zero
        fill when the conv pads (once), then per phase one DMA, no TIU transpose: the phase's columns onto
        lanes, its rows in-lane, each pixel's channels one in-lane run of C0-element (32-byte) blocks read
        as contiguous runs of C0 from DDR (the layout conversion the NCHW input needs is gone)."""
        ctx, chip, prec = self.ctx, self.ctx.chip, self.ctx.prec
        geo, e, lane_bytes = images.geo, prec.bytes, chip.lmem_bytes_per_lane
        c0 = c0_elems(chip, prec)
        blocks, pix = images.channels // c0, geo.h * geo.w
        if zero:
            self._zero_images(images, images_offset)
        for phase, (ih0, rows, iw0, cols, u0, v0) in _scatters(images):
            shape = (blocks, cols, rows, c0)        # c walks the lanes (phase columns)
            src = DRegion(x_addr + (ih0 * geo.w + iw0) * c0 * e, shape, (pix * c0, geo.sx * c0, geo.sy * geo.w * c0, 1),
                          prec)
            dst = global_lmem_address(v0 * lane_bytes + images_offset + images.base[phase] + u0 * images.row_bytes, chip)
            ctx.em.region_copy(DRegion(dst, shape, (c0, images.bytes_per_lane // e, images.row_bytes // e, 1), prec), src)

    def _store_c0(self, n: int, p: dict) -> None:
        """A span of NZ2DN result tiles (pixel-major: pixel j's mt channels at j * mt) of image n into the
        NC1HWC0 result: one DMA whose DDR side is, per C0 block of each tile, one contiguous run of nt
        pixels x C0 channels."""
        ctx, chip, prec, geo = self.ctx, self.ctx.chip, self.ctx.prec, self.geom
        c0 = c0_elems(chip, prec)
        row0, mt, col0, nt, slots = p["row0"], p["mt"], p["col0"], p["nt"], p["slots"]
        if row0 % c0 or mt % c0:
            raise ValueError(f"result rows {row0}..{row0 + mt} are not whole C0 blocks of {c0}")
        pix, count = geo.ho * geo.wo, len(slots)
        shape = (mt // c0, count, nt, c0)          # c walks the slots' lanes
        step = mt * pix if p["along"] == "rows" else nt * c0
        base = ctx.ddr_addr(self.epi.output) + ((n * -(-geo.cout // c0) + row0 // c0) * pix + col0) * c0 * prec.bytes
        src = DRegion(global_lmem_address(slots[0], chip), shape, (c0, chip.tile.slot_bytes // prec.bytes, mt, 1), prec)
        ctx.em.region_copy(DRegion(base, shape, (pix * c0, step, c0, 1), prec), src)

    def _y_region(self, addr: int, n: int, c0: int, ct: int, p0: int, pt: int) -> DRegion:
        geo, prec = self.geom, self.ctx.prec
        pix = geo.ho * geo.wo
        return DRegion(addr + ((n * geo.cout + c0) * pix + p0) * prec.bytes, (1, ct, 1, pt), (ct * pix, pix, pt, 1), prec)

    def _nhwc_address(self, cin_g: int) -> int:
        geo = self.geom
        p_bytes = cin_g * geo.kh * geo.kw * geo.ho * geo.wo * self.ctx.prec.bytes
        return self.ctx.ddr.scratch_base + _nhwc_offset(p_bytes)

    def _p_address(self, cin_g: int) -> int:
        """Where P lives: the scratch area, or the NHWC copy itself when im2col is the identity."""
        geo = self.geom
        if geo.kh * geo.kw == 1 and geo.sy == geo.sx == 1 and not any((geo.pt, geo.pl, geo.pb, geo.pr)):
            return self._nhwc_address(cin_g)
        return self.ctx.ddr.scratch_base

    def _im2col(self, n: int, ic0: int, cin_g: int, plan: TileConvPlan) -> int:
        """P[(oh, ow), (kh, kw, c)] in the scratch area (K contiguous, so B = P^T loads into Zn
        tiles in runs of K0 elements), built from an NHWC copy of the input: zero fill when the
        taps reach padding, then one DMA per (kh, kw) copying runs of cin_g channels. A 1x1
        stride-1 unpadded convolution uses the NHWC copy itself."""
        ctx, geo, prec = self.ctx, self.geom, self.ctx.prec
        pix = geo.ho * geo.wo
        kk = geo.kh * geo.kw
        rows = cin_g * kk
        base = ctx.scratch_region(0, (1, 1, rows, pix)).addr
        nhwc = self._to_nhwc(n, ic0, cin_g, self._nhwc_address(cin_g), plan)
        padded = any((geo.pt, geo.pl, geo.pb, geo.pr))
        if self._p_address(cin_g) == nhwc:
            return nhwc
        total = rows * pix
        if padded:
            width = next(w for w in range(min(total, 65535), 0, -1) if total % w == 0)
            ctx.em.fill(DRegion(base, (1, 1, total // width, width), (total, total, width, 1), prec), 0.0)
        for i in range(geo.kh):
            oh_lo, oh_hi = _valid(geo.ho, geo.sy, i * geo.dy - geo.pt, geo.h)
            for j in range(geo.kw):
                ow_lo, ow_hi = _valid(geo.wo, geo.sx, j * geo.dx - geo.pl, geo.w)
                if oh_hi <= oh_lo or ow_hi <= ow_lo:
                    continue
                src = nhwc + ((oh_lo * geo.sy + i * geo.dy - geo.pt) * geo.w + ow_lo * geo.sx + j * geo.dx - geo.pl) * cin_g * prec.bytes
                dst = base + ((oh_lo * geo.wo + ow_lo) * rows + (i * geo.kw + j) * cin_g) * prec.bytes
                copy_nd(ctx, src, (geo.sy * geo.w * cin_g, geo.sx * cin_g, 1), dst, (geo.wo * rows, rows, 1),
                        (oh_hi - oh_lo, ow_hi - ow_lo, cin_g), prec)
        return base

    def _to_nhwc(self, n: int, ic0: int, cin_g: int, dst_addr: int, plan: TileConvPlan) -> int:
        """Channels [ic0, ic0 + cin_g) of image n, transposed to pixel-major (NHWC) at dst_addr
        through LMEM: load (channels on lanes, pixels along W), TIU C<->W transpose, store runs
        of channels per pixel. Double-buffered over (channel, pixel) blocks."""
        ctx, geo, chip, prec = self.ctx, self.geom, self.ctx.chip, self.ctx.prec
        pix_in = geo.h * geo.w
        ct, pt, sets = plan.nhwc_ct, plan.nhwc_pt, plan.nhwc_sets
        x_addr = ctx.ddr_addr(self.node.inputs[0]) + (n * geo.cin + ic0) * pix_in * prec.bytes
        blocks = [(c0, c, p0, p) for c0, c in steps(cin_g, ct) for p0, p in steps(pix_in, pt)]

        def load(block, s):
            c0, c, p0, p = block
            ctx.em.load(make_tile(chip, sets[s][0], (1, c, 1, p), prec),
                        DRegion(x_addr + (c0 * pix_in + p0) * prec.bytes, (1, c, 1, p), (cin_g * pix_in, pix_in, p, 1), prec))

        def transpose_store(block, s):
            c0, c, p0, p = block
            src = make_tile(chip, sets[s][0], (1, c, 1, p), prec)
            out = make_tile(chip, sets[s][1], (1, p, 1, c), prec)
            f = out.fields("res0", with_shape=True)
            f.update(src.fields("opd0"))
            ctx.em.tiu(CwBcTiu(op="cw_ts", opd0_c=c, opd0_w=p, **{k: v for k, v in f.items() if k != "opt_opd0_prec"}))
            ctx.em.store(out, DRegion(dst_addr + (p0 * cin_g + c0) * prec.bytes, (1, p, 1, c), (pix_in * cin_g, cin_g, c, 1), prec))

        pipelined(blocks, len(sets), load, transpose_store)
        return dst_addr


def _scatters(images: PhaseImages):
    """(phase, its scatter) of every phase of `images` that holds input pixels."""
    for phase in images.base:
        scatter = images.scatter(phase)
        if scatter is not None:
            yield phase, scatter


def _nhwc_offset(p_bytes: int) -> int:
    """Scratch offset of the NHWC staging copy: after P, 4 KiB aligned."""
    return -(-p_bytes // 4096) * 4096


def _valid(out: int, stride: int, offset: int, size: int) -> tuple[int, int]:
    """Output positions o in [lo, hi) with 0 <= o*stride + offset < size."""
    lo = max(0, -(-(-offset) // stride)) if offset < 0 else 0
    hi = min(out, (size - 1 - offset) // stride + 1) if size - 1 - offset >= 0 else 0
    return lo, max(lo, hi)


class TileEngineChoice:
    """A conv or MatMul group of a tile-path model that the TILE engine can take, planned on the engine
    that runs it faster: the TILE plan, or the TIU's (lowering.ops.conv / lowering.compiler.tiu_matmul_emitter).
    The TIU's when the TILE plan does not fit a region or (convs) a layer group keeps an operand or the result
    in LMEM in a way only the TIU conv serves (no implicit GEMM of one image, or its buffers do not fit beside
    the resident tensors); never the TIU's when (MatMuls, whose declared LMEM ports are the TILE product's,
    _tile_matmul_ports) the group's LMEM residents are not all in the TIU product's ports (`tiu_serves`).
    With ENGINE_CHOICE "fit" or "cost" both are planned in each region and the faster one is taken: "fit" by
    the busiest unit of its instructions on the shared cost model (_unit_bound_ps; MatMuls _shared_bound_ps:
    their TILE plans are GDMA-bound where the TIU's are about as fast, and then the TIU's time is what the
    layers around them lose; convs keep _unit_bound_ps, which measured faster on ResNet-50 / SqueezeNet), "cost" by its
    instructions run alone on the timing model (the cost the layer-group search uses:
    lowering.compiler._records_ps). emit() follows the plan chosen. Conv results stay in LMEM (NCHW, channels
    on lanes, what the next conv's phase images are transposed from) between consecutive convs either way."""

    def __init__(self, ctx: LowerCtx, group: Group, tile_emitter, tiu_emitter, fit_bound, tiu_serves: bool = True):
        from tpuflow.lowering.weights import WeightImage
        self.ctx, self.group = ctx, group
        self.tile_emitter, self.tiu_emitter, self.tiu_serves = tile_emitter, tiu_emitter, tiu_serves
        self.fit_bound = fit_bound           # "fit"'s measure of a plan's records
        self.tile = tile_emitter(ctx, group)
        # the TIU plans in a context of its own weight image: a TIU MatMul places its constant operand when it
        # is constructed (MatmulEmitter._operand_addr), and a plan not taken must not grow the compile's image
        planning = replace(ctx, weights=WeightImage(ctx.weights.base))
        self.make_tiu = lambda: tiu_emitter(planning, group)     # noqa: E731  (plans only: emit() uses ctx)
        self.tile_missed: set[str] = set()                   # regions the TILE plan does not fit

    @classmethod
    def conv(cls, ctx: LowerCtx, group: Group) -> "TileEngineChoice":
        return cls(ctx, group, TileConvEmitter, _tiu_conv, _unit_bound_ps)

    @classmethod
    def matmul(cls, ctx: LowerCtx, group: Group) -> "TileEngineChoice":
        from tpuflow.lowering.compiler import tiu_matmul_emitter
        return cls(ctx, group, TileMatmulEmitter, tiu_matmul_emitter, _shared_bound_ps, _tiu_matmul_serves(ctx, group))

    @staticmethod
    def is_tile(plan) -> bool:
        return isinstance(plan, (TileConvPlan, TilePlan))

    def plan(self, region: str):
        tile = self.tile.plan(region)
        if tile is None:
            self.tile_missed.add(region)        # a wider region's TILE plan is still preferred (wants_wider)
            return self.make_tiu().plan(region) if self.tiu_serves else None
        if _choice(self.ctx.options) == "tile" or not self.tiu_serves:
            return tile
        tiu = self.make_tiu().plan(region)
        return tile if tiu is None or self._faster(tile, tiu) else tiu

    def _faster(self, tile, tiu) -> bool:
        """Whether the TILE plan beats the TIU plan: on the timing model alone ("cost"), or ("fit") on
        the shared per-instruction cost model's busiest unit (_unit_bound_ps), the TIU on a tie."""
        if _choice(self.ctx.options) == "cost":
            return self._cost(tile) <= self._cost(tiu)
        return self._bound(tile) < self._bound(tiu)

    def _bound(self, plan) -> int:
        """fit_bound of the plan's instructions (cached like _cost)."""
        return self._probe(plan, "bound", lambda records: self.fit_bound(records, self.ctx.chip))

    def _cost(self, plan) -> int:
        """Picoseconds of the plan's instructions alone on the timing model (cached per compile: the
        layer-group search plans a group many times under the same residency)."""
        from tpuflow.lowering.compiler import _records_ps
        return self._probe(plan, "cost", lambda records: _records_ps(records, self.ctx.chip, self.ctx.options))

    def _probe(self, plan, kind: str, measure) -> int:
        """`measure` of the records the plan emits into a probe context (cached per compile under
        `kind`: the layer-group search plans a group many times under the same residency)."""
        from tpuflow.lowering.weights import WeightImage
        ctx = self.ctx
        residents = tuple((t, r.addr, r.size) for t in sorted({t for n in self.group.nodes for t in n.inputs if t} | self.group.produced())
                          if t and (r := ctx.resident(t)) is not None)
        key = (kind, ctx.options, self.group.anchor.name, plan, residents, tuple(ctx.tile_pushes))
        cache = _PLAN_COSTS.setdefault(ctx.graph, {})
        if key not in cache:
            probe = replace(ctx.trial(plan.region), weights=WeightImage(ctx.weights.base))
            (self.tile_emitter if self.is_tile(plan) else self.tiu_emitter)(probe, self.group).emit(plan)
            cache[key] = measure(probe.em.records)
        return cache[key]

    def wants_wider(self, plan) -> bool:
        if self.is_tile(plan):
            return False
        wants = getattr(self.make_tiu(), "wants_wider", None)
        return plan.region in self.tile_missed or (wants is not None and wants(plan))

    def prefers(self, plan, other) -> bool:
        if self.is_tile(plan) != self.is_tile(other):
            if _choice(self.ctx.options) == "tile":
                return self.is_tile(plan)
            if _choice(self.ctx.options) == "cost":
                return self._cost(plan) < self._cost(other)
            tile, tiu = (plan, other) if self.is_tile(plan) else (other, plan)
            return self._faster(tile, tiu) == self.is_tile(plan)
        prefers = getattr(self.make_tiu(), "prefers", None)
        return not self.is_tile(plan) and prefers is not None and prefers(plan, other)

    def misfit(self) -> str:
        from tpuflow.lowering.emitplan import NO_FIT
        misfit = getattr(self.make_tiu(), "misfit", None) if self.tiu_serves else None
        return misfit() if misfit is not None else NO_FIT

    def emit(self, plan) -> None:
        (self.tile if self.is_tile(plan) else self.tiu_emitter(self.ctx, self.group)).emit(plan)


def _tiu_matmul_serves(ctx: LowerCtx, group: Group) -> bool:
    """Whether the TIU product serves a tile-path MatMul group's LMEM residents: each operand kept in LMEM
    is one it reads there in that layout, each result one it writes there (a column-split result too)."""
    from tpuflow.lowering.compiler import tiu_matmul_emitter
    readable, writable = tiu_matmul_emitter.resident_ports(ctx.graph, group, ctx.chip)
    produced = group.produced()
    for t in {t for n in group.nodes for t in n.inputs if t} - produced:
        held = ctx.resident(t)
        if held is not None and readable.get(t) != held.layout:
            return False
    for t in produced:
        held = ctx.resident(t)
        if (held is not None and writable.get(t) != held.layout) or (t in ctx.residency.splits and t not in writable):
            return False
    return True


def _unit_bound_ps(records, chip) -> int:
    """The busiest unit's ps over emitted records on the shared cost model (hwmodel.timing.cost): per
    unit the sum of its instructions' times, the units being the TIU, the GDMA and, of the TILE engine,
    the cube (TMATMUL, TGEMV, TPUSH), the ACCCVT drain, the tile buffer's DMA port (a TMOVE holds it for
    its bytes at the port width: its latency is pipelined) and the expansion path (TIMG2COL). A bound
    where every unit overlaps the others perfectly: what a conv costs wherever it is not waited for."""
    return max(_unit_busy(records, chip).values(), default=0)


def _shared_bound_ps(records, chip) -> int:
    """_unit_bound_ps with the TIU and the GDMA counted as one unit: the units every other layer of a model
    needs too (loads and stores, the elementwise, normalisation and softmax layers around a product), so
    what a plan takes of them is taken from its neighbours, which the TILE engine's own units are not."""
    busy = _unit_busy(records, chip)
    return max(max(busy.values(), default=0), busy.get("TIU", 0) + busy.get("GDMA", 0))


def _unit_busy(records, chip) -> dict[str, int]:
    """_unit_bound_ps' ps per unit."""
    from tpuflow.hwmodel.timing.cost import engine_period_ps, instruction_ps
    from tpuflow.hwmodel.timing.engines import unit_phases
    from tpuflow.isa import AccCvt, Engine, TImg2Col, TMove
    busy: dict[str, int] = {}
    for rec in records:
        instr, unit = rec.instr, rec.engine.name
        if rec.engine is Engine.TILE:
            unit = "port" if isinstance(instr, TMove) else "expand" if isinstance(instr, TImg2Col) else \
                "drain" if isinstance(instr, AccCvt) else "cube"
        acc = instr.accesses(chip) if isinstance(instr, TMove) else None
        if acc is not None and not (acc.ddr_reads or acc.ddr_writes):
            ps = unit_phases(instr, chip)[1] * engine_period_ps(instr, chip)
        else:
            ps = instruction_ps(instr, chip)
        busy[unit] = busy.get(unit, 0) + ps
    return busy


def _tiu_conv(ctx: LowerCtx, group: Group):
    """The TIU conv of a group, with layout conversions when it touches NC1HWC0 tensors in DDR."""
    from tpuflow.lowering.ops.conv import ConvEmitter
    reads, writes = _c0_tensors_of(ctx.graph, group, ctx.ddr.layouts)
    return _ConvertedTiu(ctx, group) if reads or writes else ConvEmitter(ctx, group)


def _c0_tensors_of(graph, group: Group, layouts: dict[str, str]) -> tuple[list[str], list[str]]:
    """(NC1HWC0 tensors the group reads, those it writes) among `layouts`."""
    reads = sorted({t for n in group.nodes for t in n.inputs if t and layouts.get(t) == C0_BLOCKED} - group.produced())
    return reads, sorted(t for t in group.produced() if layouts.get(t) == C0_BLOCKED)


def _nchw_bytes(graph, tensor: str, options) -> int:
    """Bytes of `tensor` stored NCHW in the compile's float type."""
    return math.prod(graph.tensor(tensor).shape) * Prec.from_name(options.dtype).bytes


class _ConvertedTiu:
    """The TIU conv of a tile-path conv group that reads or writes NC1HWC0 tensors in DDR (a conv the cube
    cannot serve in some region or sliced run: the layout plan expected it on the cube): each such input is
    converted to NCHW in the scratch area before it (c0_to_nchw), each such result written there and
    converted after it (nchw_to_c0). The conversions are layers of their own ("<conv>:<tensor>>NCHW",
    "<conv>:<tensor>>NC1HWC0", op LayoutConversion) in the estimate report and the manifest."""

    def __init__(self, ctx: LowerCtx, group: Group):
        from tpuflow.lowering.ops.conv import ConvEmitter
        self.ctx, self.group = ctx, group
        self.inner = ConvEmitter(ctx, group)

    def plan(self, region: str):
        return self.inner.plan(region)

    def prefers(self, plan, other) -> bool:
        return self.inner.prefers(plan, other)

    def wants_wider(self, plan) -> bool:
        return self.inner.wants_wider(plan)

    def misfit(self) -> str:
        return self.inner.misfit()

    def emit(self, plan) -> None:
        from tpuflow.errors import LoweringError
        from tpuflow.lowering.ops.conv import ConvEmitter
        ctx, prec = self.ctx, self.ctx.prec
        reads, writes = _c0_tensors_of(ctx.graph, self.group, ctx.ddr.layouts)
        tensors, offset, placed = dict(ctx.ddr.tensors), 0, {}
        for t in reads + writes:
            nbytes = _nchw_bytes(ctx.graph, t, ctx.options)
            placed[t] = ctx.ddr.scratch_base + offset
            tensors[t] = replace(tensors[t], addr=placed[t], nbytes=nbytes, layout="")
            offset = ceil_to(offset + nbytes, 4096)
        if offset > ctx.ddr.scratch_bytes:
            raise LoweringError(f"internal: layout conversions of {self.group.anchor.name} need {offset} B of scratch")
        for t in reads:
            self._convert(t, ">NCHW", lambda t=t: c0_to_nchw(ctx, ctx.ddr_addr(t), placed[t], ctx.graph.tensor(t).shape, prec))
        ConvEmitter(replace(ctx, ddr=replace(ctx.ddr, tensors=tensors, layouts={})), self.group).emit(plan)
        for t in writes:
            self._convert(t, ">NC1HWC0", lambda t=t: nchw_to_c0(ctx, placed[t], ctx.ddr_addr(t), ctx.graph.tensor(t).shape, prec))

    def _convert(self, tensor: str, suffix: str, emit) -> None:
        em, layer = self.ctx.em, self.ctx.em.layer
        em.layer = f"{self.group.anchor.name}:{tensor}{suffix}"
        emit()
        self.ctx.note_layer(em.layer, "LayoutConversion", group=self.group.name)
        em.layer = layer


_PLAN_COSTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()     # graph -> {plan key: ps}
# "fit" (the default, issue 16): each conv the cube can take, and each MatMul but the attention core, runs where the shared per-instruction cost model
# (hwmodel.timing.cost) times its plan's busiest unit less busy (TileEngineChoice._faster, _unit_bound_ps; the
# TIU on a tie): no simulation while compiling. On sg2260 the cube and the TIU have the same fp16 peak (8192
# MACs per cycle), so the cube wins only where the TIU's lanes are poorly used (fewer output channels than
# lanes, e.g. a 3x3 conv 64 -> 16 in fp32); ResNet-50's and SqueezeNet's convs all stay on the TIU (their
# TILE plans' cube blocks, drains or staged weight DMAs outlast the TIU conv). Measured at this change (fp16
# sg2260, TILE-path us, TIU path's in brackets): resnet50 1086.9 (1098.3), squeezenet 127.4 (127.0; 127.0 since
# a pool joins a TIU conv's group and no im2col scratch moves the weight image: tile_pool_fusion); the
# earlier rules (drain-bound, not expanded on chip, one-block halos: resnet50 1121.5, squeezenet 136.2 at
# the same commit) kept convs on the cube that run faster on the TIU, and one 60-wide conv off the cube.
# "tile": every conv the cube can take and every MatMul but the attention core runs on the TILE whenever it fits (the TIU conv only where a layer
# group keeps an operand in LMEM in a way the TILE conv cannot read). "cost": each such conv runs on the
# TILE or the TIU, whichever its plan's instructions run faster alone on the timing model
# (TileEngineChoice; MatMuls too), and matrix-vector products run on the vector unit (tile_matmul_emitter). "cost" runs
# the timing model while compiling (tests/test_sweep.py assumes a tile-path compile reads no timing key).
# The choice is CompileOptions.tile_engine (`--tile-engine fit|all|cost`, "all" being "tile" here);
# ENGINE_CHOICE, when set ("fit", "tile" or "cost"), overrides it (tests and older benchmark scripts).
ENGINE_CHOICE: str | None = None
TILE_ENGINE_CHOICE = {"fit": "fit", "all": "tile", "cost": "cost"}


def _choice(options) -> str:
    """The engine choice in force: ENGINE_CHOICE when set, else the options' tile_engine."""
    return ENGINE_CHOICE or TILE_ENGINE_CHOICE[getattr(options, "tile_engine", "fit")]


def tile_conv_emitter(ctx: LowerCtx, group: Group):
    """A conv group with the TILE engine (TileEngineChoice.conv). On the TIU instead: a depthwise conv (not a
    matmul), a conv with fewer input channels per group than one K fractal row (K0 elements, e.g. an
    RGB stem: its im2col would move runs of a few bytes and its K fractals would be mostly padding),
    and a part of a conv (a slice of a sliced layer group, or one core's channels): the TILE conv
    computes whole images."""
    from tpuflow.lowering.context import WHOLE
    if not cube_can_take(ctx, group) or group.tail_pool is not None or ctx.part != WHOLE:
        return _tiu_conv(ctx, group)       # a fused pool: the group was formed as a TIU conv (tile_pool_fusion)
    return TileEngineChoice.conv(ctx, group)


def cube_can_take(ctx: LowerCtx, group: Group) -> bool:
    """Whether the cube can take a conv at all: not depthwise, at least K0 input channels per group."""
    geo = conv_geometry(ctx, group.anchor)
    k0 = ctx.chip.tile.k_fractal_bytes // ctx.prec.bytes
    return not (geo.groups == geo.cin == geo.cout and geo.groups > 1) and geo.cin // geo.groups >= k0


def standalone_engines(graph, groups: list[Group], chip, options) -> dict[str, str]:
    """{conv: "tile" | "tile-im2col" | "tiu"}: the engine each conv group of `groups` (formed without pool
    fusion) runs on when it is emitted alone, its operands in DDR (no layer group): the choice TileEngineChoice
    makes (`--tile-engine`: "all" takes the cube for every conv it can take, "fit" / "cost" compare the
    plans); "tile-im2col": on the cube from an im2col matrix in DDR (the only plan that needs scratch)."""
    from tpuflow.errors import LoweringError
    from tpuflow.lowering.emitplan import choose_plan, emission_for
    ctx = _standalone_ctx(graph, groups, chip, options)
    engines: dict[str, str] = {}
    for index, group in enumerate(groups):
        if group.kind != "conv":
            continue
        ctx.group_index = index
        engine = "tiu"
        if cube_can_take(ctx, group):
            try:
                plan = choose_plan(emission_for(tile_conv_emitter, ctx, group), ctx, group)
                if isinstance(plan, TileConvPlan):
                    engine = "tile" if plan.window_images is not None else "tile-im2col"
            except LoweringError:
                pass
        engines[group.anchor.name] = engine
    return engines


def _standalone_ctx(graph, groups: list[Group], chip, options) -> LowerCtx:
    """A context in which a group is planned and emitted alone: every activation in DDR, row-major."""
    from tpuflow.lowering.compiler import scratch_bytes
    from tpuflow.lowering.ddrplan import plan_ddr
    from tpuflow.lowering.emitter import Emitter
    from tpuflow.lowering.weights import WeightImage
    saved = TENSOR_LAYOUTS.pop(graph, None)
    try:
        ddr = plan_ddr(graph, groups, chip, options.dtype, scratch_bytes(graph, groups, options))
    finally:
        if saved is not None:
            TENSOR_LAYOUTS[graph] = saved
    return LowerCtx(graph, chip, options, Emitter(chip), ddr, WeightImage(ddr.weight_base))


def plan_c0_layouts(graph, groups: list[Group], engines: dict[str, str], chip, options) -> dict[str, str]:
    """{activation: "NC1HWC0"}: the tile-path activations kept C0-blocked in DDR (issue 16): the result of a
    conv on the cube (standalone_engines) that leaves the ACC finished (bias, residual, Relu in the ACC /
    ACCCVT: no TIU epilogue) and whose every reader is a conv the cube runs as an implicit GEMM reading it
    as its input (its phase images then come from one DMA per phase, no TIU transposes) or as the residual
    it accumulates (Zn tiles straight from DDR); not a graph input or output, channels whole C0 blocks,
    single core. Kept so when the shared cost model (_unit_busy: the busiest unit of the readers' image
    builds and residual fills and of the result's stores, NCHW against NC1HWC0) says it is not slower."""
    if options.cores > 1 or options.dtype not in ("fp32", "fp16", "bf16") or C0_LAYOUTS == "never":
        return {}
    ctx = _standalone_ctx(graph, groups, chip, options)
    group_of = {n.name: g for g in groups for n in g.nodes}
    layouts: dict[str, str] = {}
    for producer in groups:
        if producer.kind != "conv" or not tile_engine_of(engines, producer).startswith("tile"):
            continue
        emitter = TileConvEmitter(ctx, producer)
        tensor = emitter.epi.output
        users = graph.consumers(tensor)
        if not users or not _c0_result(ctx, emitter, tensor):
            continue
        readers = [(group_of[u.name], u) for u in users]
        if all(_reads_c0(ctx, g, u, tensor, engines) for g, u in readers) and \
                (C0_LAYOUTS == "always" or _c0_not_slower(ctx, emitter, tensor, [g for g, _ in readers])):
            layouts[tensor] = C0_BLOCKED
    return layouts


# plan_c0_layouts: "cost" (the shared cost model decides), "always" (every activation that can be C0-blocked
# is: tests of the layout's instructions and what-if measurements), "never"
C0_LAYOUTS = "cost"


def tile_engine_of(engines: dict[str, str], group: Group) -> str:
    return engines.get(group.anchor.name, "tiu") if group.kind == "conv" else ""


def _c0_result(ctx: LowerCtx, emitter: "TileConvEmitter", tensor: str) -> bool:
    """Whether a TILE conv can store its result `tensor` C0-blocked: finished in the ACC, whole C0 blocks."""
    graph = ctx.graph
    info = graph.tensor(tensor)
    out = emitter._output()
    c0 = c0_elems(ctx.chip, ctx.prec)
    return (tensor not in graph.inputs and tensor not in graph.outputs and info.quant is None and len(info.shape) == 4
            and tensor in emitter.group.stored and emitter.geom.cout % c0 == 0 and emitter.bias_in_acc
            and not out.needs_tiu and not out.in_slot)


def _reads_c0(ctx: LowerCtx, group: Group, node, tensor: str, engines: dict[str, str]) -> bool:
    """Whether `node` of `group` reads `tensor` as a conv the cube runs as an implicit GEMM serving an
    NC1HWC0 input (its phase images) or residual (I . R)."""
    if group.kind != "conv" or tile_engine_of(engines, group) != "tile" or group.tail_pool is not None:
        return False
    emitter = TileConvEmitter(ctx, group)
    c0 = c0_elems(ctx.chip, ctx.prec)
    if node is group.anchor:
        geo = emitter.geom
        return (node.inputs[0] == tensor and tensor not in node.inputs[1:] and emitter._images() is not None
                and geo.cin % c0 == 0 and (geo.cin // geo.groups) % c0 == 0)
    return emitter.residual == tensor and emitter._residual_layout(True) == "zn"


def _c0_not_slower(ctx: LowerCtx, producer: "TileConvEmitter", tensor: str, readers: list[Group]) -> bool:
    """The shared cost model's busiest unit over the instructions the layout changes (one image's or tile's
    worth, scaled by their count): the readers' phase images (NCHW: load + TIU transposes; NC1HWC0: one DMA
    per phase) and residual tiles, and the producer's result stores, NCHW against NC1HWC0."""
    from tpuflow.lowering.emitter import Emitter
    chip, prec, geo = ctx.chip, ctx.prec, producer.geom
    c0 = c0_elems(chip, prec)
    pix = geo.ho * geo.wo
    mt, nt = min(max(TILE_SIDES), geo.cout), min(max(TILE_SIDES), pix)
    tiles = geo.n * -(-geo.cout // mt) * -(-pix // nt)
    slot = chip.tile_slot_address(0, 0)
    addr = ctx.ddr_addr(tensor)
    totals = []
    for blocked in (False, True):
        busy: dict[str, int] = {}

        def add(emit, times: int) -> None:
            probe = replace(ctx, em=Emitter(chip))
            emit(probe)
            for unit, ps in _unit_busy(probe.em.records, chip).items():
                busy[unit] = busy.get(unit, 0) + ps * times

        slot_view = DRegion(global_lmem_address(slot, chip), (mt // c0, 1, nt, c0) if blocked else (1, 1, mt, nt),
                            (c0, 0, mt, 1) if blocked else (0, 0, nt, 1), prec)
        ddr_view = DRegion(addr, slot_view.shape, (pix * c0, 0, c0, 1) if blocked else (0, 0, pix, 1), prec)
        add(lambda p: p.em.region_copy(ddr_view, slot_view), tiles)
        for group in readers:
            reader = TileConvEmitter(ctx, group)
            if group.anchor.inputs[0] == tensor:
                images = reader._images()
                build = (lambda p, r=reader, i=images: TileConvEmitter(p, r.group)._build_images_c0(i, addr, 0, False)) \
                    if blocked else \
                    (lambda p, r=reader, i=images: TileConvEmitter(p, r.group)._build_images(i, addr, 0, 0, False))
                add(build, reader.geom.n)
            else:
                operand = (lambda p: C0RowsOperand(p, addr, mt, pix, pix)) if blocked else \
                    (lambda p: RowsOperand(p, "zn", addr, mt, pix, pix))
                add(lambda p, o=operand: o(p).load(slot, 0, mt, 0, nt), tiles)
        totals.append(max(busy.values(), default=0))
    return totals[1] <= totals[0]


def tile_pool_fusion(graph, chip, options, ends: frozenset = frozenset()):
    """form_groups' `fuse_pool` on the tile path: a pooling joins the conv group before it (one TIU conv
    + pool group, as on the TIU path: the pool runs on the conv's output tile, no DDR round trip) when that
    conv runs on the TIU anyway (standalone_engines); a conv that runs on the cube is left unfused (the cube
    cannot pool its result tiles) and the pool is a group of its own. Also plans the NC1HWC0 activations of
    the compile (plan_c0_layouts, ddrplan.TENSOR_LAYOUTS: every DDR plan of `graph` places them so)."""
    from tpuflow.lowering.groups import form_groups
    if options.matmul != "tile":
        return True
    unfused = form_groups(graph, fuse_pool=False, lanes=chip.lanes, ends=ends)
    TENSOR_LAYOUTS.pop(graph, None)
    engines = standalone_engines(graph, unfused, chip, options)
    _TILE_ENGINES[graph] = engines
    layouts = plan_c0_layouts(graph, unfused, engines, chip, options)
    if layouts:
        TENSOR_LAYOUTS[graph] = layouts
    return lambda group: engines.get(group.anchor.name, "tiu") == "tiu"


def tile_engine(graph, conv: str) -> str:
    """standalone_engines' engine of `conv` in the tile path being compiled ("" when not planned)."""
    return _TILE_ENGINES.get(graph, {}).get(conv, "")


_TILE_ENGINES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()     # graph -> standalone_engines


def _expands_on_chip(chip, geo) -> bool:
    """Whether a conv's B tiles can be expanded on chip from halo tiles (HaloOperand): a chip with the
    expansion path, a kernel of more than one tap (a 1x1 window is its halo: TIMG2COL would only add a
    step), one group, the padded input no wider than the lanes (one phase: TIMG2COL takes the stride)."""
    return (chip.tile.img2col_bytes_per_cycle > 0 and geo.kh * geo.kw > 1 and geo.groups == 1
            and geo.w + geo.pl + geo.pr <= chip.lanes)


def _tile_conv_ports(graph, group: Group, chip) -> tuple[dict[str, str], dict[str, str]]:
    """The TIU conv's LMEM ports (NCHW input, full epilogue operands and result): a TILE conv reads and
    writes the same layout, and TileEngineChoice hands the TIU whatever the TILE conv cannot take."""
    from tpuflow.lowering.ops.conv import ConvEmitter
    return ConvEmitter.resident_ports(graph, group, chip)


tile_conv_emitter.resident_ports = _tile_conv_ports
def _tile_conv_scratch(graph, group: Group, options) -> int:
    """The im2col scratch of a conv the tile path may run on the cube from an im2col matrix (none for a
    conv group with a fused pool, or that standalone_engines put on the TIU or on the cube by an implicit
    GEMM: a TILE im2col plan of such a conv then does not fit, TileConvEmitter.plan, and a model whose convs
    all run on the TIU gets the TIU path's DDR plan)."""
    reads, writes = _c0_tensors_of(graph, group, TENSOR_LAYOUTS.get(graph, {}))
    convert = sum(ceil_to(_nchw_bytes(graph, t, options), 4096) for t in reads + writes)
    if group.tail_pool is not None or tile_engine(graph, group.anchor.name) in ("tiu", "tile"):
        return convert
    return max(convert, TileConvEmitter.scratch_bytes(graph, group, options))


tile_conv_emitter.scratch_bytes = _tile_conv_scratch

def _on_tiu(graph, group: Group) -> bool:
    """Whether a MatMul of a tile-path model runs on the TIU: a batched product of two activations read
    through folded head transposes (the attention core, per-head Q.K^T and P.V). Its heads are tiny (S x D x S), both operands are head-major
    views that the TIU path keeps in LMEM with the scale and softmax between them, and on the cube each
    would need transposing LMEM -> tile fills; so the whole core stays in LMEM and only the projections
    (constant weights) use the cube."""
    node = group.anchor
    a, b = (graph.tensor(t) for t in node.inputs[:2])
    heads = node.attr("a_perm") is not None or node.attr("b_perm") is not None
    return a.const is None and b.const is None and math.prod(a.shape[:-2]) > 1 and heads


def tile_matmul_emitter(ctx: LowerCtx, group: Group):
    """A MatMul group of a tile-path model: on the TIU for the attention core (_on_tiu) and, unless every
    product goes to the cube ("tile"), for a matrix-vector product (one row of A, constant B: the vector
    unit's GEMV; on the cube a TGEMV fills one row of every 16-row fractal and streams all of B through the
    tile slots: VGG-19's 25088 x 4096 classifier took 24.7k TMATMULs and 12.4k weight DMAs, and fit's
    busiest-unit measure does not see that: fp16 sg2260 VGG-19 10258 us with its classifier on the cube
    against 6692 on the TIU, AlexNet 3770 / 2275, ZFNet-512 5795 / 3294, ResNet-50 1094.3 / 1098.3); any
    other on the engine TileEngineChoice picks ("fit" / "cost": the faster plan, "tile": the cube)."""
    from tpuflow.lowering.ops.gemv import is_gemv
    if _on_tiu(ctx.graph, group) or (_choice(ctx.options) != "tile" and is_gemv(ctx, group)):
        from tpuflow.lowering.compiler import tiu_matmul_emitter
        return tiu_matmul_emitter(ctx, group)
    return TileEngineChoice.matmul(ctx, group)


def _tile_matmul_ports(graph, group: Group, chip):
    if _on_tiu(graph, group):
        from tpuflow.lowering.compiler import tiu_matmul_emitter
        return tiu_matmul_emitter.resident_ports(graph, group, chip)
    return TileMatmulEmitter.resident_ports(graph, group, chip)


tile_matmul_emitter.resident_ports = _tile_matmul_ports

TILE_EMITTERS = {"matmul": tile_matmul_emitter, "conv": tile_conv_emitter}
