"""Two output tiles accumulating interleaved in ACCs 0 and 1 (TMatmul.acc / AccCvt.acc, issue 16) in an
exact timeline: the n-th TMATMUL that starts a fresh ACC waits for ACCCVT number n - acc_buffers, so the
second pair's second fresh start waits for the first pair's second drain (not only its first)."""

from __future__ import annotations

from test_tile_move_timing import CHIP
from tpuflow.hwmodel.timing import simulate
from tpuflow.hwmodel.timing.synthetic import ProgramBuilder
from tpuflow.isa import AccCvt, TMatmul, TPush, size_code, tile_ref


def _two_pairs() -> list[tuple[int, int]]:
    """T1 TPUSH T; then two pairs, each MM(ACC0) MM(ACC1) (64 x 64 x 32, fresh: 2 + 32 + 16 = 50 cycles)
    and CVT(ACC0) CVT(ACC1) (64 x 64: 2 + 64 = 66 cycles). (start, end) in ns of T2..T9."""
    b = ProgramBuilder(CHIP)
    b.add(TPush(dst_queue=0, dst_size=size_code(4096), dt="FP16"))
    for _ in range(2):
        for acc in (0, 1):
            b.add(TMatmul(fn="TMATMUL", dt="FP16", m=64, n=64, k=32, src0=tile_ref("T", 1), src1=tile_ref("T", 1),
                          reuse0=1, reuse1=1, acc_size=size_code(64 * 64 * 4), acc=acc))
        for acc in (0, 1):
            b.add(AccCvt(layout="NZ2ND", row=64, col=64, dst_queue=2, dst_size=size_code(8192), dst_dt="FP16", acc=acc))
    r = simulate(b.build())
    return [(int(r.times["start"][r.index("tile", k)]) // 1000, int(r.times["end"][r.index("tile", k)]) // 1000)
            for k in range(2, 10)]


def test_the_second_pair_waits_for_the_drain_of_its_own_acc():
    """MM0 10-60, MM1 streams behind it (starts when MM0's body ends: 60 - 32 fill = 28; ends 78); CVT0
    after the cube's last block (78-144), CVT1 on the drain path after it (144-210); MM0' takes ACC 0,
    free when CVT0 ends (144; own end 194, retired in order at 210); MM1' takes ACC 1, free when CVT1
    ends (210-260); CVT0' after the cube (260-326), CVT1' (326-392). With the old rule (the drain two
    back at dispatch) MM1' would have waited only for CVT0 and started at 162."""
    assert _two_pairs() == [(10, 60), (28, 78), (78, 144), (144, 210), (144, 210), (210, 260), (260, 326),
                            (326, 392)]
