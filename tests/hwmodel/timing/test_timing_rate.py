"""Exact timelines of the rate model (transfers.py, memory.py) and of several cores on one heap (cores.py):
one load alone, two transfers sharing a UMC (one ends, the other speeds up), the outstanding limit, a
memory-bound kernel on 1/2/4 cores, a two-core barrier, and a removed SEND reported as a deadlock.

Common numbers (sg2260, derived in test_timing_gdma.py's 4096 B example): the load is dispatched at
10 ns; the fixed latency of a DDR -> LMEM command with 512 B bursts is
  setup 8 + head (request 13.5 + min_read 8 + response 12.25 + 4 bus beats) + tail (4 beats + LMEM 29)
  = 8 + 37.75 + 33 = 78.75 ns;
a 512 B burst holds its UMC 16 beats x 7.5 ns = 120 ns; the first use of a bank opens it: 50 ns.
"""

import sys
from pathlib import Path

import numpy as np
from hypothesis import given, settings, strategies as st
import pytest

from tpuflow.chip import load_chip, replace_param
from tpuflow.errors import DeadlockError
from tpuflow.hwmodel.timing import simulate
from tpuflow.hwmodel.timing.memory import Flow, max_min_speeds
from tpuflow.hwmodel.timing.synthetic import ProgramBuilder, copy_bytes
from tpuflow.isa import Engine, barrier
from tpuflow.program import CoreStreams, Program

sys.path.insert(0, str(Path(__file__).parent))
from dram_reference import by_request  # noqa: E402

CHIP = load_chip("sg2260")
MIB = 1 << 20


def _streams(p: Program) -> CoreStreams:
    return CoreStreams(p.tiu, p.gdma, p.tile, p.tiu_layers, p.gdma_layers, p.tile_layers, p.issue_order)


def on_cores(programs: list[Program]) -> Program:
    return Program.from_cores(programs[0], [_streams(p) for p in programs])


def loads(chip, *pieces) -> Program:
    """One core's program: DDR -> LMEM loads of (ddr address, bytes)."""
    b = ProgramBuilder(chip)
    for addr, nbytes in pieces:
        b.add(copy_bytes(chip, addr, 0, nbytes, dst_lmem=True))
    return b.build()


def test_one_load_alone():
    """4096 B from DDR 0: one granule, UMC 0, bank closed. UMC occupancy = open 50 + 8 x 120 = 1010 ns;
    the core's own limits are far below (issue 8, bus 32, LMEM port 32, credits 1312 / 128 ns), so the
    bandwidth phase is 1010 ns: end = edge(10 + 1010 + 78.75) = 1099 ns (the per-burst model: 1100,
    its UMC clock edges are not modelled here)."""
    r = simulate(loads(CHIP, (0, 4096)))
    i = r.index("gdma", 1)
    assert int(r.times["dispatch"][i]) == 10_000
    assert int(r.times["end"][i]) == 1_099_000
    assert r.dram.bursts == 8 and r.dram.bytes_read == 4096
    assert (int(r.dram.page_opens.sum()), int(r.dram.page_hits.sum())) == (1, 7)


def test_two_transfers_share_a_umc_then_the_survivor_speeds_up():
    """Core 0 loads 2048 B (DDR 0), core 1 4096 B (DDR 64 KiB): both on UMC 0, each opening its bank (each
    core keeps its own page state): occupancies 50 + 4 x 120 = 530 ns and 50 + 8 x 120 = 1010 ns, which
    are also their solo bandwidth phases. chip_peak_gbps = peak_gbps lets UMC 0 serve one core's worth
    (capacity 1). Both dispatch at 10 ns. Max-min fair in bytes/ps: both get the same byte rate x with
    x (530/2048 + 1010/4096) = 1, x = 4096/2070 B/ns (below both solo rates, 3.86 and 4.06), i.e. speeds
    1060/2070 and 1010/2070 of solo:
      core 0: 530 solo ns at 1060/2070 -> 1035 ns: bandwidth phase ends at 1045, end edge(1045 + 78.75) = 1124;
      core 1: by then 1035 x 1010/2070 = 505 of its 1010 solo ns, the other 505 at full speed -> 1550,
              end edge(1550 + 78.75) = 1629.
    With sg2260's chip total (capacity 3) the two do not slow each other: edge(10 + 530 + 78.75) = 619 and
    edge(10 + 1010 + 78.75) = 1099 ns."""
    narrow = replace_param(CHIP, "dram.chip_peak_gbps", CHIP.dram.peak_gbps)
    shared = simulate(on_cores([loads(narrow, (0, 2048)), loads(narrow, (64 * 1024, 4096))]))
    assert [int(c.times["end"][c.index("gdma", 1)]) for c in shared.cores] == [1_124_000, 1_629_000]
    assert shared.total_ps == 1_629_000
    wide = simulate(on_cores([loads(CHIP, (0, 2048)), loads(CHIP, (64 * 1024, 4096))]))
    assert [int(c.times["end"][c.index("gdma", 1)]) for c in wide.cores] == [619_000, 1_099_000]


def test_outstanding_limit_bounds_the_rate():
    """gdma.outstanding_reads = 1: one request in flight, so the reads take the sum of their round trips:
    burst 0: request 13.5 + open 50 + 120 + min_read 8 + response 12.25 + bus 4 = 207.75 ns, bursts 1..7:
    157.75 ns each -> 1312 ns > the UMC's 1010 ns. end = edge(10 + 1312 + 78.75) = 1401 ns; the credit
    stall is what the credits add beyond the other limits: 1312 - 1010 = 302 ns."""
    chip = replace_param(CHIP, "gdma.outstanding_reads", 1)
    r = simulate(loads(chip, (0, 4096)))
    i = r.index("gdma", 1)
    assert int(r.times["end"][i]) == 1_401_000
    assert int(r.stalls["dma_credit"][i]) == 302_000


def test_max_min_speeds_respect_solo_rates_and_umc_capacity():
    """Progressive filling by hand: flow a (solo 100 ps, 100 B, all on UMC 0), flow b (solo 100 ps, 100 B,
    on UMC 1): disjoint UMCs -> both at full speed. Flow c like a on UMC 0 -> a and c at half speed, b at
    full speed (its UMC is free)."""
    def flow(umc):
        return Flow(100, lambda: ((umc,), (100,)), 100, lambda t: None)
    assert max_min_speeds([flow(0), flow(1)], 2, 1.0) == [1.0, 1.0]
    assert max_min_speeds([flow(0), flow(1), flow(0)], 2, 1.0) == pytest.approx([0.5, 1.0, 0.5])


@pytest.mark.parametrize("cores", [1, 2, 4])
def test_memory_bound_kernel_saturates_the_chip_total_not_cores_times_one_port(cores):
    """Each core streams 4 x 1 MiB from its own DDR region. One core reaches close to its port
    (dram.peak_gbps = 68.264 GB/s, minus the page opens), two cores twice that; four cores would want
    4 x 68 = 273 GB/s but share the chip's dram.chip_peak_gbps = 204.8 GB/s."""
    programs = [loads(CHIP, *[((16 * k + i) * MIB, MIB) for i in range(4)]) for k in range(cores)]
    r = simulate(on_cores(programs))
    gbps = cores * 4 * MIB / r.total_ps * 1e3
    port, total = CHIP.dram.peak_gbps, CHIP.dram.chip_peak_gbps
    assert gbps <= min(cores * port, total)
    assert gbps >= 0.9 * min(cores * port, total)
    if cores == 4:
        assert gbps < 0.8 * cores * port


def barrier_program(chip, load: bool, drop_gdma_send: bool = False) -> Program:
    """One core: optionally a 4096 B load, then the chip-wide barrier over 2 cores on message 0."""
    b = ProgramBuilder(chip)
    if load:
        b.add(copy_bytes(chip, 0, 0, 4096, dst_lmem=True))
    bar = barrier(2, 0)
    b.add(bar[Engine.TIU][0])
    if not drop_gdma_send:
        b.add(bar[Engine.GDMA][0])
    b.add(bar[Engine.TIU][1])
    b.add(bar[Engine.GDMA][1])
    return b.build()


def test_two_core_barrier_exact_timeline():
    """Core 0 loads 4096 B (ends at 1099 ns, test_one_load_alone) then joins the barrier; core 1 joins at
    once. Every send counts 4 (2 engines x 2 cores). Core 0's GDMA send dispatches when the load ends,
    1099 ns, and ends after the command setup (8 ns, no data): 1107 ns; it is the fourth send and reaches
    the board core.message_latency_ns = 100 ns later: 1207 ns. All four waits (TIU and GDMA of both
    cores) dispatch then; the GDMA waits end after their setup, 1215 ns."""
    r = simulate(on_cores([barrier_program(CHIP, True), barrier_program(CHIP, False)]))
    core0, core1 = r.cores
    assert int(core0.times["end"][core0.index("gdma", 1)]) == 1_099_000
    assert int(core0.times["end"][core0.index("gdma", 2)]) == 1_107_000
    for c, wait_gdma in ((core0, 3), (core1, 2)):
        assert int(c.times["dispatch"][c.index("tiu", 2)]) == 1_207_000
        assert int(c.times["dispatch"][c.index("gdma", wait_gdma)]) == 1_207_000
        assert int(c.times["end"][c.index("gdma", wait_gdma)]) == 1_215_000
    assert int(core1.times["end"][core1.index("gdma", 1)]) < 1_099_000    # core 1 sent long before


def test_removed_send_is_a_deadlock_naming_engines_and_cores():
    """Core 1 without its GDMA send: only 3 of the 4 sends ever arrive, so every wait blocks; the error
    names each waiting engine with its core and message."""
    program = on_cores([barrier_program(CHIP, False), barrier_program(CHIP, False, drop_gdma_send=True)])
    with pytest.raises(DeadlockError) as err:
        simulate(program)
    text = str(err.value)
    for where in ("core 0 B2", "core 0 D2", "core 1 B2", "core 1 D1"):
        assert f"{where} waits for message 0 (3 of 4 sends arrived)" in text


def test_per_core_rows_in_the_json_the_timeline_and_the_trace():
    """The two-core barrier: estimate's `cores` list has each core's instructions and busy time (core 0's
    GDMA: the load 10..1099 ns, the send 1099..1107, the wait 1207..1215 -> 1105 ns busy); the report
    timeline has a row per engine of every core; the trace one process per core holding each of that
    core's instructions once."""
    from tpuflow.codegen.profile import TRACE_PID, trace_events
    from tpuflow.codegen.report_data import row_classes
    from tpuflow.codegen.report_timeline import build_timeline
    from tpuflow.hwmodel.timing.result import core_rows

    program = on_cores([barrier_program(CHIP, True), barrier_program(CHIP, False)])
    r = simulate(program)
    rows = core_rows(r)
    assert [row["engines"]["gdma"]["instructions"] for row in rows] == [3, 2]
    assert rows[0]["engines"]["gdma"]["busy_us"] == pytest.approx(1.105)
    assert rows[0]["engines"]["gdma"]["utilisation"] == pytest.approx(1.105 / r.total_us)
    timeline = build_timeline(program, r, row_classes(program), np.zeros(len(r.engine)), {"": 0})
    assert [row.label for row in timeline.rows] == ["C0 TIU", "C0 GDMA", "C1 TIU", "C1 GDMA", "DRAM"]
    events = trace_events(program, r)["traceEvents"]
    for k, core in enumerate(r.cores):
        slices = [e for e in events if e["ph"] == "X" and e["pid"] == TRACE_PID + k]
        assert sorted((e["tid"] // 1000, e["args"]["cmd_id"]) for e in slices) == \
            sorted((int(c) + 1, int(i)) for c, i in zip(core.engine, core.cmd_id))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["load", "store", "copy"]), st.integers(0, 63),
                          st.sampled_from([64, 512, 700, 4096, 9000, 70000]), st.integers(1, 6)),
                min_size=1, max_size=12))
def test_occupancy_per_pattern_equals_the_request_by_request_pass(commands):
    """occupancy.py computes each distinct request pattern once and carries the page and direction state
    from command to command; that must equal applying the rules to every request of the queue in order
    (loads, stores and DDR -> DDR copies of strided rows at addresses that repeat patterns and pages)."""
    from tpuflow.hwmodel.timing.clocks import Clocks
    from tpuflow.hwmodel.timing.transfers import TransferModel
    from tpuflow.isa import TensorDma, global_lmem_address
    instrs = []
    for kind, where, row, rows in commands:
        ddr = where * 40960
        nchw = (rows * row * 3, rows * row * 3, row * 3, 1)
        flat = (rows * row, rows * row, row, 1)
        lmem = global_lmem_address(0, CHIP)
        src, dst, ss, ds = {"load": (ddr, lmem, nchw, flat), "store": (lmem, ddr, flat, nchw),
                            "copy": (ddr, ddr + 12_345_600, nchw, flat)}[kind]
        instrs.append(TensorDma(src_start_addr=src, dst_start_addr=dst, src_nsize=1, src_csize=1, src_hsize=rows,
                                src_wsize=row, src_nstride=ss[0], src_cstride=ss[1], src_hstride=ss[2],
                                src_wstride=1, dst_nsize=1, dst_csize=1, dst_hsize=rows, dst_wsize=row,
                                dst_nstride=ds[0], dst_cstride=ds[1], dst_hstride=ds[2], dst_wstride=1,
                                src_data_format=4))
    costs = TransferModel(CHIP, Clocks.of(CHIP)).costs(instrs)
    assert np.array_equal(costs.occupancy, by_request(CHIP, instrs)[0])


def test_message_id_beyond_the_chips_queue_is_an_error():
    """core.message_ids = 4: a SEND on id 5 names the key instead of running."""
    from tpuflow.hwmodel.timing.cores import ProgramError
    from tpuflow.isa import SysTiu
    chip = replace_param(CHIP, "core.message_ids", 4)
    b = ProgramBuilder(chip)
    b.add(SysTiu.send(5, 1))
    with pytest.raises(ProgramError, match="message id 5 beyond the chip's 4 \\(core.message_ids\\)"):
        simulate(b.build())


def test_multi_core_dram_statistics_are_the_chips():
    """Two cores loading 4096 B each: the result's DRAM counts both (8192 B, 16 bursts, 2 bank opens) against
    the chip's dram.chip_peak_gbps; each core's own result counts its own."""
    r = simulate(on_cores([loads(CHIP, (0, 4096)), loads(CHIP, (64 * 1024, 4096))]))
    assert (r.dram.bytes_read, r.dram.bursts, int(r.dram.page_opens.sum())) == (8192, 16, 2)
    assert r.dram.peak_gbps == CHIP.dram.chip_peak_gbps
    assert [c.dram.bytes_read for c in r.cores] == [4096, 4096]


def test_shared_memory_runs_repeat_exactly():
    """Float speeds while flows share UMCs still give the same integer timeline on every run."""
    programs = [loads(CHIP, *[((16 * k + i) * MIB + 4096 * k, MIB // 2) for i in range(3)]) for k in range(4)]
    runs = [simulate(on_cores(programs)) for _ in range(2)]
    for a, b in zip(runs[0].cores, runs[1].cores):
        assert np.array_equal(a.times["end"], b.times["end"]) and np.array_equal(a.stalls["dram"], b.stalls["dram"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5000), st.integers(1, 10**6),
                          st.dictionaries(st.integers(0, 3), st.integers(1, 5000), min_size=0, max_size=4)),
                min_size=1, max_size=6),
       st.sampled_from([1.0, 1.5, 3.0]))
def test_max_min_speeds_are_feasible_and_every_flow_is_bottlenecked(flows, capacity):
    """For any flows: no speed above solo, no UMC above its capacity, and every flow is either at its solo
    speed or uses a full UMC on which no other flow has a higher byte rate (max-min fairness)."""
    made = []
    for solo, nbytes, occ in flows:
        occ = {u: min(o, solo) for u, o in occ.items()}          # a flow never holds a UMC longer than its phase
        made.append(Flow(solo, (lambda o=occ: (tuple(o), tuple(o.values()))), nbytes, lambda t: None))
    speeds = max_min_speeds(made, 4, capacity)
    rate = [s * f.nbytes / f.solo for s, f in zip(speeds, made)]
    load = [0.0] * 4
    for s, f in zip(speeds, made):
        for u, a in f.per_byte():
            load[u] += s * f.nbytes / f.solo * a
    assert all(0 < s <= 1.0 for s in speeds)
    assert all(x <= capacity * (1 + 1e-9) for x in load)
    for i, (s, f) in enumerate(zip(speeds, made)):
        if s < 1.0 - 1e-9:
            assert any(load[u] >= capacity * (1 - 1e-9) and
                       all(rate[j] <= rate[i] * (1 + 1e-9) for j, g in enumerate(made)
                           if any(v == u for v, _ in g.per_byte()))
                       for u, _ in f.per_byte())
