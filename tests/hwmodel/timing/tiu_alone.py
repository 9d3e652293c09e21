"""Test helper: one TIU instruction run alone on the timing model."""

from tpuflow.hwmodel.timing import simulate
from tpuflow.hwmodel.timing.synthetic import ProgramBuilder


def tiu_alone(instr, chip) -> tuple[tuple[int, int, int], int]:
    """((dispatch, start, end) in cycles, bank-conflict stall cycles) of `instr` alone on `chip`."""
    b = ProgramBuilder(chip)
    b.add(instr)
    r = simulate(b.build())
    i = r.index("tiu", 1)
    return tuple(int(r.times[s][i]) for s in ("dispatch", "start", "end")), int(r.stall_cycles("bank_conflict")[i])
