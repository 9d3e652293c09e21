"""TILE engine: tile-register queues over their LMEM slots, the CUBE's private ACC, and the
blocks TPUSH, TMATMUL / TGEMV (all six functions), ACCCVT (NORM, NZ2ND, NZ2DN, .canon), TMOVE
(the tile buffer's DMA port: its dma.tensor descriptor, executed as the GDMA would) and TIMG2COL (a halo
tile expanded into Zn window tiles).

Operands are read with the slot's in-tile layout (tpuflow.isa.tile): A is Nz with M padded to
fractal_m and K to c0, B is Zn with K padded to r0 and N to fractal_n (c0 = r0 =
k_fractal_bytes / element bytes); only the logical M x K and K x N elements are used, so the
product over k < K does not depend on the padding. The ACC holds an M x N fp32 (int32 for
integer types) matrix; its Nz fractal layout only shows when ACCCVT NORM writes it out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tpuflow.isa.base import Prec
from tpuflow.isa.tile import (AccCvt, TileQueueError, TileQueues, TileSlot, TImg2Col, TMatmul, TMove, TPush,
                              size_bytes)

from tpuflow.hwmodel.functional.errors import ExecutionError
from tpuflow.hwmodel.functional.floats import Round, encode, to_f32
from tpuflow.hwmodel.functional.layouts import dn_offsets, nd_offsets, nz_offsets, round_up, zn_offsets

DT_PREC = {"FP32": Prec.FP32, "FP16": Prec.FP16, "BF16": Prec.BF16, "S8": Prec.INT8, "S32": Prec.INT32}
# ACCCVT round modes; "none" converts like the default (nearest even)
ROUND = {"none": Round.RNE, "RNE": Round.RNE, "RTZ": Round.RTZ, "RDN": Round.RDN, "RUP": Round.RUP,
         "RNA": Round.RNA}


@dataclass
class TileState:
    """Queue replay (which slot each operand names) and the ACC (None once released)."""

    queues: TileQueues
    acc: np.ndarray | None = field(default=None)
    other_accs: dict = field(default_factory=dict)    # TMatmul.acc / AccCvt.acc > 0 -> its ACC (None: released)

    @classmethod
    def for_chip(cls, chip) -> "TileState":
        return cls(TileQueues(chip.tile.queue_slots))


def _step(m, ins) -> tuple[list[TileSlot], list[TileSlot]]:
    try:
        return m.tile.queues.step(ins)
    except TileQueueError as exc:
        raise ExecutionError(str(exc)) from None


def _slot_view(m, slot: TileSlot) -> tuple[int, slice]:
    return m.lmem.lane_bytes(slot.address(m.chip), m.chip.tile.slot_bytes)


def read_tile(m, slot: TileSlot, offsets: np.ndarray, prec: Prec) -> np.ndarray:
    """Stored elements of a tile slot at element `offsets`."""
    lane, span = _slot_view(m, slot)
    elements = m.lmem.data[lane, span].view(prec.storage_dtype)
    if offsets.size and offsets.max() >= elements.size:
        raise ExecutionError(f"tile operand needs {int(offsets.max()) + 1} elements, a slot holds {elements.size}")
    return elements[offsets]


def _operands(m, ins: TMatmul, reads: list[TileSlot], prec: Prec) -> tuple[np.ndarray, np.ndarray]:
    tc = m.chip.tile
    c0 = tc.k_fractal_bytes // prec.bytes
    rows = 1 if ins.is_gemv else ins.m
    a = read_tile(m, reads[0], nz_offsets(rows, ins.k, round_up(max(ins.m, 1), tc.fractal_m), c0), prec)
    b = read_tile(m, reads[1], zn_offsets(ins.k, ins.n, round_up(ins.n, tc.fractal_n), c0), prec)
    return a, b


def _product(a: np.ndarray, b: np.ndarray, prec: Prec) -> np.ndarray:
    if prec.is_float:
        return to_f32(a, prec) @ to_f32(b, prec)
    return (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32)


def _check_acc_size(m, ins: TMatmul, rows: int) -> None:
    tc = m.chip.tile
    need = round_up(rows, tc.fractal_m) * round_up(ins.n, tc.fractal_n) * 4
    if need > size_bytes(ins.acc_size):
        raise ExecutionError(f"{ins.fn}: a {rows}x{ins.n} ACC needs {need} B, acc_size gives {size_bytes(ins.acc_size)} B")


def _get_acc(m, ins) -> np.ndarray | None:
    """The accumulator `ins.acc` names (0: v0.56's implicit ACC)."""
    if ins.acc >= m.chip.tile.acc_buffers:
        raise ExecutionError(f"{type(ins).__name__} names ACC {ins.acc}, the chip has {m.chip.tile.acc_buffers}")
    return m.tile.acc if ins.acc == 0 else m.tile.other_accs.get(ins.acc)


def _set_acc(m, ins, value: np.ndarray | None) -> None:
    if ins.acc == 0:
        m.tile.acc = value
    else:
        m.tile.other_accs[ins.acc] = value


def _accumulate(m, ins: TMatmul, product: np.ndarray) -> np.ndarray:
    acc = _get_acc(m, ins)
    if acc is None:
        raise ExecutionError(f"{ins.fn} accumulates into an ACC that holds nothing (released by ACCCVT?)")
    if acc.shape != product.shape or acc.dtype != product.dtype:
        raise ExecutionError(f"{ins.fn}: ACC holds {acc.shape} {acc.dtype}, the product is {product.shape} {product.dtype}")
    if acc.dtype == np.int32:
        return (acc.astype(np.int64) + product).astype(np.int32)
    return acc + product


def execute_tmatmul(m, ins: TMatmul) -> None:
    reads, _ = _step(m, ins)
    prec = DT_PREC[ins.dt]
    a, b = _operands(m, ins, reads, prec)
    product = _product(a, b, prec)
    if ins.fn.endswith(".BIAS"):
        bias = read_tile(m, reads[2], nd_offsets(1, ins.n), Prec.FP32 if prec.is_float else Prec.INT32)
        product = product + bias
    if ins.accumulates:
        product = _accumulate(m, ins, product)
    _check_acc_size(m, ins, product.shape[0])
    _get_acc(m, ins)
    _set_acc(m, ins, product)


def _cvt_layout(m, ins: AccCvt, elem_bytes: int) -> tuple[np.ndarray, int]:
    """(element offset of every (row, col), elements of the padded image) of ACCCVT's result."""
    tc = m.chip.tile
    if ins.canon and ins.layout != "NORM":
        raise ExecutionError(f"ACCCVT {ins.layout}: .canon only applies to NORM")
    if ins.layout == "NZ2ND":
        return nd_offsets(ins.row, ins.col), ins.row * ins.col
    if ins.layout == "NZ2DN":
        return dn_offsets(ins.row, ins.col), ins.row * ins.col
    c0 = tc.k_fractal_bytes // elem_bytes if ins.canon else tc.fractal_n
    rows_pad = round_up(ins.row, tc.fractal_m)
    return nz_offsets(ins.row, ins.col, rows_pad, c0), rows_pad * round_up(ins.col, c0)


def _acc_values(m, ins: AccCvt) -> np.ndarray:
    acc = _get_acc(m, ins)
    if acc is None:
        raise ExecutionError("ACCCVT reads an ACC that holds nothing (already released?)")
    if (acc.dtype == np.int32) != (ins.src_dt in ("S32", "S8")):
        raise ExecutionError(f"ACCCVT src_dt {ins.src_dt} but the ACC holds {acc.dtype}")
    if ins.row > acc.shape[0] or ins.col > acc.shape[1]:
        raise ExecutionError(f"ACCCVT {ins.row}x{ins.col} is larger than the {acc.shape[0]}x{acc.shape[1]} ACC")
    values = acc[:ins.row, :ins.col]
    return np.maximum(values, 0) if ins.relu else values


def execute_acccvt(m, ins: AccCvt) -> None:
    values = _acc_values(m, ins)
    prec = DT_PREC[ins.dst_dt]
    offsets, elements = _cvt_layout(m, ins, prec.bytes)
    image = np.zeros(elements, prec.storage_dtype)
    image[offsets] = encode(values, prec, ROUND[ins.round_mode], saturate=bool(ins.saturate))
    limit = min(size_bytes(ins.dst_size), m.chip.tile.slot_bytes)
    if image.nbytes > limit:
        raise ExecutionError(f"ACCCVT {ins.layout} {ins.row}x{ins.col} {ins.dst_dt} needs {image.nbytes} B, "
                             f"the destination tile holds {limit} B")
    _, writes = _step(m, ins)
    lane, span = _slot_view(m, writes[0])
    m.lmem.data[lane, span.start:span.start + image.nbytes] = image.view(np.uint8)
    _set_acc(m, ins, None)


def execute_tpush(m, ins: TPush) -> None:
    """The slot was filled by GDMA; the push only advances the queue."""
    _step(m, ins)


def execute_tmove(m, ins: TMove) -> None:
    """The move lands as the GDMA's dma.tensor would; the queues do not change."""
    from tpuflow.hwmodel.functional.gdma import execute_tensor
    execute_tensor(m, ins.desc)


def img2col_window(halo: np.ndarray, ins: TImg2Col) -> np.ndarray:
    """The window matrix rows [k_start * c0, (k_start + k_count) * c0) (K x out_h * out_w) of a halo
    (c1, in_w, in_h, c0): TImg2Col's definition."""
    c1, _, _, c0 = halo.shape
    xs = np.arange(ins.out_w)[None, :] * ins.sx + np.arange(ins.kw)[:, None] * ins.dx     # (j, q)
    ys = np.arange(ins.out_h)[None, :] * ins.sy + np.arange(ins.kh)[:, None] * ins.dy     # (i, r)
    picked = halo[:, xs[:, None, :, None], ys[None, :, None, :], :]                       # (b, j, i, q, r, c)
    win = picked.transpose(0, 2, 1, 5, 4, 3).reshape(c1 * ins.kh * ins.kw * c0, ins.out_h * ins.out_w)
    return win[ins.k_start * c0:(ins.k_start + ins.k_count) * c0]


def execute_timg2col(m, ins: TImg2Col) -> None:
    """Read the halo, write each window tile as a Zn B tile into its slot."""
    chip, prec = m.chip, DT_PREC[ins.dt]
    c0, per_lane = ins.c0(chip), chip.lmem_bytes_per_lane
    lane, span = m.lmem.lane_bytes(ins.src_addr, ins.halo_bytes(chip))
    halo = m.lmem.data[lane, span].view(prec.storage_dtype).reshape(ins.c1, ins.in_w, ins.in_h, c0)
    window = img2col_window(halo, ins)
    n = ins.out_h * ins.out_w
    n_pad, rows = round_up(n, chip.tile.fractal_n), window.shape[0] // ins.tiles
    size = ins.tile_bytes(chip)
    if size > chip.tile.slot_bytes:
        raise ExecutionError(f"TIMG2COL tile of {rows} x {n} needs {size} B, a slot holds {chip.tile.slot_bytes} B")
    for t in range(ins.tiles):
        image = np.zeros(size // prec.bytes, prec.storage_dtype)
        image[zn_offsets(rows, n, n_pad, c0)] = window[t * rows:(t + 1) * rows]
        lane, span = m.lmem.lane_bytes(ins.dst_addr + t * per_lane, size)
        m.lmem.data[lane, span] = image.view(np.uint8)


HANDLERS = {TMatmul: execute_tmatmul, AccCvt: execute_acccvt, TPush: execute_tpush, TMove: execute_tmove,
            TImg2Col: execute_timg2col}
