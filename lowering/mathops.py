"""Elementwise functions as TIU instruction sequences on LMEM tiles (exp, log, erf, sigmoid, ...),
and the SFU coefficient tables they read (kept at the start of every lane)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tpuflow.errors import LoweringError
from tpuflow.isa import Prec
from tpuflow.lowering.emitter import Emitter
from tpuflow.lowering.tensors import LTile

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

# SFU taylor tables (fp32, coefficient k multiplies x**k), at fixed per-lane offsets.
EXP2_COEFFS = [LN2 ** k / math.factorial(k) for k in range(11)]          # 2**f on [0, 1)
ERF_P = 0.3275911                                                          # Abramowitz-Stegun 7.1.26
ERF_COEFFS = [0.0, 0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429]
LOG_COEFFS = [2.0 / (2 * k + 1) for k in range(10)]                        # 2*atanh(z)/z in z**2
SIN_COEFFS = [(-1) ** k / math.factorial(2 * k + 1) for k in range(9)]      # sin(r)/r in r**2, |r| <= pi
COS_COEFFS = [(-1) ** k / math.factorial(2 * k) for k in range(10)]          # cos(r) in r**2
TWO_PI_HI, TWO_PI_LO = 6.28125, 2 * math.pi - 6.28125    # 2*pi in two parts: k * HI is exact for |k| < 2**16
EXACT_INT = float(2 ** 23)      # |x| >= 2**23: every fp32 value is an integer already


@dataclass(frozen=True)
class Table:
    offset: int
    coeffs: tuple[float, ...]


TABLES = {"exp2": Table(0, tuple(EXP2_COEFFS)), "erf": Table(64, tuple(ERF_COEFFS)),
          "log": Table(128, tuple(LOG_COEFFS)), "sin": Table(168, tuple(SIN_COEFFS)),
          "cos": Table(204, tuple(COS_COEFFS))}
CONST_REGION_BYTES = 256   # per lane, at offset 0 of every lane


def const_region_image() -> np.ndarray:
    """The fp32 words of the per-lane constant region (loaded into every lane at program start)."""
    words = np.zeros(CONST_REGION_BYTES // 4, np.float32)
    for t in TABLES.values():
        words[t.offset // 4: t.offset // 4 + len(t.coeffs)] = t.coeffs
    return words


class Scratch:
    """Temporary tiles (fp32, the shape of the work tile) a function may clobber."""

    def __init__(self, tiles: list[LTile]):
        self.tiles = tiles

    def get(self, i: int, prec: Prec = Prec.FP32) -> LTile:
        if i >= len(self.tiles):
            raise LoweringError(f"internal: elementwise function needs {i + 1} scratch tiles")
        return self.tiles[i].as_prec(prec)


def emit_exp(em: Emitter, dst: LTile, src: LTile, s: Scratch) -> None:
    """exp(x) = 2**n * 2**f with t = x*log2(e) clamped to [-126, 126], n = floor(t), f = t - n;
    2**f by a degree-10 Taylor series, 2**n by building the float's exponent bits."""
    t, n_int, p = s.get(0), s.get(1, Prec.INT32), s.get(2)
    em.ar("mul", t, src, LOG2E)
    em.ar("max", t, t, -126.0)
    em.ar("min", t, t, 126.0)
    em.ar("cast", n_int, t, round_mode=3)              # floor
    em.ar("cast", p, n_int)
    em.ar("sub", t, t, p)                              # f in [0, 1)
    em.sfu("taylor_4x", p, t, TABLES["exp2"].offset, len(EXP2_COEFFS))
    em.ar("add", n_int, n_int, 127)
    em.ar("logic_shift", n_int, n_int, 23)
    em.ar("mul", dst, p, n_int.as_prec(Prec.FP32))


def emit_sigmoid(em: Emitter, dst: LTile, src: LTile, s: Scratch) -> None:
    e = s.get(3)
    em.ar("mul", e, src, -1.0)
    emit_exp(em, e, e, s)
    em.ar("add", e, e, 1.0)
    em.ar("div", dst, 1.0, e)


def emit_tanh(em: Emitter, dst: LTile, src: LTile, s: Scratch) -> None:
    """tanh(x) = 2 * sigmoid(2x) - 1."""
    x2 = s.get(4)
    em.ar("mul", x2, src, 2.0)
    emit_sigmoid(em, x2, x2, s)
    em.lin("mac", dst, x2, 2.0, -1.0)


def emit_erf(em: Emitter, dst: LTile, src: LTile, s: Scratch) -> None:
    """erf by Abramowitz-Stegun 7.1.26 (|error| <= 1.5e-7): 1 - poly(t) * exp(-x*x),
    t = 1 / (1 + p|x|), sign restored with a compare-select."""
    a, poly, e = s.get(3), s.get(4), s.get(5)
    em.ar("abs", a, src)
    em.lin("mac", poly, a, ERF_P, 1.0)
    em.ar("div", poly, 1.0, poly)
    em.sfu("taylor_4x", poly, poly, TABLES["erf"].offset, len(ERF_COEFFS))
    em.ar("mul", e, a, a)
    em.ar("mul", e, e, -1.0)
    emit_exp(em, e, e, s)
    em.ar("mul", e, poly, e)
    em.lin("mac", e, e, -1.0, 1.0)                     # r = 1 - poly * exp(-x^2)
    em.ar("mul", a, e, -1.0)
    em.cmp("sel_lt", dst, src, 0.0, a, e)


def emit_log(em: Emitter, dst: LTile, src: LTile, s: Scratch) -> None:
    """log(x) = e*ln2 + 2*atanh(z), x = m * 2**e, z = (m-1)/(m+1), atanh by a series in z**2."""
    m, e, z, q = s.get(0), s.get(1), s.get(2), s.get(3)
    emit_split_exponent(em, m, e, src)
    em.ar("sub", z, m, 1.0)
    em.ar("add", m, m, 1.0)
    em.ar("div", z, z, m)
    em.ar("mul", m, z, z)
    em.sfu("taylor_4x", q, m, TABLES["log"].offset, len(LOG_COEFFS))
    em.ar("mul", q, q, z)
    em.lin("mac", dst, e, LN2, q)


def emit_split_exponent(em: Emitter, m: LTile, e: LTile, src: LTile) -> None:
    """x = m * 2**e, 1 <= |m| < 2 (x's sign), for normal fp32 x, from its bits by integer arith: e = the
    exponent field - 127, m = the bits with exponent field 127 (sfu.normalize computes the same, but its
    second result has no place in the short sSFU that tpu-mlir 1.30.2 renders, and the long SFU has no
    converter there). Zero and subnormals read as 2**-127 * m (normalize: m = e = 0)."""
    if src.prec != Prec.FP32:
        em.ar("copy", m, src)
        src = m
    bits, e_int = src.as_prec(Prec.INT32), e.as_prec(Prec.INT32)
    em.ar("arith_shift", e_int, bits, -23)
    em.ar("and", e_int, e_int, 0xFF)
    em.ar("cast", e, e_int)
    em.ar("sub", e, e, 127.0)
    em.ar("and", m.as_prec(Prec.INT32), bits, -0x7F800001)    # 0x807FFFFF: sign and fraction
    em.ar("or", m.as_prec(Prec.INT32), m.as_prec(Prec.INT32), 0x3F800000)


def emit_sqrt(em: Emitter, dst: LTile, src: LTile, s: Scratch) -> None:
    """sqrt(x) = x * rsqrt(max(x, tiny)) (exact 0 at 0)."""
    r = s.get(0)
    em.ar("max", r, src, 1e-30)
    em.sfu("rsqrt", r, r)
    em.ar("mul", dst, src, r)


def emit_round(em: Emitter, dst: LTile, src: LTile, mode: int, s: Scratch) -> None:
    """Round to an integer value by the AR cast modes (0 half-even, 2 toward zero, 3 floor, 4 ceil)
    through int32; values with |x| >= 2**23 are integers already and pass through."""
    n_int, r, a = s.get(0, Prec.INT32), s.get(1), s.get(2)
    em.ar("cast", n_int, src, round_mode=mode)
    em.ar("cast", r, n_int)
    em.ar("abs", a, src)
    em.ar("copy", n_int.as_prec(Prec.FP32), src)        # src in r's layout (opd3 shares opd2's strides)
    em.cmp("sel_lt", dst, a, EXACT_INT, r, n_int.as_prec(Prec.FP32))


def emit_sign(em: Emitter, dst: LTile, src: LTile, s: Scratch) -> None:
    pos, neg = s.get(0), s.get(1)
    em.cmp("sel_gt", pos, src, 0.0, 1.0, 0.0)
    em.cmp("sel_lt", neg, src, 0.0, 1.0, 0.0)
    em.ar("sub", dst, pos, neg)


def emit_sin_cos(em: Emitter, dst: LTile, src: LTile, cosine: bool, s: Scratch) -> None:
    """r = x - k*2pi with k = round(x / 2pi) (2pi in two parts), then sin(r) = r * P(r*r) or
    cos(r) = Q(r*r) by SFU Taylor tables (|r| <= pi: truncation below 3e-8)."""
    t, k_int, r, r2 = s.get(0), s.get(1, Prec.INT32), s.get(2), s.get(3)
    em.ar("mul", t, src, 1.0 / (2 * math.pi))
    em.ar("cast", k_int, t, round_mode=0)
    em.ar("cast", t, k_int)
    em.lin("mac", r, t, -TWO_PI_HI, src)
    em.ar("mul", t, t, -TWO_PI_LO)                     # r += t * -LO (t is dead after)
    em.ar("add", r, r, t)
    em.ar("mul", r2, r, r)
    table = TABLES["cos" if cosine else "sin"]
    if cosine:
        em.sfu("taylor_4x", dst, r2, table.offset, len(table.coeffs))
        return
    em.sfu("taylor_4x", t, r2, table.offset, len(table.coeffs))
    em.ar("mul", dst, t, r)


def emit_mod(em: Emitter, dst: LTile, a, b, fmod: int, s: Scratch) -> None:
    """a - q*b with q = a/b rounded toward zero (fmod 1) or down (fmod 0, the divisor's sign)."""
    q, prod = s.get(3), s.get(3)
    em.ar("div", q, a, b)
    emit_round(em, q, q, 2 if fmod else 3, s)
    em.ar("mul", prod, q, b)
    em.ar("sub", dst, a, prod)


def emit_cast(em: Emitter, dst: LTile, src: LTile, target: str, s: Scratch) -> None:
    """Cast of values held in the activation dtype: to an integer type truncates toward zero,
    to bool gives x != 0 as 0/1, to a float type keeps the value."""
    kind = np.dtype(target).kind
    if kind == "b":
        em.cmp("sel_eq", dst, src, 0.0, 0.0, 1.0)
    elif kind in "iu" and dst.prec == Prec.FP32:     # through int32 in dst itself (no scratch;
        as_int = dst.as_prec(Prec.INT32)             # |x| >= 2**31 saturates)
        em.ar("cast", as_int, src, round_mode=2)
        em.ar("cast", dst, as_int)
    elif kind in "iu":
        emit_round(em, dst, src, 2, s)
    else:
        em.ar("copy", dst, src)


def emit_rsqrt(em: Emitter, dst: LTile, src: LTile, s: Scratch) -> None:
    em.sfu("rsqrt", dst, src)


def emit_pow_const(em: Emitter, dst: LTile, src: LTile, exponent: float, s: Scratch) -> None:
    if exponent == 1.0:
        em.ar("copy", dst, src)
    elif exponent == 0.5:
        emit_sqrt(em, dst, src, s)
    elif exponent == -0.5:
        emit_rsqrt(em, dst, src, s)
    elif exponent == -1.0:
        em.ar("div", dst, 1.0, src)
    elif exponent == 0.0:
        em.ar("mul", dst, src, 0.0)
        em.ar("add", dst, dst, 1.0)
    elif float(exponent).is_integer() and 2 <= exponent <= 4:
        acc = s.get(5)
        em.ar("mul", acc, src, src)
        for _ in range(int(exponent) - 2):
            em.ar("mul", acc, acc, src)
        em.ar("copy", dst, acc)
    else:                                              # x > 0: exp(p * log(x))
        lg = s.get(5)
        emit_log(em, lg, src, s)
        em.ar("mul", lg, lg, float(exponent))
        emit_exp(em, dst, lg, s)


def _leaky_relu(em: Emitter, dst: LTile, src: LTile, attrs, s: Scratch) -> None:
    t = s.get(0)
    em.ar("mul", t, src, float(attrs.get("alpha", 0.01)))
    em.ar("max" if float(attrs.get("alpha", 0.01)) <= 1 else "min", dst, src, t)


def _hard_swish(em: Emitter, dst: LTile, src: LTile, attrs, s: Scratch) -> None:
    t = s.get(0)
    _hard_sigmoid(em, t, src, 1.0 / 6.0, 0.5)
    em.ar("mul", dst, src, t)


def _plain(fn):
    """A rule from an emit_* function that takes no attributes."""
    return lambda em, dst, src, attrs, s: fn(em, dst, src, s)


def _rounding(mode: int):
    """A rule rounding by the AR cast round mode `mode`."""
    return lambda em, dst, src, attrs, s: emit_round(em, dst, src, mode, s)


# The unary emission rules an OpSpec.emit ("unary", name) may name: (em, dst, src, attrs, scratch).
UNARY_RULES = {
    "exp": _plain(emit_exp), "sigmoid": _plain(emit_sigmoid), "tanh": _plain(emit_tanh), "erf": _plain(emit_erf),
    "log": _plain(emit_log), "sqrt": _plain(emit_sqrt), "sign": _plain(emit_sign),
    "relu": lambda em, dst, src, attrs, s: em.ar("max", dst, src, 0.0),
    "neg": lambda em, dst, src, attrs, s: em.ar("mul", dst, src, -1.0),
    "abs": lambda em, dst, src, attrs, s: em.ar("abs", dst, src),
    "reciprocal": lambda em, dst, src, attrs, s: em.ar("div", dst, 1.0, src),
    "clip": lambda em, dst, src, attrs, s: _clip(em, dst, src, attrs.get("min", -math.inf),
                                                 attrs.get("max", math.inf)),
    "leaky_relu": _leaky_relu,
    "hard_sigmoid": lambda em, dst, src, attrs, s: _hard_sigmoid(em, dst, src, float(attrs.get("alpha", 0.2)),
                                                                 float(attrs.get("beta", 0.5))),
    "hard_swish": _hard_swish,
    "cast": lambda em, dst, src, attrs, s: emit_cast(em, dst, src, str(attrs.get("to", "float32")), s),
    "not": lambda em, dst, src, attrs, s: em.cmp("sel_eq", dst, src, 0.0, 1.0, 0.0),
    "round": _rounding(0), "floor": _rounding(3), "ceil": _rounding(4),
    "sin": lambda em, dst, src, attrs, s: emit_sin_cos(em, dst, src, False, s),
    "cos": lambda em, dst, src, attrs, s: emit_sin_cos(em, dst, src, True, s),
    "thresholded_relu": lambda em, dst, src, attrs, s: em.cmp("sel_gt", dst, src, float(attrs.get("alpha", 1.0)),
                                                              src, 0.0),
}
SCRATCH_TILES = 6         # the most any rule asks for (OpSpec.scratch is at most this)


def emit_unary(em: Emitter, rule: str, attrs, dst: LTile, src: LTile, s: Scratch) -> None:
    """The unary rule `rule` (an OpSpec.emit name) from src into dst (dst may alias src)."""
    if rule not in UNARY_RULES:
        raise LoweringError(f"internal: no elementwise emitter for {rule}")
    UNARY_RULES[rule](em, dst, src, attrs, s)


def _clip(em: Emitter, dst: LTile, src: LTile, lo: float, hi: float) -> None:
    cur = src
    if lo > -math.inf:
        em.ar("max", dst, cur, float(lo))
        cur = dst
    if hi < math.inf:
        em.ar("min", dst, cur, float(hi))
        cur = dst
    if cur is src:
        em.ar("copy", dst, src)


def _hard_sigmoid(em: Emitter, dst: LTile, src: LTile, alpha: float, beta: float) -> None:
    em.lin("mac", dst, src, alpha, beta)
    em.ar("max", dst, dst, 0.0)
    em.ar("min", dst, dst, 1.0)
