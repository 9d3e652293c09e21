"""Elementwise and row-wise ops: classify operands against a (rows, cols) view of the output and
emit one node's TIU instructions on LMEM tiles."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from tpuflow.errors import LoweringError
from tpuflow.frontend.graph import Graph, OpNode
from tpuflow.lowering import mathops
from tpuflow.lowering.emitter import Emitter
from tpuflow.lowering.opspec import SPECS, kinds_with
from tpuflow.lowering.tensors import LTile

UNARY = {"Relu", "LeakyRelu", "Clip", "HardSigmoid", "HardSwish", "Sigmoid", "Tanh", "Exp", "Log", "Erf",
         "Sqrt", "Reciprocal", "Neg", "Abs", "Cast", "Identity", "Not", "Floor", "Ceil", "Round", "Sign",
         "Sin", "Cos", "ThresholdedRelu"}
BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Max": "max", "Min": "min",
          "And": "mul", "Or": "max"}          # And / Or of 0/1 values
COMMUTATIVE = {"Add", "Mul", "Max", "Min", "And", "Or"}
# comparisons (and Xor of 0/1 values) as compare-selects: (cmp op, value when true, when false)
SELECTS = {"Equal": ("sel_eq", 1.0, 0.0), "Greater": ("sel_gt", 1.0, 0.0), "Less": ("sel_lt", 1.0, 0.0),
           "GreaterOrEqual": ("sel_lt", 0.0, 1.0), "LessOrEqual": ("sel_gt", 0.0, 1.0),
           "Xor": ("sel_eq", 0.0, 1.0)}
EMITTED = UNARY | set(BINARY) | set(SELECTS) | {"Pow", "Where", "Mod"}   # apply_elementwise's rules
# the row-wise traits come from the one spec per op kind (lowering/opspec.py)
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
    return None


def node_split_candidates(graph: Graph, node: OpNode) -> list[int]:
    """Cut points of the output shape at which this node is row-wise, best first."""
    out = graph.tensor(node.outputs[0]).shape
    ref = graph.tensor(node.inputs[0]).shape if node.op_type in set(ROW_REDUCE) | ROW_NORMALIZE else out
    rank = len(ref)
    if node.op_type in ROW_REDUCE:
        axes = tuple(range(2, rank)) if node.op_type == "GlobalAveragePool" else tuple(node.attr("axes", ()))
        if not axes or axes != tuple(range(axes[0], rank)):
            return []
        return [axes[0]]
    if node.op_type in ("Softmax", "LogSoftmax"):
        return [rank - 1] if node.attr("axis") == rank - 1 else []
    if node.op_type == "LayerNormalization":
        return [node.attr("axis", -1) % rank]
    prefer = [2] if rank == 4 else []
    return prefer + [p for p in range(rank - 1, -1, -1) if p not in prefer] + ([rank] if rank else [])


def node_fits(graph: Graph, node: OpNode, split: int) -> bool:
    """Every operand of `node` classifies at `split` (reductions: of their input's view)."""
    if node.op_type in ROW_REDUCE or node.op_type in ROW_NORMALIZE:
        return split in node_split_candidates(graph, node) and all(
            classify(graph.tensor(t).shape, graph.tensor(node.inputs[0]).shape, split) is not None
            for t in node.inputs if t)
    out = graph.tensor(node.outputs[0]).shape
    return all(classify(graph.tensor(t).shape, out, split) is not None for t in node.inputs if t)


# ---------------------------------------------------------------- emission of one node

def apply_elementwise(em: Emitter, node: OpNode, dst: LTile, ins: list, scratch: mathops.Scratch) -> None:
    """TIU instructions of one elementwise node; `ins` are LTiles already broadcast to dst's shape,
    or python floats for scalar constants."""
    op = node.op_type
    if op in UNARY:
        mathops.emit_unary(em, op, node.attrs, dst, ins[0], scratch)
    elif op in BINARY:
        a, b = ins
        if not isinstance(a, LTile) and op in COMMUTATIVE:
            a, b = b, a
        if not isinstance(a, LTile) and op == "Sub":           # c - x = -(x) + c
            em.lin("mac", dst, b, -1.0, float(a))
            return
        em.ar(BINARY[op], dst, a, b)
    elif op == "Pow":
        base, expo = ins
        if isinstance(expo, LTile):                               # base > 0: exp(e * log(b))
            lg = scratch.get(5)
            mathops.emit_log(em, lg, base, scratch)
            em.ar("mul", lg, lg, expo)
            mathops.emit_exp(em, dst, lg, scratch)
        else:
            mathops.emit_pow_const(em, dst, base, float(expo), scratch)
    elif op in SELECTS:
        cmp_op, yes, no = SELECTS[op]
        em.cmp(cmp_op, dst, ins[0], ins[1], yes, no)
    elif op == "Mod":
        mathops.emit_mod(em, dst, ins[0], ins[1], int(node.attr("fmod", 0)), scratch)
    elif op == "Where":
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
    else:
        raise LoweringError(f"internal: {op} is not elementwise")


def apply_row_reduce(em: Emitter, node: OpNode, dst_row: LTile, src: LTile, cols: int) -> None:
    pool, mean = ROW_REDUCE[node.op_type]
    em.row_pool(pool, dst_row, src, 1.0 / cols if mean else 1.0)


def apply_softmax(em: Emitter, node: OpNode, dst: LTile, src: LTile, row_tmp: LTile,
                  scratch: mathops.Scratch, cols: int) -> None:
    """Softmax / LogSoftmax over the columns of src (one row per channel)."""
    row_b = row_tmp.broadcast(dst.shape, h=True, w=True)
    em.row_pool("maxpooling", row_tmp, src)
    em.ar("sub", dst, src, row_b)
    e = scratch.get(3)
    mathops.emit_exp(em, e, dst, scratch)
    em.row_pool("avgpooling", row_tmp, e, 1.0)
    if node.op_type == "Softmax":
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
    em.row_pool("avgpooling", row_tmp, src, 1.0 / cols)
    em.ar("sub", dst, src, row_b)
    em.ar("mul", sq, dst, dst)
    em.row_pool("avgpooling", row_tmp, sq, 1.0 / cols)
    em.ar("add", row_tmp, row_tmp, float(node.attr("epsilon", 1e-5)))
    em.sfu("rsqrt", row_tmp, row_tmp)
    em.ar("mul", dst, dst, row_b)
    if gamma is not None and beta is not None:
        em.lin("mac", dst, dst, gamma, beta)
    elif gamma is not None:
        em.ar("mul", dst, dst, gamma)
    elif beta is not None:
        em.ar("add", dst, dst, beta)
