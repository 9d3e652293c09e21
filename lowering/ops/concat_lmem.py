"""Channel Concat when layer groups keep its output or an input in LMEM: inputs already written
in place cost nothing; the others are copied into their channel slice, from DDR or from their own
LMEM buffer (GDMA, which can start a slice on any lane), or stored from LMEM into the DDR output."""

from __future__ import annotations

from tpuflow.lowering.context import LowerCtx
from tpuflow.lowering.emitplan import NoBuffersPlan, no_buffers
from tpuflow.lowering.groups import Group
from tpuflow.lowering.layergroup import NCHW, is_lmem_concat


def concat_ports(graph, group: Group, chip) -> tuple[dict[str, str], dict[str, str]]:
    """A channel Concat reads any runtime input and writes its output to LMEM."""
    if not is_lmem_concat(graph, group):
        return {}, {}
    node = group.anchor
    readable = {t: NCHW for t in node.inputs if not graph.tensor(t).is_const}
    return readable, {node.outputs[0]: NCHW}


def uses_lmem(ctx: LowerCtx, group: Group) -> bool:
    node = group.anchor
    return is_lmem_concat(ctx.graph, group) and any(ctx.resident(t) is not None for t in node.inputs + node.outputs)


class ConcatLmemEmitter:
    def __init__(self, ctx: LowerCtx, group: Group):
        self.ctx, self.group, self.node = ctx, group, group.anchor
        self.name = self.node.outputs[0]
        self.out = ctx.resident(self.name)

    def plan(self, region: str) -> NoBuffersPlan:
        """GDMA copies between LMEM and DDR buffers planned elsewhere: no buffer of its own."""
        return no_buffers(self.ctx, region)

    def emit(self, plan: NoBuffersPlan) -> None:
        ctx = self.ctx
        _, _, h, w = ctx.graph.tensor(self.name).shape
        ctx.em.layer = self.node.name
        offset = 0
        for x in self.node.inputs:
            channels = ctx.graph.tensor(x).shape[1]
            if self.out is not None:
                self._into_lmem(x, offset, channels, h, w)
            else:
                self._into_ddr(x, offset, channels, h, w)
            offset += channels
        ctx.note_layer(self.node.name, "Concat", group=self.group.name)

    def _into_lmem(self, x: str, offset: int, channels: int, h: int, w: int) -> None:
        ctx, src = self.ctx, self.ctx.resident(x)
        dst = self.out.view(ctx.chip, 0, offset, channels, 0, h)
        if src is not None and src.inside == self.name:
            return                                     # written in place by its producer
        if src is not None:
            ctx.em.lmem_copy(dst, src.tile(ctx.chip))
        else:
            ctx.em.load(dst, ctx.region(x, (1, channels, h, w)))

    def _into_ddr(self, x: str, offset: int, channels: int, h: int, w: int) -> None:
        ctx, src = self.ctx, self.ctx.resident(x)
        dst = ctx.region(self.name, (1, channels, h, w), offset * h * w)
        if src is not None:
            ctx.em.store(src.tile(ctx.chip), dst)
        elif ctx.ddr.alias_root(x) != ctx.ddr.alias_root(self.name) or ctx.ddr_addr(x) != dst.addr:
            ctx.em.region_copy(dst, ctx.region(x, (1, channels, h, w)))
