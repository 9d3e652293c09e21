"""Exact timelines of GDMA commands: one load (segments, bursts, latency, bandwidth) and read credits."""

import numpy as np
import pytest

from tpuflow.chip import load_chip, replace_param
from tpuflow.hwmodel.timing import simulate
from tpuflow.hwmodel.timing.clocks import Clocks
from tpuflow.hwmodel.timing.gdma import CommandModel
from tpuflow.hwmodel.timing.segments import Side, side_bursts, split_bursts
from tpuflow.hwmodel.timing.wdc import Wdc
from tpuflow.hwmodel.timing.synthetic import ProgramBuilder, copy_bytes
from tpuflow.isa import TensorDma, global_lmem_address

CHIP = load_chip("sg2260")


def ceil_to(t, p):
    return -(-t // p) * p


def test_one_load_of_4096_bytes_exact_timeline():
    """dma.general, 4096 B from DDR 0 to LMEM lane 0 offset 0, alone on an idle core (sg2260).

    IFE (1 GHz clk_i and clk_ife, 768-bit GDMA descriptor = 3 TXI words of 256 bit):
      txi_acq 3 ns, pack 4, async 5/6, decode 7, check 8, issue 9, hand-over 1 cycle -> GDMA list at 10.
    GDMA dispatches at 10 ns; t0 = 10 + cmd_setup 8 = 18 ns.
    Segments: one (contiguous); bursts of bus 128 B x 4 beats = 512 B -> 8 bursts, aligned, issued
      one per cycle at 18, 19, ..., 25 ns. All 8 sit in one 4 KiB interleave granule -> UMC 0, and in
      one 8 KiB page (bank closed at start).
    Request path: 2 hops at 2 GHz (1 ns) + 2 hops at each of ItlvDemux, private fab, Fab2t1, AuxCam
      (800 MHz: 4 x 2.5 ns) + X2x one UMC cycle (2.5 ns) = 13.5 ns -> arrivals 31.5 + k ns, started
      on 400 MHz edges.
    DramUnit: beat period = 16 UMCs x 32 B / 68.264 GB/s = 7.5 ns; a 512 B burst = 16 beats = 120 ns.
      burst 0: arrives 31.5 -> edge 32.5; bank closed: open 50 + 120 -> done 202.5 ns.
      bursts 1..7: page hits, back to back: done 202.5 + 120k -> burst 7 done 1042.5 ns.
    Response: min_read 8 + X2x r_process 1.25 + hops (2 x (4 x 1.25 + 0.5)) 11 = 20.25 ns -> 1062.75,
      GDMA edge 1063, 4 bus beats -> data in at 1067 ns.
    LMEM write of burst 7: port free, 4 cycles + LMEM latency 29 ns -> 1100 ns = command end.
    Bandwidth over the command: 4096 B / 1090 ns = 3.76 GB/s (one UMC: the transfer is latency- and
    single-UMC-bound, 4096 B / (8 x 120 ns) = 4.27 GB/s = peak / 16 while streaming).
    This is the per-burst model (memory="burst"); the rate model's timeline of the same command is
    derived in test_timing_rate.py.
    """
    b = ProgramBuilder(CHIP)
    b.add(copy_bytes(CHIP, 0, 0, 4096, dst_lmem=True))
    r = simulate(b.build(), memory="burst")
    i = r.index("gdma", 1)
    assert [int(r.times[s][i]) for s in ("txi_acq", "pack", "decode", "check", "issue", "dispatch")] == \
        [3000, 4000, 7000, 8000, 9000, 10000]
    assert int(r.times["end"][i]) == 1_100_000
    assert r.dram.bursts == 8
    assert (int(r.dram.page_opens.sum()), int(r.dram.page_hits.sum()), int(r.dram.page_misses.sum())) == (1, 7, 0)
    assert r.dram.bytes_read == 4096
    # the same numbers, rebuilt from the chip parameters
    c = Clocks.of(CHIP)
    beat = round(16 * 32 * 1000 / CHIP.dram.peak_gbps)
    req = 2 * (c.fabric_fast.period + 4 * c.fabric.period) + c.umc.period
    first = ceil_to(18_000 + req, c.umc.period) + 50_000 + 16 * beat
    data7 = ceil_to(first + 7 * 16 * beat + 8_000 + c.fabric.period + 2 * (4 * c.fabric.period + c.fabric_fast.period),
                    1000) + 4_000
    assert data7 + 4_000 + 29_000 == 1_100_000


def test_segmentation_and_bursts_of_strided_side():
    """A DDR side (1, 3, 2, 100) fp32 with row stride 128 elements: w contiguous only -> 6 row segments
    of 400 B at 512 B steps; the 512-B grid cuts none, so 6 bursts of 400 B; 400 B touch
    ceil(400/128) = 4 bus beats when aligned; streams end at 400, 800, ..., 2400."""
    side = Side(False, 0x10000, (1, 3, 2, 100), (768, 256, 128, 1), 4)
    b = side_bursts(side, CHIP, 512)
    assert list(b.addr) == [0x10000 + 512 * k for k in range(6)]
    assert list(b.size) == [400] * 6 and list(b.beats) == [4] * 6
    assert list(b.stream_end) == [400 * (k + 1) for k in range(6)]
    # an unaligned 1000 B segment from byte 100: cuts at 512 -> bursts of 412 and 588 ... capped at 512
    s = split_bursts(np.array([100]), np.array([1000]), 512, 128)
    assert list(s.size) == [412, 512, 76] and list(s.unaligned) == [True, False, False]
    assert list(s.beats) == [4, 4, 1]


def test_lmem_side_segments_per_channel_and_lane():
    """An LMEM side (1, 4, 8, 8) fp32 at lane 62: h,w contiguous -> one 256 B segment per channel, on
    lanes 62, 63, 0, 1; channels 2 and 3 wrapped into the next channel group (offset + c_stride)."""
    lane = CHIP.lmem_bytes_per_lane
    side = Side(True, 62 * lane + 0x100, (1, 4, 8, 8), (128, 64, 8, 1), 4)
    b = side_bursts(side, CHIP, 512)
    assert list(b.addr) == [62 * lane + 0x100, 63 * lane + 0x100, 0 * lane + 0x100 + 256, 1 * lane + 0x100 + 256]
    assert list(b.size) == [256] * 4


def test_fifth_read_waits_for_a_credit():
    """outstanding_reads = 4, one TensorDma reading 5 bursts of 512 B at 4 KiB stride (5 UMCs), into LMEM.

    t0 = 18 ns; bursts 0..3 issue at 18, 19, 20, 21 ns; the 5th needs a credit: it issues when the
    first response's data are in. Every burst goes to an idle UMC with a closed bank:
      arrival 18 + 13.5 = 31.5 -> edge 32.5; done 32.5 + 50 + 120 = 202.5; +20.25 -> 222.75,
      edge 223, +4 bus beats -> burst 0's data in at 227 ns: the credit comes back.
    So burst 4 issues at 227 ns (not 22 ns): arrival 240.5 -> edge 242.5; done 412.5; +20.25 ->
    432.75 -> 433 -> data in 437; LMEM write 437 + 4 + 29 = 470 ns = command end. Credit stall
    = 227 - 22 = 205 ns.
    With the default 128 credits burst 4 issues at 22 ns: arrival 35.5 -> edge 37.5 -> done 207.5 ->
    227.75 -> edge 228; but the GDMA data bus (4 cycles per burst) is busy with bursts 0..3 until
    223 + 4 * 4 = 239, so its data are in at 243 and its LMEM write ends at 243 + 4 + 29 = 276 ns.
    """
    chip = replace_param(CHIP, "gdma.outstanding_reads", 4)
    dma = TensorDma(src_start_addr=0, dst_start_addr=global_lmem_address(0, chip),
                    src_nsize=1, src_csize=5, src_hsize=1, src_wsize=128,
                    src_nstride=5 * 1024, src_cstride=1024, src_hstride=128, src_wstride=1,
                    dst_nsize=1, dst_csize=5, dst_hsize=1, dst_wsize=128,
                    dst_nstride=128, dst_cstride=128, dst_hstride=128, dst_wstride=1)
    b = ProgramBuilder(chip)
    b.add(dma)
    r = simulate(b.build(), memory="burst")     # per-burst credits (the rate model: test_timing_rate.py)
    i = r.index("gdma", 1)
    assert int(r.times["end"][i]) == 470_000
    assert int(r.stalls["dma_credit"][i]) == 205_000
    b = ProgramBuilder(CHIP)
    b.add(dma)
    r = simulate(b.build(), memory="burst")
    assert int(r.times["end"][0]) == 276_000 and int(r.stalls["dma_credit"][0]) == 0


def test_129th_request_takes_the_first_returned_credit():
    """Default 128 credits, one command reading 129 bursts of 512 B (64.5 KiB contiguous): requests 0..127
    issue one per cycle from t0 = 8 ns; request 128 issues exactly when the earliest response (data fully
    received) is in, not a cycle earlier, and its credit stall is that time minus the 136 ns it would
    have issued at. A request-by-request replay with a heap as the semaphore (same DRAM code, one request
    per call) gives the same issue times."""
    import heapq
    model = CommandModel(CHIP, Clocks.of(CHIP))
    table = model.table([copy_bytes(CHIP, 0, 0, 129 * 512, dst_lmem=True)])
    reads = model.streams[0]
    assert list(reads.issue[:128]) == [8_000 + 1000 * k for k in range(128)]
    first_back = int(reads.release[:128].min())
    assert int(reads.issue[128]) == first_back
    assert int(table.credit_stall[0]) == first_back - 136_000
    wdc = Wdc(CHIP)
    bursts = split_bursts(np.array([0]), np.array([129 * 512]), 512, 128)
    heap, t = [], 8_000
    for i in range(129):
        if len(heap) >= 128:
            t = max(t, heapq.heappop(heap))
        resp = int(wdc.service(bursts.addr[i:i + 1], bursts.size[i:i + 1], False, np.array([t]))[0])
        heapq.heappush(heap, ceil_to(resp, 1000) + 4_000)
        assert t == int(reads.issue[i])
        t += 1000


@pytest.mark.parametrize("nbytes", [64, 4096, 100_000])
def test_lmem_to_lmem_skips_ddr(nbytes):
    """An LMEM -> LMEM copy never reaches the WDC: no bursts, no DRAM bytes."""
    b = ProgramBuilder(CHIP)
    b.add(copy_bytes(CHIP, 0, 0x10000, min(nbytes, 60_000), src_lmem=True, dst_lmem=True))
    r = simulate(b.build())
    assert r.dram.bursts == 0 and r.dram.bytes_read == 0 and r.total_ps > 0
