"""Seeded random values for a Graph's runtime inputs, in each input's own dtype and in a range valid
for the ops that consume it (indices inside the gathered axis, divisors non-zero)."""

from __future__ import annotations

import numpy as np
import onnx

from tpuflow.frontend.graph import Graph

DEFAULT_INT_HIGH = 4                  # integers drawn from [0, 4) unless a consumer needs less
INDEX_INPUTS = {"Gather": 1, "GatherElements": 1, "GatherND": 1, "ScatterND": 1, "ScatterElements": 1,
                "OneHot": 0, "Embedding": 1}
DIVISOR_INPUTS = {"Div": 1, "Mod": 1}


def _consumers(model: onnx.ModelProto) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    out: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    def walk(graph: onnx.GraphProto) -> None:
        for n in graph.node:
            for i, t in enumerate(n.input):
                out.setdefault(t, []).append((n, i))
            for a in n.attribute:
                for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    walk(g)
    walk(model.graph)
    return out


def _static_dims(model: onnx.ModelProto) -> dict[str, list[int]]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - ranges fall back to the default without shapes
        return {}
    dims = {t.name: list(t.dims) for t in model.graph.initializer}
    for vi in [*inferred.graph.input, *inferred.graph.value_info]:
        tt = vi.type.tensor_type
        if tt.HasField("shape"):
            dims[vi.name] = [d.dim_value for d in tt.shape.dim]
    return dims


def int_range(name: str, consumers, dims: dict[str, list[int]]) -> tuple[int, int]:
    """[low, high) for an integer input: index inputs stay inside every axis they index."""
    low, high = 0, DEFAULT_INT_HIGH
    for node, pos in consumers.get(name, []):
        if INDEX_INPUTS.get(node.op_type) == pos and node.input[0] in dims:
            data = dims[node.input[0]]
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            if data and node.op_type in ("Gather", "GatherElements") and -len(data) <= axis < len(data):
                high = min(high, max(data[axis], 1))
            elif data:
                high = min(high, max(min(d for d in data if d > 0) if any(data) else 1, 1))
        if DIVISOR_INPUTS.get(node.op_type) == pos:
            low, high = 1, high + 1
    return low, max(high, low + 1)


def random_inputs(graph: Graph, seed: int) -> dict[str, np.ndarray]:
    """Floats standard-normal (in their own precision), booleans fair coins, integers from int_range."""
    rng = np.random.default_rng(seed)
    model = graph.model
    ints = [n for n in graph.inputs if np.dtype(graph.tensor(n).dtype).kind in "iu"]
    consumers = _consumers(model) if ints and model is not None else {}
    dims = _static_dims(model) if ints and model is not None else {}
    out = {}
    for name in graph.inputs:
        t = graph.tensor(name)
        dtype = np.dtype(t.dtype)
        if dtype.kind == "f":
            out[name] = rng.standard_normal(t.shape).astype(dtype)
        elif dtype.kind == "b":
            out[name] = rng.integers(0, 2, t.shape).astype(bool)
        else:
            low, high = int_range(name, consumers, dims)
            out[name] = rng.integers(low, high, t.shape).astype(dtype)
    return out


REFERENCE_PRECISION = {"float16": "fp16", "bfloat16": "bf16"}
LOOSENESS = ("fp32", "fp16", "bf16")


def tolerance_dtype(graph: Graph, dtype: str) -> str:
    """The dtype whose verify tolerance applies: the compile dtype, or the model's own 16-bit float
    precision when its inputs or outputs have one (onnxruntime then rounds the reference too)."""
    worst = dtype
    for name in [*graph.inputs, *graph.outputs]:
        model_dtype = REFERENCE_PRECISION.get(graph.tensor(name).dtype)
        if model_dtype and LOOSENESS.index(model_dtype) > LOOSENESS.index(worst if worst in LOOSENESS else "fp32"):
            worst = model_dtype
    return worst
