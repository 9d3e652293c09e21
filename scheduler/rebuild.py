"""A scheduled issue order -> a Program: queues in the new order, cmd_ids renumbered, dependencies
recomputed from the chunk bitmaps (lowering.deps.assign_dependencies), SYS tile waits re-derived."""

from __future__ import annotations

from tpuflow.isa import Engine
from tpuflow.lowering.deps import assign_dependencies
from tpuflow.lowering.emitter import Record
from tpuflow.program import Program
from tpuflow.scheduler.dag import Dag


def program_in_order(program: Program, dag: Dag, order) -> Program:
    """`program` with its instructions issued in `order` (DAG node ids), stream ends last."""
    records = []
    items = [(int(dag.engine[b]), int(dag.queue_index[b])) for b in order] + list(dag.trailer)
    for code, index in items:
        engine = Engine.of_code(code)
        instr = program.queue(engine)[index]
        records.append(Record(engine, instr.without_waits(), program.layer_of(engine, index)))
    dep_mode = program.options.get("dep_mode", "bitmap")
    queues, layers, issue = assign_dependencies(records, program.chip, dep_mode)
    return program.with_queues(queues[0], queues[1], queues[2], layers[0], layers[1], layers[2], issue)
