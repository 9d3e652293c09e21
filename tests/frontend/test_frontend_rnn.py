"""LSTM / GRU / RNN unrolled into canonical ops: same values as onnxruntime (layout 0) or the ONNX
reference implementation (layout 1, which onnxruntime does not run), over hypothesis variants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from frontend_util import assert_canonical_matches, kinds, random_feeds, run_ort
from onnx.reference import ReferenceEvaluator
from rnn_models import rnn_model

from tpuflow.errors import UnsupportedOpError
from tpuflow.frontend import load
from tpuflow.frontend.export import graph_to_onnx
from tpuflow.frontend.ops import ALL

FAST = settings(max_examples=10, deadline=None, derandomize=True)
ACTS = {"LSTM": [None, ["HardSigmoid", "LeakyRelu", "Softsign"], ["Sigmoid", "Affine", "ScaledTanh"]],
        "GRU": [None, ["HardSigmoid", "Relu"], ["Sigmoid", "Softplus"]], "RNN": [None, ["Relu"], ["Elu"]]}


def check_layout1(model):
    graph = load(model)
    feeds = random_feeds(graph)
    expected = ReferenceEvaluator(model).run(None, feeds)
    actual = run_ort(graph_to_onnx(graph), feeds)
    for e, a in zip(expected, actual):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5)
    return graph


@FAST
@given(op=st.sampled_from(["LSTM", "GRU", "RNN"]), direction=st.sampled_from(["forward", "reverse", "bidirectional"]),
       init=st.sampled_from([None, "const", "runtime"]), bias=st.booleans(), act=st.integers(0, 2),
       extra=st.sampled_from(["none", "clip", "peepholes", "lbr", "seq"]), layout=st.sampled_from([0, 0, 1]))
def test_recurrent_variants(op, direction, init, bias, act, extra, layout):
    dirs = 2 if direction == "bidirectional" else 1
    if layout:                   # the ONNX reference implementation knows default activations only, no clip
        act, extra = 0, "none" if extra == "clip" else extra
    attrs = {}
    if ACTS[op][act]:
        names = ACTS[op][act] * dirs
        attrs["activations"] = names
        if any(n in ("Affine", "ScaledTanh", "HardSigmoid", "LeakyRelu", "Elu") for n in names):
            attrs["activation_alpha"] = [0.4] * len(names)
            attrs["activation_beta"] = [0.3] * len(names)
    if extra == "clip":
        attrs["clip"] = 0.7
    if extra == "lbr" and op == "GRU":
        attrs["linear_before_reset"] = 1
    model = rnn_model(op, direction=direction, init=init, bias=bias, layout=layout, peepholes=extra == "peepholes",
                      seq=extra == "seq", **attrs)
    graph = check_layout1(model) if layout else assert_canonical_matches(model, rtol=1e-4, atol=1e-5)
    assert set(kinds(graph)) <= ALL
    per_step = dirs * {"LSTM": 4, "GRU": 3, "RNN": 1}[op]                 # one MatMul per gate and step ...
    recurrent_matmuls = kinds(graph).count("MatMul") - per_step            # (one input projection per gate)
    expected = 3 * per_step if init == "runtime" else 2 * per_step        # ... but none against a zero state
    assert expected <= recurrent_matmuls <= expected + (dirs if op == "GRU" and init == "const" else 0)


def test_only_the_outputs_used_are_built():
    graph = assert_canonical_matches(rnn_model("LSTM", outputs=2, steps=4))
    assert graph.outputs == ["y0", "y1"] and kinds(graph).count("Concat") == 1


@pytest.mark.parametrize("attrs,reason", [(dict(input_forget=1), "LSTM[input_forget]"),
                                          (dict(activations=["Sigmoid", "ThresholdedRelu", "Tanh"]),
                                           "LSTM[activation ThresholdedRelu]")])
def test_rejected_variants_name_the_reason(attrs, reason):
    with pytest.raises(UnsupportedOpError) as info:
        load(rnn_model("LSTM", **attrs))
    assert info.value.unsupported == {reason: ["the_lstm"]}


def test_short_sequence_lengths_are_rejected():
    model = rnn_model("GRU", seq=True)
    model.graph.initializer[-1].CopyFrom(__import__("onnx").numpy_helper.from_array(np.array([3, 1], np.int32), "seq"))
    with pytest.raises(UnsupportedOpError, match=r"GRU\[sequence_lens shorter than the sequence\]"):
        load(model)
