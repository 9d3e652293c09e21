"""The pass rule of `tpuflow verify`: relative error and cosine, with a floor at the reference's
own absolute accuracy (onnxruntime's Sigmoid/Tanh are exact to ~1e-7 absolute in their tails)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from tpuflow.compare import REFERENCE_ATOL, compare


def _ort_sigmoid(x: np.ndarray) -> np.ndarray:
    graph = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_a_saturated_sigmoid_is_judged_at_the_references_accuracy():
    x = np.linspace(-16, -11, 256).astype(np.float32)
    exact = (1 / (1 + np.exp(-x.astype(np.float64)))).astype(np.float32)
    reference = _ort_sigmoid(x)
    err = compare("y", exact, reference)
    assert err.max_rel_err > 1e-4                     # relative to a tiny maximum the reference is far off
    assert err.max_abs_err <= REFERENCE_ATOL and err.ok("fp32")


def test_real_errors_still_fail():
    ref = np.linspace(-1, 1, 100).astype(np.float32)
    assert compare("y", ref + 1e-6, ref).ok("fp32")                 # 1e-6 of a unit-scale output
    assert not compare("y", ref + 1e-3, ref).ok("fp32")
    tiny = ref * 1e-5
    assert not compare("y", tiny + 1e-6, tiny).ok("fp32")           # above the floor: 10% of a tiny output
