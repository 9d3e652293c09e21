"""A conv chain whose activations do not fit a 64 KiB-per-lane chip whole, so layer groups slice it."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e"))
from onnx_build import ModelBuilder  # noqa: E402


def small_lmem_chip(folder: Path) -> str:
    path = folder / "small_lmem.toml"
    path.write_text('base = "sg2260"\n[core]\nlmem_bytes_per_lane = 65536\n')
    return str(path)


def pointwise_chain(layers: int = 5, channels: int = 64, height: int = 384, width: int = 32):
    """1x1 Conv + Relu `layers` times over a (1, channels, height, width) input."""
    b = ModelBuilder(seed=5)
    x = b.input("x", (1, channels, height, width))
    for i in range(layers):
        x = b.node("Conv", [x, b.weight(f"w{i}", (channels, channels, 1, 1)), b.weight(f"b{i}", (channels,))],
                   f"c{i}", kernel_shape=[1, 1], strides=[1, 1], pads=[0] * 4)
        x = b.node("Relu", [x], f"r{i}")
    b.output(x)
    return b.model()
