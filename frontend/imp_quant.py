"""Quantized ONNX into the canonical quantized graph (contract: frontend/quant.py): the QuantizeLinear /
DequantizeLinear importers, the record of constant dequantizations that folding evaluates (so weights
keep their integers), the Gemm weight transposition, and the pass that absorbs DQ -> op -> Q.

Absorption (`absorb`, on the Draft after import): an op of ABSORBED whose every input is the real value
of a quantized tensor (a DequantizeLinear's output, or a constant that was dequantized) and whose
output's only use is one QuantizeLinear takes the quantized tensors directly and produces the
QuantizeLinear's output; an op of ON_GRID (exact on quantized values) whose result is used in float
instead runs on the quantized tensor, keeps its input's Quant, and is followed by the DequantizeLinear
(so QOperator's DQ -> Relu -> MaxPool -> Q becomes Relu -> MaxPool on integers; a Transpose that only a
float MatMul reads stays float, the lowering folds it into the MatMul; an Add / Mul broadcasting one runtime
input against another stays float). Conv takes per-tensor
activations and per-tensor or axis-0 weights, its bias becomes int32 (frontend/quant.py); MatMul takes
per-tensor activations and per-tensor or last-axis weights, and a MatMul -> Add(constant bias) -> Q
chain (Gemm) becomes MatMul -> int32 accumulator -> Add(int32 bias). A Conv / MatMul whose inputs all
have scale 1 and whose result is Cast to int32 (ConvInteger / MatMulInteger) gives an int32 result of
scale 1; a Cast of such a tensor to float is a DequantizeLinear. Ops of INTEGER_MOVES that read stored
integers directly (QOperator models run MaxPool, Reshape, ... on uint8) carry their input's Quant to
their output. Any other op reading stored integers is an error naming the node; everything not absorbed
stays float between explicit DequantizeLinear / QuantizeLinear nodes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import numpy as np
from onnx import TensorProto, helper

from tpuflow.errors import ModelError
from tpuflow.frontend.draft import Draft, make_node
from tpuflow.frontend.graph import OpNode
from tpuflow.frontend.onnx_view import ONode, OnnxView
from tpuflow.frontend.ops import OpKind
from tpuflow.frontend.quant import Quant, QuantParamError, accumulator_quant, dequantize, onnx_quant, quantize
from tpuflow.frontend.registry import Facts, importer

K = OpKind
ABSORBED = frozenset({K.CONV, K.MATMUL, K.ADD, K.MUL, K.RELU, K.CLIP, K.MAX_POOL, K.AVERAGE_POOL,
                      K.GLOBAL_AVERAGE_POOL, K.CONCAT, K.RESHAPE, K.TRANSPOSE, K.SLICE})
INTEGER_MOVES = frozenset({K.MAX_POOL, K.RESHAPE, K.TRANSPOSE, K.SLICE, K.CONCAT})   # exact on stored integers
ON_GRID = INTEGER_MOVES | {K.RELU}      # exact on quantized values in their input's Quant (Relu: max(q, zero point))
BIAS_RTOL = 1e-6           # a model's bias scale counts as input scale * weight scale within this


class Dequantized(NamedTuple):
    """A constant DequantizeLinear folding removed: the model's integers, their Quant, and the name
    of the model's integer tensor (the quantized constant of the canonical graph is named after it)."""

    values: np.ndarray
    quant: Quant
    source: str


def _node_quant(label: str, node: ONode, scale, zero_point, storage: str, shape: tuple[int, ...]) -> Quant:
    try:
        return onnx_quant(scale, zero_point, storage, shape, int(node.attr("axis", 1)),
                          int(node.attr("block_size", 0)))
    except QuantParamError as exc:
        raise ModelError(f"{label}: node '{node.name}' ({node.op_type}): {exc}") from None


def _no_blocks(node: ONode, facts: Facts) -> str | None:
    return f"block_size {node.attr('block_size')}" if node.attr("block_size", 0) else None


QDQ_CONSTS = ((1, "scale"), (2, "zero point"))


@importer("DequantizeLinear", const_inputs=QDQ_CONSTS, check=_no_blocks)
def dequantize_linear(node: ONode, ctx) -> None:
    """A runtime DequantizeLinear: its parameters become its input's Quant (constant ones were folded
    and recorded by `fold_quantization`)."""
    x = node.input(0)
    quant = _node_quant(ctx.view.label, node, ctx.const(node.input(1)), ctx.const(node.input(2)), ctx.dtype(x),
                        ctx.shape(x))
    info = ctx.draft.tensors[x]
    if info.quant is not None and info.quant != quant:
        raise ModelError(f"{ctx.view.label}: node '{node.name}' (DequantizeLinear) reads '{x}' with other scale / "
                         "zero point than it was quantized with")
    ctx.draft.tensors[x] = replace(info, quant=quant)
    ctx.emit(K.DEQUANTIZE, (x,), node.outputs[:1])


@importer("QuantizeLinear", const_inputs=QDQ_CONSTS, check=_no_blocks)
def quantize_linear(node: ONode, ctx) -> None:
    x, y = node.input(0), node.outputs[0]
    quant = _node_quant(ctx.view.label, node, ctx.const(node.input(1)), ctx.const(node.input(2)), ctx.dtype(y),
                        ctx.shape(x))
    ctx.draft.tensors[y] = replace(ctx.draft.tensors[y], quant=quant)
    ctx.emit(K.QUANTIZE, (x,), (y,))


@importer("DynamicQuantizeLinear", check=lambda node, facts: "runtime scale: quantize the model statically")
def dynamic_quantize_linear(node: ONode, ctx) -> None:
    ctx.unsupported("runtime scale: quantize the model statically")


def fold_quantization(node: ONode, view: OnnxView) -> np.ndarray:
    """Quantize- / DequantizeLinear of constants, evaluated by the frontend/quant.py rules (onnx's
    reference evaluator lacks them before opset 19). A dequantization's integers and Quant are kept
    under the name of the float constant it yields (view.dequantized), so quantized ops get the
    integers back."""
    x = view.consts[node.input(0)]
    scale = view.consts[node.input(1)]
    zp = view.consts[node.input(2)] if node.input(2) else None
    if node.op_type == "QuantizeLinear":
        storage = zp.dtype.name if zp is not None else helper.tensor_dtype_to_np_dtype(
            int(node.attr("output_dtype", 0)) or TensorProto.UINT8).name
        return quantize(x, _node_quant(view.label, node, scale, zp, storage, tuple(x.shape)))
    quant = _node_quant(view.label, node, scale, zp, x.dtype.name, tuple(x.shape))
    view.dequantized[node.outputs[0]] = Dequantized(x, quant, node.input(0))
    return dequantize(x, quant).astype(scale.dtype)


def transpose_gemm_weights(view: OnnxView) -> None:
    """Gemm(transB=1) with dequantized constant weights: the weights transposed on the view (integers
    and float value, the channel axis moved), so the Gemm importer passes them through by name."""
    for node in view.nodes:
        b = node.input(1)
        if node.op_type != "Gemm" or not node.attr("transB", 0) or b not in view.dequantized:
            continue
        values, quant, source = view.dequantized[b]
        name = f"{b}/transposed"
        while name in view.consts:
            name += "_"
        view.consts[name] = np.ascontiguousarray(view.consts[b].T)
        axis = None if quant.axis is None else 1 - quant.axis
        view.dequantized[name] = Dequantized(np.ascontiguousarray(values.T), quant.with_axis(axis),
                                             f"{source}/transposed")
        node.inputs = (node.inputs[0], name) + node.inputs[2:]
        node.attrs = {**node.attrs, "transB": 0}


def is_quantized(draft: Draft) -> bool:
    return any(n.op_type in (K.QUANTIZE, K.DEQUANTIZE) for n in draft.nodes) or any(
        t.quant is not None for t in draft.tensors.values())


class _Absorber:
    """One sweep of absorption over a Draft (see the module docstring)."""

    def __init__(self, draft: Draft, dequantized: dict[str, Dequantized]):
        self.d, self.deq = draft, dequantized
        self.producer = {t: n for n in draft.nodes for t in n.outputs}
        self.users: dict[str, list[OpNode]] = {}
        for n in draft.nodes:
            for t in dict.fromkeys(n.inputs):
                self.users.setdefault(t, []).append(n)
        self.qconsts: dict[str, str] = {}
        self.dropped: set[str] = set()           # Q / Add nodes taken into a rewritten node

    def quant(self, t: str) -> Quant | None:
        return self.d.tensors[t].quant

    def real_of(self, t: str) -> str | None:
        """The quantized tensor whose real values `t` holds, or None."""
        p = self.producer.get(t)
        if p is not None and p.op_type == K.DEQUANTIZE:
            return p.inputs[0]
        if t in self.deq and self.d.tensors[t].is_const:
            if t not in self.qconsts:
                values, quant, source = self.deq[t]
                self.qconsts[t] = self.quantized_const(source, values, quant)
            return self.qconsts[t]
        return None

    def quantized_const(self, base: str, values: np.ndarray, quant: Quant) -> str:
        name = self.d.add_const(base, values)
        self.d.tensors[name] = replace(self.d.tensors[name], quant=quant)
        return name

    def sole_user(self, t: str, kind: OpKind) -> OpNode | None:
        users = self.users.get(t, [])
        if t in self.d.outputs or len(users) != 1 or users[0].op_type != kind:
            return None
        return users[0]

    def quantize_of(self, t: str) -> OpNode | None:
        """The one QuantizeLinear that is float `t`'s only use."""
        return self.sole_user(t, K.QUANTIZE)

    def int32_cast_of(self, t: str) -> OpNode | None:
        cast = self.sole_user(t, K.CAST)
        return cast if cast is not None and cast.attrs["to"] == "int32" else None

    # ---- rewrites: each returns the replacement nodes, or None to leave `n` as it is
    def rewrite(self, n: OpNode) -> list[OpNode] | None:
        if n.op_type not in ABSORBED or len(n.outputs) != 1:
            return None
        if n.op_type in (K.CONV, K.MATMUL):
            return self.product(n)
        ins = [self.real_of(t) for t in n.inputs]
        q = self.quantize_of(n.outputs[0])
        if None in ins or self.broadcasts(n):
            return None
        if q is None:
            return self.on_grid(n, ins) if n.op_type in ON_GRID else None
        self.dropped.add(q.name)
        return [replace(n, inputs=tuple(ins), outputs=q.outputs)]

    def on_grid(self, n: OpNode, ins: list[str]) -> list[OpNode] | None:
        """An ON_GRID op on quantized runtime inputs of one Quant whose result is used in float: it runs
        on the quantized tensor (its output keeps the Quant) and a DequantizeLinear after it gives the
        float result (DequantizeLinear moved below exact ops)."""
        quants = {self.quant(t) for t in ins}
        if len(quants) != 1 or any(self.d.tensors[t].is_const for t in ins) or self.folds_into_matmul(n):
            return None
        try:
            carried = _carried(self.d, replace(n, inputs=tuple(ins)), quants.pop(), n.name)
        except ModelError:
            return None
        out = self.d.tensors[n.outputs[0]]
        quantized = self.d.add_tensor(f"{out.name}_quantized", out.shape, carried.storage)
        self.d.tensors[quantized] = replace(self.d.tensors[quantized], quant=carried)
        dequantize = make_node(self.d.node_name(f"{n.name}/dequantize"), K.DEQUANTIZE, (quantized,), (out.name,))
        self.producer[out.name] = dequantize
        return [replace(n, inputs=tuple(ins), outputs=(quantized,)), dequantize]

    def broadcasts(self, n: OpNode) -> bool:
        """An Add / Mul broadcasting one runtime input against another (an SE block's x + pooled x): it
        stays float between its DequantizeLinears and QuantizeLinear (no integer form of it yet)."""
        runtime = [t for t in n.inputs if t and not self.d.tensors[t].is_const]
        out = self.d.tensors[n.outputs[0]].shape
        return n.op_type in (K.ADD, K.MUL) and len(runtime) > 1 and any(self.d.tensors[t].shape != out for t in runtime)

    def folds_into_matmul(self, n: OpNode) -> bool:
        """A Transpose whose float result only a float MatMul reads (its result, or its bias Add's, is not
        quantized): it stays float after the DequantizeLinear,
        so the lowering reads the MatMul's operand through the permutation (lowering.prepare.
        fold_matmul_transposes) instead of moving the integers in DDR first."""
        users = self.users.get(n.outputs[0], [])
        if n.op_type != K.TRANSPOSE or n.outputs[0] in self.d.outputs or len(users) != 1 \
                or users[0].op_type != K.MATMUL:
            return False
        result = users[0].outputs[0]
        bias = self.sole_user(result, K.ADD)
        return self.quantize_of(result) is None and (bias is None or self.quantize_of(bias.outputs[0]) is None)

    def product(self, n: OpNode) -> list[OpNode] | None:
        x, w = self.real_of(n.inputs[0]), self.real_of(n.inputs[1])
        if x is None or w is None or self.quant(x).per_channel:
            return None
        wq, rank = self.quant(w), len(self.d.tensors[w].shape)
        if wq.per_channel and wq.axis != (0 if n.op_type == K.CONV else rank - 1):
            return None
        out = n.outputs[0]
        cast = self.int32_cast_of(out)
        if cast is not None:
            return self.integer_product(n, x, w, cast)
        q = self.quantize_of(out)
        if n.op_type == K.CONV:
            bias = self.bias(n.inputs[2], x, w, 0) if len(n.inputs) > 2 else ""
            if q is None or bias is None:
                return None
            self.dropped.add(q.name)
            return [replace(n, inputs=(x, w, bias) if bias else (x, w), outputs=q.outputs)]
        if q is not None:
            self.dropped.add(q.name)
            return [replace(n, inputs=(x, w), outputs=q.outputs)]
        return self.matmul_with_bias(n, x, w)

    def matmul_with_bias(self, n: OpNode, x: str, w: str) -> list[OpNode] | None:
        """MatMul -> Add(constant bias) -> Q: MatMul -> int32 accumulator -> Add(int32 bias)."""
        out = n.outputs[0]
        add = self.sole_user(out, K.ADD)
        if add is None or add.inputs.count(out) != 1:
            return None
        c = add.inputs[1] if add.inputs[0] == out else add.inputs[0]
        q = self.quantize_of(add.outputs[0])
        info = self.d.tensors[c]
        if q is None or not info.is_const or info.shape[:-1] != (1,) * (len(info.shape) - 1):
            return None
        bias = self.bias(c, x, w, len(info.shape) - 1)
        if bias is None:
            return None
        shape = self.d.tensors[out].shape
        acc = self.d.add_tensor(f"{out}_accumulator", shape, "int32")
        self.d.tensors[acc] = replace(self.d.tensors[acc],
                                      quant=accumulator_quant(self.quant(x), self.quant(w), len(shape) - 1))
        self.dropped.update((q.name, add.name))
        return [replace(n, inputs=(x, w), outputs=(acc,)), replace(add, inputs=(acc, bias), outputs=q.outputs)]

    def bias(self, b: str, x: str, w: str, axis: int) -> str | None:
        """The int32 bias (scale = input scale * weight scale): the model's integers when its scale is
        that product, else its real values rounded to it; None when the bias is not a constant."""
        info = self.d.tensors[b]
        if not info.is_const:
            return None
        acc = accumulator_quant(self.quant(x), self.quant(w), axis)
        if b in self.deq:
            values, quant, _ = self.deq[b]
            same = quant.storage == "int32" and quant.scale.shape in ((), acc.scale.shape) and np.allclose(
                np.broadcast_to(quant.scale, acc.scale.shape), acc.scale, rtol=BIAS_RTOL, atol=0)
            if same and np.all(quant.zero_point == 0):
                return self.quantized_const(self.deq[b].source, values, acc)
        return self.quantized_const(f"{b}_int32", quantize(info.const, acc), acc)

    def integer_product(self, n: OpNode, x: str, w: str, cast: OpNode) -> list[OpNode] | None:
        """ConvInteger / MatMulInteger: integer inputs (scale 1), an int32 result of scale 1."""
        if len(n.inputs) > 2 or any(np.any(self.quant(t).scale != 1) for t in (x, w)):
            return None
        out = cast.outputs[0]
        self.d.tensors[out] = replace(self.d.tensors[out], quant=Quant(np.float32(1), np.int32(0), None, "int32"))
        self.dropped.add(cast.name)
        return [replace(n, inputs=(x, w), outputs=(out,))]


def absorb(draft: Draft, dequantized: dict[str, Dequantized], label: str) -> None:
    """Absorb DQ -> op -> Q patterns into ops on quantized tensors, then carry Quant through integer
    moves and check that nothing else reads stored integers (see the module docstring)."""
    ab = _Absorber(draft, dequantized)
    replaced: dict[str, list[OpNode]] = {}
    for n in draft.nodes:
        if n.name not in ab.dropped:
            new = ab.rewrite(n)
            if new is not None:
                replaced[n.name] = new
    nodes, absorbed = [], set()
    for n in draft.nodes:
        if n.name in ab.dropped:
            continue
        for m in replaced.get(n.name, [n]):
            nodes.append(m)
            if n.name in replaced:
                absorbed.add(m.name)
    draft.nodes = nodes
    draft.prune()
    draft.nodes = [_integer_node(draft, n, n.name in absorbed, label) for n in draft.nodes]


def _integer_node(draft: Draft, n: OpNode, absorbed: bool, label: str) -> OpNode:
    """`n` after the integer checks: a Cast of a quantized tensor is a DequantizeLinear (scale 1, zero
    point 0); an integer move carries its input's Quant (a Split of a per-tensor quantized tensor, as
    QOperator models leave it on int8 between QLinear ops, to every output); any other reader of
    stored integers fails."""
    quantized = [t for t in n.inputs if draft.tensors[t].quant is not None and not draft.tensors[t].is_const]
    if absorbed or not quantized or n.op_type in (K.DEQUANTIZE, K.QUANTIZE):
        return n
    q = draft.tensors[quantized[0]].quant
    where = f"{label}: node '{n.name}' ({n.op_type})"
    if n.op_type == K.CAST:
        if n.attrs["to"] not in ("float32", "float16") or np.any(q.scale != 1) or np.any(q.zero_point != 0):
            raise ModelError(f"{where}: a Cast of quantized tensor '{quantized[0]}' ({q.describe()}) is supported "
                             "only from an int32 result of scale 1 to float")
        return replace(n, op_type=K.DEQUANTIZE.value, attrs=type(n.attrs)({}))
    if n.op_type in INTEGER_MOVES and len(n.outputs) == 1 or n.op_type == K.SPLIT and not q.per_channel:
        carried = q if n.op_type == K.SPLIT else _carried(draft, n, q, where)
        for name in n.outputs:
            out = draft.tensors[name]
            if out.quant is not None and out.quant != carried:
                raise ModelError(f"{where}: output '{out.name}' is dequantized with other parameters than its "
                                 "input has")
            draft.tensors[out.name] = replace(out, quant=carried)
        return n
    raise ModelError(f"{where} computes on the stored integers of quantized tensor '{quantized[0]}' "
                     f"({q.describe()}); tpuflow takes such ops only between DequantizeLinear and QuantizeLinear")


def _carried(draft: Draft, n: OpNode, q: Quant, where: str) -> Quant:
    """The Quant an integer move gives its output: its input's, the channel axis followed."""
    if n.op_type == K.CONCAT and any(draft.tensors[t].quant != q for t in n.inputs):
        raise ModelError(f"{where}: concatenates quantized tensors of different scales / zero points")
    if not q.per_channel or n.op_type in (K.MAX_POOL, K.RELU) or n.op_type == K.CONCAT and n.attrs["axis"] != q.axis:
        return q
    if n.op_type == K.SLICE:
        dim = draft.tensors[n.inputs[0]].shape[q.axis]
        if (n.attrs["starts"][q.axis], n.attrs["ends"][q.axis], n.attrs["steps"][q.axis]) == (0, dim, 1):
            return q
    if n.op_type == K.TRANSPOSE:
        return q.with_axis(list(n.attrs["perm"]).index(q.axis))
    if n.op_type == K.RESHAPE:
        src, dst = draft.tensors[n.inputs[0]].shape, n.attrs["shape"]
        before = int(np.prod(src[:q.axis]))
        for k in range(len(dst)):
            if int(np.prod(dst[:k])) == before and dst[k] == src[q.axis]:
                return q.with_axis(k)
    raise ModelError(f"{where}: changes the channels of a per-channel quantized tensor")
