"""Element offsets of the tile layouts (lingxi.md): Nz (A, C), Zn (B), the ACC's Nz fp32 fractals,
and row/column-major ND/DN; each returns the offset of every (i, j) of a rows x cols matrix."""

from __future__ import annotations

import numpy as np


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _ij(rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    return np.arange(rows, dtype=np.int64)[:, None], np.arange(cols, dtype=np.int64)[None, :]


def nz_offsets(rows: int, cols: int, rows_pad: int, c0: int) -> np.ndarray:
    """Nz: off(i, j) = (j // c0) * rows_pad * c0 + i * c0 + j % c0."""
    i, j = _ij(rows, cols)
    return (j // c0) * rows_pad * c0 + i * c0 + j % c0


def zn_offsets(rows: int, cols: int, cols_pad: int, r0: int) -> np.ndarray:
    """Zn: off(i, j) = (i // r0) * cols_pad * r0 + j * r0 + i % r0."""
    i, j = _ij(rows, cols)
    return (i // r0) * cols_pad * r0 + j * r0 + i % r0


def nd_offsets(rows: int, cols: int) -> np.ndarray:
    """Row-major: off(i, j) = i * cols + j."""
    i, j = _ij(rows, cols)
    return i * cols + j


def dn_offsets(rows: int, cols: int) -> np.ndarray:
    """Column-major: off(i, j) = j * rows + i."""
    i, j = _ij(rows, cols)
    return j * rows + i


def nz_elements(rows: int, cols: int, fractal_rows: int, c0: int) -> int:
    """Elements of an Nz image padded to whole fractals (rows to fractal_rows, cols to c0)."""
    return round_up(rows, fractal_rows) * round_up(cols, c0)


def zn_elements(rows: int, cols: int, r0: int, fractal_cols: int) -> int:
    return round_up(rows, r0) * round_up(cols, fractal_cols)
