"""Which part of each fused group every core computes when a program is split over cores (issue
14): samples or output rows of convs and pools, rows of a row group's view, output columns of a
matmul by weights at least as large as its activations, else its rows; other groups run on core
0. DDR is shared, LMEM private: a group's parts read and write DDR."""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

from tpuflow.frontend.graph import Graph
from tpuflow.lowering.groups import Group
from tpuflow.lowering.slicing import chunk, output_height, output_of
from tpuflow.options import CompileOptions


@dataclass(frozen=True)
class CorePart:
    """What one core emits of a group (None fields: all of it along that axis)."""

    samples: range | None = None
    rows: tuple[int, int] | None = None          # conv / pool output rows
    channels: tuple[int, int] | None = None      # conv output channels
    view_rows: tuple[int, int] | None = None     # row group / matmul view rows (matmul: batch * M)
    view_cols: tuple[int, int] | None = None     # matmul output columns

    def as_dict(self) -> dict:
        out = {}
        if self.samples is not None:
            out["samples"] = [self.samples.start, self.samples.stop]
        if self.rows is not None:
            out["rows"] = list(self.rows)
        if self.channels is not None:
            out["channels"] = list(self.channels)
        if self.view_rows is not None:
            out["view_rows"] = list(self.view_rows)
        if self.view_cols is not None:
            out["columns"] = list(self.view_cols)
        return out


WHOLE = CorePart()


def core_parts(graph: Graph, group: Group, cores: int, options: CompileOptions,
               on_vector_unit: bool = False) -> list[CorePart | None]:
    """Per core, its part of `group` (None: that core has nothing of it). A group that does not
    split runs whole on core 0; `on_vector_unit`: a matmul the GEMV path computes (core 0)."""
    parts = _split(graph, group, cores, options, on_vector_unit)
    return parts if parts is not None else [WHOLE] + [None] * (cores - 1)


def _split(graph: Graph, group: Group, cores: int, options: CompileOptions,
           on_vector_unit: bool) -> list[CorePart | None] | None:
    if cores == 1:
        return None
    if group.kind in ("conv", "pool") and options.matmul == "tiu" and _is_nchw(graph, group):
        batch = graph.tensor(output_of(group)).shape[0]
        if batch >= cores:
            return [_some(CorePart(samples=range(*chunk(batch, cores, k)))) for k in range(cores)]
        height = output_height(graph, group)
        if _by_channels(graph, group, height, cores):
            cout = graph.tensor(group.anchor.inputs[1]).shape[0]
            return [_some(CorePart(channels=chunk(cout, cores, k))) for k in range(cores)]
        return [_some(CorePart(rows=chunk(height, cores, k))) for k in range(cores)]
    if group.kind == "matmul" and options.matmul == "tiu" and not on_vector_unit and _weight_heavy(graph, group):
        cols = _geometry(graph, group).n
        return [_some(CorePart(view_cols=chunk(cols, cores, k))) for k in range(cores)]
    if group.kind == "row" or (group.kind == "matmul" and options.matmul == "tiu" and not on_vector_unit):
        rows = _view_rows(graph, group)
        return [_some(CorePart(view_rows=chunk(rows, cores, k))) for k in range(cores)]
    return None


def _geometry(graph: Graph, group: Group):
    from tpuflow.lowering.ops.matmul import matmul_geometry
    return matmul_geometry(SimpleNamespace(graph=graph), group.anchor)


def _weight_heavy(graph: Graph, group: Group) -> bool:
    """A matmul by constant weights at least as large as its activations: its output columns are
    split (each core loads its share of the weights once) rather than its rows (each core would
    load all of them)."""
    geo = _geometry(graph, group)
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


def _view_rows(graph: Graph, group: Group) -> int:
    """Rows of the group's rows x columns view: the dims before its cut (row groups), batch x M
    (matmuls)."""
    if group.kind == "matmul":
        geo = _geometry(graph, group)
        return geo.batch_count * geo.m
    rows = 1
    for d in group.full_shape[:group.split]:
        rows *= d
    return rows


def _some(part: CorePart) -> CorePart | None:
    """None for a part with nothing to compute."""
    for span in (part.rows, part.channels, part.view_rows, part.view_cols):
        if span is not None and span[1] <= span[0]:
            return None
    if part.samples is not None and not part.samples:
        return None
    return part
