"""Tensor handles the emitters work with: LMEM tiles (LTile) and strided DDR regions (DRegion)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tpuflow.chip import ChipConfig
from tpuflow.isa import Prec, StrideMode, aligned_strides


# DDR / LMEM precision of a quantized tensor's storage (frontend.quant.STORAGES): uint8 is stored like
# int8 and read unsigned by the instructions' sign flags
QUANT_STORAGE_PRECS = {"int8": Prec.INT8, "uint8": Prec.INT8, "int32": Prec.INT32}


def storage_prec(info, float_prec: Prec) -> Prec:
    """The precision a tensor (a frontend TensorInfo, or None) is stored in: its integer storage when
    it is quantized, the program's float precision (`float_prec`, --dtype) otherwise."""
    quant = getattr(info, "quant", None)
    return QUANT_STORAGE_PRECS[quant.storage] if quant is not None else float_prec


@dataclass(frozen=True)
class LTile:
    """An (N, C, H, W) tensor in LMEM. `addr` is flat (lane * lmem_bytes_per_lane + offset);
    `strides` are element strides (n, channel-group, h, w); `mode` is the TIU stride mode the
    strides correspond to (FREE when they are not the aligned/compact defaults)."""

    addr: int
    shape: tuple[int, int, int, int]
    prec: Prec
    strides: tuple[int, int, int, int]
    mode: StrideMode = StrideMode.ALIGNED

    @property
    def n(self) -> int:
        return self.shape[0]

    @property
    def c(self) -> int:
        return self.shape[1]

    @property
    def h(self) -> int:
        return self.shape[2]

    @property
    def w(self) -> int:
        return self.shape[3]

    def fields(self, prefix: str, with_shape: bool = False) -> dict:
        """Descriptor fields of this tile as TIU operand `prefix` (res0, opd0, ...)."""
        out = {f"{prefix}_addr": self.addr, f"opt_{prefix}_prec": int(self.prec),
               f"short_{prefix}_str": int(self.mode)}
        if self.mode == StrideMode.FREE:
            for d, s in zip("nchw", self.strides):
                out[f"{prefix}_{d}_str"] = s
        if with_shape:
            for d, s in zip("nchw", self.shape):
                out[f"{prefix}_{d}"] = s
        return out

    def with_shape(self, shape, chip: ChipConfig) -> "LTile":
        """The same buffer viewed with another shape: keeps the strides as FREE strides."""
        return LTile(self.addr, tuple(shape), self.prec, self.strides, StrideMode.FREE)

    def broadcast(self, shape, n: bool = False, c: bool = False, h: bool = False, w: bool = False) -> "LTile":
        """A view of this tile broadcast to `shape` (stride 0 along the flagged dims)."""
        st = list(self.strides)
        for i, flag in enumerate((n, c, h, w)):
            if flag:
                st[i] = 0
        return LTile(self.addr, tuple(shape), self.prec, tuple(st), StrideMode.FREE)

    def sub_channels(self, c0: int, count: int, chip: ChipConfig) -> "LTile":
        """Channels [c0, c0+count) of this tile (they start on another lane)."""
        lanes, lb = chip.lanes, chip.lmem_bytes_per_lane
        start = (self.addr // lb) % lanes
        g, lane = divmod(start + c0, lanes)
        off = self.addr % lb + g * self.strides[1] * self.prec.bytes
        mode = StrideMode.FREE
        return LTile(lane * lb + off, (self.n, count, self.h, self.w), self.prec, self.strides, mode)

    def as_prec(self, prec: Prec) -> "LTile":
        return replace(self, prec=prec)


def eu_elements(chip: ChipConfig, prec: Prec) -> int:
    """Elements of `prec` per EU vector of a lane (the aligned layout's unit; int32 included)."""
    return chip.core.eu_bytes_per_lane // prec.bytes


def make_tile(chip: ChipConfig, addr: int, shape, prec: Prec, compact: bool = False) -> LTile:
    """A tile with the hardware's aligned (or compact) layout at `addr`."""
    start = (addr // chip.lmem_bytes_per_lane) % chip.lanes
    strides = aligned_strides(tuple(shape), eu_elements(chip, prec), chip.lanes, start, compact)
    return LTile(addr, tuple(shape), prec, strides, StrideMode.COMPACT if compact else StrideMode.ALIGNED)


def tile_bytes_per_lane(chip: ChipConfig, shape, prec: Prec, compact: bool = False) -> int:
    """Per-lane bytes an aligned/compact tile of `shape` starting on lane 0 occupies."""
    n, c, h, w = shape
    strides = aligned_strides(tuple(shape), eu_elements(chip, prec), chip.lanes, 0, compact)
    groups = -(-c // chip.lanes)
    span = (n - 1) * strides[0] + (groups - 1) * strides[1] + (h - 1) * strides[2] + w
    return span * prec.bytes


@dataclass(frozen=True)
class DRegion:
    """A strided (N, C, H, W) view of DDR bytes: element (n,c,h,w) at addr + (n*ns + c*cs + h*hs +
    w*ws) * bytes."""

    addr: int
    shape: tuple[int, int, int, int]
    strides: tuple[int, int, int, int]
    prec: Prec

    @property
    def count(self) -> int:
        return math.prod(self.shape)
