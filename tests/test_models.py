"""Bundled models: names, resolution, deterministic bytes, random-weight light copies that keep the
original graph and keep activations O(1), and the build script."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tpuflow import models
from tpuflow.errors import InputFileError
import tpuflow.models.build as build_script
from tpuflow.models.light import LIGHT_FILES, light_path

SMALL = ["mlp", "small_cnn", "mobilenetv2", "bert_layer", "gpt_block", "llama_mlp"]
LIGHT_CHECKED = ["squeezenet", "shufflenet", "inception_v1", "resnet50", "densenet121", "inception_v2"]


@functools.lru_cache(maxsize=None)
def built(name: str) -> bytes:
    return models.build_model(name).SerializeToString()


def proto(name: str) -> onnx.ModelProto:
    return onnx.ModelProto.FromString(built(name))


def test_names_and_default():
    assert models.names() == SMALL + ["bert_base"] + sorted(LIGHT_FILES)
    assert models.DEFAULT_MODEL == "resnet50"
    assert all(models.describe(n) for n in models.names())


def test_resolve_name_path_and_errors(tmp_path):
    assert models.resolve(None).graph.name == proto("resnet50").graph.name
    path = tmp_path / "m.onnx"
    path.write_bytes(built("small_cnn"))
    assert models.resolve(path).SerializeToString() == built("small_cnn")
    assert models.resolve(str(path)).graph.name == "small_cnn"
    with pytest.raises(InputFileError, match="not a bundled model"):
        models.resolve("resnet51")


@pytest.mark.parametrize("name", SMALL + ["squeezenet"])
def test_bytes_are_deterministic_and_valid(name):
    again = models.build_model(name).SerializeToString()
    assert again == built(name)
    onnx.checker.check_model(proto(name), full_check=True)


@pytest.mark.parametrize("name", ["squeezenet", "densenet121", "shufflenet"])
def test_light_copy_keeps_the_graph_and_replaces_every_weight(name):
    original = onnx.load(str(light_path(name)))
    copy = proto(name)
    kept = [n for n in original.graph.node if n.op_type != "ConstantOfShape"]
    assert [(n.op_type, list(n.input), list(n.output), n.attribute) for n in copy.graph.node] == \
        [(n.op_type, list(n.input), list(n.output), n.attribute) for n in kept]
    assert copy.ir_version == original.ir_version and copy.opset_import == original.opset_import
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in copy.graph.initializer}
    if copy.ir_version < 4:
        assert set(inits) <= {vi.name for vi in copy.graph.input}
    floats = [a for a in inits.values() if a.dtype == np.float32 and a.size > 1]
    assert floats and all(np.unique(a).size > 1 for a in floats)        # no uniform (ConstantOfShape) weights
    assert all(np.isfinite(a).all() for a in floats)


def test_batchnorm_parameters_follow_the_scheme():
    copy = proto("resnet50")
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in copy.graph.initializer}
    bn = next(n for n in copy.graph.node if n.op_type == "BatchNormalization")
    gamma, beta, mean, var = (inits[t] for t in bn.input[1:])
    assert 0.5 <= gamma.min() and gamma.max() <= 1.5 and 0.5 <= var.min() and var.max() <= 1.5
    assert np.abs(beta).max() <= 0.1 and np.abs(mean).max() <= 0.1


def activation_rms(model: onnx.ModelProto) -> dict[str, float]:
    """Root-mean-square of every float activation (node outputs that depend on the input, Softmax
    probabilities excluded) for a seeded standard-normal input."""
    live = {vi.name for vi in model.graph.input} - {t.name for t in model.graph.initializer}
    names = []
    for n in model.graph.node:
        if any(t in live for t in n.input):
            live.update(n.output)
            if n.op_type not in ("Softmax", "Shape"):
                names.append(n.output[0])
    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.output[:]
    m.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in names)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    inp = next(i for i in sess.get_inputs() if i.name in live)
    x = np.random.default_rng(0).standard_normal(inp.shape).astype(np.float32)
    out = {}
    for n, v in zip(names, sess.run(None, {inp.name: x})):
        if v.dtype == np.float32:                       # skip shape arithmetic; ignore causal-mask fill values
            kept = v[np.abs(v) < 1e30].astype(np.float64)
            out[n] = float(np.sqrt(np.mean(np.square(kept))))
    return out


@pytest.mark.parametrize("name", LIGHT_CHECKED + ["mobilenetv2", "bert_layer", "gpt_block", "llama_mlp"])
def test_activations_stay_order_one(name):
    rms = activation_rms(proto(name))
    low, high = min(rms, key=rms.get), max(rms, key=rms.get)
    assert rms[low] > 0.1 and rms[high] < 12, (low, rms[low], high, rms[high])


def test_build_script_writes_the_model(tmp_path, capsys):
    out = tmp_path / "sub" / "gpt.onnx"
    assert build_script.main(["gpt_block", "-o", str(out)]) == 0
    assert out.read_bytes() == built("gpt_block")
    assert list(out.parent.iterdir()) == [out]                         # no temp file left behind
    assert "wrote" in capsys.readouterr().out


def test_build_script_errors(tmp_path, capsys):
    assert build_script.main(["resnet51", "-o", str(tmp_path / "x.onnx")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a bundled model" in err
    assert not list(tmp_path.iterdir())
    assert build_script.main(["--list"]) == 0 and "llama_mlp" in capsys.readouterr().out


@pytest.mark.slow
def test_bert_base_is_a_bert_base_sized_encoder():
    """12 post-LN layers (two LayerNorms, six MatMuls with 768/3072-wide weights each), seq 384, hidden 768."""
    m = models.build_model("bert_base")
    ops = [n.op_type for n in m.graph.node]
    assert ops.count("LayerNormalization") == 24 and ops.count("Softmax") == 12 and ops.count("MatMul") == 12 * 6
    dims = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 384, 768]
    widths = sorted({tuple(i.dims) for i in m.graph.initializer if len(i.dims) == 2})
    assert widths == [(768, 768), (768, 3072), (3072, 768)]
    params = sum(int(np.prod(i.dims)) for i in m.graph.initializer if i.data_type == onnx.TensorProto.FLOAT)
    assert 85_000_000 < params < 85_300_000            # 12 x (4 x 768^2 + 2 x 768 x 3072) weights, biases, norms
