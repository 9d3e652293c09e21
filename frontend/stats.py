"""Per-layer and whole-graph work counts (MACs, parameters, bytes) and the roofline lower bound.

Counting rules:
- MACs: Conv = N * Cout * Ho * Wo * (Cin / group) * kh * kw; MatMul = output elements * K.
  Every other op counts 0 MACs (its work is in `vector_ops`).
- vector_ops: elementwise operations on the vector unit: one per output element for elementwise
  ops, one per input element for reductions / normalisations / GlobalAveragePool, one per window
  element for MaxPool / AveragePool; 0 for Conv, MatMul and pure data movement.
- params / weight_bytes: elements / bytes of constant inputs. Floating-point tensors are counted
  at the compute dtype (fp32: 4 bytes, fp16 / bf16: 2); integer and bool constants at their own
  size. Graph totals count a shared constant once.
- activation bytes: runtime tensors, each once; outputs of views (Reshape) alias their input and
  are not counted again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tpuflow.chip import DTYPE_BYTES
from tpuflow.errors import OptionError
from tpuflow.frontend.graph import Graph, OpNode, TensorInfo
from tpuflow.frontend.ops import VIEW, OpKind, spec
from tpuflow.options import DTYPE_ALIASES, DTYPES as COMPUTE_DTYPES

if TYPE_CHECKING:  # pragma: no cover
    from tpuflow.chip import ChipConfig


def compute_dtype(dtype: str) -> str:
    """'fp32' | 'fp16' | 'bf16' (aliases f32, float32, f16, ... accepted)."""
    name = DTYPE_ALIASES.get(dtype, dtype)
    if name not in COMPUTE_DTYPES:
        raise OptionError(f"option --dtype: '{dtype}' is not one of {', '.join(COMPUTE_DTYPES)}")
    return name


def tensor_bytes(info: TensorInfo, dtype: str) -> int:
    """Bytes of a tensor stored at compute dtype `dtype` (floats) or at its own size (others)."""
    kind = np.dtype(info.dtype)
    width = DTYPE_BYTES[dtype] if kind.kind == "f" else kind.itemsize
    return info.size * width


@dataclass(frozen=True)
class LayerStats:
    name: str
    op_type: str
    output_shape: tuple[int, ...]
    macs: int
    vector_ops: int
    params: int
    weight_bytes: int
    input_bytes: int          # runtime inputs read
    output_bytes: int         # outputs written

    @property
    def activation_bytes(self) -> int:
        return self.input_bytes + self.output_bytes


def node_macs(node: OpNode, graph: Graph) -> int:
    if node.op_type == OpKind.CONV:
        n, _, ho, wo = graph.tensor(node.outputs[0]).shape
        cout, cin_per_group, kh, kw = graph.tensor(node.inputs[1]).shape
        return n * cout * ho * wo * cin_per_group * kh * kw
    if node.op_type == OpKind.CONV_TRANSPOSE:
        return graph.tensor(node.outputs[0]).size * graph.tensor(node.inputs[0]).shape[1]
    if node.op_type == OpKind.MATMUL:
        return graph.tensor(node.outputs[0]).size * graph.tensor(node.inputs[0]).shape[-1]
    return 0


def node_vector_ops(node: OpNode, graph: Graph) -> int:
    """By the kind's spec category (module docstring); windowed pools count each window element."""
    facts = spec(node.op_type)
    if facts.category in ("contraction", "view", "movement"):
        return 0
    if facts.category == "pool" and facts.slicing == "window":
        return graph.tensor(node.outputs[0]).size * math.prod(node.attrs["kernel_shape"])
    if facts.category in ("reduce", "normalize", "pool"):
        return graph.tensor(node.inputs[0]).size
    return sum(graph.tensor(t).size for t in node.outputs)


def _layer(node: OpNode, graph: Graph, dtype: str) -> LayerStats:
    consts = [graph.tensor(t) for t in node.inputs if graph.tensor(t).is_const]
    runtime = [graph.tensor(t) for t in node.inputs if not graph.tensor(t).is_const]
    return LayerStats(
        name=node.name, op_type=node.op_type, output_shape=graph.tensor(node.outputs[0]).shape,
        macs=node_macs(node, graph), vector_ops=node_vector_ops(node, graph),
        params=sum(t.size for t in consts), weight_bytes=sum(tensor_bytes(t, dtype) for t in consts),
        input_bytes=sum(tensor_bytes(t, dtype) for t in runtime),
        output_bytes=sum(tensor_bytes(graph.tensor(t), dtype) for t in node.outputs))


def layer_stats(graph: Graph, dtype: str = "fp32") -> list[LayerStats]:
    """One LayerStats per node, in graph order."""
    dtype = compute_dtype(dtype)
    return [_layer(n, graph, dtype) for n in graph.nodes()]


@dataclass(frozen=True)
class GraphStats:
    macs: int
    vector_ops: int
    params: int
    weight_bytes: int
    activation_bytes: int
    input_bytes: int
    output_bytes: int
    ops: dict[str, int]

    @property
    def compulsory_bytes(self) -> int:
        """DRAM traffic no schedule avoids: weights once, inputs once, outputs once."""
        return self.weight_bytes + self.input_bytes + self.output_bytes


def graph_stats(graph: Graph, layers: list[LayerStats], dtype: str = "fp32") -> GraphStats:
    dtype = compute_dtype(dtype)
    used = {t for n in graph.nodes() for t in n.inputs}
    consts = [t for t in graph.tensors.values() if t.is_const and t.name in used]
    views = {t for n in graph.nodes() if n.op_type in VIEW for t in n.outputs}
    runtime = [t for t in graph.tensors.values() if not t.is_const and t.name not in views]
    ops: dict[str, int] = {}
    for layer in layers:
        ops[layer.op_type] = ops.get(layer.op_type, 0) + 1
    return GraphStats(
        macs=sum(l.macs for l in layers), vector_ops=sum(l.vector_ops for l in layers),
        params=sum(t.size for t in consts), weight_bytes=sum(tensor_bytes(t, dtype) for t in consts),
        activation_bytes=sum(tensor_bytes(t, dtype) for t in runtime),
        input_bytes=sum(tensor_bytes(graph.tensor(t), dtype) for t in graph.inputs),
        output_bytes=sum(tensor_bytes(graph.tensor(t), dtype) for t in graph.outputs),
        ops=dict(sorted(ops.items())))


@dataclass(frozen=True)
class Roofline:
    compute_s: float          # MACs / peak MAC rate
    memory_s: float           # compulsory bytes / DDR peak bandwidth

    @property
    def lower_bound_s(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


def roofline(macs: int, dram_bytes: int, chip: "ChipConfig", dtype: str, int8_macs: int = 0,
             cores: int = 1) -> Roofline:
    """`int8_macs` of the `macs` (products of quantized tensors) count at the chip's int8 rate, the
    rest at `dtype`'s. On `cores` cores: that many MAC engines, and the DDR bandwidth they share
    (one port each, at most dram.chip_peak_gbps)."""
    dtype = compute_dtype(dtype)
    compute_s = (macs - int8_macs) / chip.peak_macs_per_second(dtype) + int8_macs / chip.peak_macs_per_second("int8")
    ddr = chip.ddr_peak_bytes_per_second if cores == 1 else min(cores * chip.ddr_peak_bytes_per_second,
                                                                  chip.ddr_chip_peak_bytes_per_second)
    return Roofline(compute_s / cores, dram_bytes / ddr)
