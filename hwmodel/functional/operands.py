"""TIU operand access: read an operand (tensor or 32-bit constant) as fp32 values, integers or
raw bits, and write a result rounded to its precision."""

from __future__ import annotations

import numpy as np

from tpuflow.isa.base import LocalTensor, Prec

from tpuflow.hwmodel.functional.floats import Round, bits_of, const_value, encode, to_f32


def prec_of(instr, prefix: str) -> Prec:
    return Prec(getattr(instr, f"opt_{prefix}_prec"))


def tensor_of(m, instr, prefix: str, shape) -> LocalTensor:
    return instr.local(prefix, shape, m.chip)


def raw(m, instr, prefix: str, shape) -> np.ndarray:
    """Stored values of tensor operand `prefix` with `shape` (storage dtype)."""
    return m.lmem.read(tensor_of(m, instr, prefix, shape))


def is_float_domain(instr, prefixes) -> bool:
    """Arithmetic is done in fp32 when any of the named operands has a float precision."""
    return any(prec_of(instr, p).is_float for p in prefixes)


def value(m, instr, prefix: str, shape, as_float: bool, prec: Prec | None = None):
    """Operand `prefix` as float32 values (as_float) or int64 values; constants are scalars.
    `prec` overrides the operand's precision field (CmpTiu's opd3 uses opd2's)."""
    prec = prec_of(instr, prefix) if prec is None else prec
    if instr.is_const(prefix):
        v = const_value(getattr(instr, f"{prefix}_addr"), prec)
        return np.float32(v) if as_float else np.int64(v)
    stored = raw(m, instr, prefix, shape)
    return convert(stored, prec, as_float)


def convert(stored: np.ndarray, prec: Prec, as_float: bool) -> np.ndarray:
    if as_float:
        return to_f32(stored, prec)
    if prec.is_float:
        return np.trunc(to_f32(stored, prec)).astype(np.int64)
    return stored.astype(np.int64)


def bits(m, instr, prefix: str, shape) -> np.ndarray:
    """Operand bits as int64 (integers sign-extended; a constant is its 32-bit field)."""
    if instr.is_const(prefix):
        field = getattr(instr, f"{prefix}_addr") & 0xFFFFFFFF
        if not prec_of(instr, prefix).is_float and field & 0x80000000:
            field -= 1 << 32
        return np.int64(field)
    return bits_of(raw(m, instr, prefix, shape))


def write(m, instr, prefix: str, shape, values, mode: Round = Round.RNE, saturate: bool = False,
          tensor: LocalTensor | None = None) -> None:
    """Round `values` to operand `prefix`'s precision and store them (broadcast to `shape`)."""
    tensor = tensor_of(m, instr, prefix, shape) if tensor is None else tensor
    stored = encode(np.broadcast_to(values, tuple(shape)), tensor.prec, mode, saturate)
    m.lmem.write(tensor, stored)


def write_raw(m, instr, prefix: str, shape, stored: np.ndarray) -> None:
    m.lmem.write(tensor_of(m, instr, prefix, shape), np.broadcast_to(stored, tuple(shape)))
