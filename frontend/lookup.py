"""Elementwise functions of one 8-bit tensor collapsed into 256-entry lookup tables (OpKind LOOKUP_TABLE).

The graph rule. A *lookup set* is a connected set of elementwise nodes (LOOKUP_KINDS: single-input
activations, Add / Sub / Mul / Div / Pow / Max / Min by scalar constants, QuantizeLinear /
DequantizeLinear, earlier LookupTables) such that

- its only runtime source is ONE tensor x, quantized per tensor in int8 or uint8 (every other input of
  its nodes is made inside the set or is a constant of one element, per tensor quantized or float);
- every tensor it makes has x's shape, and all but one, y, are read only by nodes of the set (none is
  a graph output), but the float result of a DequantizeLinear of x itself, which others may read too (that
  node then stays for them); y is quantized per tensor in int8 or uint8.

Then y is a function of x's 256 codes: the set is replaced by one LookupTable node y = table[x] whose
constant input 1 is the 256 output codes indexed by x's stored byte (x.view(uint8): an int8 code -128
is entry 128), and whose input and output keep their Quants. The table is computed by running the
ORIGINAL nodes on all 256 codes with onnxruntime on their canonical-graph export (frontend/export.py,
graph optimizations off: each quantized op DequantizeLinear -> float32 op -> QuantizeLinear, float ops
in float32), the reference every int8 check of tpuflow uses; no second copy of any op's semantics.

Of the valid sets of a source the largest is taken, then the largest of the rest, ... (sources in graph
order, nodes taken once but a shared DequantizeLinear of the source). The gather costs one element per
lane and cycle (hwmodel/timing/compute.py, tpu-mlir's SG model), more than one requantising op on the
vector unit (dequantise, op, requantise: three or four fp32 vectors), so a set must hold two or more
computing nodes, or one computing in float between DequantizeLinear and QuantizeLinear (worth); a Relu /
Clip that is the only reader of a Conv / MatMul result joins no set (the int8 lowering fuses it into the
product's requantisation for free). A hard-swish x * clip(x + 3, 0, 6) / 6 of
--dtype int8 (Add, Clip, Mul each with its own scale, then DequantizeLinear -> float Div ->
QuantizeLinear) becomes one node; so does DequantizeLinear -> Sigmoid -> QuantizeLinear.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from tpuflow.frontend.graph import Graph, OpNode, TensorInfo
from tpuflow.frontend.ops import CONVERT, OpKind, SPECS

K = OpKind
EIGHT_BIT = ("int8", "uint8")
TABLE_SIZE = 256
# single-input elementwise kinds and binary ones by a scalar constant whose value is a function of
# their runtime input alone (compares, logic and Cast left out: bool / integer results)
LOOKUP_KINDS = frozenset(k for k, s in SPECS.items() if s.category in ("unary", "binary") and not s.compare
                         and not s.logic and k not in (K.CAST, K.NOT)) | CONVERT | {K.LOOKUP_TABLE}


def eight_bit_per_tensor(info: TensorInfo) -> bool:
    return info.quant is not None and not info.quant.per_channel and info.quant.storage in EIGHT_BIT


def table_codes(storage: str) -> np.ndarray:
    """The 256 codes of an 8-bit storage in table order: entry u holds the code whose stored byte is u."""
    return np.arange(TABLE_SIZE, dtype=np.uint8).view(np.dtype(storage))


class _Sets:
    """The lookup sets of one graph (see the module docstring)."""

    def __init__(self, graph: Graph):
        self.g = graph
        self.taken: set[str] = set()

    def member(self, node: OpNode, source_shape, made: set[str]) -> bool:
        """Whether `node` can join a set that has made the tensors `made` (x among them)."""
        if node.name in self.taken or node.op_type not in LOOKUP_KINDS or len(node.outputs) != 1 or \
                self.fused_activation(node):
            return False
        runtime = [t for t in node.inputs if t and not self.g.tensor(t).is_const]
        consts = [self.g.tensor(t) for t in node.inputs if t and self.g.tensor(t).is_const]
        if node.op_type == K.LOOKUP_TABLE:
            consts = consts[1:]
        if not runtime or any(t not in made for t in runtime):
            return False
        if any(c.size != 1 or (c.quant is not None and c.quant.storage == "int32") for c in consts):
            return False
        out = self.g.tensor(node.outputs[0])
        return tuple(out.shape) == tuple(source_shape) and (out.quant is None or not out.quant.per_channel)

    def closure(self, x: str) -> list[OpNode]:
        """Every node reachable from x through set members, in graph order."""
        made, nodes = {x}, []
        shape = self.g.tensor(x).shape
        for node in self.g.nodes():
            if self.member(node, shape, made):
                nodes.append(node)
                made.add(node.outputs[0])
        return nodes

    def valid(self, x: str, nodes: list[OpNode], y: str) -> list[OpNode] | None:
        """The nodes of `nodes` y depends on, when they form a lookup set with exit y (else None)."""
        need, chosen = {y}, []
        for node in reversed(nodes):
            if node.outputs[0] in need:
                chosen.append(node)
                need.update(t for t in node.inputs if t and not self.g.tensor(t).is_const and t != x)
        chosen.reverse()
        inside = {n.name for n in chosen}
        for node in chosen:
            t = node.outputs[0]
            if t != y and escapes(self.g, t, inside) and not shared_dequantize(node, x):
                return None
        return chosen if self.worth(chosen, x, y) else None

    def worth(self, nodes: list[OpNode], x: str, y: str) -> bool:
        """A set a gather (one element per lane and cycle) is worth: two or more computing nodes (each its own
        DDR round trip and requantisation otherwise), or one that computes in float between DequantizeLinear
        and QuantizeLinear (a Sigmoid: conversions and a function sequence otherwise). One Add / Mul / Relu /
        Clip on quantized tensors stays: dequantise, the op and requantise, or a clamp of the codes, are
        cheaper than a gather."""
        computing = [n for n in nodes if n.op_type not in CONVERT]
        return len(computing) >= 2 or any(self.g.tensor(n.outputs[0]).quant is None for n in computing)

    def fused_activation(self, node: OpNode) -> bool:
        """A Relu / Clip that is the only reader of a Conv / MatMul result: the int8 lowering fuses it into the
        product's requantisation (free), so no set takes it."""
        x = node.inputs[0]
        producer = self.g.producer(x)
        return node.op_type in (K.RELU, K.CLIP) and producer is not None and \
            producer.op_type in (K.CONV, K.MATMUL) and x not in self.g.outputs and len(self.g.consumers(x)) == 1 \
            and self.g.tensor(node.outputs[0]).quant is not None

    def best(self, x: str) -> list[OpNode] | None:
        """The largest lookup set from source x (the latest exit on ties), or None."""
        nodes = self.closure(x)
        best = None
        for node in nodes:
            y = node.outputs[0]
            if not eight_bit_per_tensor(self.g.tensor(y)):
                continue
            chosen = self.valid(x, nodes, y)
            if chosen is not None and (best is None or len(chosen) >= len(best)):
                best = chosen
        return best

    def all(self) -> list[tuple[str, list[OpNode]]]:
        """(source, nodes) of every lookup set, sources in graph order."""
        sources = [t for t in self.g.inputs] + [t for n in self.g.nodes() for t in n.outputs if t]
        found = []
        for x in sources:
            info = self.g.tensor(x)
            if info.is_const or not eight_bit_per_tensor(info):
                continue
            chosen = self.best(x)
            while chosen is not None:     # a DequantizeLinear of x may serve the next set of x too
                self.taken.update(n.name for n in chosen if not shared_dequantize(n, x))
                found.append((x, chosen))
                chosen = self.best(x)
        return found


def escapes(graph: Graph, tensor: str, inside: set[str]) -> bool:
    """Whether `tensor` is a graph output or read by a node outside `inside` (names)."""
    return tensor in graph.outputs or any(c.name not in inside for c in graph.consumers(tensor))


def shared_dequantize(node: OpNode, x: str) -> bool:
    """A DequantizeLinear of the source itself: a set may read its float result while other nodes do too
    (the node then stays for them: an SE block's one DequantizeLinear feeding Sigmoid and the product)."""
    return node.op_type == K.DEQUANTIZE and node.inputs[0] == x


def lookup_sets(graph: Graph) -> list[tuple[str, list[OpNode]]]:
    """(source x, nodes) of the lookup sets the graph rule finds (module docstring), in graph order."""
    return _Sets(graph).all()


def evaluate_tables(graph: Graph, sets: list[tuple[str, list[OpNode]]]) -> list[np.ndarray]:
    """The 256-entry table of each set: its nodes run by onnxruntime (graph optimizations off) on every
    code of x (table order), all sets in one model (set i reads its own copy of the codes, so one set's
    exit may be another's source)."""
    from tpuflow.frontend.export import graph_to_onnx
    if not sets:
        return []
    nodes, tensors, inputs, outputs, feeds = [], {}, [], [], {}
    for i, (x, members) in enumerate(sets):       # set i's runtime tensors and nodes renamed .../lookup{i}
        own = {t: f"{t}/lookup{i}" for n in members for t in n.outputs} | {x: f"{x}/lookup{i}"}
        tensors[own[x]] = replace(_flat(graph.tensor(x)), name=own[x])
        inputs.append(own[x])
        feeds[own[x]] = table_codes(graph.tensor(x).dtype)
        for node in members:
            for t in (*node.inputs, *node.outputs):
                if t and t != x and own.get(t, t) not in tensors:
                    tensors[own.get(t, t)] = replace(_flat(graph.tensor(t)), name=own.get(t, t))
            nodes.append(replace(node, name=f"{node.name}/lookup{i}", inputs=tuple(own.get(t, t) for t in node.inputs),
                                 outputs=tuple(own[t] for t in node.outputs)))
        outputs.append(own[members[-1].outputs[0]])
    from tpuflow.compare import run_onnxruntime
    model = graph_to_onnx(Graph("lookup_tables", nodes, tensors, inputs, outputs))
    results = run_onnxruntime(model, feeds, optimize=False)
    return [np.asarray(results[name]) for name in outputs]


def _flat(info: TensorInfo) -> TensorInfo:
    """A set's tensor as the 256 codes' version: runtime tensors (256,), constants scalars."""
    if info.is_const:
        const = np.asarray(info.const).reshape(())
        return replace(info, shape=(), const=const)
    return replace(info, shape=(TABLE_SIZE,))


def collapse_lookup_tables(graph: Graph) -> Graph:
    """`graph` with every lookup set replaced by one LookupTable node (or `graph` itself when none)."""
    sets = lookup_sets(graph)
    if not sets:
        return graph
    tables = evaluate_tables(graph, sets)
    tensors = dict(graph.tensors)
    first: dict[str, OpNode] = {}
    dropped, names, read = set(), set(), set()
    for (x, members), table in zip(sets, tables):
        y = members[-1].outputs[0]
        out = graph.tensor(y)
        name = _fresh(tensors, f"{y}__lookup_table")
        tensors[name] = TensorInfo(name, (TABLE_SIZE,), out.dtype, np.asarray(table, out.dtype).reshape(TABLE_SIZE),
                                   out.quant)
        node = _fresh(names | set(graph.nx.nodes), f"{members[-1].name}/lookup_table")
        names.add(node)
        inside = {n.name for n in members}
        kept = {n.name for n in members if shared_dequantize(n, x) and escapes(graph, n.outputs[0], inside)}
        first[next(n.name for n in members if n.name not in kept)] = OpNode(node, K.LOOKUP_TABLE.value, (x, name),
                                                                            (y,), {})
        dropped.update(n.name for n in members if n.name not in kept)
        read.update(t for n in members if n.name not in kept for t in n.inputs if t)
        for member in members:
            if member.outputs[0] != y and member.name not in kept:
                tensors.pop(member.outputs[0], None)
    nodes = [first.get(n.name, n) for n in graph.nodes() if n.name in first or n.name not in dropped]
    used = {t for n in nodes for t in n.inputs if t} | set(graph.outputs)
    unread = [n for n in nodes if n.op_type == K.DEQUANTIZE and n.outputs[0] not in used]   # kept for a later set
    nodes = [n for n in nodes if n not in unread]
    for n in unread:
        tensors.pop(n.outputs[0], None)
    for t in read - used:
        if t in tensors and tensors[t].is_const:
            del tensors[t]
    return Graph(graph.name, nodes, tensors, graph.inputs, graph.outputs, graph.model, graph.opset)


def _fresh(taken, base: str) -> str:
    name, k = base, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    return name
