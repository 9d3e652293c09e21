"""Elementwise and row-wise ops: classify operands against a (rows, cols) view of the output and
emit one node's TIU instructions on LMEM tiles."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np

from tpuflow.errors import LoweringError
from tpuflow.frontend.graph import Graph, OpNode
from tpuflow.isa import Prec
from tpuflow.lowering import mathops
from tpuflow.lowering.emitter import Emitter, f32_bits, narrow_bits
from tpuflow.lowering.opspec import SPECS, Emit, kinds_with, spec
from tpuflow.lowering.tensors import LTile

# the row-wise traits are views of the one spec per op kind (frontend/ops.py SPECS)
ELEMENTWISE = kinds_with("elementwise")
ROW_REDUCE = {k.value: s.reduce for k, s in SPECS.items() if s.row_role == "reduce"}
ROW_NORMALIZE = kinds_with("normalize")
ROWWISE = ELEMENTWISE | set(ROW_REDUCE) | ROW_NORMALIZE
SCRATCH_NEED = {k.value: s.scratch for k, s in SPECS.items() if s.scratch}   # fp32 scratch tiles (mathops)


class Kind(enum.Enum):
    FULL = "full"      # same shape as the view: one value per (row, col)
    ROW = "row"        # one value per row, broadcast along the columns
    COL = "col"        # one value per column, the same for every row
    SCALAR = "scalar"  # a single value
    PERIODIC = "periodic"  # one value per (row mod period, col): repeats over leading row axes (a mask over heads)


@dataclass(frozen=True)
class RowView:
    """Output viewed as rows x cols: rows = prod(shape[:split]), cols = prod(shape[split:])."""

    rows: int
    cols: int


def view_of(shape: tuple[int, ...], split: int) -> RowView:
    return RowView(math.prod(shape[:split]), math.prod(shape[split:]))


def classify(shape: tuple[int, ...], out_shape: tuple[int, ...], split: int) -> Kind | None:
    """How a (broadcasting) operand of `shape` maps onto the view of `out_shape` cut at `split`."""
    rank = len(out_shape)
    if len(shape) > rank:
        return None
    s = (1,) * (rank - len(shape)) + tuple(shape)
    lead, tail = s[:split], s[split:]
    olead, otail = out_shape[:split], out_shape[split:]
    if s == tuple(out_shape):           # before SCALAR: a one-element output is computed, not constant
        return Kind.FULL
    if math.prod(s) == 1:
        return Kind.SCALAR
    if lead == olead and all(d == 1 for d in tail):
        return Kind.ROW
    if all(d == 1 for d in lead) and tail == otail:
        return Kind.COL
    if tail == otail and row_period(s, out_shape, split) is not None:
        return Kind.PERIODIC
    return None


def classify_flat(shape: tuple[int, ...], out_shape: tuple[int, ...]) -> Kind | None:
    """How an operand of `shape` maps onto a flat view of `out_shape` (its elements in any rows x
    cols): FULL when it is the output's shape (leading 1s aside), SCALAR when it has one element."""
    rank = len(out_shape)
    if len(shape) > rank:
        return None
    s = (1,) * (rank - len(shape)) + tuple(shape)
    if s == tuple(out_shape):
        return Kind.FULL
    return Kind.SCALAR if math.prod(s) == 1 else None


def row_period(shape: tuple[int, ...], out_shape: tuple[int, ...], split: int) -> int | None:
    """For an operand equal to the output on its trailing row axes and of size 1 on the leading
    ones (at least one of which the output repeats): the rows after which its values repeat."""
    s = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    lead, olead = s[:split], tuple(out_shape[:split])
    for j in range(1, split):
        if all(d == 1 for d in lead[:j]) and lead[j:] == olead[j:] and math.prod(olead[:j]) > 1:
            return math.prod(olead[j:])
    return None


def reads_whole_rows(op_type: str) -> bool:
    """Reductions and normalisations: their rows x cols view is of their input, not their output."""
    return spec(op_type).row_role in ("reduce", "normalize")


def node_split_candidates(graph: Graph, node: OpNode) -> list[int]:
    """Cut points of the output shape at which this node is row-wise, best first (reductions and
    normalisations: the one cut their spec's row_axes gives)."""
    out = graph.tensor(node.outputs[0]).shape
    ref = graph.tensor(node.inputs[0]).shape if reads_whole_rows(node.op_type) else out
    rank = len(ref)
    row_axes = spec(node.op_type).row_axes
    if row_axes in ("spatial", "axes"):
        axes = tuple(range(2, rank)) if row_axes == "spatial" else tuple(node.attr("axes", ()))
        if not axes or axes != tuple(range(axes[0], rank)):
            return []
        return [axes[0]]
    if row_axes == "last_axis":
        return [rank - 1] if node.attr("axis") == rank - 1 else []
    if row_axes == "axis":
        return [node.attr("axis", -1) % rank]
    prefer = [2] if rank == 4 else []
    return prefer + [p for p in range(rank - 1, -1, -1) if p not in prefer] + ([rank] if rank else [])


def node_fits(graph: Graph, node: OpNode, split: int) -> bool:
    """Every operand of `node` classifies at `split` (reductions: of their input's view)."""
    if reads_whole_rows(node.op_type):
        return split in node_split_candidates(graph, node) and all(
            classify(graph.tensor(t).shape, graph.tensor(node.inputs[0]).shape, split) is not None
            for t in node.inputs if t)
    out = graph.tensor(node.outputs[0]).shape
    return all(classify(graph.tensor(t).shape, out, split) is not None for t in node.inputs if t)


# ---------------------------------------------------------------- emission of one node

def apply_elementwise(em: Emitter, node: OpNode, dst: LTile, ins: list, scratch: mathops.Scratch) -> None:
    """TIU instructions of one elementwise node by its spec's emission rule; `ins` are LTiles
    already broadcast to dst's shape, or python floats for scalar constants."""
    rule = spec(node.op_type).emit
    if rule is None or rule.rule not in RULES:
        raise LoweringError(f"internal: {node.op_type} is not elementwise")
    RULES[rule.rule](em, node, rule, dst, ins, scratch)


def _unary(em: Emitter, node: OpNode, rule: Emit, dst: LTile, ins: list, scratch: mathops.Scratch) -> None:
    mathops.emit_unary(em, rule.op, node.attrs, dst, ins[0], scratch)


def _ar(em: Emitter, node: OpNode, rule: Emit, dst: LTile, ins: list, scratch: mathops.Scratch) -> None:
    a, b = ins
    if not isinstance(a, LTile) and rule.commutative:
        a, b = b, a
    if not isinstance(a, LTile) and rule.op == "sub":            # c - x = -(x) + c
        em.lin("mac", dst, b, -1.0, float(a))
        return
    em.ar(rule.op, dst, a, b)


def _pow(em: Emitter, node: OpNode, rule: Emit, dst: LTile, ins: list, scratch: mathops.Scratch) -> None:
    base, expo = ins
    if isinstance(expo, LTile):                                   # base > 0: exp(e * log(b))
        lg = scratch.get(5)
        mathops.emit_log(em, lg, base, scratch)
        em.ar("mul", lg, lg, expo)
        mathops.emit_exp(em, dst, lg, scratch)
    else:
        mathops.emit_pow_const(em, dst, base, float(expo), scratch)


def _select(em: Emitter, node: OpNode, rule: Emit, dst: LTile, ins: list, scratch: mathops.Scratch) -> None:
    em.cmp(rule.op, dst, ins[0], ins[1], rule.yes, rule.no)


def _mod(em: Emitter, node: OpNode, rule: Emit, dst: LTile, ins: list, scratch: mathops.Scratch) -> None:
    mathops.emit_mod(em, dst, ins[0], ins[1], int(node.attr("fmod", 0)), scratch)


def _where(em: Emitter, node: OpNode, rule: Emit, dst: LTile, ins: list, scratch: mathops.Scratch) -> None:
    cond, x, y = ins
    if not isinstance(x, LTile) and not isinstance(y, LTile):   # a live condition selects constants
        em.cmp("sel_gt", dst, cond, 0.5, float(x), float(y))
        return
    if not isinstance(x, LTile):                    # opd2 must be the tensor: cond < 0.5 ? y : x
        em.cmp("sel_lt", dst, cond, 0.5, y, x)
        return
    if isinstance(y, LTile) and (y.strides, y.mode, y.prec) != (x.strides, x.mode, x.prec):
        # opd3 has no stride fields: give x and y the same (fp32, aligned) layout
        x2, y2 = scratch.get(0), scratch.get(1)
        em.ar("copy", x2, x)
        em.ar("copy", y2, y)
        x, y = x2, y2
    em.cmp("sel_gt", dst, cond, 0.5, x, y)


# the elementwise emission rules an OpSpec.emit may name
RULES = {"unary": _unary, "ar": _ar, "pow": _pow, "select": _select, "mod": _mod, "where": _where}


def apply_row_reduce(em: Emitter, node: OpNode, dst_row: LTile, src: LTile, cols: int) -> None:
    pool, mean = spec(node.op_type).reduce
    scale = (1.0 / cols if mean else 1.0) * float(node.attr("scale", 1.0))
    if pool == "avgpooling":
        row_average(em, dst_row, src, scale)
    else:
        em.row_pool(pool, dst_row, src, scale)


def row_average(em: Emitter, dst_row: LTile, src: LTile, scale: float) -> None:
    """dst_row = scale * the sum of each row of src, the scale exact in fp32. Average pooling reads
    its scale in src's precision (emitter.pool_scale_fields): a scale that precision does not hold
    (1/768 in fp16 is 2.4e-4 off, a LayerNorm mean off by that moves quantized codes) is applied by
    an fp32 multiply of the unscaled sum instead (into an fp32 dst_row; a narrower one takes the
    rounded scale, the unscaled sum could overflow it)."""
    if _holds(scale, src.prec) or dst_row.prec != Prec.FP32:
        em.row_pool("avgpooling", dst_row, src, scale)
        return
    em.row_pool("avgpooling", dst_row, src, 1.0)
    em.ar("mul", dst_row, dst_row, scale)


def _holds(value: float, prec) -> bool:
    """Whether a pooling constant of `prec` is `value` exactly as fp32 holds it."""
    if prec == Prec.FP16:
        return float(np.float16(value)) == float(np.float32(value))
    return narrow_bits(value, prec) == f32_bits(value)


def apply_softmax(em: Emitter, node: OpNode, dst: LTile, src: LTile, row_tmp: LTile,
                  scratch: mathops.Scratch, cols: int) -> None:
    """Softmax / LogSoftmax over the columns of src (one row per channel)."""
    row_b = row_tmp.broadcast(dst.shape, h=True, w=True)
    em.row_pool("maxpooling", row_tmp, src)
    em.ar("sub", dst, src, row_b)
    e = scratch.get(3)
    mathops.emit_exp(em, e, dst, scratch)
    em.row_pool("avgpooling", row_tmp, e, 1.0)
    if spec(node.op_type).emit.rule == "softmax":
        em.ar("div", row_tmp, 1.0, row_tmp)
        em.ar("mul", dst, e, row_b)
    else:
        row_scratch = mathops.Scratch([t.with_shape(row_tmp.shape, em.chip) for t in scratch.tiles])
        mathops.emit_log(em, row_tmp, row_tmp, row_scratch)
        em.ar("sub", dst, dst, row_b)


def apply_layernorm(em: Emitter, node: OpNode, dst: LTile, src: LTile, row_tmp: LTile,
                    gamma, beta, scratch: mathops.Scratch, cols: int) -> None:
    """LayerNormalization over the columns: (x - mean) * rsqrt(var + eps) * gamma + beta."""
    row_b = row_tmp.broadcast(dst.shape, h=True, w=True)
    sq = scratch.get(0)
    row_average(em, row_tmp, src, 1.0 / cols)
    em.ar("sub", dst, src, row_b)
    em.ar("mul", sq, dst, dst)
    row_average(em, row_tmp, sq, 1.0 / cols)
    em.ar("add", row_tmp, row_tmp, float(node.attr("epsilon", 1e-5)))
    em.sfu("rsqrt", row_tmp, row_tmp)
    em.ar("mul", dst, dst, row_b)
    if gamma is not None and beta is not None:
        em.lin("mac", dst, dst, gamma, beta)
    elif gamma is not None:
        em.ar("mul", dst, dst, gamma)
    elif beta is not None:
        em.ar("add", dst, dst, beta)
