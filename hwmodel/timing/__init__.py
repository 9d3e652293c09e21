"""Timing model of a chip: IFE, TIU (DPC + bank arbitration), GDMA, TILE of every core and the shared
WDC/DRAM on one event heap.

    simulate(program, dep_mode=None, check=True, memory="rate") -> SimResult

dep_mode None / "bitmap": the compiled waits, after the IFE check stage has re-derived them from the
chunk bitmaps (deps.py; a disagreement raises DependencyCheckError, check=False skips the comparison);
"auto": the serialising CSR DIS_AUTO_DEP_ID = 1 mode. Time is integer picoseconds, events are ordered
by (time, priority, sequence): the same program gives the same result, bit for bit.
memory "rate" (default): GDMA commands are flows of the shared DRAM (transfers.py, occupancy.py,
memory.py), their rates recomputed when a transfer starts or ends; "burst": the per-burst GDMA/WDC
solve of one core (gdma.py, wdc.py), kept for its exact per-request facts and for comparison.
A Program with several cores (Program.core_count) runs every core on the same heap (cores.py): DRAM
shared by all, SEND/WAIT messages between them; SimResult.cores holds one result per core.

Modules (each docstring states its exact rules, which the exact-timeline tests check):
  clocks       clock domains, ps periods, edge alignment
  events       the event heap
  descriptors  descriptor sizes (TXI words, command-FIFO bytes)
  ife          IFE stage recurrences, issue, request FIFOs, hand-over to the command lists
  engines      TIU (vector / cube DPC pipes), GDMA (flows or per-burst table), TILE as event-driven components
  compute      TPUPerf-derived cycle formulas (TIU classes, TILE blocks)
  banks        LMEM bank-conflict bubbles from the operands' real addresses
  segments     GDMA segmentation and bursts
  transfers    rate model: per command latency, port and credit limits, DRAM occupancy per UMC
  occupancy    rate model: DRAM occupancy once per distinct request pattern, page state across commands
  memory       rate model: the shared DRAM, max-min fair flow speeds
  cores        several cores on one heap, the message board, deadlock reports
  gdma         per-burst model: GDMA command timelines (credits, LMEM port, data bus), one queue
  wdc          per-burst model: fabrics, outstanding limits, interleave, AuxCam, X2x, DramUnit
  cost         fast per-instruction cost estimates (the scheduler's durations), same formulas
  result       SimResult (columnar) and its CSV rows, per-core rows
  synthetic    hand-built programs for tests and benchmarks

Modelling choices worth knowing (details in the modules):
  * Rate model: a command alone takes latency + max(port, credit, DRAM occupancy of its busiest UMC);
    with other cores' commands in flight the UMCs are shared max-min fair (memory.py). One core never
    has two commands in flight, so its timeline is the solo one (exact integers). The DRAM page state
    is per core; the fabric's outstanding limits are not modelled (the per-burst model has them).
  * Descriptors are counted at their long-form size in the command FIFOs.
  * TIU instructions retire in order; a switch between the cube and the vector pipe waits for the
    previous instruction to end.
  * The TILE engine is its own engine: its CUBE is not shared with the TIU's cube pipe.

How it stays fast (benchmarks/timing_bench.py; benchmarks/timing_identity.py checks that none of it changes
a timeline, field for field, on 17 programs): engine identity and waits come from the ISA (Engine.code,
Instruction.waits()); the IFE check derives every wait at once over (chunk, issue position) rows (deps.py);
equal instructions (ignoring their waits) are found by their field tuples and share accesses, TIU work and
bank bubbles; a dma.tensor's transfer shape is computed once per form (fields but addresses, and the burst
positions of its addresses); DRAM occupancy once per distinct request pattern, the open rows carried from
command to command by one "previous command on this bank" pass; the event loop keeps Python lists, pushes
onto the heap directly on its hot paths, pokes only the engines that can be released, and fills the result
columns once after the run; the cyclic garbage collector is paused during a run (the simulator's own
cycle is broken after it). What is left (synthetic ResNet-50-sized program, about 0.2 s): the IFE and engine
events (about 30%), the per-pattern DRAM pass, the instructions' accesses() for the IFE check, and the
per-process caches of isa.ddr_range / lmem_ranges and of the burst lists, which a first run fills.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager

from tpuflow.hwmodel.timing.cost import instruction_cycles, instruction_latency_cycles
from tpuflow.hwmodel.timing.deps import DependencyCheckError, resolve_waits, same_instructions
from tpuflow.hwmodel.timing.result import STAGES, STALLS, DramResult, SimResult
from tpuflow.program import Program


def simulate(program: Program, *, dep_mode: str | None = None, check: bool = True, memory: str = "rate") -> SimResult:
    """Simulate `program` on its chip; see the package docstring. memory: "rate" (transfers as flows of
    the shared memory, memory.py) or "burst" (the per-burst GDMA/WDC solve, gdma.py)."""
    from tpuflow.hwmodel.timing.core import Simulator

    with _cyclic_gc_paused():
        if program.core_count > 1:
            from tpuflow.hwmodel.timing.cores import simulate_cores
            return simulate_cores(program, dep_mode=dep_mode, check=check, memory=memory)
        accesses: list = [[], [], []]
        same = same_instructions(program)
        waits = resolve_waits(program, dep_mode, check=check, keep=accesses, same=same)
        sim = Simulator(program, waits, accesses, same, memory=memory)
        result = sim.run()
        sim.release()
        return result


@contextmanager
def _cyclic_gc_paused():
    """No cyclic garbage collection while simulating: a run allocates many small objects (access ranges,
    events) that all stay alive to its end, so the collector's passes find nothing and cost up to a third of
    a run. Reference counting still frees everything; cycles are collected after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


__all__ = ["simulate", "SimResult", "DramResult", "STAGES", "STALLS", "DependencyCheckError",
           "instruction_cycles", "instruction_latency_cycles"]
