"""The canonical operator vocabulary: the closed OpKind enum and ONE spec per kind (SPECS) holding
every per-kind fact the frontend and the lowering key on: traits, required attributes, constant
inputs, shape function, export rule, lowering group, row role, reduction, scratch tiles, slicing
rule and elementwise emission rule. The trait sets (ELEMENTWISE, POOL, ...) are views computed
from SPECS.

After the frontend every OpNode.op_type is an OpKind value, so legality checks in later stages
are spec lookups or set membership (`node.op_type in POOL`), never string compares. Attribute
conventions of the canonical form (what the lowering receives):

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
- QuantizeLinear / DequantizeLinear (category "convert", no attributes): the float <-> integer
  boundaries of a quantized model; the parameters are the Quant of the integer side's TensorInfo
  (frontend/quant.py holds the whole quantized-graph contract: any op above may read and write
  quantized tensors, meaning dequantize -> op -> quantize). Their group is a placeholder: the
  pipeline stops quantized graphs before the lowering until the int8 lowering exists.
- LookupTable (x, table): y = table[x.view(uint8)], x and y 8-bit quantized per tensor, table a constant of
  256 of y's codes (input 1, with y's Quant): a function of x's codes that frontend/lookup.py collapsed
  from elementwise ops (no ONNX op of its own; exported as a Gather on the codes).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from tpuflow.frontend import shapes
from tpuflow.frontend.graph import OpNode
from tpuflow.frontend.shapes import Shape, ShapeFn


class OpKind(str, Enum):
    """Every operator kind a canonical Graph may contain. Values are the OpNode.op_type strings."""

    __hash__ = str.__hash__          # so OpKind.X and "X" are the same set member

    CONV = "Conv"
    CONV_TRANSPOSE = "ConvTranspose"
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
    QUANTIZE = "QuantizeLinear"
    DEQUANTIZE = "DequantizeLinear"
    LOOKUP_TABLE = "LookupTable"

    def __str__(self) -> str:
        return self.value


K = OpKind

# remap: outputs gathered from computed input positions by their own kernels (Resize, ScatterND, Resample)
# convert: float <-> quantized integer boundaries (QuantizeLinear, DequantizeLinear)
CATEGORIES = ("unary", "binary", "ternary", "contraction", "reduce", "pool", "normalize", "view", "movement",
              "remap", "convert")
GROUPS = ("conv", "deconv", "matmul", "pool", "lrn", "view", "row", "move")
ROW_ROLES = ("", "elementwise", "reduce", "normalize")
SLICING = ("window", "rows", "none")
ROW_AXES = ("", "spatial", "axes", "last_axis", "axis")


@dataclass(frozen=True)
class Emit:
    """How the row emitters compute one node of a kind; lowering/ewise.py resolves `rule`:
    ar (one AR instruction `op`), select (compare-select `op`: `yes` when the compare holds, else
    `no`), unary (the mathops sequence named `op`), pow, mod, where, softmax, log_softmax, layer_norm."""

    rule: str
    op: str = ""
    yes: float = 1.0
    no: float = 0.0
    commutative: bool = False      # ar: a scalar first operand may move second


@dataclass(frozen=True)
class OpSpec:
    """Every fact about one op kind that the frontend or the lowering decides by."""

    # frontend
    category: str                  # one of CATEGORIES; the trait sets below are views of it
    shape: ShapeFn                 # output shapes from input shapes + attrs (frontend/shapes.py)
    group: str                     # lowering: the group a node starts, naming its group emitter (GROUPS)
    attrs: tuple[str, ...] = ()    # attributes every node carries after the frontend
    const_inputs: tuple[int, ...] = ()   # input positions that must be constant
    kernel: bool = False           # elementwise with its own TIU kernel sequence
    compare: bool = False          # a comparison (0/1 result)
    logic: bool = False            # a binary logic op on 0/1 values
    ceil_mode: bool = False        # the output may also have the ceil-mode window count
    import_same: bool = False      # imported 1:1 from the ONNX op of the same name, no attributes
    export_same: bool = False      # exported as the ONNX op of the same name with `attrs`
    # lowering
    row_role: str = ""             # in a row group: elementwise | reduce | normalize
    reduce: tuple[str, bool] | None = None   # reductions: (pord pooling op, divide by the count)
    row_axes: str = ""             # where a reduce / normalize cuts rows x cols: spatial (every axis after
                                   # C), axes (attr axes), last_axis (attr axis, must be last), axis (attr)
    scratch: int = 0               # fp32 scratch tiles its TIU sequence clobbers (mathops)
    slicing: str = "none"          # output rows -> input rows: window (conv / pool halos from kernel,
                                   # stride, pad, dilation), rows (row for row), none (not sliceable)
    emit: Emit | None = None       # row groups: how a node is computed


def _elementwise(category: str, emit: Emit, scratch: int = 0, **facts) -> OpSpec:
    shape = shapes.same if category == "unary" else shapes.broadcast
    return OpSpec(category, shape, "row", row_role="elementwise", scratch=scratch, slicing="rows", emit=emit,
                  **facts)


def _unary(rule: str, scratch: int = 0, **facts) -> OpSpec:
    return _elementwise("unary", Emit("unary", rule), scratch, **facts)


def _ar(op: str, commutative: bool = False, **facts) -> OpSpec:
    return _elementwise("binary", Emit("ar", op, commutative=commutative), export_same=True, **facts)


def _select(op: str, yes: float, no: float, **facts) -> OpSpec:
    return _elementwise("binary", Emit("select", op, yes, no), kernel=True, import_same=True, export_same=True,
                        **facts)


def _reduce(pool: str, mean: bool) -> OpSpec:
    return OpSpec("reduce", shapes.reduce, "row", attrs=("axes", "keepdims"), row_role="reduce",
                  reduce=(pool, mean), row_axes="axes")


def _softmax(rule: str) -> OpSpec:
    return OpSpec("normalize", shapes.same, "row", attrs=("axis",), export_same=True, row_role="normalize",
                  row_axes="last_axis", scratch=4, emit=Emit(rule))


def _move(shape: ShapeFn, attrs: tuple[str, ...], category: str = "movement", **facts) -> OpSpec:
    return OpSpec(category, shape, "move", attrs=attrs, **facts)


ONE_TO_ONE = dict(import_same=True, export_same=True)   # ONNX op of the same name
WINDOW = ("kernel_shape", "strides", "dilations", "pads")      # sliding-window attributes

SPECS: dict[OpKind, OpSpec] = {
    K.CONV: OpSpec("contraction", shapes.conv, "conv", attrs=WINDOW[:3] + ("group", "pads"), const_inputs=(1, 2),
                   export_same=True, slicing="window"),
    # kernel == stride only (every output pixel from one input pixel: a 1x1 Conv per kernel tap whose
    # results interleave), ONNX weights [C, O, kh, kw], group 1, no pads (the importer crops)
    K.CONV_TRANSPOSE: OpSpec("contraction", shapes.conv_transpose_blocks, "deconv", attrs=("kernel_shape", "strides"),
                             const_inputs=(1, 2), export_same=True),
    K.MATMUL: OpSpec("contraction", shapes.matmul, "matmul", export_same=True),
    K.ADD: _ar("add", True, import_same=True), K.SUB: _ar("sub", import_same=True),
    K.MUL: _ar("mul", True, import_same=True), K.DIV: _ar("div", import_same=True),
    K.POW: _elementwise("binary", Emit("pow"), 6, **ONE_TO_ONE),
    K.SQRT: _unary("sqrt", 1, **ONE_TO_ONE), K.RECIPROCAL: _unary("reciprocal", **ONE_TO_ONE),
    K.NEG: _unary("neg", **ONE_TO_ONE), K.ABS: _unary("abs", **ONE_TO_ONE), K.EXP: _unary("exp", 3, **ONE_TO_ONE),
    K.LOG: _unary("log", 4, **ONE_TO_ONE), K.ERF: _unary("erf", 6, **ONE_TO_ONE),
    K.TANH: _unary("tanh", 5, **ONE_TO_ONE), K.SIGMOID: _unary("sigmoid", 4, **ONE_TO_ONE),
    K.RELU: _unary("relu", **ONE_TO_ONE),
    K.LEAKY_RELU: _unary("leaky_relu", 1, attrs=("alpha",), export_same=True),
    K.CLIP: _unary("clip", attrs=("min", "max")),
    K.HARD_SIGMOID: _unary("hard_sigmoid", attrs=("alpha", "beta"), export_same=True),
    K.HARD_SWISH: _unary("hard_swish", 1, **ONE_TO_ONE),
    K.CAST: _unary("cast", attrs=("to",)),
    K.WHERE: _elementwise("ternary", Emit("where"), 2, export_same=True),
    K.SOFTMAX: _softmax("softmax"), K.LOG_SOFTMAX: _softmax("log_softmax"),
    K.LAYER_NORM: OpSpec("normalize", shapes.same, "row", attrs=("axis", "epsilon"), const_inputs=(1, 2),
                         export_same=True, row_role="normalize", row_axes="axis", scratch=1, emit=Emit("layer_norm")),
    K.LRN: OpSpec("normalize", shapes.same, "lrn", attrs=("size", "alpha", "beta", "bias"), export_same=True),
    K.REDUCE_MEAN: _reduce("avgpooling", True), K.REDUCE_SUM: _reduce("avgpooling", False),
    K.REDUCE_MAX: _reduce("maxpooling", False),
    K.MAX_POOL: OpSpec("pool", shapes.pool, "pool", attrs=WINDOW, ceil_mode=True, slicing="window"),
    K.AVERAGE_POOL: OpSpec("pool", shapes.pool, "pool", attrs=WINDOW + ("count_include_pad",), ceil_mode=True,
                           slicing="window"),
    K.GLOBAL_AVERAGE_POOL: OpSpec("pool", shapes.global_pool, "row", export_same=True, row_role="reduce",
                                  reduce=("avgpooling", True), row_axes="spatial"),
    K.RESHAPE: OpSpec("view", shapes.reshape, "view", attrs=("shape", "view")),
    K.TRANSPOSE: _move(shapes.transpose, ("perm",), export_same=True),
    K.CONCAT: _move(shapes.concat, ("axis",), export_same=True),
    K.SPLIT: _move(shapes.split, ("axis", "sizes")),
    K.SLICE: _move(shapes.slice_, ("starts", "ends", "steps")),
    K.GATHER: _move(shapes.gather, ("axis",), export_same=True),
    K.PAD: _move(shapes.pad, ("pads", "value")),
    K.EXPAND: _move(shapes.expand, ("shape",)),
    K.EQUAL: _select("sel_eq", 1.0, 0.0, compare=True), K.LESS: _select("sel_lt", 1.0, 0.0, compare=True),
    K.GREATER: _select("sel_gt", 1.0, 0.0, compare=True),
    K.LESS_OR_EQUAL: _select("sel_gt", 0.0, 1.0, compare=True),
    K.GREATER_OR_EQUAL: _select("sel_lt", 0.0, 1.0, compare=True),
    K.NOT: _unary("not", kernel=True, import_same=True),
    K.AND: _ar("mul", True, kernel=True, logic=True, import_same=True),       # of 0/1 values
    K.OR: _ar("max", True, kernel=True, logic=True, import_same=True),
    K.XOR: _select("sel_eq", 0.0, 1.0, logic=True),
    K.MAX: _ar("max", True, kernel=True), K.MIN: _ar("min", True, kernel=True),
    K.MOD: _elementwise("binary", Emit("mod"), 4, attrs=("fmod",), kernel=True, export_same=True),
    K.FLOOR: _unary("floor", 3, kernel=True, **ONE_TO_ONE), K.CEIL: _unary("ceil", 3, kernel=True, **ONE_TO_ONE),
    K.ROUND: _unary("round", 3, kernel=True, **ONE_TO_ONE), K.SIGN: _unary("sign", 2, kernel=True, **ONE_TO_ONE),
    K.SIN: _unary("sin", 4, kernel=True, **ONE_TO_ONE), K.COS: _unary("cos", 4, kernel=True, **ONE_TO_ONE),
    K.THRESHOLDED_RELU: _unary("thresholded_relu", attrs=("alpha",), kernel=True, export_same=True),
    K.RESIZE: _move(shapes.resize, ("repeats",), "remap"),
    K.SCATTER_ND: _move(shapes.same, ("rows",), "remap"),
    K.RESAMPLE: _move(shapes.resample, ("axis", "taps"), "remap"),
    K.QUANTIZE: _move(shapes.same, (), "convert"),
    K.DEQUANTIZE: _move(shapes.same, (), "convert"),
    # (x, table): y = table[x's stored byte], x and y 8-bit per tensor (frontend/lookup.py makes it): outputs
    # gathered from positions the input computes (remap); always quantized, so the int8 lowering emits it
    K.LOOKUP_TABLE: _move(shapes.same, (), "remap", const_inputs=(1,)),
}


def spec(op_type: str) -> OpSpec:
    """The spec of a canonical op type (an OpKind or its string; every OpKind has one)."""
    return SPECS[op_type]


def kinds(test) -> frozenset[OpKind]:
    """The kinds whose spec passes `test` (a view of SPECS)."""
    return frozenset(k for k, s in SPECS.items() if test(s))


def expected_shapes(node: OpNode, input_shapes: list[Shape]) -> list[list[Shape]]:
    """For each output, the shapes it may legally have (pools: floor or ceil mode)."""
    s = spec(node.op_type)
    if s.ceil_mode:
        return [shapes.pool_output_choices(node, input_shapes[0])]
    return [[shape] for shape in s.shape(node, input_shapes)]


# Trait sets: views of SPECS for callers that test membership.
COMPARE = kinds(lambda s: s.compare)
LOGIC = kinds(lambda s: s.logic)
UNARY = kinds(lambda s: s.category == "unary")
BINARY = kinds(lambda s: s.category == "binary")
KERNEL_UNARY = kinds(lambda s: s.kernel and s.category == "unary")
KERNEL_BINARY = kinds(lambda s: s.kernel and s.category == "binary")
ELEMENTWISE = kinds(lambda s: s.category in ("unary", "binary", "ternary"))
CONTRACTION = kinds(lambda s: s.category == "contraction")      # the ops that count MACs
REDUCE = kinds(lambda s: s.category == "reduce")
POOL = kinds(lambda s: s.category == "pool")
NORMALIZE = kinds(lambda s: s.category == "normalize")
VIEW = kinds(lambda s: s.category == "view")                     # no data movement
MOVEMENT = kinds(lambda s: s.category == "movement")
CONVERT = kinds(lambda s: s.category == "convert")              # quantized-model boundaries
ALL = frozenset(OpKind)

# Attributes every node of a kind carries after the frontend; inputs (by position) that must be constant.
REQUIRED_ATTRS: dict[OpKind, tuple[str, ...]] = {k: s.attrs for k, s in SPECS.items() if s.attrs}
CONST_INPUTS: dict[OpKind, tuple[int, ...]] = {k: s.const_inputs for k, s in SPECS.items() if s.const_inputs}
