"""The residency planner: which activations stay in LMEM between fused groups, in which layout,
where (first fit over lifetimes, as the DDR plan does over addresses), and which runs of groups
execute slice by slice (lowering/slicing.py) because their activations are too large to stay whole."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from tpuflow.chip import ChipConfig
from tpuflow.frontend.graph import Graph
from tpuflow.isa import Prec
from tpuflow.lowering.groups import Group
from tpuflow.lowering.layergroup import (MATRIX, NCHW, RESIDENT_SHARE, ResidencyPlan, ResidentTensor, is_column_split,
                                         is_lmem_concat, resident_shape)
from tpuflow.lowering.groupsearch import SpanOption, best_selection
from tpuflow.lowering.lmem import align_up
from tpuflow.lowering.opspec import spec
from tpuflow.lowering.slicing import SlicedRegion, candidate_runs, slice_counts, slice_region
from tpuflow.lowering.tensors import make_tile, storage_prec, tile_bytes_per_lane

# Ports: (group) -> ({tensor: layout it can read from LMEM}, {tensor: layout it can write there})
Ports = Callable[[Group], tuple[dict[str, str], dict[str, str]]]


@dataclass
class _Unit:
    """One LMEM allocation: a tensor, or a Concat output with the inputs written in place into
    their channel slices of it (`members`: (tensor, channel offset, first, last))."""

    shape: tuple[int, int, int, int]
    first: int
    last: int
    members: list[tuple[str, int, int, int]]
    sliced: bool = False          # a slice buffer (rows of one slice at a time)
    containers: dict[str, str] = field(default_factory=dict)   # member -> the Concat it is a slice of


SLICE_COUNTS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)     # row bands per sample


@dataclass
class _Inputs:
    graph: Graph
    groups: list[Group]
    chip: ChipConfig
    prec: Prec
    top: int
    budget: int
    producer: dict[str, int]
    consumers: dict[str, tuple[int, ...]]
    eligible: Callable[[str], bool]
    layouts: dict[str, str]                   # tensor -> the layout its producer writes
    aliases: list[tuple[str, str]]            # (Reshape input, output) sharing one LMEM buffer
    preloads: frozenset = frozenset()         # graph inputs loaded into LMEM once for several readers
    splits: dict = field(default_factory=dict)   # MatMul result -> column parts (layergroup.ResidencyPlan.splits)
    reserve: dict = field(default_factory=dict)  # group index -> bytes per lane kept free for it (an int8 chain's held tensors)

    def budget_over(self, first: int, last: int) -> int:
        """The per-lane bytes residents may take while groups first..last run."""
        return self.budget - max((self.reserve.get(i, 0) for i in range(first, last + 1)), default=0)

    def shape_of(self, name: str) -> tuple[int, int, int, int]:
        return resident_shape(self.graph.tensor(name).shape, self.layouts.get(name))

    def prec_of(self, name: str) -> Prec:
        return storage_prec(self.graph.tensors.get(name), self.prec)


def _strides_fit(graph: Graph, chip: ChipConfig, name: str, shape, prec: Prec) -> bool:
    """Whether `name` kept in LMEM in `shape` (at its storage precision) can name its group stride."""
    return ResidentTensor(name, shape, storage_prec(graph.tensor(name), prec), 0, 0, 0, 0).strides_fit(chip)


# Span cost: (plan, members) -> estimated time (ps) of emitting `members` under `plan`
SpanCost = Callable[[ResidencyPlan, tuple[int, ...]], int]

MAX_SPAN_CLUSTERS = 4      # search width: a sliced span covers at most this many clusters of held tensors
CONTEXT = 1                # groups either side of a span costed with it (their loads and stores overlap it)
SPAN_EXTENSIONS = 2        # a span also runs on through the readers of what it makes, this many times
SLICE_COUNT_CHOICES = 2    # slice counts tried per span: the fewest that fit, and the next ones


def plan_residency(graph: Graph, groups: list[Group], chip: ChipConfig, prec: Prec, lo: int,
                   ports: Callable[[Group], tuple[set[str], set[str]]], span_cost: SpanCost | None,
                   share: float = RESIDENT_SHARE, matrix_slicing: bool = False,
                   gathered: frozenset = frozenset(), regions: list[SlicedRegion] | None = None,
                   reserve: dict[int, int] | None = None) -> ResidencyPlan | None:
    """Choose the activations that stay in LMEM. A tensor qualifies when its producer can write it
    to LMEM and every consumer can read it there (`ports(group)` -> (readable, writable)), it has
    a resident layout, it is neither a graph input nor output, and it fits the resident share of
    LMEM (`share` of it) for its whole lifetime (first fit over offsets, as the DDR plan does over
    addresses).
    A channel Concat's inputs whose slice starts on lane 0 live inside the Concat's buffer; a
    row-wise group's output overwrites an input dying there when the two would not fit apart.
    Tensors too large to stay whole are held as row slices where a span of a run of sliceable
    groups around them runs slice by slice (lowering.slicing); the spans and their slice counts
    are chosen by the layer-group search (lowering.groupsearch) on `span_cost` (none without one).
    `gathered` activations (several cores) are loaded whole before their first reader like graph
    inputs, when several groups read them in one layout. Given `regions` (several cores:
    lowering.cores.band_regions), those spans run sliced instead of searched ones; None when
    their slice buffers do not fit. `reserve` {group index: bytes per lane}: LMEM the residents
    leave free while that group runs (an int8 chain holds its own tensors there)."""
    top = chip.tile_window_offset // chip.bank_bytes * chip.bank_bytes
    budget = int((top - lo) * share) // chip.bank_bytes * chip.bank_bytes
    producer, consumers = _producers_and_consumers(graph, groups)
    readable, writable = [list(x) for x in zip(*(ports(g) for g in groups))] if groups else ([], [])
    splits = _column_splits(graph, groups, writable, producer)
    for g, group in enumerate(groups):         # a Split whose input is not written in parts moves in DDR
        if is_column_split(graph, group) and group.anchor.inputs[0] not in splits:
            readable[g], writable[g] = {}, {}
    aliases = _view_aliases(graph, groups, readable, writable, producer, consumers)
    in_place = _in_place_pairs(graph, groups, readable, writable, producer, consumers, aliases)
    family = _family_sets(aliases)

    def alone_eligible(name: str) -> bool:
        users = consumers.get(name, ())
        layout = writable[producer[name]].get(name) if name in producer else None
        shape = resident_shape(graph.tensor(name).shape, layout) if layout else None
        return (bool(users) and name not in graph.outputs and shape is not None
                and _strides_fit(graph, chip, name, shape, prec)
                and all(readable[j].get(name) == layout for j in users))

    verdicts: dict[str, bool] = {}

    def eligible(name: str) -> bool:
        if name not in verdicts:
            verdicts[name] = all(alone_eligible(t) for t in family.get(name, {name}))
        return verdicts[name]

    layouts = {t: writable[p].get(t) for t, p in producer.items() if writable[p].get(t)}
    preloads = _preloads(graph, chip, prec, consumers, readable, gathered)
    layouts.update(preloads)
    inputs = _Inputs(graph, groups, chip, prec, top, budget, producer, consumers, eligible, layouts, aliases,
                     frozenset(preloads), splits, dict(reserve or {}))
    base = _place(inputs, [])
    needed = [(u, t) for u, t in in_place if {u, t} - set(base.tensors) and alone_eligible(u) and alone_eligible(t)]

    def placed_with(pairs: list[tuple[str, str]]) -> ResidencyPlan:
        nonlocal family
        inputs.aliases = aliases + pairs
        family = _family_sets(inputs.aliases)
        verdicts.clear()
        return _place(inputs, [])

    if needed:                 # in place only where two buffers do not fit (in place, reads and writes share banks)
        base = placed_with(needed)
        kept = [(u, t) for u, t in needed if u in base.tensors]
        if kept != needed:     # pairs that fit no better together stay apart (and may be sliced)
            base = placed_with(kept)
    if regions is not None:
        return _place(inputs, regions)
    if span_cost is None:
        return base
    rejected = {t for t in producer if eligible(t) and t not in base.tensors and t not in family}
    regions: list[SlicedRegion] = []
    for run in candidate_runs(graph, groups, matrix_slicing):
        regions += _search_run(inputs, base, run, rejected, span_cost)
    accepted: list[SlicedRegion] = []
    for region in regions:                    # chosen span by span: each with more slices if needed to fit beside the others
        region = _refit(inputs, accepted, region)
        if region is not None:
            accepted.append(region)
    return _place(inputs, accepted)


def _refit(inputs: _Inputs, accepted: list[SlicedRegion], region: SlicedRegion) -> SlicedRegion | None:
    """`region`, or the same span with the fewest more slices, that fits beside `accepted`
    (None when none does while slicing pays)."""
    counts = slice_counts(inputs.graph, inputs.groups, region.members, SLICE_COUNTS)
    for slices in [region.slices] + [k for k in counts if k > region.slices]:
        candidate = region if slices == region.slices else \
            slice_region(inputs.graph, inputs.groups, region.members, slices, set(region.buffers))
        if not _slicing_pays(inputs, candidate):
            return None
        if _place(inputs, accepted + [candidate]) is not None:
            return candidate
    return None


def _search_run(inputs: _Inputs, base: ResidencyPlan, run: tuple[int, ...], rejected: set[str],
                span_cost: SpanCost) -> list[SlicedRegion]:
    """The sliced spans of one run that the layer-group search picks among every span of up to
    MAX_SPAN_CLUSTERS consecutive clusters of held tensors (each also run on through the readers
    of what it makes, SPAN_EXTENSIONS times), at the fewest slice counts that fit:
    each saves the estimated time of the groups it affects (its members, and the groups of
    tensors it pushes out of LMEM or makes room for) unsliced minus sliced."""
    clusters = list(_slicing_candidates(inputs, run, rejected))
    options: dict[tuple, SpanOption] = {}
    unsliced: dict[tuple[int, ...], int] = {}
    spans = []
    for a in range(len(clusters)):
        for b in range(a, min(len(clusters), a + MAX_SPAN_CLUSTERS)):
            members = tuple(i for i in run if clusters[a][0][0] <= i <= clusters[b][0][-1])
            held = set().union(*(h for _, h in clusters[a:b + 1]))
            for _ in range(SPAN_EXTENSIONS + 1):
                if (members, held) not in spans:
                    spans.append((members, held))
                members = _extended(inputs, run, members)
    for members, held in spans:
        for region, plan in _fitting_regions(inputs, run, members, held):
            key = (region.members, region.slices, tuple(sorted(region.buffers)))
            if key in options:
                continue
            affected = _affected(inputs, base, plan, region)
            if affected not in unsliced:
                unsliced[affected] = span_cost(base, affected)
            saving = unsliced[affected] - span_cost(plan, affected)
            options[key] = SpanOption(run.index(region.first), run.index(region.last), saving, region)
    return [o.payload for o in best_selection(len(run), list(options.values()))[1]]


def _affected(inputs: _Inputs, base: ResidencyPlan, plan: ResidencyPlan, region: SlicedRegion) -> tuple[int, ...]:
    """The region's members, every group that makes or reads a tensor kept in LMEM under one plan
    but not the other (slice buffers can push other tensors out of LMEM, or make room), and
    CONTEXT groups either side."""
    changed = set(base.tensors) ^ set(plan.tensors)
    touched = {g for t in changed for g in (inputs.producer.get(t), *inputs.consumers.get(t, ())) if g is not None}
    lo, hi = min(touched | set(region.members)), max(touched | set(region.members))
    context = {i for i in range(lo - CONTEXT, hi + CONTEXT + 1) if 0 <= i < len(inputs.groups)}
    return tuple(sorted(touched | set(region.members) | context))


def _fitting_regions(inputs: _Inputs, run: tuple[int, ...], members: tuple[int, ...], held: set[str]):
    """Up to SLICE_COUNT_CHOICES regions (with their plans) with the fewest slices whose buffers
    fit, while slicing pays; of the span widened by the tensors whose life overlaps it when
    none of the span as it is fits."""
    found = 0
    for members, held in (members, held), _widened(inputs, run, members, held):
        held = held | _internal(inputs, members)
        for slices in slice_counts(inputs.graph, inputs.groups, members, SLICE_COUNTS):
            region = slice_region(inputs.graph, inputs.groups, members, slices, held)
            if found == SLICE_COUNT_CHOICES or not _slicing_pays(inputs, region):
                break
            plan = _place(inputs, [region])
            if plan is not None:
                found += 1
                yield region, plan
        if found:
            return


def _extended(inputs: _Inputs, run: tuple[int, ...], members: tuple[int, ...]) -> tuple[int, ...]:
    """The span run on through the last reader (inside the run) of every 4-D tensor it makes:
    what would leave the span whole then stays inside it as slices."""
    inside, last = set(run), members[-1]
    for t, p in inputs.producer.items():
        users = inputs.consumers.get(t, ())
        if p in members and users and set(users) <= inside and _sliceable_tensor(inputs, t):
            last = max(last, max(users))
    return tuple(i for i in run if members[0] <= i <= last)


def _sliceable_tensor(inputs: _Inputs, name: str) -> bool:
    """A tensor a slice buffer can hold: NCHW (4-D, bands of rows) or a matrix (bands of rows on lanes)."""
    return inputs.layouts.get(name) == MATRIX or len(inputs.graph.tensor(name).shape) == 4


def _internal(inputs: _Inputs, members: tuple[int, ...]) -> set[str]:
    """The eligible 4-D tensors a span makes and only it reads: its members compute them slice
    by slice anyway, so slice buffers hold them in less LMEM than whole buffers."""
    inside = set(members)
    return {t for t, p in inputs.producer.items()
            if p in inside and inputs.consumers.get(t) and set(inputs.consumers[t]) <= inside
            and inputs.eligible(t) and _sliceable_tensor(inputs, t)}


def _widened(inputs: _Inputs, run: tuple[int, ...], members: tuple[int, ...],
             held: set[str]) -> tuple[tuple[int, ...], set[str]]:
    """The members and held tensors grown by every eligible tensor of the same sliceable run whose
    life overlaps them (a whole tensor beside the slices can leave them no room)."""
    inside, held = set(run), set(held)
    lo, hi = members[0], members[-1]
    grown = True
    while grown:
        grown = False
        for t, p in inputs.producer.items():
            users = inputs.consumers.get(t, ())
            if (t not in held and p in inside and users and set(users) <= inside and inputs.eligible(t)
                    and _sliceable_tensor(inputs, t) and p <= hi and max(users) >= lo):
                held.add(t)
                lo, hi, grown = min(lo, p), max(hi, max(users)), True
    return tuple(i for i in run if lo <= i <= hi), held


def _slicing_candidates(inputs: _Inputs, run: tuple[int, ...], rejected: set[str]):
    """(members, held tensors) per cluster of rejected tensors inside a sliceable run, in run
    order: the members span their producers to their last consumers; clusters do not overlap."""
    inside = set(run)
    held = sorted((inputs.producer[t], max(inputs.consumers[t]), t) for t in rejected
                  if inputs.producer[t] in inside and set(inputs.consumers[t]) <= inside
                  and _sliceable_tensor(inputs, t))
    cluster: list[tuple[int, int, str]] = []
    for item in held:
        if cluster and item[0] > max(c[1] for c in cluster):
            yield _members(run, cluster), {c[2] for c in cluster}
            cluster = []
        cluster.append(item)
    if cluster:
        yield _members(run, cluster), {c[2] for c in cluster}


def _members(run: tuple[int, ...], cluster) -> tuple[int, ...]:
    lo, hi = min(c[0] for c in cluster), max(c[1] for c in cluster)
    return tuple(i for i in run if lo <= i <= hi)


def _slicing_pays(inputs: _Inputs, region: SlicedRegion) -> bool:
    """Slicing saves each held tensor's DDR write and read but loads every member's weights once
    per slice: worth it while the weights reloaded are fewer bytes than the activations kept."""
    graph = inputs.graph
    weights = sum(graph.tensor(t).const.size for m in region.members for n in inputs.groups[m].nodes
                  for t in n.inputs if t and graph.tensor(t).const is not None)
    kept = sum(2 * _count(graph.tensor(t).shape) for t in region.buffers)
    return weights * (region.slices - 1) < kept


def _count(shape) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def _place(inputs: _Inputs, regions: list[SlicedRegion]) -> ResidencyPlan | None:
    """First-fit placement of every resident unit; None when a slice buffer does not fit.
    Tensors a sliced region touches live through the whole region (it runs its members again
    for every slice)."""
    graph, chip, top = inputs.graph, inputs.chip, inputs.top
    held = {t: r for r in regions for t in r.buffers}

    written_by = {part: inputs.producer[t] for t, parts in inputs.splits.items() for part, _, _ in parts}

    def life(name: str, first: int, last: int) -> tuple[int, int]:
        first = min(first, written_by.get(name, first))      # a Split's output is written by its input's producer
        for r in regions:
            touched = inputs.producer.get(name) in r.members or set(inputs.consumers.get(name, ())) & set(r.members)
            if touched:
                first, last = min(first, r.first), max(last, r.last)
        return first, last

    aliased = {t for pair in inputs.aliases for t in pair}     # placed together or not at all
    units = [u for u in _concat_units(graph, inputs.groups, chip, inputs.producer, inputs.consumers,
                                      lambda t: t not in held and t not in aliased and inputs.eligible(t))]
    for u in units:
        u.members = [(n, c0, *life(n, f, l)) for n, c0, f, l in u.members]
        u.first, u.last = min(m[2] for m in u.members), max(m[3] for m in u.members)
    claimed = {m[0] for u in units for m in u.members}
    for names in _alias_families(inputs.aliases, inputs.producer):
        a = names[0]
        if any(t in claimed or t in held for t in names) or not inputs.eligible(a):
            continue
        lives = [life(t, inputs.producer[t], max(inputs.consumers[t])) for t in names]
        units.append(_Unit(inputs.shape_of(a), min(f for f, _ in lives), max(l for _, l in lives),
                           [(t, 0, *lf) for t, lf in zip(names, lives)]))
        claimed |= set(names)
    for name in inputs.producer:
        if name not in claimed and name not in held and name not in aliased and name not in inputs.splits \
                and inputs.eligible(name):
            first, last = life(name, inputs.producer[name], max(inputs.consumers[name]))
            units.append(_Unit(inputs.shape_of(name), first, last, [(name, 0, first, last)]))
    for name in sorted(inputs.preloads):
        first, last = life(name, min(inputs.consumers[name]), max(inputs.consumers[name]))
        units.append(_Unit(inputs.shape_of(name), first, last, [(name, 0, first, last)]))
    for name, r in held.items():
        n, c, h, w = inputs.shape_of(name)
        shape = (1, r.capacity(name), 1, w) if r.matrix else (1, c, r.capacity(name), w)
        units.append(_Unit(shape, r.first, r.last, [(name, 0, r.first, r.last)], sliced=True))
    units.sort(key=lambda u: (not u.sliced, u.first, u.last, u.members[0][0]))   # slice buffers first: their span needs them
    plan = ResidencyPlan(region_top=top, regions=list(regions))
    placed: list[tuple[int, int, _Unit]] = []
    for unit in units:
        owner = unit.members[0][0]
        prec = inputs.prec_of(owner)          # an int8 tensor one byte per element, a float one the program's type
        size = _resident_bytes(chip, unit.shape, prec)
        offset = _first_fit(placed, size, unit.first, unit.last)
        if offset + size > inputs.budget_over(unit.first, unit.last):
            if unit.sliced:
                return None
            continue
        placed.append((offset, offset + size, unit))
        base = make_tile(chip, top - offset - size, unit.shape, prec)
        for name, c0, first, last in unit.members:
            container = unit.containers.get(name, None if name == owner else owner)
            shape = unit.shape if unit.sliced else inputs.shape_of(name)
            addr = base.sub_channels(c0, shape[1], chip).addr
            plan.tensors[name] = ResidentTensor(name, shape, prec, addr, size if name == owner else 0, first, last,
                                                container, layout=inputs.layouts.get(name, NCHW))
            plan.consumers[name] = inputs.consumers[name]
    _settle_splits(inputs, plan)
    return plan


def _column_splits(graph: Graph, groups: list[Group], writable: list[dict], producer: dict[str, int]) -> dict:
    """Column Splits of a MatMul's or a DequantizeLinear's result written as a matrix: {result: ((output,
    column, columns), ...)} (the producer writes each part's columns into the part's buffer)."""
    out = {}
    for group in groups:
        if not is_column_split(graph, group):
            continue
        source = group.anchor.inputs[0]
        p = producer.get(source)
        if p is None or not _writes_parts(graph, groups[p], source) or writable[p].get(source) != MATRIX:
            continue
        parts, col = [], 0
        for name in group.anchor.outputs:
            width = graph.tensor(name).shape[-1]
            parts.append((name, col, width))
            col += width
        out[source] = tuple(parts)
    return out


def _writes_parts(graph: Graph, group: Group, result: str) -> bool:
    """Whether the group's emitter can write `result` in column parts: a MatMul's, a DequantizeLinear's
    (alone or in a chain)."""
    return group.kind == "matmul" or (group.kind == "quant" and graph.producer(result).op_type == "DequantizeLinear")


def _settle_splits(inputs: _Inputs, plan: ResidencyPlan) -> None:
    """A split MatMul result is kept (as a name, with no buffer of its own) when every output it
    is split into is in LMEM and it is eligible; else none of its outputs stays there."""
    for source, parts in inputs.splits.items():
        names = [p for p, _, _ in parts]
        if inputs.eligible(source) and all(n in plan.tensors for n in names):
            first, last = inputs.producer[source], max(inputs.consumers[source])
            addr = min(plan.tensors[n].addr for n in names)
            plan.tensors[source] = ResidentTensor(source, inputs.shape_of(source), inputs.prec_of(source), addr, 0, first, last,
                                                  layout=MATRIX)
            plan.consumers[source] = inputs.consumers[source]
            plan.splits[source] = parts
            continue
        dropped = set(names)
        while True:                # the outputs and whatever lives inside them (Reshape views)
            more = {t for t, r in plan.tensors.items() if r.inside in dropped} - dropped
            if not more:
                break
            dropped |= more
        for t in dropped:
            plan.tensors.pop(t, None)
            plan.consumers.pop(t, None)


def _preloads(graph: Graph, chip: ChipConfig, prec: Prec, consumers, readable: list[dict],
              gathered: frozenset = frozenset()) -> dict[str, str]:
    """Graph inputs (and `gathered` activations) that several groups read, all in one LMEM
    layout: loaded into LMEM once before the first of them instead of read from DDR by each
    ({input: layout})."""
    out = {}
    for name in list(graph.inputs) + sorted(gathered):
        users = consumers.get(name, ())
        layouts = {readable[j].get(name) for j in users}
        if len(users) < 2 or len(layouts) != 1 or None in layouts:
            continue
        layout = layouts.pop()
        shape = resident_shape(graph.tensor(name).shape, layout)
        if shape is not None and _strides_fit(graph, chip, name, shape, prec):
            out[name] = layout
    return out


def _view_aliases(graph: Graph, groups: list[Group], readable: list[dict], writable: list[dict],
                  producer: dict[str, int], consumers: dict[str, tuple[int, ...]]) -> list[tuple[str, str]]:
    """Reshapes whose input and output are the same bytes in LMEM in the layouts their producer
    and consumers use (same lanes, same elements per lane: e.g. a [1, S, H*D] matrix and its
    [1, S, H, D] NCHW view): the Reshape then becomes a second name for the same buffer. The
    view group is recorded as reading and writing those layouts."""
    out = []
    for v, group in enumerate(groups):
        if group.kind != "view":
            continue
        a, b = group.anchor.inputs[0], group.anchor.outputs[0]
        users = consumers.get(b, ())
        if a not in producer or groups[producer[a]].kind == "view" or not users or b in graph.outputs:
            continue
        la = writable[producer[a]].get(a)
        lbs = {readable[j].get(b) for j in users}
        if la is None or len(lbs) != 1 or None in lbs or any(groups[j].kind == "view" for j in users):
            continue
        lb = lbs.pop()
        sa, sb = resident_shape(graph.tensor(a).shape, la), resident_shape(graph.tensor(b).shape, lb)
        if sa is None or sb is None or sa[1] != sb[1] or sa[2] * sa[3] != sb[2] * sb[3]:
            continue
        readable[v] = dict(readable[v], **{a: la})
        writable[v] = dict(writable[v], **{b: lb})
        out.append((a, b))
    return out


def _family_sets(aliases: list[tuple[str, str]]) -> dict[str, set[str]]:
    """tensor -> every tensor sharing its buffer through `aliases` (chains included)."""
    family: dict[str, set[str]] = {}
    for a, b in aliases:
        members = family.get(a, {a}) | family.get(b, {b})
        for t in members:
            family[t] = members
    return family


def _alias_families(aliases: list[tuple[str, str]], producer: dict[str, int]) -> list[list[str]]:
    """Tensors sharing one buffer (a Reshape input and its outputs, an in-place output and the
    input it overwrites, and chains of those), each family from its first-made member."""
    unique = {id(f): f for f in _family_sets(aliases).values()}.values()
    return sorted((sorted(f, key=lambda t: (producer.get(t, -1), t)) for f in unique), key=lambda f: f[0])


def _in_place_pairs(graph: Graph, groups: list[Group], readable: list[dict], writable: list[dict],
                    producer: dict[str, int], consumers: dict[str, tuple[int, ...]],
                    aliases: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(input, output) of row-wise groups (elementwise and normalize rows: softmax, layer norm)
    that may write their one output over an input read in place and dying there, of the same
    resident shape and layout: each output tile is written after the group read its rows, so the
    two share one LMEM buffer."""
    taken = {t for pair in aliases for t in pair}
    out = []
    for p, group in enumerate(groups):
        if group.kind != "row" or len(writable[p]) != 1 or len(group.stored) != 1 \
                or any(spec(n.op_type).row_role not in ("elementwise", "normalize") for n in group.nodes):
            continue
        (t, layout), = writable[p].items()
        if t != group.nodes[-1].outputs[0] or t in taken:
            continue
        shape = resident_shape(graph.tensor(t).shape, layout)
        for u in dict.fromkeys(x for n in group.nodes for x in n.inputs if x in producer and x not in group.produced()):
            if (readable[p].get(u) == layout and max(consumers.get(u, (-1,))) == p and u not in taken
                    and u not in graph.outputs and resident_shape(graph.tensor(u).shape, layout) == shape):
                out.append((u, t))
                taken |= {u, t}
                break
    return out


def _concat_units(graph: Graph, groups: list[Group], chip: ChipConfig, producer, consumers,
                  eligible: Callable[[str], bool]) -> list[_Unit]:
    """Channel Concats kept in LMEM, each with the inputs that can be written in place: produced
    by a group that writes LMEM, starting on lane 0; an input that is itself a Concat kept in LMEM
    brings its own in-place inputs along (DenseNet's growing concatenations copy nothing)."""
    units: dict[str, _Unit] = {}
    claimed: set[str] = set()
    for j, group in enumerate(groups):
        node = group.anchor
        out = node.outputs[0]
        if not is_lmem_concat(graph, group) or not eligible(out):
            continue
        unit = _Unit(resident_shape(graph.tensor(out).shape, NCHW), j, max(consumers[out]),
                     [(out, 0, j, max(consumers[out]))])
        offset = 0
        for x in node.inputs:
            if offset % chip.lanes == 0 and x not in claimed and node.inputs.count(x) == 1 and eligible(x):
                inner = units.pop(x, None)
                for name, c0, first, last in (inner.members if inner else [(x, 0, producer[x], max(consumers[x]))]):
                    unit.members.append((name, offset + c0, first, last))
                    unit.containers[name] = inner.containers.get(name, x) if inner and name != x else out
                claimed.add(x)
            offset += graph.tensor(x).shape[1]
        unit.first = min(m[2] for m in unit.members)
        unit.last = max(m[3] for m in unit.members)
        units[out] = unit
    return list(units.values())


def _resident_bytes(chip: ChipConfig, shape, prec: Prec) -> int:
    """Per-lane bytes, rounded to whole banks when the tensor is at least half a bank (so the
    buffers an instruction reads and writes tend to sit on different banks)."""
    size = tile_bytes_per_lane(chip, tuple(shape), prec)
    bank = chip.bank_bytes
    return align_up(size, bank) if 2 * size >= bank else align_up(size, chip.core.lmem_align_bytes)


def _first_fit(placed, size: int, first: int, last: int) -> int:
    """Lowest offset from the top where `size` bytes are free during [first, last]."""
    return lowest_free_offset([(lo, hi) for lo, hi, t in placed if not (t.last < first or t.first > last)], size)


def lowest_free_offset(busy: list[tuple[int, int]], size: int) -> int:
    """The lowest offset >= 0 where [offset, offset + size) overlaps none of the `busy` ranges."""
    busy = sorted(busy)
    offset = 0
    for lo, hi in busy:
        if offset + size <= lo:
            break
        offset = max(offset, hi)
    return offset


def _producers_and_consumers(graph: Graph, groups: list[Group]):
    producer: dict[str, int] = {}
    consumers: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        inside = g.produced()
        for n in g.nodes:
            for t in n.outputs:
                if t:
                    producer[t] = i
        for n in g.nodes:
            for t in n.inputs:
                if t and t not in inside and i not in consumers.setdefault(t, []):
                    consumers[t].append(i)
    return producer, {k: tuple(v) for k, v in consumers.items()}
