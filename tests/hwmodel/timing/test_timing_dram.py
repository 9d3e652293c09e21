"""Exact DramUnit timing: page hit, first open, row miss, read/write turnaround; latency calibration."""

import numpy as np

from tpuflow.chip import load_chip, replace_param
from tpuflow.hwmodel.timing.clocks import Clocks
from tpuflow.hwmodel.timing.gdma import CommandModel
from tpuflow.hwmodel.timing.synthetic import copy_bytes
from tpuflow.hwmodel.timing.wdc import Wdc, WdcParams

CHIP = load_chip("sg2260")
ROW_MISS_ADDR = 2 << 20   # UMC 0, bank 0, row 1: local 128 KiB = 16 pages of 8 KiB later


def one(wdc, addr, issue, write=False, size=64):
    return int(wdc.service(np.array([addr]), np.array([size]), write, np.array([issue]))[0])


def test_hit_open_miss_and_turnaround_costs():
    """Six 64 B requests on UMC 0, each issued when the UMC is idle and timed so it reaches the UMC on a
    400 MHz edge (sg2260 numbers):

    request path 13.5 ns (writes + 1 fabric beat of data: 14.75 ns); 64 B = 2 beats x 7.5 ns = 15 ns;
    read response = min_read 8 + 1.25 + 11 = 20.25 ns; write B response = 12.25 ns.
      A read  addr 0, bank closed:   13.5 + open 50 + 15 + 20.25        =  98.75 ns
      B read  addr 64, page hit:     13.5 + 15 + 20.25                  =  48.75 ns
      C read  2 MiB, same bank, other row (miss): 13.5 + close 50 + open 50 + 15 + 20.25 = 148.75 ns
      D write 2 MiB + 64, hit after reads: 14.75 + r->w 10 + 15 + 12.25 =  52.00 ns
      E write 2 MiB + 128, hit, same direction: 14.75 + 15 + 12.25      =  42.00 ns
      F read  2 MiB + 192, hit after writes: 13.5 + w->r 15 + 15 + 20.25 = 63.75 ns
    """
    wdc = Wdc(CHIP, Clocks.of(CHIP))
    assert one(wdc, 0, 1_500) - 1_500 == 98_750
    assert one(wdc, 64, 101_500) - 101_500 == 48_750
    assert one(wdc, ROW_MISS_ADDR, 201_500) - 201_500 == 148_750
    assert one(wdc, ROW_MISS_ADDR + 64, 350_250, write=True) - 350_250 == 52_000
    assert one(wdc, ROW_MISS_ADDR + 128, 450_250, write=True) - 450_250 == 42_000
    assert one(wdc, ROW_MISS_ADDR + 192, 501_500) - 501_500 == 63_750
    st = wdc.stats
    assert (int(st.page_opens[0]), int(st.page_misses[0]), int(st.page_hits[0])) == (1, 1, 4)
    assert st.bytes_read == 4 * 64 and st.bytes_written == 2 * 64


def test_requests_on_one_umc_are_served_in_order():
    """Two 512 B reads to UMC 0 issued together: the second starts when the first ends (16 beats = 120 ns
    each), so its response is exactly 120 ns after the first; a read to UMC 1 is not delayed."""
    wdc = Wdc(CHIP, Clocks.of(CHIP))
    resp = wdc.service(np.array([0, 512, 4096]), np.array([512, 512, 512]), False, np.array([1_500, 1_500, 1_500]))
    assert resp[1] - resp[0] == 120_000
    assert resp[2] == resp[0]


def test_cam_groups_requests_to_the_same_page():
    """Requests A(row 0), B(row 1), A'(row 0) of one bank handed over together: the AuxCam serves A, A'
    then B: one first open, one hit, one miss (without reordering: open, miss, miss)."""
    wdc = Wdc(CHIP, Clocks.of(CHIP))
    addr = np.array([0, ROW_MISS_ADDR, 64])
    wdc.service(addr, np.array([64, 64, 64]), False, np.array([1_500, 1_500, 1_500]))
    st = wdc.stats
    assert (int(st.page_opens[0]), int(st.page_hits[0]), int(st.page_misses[0])) == (1, 1, 1)


def test_calibration_hit_50ns_miss_150ns():
    """Read latency seen by the GDMA (request issued -> data received over its bus), 64 B, idle UMC.

    Reaching the UMC on an edge: page hit 13.5 + 15 + 20.25 = 48.75 ns -> next GDMA edge 49 + 1 bus beat
    = 50 ns; row miss + close 50 + open 50 = 150 ns; bank closed (first use) + open 50 = 100 ns.
    Inside commands (edges counted from the dispatch): the request leaves at t0 = 8 ns and arrives at
    21.5 ns, one 1-ns wait for the 400 MHz edge: 51 / 101 / 151 ns. Commands: read A (bank closed),
    read A + 64 (hit), read 2 MiB (same bank, other row: miss)."""
    p = WdcParams.of(CHIP, Clocks.of(CHIP))
    assert p.unloaded_read_ps(64) == 48_750 and p.unloaded_read_ps(64, miss=True) == 148_750
    model = CommandModel(CHIP, Clocks.of(CHIP))
    model.table([copy_bytes(CHIP, a, 0, 64, dst_lmem=True) for a in (0, 64, ROW_MISS_ADDR)])
    reads = model.streams[0]
    assert list(reads.release - reads.issue) == [101_000, 51_000, 151_000]
    assert list(reads.issue) == [8_000] * 3


def test_beat_period_delivers_peak_bandwidth():
    """beat period = UMCs x data width / peak: 16 x 32 B / 68.264 GB/s = 7.5 ns (whole ps); a 32 GB/s
    DRAM takes 16 ns per beat."""
    assert WdcParams.of(CHIP, Clocks.of(CHIP)).beat_ps == 7_500
    slow = replace_param(CHIP, "dram.peak_gbps", 32.0)
    assert WdcParams.of(slow, Clocks.of(slow)).beat_ps == 16_000


def test_fab2t1_outstanding_holds_the_channel():
    """100 reads of 512 B to UMC 0 (64 KiB apart), then 10 to UMCs 1-2 (same channel) and 10 to UMCs 8-9
    (the other channel), issued 1 ns apart. Fab2t1 admits 32 requests per UMC: read k >= 32 of UMC 0
    waits until read k - 32 is done and, the fabric being in order, holds everything behind it on
    channel 0: read 99 enters when read 67 is done, so UMC 1's first read is answered after read 67's.
    Channel 1 does not wait; with a limit of 1000, UMC 1's first read is answered before UMC 0's 6th."""
    addr = np.concatenate([np.arange(100) * 65536, 4096 + np.arange(10) * 512, 8 * 4096 + np.arange(10) * 512])
    size = np.full(len(addr), 512)
    issue = np.arange(len(addr)) * 1000
    resp = Wdc(CHIP).service(addr, size, False, issue)
    loose = Wdc(replace_param(CHIP, "wdc.fab2t1_outstanding", 1000)).service(addr, size, False, issue)
    umc0, umc1, umc8 = resp[:100], resp[100:110], resp[110:]
    assert umc1.min() > umc0[67]
    assert loose[100:110].min() < umc0[5]
    assert (umc8 == loose[110:]).all()
    assert (umc0 == loose[:100]).all()


def test_fab2t1_outstanding_in_a_command():
    """One TensorDma reading 100 rows of 512 B at 64 KiB stride from UMC 0, then 100 from UMC 1 (same
    channel): with Fab2t1's 32-request limit UMC 1's rows wait behind UMC 0's in the in-order fabric, so
    the command takes longer than with the limit lifted; the UMC-0-only half alone is not affected (one
    UMC serves in order anyway). A per-burst fact: checked on the per-burst model (memory="burst"); the
    rate model does not model fabric outstanding limits (hwmodel/timing/transfers.py)."""
    from tpuflow.hwmodel.timing import simulate
    from tpuflow.hwmodel.timing.synthetic import ProgramBuilder
    from tpuflow.isa import TensorDma, global_lmem_address

    def run(chip, channels):
        dma = TensorDma(src_start_addr=0, dst_start_addr=global_lmem_address(0, chip),
                        src_nsize=1, src_csize=channels, src_hsize=100, src_wsize=128,
                        src_nstride=0, src_cstride=1024, src_hstride=16384, src_wstride=1,
                        dst_nsize=1, dst_csize=channels, dst_hsize=100, dst_wsize=128,
                        dst_nstride=12800, dst_cstride=12800, dst_hstride=128, dst_wstride=1)
        b = ProgramBuilder(chip)
        b.add(dma)
        return simulate(b.build(), memory="burst").total_ps

    loose = replace_param(CHIP, "wdc.fab2t1_outstanding", 1000)
    assert run(CHIP, 2) > run(loose, 2) + 1_000_000
    assert run(CHIP, 1) == run(loose, 1)


def test_shared_region_path_adds_a_fabric_level():
    """wdc.shared_region routes through shared fab1 -> shared fab2: one more 800 MHz level of
    fabric_hop_cycles (2 x 1.25 ns) on the way out and on the way back: +5 ns unloaded."""
    shared = replace_param(CHIP, "wdc.shared_region", True)
    a, b = WdcParams.of(CHIP, Clocks.of(CHIP)), WdcParams.of(shared, Clocks.of(shared))
    assert b.unloaded_read_ps(64) - a.unloaded_read_ps(64) == 5_000
    assert [lim for _, lim in b.limits] == [32, 64, 128]


def test_every_gdma_kind_moves_the_bytes_it_says():
    """DDR bytes counted by the DRAM side for each kind of command: constant fills read nothing, a
    DDR->DDR copy reads and writes, broadcasts read their source once, LMEM-only commands touch no DDR."""
    from tpuflow.hwmodel.timing import simulate
    from tpuflow.hwmodel.timing.synthetic import ProgramBuilder, copy_bytes
    from tpuflow.isa import GeneralDma, MatrixDma, SysDma, TensorDma, global_lmem_address as g

    flat = dict(src_nsize=1, src_csize=1, src_hsize=1, src_wsize=1024, src_nstride=1024, src_cstride=1024,
                src_hstride=1024, src_wstride=1, dst_nsize=1, dst_csize=1, dst_hsize=1, dst_wsize=1024,
                dst_nstride=1024, dst_cstride=1024, dst_hstride=1024, dst_wstride=1)
    cases = [
        (TensorDma(src_start_addr=0, dst_start_addr=4096, fill_constant_en=1, **flat), 0, 4096),
        (copy_bytes(CHIP, 0, 1 << 20, 100_000), 100_000, 100_000),
        (MatrixDma(src_start_addr=0, dst_start_addr=g(0, CHIP), src_hsize=128, src_wsize=100, src_hstride=100,
                   dst_cstride=112), 51_200, 0),
        (MatrixDma(src_start_addr=g(0, CHIP), dst_start_addr=1 << 20, src_hsize=128, src_wsize=100,
                   src_hstride=100, dst_cstride=112), 0, 51_200),
        (GeneralDma(op="broadcast", src_start_addr=0, dst_start_addr=g(0, CHIP), src_cstride=256, dst_csize=8), 1024, 0),
        (copy_bytes(CHIP, 0, 4096, 4096, src_lmem=True, dst_lmem=True), 0, 0),
        (SysDma(op="nop"), 0, 0),
    ]
    for instr, read, written in cases:
        b = ProgramBuilder(CHIP)
        b.add(instr)
        r = simulate(b.build())
        assert (r.dram.bytes_read, r.dram.bytes_written) == (read, written), instr.op_name
        assert r.times["end"][0] > r.times["dispatch"][0]
