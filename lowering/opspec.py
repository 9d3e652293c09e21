"""One lowering spec per op kind (keyed by the frontend's closed OpKind enum): the group an op
starts, how it computes in a row-wise view, the reduction it performs and the scratch tiles its
TIU sequence needs. Fusion (groups.py), the row-wise emitters (ewise.py) and their sizing key on it;
a test checks every OpKind has one."""

from __future__ import annotations

from dataclasses import dataclass

from tpuflow.frontend.ops import OpKind

K = OpKind


@dataclass(frozen=True)
class OpSpec:
    group: str                               # conv | matmul | pool | lrn | view | row | move
    row_role: str = ""                       # elementwise | reduce | normalize (row groups)
    scratch: int = 0                         # fp32 scratch tiles its TIU sequence clobbers (mathops)
    reduce: tuple[str, bool] | None = None   # reductions: (pord pooling op, divide by the count)


def _elementwise(scratch: int = 0) -> OpSpec:
    return OpSpec("row", "elementwise", scratch)


def _reduce(pool: str, mean: bool) -> OpSpec:
    return OpSpec("row", "reduce", 0, (pool, mean))


SPECS: dict[OpKind, OpSpec] = {
    K.CONV: OpSpec("conv"), K.MATMUL: OpSpec("matmul"), K.LRN: OpSpec("lrn"), K.RESHAPE: OpSpec("view"),
    K.MAX_POOL: OpSpec("pool"), K.AVERAGE_POOL: OpSpec("pool"),
    K.GLOBAL_AVERAGE_POOL: _reduce("avgpooling", True), K.REDUCE_MEAN: _reduce("avgpooling", True),
    K.REDUCE_SUM: _reduce("avgpooling", False), K.REDUCE_MAX: _reduce("maxpooling", False),
    K.SOFTMAX: OpSpec("row", "normalize", 4), K.LOG_SOFTMAX: OpSpec("row", "normalize", 4),
    K.LAYER_NORM: OpSpec("row", "normalize", 1),
    **{k: _elementwise() for k in (K.ADD, K.SUB, K.MUL, K.DIV, K.RECIPROCAL, K.NEG, K.ABS, K.RELU, K.CLIP,
                                  K.HARD_SIGMOID, K.CAST, K.EQUAL, K.LESS, K.GREATER, K.LESS_OR_EQUAL,
                                  K.GREATER_OR_EQUAL, K.NOT, K.AND, K.OR, K.XOR, K.MAX, K.MIN,
                                  K.THRESHOLDED_RELU)},
    K.POW: _elementwise(6), K.SQRT: _elementwise(1), K.EXP: _elementwise(3), K.LOG: _elementwise(4),
    K.ERF: _elementwise(6), K.TANH: _elementwise(5), K.SIGMOID: _elementwise(4), K.LEAKY_RELU: _elementwise(1),
    K.HARD_SWISH: _elementwise(1), K.WHERE: _elementwise(2), K.MOD: _elementwise(4), K.FLOOR: _elementwise(3),
    K.CEIL: _elementwise(3), K.ROUND: _elementwise(3), K.SIGN: _elementwise(2), K.SIN: _elementwise(4),
    K.COS: _elementwise(4),
    **{k: OpSpec("move") for k in (K.TRANSPOSE, K.CONCAT, K.SPLIT, K.SLICE, K.GATHER, K.PAD, K.EXPAND,
                                  K.RESIZE, K.SCATTER_ND, K.RESAMPLE)},
}


def spec(op_type: str) -> OpSpec:
    """The spec of a canonical op type (every OpKind has one)."""
    return SPECS[OpKind(op_type)]


def kinds_with(role: str) -> frozenset[str]:
    return frozenset(k.value for k, s in SPECS.items() if s.row_role == role)
