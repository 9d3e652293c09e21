"""Which part of each fused group every core computes when a program is split over cores (issue
14): samples or output rows of convs and pools, rows of a row group's view, output columns of a
matmul by weights at least as large as its activations, else its rows; other groups run on core
0. DDR is shared, LMEM private: a group's parts read and write DDR."""

from __future__ import annotations

import math

from tpuflow.frontend.graph import Graph
from tpuflow.lowering.context import WHOLE, EmitPart
from tpuflow.lowering.groups import Group
from tpuflow.lowering.slicing import chunk, matmul_geometry_of, output_height, output_of, view_rows
from tpuflow.options import CompileOptions


def core_parts(graph: Graph, group: Group, cores: int, options: CompileOptions,
               on_vector_unit: bool = False) -> list[EmitPart | None]:
    """Per core, its part of `group` (None: that core has nothing of it). A group that does not
    split runs whole on core 0; `on_vector_unit`: a matmul the GEMV path computes (core 0)."""
    parts = _split(graph, group, cores, options, on_vector_unit)
    return parts if parts is not None else [WHOLE] + [None] * (cores - 1)


def _split(graph: Graph, group: Group, cores: int, options: CompileOptions,
           on_vector_unit: bool) -> list[EmitPart | None] | None:
    if cores == 1:
        return None
    if group.kind in ("conv", "pool") and options.matmul == "tiu" and _is_nchw(graph, group):
        batch = graph.tensor(output_of(group)).shape[0]
        if batch >= cores:
            return [_some(EmitPart(samples=range(*chunk(batch, cores, k)))) for k in range(cores)]
        height = output_height(graph, group)
        if _by_channels(graph, group, height, cores):
            cout = graph.tensor(group.anchor.inputs[1]).shape[0]
            return [_some(EmitPart(channels=chunk(cout, cores, k))) for k in range(cores)]
        return [_some(EmitPart(rows=chunk(height, cores, k))) for k in range(cores)]
    if group.kind == "matmul" and options.matmul == "tiu" and not on_vector_unit and _weight_heavy(graph, group):
        cols = matmul_geometry_of(graph, group).n
        return [_some(EmitPart(view_cols=chunk(cols, cores, k))) for k in range(cores)]
    if group.kind == "row" or (group.kind == "matmul" and options.matmul == "tiu" and not on_vector_unit):
        rows = view_rows(graph, group)
        return [_some(EmitPart(view_rows=chunk(rows, cores, k))) for k in range(cores)]
    return None


def _weight_heavy(graph: Graph, group: Group) -> bool:
    """A matmul by constant weights at least as large as its activations: its output columns are
    split (each core loads its share of the weights once) rather than its rows (each core would
    load all of them)."""
    geo = matmul_geometry_of(graph, group)
    weights = graph.tensor(group.anchor.inputs[1])
    return weights.is_const and geo.k * geo.n >= geo.batch_count * geo.m * geo.k


def _by_channels(graph: Graph, group: Group, height: int, cores: int) -> bool:
    """A plain conv splits its output channels (each core loads its share of the weights, and
    all of the input) when its weights outweigh its input or it has fewer output rows than cores."""
    if group.kind != "conv" or group.anchor.attr("group", 1) != 1:
        return False
    weights = graph.tensor(group.anchor.inputs[1])
    source = graph.tensor(group.anchor.inputs[0])
    return weights.const is not None and (weights.const.size >= math.prod(source.shape) or height < cores)


def _is_nchw(graph: Graph, group: Group) -> bool:
    return len(graph.tensor(output_of(group)).shape) == 4


def _some(part: EmitPart) -> EmitPart | None:
    """None for a part with nothing to compute."""
    for span in (part.rows, part.channels, part.view_rows, part.view_cols):
        if span is not None and span[1] <= span[0]:
            return None
    if part.samples is not None and not part.samples:
        return None
    return part
