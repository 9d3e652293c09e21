"""The one per-instruction cost model (no simulation): what the scheduler's DAG, its bounds and the
lowering's tiling choices charge for an instruction, from the simulator's own formulas and chip keys.

instruction_cycles(instr, chip) is in cycles of the instruction's engine clock:
* TIU: startup + body + bank-conflict bubbles (compute.py, banks.py; the body counts
  compute.cube_cycles_per_step per cube step): how long the instruction occupies its DPC's COMPUTE
  stage, i.e. its share of a back-to-back stream. After a wait it first pays the pipe fill
  (pipe_fill_cycles: DES + GEN + ISSUE [+ ARB]), and its result is visible after the compute latency:
  instruction_latency_cycles is fill + cycles + latency (one instruction alone on an idle TIU).
* TILE: compute.tile_cycles (TMOVE: tmove_cycles, TIMG2COL: the expansion path), of which the block
  holds the TILE engine tile_engine_cycles.
* GDMA: cmd setup + max(transfer, direction floor), where transfer = max(GDMA bus cycles, DDR bytes at
  dram.peak_gbps, burst-issue cycles) + the unloaded latency of one burst (DDR page hit or LMEM
  access), and the direction floor is the simulator's: DDR-side bytes, each contiguous run charged at
  least gdma.min_run_bytes (one-element runs gdma.element_load/store_run_bytes), / (gdma.s2l / l2s / s2s_gbps x
  gdma.direction_efficiency) (gdma.py). SYS commands cost the setup.
instruction_timing_ps(instr, chip) gives the scheduler's (duration, head, tail) in ps from those.
Every term is a lower estimate of what the simulator charges the instruction alone, so chains and
per-engine sums of these costs bound the simulated makespan from below.
"""

from __future__ import annotations

from tpuflow.chip import ChipConfig
from tpuflow.hwmodel.timing.banks import bank_bubbles
from tpuflow.hwmodel.timing.clocks import Clocks, ns_to_ps, period_ps
from tpuflow.hwmodel.timing.compute import CUBE, cdiv, tile_cycles, tiu_work
from tpuflow.hwmodel.timing.gdma import DDR, LMEM, charged_ddr_bytes, direction_floor_ps
from tpuflow.hwmodel.timing.segments import side_bursts, sides_ddr_bytes, transfer_sides
from tpuflow.hwmodel.timing.wdc import WdcParams
from tpuflow.isa import (AccCvt, DmaInstruction, Engine, Instruction, Prec, SysDma, TensorDma, TileInstruction,
                         TiuInstruction, TImg2Col, TMatmul, TMove, global_lmem_address)


def tiu_cycles(instr: TiuInstruction, chip: ChipConfig) -> int:
    work = tiu_work(instr, chip)
    return work.startup + work.body + bank_bubbles(instr, chip)


def pipe_fill_cycles(instr: TiuInstruction, chip: ChipConfig) -> int:
    """DPC stages an instruction passes before COMPUTE: cube DES + GEN + ISSUE + ARB, vector DES + GEN + ISSUE."""
    t = chip.tiu
    if tiu_work(instr, chip).pipe == CUBE:
        return t.cube_des_delay_cycles + t.cube_gen_delay_cycles + t.cube_issue_delay_cycles + t.cube_arb_delay_cycles
    return t.vector_des_delay_cycles + t.vector_gen_delay_cycles + t.vector_issue_delay_cycles


def instruction_latency_cycles(instr: TiuInstruction, chip: ChipConfig) -> int:
    """Dispatch-to-end cycles of a TIU instruction running alone on an idle TIU."""
    return pipe_fill_cycles(instr, chip) + tiu_cycles(instr, chip) + tiu_work(instr, chip).latency


_PARAMS: dict[int, tuple[ChipConfig, WdcParams]] = {}


def _wdc(chip: ChipConfig) -> WdcParams:
    """WdcParams of a chip, remembered per chip object (ChipConfig holds mappings: not hashable)."""
    hit = _PARAMS.get(id(chip))
    if hit is None or hit[0] is not chip:
        if len(_PARAMS) > 32:
            _PARAMS.clear()
        hit = _PARAMS[id(chip)] = (chip, WdcParams.of(chip, Clocks.of(chip)))
    return hit[1]


def gdma_cycles(instr: DmaInstruction, chip: ChipConfig) -> int:
    g = chip.gdma
    period = Clocks.of(chip).gdma.period
    if isinstance(instr, SysDma):
        return g.cmd_setup_cycles
    src, dst = transfer_sides(instr, chip)
    nbytes = dst.nbytes
    ddr = sides_ddr_bytes(src, dst)
    bus = cdiv(nbytes, g.bus_bytes)
    ddr_cycles = cdiv(round(ddr / chip.dram.peak_gbps * 1000), period)
    bus = max(bus, max(_issue_cycles(side, chip) for side in (src, dst) if side is not None))
    if ddr:   # one burst's round trip: a full burst, or the whole transfer when it is smaller
        latency = _wdc(chip).unloaded_read_ps(min(nbytes, g.bus_bytes * g.max_burst_beats))
    else:
        latency = ns_to_ps(g.lmem_access_latency_ns)
    transfer = max(bus, ddr_cycles) + cdiv(latency, period)
    kind = (lambda side: 0 if side is None else LMEM if side.lmem else DDR)
    charged = [charged_ddr_bytes(chip, src, dst)]
    floor = int(direction_floor_ps(chip, [kind(src)], [kind(dst)], charged, charged)[0])
    return g.cmd_setup_cycles + max(transfer, floor // period)


def _issue_cycles(side, chip: ChipConfig) -> int:
    """Cycles to issue a side's bursts one by one: the per-burst issue cost, plus the unaligned
    penalty of bursts that do not start on the bus width (small strided segments pay it each)."""
    g = chip.gdma
    bursts = side_bursts(side, chip, g.bus_bytes * g.max_burst_beats)
    return int(len(bursts.size) * g.segment_issue_cycles + int(bursts.unaligned.sum()) * g.unaligned_penalty_cycles)


def tmove_cycles(instr: TMove, chip: ChipConfig) -> int:
    """Tile-clock cycles of a TMOVE on the tile buffer's DMA port: latency + bytes / port width, or
    with a DDR side the GDMA's estimate of its descriptor."""
    acc = instr.desc.accesses(chip)
    if acc.ddr_reads or acc.ddr_writes:
        return cdiv(gdma_cycles(instr.desc, chip) * int(chip.clocks.tile_clock_mhz), int(chip.clocks.gdma_clock_mhz))
    t = chip.tile
    return t.move_port_latency_cycles + cdiv(instr.desc.nbytes, max(1, t.move_port_bytes_per_cycle))


def instruction_cycles(instr: Instruction, chip: ChipConfig) -> int:
    """Cost estimate in cycles of the instruction's engine clock (see the module docstring)."""
    if isinstance(instr, TiuInstruction):
        return tiu_cycles(instr, chip)
    if isinstance(instr, TMove):
        return tmove_cycles(instr, chip)
    if isinstance(instr, TImg2Col):       # on the tile buffer's expansion path
        from tpuflow.hwmodel.timing.engines import unit_cycles
        return unit_cycles(instr, chip)
    if isinstance(instr, TileInstruction):
        return tile_cycles(instr, chip)
    if isinstance(instr, DmaInstruction):
        return gdma_cycles(instr, chip)
    raise TypeError(f"not an instruction: {type(instr).__name__}")


def tile_engine_cycles(instr: TileInstruction, chip: ChipConfig) -> int:
    """Tile cycles a block holds the TILE engine before it takes the next (engines.TileEngine): a TMATMUL /
    TGEMV its cycles without the cube's fill latency (the next one streams behind it), a TMOVE / TIMG2COL
    the hand-over to the port / expansion path, an ACCCVT the hand-over when the ACCs drain on a path of
    their own (tile.acc_buffers > 1); the rest of instruction_cycles is the time until its result lands."""
    t = chip.tile
    if isinstance(instr, TMatmul):
        return tile_cycles(instr, chip) - t.fill_latency_cycles
    if isinstance(instr, (TMove, TImg2Col)) or (isinstance(instr, AccCvt) and t.acc_buffers > 1):
        return t.block_overhead_cycles
    return instruction_cycles(instr, chip)


def engine_period_ps(instr: Instruction, chip: ChipConfig) -> int:
    """Clock period (ps) of the engine that runs the instruction."""
    clocks = chip.clocks
    mhz = {Engine.TIU: clocks.tiu_clock_mhz, Engine.GDMA: clocks.gdma_clock_mhz, Engine.TILE: clocks.tile_clock_mhz}
    return period_ps(mhz[instr.ENGINE])


def instruction_timing_ps(instr: Instruction, chip: ChipConfig) -> tuple[int, int, int]:
    """(duration, head, tail) in ps: how long the instruction holds its engine; for a TIU
    instruction also the pipe fill paid after a cross-engine wait (head) and the compute latency
    before its result counts as done (tail); a TILE block's tail is the rest of its cycles after it
    lets the engine go (tile_engine_cycles); GDMA has neither."""
    period = engine_period_ps(instr, chip)
    cycles = instruction_cycles(instr, chip)
    if isinstance(instr, TileInstruction):
        held = min(cycles, tile_engine_cycles(instr, chip))
        return max(1, held * period), 0, (cycles - held) * period
    if not isinstance(instr, TiuInstruction):
        return max(1, cycles * period), 0, 0
    fill = pipe_fill_cycles(instr, chip)
    tail = max(0, instruction_latency_cycles(instr, chip) - cycles - fill)
    return max(1, cycles * period), fill * period, tail * period


def instruction_ps(instr: Instruction, chip: ChipConfig) -> int:
    """Dispatch-to-done ps of an instruction alone (duration + head + tail): the cost a search that
    only compares alternatives (tilings, layer groups) should charge."""
    return sum(instruction_timing_ps(instr, chip))


def tile_load_cycles(chip: ChipConfig, rows: int, cols: int, esize: int, *, runtime: bool,
                     piece_elems: int | None = None, batch: int = 1) -> float:
    """gdma_cycles per tile of bringing rows x cols tiles into LMEM tile layout (chunks of one K
    fractal, tile.k_fractal_bytes, row by row):
    * runtime: one strided DMA per tile from a row-major matrix whose rows are 4 x cols elements
      apart, in contiguous pieces of `piece_elems` elements (default a whole chunk row; 1 when the
      source runs the other way: element by element);
    * constant (pre-arranged in the weight image): one contiguous DMA per `batch` tiles.
    With a tile buffer (tile.buffer_chunk_bytes > 0) a runtime tile is read in its source order and
    converted in flight: one DMA per `batch` tiles whose DDR side is runs of `piece_elems` elements
    (default a tile row of `cols`), 4 runs apart; the slot side costs its bytes (segments.py)."""
    k0 = max(1, chip.tile.k_fractal_bytes // esize)
    piece = min(k0, piece_elems or k0)
    key = (id(chip), rows, cols, esize, runtime, piece_elems, batch)
    hit = _TILE_LOADS.get(key)
    if hit is not None and hit[0] is chip:
        return hit[1]
    if runtime and chip.tile.buffer_chunk_bytes:
        cycles = _buffered_load_cycles(chip, rows * cols * batch, piece_elems or cols, esize) / batch
        _TILE_LOADS[key] = (chip, cycles)
        return cycles
    chunks = cdiv(cols, k0)
    prec = int({1: Prec.INT8, 2: Prec.FP16, 4: Prec.FP32}[esize])
    ddr, lmem, row = 1 << 30, global_lmem_address(0, chip), 4 * chunks * k0
    if runtime:
        gap = 1 if piece == k0 else row               # element stride inside a chunk row
        instr = TensorDma(src_start_addr=ddr, dst_start_addr=lmem,
                          src_nsize=chunks, src_csize=1, src_hsize=rows, src_wsize=k0,
                          src_nstride=k0 * gap, src_cstride=0, src_hstride=row if piece == k0 else 1,
                          src_wstride=gap, dst_nsize=chunks, dst_csize=1, dst_hsize=rows, dst_wsize=k0,
                          dst_nstride=rows * k0, dst_cstride=0, dst_hstride=k0, dst_wstride=1, src_data_format=prec)
        cycles = float(gdma_cycles(instr, chip))
    else:
        elems = chunks * rows * k0
        instr = TensorDma(src_start_addr=ddr, dst_start_addr=lmem,
                          src_nsize=1, src_csize=batch, src_hsize=1, src_wsize=elems,
                          src_nstride=batch * elems, src_cstride=elems, src_hstride=elems, src_wstride=1,
                          dst_nsize=1, dst_csize=batch, dst_hsize=1, dst_wsize=elems,
                          dst_nstride=batch * elems, dst_cstride=elems, dst_hstride=elems, dst_wstride=1,
                          src_data_format=prec)
        cycles = gdma_cycles(instr, chip) / batch
    if len(_TILE_LOADS) > 512:
        _TILE_LOADS.clear()
    _TILE_LOADS[key] = (chip, cycles)
    return cycles


_TILE_LOADS: dict[tuple, tuple[ChipConfig, float]] = {}


def _buffered_load_cycles(chip: ChipConfig, elems: int, run: int, esize: int) -> int:
    """gdma_cycles of one DMA of `elems` elements from DDR runs of `run` elements into a tile slot."""
    run = max(1, min(run, elems))
    runs = min(cdiv(elems, run), 65535)          # a descriptor dimension holds 16 bits
    prec = int({1: Prec.INT8, 2: Prec.FP16, 4: Prec.FP32}[esize])
    slot = global_lmem_address(chip.tile_slot_address(0, 0), chip)
    instr = TensorDma(src_start_addr=1 << 30, dst_start_addr=slot,
                      src_nsize=1, src_csize=1, src_hsize=runs, src_wsize=run,
                      src_nstride=4 * run * runs, src_cstride=4 * run * runs, src_hstride=4 * run, src_wstride=1,
                      dst_nsize=1, dst_csize=1, dst_hsize=runs, dst_wsize=run,
                      dst_nstride=run * runs, dst_cstride=run * runs, dst_hstride=run, dst_wstride=1,
                      src_data_format=prec)
    return gdma_cycles(instr, chip)
