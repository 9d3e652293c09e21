"""A scheduled issue order -> a Program: queues in the new order, cmd_ids renumbered, dependencies
recomputed from the chunk bitmaps (lowering.deps.assign_dependencies), SYS tile waits re-derived;
on a multi-core program core by core (each core's nodes in the order's relative order)."""

from __future__ import annotations

from tpuflow.isa import Engine
from tpuflow.lowering.deps import assign_dependencies
from tpuflow.lowering.emitter import Record
from tpuflow.program import CoreStreams, Program
from tpuflow.scheduler.dag import Dag

UNITS_PER_CORE = len(Engine)


def program_in_order(program: Program, dag: Dag, order) -> Program:
    """`program` with its instructions issued in `order` (DAG node ids), stream ends last."""
    if program.core_count > 1:
        return _cores_in_order(program, dag, order)
    items = [(int(dag.engine[b]), int(dag.queue_index[b])) for b in order] + list(dag.trailer)
    queues, layers, issue = _assigned(program, items)
    return program.with_queues(queues[0], queues[1], queues[2], layers[0], layers[1], layers[2], issue)


def _assigned(program: Program, items) -> tuple:
    """(queues, layers, issue order) of one core's (engine code, queue index) items in issue order."""
    records = []
    for code, index in items:
        engine = Engine.of_code(code)
        instr = program.queue(engine)[index]
        records.append(Record(engine, instr.without_waits(), program.layer_of(engine, index)))
    return assign_dependencies(records, program.chip, program.options.get("dep_mode", "bitmap"))


def _cores_in_order(program: Program, dag: Dag, order) -> Program:
    per_core: list[list[tuple[int, int]]] = [[] for _ in range(program.core_count)]
    for b in order:
        core, code = divmod(int(dag.engine[b]), UNITS_PER_CORE)
        per_core[core].append((code, int(dag.queue_index[b])))
    for unit, index in dag.trailer:
        core, code = divmod(unit, UNITS_PER_CORE)
        per_core[core].append((code, index))
    streams = []
    for k, items in enumerate(per_core):
        queues, layers, issue = _assigned(program.core(k), items)
        streams.append(CoreStreams(queues[0], queues[1], queues[2], layers[0], layers[1], layers[2], issue))
    return program.with_cores(streams)
