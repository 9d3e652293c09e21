"""Which part of each fused group every core computes when a program is split over cores (issue
14): samples or output rows of convs and pools, rows of a row group's or a matmul's view; other
groups run on core 0. DDR is shared, LMEM private: a group's parts read and write DDR."""

from __future__ import annotations

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
    view_rows: tuple[int, int] | None = None     # row group / matmul view rows (matmul: batch * M)

    def as_dict(self) -> dict:
        out = {}
        if self.samples is not None:
            out["samples"] = [self.samples.start, self.samples.stop]
        if self.rows is not None:
            out["rows"] = list(self.rows)
        if self.view_rows is not None:
            out["view_rows"] = list(self.view_rows)
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
        return [_some(CorePart(rows=chunk(height, cores, k))) for k in range(cores)]
    if group.kind == "row" or (group.kind == "matmul" and options.matmul == "tiu" and not on_vector_unit):
        rows = _view_rows(graph, group)
        return [_some(CorePart(view_rows=chunk(rows, cores, k))) for k in range(cores)]
    return None


def _is_nchw(graph: Graph, group: Group) -> bool:
    return len(graph.tensor(output_of(group)).shape) == 4


def _view_rows(graph: Graph, group: Group) -> int:
    """Rows of the group's rows x columns view: the dims before its cut (row groups), batch x M
    (matmuls)."""
    if group.kind == "matmul":
        from tpuflow.lowering.ops.matmul import matmul_geometry
        geo = matmul_geometry(SimpleNamespace(graph=graph), group.anchor)
        return geo.batch_count * geo.m
    rows = 1
    for d in group.full_shape[:group.split]:
        rows *= d
    return rows


def _some(part: CorePart) -> CorePart | None:
    """None for a part with nothing to compute."""
    for span in (part.rows, part.view_rows):
        if span is not None and span[1] <= span[0]:
            return None
    if part.samples is not None and not part.samples:
        return None
    return part
