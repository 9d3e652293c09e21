"""Transformer bundled models: bert_layer (encoder layer), bert_base (a 12-layer BERT-base-sized
encoder), gpt_block (causal decoder), llama_mlp (RMSNorm + SwiGLU), written the way torch.onnx
exports them (shape chains for reshape targets, a causal mask sliced out of a constant buffer), with
seeded random weights (std 1/sqrt(fan_in))."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx

from tpuflow.models.builder import ModelBuilder

@dataclass(frozen=True)
class Dims:
    seq: int
    hidden: int
    heads: int
    ffn: int

    @property
    def head(self) -> int:
        return self.hidden // self.heads


SMALL = Dims(seq=64, hidden=256, heads=4, ffn=1024)          # bert_layer, gpt_block, llama_mlp
BERT_BASE = Dims(seq=384, hidden=768, heads=12, ffn=3072)     # BERT-base (12 layers) at SQuAD length
BERT_BASE_LAYERS = 12
SEQ, HIDDEN = SMALL.seq, SMALL.hidden
LLAMA_INTERMEDIATE = 688
MASK_BUFFER = 128            # max positions of the causal-mask buffer (sliced to the sequence length)


def _i64(values) -> np.ndarray:
    return np.asarray(values, np.int64)


def _linear(b: ModelBuilder, x: str, name: str, fan_in: int, fan_out: int, bias: bool = True) -> str:
    y = b.op("MatMul", [x, b.linear_weight(f"{name}.weight", fan_in, fan_out)], name=f"{name}/matmul")
    if bias:
        y = b.op("Add", [y, b.uniform(f"{name}.bias", (fan_out,), -0.02, 0.02)], name=f"{name}/bias")
    return y


def _layer_norm(b: ModelBuilder, x: str, name: str, eps: float, d: Dims = SMALL) -> str:
    gamma = b.uniform(f"{name}.weight", (d.hidden,), 0.8, 1.2)
    beta = b.uniform(f"{name}.bias", (d.hidden,), -0.05, 0.05)
    return b.op("LayerNormalization", [x, gamma, beta], name=name, axis=-1, epsilon=eps)


def _dim(b: ModelBuilder, x: str, name: str, index: int) -> str:
    """Shape(x)[index] as a 1-element int64 tensor (the Shape -> Gather -> Unsqueeze chain)."""
    shape = b.op("Shape", [x], name=f"{name}/shape")
    d = b.op("Gather", [shape, b.const(f"{name}/index", _i64(index))], name=f"{name}/gather", axis=0)
    return b.op("Unsqueeze", [d, b.const(f"{name}/axes", _i64([0]))], name=f"{name}/unsqueeze")


def _split_heads(b: ModelBuilder, x: str, name: str, key: bool = False, d: Dims = SMALL) -> str:
    """[1, S, H] -> [1, heads, S, head] (keys: [1, heads, head, S]) with a shape-chain target."""
    parts = [_dim(b, x, f"{name}/batch", 0), _dim(b, x, f"{name}/seq", 1),
             b.const(f"{name}/heads", _i64([d.heads])), b.const(f"{name}/head", _i64([d.head]))]
    target = b.op("Concat", parts, name=f"{name}/target", axis=0)
    y = b.op("Reshape", [x, target], name=f"{name}/reshape")
    return b.op("Transpose", [y], name=f"{name}/transpose", perm=[0, 2, 3, 1] if key else [0, 2, 1, 3])


def _merge_heads(b: ModelBuilder, x: str, name: str, d: Dims = SMALL) -> str:
    y = b.op("Transpose", [x], name=f"{name}/transpose", perm=[0, 2, 1, 3])
    return b.op("Reshape", [y, b.const(f"{name}/shape", _i64([1, d.seq, d.hidden]))], name=f"{name}/reshape")


def _attention(b: ModelBuilder, q: str, k: str, v: str, name: str, mask: str | None, d: Dims = SMALL) -> str:
    scores = b.op("MatMul", [_split_heads(b, q, f"{name}/q", d=d), _split_heads(b, k, f"{name}/k", key=True, d=d)],
                  name=f"{name}/scores")
    scores = b.op("Div", [scores, b.const(f"{name}/sqrt_head", np.asarray(math.sqrt(d.head), np.float32))],
                  name=f"{name}/scale")
    if mask is not None:
        low = b.const(f"{name}/masked", np.asarray(np.finfo(np.float32).min, np.float32))
        scores = b.op("Where", [mask, scores, low], name=f"{name}/causal")
    probs = b.op("Softmax", [scores], name=f"{name}/softmax", axis=-1)
    context = b.op("MatMul", [probs, _split_heads(b, v, f"{name}/v", d=d)], name=f"{name}/context")
    return _merge_heads(b, context, f"{name}/merge", d)


def _gelu_erf(b: ModelBuilder, x: str, name: str) -> str:
    """0.5 x (1 + erf(x / sqrt 2))."""
    e = b.op("Erf", [b.op("Div", [x, b.const(f"{name}/sqrt2", np.float32(math.sqrt(2)))], name=f"{name}/div")],
             name=f"{name}/erf")
    e = b.op("Add", [e, b.const(f"{name}/one", np.float32(1))], name=f"{name}/add")
    return b.op("Mul", [b.op("Mul", [x, e], name=f"{name}/mul"), b.const(f"{name}/half", np.float32(0.5))],
                name=f"{name}/out")


def _gelu_tanh(b: ModelBuilder, x: str, name: str) -> str:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    cube = b.op("Pow", [x, b.const(f"{name}/three", np.float32(3))], name=f"{name}/pow")
    inner = b.op("Add", [x, b.op("Mul", [cube, b.const(f"{name}/c", np.float32(0.044715))], name=f"{name}/mulc")],
                 name=f"{name}/inner")
    t = b.op("Tanh", [b.op("Mul", [inner, b.const(f"{name}/k", np.float32(math.sqrt(2 / math.pi)))],
                           name=f"{name}/mulk")], name=f"{name}/tanh")
    t = b.op("Add", [t, b.const(f"{name}/one", np.float32(1))], name=f"{name}/add")
    return b.op("Mul", [b.op("Mul", [x, t], name=f"{name}/mul"), b.const(f"{name}/half", np.float32(0.5))],
                name=f"{name}/out")


def _encoder_layer(b: ModelBuilder, x: str, prefix: str, d: Dims) -> str:
    """Post-LN encoder layer: self-attention + FFN with erf-GELU, LayerNormalization."""
    q, k, v = (_linear(b, x, f"{prefix}attention/{p}", d.hidden, d.hidden) for p in ("query", "key", "value"))
    a = _linear(b, _attention(b, q, k, v, f"{prefix}attention", None, d), f"{prefix}attention/output", d.hidden, d.hidden)
    h = _layer_norm(b, b.op("Add", [a, x], name=f"{prefix}attention/residual"), f"{prefix}attention/layer_norm",
                    1e-12, d)
    f = _gelu_erf(b, _linear(b, h, f"{prefix}ffn/intermediate", d.hidden, d.ffn), f"{prefix}ffn/gelu")
    f = _linear(b, f, f"{prefix}ffn/output", d.ffn, d.hidden)
    return _layer_norm(b, b.op("Add", [f, h], name=f"{prefix}ffn/residual"), f"{prefix}ffn/layer_norm", 1e-12, d)


def bert_layer() -> onnx.ModelProto:
    """Post-LN encoder layer: self-attention (4 heads) + FFN 1024 with erf-GELU, LayerNormalization (opset 17)."""
    b = ModelBuilder("bert_layer", opset=17)
    x = b.input("hidden_states", (1, SEQ, HIDDEN))
    y = _encoder_layer(b, x, "", SMALL)
    b.op("Identity", [y], name="output", outputs=["output"])
    b.output("output", (1, SEQ, HIDDEN))
    return b.build()


def encoder(name: str, layers: int, d: Dims) -> onnx.ModelProto:
    """`layers` post-LN encoder layers of size `d` over a (1, seq, hidden) input (opset 17)."""
    b = ModelBuilder(name, opset=17)
    x = b.input("hidden_states", (1, d.seq, d.hidden))
    for i in range(layers):
        x = _encoder_layer(b, x, f"layer{i}/", d)
    b.op("Identity", [x], name="output", outputs=["output"])
    b.output("output", (1, d.seq, d.hidden))
    return b.build()


def bert_base() -> onnx.ModelProto:
    """BERT-base-sized encoder: 12 post-LN layers, hidden 768, 12 heads, FFN 3072, seq 384 (opset 17)."""
    return encoder("bert_base", BERT_BASE_LAYERS, BERT_BASE)


def _causal_mask(b: ModelBuilder, x: str) -> str:
    """tril(ones(MASK_BUFFER, MASK_BUFFER))[:, :, :S, :S] with S taken from the input's shape."""
    buffer = np.tril(np.ones((MASK_BUFFER, MASK_BUFFER), bool))[None, None]
    seq = _dim(b, x, "mask/seq", 1)
    ends = b.op("Concat", [seq, seq], name="mask/ends", axis=0)
    return b.op("Slice", [b.const("mask/buffer", buffer), b.const("mask/starts", _i64([0, 0])), ends,
                          b.const("mask/axes", _i64([2, 3]))], name="mask/slice")


def gpt_block() -> onnx.ModelProto:
    """Pre-LN causal decoder block: fused QKV + Split, Where(causal mask), tanh-GELU MLP (opset 17)."""
    b = ModelBuilder("gpt_block", opset=17)
    x = b.input("hidden_states", (1, SEQ, HIDDEN))
    mask = _causal_mask(b, x)
    qkv = _linear(b, _layer_norm(b, x, "ln_1", 1e-5), "attn/c_attn", HIDDEN, 3 * HIDDEN)
    q, k, v = b.op("Split", [qkv, b.const("attn/split_sizes", _i64([HIDDEN] * 3))], name="attn/split", outputs=3, axis=2)
    a = _linear(b, _attention(b, q, k, v, "attn", mask), "attn/c_proj", HIDDEN, HIDDEN)
    r = b.op("Add", [x, a], name="attn/residual")
    m = _gelu_tanh(b, _linear(b, _layer_norm(b, r, "ln_2", 1e-5), "mlp/c_fc", HIDDEN, SMALL.ffn), "mlp/gelu")
    b.op("Add", [r, _linear(b, m, "mlp/c_proj", SMALL.ffn, HIDDEN)], name="mlp/residual", outputs=["output"])
    b.output("output", (1, SEQ, HIDDEN))
    return b.build()


def llama_mlp() -> onnx.ModelProto:
    """RMSNorm (Pow, ReduceMean, Add, Sqrt, Div, Mul) + SwiGLU MLP (SiLU = x * Sigmoid(x)) + residual (opset 18)."""
    b = ModelBuilder("llama_mlp", opset=18)
    x = b.input("hidden_states", (1, SEQ, HIDDEN))
    sq = b.op("Pow", [x, b.const("norm/two", np.float32(2))], name="norm/pow")
    ms = b.op("ReduceMean", [sq, b.const("norm/axes", _i64([-1]))], name="norm/mean", keepdims=1)
    rms = b.op("Sqrt", [b.op("Add", [ms, b.const("norm/eps", np.float32(1e-6))], name="norm/add")], name="norm/sqrt")
    n = b.op("Mul", [b.op("Div", [x, rms], name="norm/div"), b.uniform("norm.weight", (HIDDEN,), 0.8, 1.2)],
             name="norm/scale")
    gate = _linear(b, n, "mlp/gate_proj", HIDDEN, LLAMA_INTERMEDIATE, bias=False)
    up = _linear(b, n, "mlp/up_proj", HIDDEN, LLAMA_INTERMEDIATE, bias=False)
    silu = b.op("Mul", [gate, b.op("Sigmoid", [gate], name="mlp/sigmoid")], name="mlp/silu")
    h = b.op("Mul", [silu, up], name="mlp/gated")
    down = _linear(b, h, "mlp/down_proj", LLAMA_INTERMEDIATE, HIDDEN, bias=False)
    b.op("Add", [x, down], name="residual", outputs=["output"])
    b.output("output", (1, SEQ, HIDDEN))
    return b.build()
