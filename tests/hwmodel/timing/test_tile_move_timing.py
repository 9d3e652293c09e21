"""The TILE engine in the simulator (issue 16): the tile buffer's DMA port (TMOVE) in an exact
timeline (the engine hands a move over in block_overhead cycles and goes on, a block that does not
touch the move's bytes runs while it is in flight, a TPUSH of the moved slot waits for it to land,
blocks retire in order), the port's cost model, a DDR-side move sharing the core's DDR port with a
GDMA load, and consecutive TMATMULs streaming through the cube."""

from __future__ import annotations

from tpuflow.chip import load_chip, replace_param
from tpuflow.hwmodel.timing import simulate
from tpuflow.hwmodel.timing.compute import tile_cycles
from tpuflow.hwmodel.timing.cost import instruction_cycles
from tpuflow.hwmodel.timing.synthetic import ProgramBuilder
from tpuflow.isa import AccCvt, Prec, TensorDma, TMatmul, TMove, TPush, global_lmem_address, size_code, tile_ref

CHIP = load_chip("sg2260")


def tensor_dma(src: int, dst: int, nbytes: int, lanes: int = 1) -> TensorDma:
    """fp16 bytes: `lanes` runs of nbytes / lanes, src and dst one lane each run (c walks the lanes)."""
    w = nbytes // lanes // 2
    f = {f"{side}_{a}size": v for side in ("src", "dst") for a, v in zip("nchw", (1, lanes, 1, w))}
    f.update({f"{side}_{a}stride": v for side in ("src", "dst") for a, v in zip("nchw", (lanes * w, w, w, 1))})
    return TensorDma(src_start_addr=src, dst_start_addr=dst, src_data_format=int(Prec.FP16), **f)


def slot(queue: int, index: int) -> int:
    return global_lmem_address(CHIP.tile_slot_address(queue, index), CHIP)


def test_a_move_runs_beside_the_blocks_that_do_not_touch_its_bytes():
    """T1 TPUSH T (timing only), T2 TMOVE 8192 B LMEM lane 0 -> U slot 0, T3 TMATMUL 64 x 64 x 32 on T#1,
    T4 TPUSH U (reads the moved slot). At 1 GHz: the port takes move_port_latency 64 + 8192 / 256 = 96
    cycles; the engine hands T2 over in block_overhead = 2 cycles, so T3 starts 2 ns after T2 and takes
    2 + 32 + 16 = 50 cycles (test_tile_buffer_timing) while T2 is in flight; T3 retires when T2 has
    landed (in order); T4 waits for the move (its slot), starts when it lands and takes 2 cycles."""
    b = ProgramBuilder(CHIP)
    b.add(TPush(dst_queue=0, dst_size=size_code(4096), dt="FP16"))
    b.add(TMove(desc=tensor_dma(global_lmem_address(0, CHIP), slot(1, 0), 8192)))
    mm = TMatmul(fn="TMATMUL", dt="FP16", m=64, n=64, k=32, src0=tile_ref("T", 1), src1=tile_ref("T", 1),
                 reuse0=1, acc_size=size_code(64 * 64 * 4))
    b.add(mm)
    b.add(TPush(dst_queue=1, dst_size=size_code(8192), dt="FP16"))
    r = simulate(b.build())
    move, matmul, push = (r.index("tile", k) for k in (2, 3, 4))
    start = int(r.times["start"][move])
    assert int(r.times["end"][move]) - start == 96_000
    assert int(r.times["start"][matmul]) == start + 2_000
    assert int(r.times["end"][matmul]) == start + 96_000           # own end at +52 ns, retired with the move
    assert (int(r.times["start"][push]), int(r.times["end"][push])) == (start + 96_000, start + 98_000)
    assert tile_cycles(mm, CHIP) == 50 and instruction_cycles(b.build().tile[1], CHIP) == 96


def test_a_block_touching_the_moving_bytes_waits_and_no_port_means_gdma_fills():
    """A TMATMUL reading the slot a move is filling (pushed before the move: a WAR the queue order
    alone would not stop) waits for the move to land; with tile.move_port_bytes_per_cycle = 0 the port
    cost model is not used by the lowering (covered in tests/e2e/test_tile_fills.py)."""
    b = ProgramBuilder(CHIP)
    b.add(TPush(dst_queue=0, dst_size=size_code(4096), dt="FP16"))
    b.add(TMove(desc=tensor_dma(global_lmem_address(0, CHIP), slot(0, 0), 4096)))     # overwrites T#1's slot
    b.add(TMatmul(fn="TMATMUL", dt="FP16", m=64, n=64, k=32, src0=tile_ref("T", 1), src1=tile_ref("T", 1),
                  reuse0=1, acc_size=size_code(64 * 64 * 4)))
    r = simulate(b.build())
    move, matmul = r.index("tile", 2), r.index("tile", 3)
    assert int(r.times["start"][matmul]) == int(r.times["end"][move]) == int(r.times["start"][move]) + (64 + 16) * 1000
    assert replace_param(CHIP, "tile.move_port_bytes_per_cycle", 0).tile.move_port_bytes_per_cycle == 0


def test_a_ddr_move_shares_the_core_ddr_port_with_the_gdma():
    """64 KiB from DDR into 8 slots by TMOVE, and 64 KiB from elsewhere in DDR into LMEM by the GDMA,
    issued together: each alone takes its solo time; together neither ends sooner, and the later one
    ends no sooner than both transfers' bytes at the core's peak rate (one DDR port per core)."""
    def run(move: bool, load: bool) -> dict:
        b = ProgramBuilder(CHIP)
        if move:
            b.add(TMove(desc=tensor_dma(0, slot(1, 0), 65536, lanes=8)))
        if load:
            b.add(tensor_dma(1 << 20, global_lmem_address(0, CHIP), 65536, lanes=8))
        r = simulate(b.build())
        out = {}
        if move:
            out["move"] = int(r.times["end"][r.index("tile", 1)]) - int(r.times["start"][r.index("tile", 1)])
        if load:
            out["load"] = int(r.times["end"][r.index("gdma", 1)]) - int(r.times["start"][r.index("gdma", 1)])
        return out
    alone = {**run(True, False), **run(False, True)}
    both = run(True, True)
    assert both["move"] >= alone["move"] and both["load"] >= alone["load"]
    assert max(both.values()) >= 2 * 65536 * 1000 / CHIP.dram.peak_gbps
    assert max(both.values()) < alone["move"] + alone["load"]           # they do overlap


def test_consecutive_tmatmuls_stream_through_the_cube():
    """TPUSH T, then TMATMUL 64 x 64 x 32 twice (the second .ACC) and ACCCVT 64 x 64: each TMATMUL is
    block_overhead 2 + fill_latency 32 + 16 fractal-step cycles (50 ns at 1 GHz); the second starts when
    the first one's body (2 + 16 cycles) ends, overlapping its fill latency, as the TIU's cube pipe does;
    the ACCCVT (2 + 64 * 64 * 4 / 256 = 66 cycles) waits for the second one's end (the ACC is complete)."""
    b = ProgramBuilder(CHIP)
    b.add(TPush(dst_queue=0, dst_size=size_code(4096), dt="FP16"))
    for fn in ("TMATMUL", "TMATMUL.ACC"):
        b.add(TMatmul(fn=fn, dt="FP16", m=64, n=64, k=32, src0=tile_ref("T", 1), src1=tile_ref("T", 1), reuse0=1,
                      reuse1=1, acc_size=size_code(64 * 64 * 4)))
    b.add(AccCvt(layout="NZ2ND", row=64, col=64, dst_queue=2, dst_size=size_code(64 * 64 * 2), dst_dt="FP16"))
    r = simulate(b.build())
    first, second, cvt = (r.index("tile", k) for k in (2, 3, 4))
    t0 = int(r.times["start"][first])
    assert int(r.times["end"][first]) == t0 + 50_000
    assert (int(r.times["start"][second]), int(r.times["end"][second])) == (t0 + 18_000, t0 + 68_000)
    assert (int(r.times["start"][cvt]), int(r.times["end"][cvt])) == (t0 + 68_000, t0 + 134_000)


def test_a_tpush_between_tmatmuls_keeps_them_streaming():
    """TPUSH T, TMATMUL 64 x 64 x 32, TPUSH U, TMATMUL.ACC: the TPUSH does not use the cube, so it starts
    when the first TMATMUL's body (2 + 16 cycles) ends, takes block_overhead 2 cycles, and the second
    TMATMUL still streams (starts 20 ns after the first, ends 50 ns after that), instead of both waiting
    for the first one's fill latency (which would start the second at 52 ns)."""
    b = ProgramBuilder(CHIP)
    b.add(TPush(dst_queue=0, dst_size=size_code(4096), dt="FP16"))
    for fn, queue in (("TMATMUL", None), ("TMATMUL.ACC", 1)):
        if queue is not None:
            b.add(TPush(dst_queue=queue, dst_size=size_code(4096), dt="FP16"))
        b.add(TMatmul(fn=fn, dt="FP16", m=64, n=64, k=32, src0=tile_ref("T", 1), src1=tile_ref("T", 1), reuse0=1,
                      reuse1=1, acc_size=size_code(64 * 64 * 4)))
    r = simulate(b.build())
    first, push, second = (r.index("tile", k) for k in (2, 3, 4))
    t0 = int(r.times["start"][first])
    assert (int(r.times["start"][push]), int(r.times["start"][second])) == (t0 + 18_000, t0 + 20_000)
    assert int(r.times["end"][second]) == t0 + 70_000
