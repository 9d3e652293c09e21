"""Small QDQ models of elementwise chains on one int8 / uint8 tensor for the lookup-table tests: an 8-bit graph
input x (so every code can be fed), DequantizeLinear, float ops with their constants, each result quantized
(QuantizeLinear -> DequantizeLinear) with its own scale and zero point where asked, a float output."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T, helper, numpy_helper

SHAPE = (1, 4, 8, 8)
ELEM = {"int8": T.INT8, "uint8": T.UINT8}


def _arr(name, value, dtype):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


class Chain:
    """Builds x (8-bit input) -> DequantizeLinear -> steps -> output 'y' (float)."""

    def __init__(self, storage="int8", scale=0.05, zero_point=0, shape=SHAPE, x_axis_scales=None):
        self.storage, self.shape = storage, shape
        self.nodes, self.inits, self.inputs = [], [], {"xq": (shape, ELEM[storage])}
        self.k = 0
        if x_axis_scales is not None:        # x quantized per channel (axis 1)
            self.inits += [_arr("sx", x_axis_scales, np.float32), _arr("zx", [zero_point] * len(x_axis_scales),
                                                                       storage)]
            self.nodes.append(helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["x"], name="x_dq", axis=1))
        else:
            self.inits += [_arr("sx", scale, np.float32), _arr("zx", zero_point, storage)]
            self.nodes.append(helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["x"], name="x_dq"))

    def const(self, value) -> str:
        self.k += 1
        name = f"c{self.k}"
        self.inits.append(_arr(name, value, np.float32))
        return name

    def qconst(self, value) -> str:
        """A constant as DequantizeLinear of int8 codes (as quantizers store them): ops reading it are absorbed
        into ops on quantized tensors (frontend/imp_quant.py)."""
        self.k += 1
        value = np.asarray(value, np.float32)
        scale = np.float32(max(float(np.max(np.abs(value))), 1e-3) / 127)
        codes = np.clip(np.rint(value / scale), -127, 127).astype(np.int8)
        names = [f"q{self.k}", f"q{self.k}_scale", f"q{self.k}_zp"]
        self.inits += [_arr(names[0], codes, np.int8), _arr(names[1], scale, np.float32), _arr(names[2], 0, np.int8)]
        return self.op("DequantizeLinear", names, f"q{self.k}_real")

    def op(self, op: str, inputs, out: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=out, **attrs))
        return out

    def quantize(self, value: str, scale: float, zero_point: int, storage: str | None = None) -> str:
        """value -> QuantizeLinear -> DequantizeLinear; the real value's name."""
        storage = storage or self.storage
        s, z = self.const(scale), f"{value}_zp"
        self.inits.append(_arr(z, zero_point, storage))
        self.op("QuantizeLinear", [value, s, z], f"{value}_q")
        return self.op("DequantizeLinear", [f"{value}_q", s, z], f"{value}_real")

    def runtime_input(self, name: str) -> str:
        self.inputs[name] = (self.shape, T.FLOAT)
        return name

    def model(self, *outputs: str) -> onnx.ModelProto:
        outs = list(outputs)
        nodes = self.nodes + [helper.make_node("Identity", [o], [f"y{i}"], name=f"y{i}") for i, o in enumerate(outs)]
        graph = helper.make_graph(nodes, "lookup_chain",
                                  [helper.make_tensor_value_info(k, e, list(s)) for k, (s, e) in self.inputs.items()],
                                  [helper.make_tensor_value_info(f"y{i}", T.FLOAT, list(self.shape))
                                   for i in range(len(outs))], self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def hard_swish(scales=(0.04, 0.03, 0.05, 0.02), zps=(0, 0, 0, 0), three=3.0, six=6.0, storage="int8",
               x_scale=0.05, x_zp=0, quantized_constants=True, shape=SHAPE) -> onnx.ModelProto:
    """x * clip(x + 3, 0, 6) / 6 with every op quantized on its own scale (--dtype int8's form: the constants
    quantized too, so the frontend absorbs Add / Clip / Mul into ops on quantized tensors)."""
    c = Chain(storage, x_scale, x_zp, shape)
    const = c.qconst if quantized_constants else c.const
    a = c.quantize(c.op("Add", ["x", const(three)], "a"), scales[0], zps[0])
    k = c.quantize(c.op("Clip", [a, c.const(0.0), c.const(six)], "k"), scales[1], zps[1])
    m = c.quantize(c.op("Mul", ["x", k], "m"), scales[2], zps[2])
    y = c.quantize(c.op("Mul", [m, const(1.0 / six)], "h"), scales[3], zps[3])
    return c.model(y)


def float_sigmoid(storage="int8") -> onnx.ModelProto:
    """x -> DequantizeLinear -> Sigmoid (float) -> QuantizeLinear: a LUT through a float op."""
    c = Chain(storage, 0.08, 3 if storage == "uint8" else 0)
    return c.model(c.quantize(c.op("Sigmoid", ["x"], "s"), 1 / 255, 0, "uint8"))
