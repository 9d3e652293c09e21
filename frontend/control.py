"""Control flow removed at compile time: an If whose condition folded to a constant is replaced by
the nodes of the branch it takes; a Loop with a constant trip count (and a condition that stays
true) is unrolled, and so is a Scan (frontend/scan.py). Tensors a subgraph defines are renamed
under the control node's name, outer-scope references are kept, and nested subgraphs are renamed
consistently."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tpuflow.errors import UnsupportedOpError
from tpuflow.frontend.onnx_view import ONode, OnnxView
from tpuflow.frontend.reader import parse_attrs

MAX_UNROLLED_NODES = 20000       # trip count x body nodes beyond this is rejected, not unrolled


def defined_in(graph: onnx.GraphProto) -> set[str]:
    """Names a subgraph defines itself (inputs, initializers, node outputs)."""
    names = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    return names | {t for n in graph.node for t in n.output if t}


def _rename_graph(graph: onnx.GraphProto, mapping: dict[str, str]) -> onnx.GraphProto:
    """A copy of a nested subgraph whose outer-scope references follow `mapping`."""
    out = onnx.GraphProto()
    out.CopyFrom(graph)
    local = {k: v for k, v in mapping.items() if k not in defined_in(graph)}
    for n in out.node:
        _rename_node(n, local)
    return out


def _rename_node(n: onnx.NodeProto, mapping: dict[str, str]) -> None:
    n.input[:] = [mapping.get(t, t) if t else t for t in n.input]
    n.output[:] = [mapping.get(t, t) if t else t for t in n.output]
    for a in n.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            a.g.CopyFrom(_rename_graph(a.g, mapping))
        elif a.type == onnx.AttributeProto.GRAPHS:
            for g in a.graphs:
                g.CopyFrom(_rename_graph(g, mapping))


class _Splicer:
    """Copies a subgraph's nodes into the view under a name prefix."""

    def __init__(self, view: OnnxView, owner: ONode):
        self.view, self.owner = view, owner
        self.nodes: list[ONode] = []

    def splice(self, graph: onnx.GraphProto, prefix: str, bound: dict[str, str]) -> dict[str, str]:
        """Nodes of `graph` with its inputs bound to outer names (`bound`) and every tensor it
        defines renamed to prefix/name; returns the full name mapping."""
        mapping = dict(bound)
        for t in graph.initializer:
            mapping[t.name] = f"{prefix}/{t.name}"
            self.view.consts[mapping[t.name]] = numpy_helper.to_array(t)
        for n in graph.node:
            for t in n.output:
                if t:
                    mapping[t] = f"{prefix}/{t}"
        for i, n in enumerate(graph.node):
            proto = onnx.NodeProto()
            proto.CopyFrom(n)
            _rename_node(proto, mapping)
            proto.name = f"{prefix}/{n.name or f'{n.op_type}_{i}'}"
            self.add(proto)
        return mapping

    def add(self, proto: onnx.NodeProto) -> None:
        self.nodes.append(ONode(proto.name, proto.op_type, proto.domain, tuple(proto.input), tuple(proto.output),
                                parse_attrs(proto), proto))

    def identity(self, src: str, dst: str, tag: str) -> None:
        self.add(helper.make_node("Identity", [src], [dst], name=f"{self.owner.name}/{tag}"))


def _inline_if(node: ONode, view: OnnxView) -> list[ONode]:
    taken = bool(np.asarray(view.consts[node.input(0)]).reshape(-1)[0])
    branch = node.attrs["then_branch" if taken else "else_branch"]
    sp = _Splicer(view, node)
    prefix = f"{node.name}/{'then' if taken else 'else'}"
    mapping = sp.splice(branch, prefix, {})
    for k, (out, result) in enumerate(zip(node.outputs, branch.output)):
        if out:
            sp.identity(mapping.get(result.name, result.name), out, f"out{k}")
    return sp.nodes


def _loop_plan(node: ONode, view: OnnxView) -> tuple[int, str | None]:
    """(trip count, reason it cannot be unrolled or None)."""
    body = node.attrs["body"]
    trip = view.consts.get(node.input(0)) if node.input(0) else None
    if trip is None:
        return 0, "no constant trip count"
    count = int(np.asarray(trip).reshape(-1)[0])
    if node.input(1) and node.input(1) in view.consts:
        if not bool(np.asarray(view.consts[node.input(1)]).reshape(-1)[0]):
            count = 0
    elif node.input(1):
        return 0, "runtime condition"
    if count > 0 and not _condition_stays_true(body):
        return 0, "condition computed in the body"
    if count * max(len(body.node), 1) > MAX_UNROLLED_NODES:
        return 0, f"trip count {count} too large to unroll"
    scans = len(body.output) - 1 - (len(node.inputs) - 2)
    if count == 0 and scans > 0:
        return 0, "zero iterations with scan outputs"
    return count, None


def _condition_stays_true(body: onnx.GraphProto) -> bool:
    """The body's condition output is its condition input passed through, or a constant true."""
    producers = {t: n for n in body.node for t in n.output}
    name, cond_in = body.output[0].name, body.input[1].name if len(body.input) > 1 else None
    for _ in range(len(body.node) + 1):
        if name == cond_in:
            return True
        init = next((t for t in body.initializer if t.name == name), None)
        if init is not None:
            return bool(numpy_helper.to_array(init).reshape(-1)[0])
        n = producers.get(name)
        if n is None:
            return False
        if n.op_type == "Identity":
            name = n.input[0]
            continue
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            return bool(numpy_helper.to_array(n.attribute[0].t).reshape(-1)[0])
        return False
    return False


def _unroll_loop(node: ONode, view: OnnxView, count: int) -> list[ONode]:
    body = node.attrs["body"]
    sp = _Splicer(view, node)
    carried = list(node.inputs[2:])
    n_carried = len(carried)
    scans: list[list[str]] = [[] for _ in range(len(body.output) - 1 - n_carried)]
    for k in range(count):
        prefix = f"{node.name}/iter{k}"
        bound = {}
        it = f"{prefix}/iteration"
        view.consts[it] = np.asarray(k, np.int64)
        bound[body.input[0].name] = it
        if len(body.input) > 1:
            cond = f"{prefix}/condition"
            view.consts[cond] = np.asarray(True)
            bound[body.input[1].name] = cond
        for vi, value in zip(body.input[2:], carried):
            bound[vi.name] = value
        mapping = sp.splice(body, prefix, bound)
        results = [mapping.get(o.name, o.name) for o in body.output]
        carried = results[1:1 + n_carried]
        for acc, value in zip(scans, results[1 + n_carried:]):
            acc.append(value)
    for j, out in enumerate(node.outputs[:n_carried]):
        if out:
            sp.identity(carried[j], out, f"final{j}")
    for j, (out, values) in enumerate(zip(node.outputs[n_carried:], scans)):
        if out:
            _stack(sp, node, view, values, out, j)
    return sp.nodes


def _stack(sp: _Splicer, node: ONode, view: OnnxView, values: list[str], out: str, j: int, axis: int = 0) -> None:
    """Scan output j: the per-iteration values stacked along a new axis `axis`."""
    rows = []
    for k, v in enumerate(values):
        row = f"{node.name}/scan{j}/row{k}"
        if view.opset >= 13:
            axes = f"{node.name}/scan{j}/axes"
            view.consts[axes] = np.asarray([axis], np.int64)
            sp.add(helper.make_node("Unsqueeze", [v, axes], [row], name=f"{node.name}/scan{j}/unsqueeze{k}"))
        else:
            sp.add(helper.make_node("Unsqueeze", [v], [row], name=f"{node.name}/scan{j}/unsqueeze{k}", axes=[axis]))
        rows.append(row)
    sp.add(helper.make_node("Concat", rows, [out], name=f"{node.name}/scan{j}/concat", axis=axis))


def inline_control_flow(view: OnnxView) -> bool:
    """One sweep; True when some If, Loop or Scan was replaced (shapes must be re-inferred, constants
    re-folded). Loops and Scans that cannot be unrolled are rejected here, all in one error."""
    from tpuflow.frontend.scan import scan_plan, unroll_scan      # scan.py builds on the splicer here
    nodes, changed, problems = [], False, {}
    for node in view.nodes:
        if node.op_type == "If" and node.input(0) in view.consts:
            nodes += _inline_if(node, view)
            changed = True
        elif node.op_type in ("Loop", "Scan"):
            plan, unroll = (_loop_plan, _unroll_loop) if node.op_type == "Loop" else (scan_plan, unroll_scan)
            count, reason = plan(node, view)
            if reason:
                problems.setdefault(f"{node.op_type}[{reason}]", []).append(node.name)
                continue
            nodes += unroll(node, view, count)
            changed = True
        else:
            nodes.append(node)
    if problems:
        raise UnsupportedOpError(problems)
    view.nodes = nodes
    return changed
