"""Gather with runtime indices (embedding lookups): the indices are loaded into one lane, made
non-negative and converted to uint32 on the TIU, and one gdma.gather per block of indices copies
the selected rows straight from the table to the output."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tpuflow.errors import LoweringError
from tpuflow.isa import GatherDma, Prec, global_lmem_address
from tpuflow.lowering.context import LowerCtx
from tpuflow.lowering.lmem import GroupArena
from tpuflow.lowering.ops.lmem_move import LmemTiling, allocate
from tpuflow.lowering.tensors import DRegion, make_tile, tile_bytes_per_lane
from tpuflow.lowering.tiling import steps

INDEX_BLOCK = 4096          # indices converted and gathered per block (one lane, uint32)
MAX_ROW = 65535             # src_wsize / csize are 16-bit descriptor fields
BUFFERS = ["indices", "as_fp32", "wrapped", "selected", "index"]   # one set, in allocation order


@dataclass(frozen=True)
class GatherTiling(LmemTiling):
    """Indices per block; the one buffer set (BUFFERS: the raw indices, three fp32 scratch rows
    and the uint32 indices the DMA reads)."""

    block: int


@dataclass(frozen=True)
class RuntimeGather:
    """A Gather node with runtime indices as a table lookup: dst[o, n, :] = table[o, idx[n], :]."""

    outer: int
    rows: int
    inner: int
    count: int
    index_prec: Prec | None      # INT32 when the DDR plan keeps the indices as int32, else the activations'


def runtime_gather(ctx: LowerCtx, node) -> RuntimeGather:
    """The lookup of a Gather node whose indices are a runtime tensor."""
    x_shape = ctx.graph.tensor(node.inputs[0]).shape
    axis = node.attr("axis", 0)
    stored = ctx.ddr.tensors[node.inputs[1]].dtype
    return RuntimeGather(math.prod(x_shape[:axis]), x_shape[axis], math.prod(x_shape[axis + 1:]),
                         math.prod(ctx.graph.tensor(node.inputs[1]).shape), Prec.INT32 if stored == "int32" else None)


def plan_gather(arena: GroupArena, label: str, lookup: RuntimeGather, prec: Prec) -> GatherTiling | None:
    """The index buffers of gather_rows, None when they do not fit; rows the DMA descriptor
    cannot describe are an error."""
    if lookup.inner > MAX_ROW or lookup.outer > MAX_ROW:
        raise LoweringError(f"node {label}: gather rows of {lookup.inner} elements x {lookup.outer} exceed the DMA size fields")
    iprec = lookup.index_prec or prec
    block = min(lookup.count, INDEX_BLOCK)
    raw_b = tile_bytes_per_lane(arena.chip, (1, 1, 1, block), iprec if iprec.is_float else Prec.FP32)
    f32_b = tile_bytes_per_lane(arena.chip, (1, 1, 1, block), Prec.FP32)
    sets = allocate(arena, [raw_b] + [f32_b] * 4, BUFFERS, max_copies=1)
    return None if sets is None else GatherTiling(sets, block)


def gather_rows(ctx: LowerCtx, tiling: GatherTiling, table: int, lookup: RuntimeGather, indices: int, dst: int) -> None:
    """dst[o, n, :] = table[o, idx[n], :] for o < outer, n < count; table (outer, rows, inner),
    dst (outer, count, inner), idx the `count` values at DDR `indices`, stored in the lookup's
    index_prec (negative values count from the end, as ONNX Gather's). Float-stored indices are
    exact up to 2**24 (fp32), 2048 (fp16), 256 (bf16)."""
    chip, em, prec = ctx.chip, ctx.em, ctx.prec
    outer, rows, inner, count = lookup.outer, lookup.rows, lookup.inner, lookup.count
    iprec = lookup.index_prec or prec
    raw_off, a_off, b_off, c_off, i_off = tiling.sets[0]
    for n0, n in steps(count, tiling.block):
        shape = (1, 1, 1, n)
        index = make_tile(chip, i_off, shape, Prec.FP32).as_prec(Prec.INT32)     # same 4-byte layout
        if iprec.is_float:
            raw = make_tile(chip, raw_off, shape, iprec)
            a, b, c = (make_tile(chip, off, shape, Prec.FP32) for off in (a_off, b_off, c_off))
            em.load(raw, DRegion(indices + n0 * iprec.bytes, shape, (n, n, n, 1), iprec))
            em.ar("copy", a, raw)
            em.ar("add", b, a, float(rows))
            em.cmp("sel_lt", c, a, 0.0, b, a)                  # negative: count from the end
            em.ar("cast", index, c, round_mode=0)
        else:
            raw = make_tile(chip, raw_off, shape, Prec.FP32).as_prec(Prec.INT32)
            b = make_tile(chip, b_off, shape, Prec.FP32).as_prec(Prec.INT32)
            em.load(raw, DRegion(indices + n0 * 4, shape, (n, n, n, 1), Prec.INT32))
            em.ar("add", b, raw, int(rows))
            em.cmp("sel_lt", index, raw, 0, b, raw)
        em.gdma(GatherDma(src_start_addr=table, dst_start_addr=dst + n0 * inner * prec.bytes,
                          index_start_addr=global_lmem_address(index.addr, chip),
                          src_csize=outer, src_hsize=rows, src_wsize=inner, src_cstride=rows * inner,
                          src_hstride=inner, dst_cstride=count * inner, dst_hstride=inner,
                          index_csize=1, index_hsize=n, index_cstride=0,
                          dst_csize=outer, dst_hsize=n, dst_wsize=inner, src_data_format=int(prec)))
