"""Helpers for the frontend tests: one-op ONNX models, onnxruntime runs, canonical-vs-original checks."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from tpuflow import models
from tpuflow.frontend import load
from tpuflow.frontend.export import graph_to_onnx
from tpuflow.frontend.graph import Graph


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 2
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return session(model).run(None, feeds)


def random_feeds(graph: Graph, seed: int = 0, positive: bool = False) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for name in graph.inputs:
        t = graph.tensor(name)
        if np.dtype(t.dtype).kind == "f":
            x = rng.uniform(0.1, 2.0, t.shape) if positive else rng.standard_normal(t.shape)
        elif t.dtype == "bool":
            x = rng.integers(0, 2, t.shape).astype(bool)
        else:
            x = rng.integers(0, 4, t.shape)
        feeds[name] = np.asarray(x).astype(t.dtype)
    return feeds


def assert_canonical_matches(model: onnx.ModelProto, input_shapes=None, positive: bool = False,
                             rtol: float = 1e-5, atol: float = 1e-5) -> Graph:
    """Load `model`; the canonical graph, exported back to ONNX, computes what the original computes
    (onnxruntime on both, seeded random inputs), and its output shapes are onnxruntime's."""
    graph = load(model, input_shapes)
    feeds = random_feeds(graph, positive=positive)
    expected = run_ort(model, feeds)
    actual = run_ort(graph_to_onnx(graph), feeds)
    assert len(expected) == len(actual) == len(graph.outputs)
    for name, e, a in zip(graph.outputs, expected, actual):
        assert graph.tensor(name).shape == e.shape, name
        scale = float(np.max(np.abs(e))) if e.size else 1.0
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol * max(scale, 1.0), err_msg=name)
    return graph


def one_op(op: str, inputs: dict[str, tuple[int, ...]], consts: dict[str, np.ndarray] | None = None,
           opset: int = 13, outputs: int = 1, input_order: list[str] | None = None,
           elem: int = TensorProto.FLOAT, **attrs) -> onnx.ModelProto:
    """A model with one node `op`; `inputs` are runtime inputs (shapes), `consts` initializers;
    node inputs follow `input_order` (default: runtime inputs, then constants; '' = absent)."""
    consts = consts or {}
    order = input_order if input_order is not None else [*inputs, *consts]
    outs = [f"y{i}" for i in range(outputs)]
    node = helper.make_node(op, order, outs, name=f"the_{op.lower()}", **attrs)
    graph = helper.make_graph(
        [node], f"one_{op}", [helper.make_tensor_value_info(n, elem, list(s)) for n, s in inputs.items()],
        [helper.make_empty_tensor_value_info(o) for o in outs],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    inferred = onnx.shape_inference.infer_shapes(model)        # give outputs their types
    del model.graph.output[:]
    model.graph.output.extend(inferred.graph.output)
    return model


def kinds(graph: Graph) -> list[str]:
    return [n.op_type for n in graph.nodes()]


@functools.lru_cache(maxsize=None)
def bundled_bytes(name: str) -> bytes:
    return models.build_model(name).SerializeToString()


def bundled(name: str) -> onnx.ModelProto:
    return onnx.ModelProto.FromString(bundled_bytes(name))
