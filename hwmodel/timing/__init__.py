"""Timing model of one core: IFE, TIU (DPC + bank arbitration), GDMA, TILE and WDC/DRAM on one event heap.

    simulate(program, dep_mode=None) -> SimResult

dep_mode None / "bitmap": the compiled waits, after the IFE check stage has re-derived them from the
chunk bitmaps (a disagreement raises DependencyCheckError; check=False skips the comparison);
"auto": the serialising CSR DIS_AUTO_DEP_ID = 1 mode. Same program -> identical result.
"""

from __future__ import annotations

from tpuflow.hwmodel.timing.cost import instruction_cycles, instruction_latency_cycles
from tpuflow.hwmodel.timing.deps import DependencyCheckError, resolve_waits
from tpuflow.hwmodel.timing.result import STAGES, STALLS, DramResult, SimResult
from tpuflow.program import Program


def simulate(program: Program, *, dep_mode: str | None = None, check: bool = True) -> SimResult:
    """Simulate `program` on its chip; see the package docstring."""
    from tpuflow.hwmodel.timing.core import Simulator

    accesses: list = [[], [], []]
    waits = resolve_waits(program, dep_mode, check=check, keep=accesses)
    return Simulator(program, waits, accesses).run()


__all__ = ["simulate", "SimResult", "DramResult", "STAGES", "STALLS", "DependencyCheckError",
           "instruction_cycles", "instruction_latency_cycles"]
