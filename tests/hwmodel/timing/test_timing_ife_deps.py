"""IFE back-pressure and dependency timelines: full TIU command FIFO, TIU->GDMA waits, the check stage,
auto mode, TILE synchronisation, deadlock reports, determinism."""

import dataclasses

import pytest

from tpuflow.chip import load_chip, replace_param
from tpuflow.errors import DeadlockError
from tpuflow.hwmodel.timing import DependencyCheckError, simulate
from tpuflow.hwmodel.timing.synthetic import ProgramBuilder, ar, copy_bytes, load, store
from tpuflow.isa import TILE_WAIT_TAG, AccCvt, SysDma, TMatmul, TPush, tile_ref
from tpuflow.program import Program

CHIP = load_chip("sg2260")
SHAPE = (1, 64, 16, 16)


def fifo_program(chip):
    """D1 loads 256 KiB into LMEM offset 0 (about 4.5 us); B1..B300 are small adds reading it (each waits
    for D1); D2, issued last, is an independent load."""
    b = ProgramBuilder(chip)
    b.add(load(chip, 0, 0, (1, 64, 32, 32)))
    for _ in range(300):
        b.add(ar("add", 0x8000, 0x0, None, (1, 64, 1, 16), b_const=0))
    b.add(load(chip, 1 << 20, 0x20000, (1, 64, 1, 16)))
    return b.build()


def test_ife_stalls_when_the_tiu_command_fifo_is_full():
    """The TIU command list holds 32768 B = 256 long (128 B) descriptors. B1 cannot start before D1 ends
    (E), so B1..B256 fill the list, B257 waits at the head of the TIU request FIFO, B258 sits behind it
    (depth 2) and B259 cannot leave the issue stage: the in-order IFE stops. At E the TIU takes B1, B257
    moves into the freed 128 B, the request FIFO has room and B259 issues at exactly E. D2, behind all
    TIU instructions, is held too; with a 1 MiB command list it issues long before E."""
    r = simulate(fifo_program(CHIP))
    end_d1 = int(r.times["end"][r.index("gdma", 1)])
    b259 = r.index("tiu", 259)
    assert int(r.times["issue"][b259]) == end_d1
    assert int(r.times["dispatch"][r.index("tiu", 1)]) == end_d1
    assert int(r.times["transfer"][r.index("tiu", 257)]) == end_d1 + 1_000
    assert int(r.stalls["fifo_full"][b259]) > 0
    assert all(int(r.stalls["fifo_full"][r.index("tiu", k)]) == 0 for k in range(1, 257))
    assert int(r.times["issue"][r.index("gdma", 2)]) > end_d1
    roomy = simulate(fifo_program(replace_param(CHIP, "ife.tiu_cmd_fifo_bytes", 1 << 20)))
    assert int(roomy.times["issue"][roomy.index("gdma", 2)]) < end_d1
    assert int(roomy.stalls["fifo_full"].sum()) == 0


def test_tiu_to_gdma_dependency_delays_the_gdma_by_the_tiu_completion():
    """B1 (add, alone: ends at 44 ns, see test_timing_tiu) writes 0x8000; D1 stores it (cmd_id_dep = 1).
    D1 is received after B1 (4 + 3 TXI words: txi_acq 7 ns, check 12, issue 13) and is in the GDMA list
    at 14 ns; it dispatches exactly at 44 ns, and its dependency stall is 44 - 14 = 30 ns."""
    b = ProgramBuilder(CHIP)
    b.add(ar("add", 0x8000, 0x0, 0x4000, SHAPE))
    b.add(store(CHIP, 0x8000, 1 << 20, SHAPE))
    r = simulate(b.build())
    d1 = r.index("gdma", 1)
    assert int(r.cmd_id_dep[d1]) == 1
    assert int(r.times["end"][r.index("tiu", 1)]) == 44_000
    assert int(r.times["transfer"][d1]) == 14_000
    assert int(r.times["dispatch"][d1]) == 44_000
    assert int(r.stalls["dependency"][d1]) == 30_000


def test_check_stage_flags_a_wrong_cmd_id_dep():
    """An add reading what D1 loads but compiled with cmd_id_dep = 0: the check stage derives D1."""
    b = ProgramBuilder(CHIP)
    b.add(load(CHIP, 0, 0, SHAPE))
    b.add(ar("add", 0x8000, 0x0, 0x4000, SHAPE), dep=0)
    with pytest.raises(DependencyCheckError, match=r"B1 cmd_id_dep=D0, bitmaps give D1"):
        simulate(b.build())
    # an over-eager wait is a disagreement too, and check=False simulates it as compiled
    b = ProgramBuilder(CHIP)
    b.add(load(CHIP, 0, 0x30000, SHAPE))   # lane offset 192 KiB: no chunk in common
    b.add(ar("add", 0x8000, 0x0, 0x4000, SHAPE), dep=1)
    with pytest.raises(DependencyCheckError, match=r"B1 cmd_id_dep=D1, bitmaps give D0"):
        simulate(b.build())
    assert simulate(b.build(), check=False).cmd_id_dep[0] == 1


def independent_program():
    b = ProgramBuilder(CHIP)
    b.add(load(CHIP, 0, 0x0, (1, 64, 32, 32)))
    b.add(ar("add", 0x28000, 0x20000, 0x24000, SHAPE))
    b.add(load(CHIP, 1 << 20, 0x10000, (1, 64, 32, 32)))
    b.add(ar("add", 0x38000, 0x30000, 0x34000, SHAPE))
    return b.build()


def test_auto_mode_serialises():
    """Nothing depends on anything in bitmap mode, so the adds overlap the loads. Auto mode (DIS_AUTO_DEP_ID
    = 1) makes each instruction wait for every instruction of the other engine issued before it:
    B1 after D1, D2 after B1, B2 after D2 -> the four run one after the other."""
    prog = independent_program()
    free = simulate(prog)
    auto = simulate(prog, dep_mode="auto")
    assert list(free.cmd_id_dep) == [0, 0, 0, 0]
    assert list(auto.cmd_id_dep) == [1, 2, 0, 1]          # rows: B1, B2, D1, D2
    t = {k: auto.index(*k) for k in (("tiu", 1), ("tiu", 2), ("gdma", 1), ("gdma", 2))}
    assert auto.times["dispatch"][t["tiu", 1]] == auto.times["end"][t["gdma", 1]]
    assert auto.times["dispatch"][t["gdma", 2]] == auto.times["end"][t["tiu", 1]]
    assert auto.times["dispatch"][t["tiu", 2]] == auto.times["end"][t["gdma", 2]]
    assert free.total_ps < auto.total_ps
    assert free.times["end"][free.index("tiu", 1)] < free.times["end"][free.index("gdma", 1)]


def tile_program(chip):
    """GDMA fills tile slots T0 and U0 (4 KiB each), TPUSH x2, TMATMUL 32x32x32 fp32, ACCCVT to M, and a
    GDMA store of the M tile (the builder puts a SYS tile wait for T4 before it)."""
    b = ProgramBuilder(chip)
    b.add(copy_bytes(chip, 0, chip.tile_slot_address(0, 0), 4096, dst_lmem=True))
    b.add(copy_bytes(chip, 8192, chip.tile_slot_address(1, 0), 4096, dst_lmem=True))
    b.add(TPush(dst_queue=0, dst_size=8))
    b.add(TPush(dst_queue=1, dst_size=8))
    b.add(TMatmul(fn="TMATMUL", dt="FP32", m=32, n=32, k=32, src0=tile_ref("T", 1), src1=tile_ref("U", 1),
                  acc_size=8))
    b.add(AccCvt(layout="NZ2ND", row=32, col=32, dst_queue=2, dst_size=8))
    b.add(copy_bytes(chip, chip.tile_slot_address(2, 0), 1 << 20, 4096, src_lmem=True))
    return b.build()


def test_tile_blocks_and_sys_tile_wait():
    """TPUSH T waits for D1, TPUSH U for D2; each costs block_overhead 2 cycles. TMATMUL: 2 x 2 x
    ceil(32/8) = 16 fractal steps of 16 x 16 x 8 = 2048 MACs at 1024 MAC/cycle = 32 cycles + fill 32 +
    overhead 2 = 66 cycles; ACCCVT drains 32 x 32 x 4 B at 256 B/cycle = 16 + 2 = 18 cycles. The store
    D4 sits behind D3 = dma.sys.sys_wait(T4), which ends as soon as T4 has completed."""
    prog = tile_program(CHIP)
    assert isinstance(prog.gdma[2], SysDma) and prog.gdma[2].constant_value == 4
    assert prog.gdma[2].index == TILE_WAIT_TAG
    assert (prog.tile[0].wait_gdma_id, prog.tile[1].wait_gdma_id) == (1, 2)
    r = simulate(prog)
    t = [r.index("tile", k) for k in (1, 2, 3, 4)]
    assert int(r.times["start"][t[0]]) == int(r.times["end"][r.index("gdma", 1)])
    assert int(r.times["start"][t[1]]) == int(r.times["end"][r.index("gdma", 2)])
    durations = [int(r.times["end"][i] - r.times["start"][i]) for i in t]
    assert durations == [2_000, 2_000, 66_000, 18_000]
    assert int(r.times["start"][t[2]]) == int(r.times["end"][t[1]])
    d3 = r.index("gdma", 3)
    assert int(r.waits["gdma"][t[0]]) == 1 and int(r.waits["gdma"][t[1]]) == 2
    assert int(r.waits["tile"][d3]) == 4 and int(r.waits["tiu"][d3]) == 0
    assert int(r.times["dispatch"][d3]) == int(r.times["end"][t[3]])
    assert int(r.times["dispatch"][r.index("gdma", 4)]) == int(r.times["end"][d3])


def test_check_stage_wants_the_sys_tile_wait_and_tile_waits():
    """Without the SYS wait the store (now D3) conflicts with T4 unguarded; a TPUSH that does not wait for
    the GDMA load of its slot disagrees with the bitmaps."""
    prog = tile_program(CHIP)
    bad = Program(chip=CHIP, gdma=[prog.gdma[0], prog.gdma[1], prog.gdma[3]], tile=prog.tile,
                  issue_order="DDTTTTD")
    with pytest.raises(DependencyCheckError, match="D3 conflicts with T4 but is not preceded by a SYS wait for T4"):
        simulate(bad)
    early = dataclasses.replace(prog.tile[0], wait_gdma_id=0)
    bad = Program(chip=CHIP, gdma=prog.gdma, tile=[early, *prog.tile[1:]], issue_order=prog.issue_order)
    with pytest.raises(DependencyCheckError, match=r"T1 waits B0,D0, bitmaps give B0,D1"):
        simulate(bad)


def test_deadlock_is_reported_with_the_blocked_heads():
    """A TIU instruction waiting for a GDMA id that never completes (check off): DeadlockError names it."""
    b = ProgramBuilder(CHIP)
    b.add(ar("add", 0x8000, 0x0, 0x4000, SHAPE), dep=5)
    with pytest.raises(DeadlockError, match=r"B1 waits for D5"):
        simulate(b.build(), check=False)


def test_same_program_same_result():
    prog = fifo_program(CHIP)
    a, b = simulate(prog), simulate(prog)
    assert a.total_ps == b.total_ps
    assert all((a.times[s] == b.times[s]).all() for s in a.times)
    assert list(a.rows()) == list(b.rows())


def test_full_command_fifo_behind_a_missing_producer_deadlocks():
    """Eight adds wait for a load issued after them (check off) with a 4-descriptor TIU command FIFO: B1-B4
    fill it, B5 and B6 fill the TIU request FIFO, B7 cannot leave the issue stage, so the IFE never
    reaches the load: nothing moves, and the report names the blocked heads and the IFE."""
    from tpuflow.program import Program
    chip = replace_param(CHIP, "ife.tiu_cmd_fifo_bytes", 4 * 128)
    adds = [dataclasses.replace(ar("add", 0x8000, 0x0, None, (1, 64, 1, 16), b_const=0), cmd_id_dep=1)] * 8
    program = Program(chip=chip, tiu=adds, gdma=[load(chip, 0, 0, (1, 64, 1, 16))], issue_order="B" * 8 + "D")
    with pytest.raises(DeadlockError, match=r"B1 waits for D1.*the IFE cannot issue B7"):
        simulate(program, check=False)
