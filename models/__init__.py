"""Bundled models: `names()`, `describe(name)` and `resolve(name_or_path) -> onnx.ModelProto`.

Every bundled model is built on demand with onnx.helper and seeded random weights, so its bytes
are deterministic; `python -m tpuflow.models.build NAME -o file.onnx` writes one to a file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import onnx

from tpuflow.errors import InputFileError

DEFAULT_MODEL = "resnet50"

_DESCRIPTIONS = {
    "mlp": "3-layer perceptron 784-512-256-10 (Gemm, Relu, Softmax), batch 4",
    "small_cnn": "3 conv blocks (Conv, BatchNorm, Relu, MaxPool), GlobalAveragePool, Gemm; 1x3x32x32",
    "mobilenetv2": "MobileNetV2: inverted residuals, depthwise 3x3, Relu6 (Clip), Gemm; 1x3x112x112",
    "bert_layer": "BERT encoder layer: 4-head attention, LayerNorm, erf-GELU FFN 1024; seq 64, hidden 256",
    "gpt_block": "GPT decoder block: causal mask (Where), pre-LayerNorm, tanh-GELU MLP; seq 64, hidden 256",
    "llama_mlp": "LLaMA MLP: RMSNorm from primitives, SwiGLU gate/up/down 256-688-256; seq 64",
    "bert_base": "BERT-base-sized encoder: 12 layers, 12 heads, hidden 768, FFN 3072, erf-GELU; seq 384",
    "alexnet": "onnx light AlexNet (LRN, Dropout, Gemm), random weights; 1x3x224x224",
    "densenet121": "onnx light DenseNet-121 (BatchNorm, Concat), random weights; 1x3x224x224",
    "inception_v1": "onnx light Inception v1 / GoogLeNet (LRN, Concat), random weights; 1x3x224x224",
    "inception_v2": "onnx light Inception v2 (BatchNorm, Concat), random weights; 1x3x224x224",
    "resnet50": "onnx light ResNet-50 v1.5 (BatchNorm, Sum), random weights; 1x3x224x224",
    "shufflenet": "onnx light ShuffleNet (grouped Conv, channel shuffle), random weights; 1x3x224x224",
    "squeezenet": "onnx light SqueezeNet 1.0 (fire modules), random weights; 1x3x224x224",
    "vgg19": "onnx light VGG-19 (16 Conv + 3 Gemm), random weights; 1x3x224x224",
    "zfnet512": "onnx light ZFNet-512 (LRN, Gemm), random weights; 1x3x224x224",
}


def _builder(name: str) -> Callable[[], onnx.ModelProto]:
    from tpuflow.models import cnn, light, mlp, transformer
    table = {"mlp": mlp.mlp, "small_cnn": cnn.small_cnn, "mobilenetv2": cnn.mobilenetv2,
             "bert_layer": transformer.bert_layer, "bert_base": transformer.bert_base, "gpt_block": transformer.gpt_block,
             "llama_mlp": transformer.llama_mlp}
    if name in table:
        return table[name]
    return lambda: light.randomized_light(name)


def names() -> list[str]:
    """Every bundled model name, in listing order."""
    return list(_DESCRIPTIONS)


def describe(name: str) -> str:
    return _DESCRIPTIONS[name]


def is_bundled(name) -> bool:
    return isinstance(name, str) and name in _DESCRIPTIONS


def build_model(name: str) -> onnx.ModelProto:
    """Build the bundled model `name` (seeded, deterministic)."""
    if not is_bundled(name):
        raise InputFileError(f"'{name}' is not a bundled model (bundled: {', '.join(names())})")
    return _builder(name)()


def resolve(name_or_path: str | Path | None = None) -> onnx.ModelProto:
    """A bundled model by name (None -> the default model), or an ONNX file by path."""
    if name_or_path is None:
        return build_model(DEFAULT_MODEL)
    path = Path(name_or_path)
    if path.is_file():
        from tpuflow.frontend.reader import read_model
        return read_model(path)[0]
    if is_bundled(str(name_or_path)):
        return build_model(str(name_or_path))
    raise InputFileError(f"{name_or_path}: no such file, and not a bundled model "
                         f"(bundled: {', '.join(names())})")
