"""Gain balancing for the random-weight light models: per-channel affine gains folded back into Conv weights.

Random BatchNormalization parameters scale channel c by k_c = gamma_c / sqrt(var_c + eps) (and
DenseNet / Inception-v2 add a per-channel Mul); E[k^2] > 1 compounds over dozens of layers. So:

- a Conv whose output runs through a chain of per-channel affine ops (BN, Mul / Add by a weight)
  has output channel c of its weights (and bias) divided by the chain's gain k_c;
- an affine chain that does not start at a Conv (pre-activation BN after Concat / MaxPool) is
  compensated in the input channels of the Convs it feeds (through Relu and pools, which commute
  with positive per-channel scales);
- a chain ending in a residual Add / Sum is scaled further: by 1/sqrt(n) when all n summands are
  such chains (projection shortcut), by sqrt(RESIDUAL_BRANCH_VARIANCE) when an identity shortcut
  is one of them, so activations grow by at most (1 + 0.1) in variance per residual block.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper

RESIDUAL_BRANCH_VARIANCE = 0.1
CHANNELWISE = ("Relu", "MaxPool", "AveragePool", "GlobalAveragePool")
PASS_THROUGH = ("Reshape", "Unsqueeze", "Squeeze", "Flatten")


class _Graph:
    def __init__(self, graph: onnx.GraphProto, values: dict[str, np.ndarray]):
        self.values = values
        self.producer = {t: n for n in graph.node for t in n.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for n in graph.node:
            for t in n.input:
                self.consumers.setdefault(t, []).append(n)

    def weight(self, tensor: str) -> np.ndarray | None:
        """The random weight behind `tensor` (looking through reshape-likes), if any."""
        while tensor not in self.values:
            node = self.producer.get(tensor)
            if node is None or node.op_type not in PASS_THROUGH:
                return None
            tensor = node.input[0]
        return self.values[tensor]

    def only_consumer(self, tensor: str) -> onnx.NodeProto | None:
        users = self.consumers.get(tensor, [])
        return users[0] if len(users) == 1 else None

    def affine_gain(self, node: onnx.NodeProto, data: str) -> np.ndarray | None:
        """Per-channel gain of an affine node applied to `data`, None if it is not one."""
        if node.op_type == "BatchNormalization" and node.input[0] == data:
            eps = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "epsilon"), 1e-5)
            gamma, var = self.weight(node.input[1]), self.weight(node.input[4])
            return gamma / np.sqrt(var + eps)
        if node.op_type in ("Mul", "Add") and len(node.input) == 2:
            other = node.input[1] if node.input[0] == data else node.input[0]
            w = self.weight(other)
            if w is None:
                return None
            return w.reshape(-1) if node.op_type == "Mul" else np.ones(w.size)
        return None

    def chain(self, tensor: str, first: onnx.NodeProto | None = None) -> tuple[np.ndarray | None, str]:
        """Follow single-consumer affine nodes from `tensor` (starting with node `first` when
        given): (total gain or None, end tensor)."""
        gain = None
        while (node := first or self.only_consumer(tensor)) is not None:
            first = None
            k = self.affine_gain(node, tensor)
            if k is None:
                break
            gain = k if gain is None else gain * k
            tensor = node.output[0]
        return gain, tensor


def _residual_scale(g: _Graph, end: str, chain_ends: set[str]) -> float:
    node = g.only_consumer(end)
    if node is None or node.op_type not in ("Sum", "Add") or any(g.weight(t) is not None for t in node.input):
        return 1.0
    n = len(node.input)
    summands = sum(t in chain_ends for t in node.input)
    if summands == n:
        return 1.0 / math.sqrt(n)
    return math.sqrt(RESIDUAL_BRANCH_VARIANCE / summands)


def _scale_output_channels(g: _Graph, conv: onnx.NodeProto, gain: np.ndarray) -> None:
    w = g.values[conv.input[1]]
    g.values[conv.input[1]] = w / gain.astype(w.dtype).reshape((-1,) + (1,) * (w.ndim - 1))
    if len(conv.input) > 2 and conv.input[2] in g.values:
        g.values[conv.input[2]] = g.values[conv.input[2]] / gain


def _scale_input_channels(g: _Graph, conv: onnx.NodeProto, gain: np.ndarray) -> None:
    w = g.values[conv.input[1]]
    groups = next((helper.get_attribute_value(a) for a in conv.attribute if a.name == "group"), 1)
    cout, cpg = w.shape[0], w.shape[1]
    scaled = (w.reshape(groups, cout // groups, cpg, *w.shape[2:])
              / gain.astype(w.dtype).reshape(groups, 1, cpg, *(1,) * (w.ndim - 2)))
    g.values[conv.input[1]] = scaled.reshape(w.shape)


def _feeding_convs(g: _Graph, tensor: str) -> list[onnx.NodeProto]:
    """Convs reading `tensor` as data, through channelwise positive-homogeneous ops."""
    found, frontier = [], [tensor]
    while frontier:
        t = frontier.pop()
        for node in g.consumers.get(t, []):
            if node.op_type == "Conv" and node.input[0] == t and node.input[1] in g.values:
                found.append(node)
            elif node.op_type in CHANNELWISE:
                frontier.append(node.output[0])
    return found


def balance_gains(graph: onnx.GraphProto, values: dict[str, np.ndarray]) -> None:
    """Rewrite Conv weights in `values` (name -> array) as the module docstring says."""
    g = _Graph(graph, values)
    convs = [n for n in graph.node if n.op_type == "Conv" and n.input[1] in values]
    chains = {c.output[0]: g.chain(c.output[0]) for c in convs}
    ends = {end for _, end in chains.values()}
    for conv in convs:
        gain, end = chains[conv.output[0]]
        channels = values[conv.input[1]].shape[0]
        total = (np.ones(channels) if gain is None else gain) / _residual_scale(g, end, ends)
        _scale_output_channels(g, conv, total)
    conv_outputs = set(chains)
    for node in graph.node:
        if node.op_type == "BatchNormalization" and node.input[0] not in conv_outputs:
            source = g.producer.get(node.input[0])
            if source is not None and g.affine_gain(source, source.input[0]) is not None:
                continue                              # inside a chain already handled
            gain, end = g.chain(node.input[0], first=node)
            for conv in _feeding_convs(g, end):
                _scale_input_channels(g, conv, gain)
