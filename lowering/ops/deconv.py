"""ConvTranspose with kernel == stride on the TIU: each input pixel becomes a kh x kw block, so the
layer is kh * kw 1x1 convolutions (one per kernel tap) whose results interleave. Per tile of input
rows and output channels, each tap's conv writes straight into its strided positions of the output
tile in LMEM (the long CONV form: result strides kh * W_out by kw), then the epilogue runs over the
whole tile and one contiguous store writes it: DDR sees the input once and the output once."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tpuflow.isa import ConvTiu, Prec, StrideMode
from tpuflow.lowering.context import LowerCtx
from tpuflow.lowering.emitplan import FrozenPlan
from tpuflow.lowering.groups import Group
from tpuflow.lowering.ops.conv import _pipelined_rows, row_options
from tpuflow.lowering.ops.epilogue import Epilogue
from tpuflow.lowering.tensors import DRegion, LTile, make_tile, tile_bytes_per_lane
from tpuflow.lowering.tiling import pipelined, steps, steps_between
from tpuflow.lowering.weights import pack_conv_weights


@dataclass(frozen=True)
class DeconvPlan(FrozenPlan):
    """Output channels (ct) and input rows (ht) per tile; resident offsets (bias, all taps'
    weights, epilogue residents) and each buffer set's offsets (input, result, epilogue operands and
    scratch, the stored copy when the result is computed in fp32)."""

    ct: int
    ht: int
    residents: tuple[int, ...]
    sets: tuple[tuple[int, ...], ...]


class DeconvEmitter:
    def __init__(self, ctx: LowerCtx, group: Group):
        self.ctx, self.group, self.chip = ctx, group, ctx.chip
        self.node = group.anchor
        g = ctx.graph
        self.n, self.cin, self.h, self.w = g.tensor(self.node.inputs[0]).shape
        self.kh, self.kw = self.node.attr("kernel_shape")
        weights = np.asarray(ctx.const(self.node.inputs[1]), np.float32)          # [C, O, kh, kw]
        self.cout = weights.shape[1]
        b = self.node.inputs[2] if len(self.node.inputs) > 2 and self.node.inputs[2] else None
        self.bias = np.asarray(ctx.const(b), np.float32) if b else None
        # one [O, C] weight matrix per kernel tap (its own compact tile: a conv over more output
        # channels than lanes finds the next lane group's weights one tile row further)
        self.taps = [pack_conv_weights(np.ascontiguousarray(weights[:, :, a, b].T[:, :, None, None]), 1)
                     for a in range(self.kh) for b in range(self.kw)]
        epilogue = list(group.nodes[1:])
        out = self.node.outputs[0]
        self.fused_relu = bool(epilogue) and epilogue[0].op_type == "Relu"
        if self.fused_relu:
            out = epilogue.pop(0).outputs[0]
        self.ho, self.wo = self.h * self.kh, self.w * self.kw
        self.epi = Epilogue(ctx, out, epilogue, (self.n, self.cout, self.ho, self.wo), 2)
        self.result = self.epi.output

    @staticmethod
    def resident_ports(graph, group: Group, chip) -> tuple[dict[str, str], dict[str, str]]:
        return {}, {}                       # reads and writes DDR (not a layer-group member yet)

    # ------------------------------------------------------------ planning
    def _out_prec(self) -> Prec:
        return Prec.FP32 if not self.epi.empty and self.ctx.prec != Prec.FP32 else self.ctx.prec

    def _sizes(self, ct: int, ht: int) -> list[int]:
        chip, prec = self.chip, self.ctx.prec
        out_shape = (1, ct, ht * self.kh, self.wo)
        sizes = [tile_bytes_per_lane(chip, (1, self.cin, ht, self.w), prec),
                 tile_bytes_per_lane(chip, out_shape, self._out_prec())]
        sizes += self.epi.set_sizes(out_shape)
        if self._out_prec() != prec:
            sizes.append(tile_bytes_per_lane(chip, out_shape, prec))
        return sizes

    def _resident_sizes(self) -> list[int]:
        chip = self.chip
        tap = tile_bytes_per_lane(chip, (1, self.cout, 1, self.cin), self.ctx.prec, compact=True)
        return ([tile_bytes_per_lane(chip, (1, self.cout, 1, 1), Prec.FP32, compact=True)] + [tap] * len(self.taps)
                + self.epi.resident_sizes(self.cout, self.wo))

    def plan(self, region: str) -> DeconvPlan | None:
        """The widest output-channel tile, then the most input rows, that fit `region` double-buffered."""
        arena, lanes = self.ctx.planning_arena(region), self.chip.lanes
        residents = self._resident_sizes()
        c_opts = sorted({min(self.cout, lanes * k) for k in range(1, -(-self.cout // lanes) + 1)}, reverse=True)
        choice = next(((ct, ht) for ct in c_opts for ht in row_options(self.h)
                       if arena.fits(residents + self._sizes(ct, ht) * 2)), None)
        if choice is None:
            return None
        ct, ht = choice[0], _pipelined_rows(choice[1], self.h, self.wo)
        names = (["bias"] + [f"weights{t}" for t in range(len(self.taps))] + self.epi.resident_names(),
                 ["input", "result"] + self.epi.set_names() + (["stored"] if self._out_prec() != self.ctx.prec else []))
        res, sets = arena.alloc_plan(residents, self._sizes(ct, ht), self.node.name, names=names)
        return DeconvPlan(region, self.ctx.window(region), tuple(arena.names), ct, ht, tuple(res),
                          tuple(tuple(s) for s in sets))

    def misfit(self) -> str:
        return f"no tiling of the {self.kh}x{self.kw} ConvTranspose ({self.cin} -> {self.cout} channels) fits LMEM"

    # ------------------------------------------------------------ emission
    def emit(self, plan: DeconvPlan) -> None:
        ctx, chip = self.ctx, self.chip
        ctx.em.layer = self.node.name
        res = plan.residents
        self.bias_tile = make_tile(chip, res[0], (1, self.cout, 1, 1), Prec.FP32, compact=True)
        if self.bias is not None:
            ctx.load_const_channels(self.bias_tile, f"bias:{self.node.name}", self.bias.reshape(-1, 1), Prec.FP32)
        self.w_tiles = [make_tile(chip, off, (1, self.cout, 1, self.cin), ctx.prec, compact=True)
                        for off in res[1:1 + len(self.taps)]]
        for t, (tile, packed) in enumerate(zip(self.w_tiles, self.taps)):
            ctx.load_const_channels(tile, f"deconvw{t}:{self.node.name}", packed, ctx.prec)
        self.epi.load_residents(list(res[1 + len(self.taps):]), self.cout, self.wo)
        tiles = [(n, c0, ct, h0, ht) for n in range(self.n) for c0, ct in steps(self.cout, plan.ct)
                 for h0, ht in steps_between(0, self.h, plan.ht)]
        sets = plan.sets
        pipelined(tiles, len(sets), lambda t, s: self._load(t, sets[s]), lambda t, s: self._compute(t, sets[s]))
        macs = self.n * self.cout * self.ho * self.wo * self.cin
        ctx.note_layer(self.node.name, "ConvTranspose", macs=macs, lmem_peak=plan.peak, group=self.group.name)
        for n in self.group.nodes[1:]:
            ctx.note_layer(n.name, n.op_type, lmem_peak=plan.peak, group=self.group.name)

    def _out_window(self, n: int, c0: int, ct: int, h0: int, ht: int):
        """(shape, element offset, strides) of a tile's output rows in an NCHW output-shaped tensor."""
        base = ((n * self.cout + c0) * self.ho + h0 * self.kh) * self.wo
        return (1, ct, ht * self.kh, self.wo), base, (self.cout * self.ho * self.wo, self.ho * self.wo, self.wo, 1)

    def _load(self, tile, offs) -> None:
        n, c0, ct, h0, ht = tile
        ctx = self.ctx
        ctx.em.layer = self.node.name
        base = ((n * self.cin) * self.h + h0) * self.w
        ctx.em.load(make_tile(self.chip, offs[0], (1, self.cin, ht, self.w), ctx.prec),
                    ctx.region(self.node.inputs[0], (1, self.cin, ht, self.w), base,
                               (self.cin * self.h * self.w, self.h * self.w, self.w, 1)))
        if self.epi.full:
            shape, base, strides = self._out_window(n, c0, ct, h0, ht)
            self.epi.load_tile(offs[2:], shape,
                               lambda addr: DRegion(addr + base * ctx.prec.bytes, shape, strides, ctx.prec))

    def _compute(self, tile, offs) -> None:
        n, c0, ct, h0, ht = tile
        ctx, chip, prec = self.ctx, self.chip, self.ctx.prec
        out = make_tile(chip, offs[1], (1, ct, ht * self.kh, self.wo), self._out_prec())
        inp = make_tile(chip, offs[0], (1, self.cin, ht, self.w), prec)
        bias = self.bias_tile.sub_channels(c0, ct, chip) if self.bias is not None else None
        ctx.em.layer = self.node.name
        for a in range(self.kh):
            for b in range(self.kw):
                tap = a * self.kw + b
                view = LTile(out.addr + (a * self.wo + b) * out.prec.bytes, (1, ct, ht, self.w), out.prec,
                             (out.strides[0], out.strides[1], self.kh * self.wo, self.kw), StrideMode.FREE)
                ctx.em.tiu(self._conv(view, inp, self.w_tiles[tap].sub_channels(c0, ct, chip), bias))
        value = self.epi.apply(out, offs[2:], c0, 0) if not self.epi.empty else out
        if value.prec != prec:
            stored = make_tile(chip, offs[-1], value.shape, prec)
            ctx.em.layer = self.group.nodes[-1].name
            ctx.em.ar("copy", stored, value)
            value = stored
        ctx.em.layer = self.group.nodes[-1].name
        ctx.em.store(value, ctx.region(self.result, *self._out_window(n, c0, ct, h0, ht)))

    def _conv(self, out: LTile, inp: LTile, weights: LTile, bias: LTile | None) -> ConvTiu:
        """One tap's 1x1 conv of the whole input tile into its strided result view (long form)."""
        f = out.fields("res0", with_shape=True)
        f.update(inp.fields("opd0"))
        f.update(opd0_c=inp.c, opd0_h=inp.h, opd0_w=inp.w, opd1_addr=weights.addr, opd1_h=1, opd1_w=1,
                 opt_opd1_prec=int(weights.prec))
        if bias is not None:
            f.update(opd2_addr=bias.addr, opt_opd2_const=0, opt_opd2_prec=int(Prec.FP32))
        return ConvTiu(**f, opd0_up_pad=0, opd0_dn_pad=0, opd0_lf_pad=0, opd0_rt_pad=0, res_op_x_str=1,
                       res_op_y_str=1, opd1_x_ins0=0, opd1_y_ins0=0, opt_res_add=0, opt_relu=int(self.fused_relu),
                       weight_ic_block=1)
