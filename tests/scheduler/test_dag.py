"""The scheduler's DAG: every precise hazard is ordered by a path of edges, no edge lacks a reason,
edges point forward in the original issue order, and durations/lags come from the cost model."""

from __future__ import annotations

import networkx as nx
from hypothesis import given, settings
from scheduler_programs import CHIP, random_program, specs

from tpuflow.hwmodel.timing import instruction_cycles, instruction_latency_cycles
from tpuflow.isa import ArTiu, Engine
from tpuflow.scheduler.dag import build_dag

ENGINES = (Engine.TIU, Engine.GDMA, Engine.TILE)


def nodes_of(program):
    """(engine, index) of every DAG node candidate in issue order (tile waits and stream ends excluded)."""
    out = []
    for engine, index in program.issue_sequence():
        instr = program.queue(engine)[index]
        last = index == len(program.queue(engine)) - 1 and instr.op_name in ("system.end", "dma.sys.chain_end")
        if not instr.is_tile_wait and not last:
            out.append((engine, index))
    return out


def brute_hazards(program, nodes):
    """Pairs (i, j), i < j in issue order, whose precise ranges overlap with a write."""
    acc = [program.accesses(e, i) for e, i in nodes]
    pairs = set()
    for j in range(len(nodes)):
        for i in range(j):
            a, b = acc[i], acc[j]
            lmem = any(x.overlaps(y) for x in a.lmem_writes for y in b.lmem_reads + b.lmem_writes) or \
                any(x.overlaps(y) for x in a.lmem_reads for y in b.lmem_writes)
            ddr = any(x.overlaps(y) for x in a.ddr_writes for y in b.ddr_reads + b.ddr_writes) or \
                any(x.overlaps(y) for x in a.ddr_reads for y in b.ddr_writes)
            if lmem or ddr:
                pairs.add((i, j))
    return pairs


def graph_of(dag) -> nx.DiGraph:
    g = nx.DiGraph()
    g.add_nodes_from(range(dag.size))
    src, dst = dag.edges()
    g.add_edges_from(zip(src.tolist(), dst.tolist()))
    return g


@settings(max_examples=60, deadline=None)
@given(specs)
def test_every_hazard_is_a_path_and_every_edge_has_a_reason(spec):
    program = random_program(spec)
    dag = build_dag(program)
    nodes = nodes_of(program)
    assert [(ENGINES[int(e)], int(i)) for e, i in zip(dag.engine, dag.queue_index)] == nodes
    src, dst = dag.edges()
    assert (src < dst).all()
    hazards = brute_hazards(program, nodes)
    closure = nx.transitive_closure_dag(graph_of(dag))
    for i, j in hazards:
        assert closure.has_edge(i, j), f"hazard {nodes[i]} -> {nodes[j]} not ordered by the DAG"
    tile = [k for k, (e, _) in enumerate(nodes) if e is Engine.TILE]
    chain = set(zip(tile, tile[1:]))
    for a, b in zip(src.tolist(), dst.tolist()):
        assert (a, b) in hazards or (a, b) in chain, f"edge {nodes[a]} -> {nodes[b]} without a hazard"


def test_tile_queue_order_is_a_chain_and_stream_ends_are_kept_aside():
    program = random_program([("matmul",), ("matmul",)])
    dag = build_dag(program)
    tile = [k for k in range(dag.size) if dag.engine[k] == 2]
    g = graph_of(dag)
    assert all(g.has_edge(a, b) for a, b in zip(tile, tile[1:]))
    assert dag.trailer == [(0, len(program.tiu) - 1), (1, len(program.gdma) - 1)]


def test_durations_and_lags_follow_the_cost_model():
    program = random_program([("copy", (0, (1, 4, 1, 64)), (4096, (1, 4, 1, 64))), ("load", (0, (1, 4, 1, 64)), 1)])
    dag = build_dag(program)
    tiu = program.tiu[0]
    assert isinstance(tiu, ArTiu)
    chip = CHIP
    period = 1000  # every sg2260 engine clock runs at 1 GHz
    t = CHIP.tiu
    fill = t.vector_des_delay_cycles + t.vector_gen_delay_cycles + t.vector_issue_delay_cycles
    assert dag.duration[0] == instruction_cycles(tiu, chip) * period
    assert dag.head[0] == fill * period
    assert dag.tail[0] == (instruction_latency_cycles(tiu, chip) - instruction_cycles(tiu, chip) - fill) * period
    assert dag.duration[1] == instruction_cycles(program.gdma[0], chip) * period
    assert dag.head[1] == dag.tail[1] == 0
    # the load overwrites the tile the copy writes: WAW, and the lag is the copy's tail
    assert dag.preds(1).tolist() == [0]
    assert dag.lag(0, 1) == dag.tail[0]
