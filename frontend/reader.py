"""Reading an ONNX model: file / bytes / ModelProto in, a checked OnnxView with fixed input shapes out."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Mapping

import onnx
from google.protobuf.message import DecodeError
from onnx import helper

from tpuflow.errors import InputFileError, ModelError, OptionError
from tpuflow.frontend.onnx_view import SMALL_CONST_ELEMENTS, Dims, ONode, OnnxView, node_reads, one_line

MIN_OPSET, MAX_OPSET = 9, 21
DEPRECATED_OP = "is deprecated in domain_version"     # the checker's complaint about a deprecated op version


def read_model(model: Any) -> tuple[onnx.ModelProto, str]:
    """Parse `model` (path, bytes or ModelProto); returns the proto and a label for messages."""
    if isinstance(model, onnx.ModelProto):
        return model, model.graph.name or "<model>"
    if isinstance(model, (bytes, bytearray, memoryview)):
        return _parse(bytes(model), "<bytes>"), "<bytes>"
    if isinstance(model, (str, os.PathLike)):
        return _read_file(Path(model)), str(model)
    raise OptionError(f"a model is a path, bytes or onnx.ModelProto, not {type(model).__name__}")


def _read_file(path: Path) -> onnx.ModelProto:
    if not path.exists():
        raise InputFileError(f"{path}: no such file")
    if path.is_dir():
        raise InputFileError(f"{path}: is a directory, not an ONNX file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputFileError(f"{path}: cannot read: {exc.strerror}") from None
    proto = _parse(data, str(path))
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer):
        try:
            onnx.external_data_helper.load_external_data_for_model(proto, str(path.parent))
        except (OSError, ValueError) as exc:
            raise InputFileError(f"{path}: cannot load external weight data: {one_line(exc)}") from None
    return proto


def _parse(data: bytes, label: str) -> onnx.ModelProto:
    if not data:
        raise InputFileError(f"{label}: empty file, not an ONNX model")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except DecodeError as exc:
        raise InputFileError(f"{label}: not an ONNX model, or truncated ({len(data)} bytes; protobuf: "
                             f"{one_line(exc)})") from None
    if proto.ir_version <= 0 or not proto.HasField("graph"):
        raise InputFileError(f"{label}: not an ONNX model (no IR version or no graph in {len(data)} bytes)")
    return proto


def onnx_opset(proto: onnx.ModelProto, label: str) -> int:
    versions = [o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")]
    if not versions:
        raise ModelError(f"{label}: the model imports no ai.onnx opset")
    opset = versions[0]
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise ModelError(f"{label}: opset {opset} is outside the supported range {MIN_OPSET}-{MAX_OPSET} "
                         "(convert it with onnx.version_converter)")
    return opset


def run_checker(proto: onnx.ModelProto, label: str, nodes: list[onnx.NodeProto] | None = None) -> None:
    """onnx.checker on the model's skeleton (large initializers become typed inputs, so hundreds of
    MB of weights are not serialized just to be checked); `nodes` replaces the node order."""
    try:
        onnx.checker.check_model(skeleton(proto, nodes))
    except onnx.checker.ValidationError as exc:
        if DEPRECATED_OP in str(exc):
            return                  # e.g. GroupNormalization-18: exporters write it, onnxruntime runs it
        raise ModelError(f"{label}: invalid ONNX model: {one_line(exc)}") from None


def _is_repeated(f) -> bool:
    flag = getattr(f, "is_repeated", None)           # protobuf >= 6 (a property or a method)
    if flag is None:
        return f.label == f.LABEL_REPEATED
    return bool(flag() if callable(flag) else flag)


def _copy_fields(src, dst, skip: tuple[str, ...]) -> None:
    for f, value in src.ListFields():
        if f.name in skip:
            continue
        if _is_repeated(f):
            getattr(dst, f.name).extend(value)
        elif f.type == f.TYPE_MESSAGE:
            getattr(dst, f.name).CopyFrom(value)
        else:
            setattr(dst, f.name, value)


def skeleton(proto: onnx.ModelProto, nodes: list[onnx.NodeProto] | None = None) -> onnx.ModelProto:
    """The model with initializers above SMALL_CONST_ELEMENTS replaced by graph inputs of the same
    type (and the nodes in the order `nodes`, when given)."""
    out = onnx.ModelProto()
    _copy_fields(proto, out, ("graph",))
    g, sg = proto.graph, out.graph
    _copy_fields(g, sg, ("initializer", "input", "node"))
    sg.node.extend(g.node if nodes is None else nodes)
    big = [t for t in g.initializer if math.prod(t.dims) > SMALL_CONST_ELEMENTS]
    sg.input.extend(g.input)
    listed = {vi.name for vi in g.input}
    sg.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in big
                    if t.name not in listed)
    big_names = {t.name for t in big}
    sg.initializer.extend(t for t in g.initializer if t.name not in big_names)
    return out


# ------------------------------------------------------------------ nodes and structure

def parse_attrs(node: onnx.NodeProto) -> dict[str, Any]:
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode("utf-8", "replace")
        elif isinstance(v, list) and v and isinstance(v[0], bytes):
            v = [x.decode("utf-8", "replace") for x in v]
        out[a.name] = v
    return out


def _unique_names(nodes: list[onnx.NodeProto]) -> list[str]:
    names, seen = [], set()
    for i, n in enumerate(nodes):
        base = n.name or f"{n.op_type}_{i}"
        name, k = base, 1
        while name in seen:
            name, k = f"{base}_{k}", k + 1
        seen.add(name)
        names.append(name)
    return names


def _topo_sort(nodes: list[ONode], available: set[str], label: str) -> list[ONode]:
    """Stable topological order; dangling names and cycles are ModelErrors naming the node."""
    producer: dict[str, ONode] = {}
    for n in nodes:
        for t in n.outputs:
            if not t:
                continue
            if t in producer or t in available:
                first = producer[t].name if t in producer else "a graph input / initializer"
                raise ModelError(f"{label}: tensor '{t}' is produced twice (by {first} and by node "
                                 f"'{n.name}')")
            producer[t] = n
    for n in nodes:
        for t in n.inputs:
            if t and t not in producer and t not in available:
                raise ModelError(f"{label}: node '{n.name}' ({n.op_type}) reads tensor '{t}', which no node "
                                 "produces and which is neither a graph input nor an initializer")
    # a subgraph's outer-scope reads (If / Loop bodies) order their node after the producer too
    needs = {id(n): [t for t in node_reads(n.proto) if t and (t in n.inputs or t in producer)] for n in nodes}
    done, order, pending = set(available), [], list(nodes)
    while pending:
        ready = [n for n in pending if all(t in done for t in needs[id(n)])]
        if not ready:
            raise ModelError(f"{label}: the graph has a cycle through node '{pending[0].name}'")
        ready_ids = {id(n) for n in ready}
        pending = [n for n in pending if id(n) not in ready_ids]
        for n in ready:
            order.append(n)
            done.update(t for t in n.outputs if t)
    return order


def _dims(value_info: onnx.ValueInfoProto) -> Dims | None:
    t = value_info.type
    if not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                 for d in t.tensor_type.shape.dim)


def view_of(proto: onnx.ModelProto, label: str, name: str) -> OnnxView:
    """The model's nodes (topologically sorted, uniquely named), constants and runtime inputs."""
    g = proto.graph
    opset = onnx_opset(proto, label)
    consts = {t.name: t for t in g.initializer}
    runtime = [vi for vi in g.input if vi.name not in consts]
    for vi in runtime:
        if not vi.type.HasField("tensor_type"):
            raise ModelError(f"{label}: graph input '{vi.name}' is not a tensor")
    nodes = [ONode(uname, n.op_type, n.domain, tuple(n.input), tuple(n.output), parse_attrs(n), n)
             for uname, n in zip(_unique_names(list(g.node)), g.node)]
    available = set(consts) | {vi.name for vi in runtime}
    nodes = _topo_sort(nodes, available, label)
    produced = {t for n in nodes for t in n.outputs} | available
    for o in g.output:
        if o.name not in produced:
            raise ModelError(f"{label}: graph output '{o.name}' is produced by no node")
    return OnnxView(label=label, name=name, opset=opset, proto=proto, nodes=nodes,
                    initializers=consts,
                    inputs={vi.name: (_dims(vi), vi.type.tensor_type.elem_type) for vi in runtime},
                    outputs=[o.name for o in g.output])


def fix_input_shapes(view: OnnxView, input_shapes: Mapping[str, tuple[int, ...]] | None) -> None:
    """Apply user shapes to runtime inputs; any dimension left symbolic is a ModelError. Pinned
    values (InputValue entries) in the mapping are not shapes and are skipped here."""
    from tpuflow.frontend.pinning import split_inputs
    shapes, _ = split_inputs(input_shapes)
    for name in shapes:
        if name not in view.inputs:
            known = ", ".join(view.inputs) or "none"
            raise OptionError(f"{view.label}: input shape given for '{name}', which is not a runtime graph "
                              f"input (inputs: {known})")
    for name, (dims, elem) in list(view.inputs.items()):
        if name in shapes:
            dims = _merge_shape(view.label, name, dims, tuple(int(d) for d in shapes[name]))
        if dims is None or any(not isinstance(d, int) or d <= 0 for d in dims):
            raise ModelError(_symbolic_message(view.label, name, dims))
        view.inputs[name] = (dims, elem)


def _merge_shape(label: str, name: str, dims: Dims | None, given: tuple[int, ...]) -> tuple[int, ...]:
    if any(d <= 0 for d in given):
        raise OptionError(f"{label}: input shape for '{name}' must be positive, got {given}")
    if dims is not None:
        if len(dims) != len(given):
            raise OptionError(f"{label}: input '{name}' has rank {len(dims)}, the given shape {given} "
                              f"has rank {len(given)}")
        for i, (d, g) in enumerate(zip(dims, given)):
            if isinstance(d, int) and d > 0 and d != g:
                raise OptionError(f"{label}: input '{name}' dimension {i} is {d} in the model, the given "
                                  f"shape says {g}")
    return given


def _symbolic_message(label: str, name: str, dims: Dims | None) -> str:
    if dims is None:
        what = "has no shape"
    else:
        bad = [(i, d) for i, d in enumerate(dims) if not isinstance(d, int) or d <= 0]
        what = "has symbolic dimension " + ", ".join(f"{i} ('{d}')" if isinstance(d, str) else f"{i} (unknown)"
                                                   for i, d in bad)
    example = ",".join(str(d) if isinstance(d, int) and d > 0 else "N" for d in (dims or ("N",)))
    return (f"{label}: input '{name}' {what}; fix it with --input-shape {name}={example} "
            f"(input_shapes={{'{name}': (...)}} in Python)")
