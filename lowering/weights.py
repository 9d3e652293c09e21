"""The DDR weight image: constants in the layout each emitter wants, deduplicated, 64 B aligned."""

from __future__ import annotations

import numpy as np

from tpuflow.isa import Prec

WEIGHT_ALIGN = 64


def to_storage(array: np.ndarray, prec: Prec) -> np.ndarray:
    """Values as the bits stored in DDR for `prec` (bf16: round-to-nearest-even uint16)."""
    a = np.asarray(array)
    if prec == Prec.FP32:
        return a.astype(np.float32)
    if prec == Prec.FP16:
        return a.astype(np.float16)
    if prec == Prec.BF16:
        bits = a.astype(np.float32).view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return rounded.astype(np.uint16)
    if prec == Prec.INT32:
        return a.astype(np.int32)
    if prec == Prec.INT8:
        return a.astype(np.int8)
    raise ValueError(f"no storage for {prec}")


def pack_conv_weights(weights: np.ndarray, ic_block: int) -> np.ndarray:
    """(OC, IC, KH, KW) conv weights -> (OC, ceil(IC / B) * B * KH * KW) rows in ConvTiu's
    weight layout for weight_ic_block B: per output channel [ic // B][kh][kw][ic % B], the padding
    channels zero (B = 1: the plain [ic][kh][kw] order)."""
    oc, ic, kh, kw = weights.shape
    blocks = -(-ic // ic_block)
    padded = np.zeros((oc, blocks * ic_block, kh, kw), dtype=weights.dtype)
    padded[:, :ic] = weights
    return padded.reshape(oc, blocks, ic_block, kh, kw).transpose(0, 1, 3, 4, 2).reshape(oc, -1)


class WeightImage:
    """Appends constant blobs; `base` is the DDR address the image is loaded at."""

    def __init__(self, base: int):
        self.base = base
        self.chunks: list[bytes] = []
        self.size = 0
        self.index: dict[tuple, int] = {}

    def add(self, key: tuple, array: np.ndarray, prec: Prec) -> int:
        """DDR address of `array` stored as `prec` (row-major); the same key returns the same blob."""
        full_key = key + (int(prec),)
        if full_key in self.index:
            return self.index[full_key]
        data = np.ascontiguousarray(to_storage(array, prec)).tobytes()
        pad = (-self.size) % WEIGHT_ALIGN
        if pad:
            self.chunks.append(b"\0" * pad)
            self.size += pad
        addr = self.base + self.size
        self.chunks.append(data)
        self.size += len(data)
        self.index[full_key] = addr
        return addr

    def lookup(self, key: tuple, prec: Prec) -> int | None:
        """Address of a blob added before under `key`, or None."""
        return self.index.get(key + (int(prec),))

    def image(self) -> bytes:
        return b"".join(self.chunks)
