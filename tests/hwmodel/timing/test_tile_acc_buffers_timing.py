"""Two accumulators (tile.acc_buffers = 2, issue 16) in an exact timeline: an ACCCVT drains its ACC on
its own path while the cube streams the next output tile into the other one; a TMATMUL starting a
fresh ACC waits until the ACCCVT two conversions back has drained the buffer it takes; with one ACC
every TMATMUL waits for the ACCCVT before it."""

from __future__ import annotations

from test_tile_move_timing import CHIP
from tpuflow.chip import replace_param
from tpuflow.hwmodel.timing import simulate
from tpuflow.hwmodel.timing.synthetic import ProgramBuilder
from tpuflow.isa import AccCvt, TMatmul, TPush, size_code, tile_ref


def _three_tiles(buffers: int) -> list[tuple[int, int]]:
    """T1 TPUSH T; then three output tiles, each a TMATMUL 64 x 64 x 32 (T#1 . T#1, fresh ACC: 2 + 32 +
    16 = 50 cycles) and an ACCCVT 64 x 64 (2 + 64 * 64 * 4 / 256 = 66 cycles). (start, end) in ns of T2..T7."""
    chip = replace_param(CHIP, "tile.acc_buffers", buffers)
    b = ProgramBuilder(chip)
    b.add(TPush(dst_queue=0, dst_size=size_code(4096), dt="FP16"))
    for _ in range(3):
        b.add(TMatmul(fn="TMATMUL", dt="FP16", m=64, n=64, k=32, src0=tile_ref("T", 1), src1=tile_ref("T", 1),
                      reuse0=1, reuse1=1, acc_size=size_code(64 * 64 * 4)))
        b.add(AccCvt(layout="NZ2ND", row=64, col=64, dst_queue=2, dst_size=size_code(8192), dst_dt="FP16"))
    r = simulate(b.build())
    return [(int(r.times["start"][r.index("tile", k)]) // 1000, int(r.times["end"][r.index("tile", k)]) // 1000)
            for k in range(2, 8)]


def test_one_acc_serialises_matmul_and_drain():
    """Each block starts when the one before ends: 10-60, 60-126, 126-176, 176-242, 242-292, 292-358."""
    assert _three_tiles(1) == [(10, 60), (60, 126), (126, 176), (176, 242), (242, 292), (292, 358)]


def test_two_accs_drain_beside_the_cube():
    """MM1 10-60; CVT1 waits for MM1's results (60-126); the engine hands it over in 2 cycles and MM2
    streams behind MM1 (starts when MM1's body ends, 60 - 32 fill = 28, + 2 = 30; own end 80, retired
    in order at 126); CVT2 waits for the drain path (126-192); MM3 takes MM1's ACC, free when CVT1 ends
    (126; own end 176, retired at 192); CVT3 after CVT2 (192-258): 100 ns sooner than with one ACC."""
    assert _three_tiles(2) == [(10, 60), (60, 126), (30, 126), (126, 192), (126, 192), (192, 258)]
