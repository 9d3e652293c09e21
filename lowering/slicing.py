"""N/H-slicing of layer groups: a run of conv / pool / elementwise groups whose activations are too
large to stay whole in LMEM runs slice by slice, over samples (batch > 1) and within a sample over
output rows. Each slice computes, for its sample, the rows of every member that later members need
in that slice (halos propagated backward through kernels, strides, pads and dilations; rows at
band borders are recomputed), and every row of every sample of every member at least once."""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

from tpuflow.frontend.graph import Graph
from tpuflow.lowering.groups import Group
from tpuflow.lowering.opspec import spec

Rows = tuple[int, int]          # [lo, hi)


@dataclass(frozen=True)
class SlicedRegion:
    """Consecutive fused groups run `slices` times: slice s is sample `sample_of(s)` and, within
    it, row band s % bands; `rows[m][s]` are the output rows member m computes in slice s,
    `buffers[t][s]` the rows of tensor t held in LMEM in slice s (one sample at a time)."""

    members: tuple[int, ...]
    slices: int
    rows: dict[int, tuple[Rows, ...]]
    buffers: dict[str, tuple[Rows, ...]]
    samples: int = 1
    matrix: bool = False        # bands of view rows of matmuls and row groups (no halo), not of NCHW rows

    @property
    def bands(self) -> int:
        return self.slices // self.samples

    def sample_of(self, s: int) -> int:
        return s // self.bands

    def part(self, member: int, s: int):
        """What member `member` computes in slice `s` (lowering.context.EmitPart)."""
        from tpuflow.lowering.context import EmitPart
        if self.matrix:
            return EmitPart(view_rows=self.rows[member][s])
        sample = self.sample_of(s)
        return EmitPart(samples=range(sample, sample + 1), rows=self.rows[member][s])

    @property
    def axes(self) -> str:
        """"n", "h", "n,h" or "rows" (matrix rows): what the slices split."""
        if self.matrix:
            return "rows"
        return ",".join(a for a, used in (("n", self.samples > 1), ("h", self.bands > 1)) if used)

    @property
    def first(self) -> int:
        return self.members[0]

    @property
    def last(self) -> int:
        return self.members[-1]

    def capacity(self, tensor: str) -> int:
        """Rows the slice buffer of `tensor` must hold."""
        return max(hi - lo for lo, hi in self.buffers[tensor])


def output_of(group: Group) -> str:
    return group.nodes[-1].outputs[0]


def output_height(graph: Graph, group: Group) -> int:
    return graph.tensor(output_of(group)).shape[2]


def matmul_geometry_of(graph: Graph, group: Group):
    """The MatmulGeom of a matmul group, from the graph alone."""
    from tpuflow.lowering.ops.matmul import matmul_geometry
    return matmul_geometry(SimpleNamespace(graph=graph), group.anchor)


def view_rows(graph: Graph, group: Group) -> int | None:
    """Rows of a group's rows x columns view: batch x M of a matmul, the dims before a row
    group's cut; None for other groups."""
    if group.kind == "matmul":
        geo = matmul_geometry_of(graph, group)
        return geo.batch_count * geo.m
    return math.prod(group.full_shape[:group.split]) if group.kind == "row" else None


def _cut_before_last(group: Group) -> bool:
    """A row group whose view keeps the last axis as its columns (a matrix layout)."""
    return len(group.full_shape) >= 2 and group.split == len(group.full_shape) - 1


def _matrix_extent(graph: Graph, group: Group, made: set[str]) -> int | None:
    """The view rows of a group that can run on a band of them inside a run that made `made`:
    a matmul whose right operand is not made in the run and whose left operand, when made there,
    is read row for row; a row group cut before its last axis."""
    rows = view_rows(graph, group)
    if group.kind == "row":
        return rows if _cut_before_last(group) else None
    if rows is None:
        return None
    node = group.anchor
    a, b = node.inputs[0], node.inputs[1]
    if b in made or (a in made and (node.attr("a_perm") is not None or math.prod(graph.tensor(a).shape[:-1]) != rows)):
        return None
    return rows


def samples(graph: Graph, group: Group) -> int:
    return graph.tensor(output_of(group)).shape[0]


def is_sliceable(graph: Graph, group: Group) -> bool:
    """Conv groups (plain or depthwise, epilogue and pool included), pools, and purely
    elementwise row groups over NCHW (rows = channels): each computes any band of output rows of
    any sample from a band of input rows of that sample."""
    out = graph.tensor(output_of(group)).shape
    if len(out) != 4:
        return False
    if group.kind == "conv":
        node = group.anchor
        cin = graph.tensor(node.inputs[0]).shape[1]
        g = node.attr("group", 1)
        return g == 1 or g == cin == graph.tensor(node.inputs[1]).shape[0]
    if group.kind == "pool":
        return True
    if group.kind == "move":
        from tpuflow.lowering.ops.resize_lmem import is_lmem_resize
        return is_lmem_resize(graph, group)
    if group.kind == "quant":
        from tpuflow.lowering.quant import sliceable_quant
        return sliceable_quant(graph, group)
    if group.kind == "row":
        return (group.split == 2 and len(group.full_shape) == 4 and tuple(group.full_shape) == tuple(out)
                and all(spec(n.op_type).slicing == "rows" for n in group.nodes))
    return False


def input_rows(graph: Graph, group: Group, rows: Rows) -> dict[str, Rows]:
    """Rows of each runtime 4-D input a sliceable group reads to produce output rows `rows`."""
    from tpuflow.lowering.ops.conv import conv_geometry
    from tpuflow.lowering.ops.pool import pool_geometry
    shim = SimpleNamespace(graph=graph)
    lo, hi = rows
    need: dict[str, Rows] = {}
    kind = group.kind if group.kind != "quant" else _quant_kind(group)
    if kind == "pool":
        geom, _ = pool_geometry(shim, group.anchor)
        return {group.anchor.inputs[0]: _window(geom, lo, hi)}
    if group.kind == "move":                      # nearest upsampling (is_sliceable)
        from tpuflow.lowering.ops.resize_lmem import resize_input_rows
        return {group.anchor.inputs[0]: resize_input_rows(group, rows)}
    if kind == "conv":
        if group.tail_pool is not None:
            pgeom, _ = pool_geometry(shim, group.tail_pool)
            lo, hi = _window(pgeom, lo, hi)
        geom = conv_geometry(shim, group.anchor)
        need[group.anchor.inputs[0]] = _window(geom, lo, hi)
    for node in group.nodes[1:] if kind == "conv" else group.nodes:
        for t in node.inputs:
            info = graph.tensor(t) if t else None
            if info is not None and not info.is_const and len(info.shape) == 4 and info.shape[2] > 1 \
                    and t not in group.produced():
                need[t] = _hull(need.get(t), (lo, hi))
    return need


def _quant_kind(group: Group) -> str:
    """What an int8 group computes rows like: a conv, a pool, or elementwise ("row")."""
    op = group.anchor.op_type
    return "conv" if op == "Conv" else "pool" if op in ("MaxPool", "AveragePool") else "row"


def _window(geom, lo: int, hi: int) -> Rows:
    first, count, _, _ = geom.input_rows(lo, hi - lo)
    return first, first + count


def _hull(a: Rows | None, b: Rows) -> Rows:
    return b if a is None else (min(a[0], b[0]), max(a[1], b[1]))


def chunk(height: int, slices: int, s: int) -> Rows:
    return height * s // slices, height * (s + 1) // slices


def slice_counts(graph: Graph, groups: list[Group], members: tuple[int, ...], counts) -> list[int]:
    """The slice counts a span can run at: one slice per sample, or `counts` row bands per
    sample (a batch is always sliced by sample first: no halo, no recomputation)."""
    n = 1 if _is_matrix_span(graph, groups, members) else samples(graph, groups[members[0]])
    return ([n] if n > 1 else []) + [n * k for k in counts]


def slice_region(graph: Graph, groups: list[Group], members: tuple[int, ...], slices: int,
                 held: set[str]) -> SlicedRegion:
    """Rows per member and slice (each member's own share of its rows plus what later members
    need), and the rows of each tensor in `held` (slice buffers) per slice; `slices` is a
    multiple of the batch (slice_counts)."""
    if _is_matrix_span(graph, groups, members):
        return _matrix_region(graph, groups, members, slices, held)
    n = samples(graph, groups[members[0]])
    if slices % n or any(samples(graph, groups[m]) != n for m in members):
        raise ValueError(f"internal: {slices} slices of a span of batch {n}")
    bands = slices // n
    rows: dict[int, list[Rows]] = {m: [] for m in members}
    buffers: dict[str, list[Rows]] = {t: [] for t in held}
    produced_by = {output_of(groups[m]): m for m in members}
    for s in range(bands):
        needed: dict[str, Rows] = {}
        for m in reversed(members):
            name = output_of(groups[m])
            own = chunk(output_height(graph, groups[m]), bands, s)
            band = _hull(needed.get(name), own) if own[1] > own[0] else needed.get(name, (own[0], own[0]))
            rows[m].append(band)
            if band[1] <= band[0]:
                continue
            for t, r in input_rows(graph, groups[m], band).items():
                if t in produced_by:
                    needed[t] = _hull(needed.get(t), r)
        for t in held:
            buffers[t].append(rows[produced_by[t]][s])
    return SlicedRegion(tuple(members), slices, {m: tuple(v) * n for m, v in rows.items()},
                        {t: tuple(v) * n for t, v in buffers.items()}, n)


def _is_matrix_span(graph: Graph, groups: list[Group], members: tuple[int, ...]) -> bool:
    first = groups[members[0]]
    return first.kind == "matmul" or (first.kind == "row" and _cut_before_last(first)
                                      and not _nchw_row_group(graph, first))


def _nchw_row_group(graph: Graph, group: Group) -> bool:
    out = graph.tensor(output_of(group)).shape
    return (len(out) == 4 and group.split == 2 and len(group.full_shape) == 4
            and tuple(group.full_shape) == tuple(out))


def _matrix_region(graph: Graph, groups: list[Group], members: tuple[int, ...], slices: int,
                   held: set[str]) -> SlicedRegion:
    """Every member computes the same band of view rows per slice (rows are independent)."""
    rows = view_rows(graph, groups[members[0]])
    bands = tuple(chunk(rows, slices, s) for s in range(slices))
    return SlicedRegion(tuple(members), slices, {m: bands for m in members}, {t: bands for t in held},
                        1, matrix=True)


def candidate_runs(graph: Graph, groups: list[Group], matrix: bool = False) -> list[tuple[int, ...]]:
    """Maximal runs of consecutive sliceable groups in which every member after the first reads a
    tensor made by an earlier member: NCHW runs of one batch size (sliced by samples and output
    rows), and with `matrix` runs of matmuls and row groups over the same number of view rows
    (sliced by bands of rows; a matmul's right operand comes from outside the run)."""
    runs, current, made, kind = [], [], set(), None
    for i, g in enumerate(groups):
        inputs = {t for n in g.nodes for t in n.inputs if t}
        if current and inputs & made and _signature(graph, g, made, matrix) == kind:
            current.append(i)
            made |= g.produced()
            continue
        if len(current) > 1:
            runs.append(tuple(current))
        kind = _signature(graph, g, set(), matrix)
        current, made = ([i], set(g.produced())) if kind is not None else ([], set())
    if len(current) > 1:
        runs.append(tuple(current))
    return runs


def _signature(graph: Graph, group: Group, made: set[str], matrix: bool):
    """What members of one run share: ("nchw", batch) or ("rows", view rows); None when the group
    cannot join (or start) a run."""
    if group.kind in ("conv", "pool", "move", "quant") or _nchw_row_group(graph, group):
        return ("nchw", samples(graph, group)) if is_sliceable(graph, group) else None
    if not matrix:
        return None
    rows = _matrix_extent(graph, group, made)
    return None if rows is None else ("rows", rows)
