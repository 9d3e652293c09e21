"""DDR placement: graph inputs and outputs, activations with reuse of dead space (first fit over
lifetimes; a tile-path activation chosen C0-blocked in the NC1HWC0 layout), views aliasing their source,
Concat inputs placed inside their Concat's output, one scratch area, then the weight image."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

from tpuflow.chip import ChipConfig
from tpuflow.errors import LoweringError
from tpuflow.frontend.graph import Graph
from tpuflow.lowering.groups import Group
from tpuflow.lowering.lmem import align_up
from tpuflow.program import DdrTensor


@dataclass
class DdrPlan:
    tensors: dict[str, DdrTensor]
    scratch_base: int
    scratch_bytes: int
    weight_base: int
    concat_members: dict[str, tuple[str, int]]   # tensor -> (Concat output it lives in, byte offset)
    layouts: dict[str, str] = field(default_factory=dict)   # tensor with a DDR buffer -> "NC1HWC0" (tile path)

    def alias_root(self, name: str) -> tuple[str, int]:
        return alias_root(self.concat_members, name)


C0_BLOCKED = "NC1HWC0"
# Layouts of activations other than row-major, per graph being compiled (the tile path's choice,
# lowering.ops.tilemm.plan_c0_layouts): every DDR plan of that graph places them so.
TENSOR_LAYOUTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def c0_blocked_bytes(shape, esize: int, c0: int) -> int:
    """Bytes of an N x C x H x W tensor in NC1HWC0 (C rounded up to whole C0 blocks)."""
    n, c, h, w = shape
    return n * -(-c // c0) * c0 * h * w * esize


def alias_root(members: dict[str, tuple[str, int]], name: str) -> tuple[str, int]:
    """The buffer a tensor lives in and its byte offset there (itself at 0 when not aliased)."""
    offset = 0
    while name in members:
        name, off = members[name]
        offset += off
    return name, offset


class FirstFit:
    """Address ranges of a pool, handed out first-fit and returned when a tensor dies."""

    def __init__(self, base: int, align: int):
        self.base, self.align = base, align
        self.free: list[tuple[int, int]] = []   # (addr, size), sorted by address
        self.end = base

    def alloc(self, size: int) -> int:
        size = align_up(max(size, 1), self.align)
        for i, (addr, free_size) in enumerate(self.free):
            if free_size >= size:
                rest = (addr + size, free_size - size)
                self.free[i:i + 1] = [rest] if rest[1] else []
                return addr
        addr = self.end
        self.end += size
        return addr

    def release(self, addr: int, size: int) -> None:
        size = align_up(max(size, 1), self.align)
        self.free.append((addr, size))
        self.free.sort()
        merged: list[tuple[int, int]] = []
        for a, s in self.free:
            if merged and merged[-1][0] + merged[-1][1] == a:
                merged[-1] = (merged[-1][0], merged[-1][1] + s)
            else:
                merged.append((a, s))
        self.free = merged


def plan_ddr(graph: Graph, groups: list[Group], chip: ChipConfig, dtype: str, scratch_bytes: int,
             in_lmem: set[str] = frozenset(), rerun: list[tuple[int, int]] = ()) -> DdrPlan:
    """`in_lmem`: activations that live in LMEM only (layer groups) and get no DDR buffer.
    `rerun`: spans of groups [first, last] run once per slice (sliced layer groups): a buffer
    read inside a span lives until the span's end, since its first members run again."""
    align = chip.core.ddr_align_bytes
    tensors: dict[str, DdrTensor] = {}
    cursor = 0

    def fixed(name: str, role: str) -> None:
        nonlocal cursor
        shape = graph.tensor(name).shape
        stored = "int32" if role == "input" and _indices_only(graph, name) else stored_dtype(graph, name, dtype)
        nbytes = _count(shape) * ELEMENT_BYTES[stored]
        tensors[name] = DdrTensor(name, cursor, shape, stored, role, nbytes)
        cursor = align_up(cursor + nbytes, align)

    for name in graph.inputs:
        fixed(name, "input")
    for name in graph.outputs:
        if name not in tensors:
            fixed(name, "output")
    pool = FirstFit(align_up(cursor, align), align)
    members = _concat_members(graph, groups, dtype, in_lmem)
    last_use = _last_use(graph, groups, members)
    for first, last in rerun:
        for name, when in last_use.items():
            if first <= when <= last:
                last_use[name] = last

    layouts = {t: lay for t, lay in TENSOR_LAYOUTS.get(graph, {}).items() if t not in members and t not in tensors}

    def place(name: str) -> None:
        root, offset = alias_root(members, name)
        if root not in tensors:
            shape, stored = graph.tensor(root).shape, stored_dtype(graph, root, dtype)
            nbytes = _count(shape) * ELEMENT_BYTES[stored]
            if root in layouts:
                esize = ELEMENT_BYTES[stored]
                nbytes = c0_blocked_bytes(shape, esize, chip.tile.k_fractal_bytes // esize)
            tensors[root] = DdrTensor(root, pool.alloc(nbytes), shape, stored, "activation", nbytes,
                                      layouts.get(root, ""))
        if name != root:
            shape, stored = graph.tensor(name).shape, stored_dtype(graph, name, dtype)
            tensors[name] = DdrTensor(name, tensors[root].addr + offset, shape, stored, "alias",
                                      _count(shape) * ELEMENT_BYTES[stored])

    for index, group in enumerate(groups):
        if group.kind == "view":
            if group.anchor.outputs[0] not in in_lmem:
                _alias_view(graph, group, tensors)
        else:
            for name in group.stored:
                if name not in tensors and name not in in_lmem:
                    place(name)
        for name in _dying(group, index, last_use, tensors):
            t = tensors[name]
            pool.release(t.addr, t.nbytes)
    scratch_base = align_up(pool.end, align)
    weight_base = align_up(scratch_base + scratch_bytes, 4096)
    if weight_base > chip.core.ddr_bytes:
        raise LoweringError(f"activations need {weight_base} B of DDR, the chip has {chip.core.ddr_bytes} B")
    return DdrPlan(tensors, scratch_base, scratch_bytes, weight_base, members,
                   {t: tensors[t].layout for t in layouts if t in tensors and tensors[t].layout})


ELEMENT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "int32": 4, "int8": 1, "uint8": 1}


def stored_dtype(graph: Graph, name: str, dtype: str) -> str:
    """The DDR dtype of a tensor: a quantized tensor's integer storage ("int8", "uint8", "int32"),
    the program's float `dtype` (--dtype) for every other tensor."""
    quant = graph.tensor(name).quant
    return quant.storage if quant is not None else dtype


def _concat_members(graph: Graph, groups: list[Group], dtype: str,
                    in_lmem: set[str] = frozenset()) -> dict[str, tuple[str, int]]:
    """Concat inputs that can be written straight into their slice of the Concat's output, so the
    Concat copies nothing for them: the output must be one contiguous slice per input (every dim
    before the axis is 1), and the input a runtime activation of its own (not a graph input or
    output, not a view, not used twice by this Concat, not claimed by another Concat)."""
    producer = {t: g for g in groups for n in g.nodes for t in n.outputs}
    members: dict[str, tuple[str, int]] = {}
    for group in groups:
        node = group.anchor
        if node.op_type != "Concat" or len(group.nodes) != 1 or node.outputs[0] in in_lmem:
            continue
        out_shape = graph.tensor(node.outputs[0]).shape
        axis = node.attr("axis") % len(out_shape)
        if any(d != 1 for d in out_shape[:axis]):
            continue
        offset = 0
        for x in node.inputs:
            info = graph.tensor(x)
            slice_bytes = _count(info.shape) * ELEMENT_BYTES[stored_dtype(graph, x, dtype)]
            if (not info.is_const and x not in graph.inputs and x not in graph.outputs and x not in members
                    and node.inputs.count(x) == 1 and x in producer and producer[x].kind != "view"):
                members[x] = (node.outputs[0], offset)
            offset += slice_bytes
    return members


def _indices_only(graph: Graph, name: str) -> bool:
    """An integer graph input read only as Gather indices is kept as int32 in DDR: exact for any
    vocabulary, where the activation dtype is not (fp16 holds integers exactly only to 2048)."""
    users = graph.consumers(name)
    return (graph.tensor(name).dtype.startswith(("int", "uint")) and bool(users)
            and all(u.op_type == "Gather" and u.inputs[1] == name and u.inputs[0] != name for u in users))


def _count(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _alias_view(graph: Graph, group: Group, tensors: dict[str, DdrTensor]) -> None:
    node = group.anchor
    src = tensors.get(node.inputs[0])
    out = node.outputs[0]
    if src is None:
        raise LoweringError(f"node {node.name}: reshape of a tensor with no DDR buffer")
    if out in tensors:         # a graph output: the emitter copies
        return
    shape = graph.tensor(out).shape
    # a view is never an input or output of its own (the functional model feeds and reads those)
    tensors[out] = DdrTensor(out, src.addr, shape, src.dtype, "weight" if src.role == "weight" else "view",
                             src.nbytes)


def _last_use(graph: Graph, groups: list[Group], members: dict[str, tuple[str, int]]) -> dict[str, int]:
    """Index of the last group reading each buffer (views extend the life of their source, Concat
    members the life of the Concat output they live in)."""
    last: dict[str, int] = {}
    view_source: dict[str, str] = {}
    for i, g in enumerate(groups):
        if g.kind == "view":
            src, out = g.anchor.inputs[0], g.anchor.outputs[0]
            view_source[out] = view_source.get(src, src)
        for n in g.nodes:
            for t in n.inputs:
                if t:
                    last[alias_root(members, view_source.get(t, t))[0]] = i
    return last


def _dying(group: Group, index: int, last_use: dict[str, int], tensors: dict[str, DdrTensor]) -> list[str]:
    out = []
    for name, when in last_use.items():
        if when == index and name in tensors and tensors[name].role == "activation":
            out.append(name)
    return sorted(out)
