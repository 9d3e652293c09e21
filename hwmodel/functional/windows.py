"""Sliding windows shared by convolution and pooling: padding and strided tap views."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import as_strided


@dataclass(frozen=True)
class Window:
    """Kernel (kh, kw), output (oh, ow), strides (sy, sx), dilations (dy, dx), pads (up, left)."""

    kh: int
    kw: int
    oh: int
    ow: int
    sy: int
    sx: int
    dy: int
    dx: int
    up: int
    left: int

    @classmethod
    def of(cls, instr) -> "Window":
        """The window of a ConvTiu / PordTiu (kernel opd1_h x opd1_w, dilation ins0 + 1)."""
        return cls(instr.opd1_h, instr.opd1_w, instr.res0_h, instr.res0_w, instr.res_op_y_str,
                   instr.res_op_x_str, instr.opd1_y_ins0 + 1, instr.opd1_x_ins0 + 1,
                   instr.opd0_up_pad, instr.opd0_lf_pad)

    @property
    def padded_hw(self) -> tuple[int, int]:
        """Input extent the windows reach (rows, cols), padding included."""
        return ((self.oh - 1) * self.sy + (self.kh - 1) * self.dy + 1,
                (self.ow - 1) * self.sx + (self.kw - 1) * self.dx + 1)


def pad(x: np.ndarray, win: Window, fill: float) -> np.ndarray:
    """x (N, C, H, W) placed at (up, left) in a `fill` canvas of the extent the windows reach;
    input rows/cols beyond that extent are dropped, missing ones are padding."""
    n, c, h, w = x.shape
    hp, wp = win.padded_hw
    out = np.full((n, c, hp, wp), fill, dtype=x.dtype)
    rows, cols = max(0, min(h, hp - win.up)), max(0, min(w, wp - win.left))
    out[:, :, win.up:win.up + rows, win.left:win.left + cols] = x[:, :, :rows, :cols]
    return out


def windows(xp: np.ndarray, win: Window) -> np.ndarray:
    """Read-only view (N, C, KH, KW, OH, OW) of a padded input."""
    n, c = xp.shape[:2]
    s_n, s_c, s_h, s_w = xp.strides
    return as_strided(xp, (n, c, win.kh, win.kw, win.oh, win.ow),
                      (s_n, s_c, s_h * win.dy, s_w * win.dx, s_h * win.sy, s_w * win.sx), writeable=False)


def tap(xp: np.ndarray, win: Window, i: int, j: int) -> np.ndarray:
    """The (N, C, OH, OW) inputs that kernel tap (i, j) meets."""
    r0, c0 = i * win.dy, j * win.dx
    return xp[:, :, r0:r0 + (win.oh - 1) * win.sy + 1:win.sy, c0:c0 + (win.ow - 1) * win.sx + 1:win.sx]
