"""Tensor-parallel MLP pairs for several cores (issue 14): MatMul(X, W1) (and, gated, MatMul(X, W3))
-> elementwise chain -> MatMul(G, W2), by constant weights, becomes per core k the products by
the column blocks k of W1 (and W3),
the chain on those columns and the product by W2's row block k (all on core k: its hidden
columns never leave its LMEM), then the sum of the cores' partial results (a row group every
core runs on its rows). Bytes: the hidden activation G (M x H) is no longer read whole by every
core, nor stored and reloaded around the chain; the partials cost a write and a read
(2 x cores x |Y|)."""

from __future__ import annotations

from types import MappingProxyType

import numpy as np

from tpuflow.frontend.graph import Graph, OpNode, TensorInfo
from tpuflow.lowering.ewise import ELEMENTWISE
from tpuflow.lowering.slicing import chunk


def split_mlp_pairs(graph: Graph, cores: int, lanes: int) -> tuple[Graph, dict[str, int]]:
    """The graph with every MLP pair that moves fewer bytes split over `cores`, and the core
    each new node is pinned to ({node name: core}); the graph itself when none is."""
    pairs = [p for p in (_pair_at(graph, n) for n in graph.nodes() if n.op_type == "MatMul") if p]
    pairs = _disjoint([p for p in pairs if _pays(graph, p, cores, lanes)])
    if not pairs:
        return graph, {}
    tensors, pins = dict(graph.tensors), {}
    replaced = {}
    for firsts, chain, last in pairs:
        for n in [*firsts[1:], *chain, last]:
            replaced[n.name] = []
        replaced[firsts[0].name] = _split_pair(graph, firsts, chain, last, cores, lanes, tensors, pins)
    nodes = [m for n in graph.nodes() for m in replaced.get(n.name, [n])]
    return Graph(graph.name, nodes, tensors, graph.inputs, graph.outputs, graph.model, graph.opset), pins


def _disjoint(pairs: list) -> list:
    """The pairs in order, without those sharing a MatMul with an earlier one."""
    taken, out = set(), []
    for firsts, chain, last in pairs:
        names = {n.name for n in firsts} | {last.name}
        if not names & taken:
            out.append((firsts, chain, last))
            taken |= names
    return out


def _weights(graph: Graph, node: OpNode) -> np.ndarray | None:
    """A MatMul's constant 2-D right operand, read plainly (no folded transposes)."""
    if any(node.attr(k) is not None for k in ("a_perm", "b_perm", "y_perm")):
        return None
    b = graph.tensor(node.inputs[1])
    return b.const if b.is_const and len(b.shape) == 2 and not graph.tensor(node.inputs[0]).is_const else None


def _pair_at(graph: Graph, first: OpNode):
    """(first MatMuls, elementwise chain, second MatMul) starting at `first`, or None: the chain's
    other operands are constants or further MatMuls of the same input by constant weights of the
    same width (a gated MLP: silu(x W_gate) * (x W_up)), its tensors are read inside it only, and
    its one result is the second MatMul's left operand."""
    if _weights(graph, first) is None:
        return None
    hidden = graph.tensor(first.outputs[0]).shape
    inside, chain, firsts = {first.outputs[0]}, [], [first]
    for node in graph.nodes():
        used = [t for t in node.inputs if t in inside]
        if not used or node is first:
            continue
        if node.op_type == "MatMul" and node.inputs[0] in inside and used == [node.inputs[0]]:
            w = _weights(graph, node)
            return (tuple(firsts), chain, node) if w is not None and w.shape[0] == hidden[-1] and \
                _closed(graph, inside, chain, node) else None
        siblings = [_sibling(graph, first, t) for t in node.inputs if t and t not in inside and not graph.tensor(t).is_const]
        if node.op_type not in ELEMENTWISE or graph.tensor(node.outputs[0]).shape != hidden or None in siblings:
            return None
        firsts += siblings
        inside |= {s.outputs[0] for s in siblings} | {node.outputs[0]}
        chain.append(node)
    return None


def _sibling(graph: Graph, first: OpNode, tensor: str) -> OpNode | None:
    """The MatMul making `tensor` when it multiplies `first`'s input by constant weights of its width."""
    node = graph.producer(tensor)
    if node is None or node.op_type != "MatMul" or node.inputs[0] != first.inputs[0] or _weights(graph, node) is None:
        return None
    return node if graph.tensor(tensor).shape == graph.tensor(first.outputs[0]).shape else None


def _closed(graph: Graph, inside: set[str], chain: list[OpNode], last: OpNode) -> bool:
    """Every tensor of the pair is read by the pair only (the second MatMul reading one)."""
    members = {n.name for n in chain} | {last.name}
    return all(t not in graph.outputs and all(u.name in members for u in graph.consumers(t)) for t in inside) \
        and sum(1 for t in inside if last.name in {u.name for u in graph.consumers(t)}) == 1


def _pays(graph: Graph, pair, cores: int, lanes: int) -> bool:
    """Whether splitting moves fewer activation bytes, with whole lanes of columns per core.
    Unsplit, the first MatMul's column parts are stored, the chain (a row group of its own
    unless empty) reads and stores them whole, and every core reads all of the hidden result;
    split, every core writes its partial result and reads its rows of all of them."""
    firsts, chain, last = pair
    hidden = graph.tensor(firsts[0].outputs[0]).shape[-1]
    hidden_bytes = graph.tensor(last.inputs[0]).size
    unsplit = (len(firsts) + cores + (len(firsts) + 1 if chain else 0)) * hidden_bytes
    return hidden // cores >= lanes and unsplit > 2 * cores * graph.tensor(last.outputs[0]).size


def _split_pair(graph: Graph, firsts: tuple[OpNode, ...], chain: list[OpNode], last: OpNode, cores: int, lanes: int,
                tensors: dict[str, TensorInfo], pins: dict[str, int]) -> list[OpNode]:
    """The pair's nodes per core, then the sum of the partials under the second MatMul's output name."""
    hidden = graph.tensor(firsts[0].outputs[0]).shape[-1]
    step = lanes if hidden % lanes == 0 else 1
    nodes, partials = [], []
    for k in range(cores):
        lo, hi = (x * step for x in chunk(hidden // step, cores, k))
        rename = {t: f"{t}@core{k}" for t in [f.outputs[0] for f in firsts] + [n.outputs[0] for n in chain]}
        made = [_node(f, (f.inputs[0], _const(graph, tensors, f.inputs[1], lo, hi, axis=1)), rename, k) for f in firsts]
        for n in chain:
            inputs = tuple(rename.get(t) or _const(graph, tensors, t, lo, hi, axis=-1) for t in n.inputs)
            made.append(_node(n, inputs, rename, k))
        partial = f"{last.outputs[0]}@core{k}"
        made.append(OpNode(f"{last.name}@core{k}", "MatMul",
                           (rename[last.inputs[0]], _const(graph, tensors, last.inputs[1], lo, hi, axis=0)), (partial,)))
        view = f"{partial}/view"        # keeps the sum out of this MatMul's epilogue (it reads other cores' partials)
        made.append(OpNode(f"{last.name}@core{k}/view", "Reshape", (partial,), (view,),
                           MappingProxyType({"shape": graph.tensor(last.outputs[0]).shape, "view": True})))
        for n in made:
            pins[n.name] = k
        for t, core_t in rename.items():
            info = graph.tensor(t)
            tensors[core_t] = TensorInfo(core_t, info.shape[:-1] + (hi - lo,), info.dtype)
        for t in (partial, view):
            tensors[t] = TensorInfo(t, graph.tensor(last.outputs[0]).shape, graph.tensor(last.outputs[0]).dtype)
        nodes += made
        partials.append(view)
    return nodes + _sum(last, partials, tensors, graph)


def _node(original: OpNode, inputs: tuple[str, ...], rename: dict[str, str], core: int) -> OpNode:
    return OpNode(f"{original.name}@core{core}", original.op_type, inputs,
                  tuple(rename[t] for t in original.outputs), original.attrs)


def _const(graph: Graph, tensors: dict[str, TensorInfo], name: str, lo: int, hi: int, axis: int) -> str:
    """A constant's block [lo, hi) along `axis` (as it is when that axis has size 1 or it is a scalar)."""
    info = graph.tensor(name)
    value = np.asarray(info.const)
    if value.ndim == 0 or value.shape[axis] == 1:
        return name
    block = f"{name}@{lo}:{hi}"
    if block not in tensors:
        part = np.ascontiguousarray(np.take(value, np.arange(lo, hi), axis=axis))
        tensors[block] = TensorInfo(block, part.shape, info.dtype, part, info.quant)
    return block


def _sum(last: OpNode, partials: list[str], tensors: dict[str, TensorInfo], graph: Graph) -> list[OpNode]:
    """Add nodes summing `partials` into the second MatMul's output."""
    info = graph.tensor(last.outputs[0])
    nodes, acc = [], partials[0]
    for k, p in enumerate(partials[1:], start=1):
        out = last.outputs[0] if k == len(partials) - 1 else f"{last.outputs[0]}/sum{k}"
        if out not in tensors:
            tensors[out] = TensorInfo(out, info.shape, info.dtype)
        nodes.append(OpNode(f"{last.name}/sum{k}", "Add", (acc, p), (out,)))
        acc = out
    return nodes


def head_aligned_cores(graph: Graph, cores: int) -> list[int]:
    """The largest core count above half of `cores` and below it that splits the heads of every
    attention (a batched MatMul of two activations: its batch is the heads) evenly, as a list
    (empty when there is none or no attention): a split whose cores each compute as many heads
    can beat one over more cores (bert_base, 12 heads: 6 of 8 cores 2710 us against 3147 over
    all 8 and 3020 over 4, fp16 sg2260)."""
    heads = set()
    for node in graph.nodes():
        if node.op_type == "MatMul" and not any(graph.tensor(t).is_const for t in node.inputs[:2]):
            shape = graph.tensor(node.outputs[0]).shape
            if len(shape) >= 3 and int(np.prod(shape[:-2])) > 1:
                heads.add(int(np.prod(shape[:-2])))
    fitting = [n for n in range(cores - 1, cores // 2, -1) if heads and all(h % n == 0 for h in heads)]
    return fitting[:1]
