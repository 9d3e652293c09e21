"""lower(): Graph -> Program. Fusion, DDR plan, per-group emission, dependency ids."""

from __future__ import annotations

from dataclasses import replace

from tpuflow.chip import ChipConfig
from tpuflow.errors import GroupDoesNotFit, LoweringError
from tpuflow.frontend.graph import Graph
from tpuflow.frontend.stats import graph_stats, layer_stats
from tpuflow.isa import Engine, Prec, SysDma, SysTiu
from tpuflow.isa.messages import barrier, barrier_id
from tpuflow.lowering.context import WHOLE, HeldConstants, LowerCtx
from tpuflow.lowering.cores import (BAND_LMEM_SHARES, CELL_BYTES, CrossCoreHazards, band_regions, core_parts,
                                     crossing_tensors, ddr_cells, span_tensors)
from tpuflow.lowering.slicing import chunk
from tpuflow.lowering.ddrplan import plan_ddr
from tpuflow.lowering.deps import assign_dependencies
from tpuflow.lowering.emitter import Emitter
from tpuflow.lowering.emitplan import NoBuffersPlan, choose_plan, emission_for, no_buffers
from tpuflow.lowering.groups import Group, form_groups
from tpuflow.lowering.lmem import align_up
from tpuflow.lowering.layergroup import RESIDENT_SHARE, RESIDENT_SHARE_FALLBACKS, ResidencyPlan, split_ports
from tpuflow.lowering.residency import plan_residency
from tpuflow.lowering.mathops import CONST_REGION_BYTES, const_region_image
from tpuflow.lowering.ops.concat_lmem import ConcatLmemEmitter, concat_ports, uses_lmem
from tpuflow.lowering.ops.conv import ConvEmitter
from tpuflow.lowering.ops.deconv import DeconvEmitter
from tpuflow.lowering.ops.gemv import GemvEmitter, is_gemv
from tpuflow.lowering.ops.lrn import LrnEmitter
from tpuflow.lowering.ops.matmul import MatmulEmitter
from tpuflow.lowering.ops.movement import MoveEmitter, ViewEmitter
from tpuflow.lowering.ops.pool import PoolEmitter
from tpuflow.lowering.ops.resize_lmem import ResizeLmemEmitter, is_lmem_resize, resize_ports
from tpuflow.lowering.ops.rowgroup import RowGroupEmitter
from tpuflow.lowering.ops.tilemm import tile_pool_fusion
from tpuflow.lowering.prepare import (fold_matmul_transposes, fold_reduction_scales, materialize_broadcasts,
                                      merge_duplicates)
from tpuflow.lowering.quant import QuantChain, chain_reserve, is_quantized, quantized_groups
from tpuflow.lowering.ops.quant_ops import quant_emitter
from tpuflow.lowering.tensors import make_tile
from tpuflow.lowering.ewise import ROW_REDUCE
from tpuflow.lowering.long_rows import split_long_rows
from tpuflow.lowering.tensor_parallel import head_aligned_cores, split_mlp_pairs
from tpuflow.lowering.timesteps import pipelined_order
from tpuflow.lowering.weight_prefetch import WeightPrefetch, prefetchable

from tpuflow.lowering.weights import WeightImage
from tpuflow.options import CompileOptions
from tpuflow.program import CoreStreams, DdrTensor, MemoryPlan, Program

def tiu_matmul_emitter(ctx: LowerCtx, group: Group):
    """A MatMul group on the TIU: a matrix-vector product on the vector unit when it is one, else MM2."""
    return (GemvEmitter if is_gemv(ctx, group) else MatmulEmitter)(ctx, group)


def _tiu_matmul_ports(graph: Graph, group: Group, chip: ChipConfig) -> tuple[set[str], set[str]]:
    """MM2 groups keep activations in LMEM; single-row products (the GEMV path) use DDR."""
    a = graph.tensor(group.anchor.inputs[0]).shape
    if len(a) < 2 or (group.anchor.attr("a_perm") is None and a[-2] == 1):
        return {}, {}
    return MatmulEmitter.resident_ports(graph, group, chip)


tiu_matmul_emitter.resident_ports = _tiu_matmul_ports


class LmemViewEmitter:
    """A Reshape whose input and output are one LMEM buffer, or a Split its producer wrote in
    place (layer groups): nothing to emit."""

    def __init__(self, ctx: LowerCtx, group: Group):
        self.ctx, self.group = ctx, group

    def plan(self, region: str) -> NoBuffersPlan:
        return no_buffers(self.ctx, region)

    def emit(self, plan: NoBuffersPlan) -> None:
        self.ctx.note_layer(self.group.anchor.name, self.group.anchor.op_type, group=self.group.name)


def view_emitter(ctx: LowerCtx, group: Group):
    if ctx.resident(group.anchor.outputs[0]) is not None:
        return LmemViewEmitter(ctx, group)
    return ViewEmitter(ctx, group)


def move_emitter(ctx: LowerCtx, group: Group):
    """Data movement in DDR, a channel Concat into an LMEM-resident output, a nearest upsampling
    in a layer group (reading or writing LMEM, or run sliced), or a column Split whose outputs
    its producer wrote in place (layer groups: nothing to move)."""
    if group.anchor.op_type == "Concat" and uses_lmem(ctx, group):
        return ConcatLmemEmitter(ctx, group)
    if group.anchor.op_type == "Split" and group.anchor.inputs[0] in ctx.residency.splits:
        return LmemViewEmitter(ctx, group)
    if is_lmem_resize(ctx.graph, group) and (ctx.part.rows is not None or any(
            ctx.resident(t) is not None for t in (group.anchor.inputs[0], group.anchor.outputs[0]))):
        return ResizeLmemEmitter(ctx, group)
    return MoveEmitter(ctx, group)


def _move_ports(graph: Graph, group: Group, chip: ChipConfig) -> tuple[dict[str, str], dict[str, str]]:
    if group.anchor.op_type == "Split":
        return split_ports(graph, group)
    if group.anchor.op_type == "Resize":
        return resize_ports(graph, group, chip)
    return concat_ports(graph, group, chip)


move_emitter.resident_ports = _move_ports


TIU_EMITTERS = {"row": RowGroupEmitter, "conv": ConvEmitter, "deconv": DeconvEmitter, "matmul": tiu_matmul_emitter,
                "pool": PoolEmitter, "lrn": LrnEmitter, "move": move_emitter, "view": view_emitter, "quant": quant_emitter}


def emitter_for(group: Group, options: CompileOptions):
    if options.matmul == "tile" and group.kind in ("matmul", "conv"):
        from tpuflow.lowering.ops.tilemm import TILE_EMITTERS
        return TILE_EMITTERS[group.kind]
    return TIU_EMITTERS[group.kind]


def scratch_bytes(graph: Graph, groups: list[Group], options: CompileOptions) -> int:
    need = 0
    for g in groups:
        cls = emitter_for(g, options)
        if hasattr(cls, "scratch_bytes"):
            need = max(need, cls.scratch_bytes(graph, g, options))
    return need


def resident_ports(graph: Graph, group: Group, chip: ChipConfig,
                   options: CompileOptions) -> tuple[dict[str, str], dict[str, str]]:
    """({activation: layout} the group's emitter can read from LMEM, those it can write there)."""
    ports = getattr(emitter_for(group, options), "resident_ports", None)
    return ports(graph, group, chip) if ports is not None else ({}, {})


def plan_layer_groups(graph: Graph, groups: list[Group], chip: ChipConfig, options: CompileOptions,
                      share: float = RESIDENT_SHARE, crossing: frozenset = frozenset(),
                      gathered: frozenset = frozenset(), bands: list | None = None) -> ResidencyPlan | None:
    """The residency plan; its sliced spans are chosen by the layer-group search on estimated
    times (`_members_cost`), and kept when the groups whose emission they can change (first to
    last, `_differing_span`) run faster with them than without. Several cores: whole tensors
    only, none of `crossing` (activations a core reads from another core's part) but those
    `gathered` (every core loads them whole from DDR once, as graph inputs are preloaded); with
    `bands` (lowering.cores.band_regions) those spans run in bands over the cores (None when
    their slice buffers do not fit)."""
    if options.layer_group == "off" or share <= 0:
        return ResidencyPlan()
    if options.cores > 1:
        plan = plan_residency(graph, groups, chip, Prec.from_name(options.dtype), CONST_REGION_BYTES,
                              lambda g: _local_ports(resident_ports(graph, g, chip, options), crossing, gathered),
                              None, share, gathered=gathered, regions=bands)
        if plan is not None:
            plan.gathered = frozenset(t for t in gathered if t in plan.tensors)
        return plan

    reserve = chain_reserve(graph, groups, chip)

    def plan(span_cost) -> ResidencyPlan:
        return plan_residency(graph, groups, chip, Prec.from_name(options.dtype), CONST_REGION_BYTES,
                              lambda g: resident_ports(graph, g, chip, options), span_cost, share,
                              matrix_slicing=options.matmul == "tiu", reserve=reserve)

    def cost(residency: ResidencyPlan, members: tuple[int, ...]) -> int:
        return _members_cost(graph, groups, chip, options, residency, members)

    searched = plan(cost)
    if not searched.regions:
        return searched
    whole = plan(None)          # spans are costed locally: keep them only if the program agrees
    span = _differing_span(graph, groups, searched, whole)
    return searched if cost(searched, span) < cost(whole, span) else whole


def _local_ports(ports: tuple[dict[str, str], dict[str, str]], crossing: frozenset, gathered: frozenset):
    """A group's LMEM ports without the activations that cross cores (they meet in DDR; those
    gathered are read from LMEM after every core loaded them whole)."""
    readable, writable = ports
    return ({t: v for t, v in readable.items() if t not in crossing or t in gathered},
            {t: v for t, v in writable.items() if t not in crossing})


def _differing_span(graph: Graph, groups: list[Group], a: ResidencyPlan, b: ResidencyPlan) -> tuple[int, ...]:
    """The groups from the first to the last that makes or reads a tensor the two plans keep
    differently (in LMEM or not, or at another address), or runs sliced in either: every group
    whose emission can differ, and those between them (their timing interacts)."""
    differ = {t for t in set(a.tensors) | set(b.tensors)
              if t not in a.tensors or t not in b.tensors
              or (a.tensors[t].addr, a.tensors[t].size) != (b.tensors[t].addr, b.tensors[t].size)}
    touched = {i for i, g in enumerate(groups)
               if differ & ({t for n in g.nodes for t in n.inputs} | g.produced())}
    touched |= {m for r in a.regions + b.regions for m in r.members}
    return tuple(range(min(touched), max(touched) + 1))


def _members_cost(graph: Graph, groups: list[Group], chip: ChipConfig, options: CompileOptions,
                  residency: ResidencyPlan, members: tuple[int, ...]) -> int:
    """Estimated time (ps) of the groups `members` (ascending; a sliced region among them whole)
    under `residency`: their instructions emitted alone, with their dependencies, run in emission
    order on the timing model (hwmodel.timing: the per-instruction costs of hwmodel.timing.cost,
    with the memory system; list-scheduling each candidate too tripled planning time and changed
    no decision on the sliced real models)."""
    ddr = plan_ddr(graph, groups, chip, options.dtype, scratch_bytes(graph, groups, options),
                   in_lmem=set(residency.tensors), rerun=[(r.first, r.last) for r in residency.regions])
    em = Emitter(chip)
    ctx = LowerCtx(graph, chip, options, em, ddr, WeightImage(ddr.weight_base), residency=residency)
    done: set[int] = set()
    try:
        for m in members:
            region = residency.region_at(m)
            if region is not None and set(region.members) <= set(members):
                _emit_sliced(ctx, groups, region, options)
                done |= set(region.members)
            elif m not in done:
                ctx.group_index = m
                _emit_group(ctx, groups[m], options)
    except LoweringError:
        return INFEASIBLE_PS
    return _alone_ps(em, chip, options)


INFEASIBLE_PS = 1 << 62          # the cost of groups that cannot be emitted under a plan


def lower(source: Graph, chip: ChipConfig, options: CompileOptions) -> Program:
    """The program of `source`: layer groups at the resident share of LMEM, or at the next
    smaller share when some group does not fit the working area the residents leave it.
    Several cores: the program split over all of them, over as many as split the attention heads
    evenly (lowering.tensor_parallel.head_aligned_cores), over half of them or on core 0 alone
    (the others idle), whichever runs fastest on the timing model (a split's parts meet in DDR:
    small models, and layers whose exchange grows with the core count, can run faster on fewer)."""
    if options.cores == 1:
        return lower_split(source, chip, options)
    from tpuflow.hwmodel.timing import simulate
    used = [options.cores] + head_aligned_cores(source, options.cores) + \
        ([options.cores // 2] if options.cores // 2 > 1 else []) + [1]
    best, best_ps = None, 0
    for n in used:              # one candidate held beside the best (bert_base at 8 cores: four lowerings)
        program = _widened(lower_split(source, chip, replace(options, cores=n)), options, chip)
        ps = simulate(program).total_ps
        if best is None or ps < best_ps:
            best, best_ps = program, ps
    return best


def _widened(program: Program, options: CompileOptions, chip: ChipConfig) -> Program:
    """A program over fewer cores than `options.cores` as one over all of them, the rest idle."""
    used = program.core_count
    if used == options.cores:
        return program
    split = program.core_split or [{"core": 0, "groups": {name: {} for name in program.layers}}]
    idle = _finish_core(Emitter(chip), chip, options)
    program = Program.from_cores(program, program.cores + [idle] * (options.cores - used),
                                 split + [{"core": k, "groups": {}} for k in range(used, options.cores)])
    program.options = {k: str(v) for k, v in options.as_dict().items()}
    return program


def lower_split(source: Graph, chip: ChipConfig, options: CompileOptions) -> Program:
    """The program split over `options.cores` (lowering.cores, lowering.tensor_parallel), faster
    or not than one core (lower() chooses); a softmax whose rows fit no LMEM region is decomposed
    into column-chunked pieces (lowering.long_rows) and the lowering retried."""
    ends: frozenset[str] = frozenset()
    while True:
        try:
            return _lower_split_once(source, chip, options, ends)
        except GroupDoesNotFit as err:
            source, ends = _refit_long_rows(source, err, ends)


def _refit_long_rows(source: Graph, err: GroupDoesNotFit, ends: frozenset[str]) -> tuple[Graph, frozenset[str]]:
    """After a row group that fits nowhere: end row groups at its reductions that are not its last
    node (each then runs in column chunks), else decompose its Softmax / LogSoftmax; re-raise
    when neither applies."""
    inner = [n for n in err.nodes[:-1] if source.nx.has_node(n) and source.node(n).op_type in ROW_REDUCE]
    if inner and not set(inner) <= ends:
        return source, ends | set(inner)
    decomposed = split_long_rows(source, [n for n in err.nodes if source.nx.has_node(n)])
    if decomposed is None:
        raise err
    return decomposed, ends


def _lower_split_once(source: Graph, chip: ChipConfig, options: CompileOptions,
                      ends: frozenset[str] = frozenset()) -> Program:
    graph = materialize_broadcasts(fold_matmul_transposes(fold_reduction_scales(merge_duplicates(source))))
    pins: dict[str, int] = {}
    if options.cores > 1 and options.matmul == "tiu" and not any(is_quantized(graph, n) for n in graph.nodes()):
        graph, pins = split_mlp_pairs(graph, options.cores, chip.lanes)     # float pairs (int8: its groups split)
    formed = form_groups(graph, fuse_pool=tile_pool_fusion(graph, chip, options, ends), lanes=chip.lanes, ends=ends)
    groups = quantized_groups(graph, formed, chip)
    crossing, gathered = _crossing_tensors(graph, groups, chip, options, pins) if options.cores > 1 else ((), ())
    program = _lower_shares(source, graph, groups, chip, options, pins, crossing, gathered)
    if options.cores == 1:
        return _with_slices_first(program, groups, source, graph, formed, chip, options)
    variants = {"split": program, **_banded(source, graph, groups, chip, options, pins, crossing, gathered, ""),
                "core0_but_gemv": _lower_core0_but_gemv(source, graph, groups, chip, options, pins)}
    if any(isinstance(g, QuantChain) for g in groups):      # int8: chains run whole on core 0
        variants.update(_unchained_variants(source, graph, quantized_groups(graph, formed), chip, options, pins))
    return _fastest({name: p for name, p in variants.items() if p is not None})


def _banded(source: Graph, graph: Graph, groups: list[Group], chip: ChipConfig, options: CompileOptions,
            pins: dict[str, int], crossing, gathered, prefix: str) -> dict[str, Program | None]:
    """The programs of `groups` with spans in bands by either rule (_lower_banded), named `prefix`bands
    and `prefix`bands_lenient."""
    return {f"{prefix}bands": _lower_banded(source, graph, groups, chip, options, pins, crossing, gathered),
            f"{prefix}bands_lenient": _lower_banded(source, graph, groups, chip, options, pins, crossing, gathered,
                                                    True)}


def _unchained_variants(source: Graph, graph: Graph, groups: list[Group], chip: ChipConfig, options: CompileOptions,
                        pins: dict[str, int]) -> dict[str, Program | None]:
    """Several cores: the programs of an int8 program's `groups` without lowering.quant.QuantChain (a
    chain runs whole on core 0, its members alone split over the cores), split group by group
    (unchained_split) and in bands (_banded)."""
    crossing, gathered = _crossing_tensors(graph, groups, chip, options, pins)
    try:
        split = _lower_shares(source, graph, groups, chip, options, pins, crossing, gathered)
    except LoweringError:
        split = None
    return {"unchained_split": split, **_banded(source, graph, groups, chip, options, pins, crossing, gathered,
                                                "unchained_")}


def _with_slices_first(program: Program, chained: list[Group], source: Graph, graph: Graph, formed: list[Group],
                       chip: ChipConfig, options: CompileOptions) -> Program:
    """An int8 program `program` of groups `chained` (with lowering.quant.QuantChain) against the one whose groups a
    sliced run can take stay alone (their tensors kept by the layer groups, whole or in row slices):
    whichever runs faster on the timing model (chains hold a Concat's inputs in place and pass
    tensors between members without the residency planner; slices keep every tensor of a row band
    in LMEM where a whole tensor fills the chain's share: sg2260 --dtype int8 densenet121 858 us
    with chains, 1202 without; PP-OCRv4 det at 640 x 640 4087 with, 3107 without)."""
    groups = quantized_groups(graph, formed, chip, slices_first=True)
    if groups == chained:
        return program
    try:
        other = _lower_shares(source, graph, groups, chip, options, {}, (), ())
    except LoweringError:
        return program
    return _fastest({"chains": program, "slices_first": other})


def _lower_shares(source: Graph, graph: Graph, groups: list[Group], chip: ChipConfig, options: CompileOptions,
                  pins: dict[str, int], crossing, gathered) -> Program:
    """The program at the resident share of LMEM, or the next smaller share when a group does not
    fit the working area the residents leave it."""
    for share in RESIDENT_SHARE_FALLBACKS:
        residency = plan_layer_groups(graph, groups, chip, options, share, frozenset(crossing), frozenset(gathered))
        try:
            return _lower_planned(source, graph, groups, chip, options, residency, pins)
        except LoweringError:
            if not residency.tensors:
                raise
    raise AssertionError("unreachable: the last share keeps nothing resident")


def _fastest(variants: dict[str, Program]) -> Program:
    """The variant that runs fastest on the timing model (the first of equals): every group split
    over the cores, spans in bands by either rule (_lower_banded), or core 0 but for matrix-vector products
    (_lower_core0_but_gemv)."""
    from tpuflow.hwmodel.timing import simulate
    times = {name: simulate(p).total_ps for name, p in variants.items()}
    return variants[min(times, key=lambda name: (times[name], list(variants).index(name)))]


def _lower_core0_but_gemv(source: Graph, graph: Graph, groups: list[Group], chip: ChipConfig,
                          options: CompileOptions, pins: dict[str, int]) -> Program | None:
    """Several cores: every group on core 0, its activations in its LMEM as on one core, but the
    matrix-vector products (a classifier's weights: all DMA, no reuse) split by columns over the
    cores; None when there is none (MobileNetV2 fp16 on 8 cores: its 2.5 MB classifier takes 70
    of its 239 us on one core)."""
    probe = LowerCtx(graph, chip, options, Emitter(chip), None, None)
    vector = {g.anchor.name for g in groups if _on_vector_unit(probe, g)}
    if options.matmul != "tiu" or not vector or len(vector) == len(groups):
        return None
    pinned = {**{g.anchor.name: 0 for g in groups if g.anchor.name not in vector}, **pins}
    crossing, gathered = _crossing_tensors(graph, groups, chip, options, pinned)
    return _lower_shares(source, graph, groups, chip, options, pinned, crossing, gathered)


def _lower_banded(source: Graph, graph: Graph, groups: list[Group], chip: ChipConfig, options: CompileOptions,
                  pins: dict[str, int], crossing, gathered, lenient: bool = False) -> Program | None:
    """Several cores: the program with spans of sliceable groups run in bands over the cores
    (lowering.cores.band_regions; the tensors crossing a span's edge meet in DDR, those inside
    stay in each core's LMEM), at the resident share of LMEM; None when there are no such spans
    or they do not fit (lowering keeps it when it runs faster than the program without them)."""
    if options.cores == 1 or options.matmul != "tiu" or options.layer_group == "off":
        return None
    for share in BAND_LMEM_SHARES:
        budget = None if share is None else share * chip.lmem_bytes_per_lane
        bands = band_regions(graph, groups, options.cores, chip.lanes, budget, Prec.from_name(options.dtype).bytes,
                             lenient)
        if not bands:
            return None
        residency = _band_residency(graph, groups, chip, options, bands, crossing, gathered)
        if residency is not None:
            break
    else:
        return None
    try:
        return _lower_planned(source, graph, groups, chip, options, residency, pins)
    except LoweringError:
        return None


def _band_residency(graph: Graph, groups: list[Group], chip: ChipConfig, options: CompileOptions, bands: list,
                    crossing, gathered) -> ResidencyPlan | None:
    """The residency plan with `bands` run in bands over the cores: what crosses a span's edge
    meets in DDR, what stays inside is a slice buffer (None when they do not fit)."""
    inside, edges, made = set(), set(), set()
    for region in bands:
        i, e = span_tensors(graph, groups, region.members)
        inside, edges = inside | i, edges | e
        made |= {t for m in region.members for t in groups[m].produced()}
    crossing = (set(crossing) - inside) | edges
    gathered = set(gathered) - made          # a gathered tensor is loaded before the span that makes it runs
    return plan_layer_groups(graph, groups, chip, options, RESIDENT_SHARE, frozenset(crossing),
                             frozenset(gathered), bands)


def _lower_planned(source: Graph, graph: Graph, groups: list[Group], chip: ChipConfig, options: CompileOptions,
                   residency: ResidencyPlan, pins: dict[str, int] | None = None) -> Program:
    ddr = plan_ddr(graph, groups, chip, options.dtype, scratch_bytes(graph, groups, options),
                   in_lmem=set(residency.tensors) - residency.gathered, rerun=[(r.first, r.last) for r in residency.regions])
    weights = WeightImage(ddr.weight_base)
    make_ctx = lambda: LowerCtx(graph, chip, options, Emitter(chip), ddr, weights, residency=residency)  # noqa: E731
    if options.cores > 1:
        ctxs, split, _ = _emit_over_cores(make_ctx, groups, options, ddr.weight_base, pins or {})
    else:
        ctxs, split = [_emit_one_core(make_ctx(), groups, options)], []
    streams = [_finish_core(ctx.em, chip, options) for ctx in ctxs]
    image = weights.image()
    tensors = dict(ddr.tensors)
    tensors["__weights__"] = DdrTensor("__weights__", weights.base, (len(image),), "uint8", "weight", len(image))
    memory = MemoryPlan(tensors=tensors, weight_base=weights.base, weight_image=image,
                        ddr_bytes_used=weights.base + len(image))
    fused = [tuple(n.name for n in g.nodes) for g in groups if len(g.nodes) > 1]
    stats = graph_stats(source, layer_stats(source, options.dtype), options.dtype)
    first = streams[0]
    program = Program(chip=chip, tiu=first.tiu, gdma=first.gdma, tile=first.tile, tiu_layers=first.tiu_layers,
                      gdma_layers=first.gdma_layers, tile_layers=first.tile_layers, memory=memory,
                      layers=ctxs[0].layers, fused_groups=fused,
                      layer_groups=[lg.as_dict() for lg in residency.layer_groups(groups)],
                      compulsory_ddr_bytes=stats.compulsory_bytes,
                      options={k: str(v) for k, v in options.as_dict().items()},
                      model_name=graph.name, issue_order=first.issue_order,
                      held_tensors=dict(ctxs[0].held_tensors) if len(ctxs) == 1 else {})
    return Program.from_cores(program, streams, split) if len(streams) > 1 else program


def _emit_one_core(ctx: LowerCtx, groups: list[Group], options: CompileOptions) -> LowerCtx:
    """Every group in order on one core: sliced runs slice by slice, resident inputs preloaded."""
    residency = ctx.residency
    _prologue(ctx)
    index, loaded = 0, set()
    while index < len(groups):
        region = residency.region_at(index)
        _emit_preloads(ctx, groups, region.last if region is not None else index, loaded)
        if region is not None:
            _emit_sliced(ctx, groups, region, options, compare=True)
            index = region.last + 1
            continue
        ctx.group_index = index
        _emit_group(ctx, groups[index], options)
        index += 1
    return ctx


def _emit_over_cores(make_ctx, groups: list[Group], options: CompileOptions, ddr_limit: int,
                     pins: dict[str, int], barriers: bool = True) -> tuple[list[LowerCtx], list[dict], list[list[tuple[int, int]]]]:
    """Every group split over the cores (lowering.cores: each core emits its part; activations
    resident in LMEM stay where their core's part made them), with a chip-wide barrier before a
    group only where one core touches DDR that another core wrote, or writes DDR another core
    read, since the last barrier (lowering.cores.CrossCoreHazards; none with `barriers` off); a
    sliced region of the residency plan runs in bands over the cores (_emit_band_over_cores);
    (the cores' contexts, the manifest's record of the split: per core, each group's part,
    per group and core the [start, end) of its records)."""
    ctxs = [make_ctx() for _ in range(options.cores)]
    split = [{"core": k, "groups": {}} for k in range(options.cores)]
    for ctx in ctxs:
        _prologue(ctx)
    graph, chip = ctxs[0].graph, ctxs[0].chip
    hazards = CrossCoreHazards(ddr_limit) if barriers else None
    loaded: list[set[str]] = [set() for _ in ctxs]
    spans, count = [], 0

    def parts_of(index: int) -> list:
        return core_parts(graph, groups[index], options.cores, options, _on_vector_unit(ctxs[0], groups[index]),
                          pins.get(groups[index].anchor.name), chip)
    prefetch = _weight_prefetch(ctxs, groups, options, parts_of) if barriers else None
    for index, group in enumerate(groups):
        band = ctxs[0].residency.region_at(index)
        starts = [len(ctx.em.records) for ctx in ctxs]
        if band is not None or ctxs[0].residency.in_region(index):
            if band is not None:
                _emit_band_over_cores(ctxs, groups, band, options, split, loaded)
                if hazards is not None and _needs_barrier(hazards, ctxs, starts, chip, ddr_limit):
                    for ctx, start in zip(ctxs, starts):
                        _insert_barrier(ctx, start, options.cores, count)
                    count += 1
            spans.append([(start, len(ctx.em.records)) for ctx, start in zip(ctxs, starts)])
            continue
        parts = parts_of(index)
        for ctx, part, record, done in zip(ctxs, parts, split, loaded):
            _emit_preloads(ctx, groups, index, done)
            if part is None:
                continue
            record["groups"][group.name] = part.as_dict()
            ctx.group_index = index
            ctx.part = part
            _emit_group(ctx, group, options)
            ctx.part = WHOLE
        if hazards is not None and _needs_barrier(hazards, ctxs, starts, chip, ddr_limit):
            for ctx, start in zip(ctxs, starts):
                _insert_barrier(ctx, start, options.cores, count)
            count += 1
        if prefetch is not None:
            prefetch.after(index, starts)
        spans.append([(start, len(ctx.em.records)) for ctx, start in zip(ctxs, starts)])
    return ctxs, split, spans


def _emit_band_over_cores(ctxs: list[LowerCtx], groups: list[Group], region, options: CompileOptions,
                          split: list[dict], loaded: list[set[str]]) -> None:
    """A span run in bands over the cores (lowering.cores.band_regions): core k runs its block of
    the region's slices (one band per core), every member on the rows that band needs, the
    activations inside in its LMEM slice buffers."""
    cores = len(ctxs)
    for k, (ctx, record, done) in enumerate(zip(ctxs, split, loaded)):
        _emit_preloads(ctx, groups, region.last, done)
        start, slice_of = len(ctx.em.records), []
        for s in range(*chunk(region.slices, cores, k)):
            ctx.residency.enter_slice(region, s)
            for m in region.members:
                part = region.part(m, s)
                if part.rows[1] <= part.rows[0]:
                    continue
                record["groups"][groups[m].name] = part.as_dict()
                ctx.group_index, ctx.part = m, part
                _emit_group(ctx, groups[m], options)
            slice_of += [s] * (len(ctx.em.records) - start - len(slice_of))
        ctx.part = WHOLE
        emitted = ctx.em.records[start:]
        ctx.em.records[start:] = [emitted[i] for i in pipelined_order(emitted, slice_of, ctx.chip)]


def _weight_prefetch(ctxs: list[LowerCtx], groups: list[Group], options: CompileOptions, parts_of) -> WeightPrefetch:
    """Every core's weight ring (lowering.weight_prefetch)."""
    graph = ctxs[0].graph
    return WeightPrefetch(ctxs, groups, parts_of, lambda g: prefetchable(graph, g, options, _on_vector_unit(ctxs[0], g)))


def _needs_barrier(hazards: CrossCoreHazards, ctxs: list[LowerCtx], starts: list[int], chip: ChipConfig,
                   ddr_limit: int) -> bool:
    """Whether the group just emitted (each core's records from its start) conflicts with DDR
    accesses of other cores since the last barrier; its accesses are then recorded."""
    cells = [ddr_cells(ctx.em.records[start:], chip, ddr_limit) for ctx, start in zip(ctxs, starts)]
    conflict = any(hazards.conflicts(k, reads, writes) for k, (reads, writes) in enumerate(cells))
    if conflict:
        hazards.barrier()
    for k, (reads, writes) in enumerate(cells):
        hazards.record(k, reads, writes)
    return conflict


def _insert_barrier(ctx: LowerCtx, at: int, cores: int, index: int) -> None:
    """A chip-wide barrier before the records from `at` on."""
    after, layer = ctx.em.records[at:], ctx.em.layer
    del ctx.em.records[at:]
    _emit_barrier(ctx, cores, index)
    ctx.em.records.extend(after)
    ctx.em.layer = layer


def _crossing_tensors(graph: Graph, groups: list[Group], chip: ChipConfig, options: CompileOptions,
                      pins: dict[str, int]) -> tuple[set[str], set[str]]:
    """The activations some core reads from another core's part (or from a core that made all of
    it), found on the program that keeps every activation in DDR: they cannot stay in one core's
    LMEM. With a view or Concat sharing their DDR buffer, the whole family crosses. And those
    every core reads more of than their size, outside such families (lowering.cores)."""
    if options.layer_group == "off":
        return set(), set()
    ddr = plan_ddr(graph, groups, chip, options.dtype, scratch_bytes(graph, groups, options))
    make_ctx = lambda: LowerCtx(graph, chip, options, Emitter(chip), ddr, WeightImage(ddr.weight_base))  # noqa: E731
    ctxs, _, spans = _emit_over_cores(make_ctx, groups, options, ddr.weight_base, pins, barriers=False)
    per_group = [[ddr_cells(ctx.em.records[a:b], chip, ddr.weight_base) for ctx, (a, b) in zip(ctxs, span)]
                 for span in spans]
    reads = [[t for t in dict.fromkeys(x for n in g.nodes for x in n.inputs) if t in ddr.tensors and t not in g.produced()]
             for g in groups]
    cells_of = {t: (d.addr // CELL_BYTES, -(-(d.addr + d.nbytes) // CELL_BYTES)) for t, d in ddr.tensors.items()}
    crossing, gathered = crossing_tensors(per_group, reads, cells_of, ddr.weight_base)
    return _buffer_families(crossing, groups, ddr), {t for t in gathered if _buffer_families({t}, groups, ddr) == {t}}


def _buffer_families(names: set[str], groups: list[Group], ddr) -> set[str]:
    """`names` with every tensor sharing a DDR buffer with one of them (views, Concat members)."""
    pairs = [(g.anchor.inputs[0], g.anchor.outputs[0]) for g in groups if g.kind == "view"]
    pairs += [(t, root) for t, (root, _) in ddr.concat_members.items()]
    out, grown = set(names), True
    while grown:
        grown = False
        for a, b in pairs:
            if (a in out) != (b in out):
                out |= {a, b}
                grown = True
    return out


def _on_vector_unit(ctx: LowerCtx, group: Group) -> bool:
    return group.kind == "matmul" and is_gemv(ctx, group)


def _emit_barrier(ctx: LowerCtx, cores: int, index: int) -> None:
    ctx.em.layer = "__barrier__"
    engines = barrier(cores, barrier_id(index))
    for instr in engines[Engine.TIU]:
        ctx.em.tiu(instr)
    for instr in engines[Engine.GDMA]:
        ctx.em.gdma(instr)


def _finish_core(em: Emitter, chip: ChipConfig, options: CompileOptions) -> CoreStreams:
    """End markers, dependency ids and the per-engine queues of one core's instructions."""
    em.layer = ""
    em.tiu(SysTiu(op="end"))
    em.gdma(SysDma(op="chain_end"))
    queues, layers, order = assign_dependencies(em.records, chip, options.dep_mode)
    return CoreStreams(queues[0], queues[1], queues[2], layers[0], layers[1], layers[2], order)


def _alone_ps(em: Emitter, chip: ChipConfig, options: CompileOptions) -> int:
    """Estimated time (ps) of an emitter's instructions run alone on the timing model."""
    from tpuflow.hwmodel.timing import simulate
    s = _finish_core(em, chip, options)
    return simulate(Program(chip=chip, tiu=s.tiu, gdma=s.gdma, tile=s.tile, issue_order=s.issue_order)).total_ps


def _records_ps(records, chip: ChipConfig, options: CompileOptions) -> int:
    """_alone_ps of emitted records (a copy: the records themselves are left as they are)."""
    em = Emitter(chip)
    em.records = list(records)
    return _alone_ps(em, chip, options)


def _emit_group(ctx: LowerCtx, group: Group, options: CompileOptions) -> None:
    """Emit a group from the plan its emitter makes for the LMEM ring after the previous group,
    or for all of the working area when it does not fit there (lowering.emitplan): the plan is
    emitted into a fresh trial context, committed when the group emitted whole."""
    emission = emission_for(emitter_for(group, options), ctx, group)
    plan = choose_plan(emission, ctx, group)
    trial = ctx.trial(plan.region)
    emission.emit_into(trial, plan)
    ctx.commit(trial)
    ctx.advance_ring()


def _emit_preloads(ctx: LowerCtx, groups: list[Group], upto: int, loaded: set[str]) -> None:
    """Load graph inputs kept in LMEM (several groups read them) before their first reader."""
    for t in ctx.residency.preloads_due(upto, ctx.graph.inputs):
        if t.name in loaded:
            continue
        ctx.em.layer = groups[t.first].anchor.name
        ctx.em.load(t.tile(ctx.chip), ctx.region(t.name, t.shape))
        loaded.add(t.name)


# Share of a sliced run's working area (per lane) that its members' constants may hold across
# its slices; the rest stays the members' own working area. A compiler policy, not a hardware
# number. Measured (`tpuflow estimate`, sg2260, shares 0 / 0.25 / 0.5 / 0.75; the bundled models
# have no sliced run): PP-OCRv4 det fp16 3558 / 3464 / 3464 / 3464 us, layout_cdla fp16 1844 /
# 1813 / 1813 / 1813, layout_cdla fp32 8586 / 8809 / 8809 / 8809 (+2.6%: smaller working tiles),
# ResNet-50 batch 4 fp16 2828 / 2773 / 2773 / 2773; no share above 0.25 bound on these models.
HELD_SHARE = 0.5


def _emit_sliced(ctx: LowerCtx, groups: list[Group], region, options: CompileOptions,
                 compare: bool = False) -> None:
    """A sliced run of groups: every member once per slice, each on the sample and rows that slice
    needs; members whose constants fit hold them in LMEM across the slices (loaded once), unless
    the members then do not fit their working area or, with `compare`, the run alone is faster on
    the timing model when every slice loads its own (smaller working tiles can cost more than
    the reloads: VGG-19 fp32 28139 vs 29588 us held)."""
    held, floor = _held_constants(ctx, groups, region, options)
    attempts = []
    if held:
        attempt = ctx.trial(ctx.lmem_region)
        attempt.held, attempt.held_floor = held, floor
        try:
            _emit_slices(attempt, groups, region, options)
            attempts.append(attempt)
        except LoweringError:
            pass
    if not attempts or compare:
        plain = ctx.trial(ctx.lmem_region)
        _emit_slices(plain, groups, region, options)
        attempts.append(plain)
    best = min(attempts, key=lambda a: _records_ps(a.em.records, ctx.chip, options)) if len(attempts) > 1 else attempts[0]
    ctx.commit(best)
    ctx.previous = best.previous


def _held_constants(ctx: LowerCtx, groups: list[Group], region,
                    options: CompileOptions) -> tuple[dict[int, HeldConstants], int | None]:
    """Blocks at the top of the run's working area for the constants of the members that can
    hold them, largest first while they fit HELD_SHARE of it: ({member: block}, the blocks' floor)."""
    top = min(ctx.residency.arena_top(m, ctx.chip.tile_window_offset) for m in region.members)
    budget, align = int((top - CONST_REGION_BYTES) * HELD_SHARE), ctx.chip.core.lmem_align_bytes
    ctx.residency.enter_slice(region, 0)
    probe = ctx.trial(ctx.lmem_region)
    wanted = []
    for m in region.members:
        cls = emitter_for(groups[m], options)
        probe.group_index = m
        sizes = cls(probe, groups[m]).held_sizes() if hasattr(cls, "held_sizes") else None
        if sizes:
            wanted.append((sum(align_up(x, align) for x in sizes), m))
    chosen, used = [], 0
    for size, m in sorted(wanted, key=lambda w: (-w[0], w[1])):
        if used + size <= budget:
            chosen.append((m, size))
            used += size
    floor = (top - used) // align * align
    held, addr = {}, floor
    for m, size in sorted(chosen):
        held[m] = HeldConstants(addr, size)
        addr += size
    return held, (floor if held else None)


def _emit_slices(ctx: LowerCtx, groups: list[Group], region, options: CompileOptions) -> None:
    """Every member once per slice; the run's instructions then follow its timestep table
    (lowering.timesteps) where hazards allow."""
    before = {name: info.macs for name, info in ctx.layers.items()}
    start, slice_of = len(ctx.em.records), []
    for s in range(region.slices):
        ctx.residency.enter_slice(region, s)
        for m in region.members:
            ctx.group_index = m
            ctx.part = region.part(m, s)
            _emit_group(ctx, groups[m], options)
            if m in ctx.held:
                ctx.held[m].loaded = True
        slice_of += [s] * (len(ctx.em.records) - start - len(slice_of))
    ctx.part = WHOLE
    emitted = ctx.em.records[start:]
    ctx.em.records[start:] = [emitted[i] for i in pipelined_order(emitted, slice_of, ctx.chip)]
    for name, info in ctx.layers.items():           # the model's MACs, not those of every slice
        info.macs = before.get(name, 0) + (info.macs - before.get(name, 0)) // region.slices


def _prologue(ctx: LowerCtx) -> None:
    """Load the SFU coefficient tables into the constant region of every lane."""
    words = const_region_image()
    addr = ctx.weights.add(("__sfu_tables__",), words, Prec.FP32)
    ctx.em.layer = "__prologue__"
    tile = make_tile(ctx.chip, 0, (1, ctx.chip.lanes, 1, CONST_REGION_BYTES // 4), Prec.FP32, compact=True)
    ctx.em.broadcast_load(tile, addr, Prec.FP32)
