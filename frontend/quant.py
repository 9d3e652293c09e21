"""Quantization parameters of a tensor (Quant) and the one rule that maps stored integers to real values.

The canonical quantized graph (frontend/imp_quant.py builds it, frontend/graph.py carries it):

- A *quantized tensor* is a TensorInfo whose `quant` is a Quant and whose `dtype` equals
  `quant.storage` ("int8", "uint8" or "int32"). Its stored integers q stand for the real values
  real = (q - zero_point) * scale, broadcast along `axis` when per-channel. Float tensors have
  quant None; nothing else about them changes. Graph inputs and outputs may be quantized too
  (integer inputs of ConvInteger / MatMulInteger, uint8 outputs of QOperator models).
- A quantized constant (weights, biases) holds the model's integers exactly (TensorInfo.const is
  the integer array) with the model's scale and zero point; only a bias the model keeps in float
  (PyTorch exports) is rounded to int32 by `quantize`.
- An op of the canonical vocabulary (frontend/ops.py) whose inputs or outputs are quantized
  computes on real values and rounds once: out = quantize(op(real(inputs)), out.quant), with
  quantize = round half to even, add the zero point, saturate to the storage range (the ONNX
  QuantizeLinear rule). It is exactly the ONNX QDQ meaning of DequantizeLinear -> op ->
  QuantizeLinear, so int8 lowering may pick any integer form that gives the same integers.
  Attributes keep their real-valued meaning (Clip min / max are real values). The kinds that
  appear on quantized tensors are imp_quant.ABSORBED: Conv, MatMul, Add, Mul, Relu, Clip,
  MaxPool, AveragePool, GlobalAveragePool, Concat, Reshape, Transpose, Slice. Relu, MaxPool and
  the moves (imp_quant.ON_GRID) usually have their input's Quant on their output: then they are
  exact on the stored integers (Relu: max(q, zero_point)).
- Conv and MatMul take a per-tensor quantized activation (input 0) and weights quantized per
  tensor or per channel: axis 0 (output channels) for Conv, the last axis (columns) for MatMul.
  A Conv bias is an int32 constant with zero point 0 and scale = input scale * weight scale
  (float32, per output channel on axis 0 when the weights are per-channel), so the accumulator
  adds it unscaled. A MatMul that had a bias (Gemm) produces an int32 accumulator tensor of that
  scale (on its last axis when the weights are per-channel), consumed by an Add of the int32 bias
  that produces the 8-bit output. ConvInteger / MatMulInteger give Conv / MatMul with an int32
  result of scale 1 (inputs of scale 1 and the model's zero points).
- Float <-> integer boundaries are explicit QuantizeLinear / DequantizeLinear nodes (OpKind
  QUANTIZE / DEQUANTIZE, no attributes): DequantizeLinear's parameters are its input's Quant,
  QuantizeLinear's are its output's Quant. Ops without an int8 form in the model (Softmax,
  LayerNormalization, ...) stay float between them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

STORAGES = ("int8", "uint8", "int32")


class QuantParamError(ValueError):
    """Quantization parameters that do not describe a valid per-tensor or per-channel quantization."""


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.array(a, copy=True)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class Quant:
    """How a tensor's stored integers map to real values: real = (q - zero_point) * scale.

    scale: float32, shape () per-tensor or (C,) per-channel, every entry finite and > 0.
    zero_point: same shape as scale, of the storage dtype (int32 storage: zero points are 0).
    axis: the per-channel axis of the tensor (non-negative), None for per-tensor.
    storage: the integer dtype name of the stored values (one of STORAGES)."""

    scale: np.ndarray
    zero_point: np.ndarray
    axis: int | None
    storage: str

    def __post_init__(self):
        if self.storage not in STORAGES:
            raise QuantParamError(f"storage {self.storage!r} is not one of {', '.join(STORAGES)}")
        scale = np.asarray(self.scale, np.float32)
        zp = np.asarray(self.zero_point)
        if scale.ndim > 1 or scale.shape != zp.shape:
            raise QuantParamError(f"zero point shape {list(zp.shape)} does not match scale shape {list(scale.shape)}")
        if (self.axis is None) != (scale.ndim == 0):
            raise QuantParamError("a per-channel quantization has a 1-D scale and an axis, a per-tensor one neither")
        if not np.all(np.isfinite(scale)) or not np.all(scale > 0):
            raise QuantParamError(f"scale must be finite and positive, got {scale.reshape(-1)[:4].tolist()}")
        if zp.dtype.kind not in "iu" or not np.all((zp >= storage_range(self.storage)[0])
                                                    & (zp <= storage_range(self.storage)[1])):
            raise QuantParamError(f"zero point {zp.reshape(-1)[:4].tolist()} is not a {self.storage} value")
        if self.storage == "int32" and np.any(zp != 0):
            raise QuantParamError("an int32 tensor (bias, accumulator) has zero point 0")
        object.__setattr__(self, "scale", _frozen(scale))
        object.__setattr__(self, "zero_point", _frozen(zp.astype(self.storage)))

    @property
    def per_channel(self) -> bool:
        return self.axis is not None

    @property
    def channels(self) -> int:
        return int(self.scale.size) if self.per_channel else 1

    def __eq__(self, other) -> bool:
        return (isinstance(other, Quant) and self.storage == other.storage and self.axis == other.axis
                and np.array_equal(self.scale, other.scale) and np.array_equal(self.zero_point, other.zero_point))

    def __hash__(self) -> int:
        return hash((self.storage, self.axis, self.scale.tobytes(), self.zero_point.tobytes()))

    def describe(self) -> str:
        """'int8 per-tensor' / 'uint8 per-channel(axis 0, 64)'."""
        return f"{self.storage} " + (f"per-channel(axis {self.axis}, {self.channels})" if self.per_channel
                                     else "per-tensor")

    def broadcast(self, values: np.ndarray, rank: int) -> np.ndarray:
        """`values` (scale-shaped) shaped to broadcast against a tensor of `rank` dimensions."""
        if not self.per_channel:
            return values
        shape = [1] * rank
        shape[self.axis] = self.channels
        return values.reshape(shape)

    def with_axis(self, axis: int | None) -> "Quant":
        return Quant(self.scale, self.zero_point, axis if self.per_channel else None, self.storage)


def storage_range(storage: str) -> tuple[int, int]:
    info = np.iinfo(storage)
    return int(info.min), int(info.max)


def dequantize(q: np.ndarray, quant: Quant) -> np.ndarray:
    """Real values (float32) of stored integers, the ONNX DequantizeLinear rule."""
    q = np.asarray(q)
    zp = quant.broadcast(quant.zero_point.astype(np.int64), q.ndim)
    return ((q.astype(np.int64) - zp).astype(np.float32) * quant.broadcast(quant.scale, q.ndim)).astype(np.float32)


def quantize(real: np.ndarray, quant: Quant) -> np.ndarray:
    """Stored integers of real values, the ONNX QuantizeLinear rule: round half to even, add the
    zero point, saturate to the storage range. 8-bit storages divide in fp32, as QuantizeLinear on an
    fp32 input does (onnxruntime: 0.7f / 0.2f is 3.5f, quantized to 4; the exact quotient rounds to 3);
    an int32 accumulator's values (a bias folded into integer sums) divide in fp64."""
    divide_in = np.float32 if quant.storage in ("int8", "uint8") else np.float64
    real = np.asarray(real, divide_in)
    scaled = np.rint((real / quant.broadcast(quant.scale.astype(divide_in), real.ndim)).astype(np.float64))
    q = scaled + quant.broadcast(quant.zero_point.astype(np.float64), real.ndim)
    low, high = storage_range(quant.storage)
    return np.clip(q, low, high).astype(quant.storage)


def onnx_quant(scale: np.ndarray, zero_point: np.ndarray | None, storage: str, shape: tuple[int, ...],
               axis: int = 1, block_size: int = 0) -> Quant:
    """The Quant of an ONNX QuantizeLinear / DequantizeLinear: `scale` and `zero_point` as the model
    has them, `storage` the integer dtype, `shape` the quantized tensor's shape, `axis` and
    `block_size` the node's attributes. A scale and zero point of one element each are per-tensor
    (onnxruntime writes a bias scale of shape [1] with a scalar zero point); a 1-D scale of the
    channel count of `axis` is per-channel. Raises QuantParamError."""
    scale = np.asarray(scale)
    if scale.dtype.kind != "f":
        raise QuantParamError(f"scale has dtype {scale.dtype.name}, not a float type")
    if block_size:
        raise QuantParamError(f"blocked quantization (block_size {block_size}) is not supported")
    zp = np.zeros(scale.shape, storage) if zero_point is None else np.asarray(zero_point)
    if zp.dtype.name != storage:
        raise QuantParamError(f"zero point dtype {zp.dtype.name} is not the quantized dtype {storage}")
    if scale.size == 1 and zp.size == 1 and scale.ndim <= 1 and zp.ndim <= 1:      # () or [1]: per-tensor
        return Quant(scale.reshape(()), zp.reshape(()), None, storage)
    if zp.shape != scale.shape:
        raise QuantParamError(f"zero point shape {list(zp.shape)} does not match scale shape {list(scale.shape)}")
    if scale.ndim != 1:
        raise QuantParamError(f"scale of shape {list(scale.shape)}: only per-tensor and per-axis (1-D) are supported")
    rank = len(shape)
    if not -rank <= axis < rank:
        raise QuantParamError(f"axis {axis} is outside a {rank}-D tensor")
    axis %= rank
    if shape[axis] != scale.size:
        raise QuantParamError(f"{scale.size} scales for axis {axis} of size {shape[axis]}")
    return Quant(scale, zp, axis, storage)


def accumulator_quant(x: Quant, w: Quant, axis: int) -> Quant:
    """The int32 Quant of a product's accumulator (and of its bias): zero point 0, scale = input
    scale * weight scale (float32), per-channel along `axis` of the accumulator when the weights are."""
    scale = (x.scale.astype(np.float32) * w.scale.astype(np.float32)).astype(np.float32)
    return Quant(scale, np.zeros(scale.shape, np.int32), axis if w.per_channel else None, "int32")


def first_quantized_node(graph) -> tuple | None:
    """(node, tensor) of the first node (in graph order) that reads or writes a quantized tensor of
    `graph` (a frontend Graph), or None for a float graph."""
    for node in graph.nodes():
        for name in (*node.inputs, *node.outputs):
            tensor = graph.tensor(name)
            if tensor.quant is not None:
                return node, tensor
    return None
