"""Sanity against physics: streaming bandwidth, DRAM / lane scaling, roofline lower bound."""

from hypothesis import HealthCheck, given, settings, strategies as st

from tpuflow.chip import load_chip, replace_param
from tpuflow.hwmodel.timing import simulate
from tpuflow.hwmodel.timing.compute import chip_dtype, tiu_macs
from tpuflow.hwmodel.timing.segments import transfer_sides
from tpuflow.hwmodel.timing.synthetic import ProgramBuilder, ar, conv, load, matmul, store
from tpuflow.isa import DmaInstruction, Prec, SysDma, TiuInstruction

CHIP = load_chip("sg2260")
MIB = 1 << 20


def streaming_efficiency(chip, nbytes: int) -> float:
    """Page-limited share of the peak for a contiguous stream that starts with every bank closed: per UMC
    nbytes/16 in 8 KiB pages; the first 16 pages open a closed bank (50 ns), the rest close + open
    (100 ns); data flow at peak / 16 between those."""
    pages = nbytes // chip.umc_count // chip.dram.page_bytes
    opens = min(pages, chip.dram.banks_per_umc)
    data_ns = nbytes / chip.umc_count / (chip.dram.peak_gbps / chip.umc_count)
    penalty = opens * chip.dram.open_page_ns + (pages - opens) * (chip.dram.open_page_ns + chip.dram.read_close_page_ns)
    return data_ns / (data_ns + penalty)


def test_streaming_load_reaches_the_page_limited_peak():
    """One 8 MiB DDR -> LMEM load: 512 KiB per UMC = 64 pages of 8 KiB -> 16 opens and 48 row misses per
    UMC: expected 122.88 us of data + 4.8 + 0.8 us of page changes = 95.65 % of 68.264 GB/s. Measured
    over the command (dispatch to end, including the ~0.2 us fill and drain): 95.2 %."""
    b = ProgramBuilder(CHIP)
    b.add(load(CHIP, 0, 0, (1, 64, 256, 128)))
    r = simulate(b.build())
    i = r.index("gdma", 1)
    duration_ns = (r.times["end"][i] - r.times["dispatch"][i]) / 1e3
    ratio = 8 * MIB / duration_ns / CHIP.dram.peak_gbps
    expected = streaming_efficiency(CHIP, 8 * MIB)
    assert abs(expected - 0.9565) < 1e-3
    assert expected - 0.01 < ratio <= expected
    assert int(r.dram.page_misses.sum()) == 16 * 48 and int(r.dram.page_opens.sum()) == 16 * 16


def test_back_to_back_loads_stay_close_to_peak():
    """Sixteen 512 KiB loads one after the other (each starts with empty queues and credits): 89 %."""
    b = ProgramBuilder(CHIP)
    for k in range(16):
        b.add(load(CHIP, k * 512 * 1024, (k % 2) * 0x10000, (1, 64, 16, 128)))
    r = simulate(b.build())
    ratio = 8 * MIB / (r.total_ps / 1e3) / CHIP.dram.peak_gbps
    assert 0.85 < ratio < 0.95


def memory_bound(chip):
    b = ProgramBuilder(chip)
    for k in range(8):
        b.add(load(chip, k * MIB, (k % 2) * 0x10000, (1, 64, 32, 128)))        # 1 MiB each
        b.add(ar("add", 0x30000, (k % 2) * 0x10000, None, (1, 64, 1, 16), b_const=0))
    return b.build()


def compute_bound(chip):
    b = ProgramBuilder(chip)
    b.add(load(chip, 0, 0, (1, 128, 28, 28)))
    b.add(load(chip, MIB, 0x10000, (1, 64, 1, 9 * 128)))
    for k in range(6):
        b.add(conv(0x20000 + (k % 2) * 0x8000, 0, 0x10000, n=1, cin=128, h=28, w=28, cout=64))
        b.add(store(chip, 0x20000 + (k % 2) * 0x8000, 2 * MIB + k * 262144, (1, 64, 28, 28)))
    return b.build()


def test_doubling_ddr_bandwidth_speeds_up_memory_bound_only():
    """Eight 1 MiB loads with a tiny add after each: twice the DRAM peak is faster (page
    changes do not speed up): 1.84x. Six 3x3 convs (128 -> 64, 28x28, fp32: 49 x 9 x 128 cycles = 56 us each)
    behind 0.7 MiB of loads, their 196 KiB stores overlapped: 1.02x (only the first loads shrink)."""
    fast = replace_param(CHIP, "dram.peak_gbps", 2 * CHIP.dram.peak_gbps)
    mem = simulate(memory_bound(CHIP)).total_ps / simulate(memory_bound(fast)).total_ps
    cpu = simulate(compute_bound(CHIP)).total_ps / simulate(compute_bound(fast)).total_ps
    print(f"memory-bound speed-up {mem:.3f}, compute-bound {cpu:.3f}")
    assert mem > 1.6
    assert 1.0 <= cpu < 1.03


def test_more_lanes_make_a_compute_bound_conv_faster():
    """conv 3x3, 64 -> 128 channels, 28x28 fp32: ceil(128/64) = 2 output channel groups on 64 lanes, one on
    128 lanes: the body halves (plus the fixed startup and pipe fill)."""
    def run(chip):
        b = ProgramBuilder(chip)
        b.add(conv(0x20000, 0, 0x10000, n=1, cin=64, h=28, w=28, cout=128))
        return simulate(b.build()).total_ps
    wide = replace_param(CHIP, "core.lanes", 128)
    t64, t128 = run(CHIP), run(wide)
    assert t128 < 0.52 * t64


def bound_ps(program) -> float:
    """max(sum of MACs / peak MAC rate of their dtype, DDR bytes / DDR peak), in ps."""
    chip = program.chip
    compute = sum(tiu_macs(i) / chip.peak_macs_per_second(chip_dtype(i.opt_opd0_prec)) for i in program.tiu
                  if isinstance(i, TiuInstruction) and tiu_macs(i))
    ddr = 0
    for i in program.gdma:
        if isinstance(i, DmaInstruction) and not isinstance(i, SysDma):
            src, dst = transfer_sides(i, chip)
            ddr += sum(s.nbytes for s in (src, dst) if s is not None and not s.lmem)
    return max(compute * 1e12, ddr / chip.ddr_peak_bytes_per_second * 1e12)


SLOTS = (0x0, 0x8000, 0x10000, 0x18000, 0x20000, 0x28000)
op = st.one_of(
    st.tuples(st.just("load"), st.sampled_from(SLOTS), st.integers(0, 63), st.sampled_from([8, 16, 32]),
              st.sampled_from([Prec.FP32, Prec.FP16])),
    st.tuples(st.just("store"), st.sampled_from(SLOTS), st.integers(0, 63), st.sampled_from([8, 16, 32]),
              st.sampled_from([Prec.FP32, Prec.FP16])),
    st.tuples(st.just("conv"), st.sampled_from(SLOTS), st.sampled_from(SLOTS), st.sampled_from([16, 64, 128]),
              st.sampled_from([Prec.FP32, Prec.FP16, Prec.INT8])),
    st.tuples(st.just("add"), st.sampled_from(SLOTS), st.sampled_from(SLOTS), st.sampled_from([8, 16]),
              st.sampled_from([Prec.FP32])),
    st.tuples(st.just("mm"), st.sampled_from(SLOTS), st.sampled_from(SLOTS), st.sampled_from([64, 128]),
              st.sampled_from([Prec.FP32, Prec.BF16])),
)


def random_program(ops):
    b = ProgramBuilder(CHIP)
    for kind, a, x, size, prec in ops:
        p = int(prec)
        if kind == "load":
            b.add(load(CHIP, x * 65536, a, (1, 64, size, size), p))
        elif kind == "store":
            b.add(store(CHIP, a, x * 65536 + (8 << 20), (1, 64, size, size), p))
        elif kind == "conv":
            b.add(conv(0x30000, a, x, n=1, cin=size, h=8, w=8, cout=64, prec=p))
        elif kind == "add":
            b.add(ar("add", 0x30000, a, x, (1, 64, size, size), p))
        else:
            b.add(matmul(0x30000, a, x, 64, size, 64, prec=p))
    return b.build()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, min_size=1, max_size=12))
def test_latency_never_below_the_roofline(ops):
    """Whatever the mix of loads, stores, convs, matmuls and adds: simulated latency >= max(MACs / peak,
    DDR bytes / DDR peak)."""
    program = random_program(ops)
    r = simulate(program)
    assert r.total_ps >= bound_ps(program) * (1 - 1e-12)
    assert r.total_ps >= max(int(e) for e in r.times["end"])
