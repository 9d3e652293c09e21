"""DDR placement: graph inputs and outputs, activations with reuse of dead space (first fit over
lifetimes), views aliasing their source, one scratch area, then the weight image."""

from __future__ import annotations

from dataclasses import dataclass

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


def plan_ddr(graph: Graph, groups: list[Group], chip: ChipConfig, dtype: str, scratch_bytes: int) -> DdrPlan:
    align = chip.core.ddr_align_bytes
    esize = {"fp32": 4, "fp16": 2, "bf16": 2}[dtype]
    tensors: dict[str, DdrTensor] = {}
    cursor = 0

    def fixed(name: str, role: str) -> None:
        nonlocal cursor
        shape = graph.tensor(name).shape
        nbytes = _count(shape) * esize
        tensors[name] = DdrTensor(name, cursor, shape, dtype, role, nbytes)
        cursor = align_up(cursor + nbytes, align)

    for name in graph.inputs:
        fixed(name, "input")
    for name in graph.outputs:
        if name not in tensors:
            fixed(name, "output")
    pool = FirstFit(align_up(cursor, align), align)
    last_use = _last_use(graph, groups)
    for index, group in enumerate(groups):
        if group.kind == "view":
            _alias_view(graph, group, tensors)
        else:
            for name in group.stored:
                if name in tensors:
                    continue
                shape = graph.tensor(name).shape
                nbytes = _count(shape) * esize
                tensors[name] = DdrTensor(name, pool.alloc(nbytes), shape, dtype, "activation", nbytes)
        for name in _dying(group, index, last_use, tensors):
            t = tensors[name]
            pool.release(t.addr, t.nbytes)
    scratch_base = align_up(pool.end, align)
    weight_base = align_up(scratch_base + scratch_bytes, 4096)
    if weight_base > chip.core.ddr_bytes:
        raise LoweringError(f"activations need {weight_base} B of DDR, the chip has {chip.core.ddr_bytes} B")
    return DdrPlan(tensors, scratch_base, scratch_bytes, weight_base)


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
    tensors[out] = DdrTensor(out, src.addr, shape, src.dtype, "view" if src.role == "activation" else src.role,
                             src.nbytes)


def _last_use(graph: Graph, groups: list[Group]) -> dict[str, int]:
    """Index of the last group reading each tensor (views extend the life of their source)."""
    last: dict[str, int] = {}
    alias_root: dict[str, str] = {}
    for i, g in enumerate(groups):
        if g.kind == "view":
            src, out = g.anchor.inputs[0], g.anchor.outputs[0]
            alias_root[out] = alias_root.get(src, src)
        for n in g.nodes:
            for t in n.inputs:
                if t:
                    root = alias_root.get(t, t)
                    last[root] = i
    return last


def _dying(group: Group, index: int, last_use: dict[str, int], tensors: dict[str, DdrTensor]) -> list[str]:
    out = []
    for name, when in last_use.items():
        if when == index and name in tensors and tensors[name].role == "activation":
            out.append(name)
    return sorted(out)
