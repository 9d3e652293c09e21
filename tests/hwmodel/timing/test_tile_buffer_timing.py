"""The tile buffer's DMA port (tile.buffer_chunk_bytes): a GDMA fill of a tile slot costs its bytes
in chunks whatever fractal order it scatters into (ND -> Nz / Zn in flight), an exact timeline of
one Nz fill + TPUSH + TMATMUL, and buffer_chunk_bytes = 0 bringing back the per-piece LMEM side."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tpuflow.chip import load_chip, replace_param
from tpuflow.hwmodel.timing import simulate
from tpuflow.hwmodel.timing.compute import tile_cycles
from tpuflow.hwmodel.timing.cost import gdma_cycles
from tpuflow.hwmodel.timing.segments import relative_bursts, transfer_sides
from tpuflow.hwmodel.timing.synthetic import ProgramBuilder, copy_bytes
from tpuflow.isa import Prec, TensorDma, TMatmul, TPush, global_lmem_address, size_code, tile_ref

CHIP = load_chip("sg2260")
PLAIN = replace_param(CHIP, "tile.buffer_chunk_bytes", 0)
FP16 = int(Prec.FP16)


def dma(chip, src: int, dst: int, shape, src_strides, dst_strides) -> TensorDma:
    f = {}
    for side, strides in (("src", src_strides), ("dst", dst_strides)):
        for axis, size, stride in zip("nchw", shape, strides):
            f[f"{side}_{axis}size"], f[f"{side}_{axis}stride"] = size, stride
    return TensorDma(src_start_addr=src, dst_start_addr=dst, src_data_format=FP16, **f)


def nz_fill(chip, rows: int, cols: int, row_stride: int, slot: int = 0) -> TensorDma:
    """A rows x cols fp16 block of a row-major DDR matrix at 0 into tile slot T[slot] as Nz, walking
    the source rows (n = row, h = K0 chunk, w = element): the lowering's RowsOperand order."""
    k0 = chip.tile.k_fractal_bytes // 2
    rows_pad = -(-rows // chip.tile.fractal_m) * chip.tile.fractal_m
    addr = global_lmem_address(chip.tile_slot_address(0, slot), chip)
    return dma(chip, 0, addr, (rows, 1, cols // k0, k0), (row_stride, 0, k0, 1), (k0, 0, rows_pad * k0, 1))


def test_the_tile_window_is_the_buffer_and_nothing_else_is():
    slot = CHIP.tile_slot_address(3, 15)
    assert CHIP.in_tile_buffer(slot) and CHIP.in_tile_buffer(CHIP.tile_slot_address(0, 0))
    assert not CHIP.in_tile_buffer(CHIP.tile_window_offset - 1)
    assert not PLAIN.in_tile_buffer(slot)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 8), st.integers(1, 4), st.integers(0, 3))
def test_a_slot_side_costs_its_bytes_in_chunks_whatever_its_order(row_blocks, chunks, extra):
    """The slot side of an Nz scatter (32 B pieces k0 apart per row) is cut exactly like a
    contiguous side of the same bytes: nbytes / buffer_chunk_bytes chunks (last one partial)."""
    rows, cols = 16 * row_blocks, 16 * chunks
    instr = nz_fill(CHIP, rows, cols, cols + 16 * extra)
    _, dst = transfer_sides(instr, CHIP)
    bursts, _ = relative_bursts(dst, CHIP, CHIP.gdma.bus_bytes * CHIP.gdma.max_burst_beats)
    nbytes = rows * cols * 2
    chunk = CHIP.tile.buffer_chunk_bytes
    assert int(bursts.size.sum()) == nbytes and len(bursts) == -(-nbytes // chunk)
    assert int(bursts.size.max()) <= chunk
    plain, _ = relative_bursts(transfer_sides(instr, PLAIN)[1], PLAIN, PLAIN.gdma.bus_bytes * PLAIN.gdma.max_burst_beats)
    assert len(plain) == rows * chunks          # without the buffer: one 32 B piece per row and chunk


def test_a_column_scatter_from_ddr_rows_costs_what_a_contiguous_fill_costs():
    """A 64 x 64 fp16 Nz tile read as 64 DDR rows of 128 B (row stride 256 elements): through the
    buffer the cost model charges exactly a contiguous-destination DMA of those rows; read the slot's
    way (K0 pieces, chunk-major) it costs the 32 B DDR pieces and is several times dearer."""
    scatter = nz_fill(CHIP, 64, 64, 256)
    slot = global_lmem_address(CHIP.tile_slot_address(0, 0), CHIP)
    dense = dma(CHIP, 0, slot, (64, 1, 4, 16), (256, 0, 16, 1), (64, 0, 16, 1))
    slot_order = dma(CHIP, 0, slot, (4, 1, 64, 16), (16, 0, 256, 1), (64 * 16, 0, 16, 1))
    assert gdma_cycles(scatter, CHIP) == gdma_cycles(dense, CHIP)
    assert gdma_cycles(slot_order, CHIP) > 4 * gdma_cycles(scatter, CHIP)


def test_one_tile_fill_and_one_tmatmul_exact_timeline():
    """GDMA 1: dma.general of 4096 B from DDR 0 into slot T[0] (the tile window), TPUSH T, then
    TMATMUL 64 x 64 x 32 fp16 reading T#1 as both operands (timing only); sg2260, per-burst memory.

    GDMA 1's read side is test_timing_gdma's 4096 B load exactly (dispatch 10 ns, 8 bursts of
    512 B on UMC 0): the data of the 8th burst are in at 1067 ns. Its slot side is 16 chunks of
    buffer_chunk_bytes = 256 B (2 bus beats each) on the LMEM write port: the last two chunks both
    wait for the 8th burst (ready at 1067), hold the port 2 cycles each (1067..1071), + LMEM latency
    29 ns -> end 1100 ns, the same as outside the window (there the last write is one 4-beat burst).
    TPUSH waits for GDMA 1 (tdma_sync_id = 1 at 1100 ns), starts on that 1 GHz tile-clock edge and
    lasts block_overhead = 2 cycles -> 1102 ns. TMATMUL follows in order: ceil(64/16) * ceil(64/16)
    * ceil(32/16) = 32 fractal steps of 16 x 16 x 16 MACs = 131072 MACs at 8192 MAC/cycle = 16
    cycles, + block_overhead 2 + fill_latency 32 = 50 cycles -> 1102 .. 1152 ns."""
    b = ProgramBuilder(CHIP)
    b.add(copy_bytes(CHIP, 0, CHIP.tile_slot_address(0, 0), 4096, dst_lmem=True))
    b.add(TPush(dst_queue=0, dst_size=size_code(4096), dt="FP16"))
    mm = TMatmul(fn="TMATMUL", dt="FP16", m=64, n=64, k=32, src0=tile_ref("T", 1), src1=tile_ref("T", 1),
                 reuse0=1, acc_size=size_code(64 * 64 * 4))
    b.add(mm)
    r = simulate(b.build(), memory="burst")
    fill, push, matmul = r.index("gdma", 1), r.index("tile", 1), r.index("tile", 2)
    assert (int(r.times["dispatch"][fill]), int(r.times["end"][fill])) == (10_000, 1_100_000)
    assert (int(r.times["start"][push]), int(r.times["end"][push])) == (1_100_000, 1_102_000)
    assert (int(r.times["start"][matmul]), int(r.times["end"][matmul])) == (1_102_000, 1_152_000)
    assert tile_cycles(mm, CHIP) == 2 + 32 + 16
    outside = ProgramBuilder(CHIP)
    outside.add(copy_bytes(CHIP, 0, 0, 4096, dst_lmem=True))
    assert int(simulate(outside.build(), memory="burst").times["end"][0]) == 1_100_000


def test_a_scattered_fill_simulates_like_a_dense_one_of_the_same_ddr_rows():
    """The simulator agrees with the cost model: a 64 x 64 fp16 Nz fill read as DDR rows ends
    exactly when the same rows written densely into the window end; without the buffer the
    scatter (32 B pieces on the LMEM port) ends later."""
    slot = global_lmem_address(CHIP.tile_slot_address(0, 0), CHIP)
    ends = []
    for chip, instr in ((CHIP, nz_fill(CHIP, 64, 64, 256)),
                        (CHIP, dma(CHIP, 0, slot, (64, 1, 4, 16), (256, 0, 16, 1), (64, 0, 16, 1))),
                        (PLAIN, nz_fill(PLAIN, 64, 64, 256))):
        b = ProgramBuilder(chip)
        b.add(instr)
        ends.append(int(simulate(b.build(), memory="burst").times["end"][0]))
    assert ends[0] == ends[1] < ends[2]
