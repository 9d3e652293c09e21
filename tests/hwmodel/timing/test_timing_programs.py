"""The timing model on compiled programs and on its public surface: the IFE check agrees with the
compiler, SimResult is columnar and complete, cost estimates match the simulator's formulas."""

import csv
import io

import numpy as np
import pytest

from tpuflow.chip import load_chip
from tpuflow.hwmodel.timing import STAGES, STALLS, instruction_cycles, simulate
from tpuflow.hwmodel.timing.compute import tile_cycles, tiu_work
from tpuflow.hwmodel.timing.synthetic import ProgramBuilder, ar, conv, copy_bytes, load, store
from tpuflow.isa import TMatmul, tile_ref
from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model

CHIP = load_chip("sg2260")


@pytest.mark.parametrize("model,matmul", [("small_cnn", "tiu"), ("mlp", "tile"), ("small_cnn", "tile")])
def test_compiled_programs_pass_the_ife_check_and_finish(model, matmul):
    """The check stage re-derives every compiled wait (bitmaps, id window, SYS tile waits) and agrees;
    every instruction ends, in order per engine, after it started, and after its IFE issue."""
    _, program = compile_model(model, CHIP, CompileOptions(matmul=matmul, schedule="program"))
    r = simulate(program)
    assert r.total_ps > 0 and len(r) == program.instruction_count
    for code in range(3):
        rows = r.engine == code
        assert np.all(np.diff(r.times["end"][rows]) >= 0)
    assert np.all(r.times["end"] >= r.times["start"])
    assert np.all(r.times["dispatch"] >= r.times["issue"])
    assert np.all(np.diff(r.times["issue"][np.argsort(r.times["issue"], kind="stable")]) >= 0)
    if matmul == "tile":
        assert r.busy_ps["tile"] > 0


def test_auto_mode_is_never_faster_on_a_compiled_program():
    _, program = compile_model("small_cnn", CHIP, CompileOptions(schedule="program"))
    assert simulate(program, dep_mode="auto").total_ps >= simulate(program).total_ps


def test_simresult_is_columnar_and_rows_make_a_csv():
    b = ProgramBuilder(CHIP)
    b.add(load(CHIP, 0, 0, (1, 64, 8, 8)))
    b.add(ar("add", 0x8000, 0x0, 0x4000, (1, 64, 8, 8)))
    b.add(store(CHIP, 0x8000, 1 << 20, (1, 64, 8, 8)))
    r = simulate(b.build())
    assert all(isinstance(r.times[s], np.ndarray) and len(r.times[s]) == 3 for s in STAGES)
    assert all(isinstance(r.stalls[c], np.ndarray) for c in STALLS)
    rows = list(r.rows())
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    back = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert [row["engine"] for row in back] == ["tiu", "gdma", "gdma"]
    assert back[0]["op"] == "arith.add" and int(back[0]["cmd_id_dep"]) == 1
    assert float(back[0]["end_ns"]) * 1000 == r.times["end"][0]
    s = r.summary()
    assert s["instructions"] == {"tiu": 1, "gdma": 2, "tile": 0}
    assert s["dram"]["bytes_read"] == 64 * 64 * 4 and s["dram"]["bytes_written"] == 64 * 64 * 4
    assert r.busy_ps["gdma"] <= r.total_ps and r.busy_ps["tiu"] == r.times["end"][0] - r.times["start"][0]


def test_cost_estimate_matches_the_simulated_body():
    """instruction_cycles of a TIU instruction = the cycles it holds COMPUTE in the simulator; of a TILE
    block = its simulated duration; of a GDMA load >= bytes / peak and within 2x of the simulation."""
    c = conv(0x8000, 0x0, 0x4000, n=1, cin=64, h=8, w=8, cout=64)
    b = ProgramBuilder(CHIP)
    b.add(c)
    r = simulate(b.build())
    body = r.times["end"][0] - r.times["start"][0] - tiu_work(c, CHIP).latency * 1000
    assert body == instruction_cycles(c, CHIP) * 1000
    mm = TMatmul(fn="TMATMUL", dt="FP16", m=64, n=64, k=64, src0=tile_ref("T", 1), src1=tile_ref("U", 1), acc_size=12)
    # 4 x 4 x 4 fractal steps x 4096 MACs / 8192 per cycle = 32, + fill 32 + overhead 2
    assert instruction_cycles(mm, CHIP) == tile_cycles(mm, CHIP) == 66
    ld = copy_bytes(CHIP, 0, 0, 1 << 20, dst_lmem=True)
    b = ProgramBuilder(CHIP)
    b.add(ld)
    r = simulate(b.build())
    simulated = (r.times["end"][0] - r.times["dispatch"][0]) / 1000
    estimate = instruction_cycles(ld, CHIP)
    assert estimate >= (1 << 20) / CHIP.dram.peak_gbps
    assert simulated / 2 < estimate < simulated * 2


@pytest.mark.parametrize("chip_name", ["sg2260", "bm1684x", "sg2262"])
def test_every_builtin_chip_simulates_a_compiled_model(chip_name):
    """small_cnn compiled for each built-in chip: the check agrees, and the narrower sg2262 (16 lanes,
    34.1 GB/s) is slower than sg2260."""
    chip = load_chip(chip_name)
    _, program = compile_model("small_cnn", chip, CompileOptions(schedule="program"))
    r = simulate(program)
    assert r.total_ps > 0 and r.dram.peak_gbps == chip.dram.peak_gbps
    if chip_name == "sg2262":
        _, ref = compile_model("small_cnn", CHIP, CompileOptions(schedule="program"))
        assert r.total_ps > simulate(ref).total_ps


def test_solving_gdma_commands_in_chunks_changes_nothing():
    """The command table is solved in chunks of commands (memory); the DRAM page state carries over, so
    any chunk size gives the same timelines and counters."""
    from tpuflow.hwmodel.timing.clocks import Clocks
    from tpuflow.hwmodel.timing.gdma import CommandModel
    b = ProgramBuilder(CHIP)
    for k in range(12):
        b.add(load(CHIP, k * 40_000, (k % 3) * 0x10000, (1, 64, 8, 16 + k)))
        b.add(store(CHIP, (k % 3) * 0x10000, (1 << 24) + k * 50_000, (1, 64, 8, 16 + k)))
    gdma = b.build().gdma
    whole = CommandModel(CHIP, Clocks.of(CHIP)).table(gdma)
    small = CommandModel(CHIP, Clocks.of(CHIP))
    small.CHUNK_BURSTS = 50
    parts = small.table(gdma)
    for field in ("end", "credit_stall", "dram_stall", "ddr_bursts", "dram_first", "dram_last"):
        assert (getattr(whole, field) == getattr(parts, field)).all(), field
    assert (whole.state.page_misses == parts.state.page_misses).all()
