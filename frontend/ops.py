"""The canonical operator vocabulary: a closed OpKind enum, trait sets and per-kind attributes.

After the frontend every OpNode.op_type is an OpKind value, so legality checks in later stages
are set membership (`node.op_type in POOL`), never string compares. Attribute conventions of the
canonical form (what the lowering receives):

- Conv: inputs (X, W, B?) with W and B constant; attrs kernel_shape (kh, kw), strides, dilations,
  group, pads (top, left, bottom, right). 2-D only (NCHW).
- MatMul: numpy matmul semantics (batched, broadcast); Gemm arrives as MatMul (+ Add of a bias).
- Reshape: attrs shape (static tuple) and view=True (row-major, no data movement). Flatten,
  Squeeze and Unsqueeze arrive as Reshape.
- Softmax / LogSoftmax: axis, always the input's last axis (other axes are swapped last by a
  Transpose, or viewed as last when every later axis has size 1).
- Clip: min / max floats (-inf / +inf when absent). LeakyRelu alpha; HardSigmoid alpha, beta.
- Cast: to (numpy dtype name). Same-type casts never appear.
- ReduceMean / ReduceSum / ReduceMax: axes (sorted, non-negative tuple), keepdims (bool); the axes
  are the input's trailing ones (others are moved last by a Transpose and flattened).
- Transpose perm; Concat axis; Split axis + sizes; Slice starts / ends / steps, one entry per
  axis of the input, clamped into [0, dim], steps positive; Gather axis, indices a constant
  with non-negative values or a runtime tensor (negative values count from the end); Pad pads
  (begin of every axis, then end of every axis, non-negative) and value (float), constant mode
  unless `mode` says otherwise (see below). Expand shape: the
  output shape (numpy broadcast of the input to it; a stride-0 copy).
- MaxPool / AveragePool: kernel_shape, strides, dilations, pads (t, l, b, r), and for
  AveragePool count_include_pad. ceil_mode is resolved into the output tensor's shape: output
  positions come from that shape, and windows are clipped to the padded input (so the divisor of
  a clipped average window counts only the elements inside input + explicit pads, or only real
  elements when count_include_pad is false).
- GlobalAveragePool (NCHW -> NC11); LRN size, alpha, beta, bias; LayerNormalization axis
  (non-negative), epsilon, constant scale (and bias when present).
- Pow: (X, exponent); the exponent is usually a constant scalar.
- Comparisons (Equal, Less, Greater, LessOrEqual, GreaterOrEqual) and logic (Not, And, Or, Xor)
  broadcast like Add; their bool results are 0/1 values of the activation dtype. Where's
  condition may be a runtime tensor (nonzero = true). Max / Min are binary (variadic forms are
  chained). Mod fmod (0: sign of the divisor, 1: C fmod); ThresholdedRelu alpha.
- Resize: nearest-neighbour upsampling by integer `repeats` (one per axis, >1 only on the last
  two); every other Resize / Upsample arrives as strided Slices or MatMuls with constant
  interpolation matrices. Pad may carry mode "reflect" or "edge" (default constant).
- Resample (one of the last two axes): taps, per output index (i0, w0, i1, w1): y[.., o, ..] =
  w0 * x[.., i0, ..] + w1 * x[.., i1, ..] along `axis` (linear Resize, one node per axis).
- ScatterND (data, updates): rows = the constant linear row indices (non-negative) of data viewed
  as (rows, row elements); update i overwrites row rows[i], in order (the last write wins).
"""

from __future__ import annotations

from enum import Enum


class OpKind(str, Enum):
    """Every operator kind a canonical Graph may contain. Values are the OpNode.op_type strings."""

    __hash__ = str.__hash__          # so OpKind.X and "X" are the same set member

    CONV = "Conv"
    MATMUL = "MatMul"
    ADD = "Add"
    SUB = "Sub"
    MUL = "Mul"
    DIV = "Div"
    POW = "Pow"
    SQRT = "Sqrt"
    RECIPROCAL = "Reciprocal"
    NEG = "Neg"
    ABS = "Abs"
    EXP = "Exp"
    LOG = "Log"
    ERF = "Erf"
    TANH = "Tanh"
    SIGMOID = "Sigmoid"
    RELU = "Relu"
    LEAKY_RELU = "LeakyRelu"
    CLIP = "Clip"
    HARD_SIGMOID = "HardSigmoid"
    HARD_SWISH = "HardSwish"
    CAST = "Cast"
    WHERE = "Where"
    SOFTMAX = "Softmax"
    LOG_SOFTMAX = "LogSoftmax"
    LAYER_NORM = "LayerNormalization"
    LRN = "LRN"
    REDUCE_MEAN = "ReduceMean"
    REDUCE_SUM = "ReduceSum"
    REDUCE_MAX = "ReduceMax"
    MAX_POOL = "MaxPool"
    AVERAGE_POOL = "AveragePool"
    GLOBAL_AVERAGE_POOL = "GlobalAveragePool"
    RESHAPE = "Reshape"
    TRANSPOSE = "Transpose"
    CONCAT = "Concat"
    SPLIT = "Split"
    SLICE = "Slice"
    GATHER = "Gather"
    PAD = "Pad"
    EXPAND = "Expand"
    EQUAL = "Equal"
    LESS = "Less"
    GREATER = "Greater"
    LESS_OR_EQUAL = "LessOrEqual"
    GREATER_OR_EQUAL = "GreaterOrEqual"
    NOT = "Not"
    AND = "And"
    OR = "Or"
    XOR = "Xor"
    MAX = "Max"
    MIN = "Min"
    MOD = "Mod"
    FLOOR = "Floor"
    CEIL = "Ceil"
    ROUND = "Round"
    SIGN = "Sign"
    SIN = "Sin"
    COS = "Cos"
    THRESHOLDED_RELU = "ThresholdedRelu"
    RESIZE = "Resize"
    SCATTER_ND = "ScatterND"
    RESAMPLE = "Resample"

    def __str__(self) -> str:
        return self.value


K = OpKind

# Elementwise kinds with their own TIU kernels (lowering/ewise.py, mathops.py).
COMPARE = frozenset({K.EQUAL, K.LESS, K.GREATER, K.LESS_OR_EQUAL, K.GREATER_OR_EQUAL})
LOGIC = frozenset({K.AND, K.OR, K.XOR})
KERNEL_UNARY = frozenset({K.NOT, K.FLOOR, K.CEIL, K.ROUND, K.SIGN, K.SIN, K.COS, K.THRESHOLDED_RELU})
KERNEL_BINARY = COMPARE | LOGIC | {K.MAX, K.MIN, K.MOD}
UNARY = frozenset({K.SQRT, K.RECIPROCAL, K.NEG, K.ABS, K.EXP, K.LOG, K.ERF, K.TANH, K.SIGMOID,
                   K.RELU, K.LEAKY_RELU, K.CLIP, K.HARD_SIGMOID, K.HARD_SWISH, K.CAST}) | KERNEL_UNARY
BINARY = frozenset({K.ADD, K.SUB, K.MUL, K.DIV, K.POW}) | KERNEL_BINARY
ELEMENTWISE = UNARY | BINARY | {K.WHERE}
CONTRACTION = frozenset({K.CONV, K.MATMUL})            # the ops that count MACs
REDUCE = frozenset({K.REDUCE_MEAN, K.REDUCE_SUM, K.REDUCE_MAX})
POOL = frozenset({K.MAX_POOL, K.AVERAGE_POOL, K.GLOBAL_AVERAGE_POOL})
NORMALIZE = frozenset({K.SOFTMAX, K.LOG_SOFTMAX, K.LAYER_NORM, K.LRN})
VIEW = frozenset({K.RESHAPE})                          # no data movement
MOVEMENT = frozenset({K.TRANSPOSE, K.CONCAT, K.SPLIT, K.SLICE, K.GATHER, K.PAD, K.EXPAND})
ALL = frozenset(OpKind)

# Attributes every node of a kind carries after the frontend (the verifier checks them).
REQUIRED_ATTRS: dict[OpKind, tuple[str, ...]] = {
    K.CONV: ("kernel_shape", "strides", "dilations", "group", "pads"),
    K.RESHAPE: ("shape", "view"),
    K.SOFTMAX: ("axis",), K.LOG_SOFTMAX: ("axis",),
    K.CLIP: ("min", "max"), K.LEAKY_RELU: ("alpha",), K.HARD_SIGMOID: ("alpha", "beta"),
    K.CAST: ("to",),
    K.REDUCE_MEAN: ("axes", "keepdims"), K.REDUCE_SUM: ("axes", "keepdims"),
    K.REDUCE_MAX: ("axes", "keepdims"),
    K.TRANSPOSE: ("perm",), K.CONCAT: ("axis",), K.SPLIT: ("axis", "sizes"),
    K.SLICE: ("starts", "ends", "steps"), K.GATHER: ("axis",), K.PAD: ("pads", "value"), K.EXPAND: ("shape",),
    K.MAX_POOL: ("kernel_shape", "strides", "dilations", "pads"),
    K.AVERAGE_POOL: ("kernel_shape", "strides", "dilations", "pads", "count_include_pad"),
    K.LRN: ("size", "alpha", "beta", "bias"),
    K.LAYER_NORM: ("axis", "epsilon"),
    K.MOD: ("fmod",), K.THRESHOLDED_RELU: ("alpha",), K.RESIZE: ("repeats",), K.SCATTER_ND: ("rows",),
    K.RESAMPLE: ("axis", "taps"),
}

# Inputs (by position) that must be constant after the frontend.
CONST_INPUTS: dict[OpKind, tuple[int, ...]] = {
    K.CONV: (1, 2), K.LAYER_NORM: (1, 2),
}
