"""TIMG2COL on the tile buffer's expansion path in an exact timeline (issue 16): the halo's TMOVE on the
DMA port, the TIMG2COL that reads it is handed over at once but its path begins it only when the halo has
landed (the engine goes on with the cube), then it runs img2col_latency + written bytes /
img2col_bytes_per_cycle; the TPUSH of the expanded slots waits for it; blocks retire in order."""

from __future__ import annotations

from test_tile_move_timing import CHIP, slot, tensor_dma
from tpuflow.chip import replace_param
from tpuflow.hwmodel.timing import simulate
from tpuflow.hwmodel.timing.cost import instruction_cycles
from tpuflow.hwmodel.timing.synthetic import ProgramBuilder
from tpuflow.isa import TImg2Col, TMatmul, TMove, TPush, global_lmem_address, size_code, tile_ref

HALO = 3 * 58 * 16 * 2           # one channel block (16 fp16) of 3 rows x 58 columns: 5568 B
EXPAND = TImg2Col(dt="FP16", src_addr=CHIP.tile_slot_address(3, 0), dst_addr=CHIP.tile_slot_address(1, 0), c1=1, in_h=3,
                  in_w=58, kh=3, kw=3, out_h=1, out_w=56, k_start=0, k_count=9, tiles=3)


def _program(chip=CHIP):
    """T1 TPUSH T, T2 TMOVE halo LMEM -> N slot 0, T3 TIMG2COL N slot 0 -> U slots 0..2 (3 taps each),
    T4 TMATMUL 64 x 64 x 32 on T#1 (touches neither), T5 TPUSH U x3 (the expanded slots)."""
    b = ProgramBuilder(chip)
    b.add(TPush(dst_queue=0, dst_size=size_code(4096), dt="FP16"))
    b.add(TMove(desc=tensor_dma(global_lmem_address(0, chip), slot(3, 0), HALO)))
    b.add(EXPAND)
    b.add(TMatmul(fn="TMATMUL", dt="FP16", m=64, n=64, k=32, src0=tile_ref("T", 1), src1=tile_ref("T", 1), reuse0=1,
                  acc_size=size_code(64 * 64 * 4)))
    b.add(TPush(dst_queue=1, dst_size=size_code(6144), dt="FP16", count=3))
    return b.build()


def test_the_expansion_waits_for_its_halo_and_runs_beside_the_cube():
    """At 1 GHz: the move takes 64 + ceil(5568 / 256) = 86 cycles; the TIMG2COL (reads the halo) starts when
    it lands and takes 32 + 3 x 48 x 64 x 2 / 256 = 104 cycles; the TMATMUL is handed the engine 2 cycles
    later (block_overhead), runs its 50 cycles meanwhile and retires with the TIMG2COL; the TPUSH of the
    three expanded slots starts when they are written and takes 2 cycles."""
    r = simulate(_program())
    move, expand, matmul, push = (r.index("tile", k) for k in (2, 3, 4, 5))
    t0 = int(r.times["start"][move])
    assert int(r.times["end"][move]) == t0 + 86_000
    assert (int(r.times["start"][expand]), int(r.times["end"][expand])) == (t0 + 86_000, t0 + 190_000)
    assert (int(r.times["start"][matmul]), int(r.times["end"][matmul])) == (t0 + 4_000, t0 + 190_000)
    assert (int(r.times["start"][push]), int(r.times["end"][push])) == (t0 + 190_000, t0 + 192_000)
    assert instruction_cycles(EXPAND, CHIP) == 104 and EXPAND.tile_bytes(CHIP) == 6144


def test_the_expansion_rate_is_the_chip_files():
    """Half the expansion bandwidth: 32 + 18432 / 128 = 176 cycles."""
    chip = replace_param(CHIP, "tile.img2col_bytes_per_cycle", 128)
    r = simulate(_program(chip))
    expand = r.index("tile", 3)
    assert int(r.times["end"][expand]) - int(r.times["start"][expand]) == 176_000
