"""Paired output tiles in the TILE conv (issue 16): an implicit-GEMM conv whose weight panel cannot stay
resident (K tiles > queue_slots) runs its pixel tiles two by two in ACCs 0 and 1, so each weight tile
crosses the tile buffer's DMA port once per pair, not once per pixel tile; numerics against onnxruntime."""

from __future__ import annotations

import pytest
from onnx_build import ModelBuilder

from tpuflow.hwmodel.timing.segments import transfer_sides
from tpuflow.isa import AccCvt, TMatmul, TMove, global_lmem_address
from tpuflow.lowering.ops.tile_gemm import TileGemm
from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model, verify

pytestmark = pytest.mark.usefixtures("convs_on_the_cube")


def _conv(cin: int, cout: int, hw: int):
    b = ModelBuilder(seed=cin + hw)
    x = b.node("Neg", [b.input("x", [1, cin, hw, hw])], "nx")
    y = b.node("Conv", [x, b.weight("w", [cout, cin, 3, 3]), b.weight("b", [cout], 0.5)], "c", pads=[1, 1, 1, 1])
    b.output(b.node("Relu", [y], "r"))
    return b.model()


def _weight_bytes_moved(program) -> int:
    """Bytes the tile buffer's DMA port writes into the T queue's slots (the conv's weight tiles)."""
    chip = program.chip
    t_slots = {global_lmem_address(chip.tile_slot_address(0, i), chip) for i in range(chip.tile.queue_slots)}
    return sum(transfer_sides(i.desc, chip)[1].nbytes for i in program.tile
               if isinstance(i, TMove) and i.desc.dst_start_addr in t_slots)


def test_pairs_halve_the_weight_tiles_moved(monkeypatch):
    """256 -> 64 3x3 on 16 x 16 (K = 2304: 48 K tiles, four pixel tiles of four output rows): the paired
    program moves half the weight bytes of one that takes the pixel tiles one by one, and its second
    tile of each pair works in ACC 1."""
    model = _conv(256, 64, 16)
    _, paired = compile_model(model, None, CompileOptions(dtype="fp16", matmul="tile"))
    monkeypatch.setattr(TileGemm, "_pairable", lambda self: False)
    _, single = compile_model(model, None, CompileOptions(dtype="fp16", matmul="tile"))
    assert _weight_bytes_moved(paired) * 2 == _weight_bytes_moved(single) > 0
    assert {i.acc for i in paired.tile if isinstance(i, (TMatmul, AccCvt))} == {0, 1}
    assert {i.acc for i in single.tile if isinstance(i, (TMatmul, AccCvt))} == {0}
    assert sum(isinstance(i, AccCvt) for i in paired.tile) == sum(isinstance(i, AccCvt) for i in single.tile)


@pytest.mark.parametrize("dtype,hw", [("fp16", 14), ("fp32", 12), ("bf16", 16)])
def test_paired_conv_matches_onnxruntime(dtype, hw):
    """Even and odd pixel tile counts (a lone last tile in ACC 0), race detector on."""
    model = _conv(256, 48, hw)
    _, program = compile_model(model, None, CompileOptions(dtype=dtype, matmul="tile"))
    assert any(isinstance(i, TMatmul) and i.acc == 1 for i in program.tile)
    result = verify(model, None, CompileOptions(dtype=dtype, matmul="tile"), race_check=True)
    assert result["ok"], result["outputs"]


def _ddr_to_tile_dmas(program) -> int:
    """GDMA commands from DDR into the tile buffer."""
    chip, count = program.chip, 0
    for instr in program.gdma:
        try:
            src, dst = transfer_sides(instr, chip)
        except TypeError:
            continue
        count += src is not None and not src.lmem and dst.lmem and chip.in_tile_buffer(dst.addr)
    return count


def _pointwise(cin: int, cout: int, hw: int):
    b = ModelBuilder(seed=cout + hw)
    x = b.node("Neg", [b.input("x", [1, cin, hw, hw])], "nx")
    y = b.node("Conv", [x, b.weight("w", [cout, cin, 1, 1]), b.weight("b", [cout], 0.5)], "c")
    b.output(b.node("Relu", [y], "r"))
    return b.model()


def test_streamed_row_bias_pairs_come_from_the_lmem_copies(monkeypatch):
    """A 1x1 256 -> 1024 conv on 14 x 14 keeps its B panel resident, so every output tile has another
    row bias pair: the pairs are staged in LMEM once and reach their N slots by moves on the tile
    buffer's port, no DDR -> tile DMA (without the copies: one per batch); onnxruntime agrees."""
    model = _pointwise(256, 1024, 14)
    options = CompileOptions(dtype="fp16", matmul="tile")
    _, program = compile_model(model, None, options)
    assert _ddr_to_tile_dmas(program) == 0
    assert verify(model, None, options, race_check=True)["ok"]
    monkeypatch.setattr(TileGemm, "_load_cached", lambda self, queue, op, blocks: self._load_blocks(queue, op, blocks))
    _, from_ddr = compile_model(model, None, options)
    assert _ddr_to_tile_dmas(from_ddr) > 0


def test_staged_weight_chunks_sit_in_dependency_chunks_of_their_own():
    """128 x 2304 weights (two staging DMAs of 64 lanes): each lands in an LMEM dependency chunk of its
    own, so the first move out of the first one waits for it alone, not for the one loaded ahead."""
    model = _conv(256, 128, 14)
    _, program = compile_model(model, None, CompileOptions(dtype="fp16", matmul="tile"))
    chip = program.chip
    stages = []
    for index, instr in enumerate(program.gdma):
        try:
            src, dst = transfer_sides(instr, chip)
        except TypeError:
            continue
        if src is not None and not src.lmem and dst.lmem and not chip.in_tile_buffer(dst.addr) \
                and dst.shape[0] == dst.shape[2] == 1 and dst.shape[3] > 1024:     # tiles of 64 x 48
            stages.append((index + 1, dst.addr % chip.lmem_bytes_per_lane))
    assert len(stages) == 2
    chunks = [offset // chip.chunk_bytes_per_lane for _, offset in stages]
    assert chunks[0] != chunks[1]
    first_move = next(i for i in program.tile if isinstance(i, TMove) and not chip.in_tile_buffer(i.desc.src_start_addr)
                      and i.desc.src_start_addr % chip.lmem_bytes_per_lane // chip.chunk_bytes_per_lane == chunks[0])
    assert stages[0][0] <= first_move.wait_gdma_id < stages[1][0]
