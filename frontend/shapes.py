"""Output shapes of canonical ops from their input shapes and attributes: the shape function of
every op kind (frontend/ops.py's SPECS names one per kind; the verifier checks every node with it)."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from tpuflow.frontend.graph import OpNode

Shape = tuple[int, ...]
ShapeFn = Callable[[OpNode, list[Shape]], list[Shape]]


def _window_out(size: int, k: int, s: int, d: int, begin: int, end: int) -> tuple[int, int]:
    """(floor, ceil) output length of a sliding window."""
    span = size + begin + end - d * (k - 1) - 1
    return span // s + 1, -(-span // s) + 1


def conv(n: OpNode, ins: list[Shape]) -> list[Shape]:
    (batch, channels, h, w), wshape = ins[0], ins[1]
    if wshape[1] * n.attrs["group"] != channels:
        raise ValueError(f"weights take {wshape[1]} x group {n.attrs['group']} channels, input has {channels}")
    (kh, kw), (sh, sw), (dh, dw), (t, l, b, r) = (n.attrs[k] for k in ("kernel_shape", "strides", "dilations", "pads"))
    return [(batch, wshape[0], _window_out(h, kh, sh, dh, t, b)[0], _window_out(w, kw, sw, dw, l, r)[0])]


def conv_transpose_blocks(n: OpNode, ins: list[Shape]) -> list[Shape]:
    """ConvTranspose with kernel == stride: each input pixel becomes a kh x kw block."""
    (batch, channels, h, w), wshape = ins[0], ins[1]
    (kh, kw), strides = n.attrs["kernel_shape"], n.attrs["strides"]
    if tuple(strides) != (kh, kw) or wshape[0] != channels or tuple(wshape[2:]) != (kh, kw):
        raise ValueError(f"weights {wshape}, kernel {kh}x{kw} stride {tuple(strides)} over {channels} channels")
    return [(batch, wshape[1], h * kh, w * kw)]


def pool_output_choices(n: OpNode, shape: Shape) -> list[Shape]:
    """Floor and ceil-mode output shapes of a MaxPool / AveragePool."""
    batch, channels, h, w = shape
    (kh, kw), (sh, sw), (dh, dw), (t, l, b, r) = (n.attrs[k] for k in ("kernel_shape", "strides", "dilations", "pads"))
    oh, ow = _window_out(h, kh, sh, dh, t, b), _window_out(w, kw, sw, dw, l, r)
    return [(batch, channels, oh[0], ow[0]), (batch, channels, oh[1], ow[1])]


def pool(n: OpNode, ins: list[Shape]) -> list[Shape]:
    """The floor-mode shape (the ceil-mode one is allowed too: see OpSpec.ceil_mode)."""
    return pool_output_choices(n, ins[0])[:1]


def global_pool(n: OpNode, ins: list[Shape]) -> list[Shape]:
    return [ins[0][:2] + (1,) * (len(ins[0]) - 2)]


def matmul_shape(a: Shape, b: Shape) -> Shape:
    """numpy.matmul's result shape (1-D operands promoted, batch dims broadcast)."""
    a2, b2 = (1,) + a if len(a) == 1 else a, b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise ValueError(f"inner dimensions differ: {a} @ {b}")
    out = np.broadcast_shapes(a2[:-2], b2[:-2]) + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return tuple(out)


def matmul(n: OpNode, ins: list[Shape]) -> list[Shape]:
    return [matmul_shape(ins[0], ins[1])]


def same(n: OpNode, ins: list[Shape]) -> list[Shape]:
    """The first input's shape (unary ops, normalisations, ScatterND)."""
    return [tuple(ins[0])]


def broadcast(n: OpNode, ins: list[Shape]) -> list[Shape]:
    """numpy broadcasting of every input (binary ops, Where)."""
    return [tuple(np.broadcast_shapes(*ins))]


def reduce(n: OpNode, ins: list[Shape]) -> list[Shape]:
    axes, keep = n.attrs["axes"], n.attrs["keepdims"]
    return [tuple(1 if i in axes else d for i, d in enumerate(ins[0]) if keep or i not in axes)]


def reshape(n: OpNode, ins: list[Shape]) -> list[Shape]:
    if math.prod(ins[0]) != math.prod(n.attrs["shape"]):
        raise ValueError(f"cannot view {ins[0]} as {n.attrs['shape']}")
    return [tuple(n.attrs["shape"])]


def transpose(n: OpNode, ins: list[Shape]) -> list[Shape]:
    return [tuple(ins[0][p] for p in n.attrs["perm"])]


def concat(n: OpNode, ins: list[Shape]) -> list[Shape]:
    axis = n.attrs["axis"]
    for s in ins[1:]:
        if len(s) != len(ins[0]) or any(a != b for i, (a, b) in enumerate(zip(s, ins[0])) if i != axis):
            raise ValueError(f"inputs {ins} differ outside axis {axis}")
    return [ins[0][:axis] + (sum(s[axis] for s in ins),) + ins[0][axis + 1:]]


def split(n: OpNode, ins: list[Shape]) -> list[Shape]:
    axis, sizes = n.attrs["axis"], n.attrs["sizes"]
    if sum(sizes) != ins[0][axis]:
        raise ValueError(f"sizes {sizes} do not add up to dimension {ins[0][axis]}")
    return [ins[0][:axis] + (s,) + ins[0][axis + 1:] for s in sizes]


def slice_(n: OpNode, ins: list[Shape]) -> list[Shape]:
    starts, ends, steps = n.attrs["starts"], n.attrs["ends"], n.attrs["steps"]
    if not len(starts) == len(ends) == len(steps) == len(ins[0]):
        raise ValueError("starts / ends / steps must have one entry per input axis")
    return [tuple(len(range(s, e, st)) for s, e, st in zip(starts, ends, steps))]


def gather(n: OpNode, ins: list[Shape]) -> list[Shape]:
    axis = n.attrs["axis"]
    return [ins[0][:axis] + ins[1] + ins[0][axis + 1:]]


def pad(n: OpNode, ins: list[Shape]) -> list[Shape]:
    pads, rank = n.attrs["pads"], len(ins[0])
    return [tuple(d + pads[i] + pads[rank + i] for i, d in enumerate(ins[0]))]


def expand(n: OpNode, ins: list[Shape]) -> list[Shape]:
    return [tuple(np.broadcast_shapes(ins[0], tuple(n.attrs["shape"])))]


def resize(n: OpNode, ins: list[Shape]) -> list[Shape]:
    return [tuple(d * r for d, r in zip(ins[0], n.attrs["repeats"], strict=True))]


def resample(n: OpNode, ins: list[Shape]) -> list[Shape]:
    return [tuple(len(n.attrs["taps"]) if a == n.attrs["axis"] else d for a, d in enumerate(ins[0]))]
