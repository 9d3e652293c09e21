"""Fusion: partitions the graph into groups that run without DDR round trips inside them
(Conv + epilogue, MatMul + bias + activation, row-wise chains such as softmax and layer norm)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from tpuflow.frontend.graph import Graph, OpNode
from tpuflow.frontend.ops import OpKind
from tpuflow.lowering.ewise import Kind, classify, classify_flat, node_fits, node_split_candidates, reads_whole_rows
from tpuflow.lowering.opspec import spec
from tpuflow.lowering.tiling import lane_rows

CONV_EPILOGUE_SPLIT = 2     # NCHW: rows = (n, c), cols = (h, w)


@dataclass
class Group:
    kind: str                         # conv | deconv | matmul | row | pool | lrn | move | view
    nodes: list[OpNode]
    split: int = 0                    # row groups: where the output shape is cut into rows x cols
    stored: list[str] = field(default_factory=list)   # tensors written to DDR (consumed outside)
    splits: dict[str, int] = field(default_factory=dict)  # row groups: each node's own cut point
    full_shape: tuple[int, ...] = ()   # row groups: the reference shape the view is cut from
    flat_shape: tuple[int, ...] = ()   # flat row groups: the output shape viewed as full_shape (else empty)

    def kind_of(self, shape: tuple[int, ...]) -> Kind | None:
        """How an operand of `shape` maps onto this row group's view: cut from full_shape at
        split, or, for a flat view, FULL (the output's shape) or SCALAR (one element) only."""
        if self.flat_shape:
            return classify_flat(shape, self.flat_shape)
        return classify(shape, self.full_shape, self.split)

    @property
    def name(self) -> str:
        return self.nodes[0].name

    @property
    def anchor(self) -> OpNode:
        return self.nodes[0]

    @property
    def tail_pool(self) -> OpNode | None:
        """A pooling fused after a Conv's epilogue (Conv -> Relu -> Pool), or None."""
        last = self.nodes[-1]
        return last if self.kind == "conv" and len(self.nodes) > 1 and spec(last.op_type).group == "pool" else None

    @property
    def epilogue(self) -> list[OpNode]:
        return self.nodes[1:-1] if self.tail_pool is not None else self.nodes[1:]

    def produced(self) -> set[str]:
        return {t for n in self.nodes for t in n.outputs}

    def external_inputs(self, graph: Graph) -> list[str]:
        """Runtime (non-constant) tensors the group reads from DDR, in first-use order."""
        made, out = self.produced(), []
        for n in self.nodes:
            for t in n.inputs:
                if t and t not in made and not graph.tensor(t).is_const and t not in out:
                    out.append(t)
        return out


def _single_use(graph: Graph, tensor: str) -> OpNode | None:
    users = graph.consumers(tensor)
    if len(users) != 1 or tensor in graph.outputs:
        return None
    return users[0]


def _epilogue_ok(graph: Graph, node: OpNode, value: str, split: int, allow_col: bool, taken: set[str]) -> bool:
    if spec(node.op_type).row_role != "elementwise":
        return False
    for t in node.inputs:          # other operands must already be computed (group order = topological)
        producer = graph.producer(t) if t else None
        if t and t != value and producer is not None and producer.name not in taken:
            return False
    out = graph.tensor(node.outputs[0]).shape
    if graph.tensor(value).shape != out:
        return False
    for t in node.inputs:
        if not t or t == value:
            continue
        kind = classify(graph.tensor(t).shape, out, split)
        if kind is None or kind is Kind.PERIODIC or (kind is Kind.COL and not allow_col):
            return False
    return True


def _absorb_epilogue(graph: Graph, anchor: OpNode, split: int, allow_col: bool, taken: set[str]) -> list[OpNode]:
    nodes, value = [], anchor.outputs[0]
    while True:
        nxt = _single_use(graph, value)
        if nxt is None or nxt.name in taken or not _epilogue_ok(graph, nxt, value, split, allow_col, taken):
            return nodes
        nodes.append(nxt)
        value = nxt.outputs[0]


# A row group's view starves the lanes when its rows fill less than 1/STARVED_FILL of them (a
# 1-channel NCHW map cut after C computes on one lane): another cut point is then preferred.
STARVED_FILL = 8


def _row_group(graph: Graph, start: OpNode, order: list[OpNode], pos: int, taken: set[str],
               lanes: int | None, ends: frozenset[str] = frozenset()) -> Group | None:
    """The longest run of row-wise nodes after `start` that share its (rows, cols) view: every
    operand classifies against the group's reference shape, values are FULL or ROW. Of the cut
    points `start` can take, the one that joins the most nodes (the first on ties), unless its
    rows starve the chip's `lanes` and another's do not. A purely elementwise group then takes
    the flat view of its tensors when that is better (_flat_pays)."""
    best, best_key = None, None
    for split in node_split_candidates(graph, start):
        if node_fits(graph, start, split):
            group = _row_group_at(graph, start, order, pos, taken, split, ends)
            key = (not _starves(group, lanes), len(group.nodes))
            if best is None or key > best_key:
                best, best_key = group, key
    flat = _flat_group(graph, best, lanes) if best is not None else None
    return flat if flat is not None and _flat_pays(graph, best, flat, lanes) else best


def _flat_group(graph: Graph, group: Group, lanes: int | None) -> Group | None:
    """`group`'s nodes with the flat view of their output: its elements as rows x cols, rows the
    largest divisor of the count within the `lanes` (every DMA moves whole rows of cols contiguous
    elements); None unless every node is elementwise, of the group's output shape, and every
    operand is FULL or a single element (DDR tensors are contiguous: the view is a reshape)."""
    shape = graph.tensor(group.anchor.outputs[0]).shape
    count = math.prod(shape)
    if lanes is None or count < 2:
        return None
    for node in group.nodes:
        if spec(node.op_type).row_role != "elementwise" or graph.tensor(node.outputs[0]).shape != shape:
            return None
        if any(classify_flat(graph.tensor(t).shape, shape) is None for t in node.inputs if t):
            return None
    rows = lane_rows(count, lanes)
    # (rows, 1, cols) cut after rows: the view is no NCHW map or matrix to slicing and residency
    return Group("row", list(group.nodes), 1, splits={n.name: 1 for n in group.nodes},
                 full_shape=(rows, 1, count // rows), flat_shape=tuple(shape))


def _flat_pays(graph: Graph, cut: Group, flat: Group, lanes: int | None) -> bool:
    """The flat view replaces a cut-point view that cannot keep its output in LMEM (no resident
    layout: nothing to lose to layer groups) when it does not starve the lanes and either the cut
    view does or the flat view's transfers move fewer DMA pieces (one contiguous run per view row
    and lane: rows pieces per tensor, the same tensors either way)."""
    from tpuflow.lowering.ops.rowgroup import rows_layout
    out = graph.tensor(cut.nodes[-1].outputs[0]).shape
    if rows_layout(out, cut.full_shape, cut.split) is not None or _starves(flat, lanes):
        return False
    return _starves(cut, lanes) or view_rows(flat) < view_rows(cut)


def view_rows(group: Group) -> int:
    """Rows of a row group's view (the product of its reference shape's dims before the cut)."""
    return math.prod(group.full_shape[:group.split])


def _starves(group: Group, lanes: int | None) -> bool:
    return lanes is not None and view_rows(group) * STARVED_FILL < lanes


def _row_group_at(graph: Graph, start: OpNode, order: list[OpNode], pos: int, taken: set[str], split: int,
                  ends: frozenset[str] = frozenset()) -> Group:
    ref = _reference_shape(graph, start)
    group = Group("row", [start], split, splits={start.name: split}, full_shape=ref)
    members = set(start.outputs)
    for node in order[pos + 1:]:
        if group.nodes[-1].name in ends or node.name in taken or not spec(node.op_type).row_role:
            break
        if not any(t in members for t in node.inputs) or not row_member_ok(graph, node, ref, split):
            break
        group.nodes.append(node)
        group.splits[node.name] = split
        members.update(node.outputs)
    return group


def _reference_shape(graph: Graph, node: OpNode) -> tuple[int, ...]:
    ref = node.inputs[0] if reads_whole_rows(node.op_type) else node.outputs[0]
    return graph.tensor(ref).shape


def row_member_ok(graph: Graph, node: OpNode, ref: tuple[int, ...], split: int) -> bool:
    """Whether `node` computes row-wise in the view of `ref` cut at `split`."""
    kinds = [classify(graph.tensor(t).shape, ref, split) for t in node.inputs if t]
    if any(k is None for k in kinds):
        return False
    if reads_whole_rows(node.op_type):
        return (kinds[0] is Kind.FULL and len(graph.tensor(node.inputs[0]).shape) == len(ref)
                and node_split_candidates(graph, node) == [split])
    out = classify(graph.tensor(node.outputs[0]).shape, ref, split)
    return out in (Kind.FULL, Kind.ROW)


def _fusable_pool(graph: Graph, conv: OpNode, value: str, taken: set[str]) -> OpNode | None:
    """The pooling consuming `value` when it can run on the conv's output tile: a MaxPool, or an
    AveragePool whose every window has the same element count (no padding, no ceil overhang)."""
    nxt = _single_use(graph, value)
    if nxt is None or spec(nxt.op_type).group != "pool" or nxt.name in taken:
        return None
    if conv.attr("group", 1) > 1 and conv.attr("group", 1) == graph.tensor(conv.inputs[0]).shape[1]:
        return None                                   # depthwise: pooled separately
    if nxt.op_type == OpKind.AVERAGE_POOL:
        _, _, h, w = graph.tensor(value).shape
        _, _, ho, wo = graph.tensor(nxt.outputs[0]).shape
        kh, kw = nxt.attr("kernel_shape")
        sy, sx = nxt.attr("strides", (1, 1))
        if any(nxt.attr("pads", (0, 0, 0, 0))) or (ho - 1) * sy + kh > h or (wo - 1) * sx + kw > w:
            return None
    return nxt


def form_groups(graph: Graph, fuse_pool: bool | Callable[[Group], bool] = True, lanes: int | None = None,
                ends: frozenset[str] = frozenset()) -> list[Group]:
    """Groups in topological order; every node is in exactly one group. `fuse_pool` lets a
    pooling join the Conv group before it (TIU path), or, a function of the conv group, those
    groups it is true for (the tile path: lowering.ops.tilemm.tile_pool_fusion); `lanes` (the chip's) steers row groups
    away from views that leave most lanes idle; a row group ends at a node named in `ends`."""
    order = list(graph.nodes())
    taken: set[str] = set()
    groups: list[Group] = []
    for pos, node in enumerate(order):
        if node.name in taken:
            continue
        group = _group_at(graph, node, order, pos, taken, lanes, ends)
        if group.kind == "conv" and (fuse_pool(group) if callable(fuse_pool) else fuse_pool):
            pool = _fusable_pool(graph, node, group.nodes[-1].outputs[0], taken | {n.name for n in group.nodes})
            if pool is not None:
                group.nodes.append(pool)
        taken.update(n.name for n in group.nodes)
        groups.append(group)
    for g in groups:
        g.stored = _stored_outputs(graph, g)
    return groups


def _group_at(graph: Graph, node: OpNode, order: list[OpNode], pos: int, taken: set[str],
              lanes: int | None, ends: frozenset[str] = frozenset()) -> Group:
    kind = spec(node.op_type).group
    if kind == "conv":
        return Group("conv", [node] + _absorb_epilogue(graph, node, CONV_EPILOGUE_SPLIT, False, taken),
                     CONV_EPILOGUE_SPLIT)
    if kind == "deconv":
        return Group("deconv", [node] + _absorb_epilogue(graph, node, CONV_EPILOGUE_SPLIT, False, taken),
                     CONV_EPILOGUE_SPLIT)
    if kind == "matmul":
        split = len(graph.tensor(node.outputs[0]).shape) - 1
        if node.attr("y_perm") is not None:            # stores through a folded Transpose: no epilogue
            return Group("matmul", [node], split)
        return Group("matmul", [node] + _absorb_epilogue(graph, node, split, True, taken), split)
    if kind == "pool":
        return Group("pool", [node], CONV_EPILOGUE_SPLIT)
    if kind in ("lrn", "view"):
        return Group(kind, [node])
    if kind == "row":
        group = _row_group(graph, node, order, pos, taken, lanes, ends)
        if group is not None:
            return group
        return Group("move", [node])       # elementwise with a general broadcast: expand first
    return Group("move", [node])


def _stored_outputs(graph: Graph, group: Group) -> list[str]:
    """Outputs consumed outside the group (or graph outputs): they get DDR buffers."""
    inside = {n.name for n in group.nodes}
    out = []
    for n in group.nodes:
        for t in n.outputs:
            if not t:
                continue
            if t in graph.outputs or any(c.name not in inside for c in graph.consumers(t)):
                out.append(t)
    return out
