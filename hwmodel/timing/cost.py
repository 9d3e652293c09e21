"""Fast per-instruction cost estimates (no simulation) for the scheduler, from the simulator's own formulas.

instruction_cycles(instr, chip) is in cycles of the instruction's engine clock:
* TIU: startup + body + bank-conflict bubbles (compute.py, banks.py): how long the instruction
  occupies its DPC's COMPUTE stage, i.e. its share of a back-to-back stream. Alone it also pays the
  pipe fill (DES + GEN + ISSUE + ARB delays) and the compute latency: instruction_latency_cycles.
* TILE: compute.tile_cycles.
* GDMA: cmd setup + max(GDMA bus cycles, DDR bytes at dram.peak_gbps, LMEM-port cycles) + the
  unloaded latency of one burst (DDR page hit or LMEM access); SYS commands cost the setup.
"""

from __future__ import annotations

from tpuflow.chip import ChipConfig
from tpuflow.hwmodel.timing.banks import bank_bubbles
from tpuflow.hwmodel.timing.clocks import Clocks, ns_to_ps
from tpuflow.hwmodel.timing.compute import CUBE, cdiv, tile_cycles, tiu_work
from tpuflow.hwmodel.timing.segments import side_bursts, transfer_sides
from tpuflow.hwmodel.timing.wdc import WdcParams
from tpuflow.isa import DmaInstruction, Instruction, SysDma, TileInstruction, TiuInstruction


def tiu_cycles(instr: TiuInstruction, chip: ChipConfig) -> int:
    work = tiu_work(instr, chip)
    return work.startup + work.body + bank_bubbles(instr, chip)


def instruction_latency_cycles(instr: TiuInstruction, chip: ChipConfig) -> int:
    """Dispatch-to-end cycles of a TIU instruction running alone on an idle TIU."""
    work = tiu_work(instr, chip)
    t = chip.tiu
    if work.pipe == CUBE:
        fill = t.cube_des_delay_cycles + t.cube_gen_delay_cycles + t.cube_issue_delay_cycles + t.cube_arb_delay_cycles
    else:
        fill = t.vector_des_delay_cycles + t.vector_gen_delay_cycles + t.vector_issue_delay_cycles
    return fill + tiu_cycles(instr, chip) + work.latency


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
    ddr = sum(s.nbytes for s in (src, dst) if s is not None and not s.lmem)
    bus = cdiv(nbytes, g.bus_bytes)
    ddr_cycles = cdiv(round(ddr / chip.dram.peak_gbps * 1000), period)
    bus = max(bus, max(_issue_cycles(side, chip) for side in (src, dst) if side is not None))
    if ddr:
        latency = _wdc(chip).unloaded_read_ps(g.bus_bytes * g.max_burst_beats)
    else:
        latency = ns_to_ps(g.lmem_access_latency_ns)
    return g.cmd_setup_cycles + max(bus, ddr_cycles) + cdiv(latency, period)


def _issue_cycles(side, chip: ChipConfig) -> int:
    """Cycles to issue a side's bursts one by one: the per-burst issue cost, plus the unaligned
    penalty of bursts that do not start on the bus width (small strided segments pay it each)."""
    g = chip.gdma
    bursts = side_bursts(side, chip, g.bus_bytes * g.max_burst_beats)
    return int(len(bursts.size) * g.segment_issue_cycles + int(bursts.unaligned.sum()) * g.unaligned_penalty_cycles)


def instruction_cycles(instr: Instruction, chip: ChipConfig) -> int:
    """Cost estimate in cycles of the instruction's engine clock (see the module docstring)."""
    if isinstance(instr, TiuInstruction):
        return tiu_cycles(instr, chip)
    if isinstance(instr, TileInstruction):
        return tile_cycles(instr, chip)
    if isinstance(instr, DmaInstruction):
        return gdma_cycles(instr, chip)
    raise TypeError(f"not an instruction: {type(instr).__name__}")
