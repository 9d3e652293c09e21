"""Lower bounds on the makespan of any order of a program: critical path, per-engine busy time, the
per-engine one-machine relaxation (busy time with heads and tails, Jackson's preemptive rule) and
the roofline (MACs at the MAC engines' combined peak, DDR bytes at the DRAM peak; on several cores
the cores' peaks, and the DRAM bandwidth they share, dram.chip_peak_gbps).

The critical path, busy times and relaxations are in the scheduler's DAG model (hwmodel.timing.cost,
the one per-instruction cost model; precise hazards only), so they bound every schedule as that model
times it (schedule_bound_ps: their maximum); the roofline terms use only the chip's peaks.
`bounds_summary` puts a makespan (the upper bound: an achieved schedule) next to them with the gap.
"""

from __future__ import annotations

import heapq

import numpy as np

from tpuflow.isa import Engine, Prec
from tpuflow.program import Program
from tpuflow.scheduler.dag import Dag, build_dag
from tpuflow.scheduler.listsched import EdgeTable, bottom_levels

ENGINE_NAMES = tuple(e.value for e in Engine)     # by Engine.code


def unit_names(dag: Dag) -> tuple[str, ...]:
    """Name of each engine slot of the DAG: the engine's on one core, `core<k>.<engine>` on several."""
    if dag.units == len(ENGINE_NAMES):
        return ENGINE_NAMES
    return tuple(f"core{u // len(ENGINE_NAMES)}.{ENGINE_NAMES[u % len(ENGINE_NAMES)]}" for u in range(dag.units))


def critical_path_ps(dag: Dag, edges: EdgeTable | None = None) -> int:
    """Longest chain of the DAG (durations + lags), as if every node had an engine of its own."""
    if dag.size == 0:
        return 0
    starts = _unconstrained_starts(dag, edges or EdgeTable(dag))
    return int((starts + dag.duration + dag.tail).max())


def engine_relaxation_ps(dag: Dag, edges: EdgeTable | None = None) -> dict[str, int]:
    """Per engine, the optimum of its one-machine relaxation with heads and tails: its nodes may
    not start before their longest chain from the sources (head) and are followed by their longest
    chain to the end (tail), and may be preempted; Jackson's rule (run the released node with the
    longest tail) solves that exactly, and no real schedule can beat it. It is at least the
    engine's busy time plus the smallest head and tail."""
    edges = edges or EdgeTable(dag)
    heads = _unconstrained_starts(dag, edges)
    tails = bottom_levels(dag, edges) - dag.duration
    out = {}
    for code, name in enumerate(unit_names(dag)):
        mine = np.flatnonzero(dag.engine == code)
        out[name] = _jackson(heads[mine].tolist(), dag.duration[mine].tolist(), tails[mine].tolist())
    return out


def _jackson(release: list[int], work: list[int], tail: list[int]) -> int:
    """Makespan of Jackson's preemptive schedule on one machine (0 without jobs)."""
    jobs = sorted(range(len(release)), key=lambda j: release[j])
    left = list(work)
    ready: list[tuple[int, int]] = []
    t, best, k = 0, 0, 0
    while k < len(jobs) or ready:
        if not ready and release[jobs[k]] > t:
            t = release[jobs[k]]
        while k < len(jobs) and release[jobs[k]] <= t:
            heapq.heappush(ready, (-tail[jobs[k]], jobs[k]))
            k += 1
        _, j = ready[0]
        horizon = release[jobs[k]] if k < len(jobs) else t + left[j]
        run = min(left[j], horizon - t)
        t += run
        left[j] -= run
        if left[j] == 0:
            heapq.heappop(ready)
            best = max(best, t + tail[j])
    return best


def _unconstrained_starts(dag: Dag, edges: EdgeTable) -> np.ndarray:
    starts = [0] * dag.size
    pp, pred, off = edges.pred_ptr, edges.pred, edges.pred_offset
    for b in range(dag.size):
        s = 0
        for k in range(pp[b], pp[b + 1]):
            v = starts[pred[k]] + off[k]
            if v > s:
                s = v
        starts[b] = s
    return np.asarray(starts, dtype=np.int64)


def program_macs(program: Program) -> int:
    return sum(layer.macs for layer in program.layers.values())


def int8_product_layers(program: Program) -> set[str]:
    """Layers whose CONV / MM2 instructions (on any core) read int8 operands: their MACs run at the
    chip's int8 rate, not the program's float dtype's."""
    from tpuflow.isa.tiu import ConvTiu, Mm2Tiu
    return {view.layer_of(Engine.TIU, i) for view in (program.core(k) for k in range(program.core_count))
            for i, instr in enumerate(view.tiu)
            if isinstance(instr, (ConvTiu, Mm2Tiu)) and instr.opt_opd0_prec == Prec.INT8}


def int8_macs(program: Program) -> int:
    """The MACs of int8_product_layers."""
    return sum(program.layers[name].macs for name in int8_product_layers(program) if name in program.layers)


def ddr_bytes(program: Program) -> int:
    """DDR bytes the GDMA instructions of every core read plus write (hwmodel.timing.segments.ddr_bytes)."""
    from tpuflow.hwmodel.timing.segments import ddr_bytes as instruction_ddr_bytes
    return sum(instruction_ddr_bytes(instr, program.chip)
               for k in range(program.core_count) for instr in program.core(k).gdma)


def roofline_ps(program: Program) -> tuple[int, int]:
    """(compute, memory) roofline bounds in ps (the MACs of int8 CONV / MM2 layers at the int8 peak).
    On N cores: N times one core's MAC peak, and the DDR
    bytes of every core at the DRAM rate the cores share (N ports, at most dram.chip_peak_gbps)."""
    chip, cores = program.chip, program.core_count
    dtype = program.options.get("dtype", "fp32")
    peak_per_ps = chip.peak_macs_per_second(dtype, "tiu") / 1e12
    if any(s.tile for s in program.cores):
        peak_per_ps += chip.peak_macs_per_second(dtype, "tile") / 1e12
    peak_per_ps *= cores
    integer = int8_macs(program)
    int8_per_ps = chip.peak_macs_per_second("int8", "tiu") / 1e12 * cores
    compute = int((program_macs(program) - integer) / peak_per_ps + integer / int8_per_ps) if peak_per_ps else 0
    gbps = chip.dram.peak_gbps if cores == 1 else min(cores * chip.dram.peak_gbps, chip.ddr_chip_peak_bytes_per_second / 1e9)
    memory = int(ddr_bytes(program) / (gbps * 1e-3))   # GB/s = bytes per ns
    return compute, memory


def lower_bounds(program: Program, dag: Dag | None = None) -> dict:
    """Every bound in ps, the binding one and its value (`lower_bound_ps`)."""
    dag = dag or build_dag(program)
    edges = EdgeTable(dag)
    busy = {name: int(dag.duration[dag.engine == code].sum()) for code, name in enumerate(unit_names(dag))}
    relaxed = engine_relaxation_ps(dag, edges)
    compute, memory = roofline_ps(program)
    bounds = {"critical_path_ps": critical_path_ps(dag, edges), "engine_busy_ps": busy,
              "engine_relaxation_ps": relaxed, "roofline_compute_ps": compute, "roofline_ddr_ps": memory}
    candidates = {"critical_path": bounds["critical_path_ps"], "roofline_compute": compute,
                  "roofline_ddr": memory, **{f"{k}_busy": v for k, v in busy.items()},
                  **{f"{k}_relaxation": v for k, v in relaxed.items()}}
    binding = max(candidates, key=lambda k: (candidates[k], k))
    bounds["lower_bound_ps"] = candidates[binding]
    bounds["binding"] = binding
    return bounds


def schedule_bound_ps(program: Program, dag: Dag | None = None) -> int:
    """The scheduler's lower bound for the program in its DAG model (hwmodel.timing.cost's costs,
    precise hazards): max of the critical path and every engine's one-machine relaxation. No order
    of the program's instructions finishes sooner in that model, and the simulator charges every
    instruction at least its cost, so it never exceeds the simulated makespan either."""
    dag = dag or build_dag(program)
    if dag.size == 0:
        return 0
    edges = EdgeTable(dag)
    return max(critical_path_ps(dag, edges), *engine_relaxation_ps(dag, edges).values())


def bounds_summary(program: Program, makespan_ps: int, dag: Dag | None = None) -> dict:
    """Upper bound (the achieved makespan), lower bound, their ratio and the bound details."""
    lb = lower_bounds(program, dag)
    low = lb["lower_bound_ps"]
    return {"upper_bound_ps": int(makespan_ps), "lower_bound_ps": low,
            "gap": (makespan_ps / low - 1.0) if low else 0.0, "bounds": lb}
