"""Nearest-neighbour upsampling of NCHW activations by integer repeats of H and W as a layer-group
member: it reads its input from LMEM (or loads it), writes its output to LMEM (or stores it),
and computes any band of output rows of any sample (sliced layer groups) with one TIU copy per
row repeat whose source strides repeat each element along W."""

from __future__ import annotations

from dataclasses import dataclass

from tpuflow.isa import StrideMode
from tpuflow.lowering.context import LowerCtx
from tpuflow.lowering.emitplan import FrozenPlan
from tpuflow.lowering.groups import Group
from tpuflow.lowering.layergroup import NCHW
from tpuflow.lowering.tensors import LTile, make_tile, tile_bytes_per_lane
from tpuflow.lowering.tiling import pipelined, steps, steps_between


def is_lmem_resize(graph, group: Group) -> bool:
    """A Resize of a 4-D tensor repeating only its last two axes."""
    node = group.anchor
    if node.op_type != "Resize" or len(group.nodes) != 1 or len(graph.tensor(node.inputs[0]).shape) != 4:
        return False
    repeats = tuple(node.attr("repeats"))
    return len(repeats) == 4 and repeats[:2] == (1, 1)


def resize_ports(graph, group: Group, chip) -> tuple[dict[str, str], dict[str, str]]:
    if not is_lmem_resize(graph, group):
        return {}, {}
    return {group.anchor.inputs[0]: NCHW}, {group.anchor.outputs[0]: NCHW}


def resize_input_rows(group: Group, rows: tuple[int, int]) -> tuple[int, int]:
    """Input rows output rows [lo, hi) repeat."""
    rh = group.anchor.attr("repeats")[2]
    return rows[0] // rh, -(-rows[1] // rh)


@dataclass(frozen=True)
class ResizePlan(FrozenPlan):
    """Channels (ct) and input rows (it) per tile; each buffer set's offsets (input, output)."""

    ct: int
    it: int
    sets: tuple[tuple[int, ...], ...]


class ResizeLmemEmitter:
    def __init__(self, ctx: LowerCtx, group: Group):
        self.ctx, self.group, self.chip = ctx, group, ctx.chip
        self.node = group.anchor
        self.x, self.y = self.node.inputs[0], self.node.outputs[0]
        self.n, self.c, self.h, self.w = ctx.graph.tensor(self.x).shape
        self.rh, self.rw = tuple(self.node.attr("repeats"))[2:]
        self.in_res, self.out_res = ctx.resident(self.x), ctx.resident(self.y)
        self.rows = ctx.rows_to_emit(self.h * self.rh)               # output rows to emit
        self.in_rows = resize_input_rows(group, self.rows)

    def _sizes(self, ct: int, it: int) -> list[int]:
        chip, prec = self.chip, self.ctx.prec
        return [0 if self.in_res else tile_bytes_per_lane(chip, (1, ct, it, self.w), prec),
                0 if self.out_res else tile_bytes_per_lane(chip, (1, ct, it * self.rh, self.w * self.rw), prec)]

    def plan(self, region: str) -> ResizePlan | None:
        """The largest channel and row tiles whose buffers fit `region` twice (else once)."""
        arena = self.ctx.planning_arena(region)
        lanes, band = self.chip.lanes, self.in_rows[1] - self.in_rows[0]
        c_opts = sorted({min(self.c, lanes * k) for k in range(1, -(-self.c // lanes) + 1)}, reverse=True)
        r_opts = sorted({min(band, r) for r in (band, 64, 32, 16, 8, 4, 2, 1)}, reverse=True)
        for copies in (2, 1):
            for ct in c_opts:
                for it in r_opts:
                    if arena.fits(self._sizes(ct, it) * copies):
                        _, sets = arena.alloc_plan([], self._sizes(ct, it), self.node.name, copies,
                                                   names=([], ["input", "output"]))
                        return ResizePlan(region, self.ctx.window(region), tuple(arena.names), ct, it,
                                          tuple(tuple(s) for s in sets))
        return None

    def misfit(self) -> str:
        return f"no tiling of Resize {self.node.name} fits LMEM"

    def emit(self, plan: ResizePlan) -> None:
        tiles = [(n, c0, ct, i0, it) for n in self.ctx.samples_to_emit(self.n) for c0, ct in steps(self.c, plan.ct)
                 for i0, it in steps_between(*self.in_rows, plan.it)]
        sets = plan.sets
        pipelined(tiles, len(sets), lambda t, s: self._load(t, sets[s]), lambda t, s: self._compute(t, sets[s]))
        self.ctx.note_layer(self.node.name, "Resize", lmem_peak=plan.peak, group=self.group.name)

    def _load(self, tile, offs) -> None:
        n, c0, ct, i0, it = tile
        if self.in_res is not None:
            return
        ctx = self.ctx
        ctx.em.layer = self.node.name
        base = ((n * self.c + c0) * self.h + i0) * self.w
        ctx.em.load(make_tile(self.chip, offs[0], (1, ct, it, self.w), ctx.prec),
                    ctx.region(self.x, (1, ct, it, self.w), base, (self.c * self.h * self.w, self.h * self.w, self.w, 1)))

    def _compute(self, tile, offs) -> None:
        n, c0, ct, i0, it = tile
        ctx, chip, prec = self.ctx, self.chip, self.ctx.prec
        ho, wo = self.h * self.rh, self.w * self.rw
        o0, o1 = max(self.rows[0], i0 * self.rh), min(self.rows[1], (i0 + it) * self.rh)
        src = (self.in_res.view(chip, n, c0, ct, i0, it) if self.in_res is not None
               else make_tile(chip, offs[0], (1, ct, it, self.w), prec))
        dst = (self.out_res.view(chip, n, c0, ct, o0, o1 - o0) if self.out_res is not None
               else make_tile(chip, offs[1], (1, ct, o1 - o0, wo), prec))
        ctx.em.layer = self.node.name
        for dy in range(self.rh):
            first = o0 + (dy - o0) % self.rh                          # first output row repeating row dy
            count = len(range(first, o1, self.rh))
            if count == 0:
                continue
            i = (first - dy) // self.rh - i0                          # its input row in the tile
            ctx.em.ar("copy", _rows_view(dst, first - o0, count, self.rh, self.w, self.rw, True),
                      _rows_view(src, i, count, 1, self.w, self.rw, False))
        if self.out_res is None:
            base = ((n * self.c + c0) * ho + o0) * wo
            ctx.em.store(dst, ctx.region(self.y, (1, ct, o1 - o0, wo), base, (self.c * ho * wo, ho * wo, wo, 1)))


def _rows_view(tile: LTile, row: int, count: int, row_step: int, width: int, repeat: int, output: bool) -> LTile:
    """`count` rows (every `row_step`-th from `row`) of `tile` as (rows, channels, width, repeat):
    the output's columns in groups of `repeat`, or the input's, each element read `repeat` times."""
    n_st, c_st, h_st, w_st = tile.strides
    st = (row_step * h_st, c_st, repeat * w_st, w_st) if output else (h_st, c_st, w_st, 0)
    return LTile(tile.addr + row * h_st * tile.prec.bytes, (count, tile.shape[1], width, repeat), tile.prec, st,
                 StrideMode.FREE)
