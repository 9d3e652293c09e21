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
    engine, queue_index = dag.engine.tolist(), dag.queue_index.tolist()
    order = order.tolist() if hasattr(order, "tolist") else list(order)
    items = [(engine[b], queue_index[b]) for b in order] + list(dag.trailer)
    queues, layers, issue = _assigned(program, items, _node_accesses(dag, order, len(dag.trailer)))
    result = program.with_queues(queues[0], queues[1], queues[2], layers[0], layers[1], layers[2], issue)
    result.adopt_tile_accesses(program)     # the DAG chains the TILE queue: same blocks, same order
    return result


def _node_accesses(dag: Dag, nodes: list[int], trailing: int) -> list | None:
    """The DAG's Accesses of `nodes` and None for `trailing` stream ends after them (None if the
    DAG does not carry them). A TILE node's are still its block's: the order keeps each queue's
    relative order, so the TILE stream is the same stream."""
    if dag.accesses is None:
        return None
    acc = dag.accesses
    return [acc[b] for b in nodes] + [None] * trailing


def _assigned(program: Program, items, accesses: list | None = None) -> tuple:
    """(queues, layers, issue order) of one core's (engine code, queue index) items in issue order
    (`accesses`: theirs where known, see assign_dependencies). The instructions keep their old
    waits here: assign_dependencies sets every wait field."""
    engines = [Engine.of_code(c) for c in range(len(Engine))]
    queues = [program.queue(e) for e in engines]
    names = [program.layer_names(e) for e in engines]
    records = [Record(engines[code], queues[code][index], names[code][index] if index < len(names[code]) else "")
               for code, index in items]
    return assign_dependencies(records, program.chip, program.options.get("dep_mode", "bitmap"), accesses)


def _cores_in_order(program: Program, dag: Dag, order) -> Program:
    per_core: list[list[tuple[int, int]]] = [[] for _ in range(program.core_count)]
    nodes: list[list[int]] = [[] for _ in range(program.core_count)]
    trailing = [0] * program.core_count
    engine, queue_index = dag.engine.tolist(), dag.queue_index.tolist()
    for b in (order.tolist() if hasattr(order, "tolist") else order):
        core, code = divmod(engine[b], UNITS_PER_CORE)
        per_core[core].append((code, queue_index[b]))
        nodes[core].append(b)
    for unit, index in dag.trailer:
        core, code = divmod(unit, UNITS_PER_CORE)
        per_core[core].append((code, index))
        trailing[core] += 1
    streams = []
    for k, items in enumerate(per_core):
        queues, layers, issue = _assigned(program.core(k), items, _node_accesses(dag, nodes[k], trailing[k]))
        streams.append(CoreStreams(queues[0], queues[1], queues[2], layers[0], layers[1], layers[2], issue))
    return program.with_cores(streams)
