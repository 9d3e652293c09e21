"""Weight prefetch for programs split over several cores (issue 14): each core loads the constant
weights of its upcoming MM2 matmuls into blocks of LMEM above the working area while it computes
earlier groups, instead of into its working area just before the matmul. A group's prefetch loads
go after its last load (before its stores, in the one GDMA queue) and only as many rows as the
group's TIU time can hide beyond its own transfers, so they fill the GDMA's idle time (attention,
GELU, the other FFN matmul) without delaying the group's results; what is left of the next
matmul's block loads right before it. The loads never wait for a working-area buffer the previous
groups still read (the LMEM ring's write-after-read wait). A block lies below the resident
activations of every group from its load to its matmul, above the buffers of the group it loads
during (those groups work below it: LowerCtx.held_floor), and is free once its matmul was emitted
(a later load there waits for that read through the dependency ids)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tpuflow.isa import Engine, is_lmem
from tpuflow.lowering.context import HeldConstants, LowerCtx
from tpuflow.lowering.groups import Group
from tpuflow.lowering.mathops import CONST_REGION_BYTES

# Share of the working area (per lane, below the resident activations of every group) the weight
# area may take at its bottom (whole dependency chunks, at most what the core's blocks need). A
# compiler policy, not a hardware number: bert_base fp16 on sg2260 (lower_split + list schedule),
# 4 / 8 cores: 0.45 (2 chunks) 3270.9 / 3177.1 us, 0.55 and 0.65 (3) 3036.6 / 3140.9, 0.75 (4)
# 3020.1 / 3146.9; without prefetch 3363.3 / 3529.8. Larger areas cut the attention's softmax into
# more, smaller row tiles.
WEIGHT_RING_SHARE = 0.75


@dataclass
class WeightRing:
    """One core's area of weight blocks [start, end) per lane and the blocks whose matmuls are not
    emitted yet (group index -> block)."""

    start: int
    end: int
    align: int
    bank: int
    pending: dict[int, HeldConstants] = field(default_factory=dict)

    def where(self, size: int) -> int | None:
        """The lowest offset where a block of `size` bytes overlaps no block whose matmul is not
        emitted yet, preferring one that shares no dependency chunk (`bank`) with them (a load
        there would wait for their readers, and their readers for it); None when there is none."""
        size = self.aligned(size)
        starts = {self.start} | {b.addr + b.size for b in self.pending.values()}
        starts |= set(range(self.start, self.end, self.bank))
        fits = [a for a in sorted(starts) if a + size <= self.end and not self._overlaps(a, a + size, 1)]
        apart = [a for a in fits if not self._overlaps(a, a + size, self.bank)]
        return (apart or fits or [None])[0]

    def _overlaps(self, lo: int, hi: int, grain: int) -> bool:
        """Whether [lo, hi) meets a pending block, both widened to whole `grain`s."""
        return any(lo // grain < -(-(b.addr + b.size) // grain) and b.addr // grain < -(-hi // grain)
                   for b in self.pending.values())

    def take(self, index: int, addr: int, size: int) -> HeldConstants:
        block = HeldConstants(addr, self.aligned(size))
        self.pending[index] = block
        return block

    def aligned(self, size: int) -> int:
        return -(-size // self.align) * self.align


class CorePrefetch:
    """One core's weight ring, the blocks it is filling (group index -> rows loaded) and the first
    group it has not looked at yet."""

    def __init__(self, ctx: LowerCtx, core: int, groups: list[Group], parts_of, eligible, cores: int):
        self.ctx, self.core, self.groups, self.parts_of, self.eligible = ctx, core, groups, parts_of, eligible
        chip = ctx.chip
        top = min(ctx.residency.arena_top(i, chip.tile_window_offset) for i in range(len(groups)))
        bank = chip.chunk_bytes_per_lane            # dependency chunks: blocks share none with the SFU tables
        start = -(-CONST_REGION_BYTES // bank) * bank
        blocks = [self._block_bytes(i) for i in range(len(groups))]
        blocks = [b for b in blocks if b]
        size = min(int((top - start) * WEIGHT_RING_SHARE), -(-sum(blocks) // bank) * bank) // bank * bank
        self.ring = None         # no matmul to prefetch, or no room: the working area keeps all of LMEM
        if blocks and size >= max(blocks):
            self.ring = WeightRing(start, start + size, chip.core.lmem_align_bytes, bank)
            ctx.work_floor = self.ring.end
        self.gbps = min(chip.ddr_peak_bytes_per_second, chip.ddr_chip_peak_bytes_per_second / cores) / 1e9
        self.rows: dict[int, int] = {}
        self.next = 0

    def _block_bytes(self, index: int) -> int:
        """Per-lane bytes of group `index`'s weight block on this core (0: none)."""
        part = self.parts_of(index)[self.core] if self.eligible(self.groups[index]) else None
        if part is None:
            return 0
        em = _emitter(self.ctx, self.groups[index], index, part)
        return 0 if em.ctx.residency.splits.get(em.result) else em.held_bytes()

    def after(self, index: int, start: int) -> None:
        """Group `index` was emitted (this core's records from `start`): after its last load, load
        rows of the next groups' blocks while their transfers fit the time its TIU work hides
        beyond its own; then the rest of the next group's block; its own block is then free, and
        the next group works below the blocks still waiting."""
        if self.ring is None:
            return
        records = self.ctx.em.records
        span = records[start:]
        budget = self._tiu_ps(span) - self._dma_ps(span)
        at, end = start + _after_last_load(span, self.ctx.chip), len(records)
        self._fill(index, budget)
        moved = records[end:]
        del records[end:]
        records[at:at] = moved
        self._fill(index, None, upto=index + 1)
        for table in (self.ring.pending, self.rows, self.ctx.held):
            table.pop(index, None)

    def _fill(self, index: int, budget: int | None, upto: int | None = None) -> None:
        """Load block rows of the groups after `index` in order while `budget` (ps; None: no
        limit) lasts, up to group `upto` (None: as far as blocks can be placed)."""
        last = len(self.groups) - 1 if upto is None else min(upto, len(self.groups) - 1)
        group = index + 1
        while group <= last and (budget is None or budget > 0):
            if group not in self.rows:
                placed = self._place(group, index) if group >= self.next else "skip"
                if placed == "full":
                    return
                if placed == "skip":
                    group += 1
                    continue
            spent = self._load_rows(group, budget)
            if budget is not None:
                budget -= spent
            if self.rows[group] < self._k(group):
                return
            group += 1

    def _place(self, index: int, now: int) -> str:
        """Give group `index` a block while group `now` computes ("placed") when it is eligible
        and this core computes a part of it ("skip" otherwise) and a place is free ("full")."""
        part = self.parts_of(index)[self.core] if self.eligible(self.groups[index]) else None
        em = _emitter(self.ctx, self.groups[index], index, part) if part is not None else None
        if em is None or em.ctx.residency.splits.get(em.result):
            self.next = index + 1
            return "skip"
        addr = self.ring.where(em.held_bytes())
        if addr is None:
            return "full"
        self.ctx.held[index] = self.ring.take(index, addr, em.held_bytes())
        self.rows[index] = 0
        self.next = index + 1
        return "placed"

    def _k(self, index: int) -> int:
        return matmul_k(self.ctx, self.groups[index])

    def _load_rows(self, index: int, budget: int | None) -> int:
        """Load the next rows of group `index`'s block (whole lane multiples, as many as `budget`
        covers at the DRAM share's rate; all of them with no budget): their ps (_dma_ps)."""
        ctx, lanes = self.ctx, self.ctx.chip.lanes
        part = self.parts_of(index)[self.core]
        em = _emitter(ctx, self.groups[index], index, part)
        lo, hi = em.col_range
        row_ps = (hi - lo) * ctx.prec.bytes / self.gbps * 1e3
        done, k = self.rows[index], em.geom.k
        rows = k - done if budget is None else min(k - done, int(budget / (row_ps * lanes)) * lanes)
        if rows <= 0:
            return 0
        saved = (ctx.group_index, ctx.part, ctx.em.layer)
        ctx.group_index, ctx.part = index, part
        first = len(ctx.em.records)
        try:
            em.fetch_held(done, rows)
        finally:
            ctx.group_index, ctx.part, ctx.em.layer = saved
        self.rows[index] = done + rows
        if done + rows == k:
            ctx.held[index].loaded = True
        return self._dma_ps(ctx.em.records[first:])

    def _tiu_ps(self, span) -> int:
        from tpuflow.hwmodel.timing.cost import instruction_ps
        return sum(instruction_ps(r.instr, self.ctx.chip) for r in span if r.engine == Engine.TIU)

    def _dma_ps(self, span) -> int:
        """The span's GDMA time in the cost model, stretched by this core's share of the DRAM bandwidth."""
        from tpuflow.hwmodel.timing.cost import instruction_ps
        chip = self.ctx.chip
        share = chip.ddr_peak_bytes_per_second / 1e9 / self.gbps
        return int(sum(instruction_ps(r.instr, chip) for r in span if r.engine == Engine.GDMA) * share)


def matmul_k(ctx: LowerCtx, group: Group) -> int:
    from tpuflow.lowering.ops.matmul import matmul_geometry
    return matmul_geometry(ctx, group.anchor).k


class WeightPrefetch:
    """Every core's weight prefetch (CorePrefetch)."""

    def __init__(self, ctxs: list[LowerCtx], groups: list[Group], parts_of, eligible):
        self.cores = [CorePrefetch(ctx, k, groups, parts_of, eligible, len(ctxs)) for k, ctx in enumerate(ctxs)]

    def after(self, index: int, starts: list[int]) -> None:
        """Group `index` was emitted on every core (core k's records from starts[k])."""
        for core, start in zip(self.cores, starts):
            core.after(index, start)


def _after_last_load(span, chip) -> int:
    """The position after the last GDMA load into LMEM among `span` (0 when there is none)."""
    for i in range(len(span) - 1, -1, -1):
        r = span[i]
        if r.engine == Engine.GDMA and is_lmem(getattr(r.instr, "dst_start_addr", 0) or 0, chip) \
                and not is_lmem(getattr(r.instr, "src_start_addr", 0) or 0, chip):
            return i + 1
    return 0


def _emitter(ctx: LowerCtx, group: Group, index: int, part):
    """The MM2 emitter of group `index`, part `part`, with a held block (the present one or a placeholder)."""
    from tpuflow.lowering.ops.matmul import MatmulEmitter
    saved = (ctx.group_index, ctx.part)
    placeholder = index not in ctx.held
    if placeholder:
        ctx.held[index] = HeldConstants(0, 0)
    ctx.group_index, ctx.part = index, part
    try:
        return MatmulEmitter(ctx, group)
    finally:
        if placeholder:
            del ctx.held[index]
        ctx.group_index, ctx.part = saved


def prefetchable(graph, group: Group, options, on_vector_unit: bool) -> bool:
    """An MM2 matmul (TIU path) by a constant 2-D B, one product (no batch): its B columns can be
    held in a weight block."""
    if group.kind != "matmul" or options.matmul != "tiu" or on_vector_unit:
        return False
    node = group.anchor
    b = graph.tensor(node.inputs[1])
    if not b.is_const or len(b.shape) != 2 or node.attr("b_perm") is not None:
        return False
    a = graph.tensor(node.inputs[0]).shape
    return len(a) >= 2 and all(d == 1 for d in a[:-2])
