"""Which quantized nodes the int8 lowering supports, and the groups it emits them in (issue 15).

A node is *quantized* when it reads or writes a quantized tensor (frontend/quant.py); such a tensor
lives in DDR at its integer storage (ddrplan.stored_dtype: int8 / uint8 one byte, int32 four),
every float tensor at --dtype. The int8 lowering (lowering/ops/quant_ops.py) emits every quantized
node in a group of kind "quant":

- Conv (standard, grouped or depthwise; int8 or uint8 weights, any zero points; an int32 result, ConvInteger's,
  stored as it is) and MatMul by constant int8
  or uint8 weights (any zero points but -128 / 0; the Gemm form, with the int32 bias Add that follows its int32
  accumulator), each with a following Relu / Clip on its 8-bit output fused; MatMul of two
  per-tensor 8-bit activations (attention; both zero points exact: quant_ops.ActMatMulQuant);
- QuantizeLinear, DequantizeLinear (per tensor), LookupTable (frontend/lookup.py, 8-bit per tensor in
  and out), and Add / Mul / Relu / Clip of same-shaped quantized tensors or of one such tensor and a broadcast constant (scalar, per channel, or any
  other pattern: row_pattern);
- MaxPool, AveragePool, GlobalAveragePool;
- channel Concat (requantising the inputs whose Quant is not the output's);
- Reshape views (no instructions: the DDR buffer is shared, as for float views); a Reshape whose
  output has another Quant (requantising_view) is requantised like an elementwise op;
- Transpose / Slice / Split of an 8-bit tensor whose outputs have its per-tensor Quant: the float
  movement emitter's DMAs (or its LMEM paths) on the stored bytes (exact).

Runs of consecutive chainable quant groups (takes_held: CHAINABLE kinds on NCHW tensors; the Gemm
form, elementwise ops and DequantizeLinear on tensors of other ranks, held as rows: held_view) form a
QuantChain whose inner tensors stay whole in LMEM; a Reshape keeping the held layout does not end a run.
Between groups and chains the layer groups' residency plan keeps tensors in LMEM (8-bit ones at one
byte an element) where the quant emitters declare LMEM ports (quant_ops._boundary_ports). Everything
else on quantized tensors is refused before lowering by `check_supported`, one line naming the node.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tpuflow.errors import LoweringError
from tpuflow.frontend.graph import Graph, OpNode
from tpuflow.frontend.quant import storage_range
from tpuflow.lowering.ddrplan import FirstFit
from tpuflow.lowering.groups import Group

PRODUCTS = ("Conv", "MatMul")
ACTIVATIONS = ("Relu", "Clip")
LOOKUP = "LookupTable"      # frontend/lookup.py: y = table[x], ElementwiseQuant's SG gathers
ELEMENTWISE = ("QuantizeLinear", "DequantizeLinear", "Add", "Mul", "Relu", "Clip", LOOKUP)
POOLS = ("MaxPool", "AveragePool", "GlobalAveragePool")
VIEWS = ("Reshape",)
# Data movement that is exact on the stored bytes when every moved tensor has one per-tensor Quant:
# emitted by the float movement emitters at the storage precision (quant_ops.QuantMove).
MOVES = ("Transpose", "Slice", "Split")
SUPPORTED = PRODUCTS + ELEMENTWISE + POOLS + VIEWS + MOVES + ("Concat",)
# Emitters that read and write held tensors. DequantizeLinear is left out on NCHW tensors: a chain
# ending in one gave wrong results at fp16 on AlexNet QDQ (its float output feeding LRN; correct at
# fp32 and unchained), not understood yet; unchained, its input is stored by its producer and it runs
# on the flat view. On tensors held as rows (held_view: a transformer's) it joins chains (takes_held).
CHAINABLE = ("Conv", "Concat") + tuple(k for k in ELEMENTWISE if k != "DequantizeLinear") + POOLS


BROADCASTING = "broadcasting elementwise int8 ops are not supported yet"


def requantising_view(graph: Graph, node: OpNode) -> bool:
    """A Reshape whose output has another Quant than its input (onnxruntime's quantizer gives a
    Flatten before a classifier its own scale): not a view but a requantisation of the flat
    values (ElementwiseQuant), quantize(real(x), out.quant)."""
    return node.op_type in VIEWS and graph.tensor(node.inputs[0]).quant != graph.tensor(node.outputs[0]).quant


def is_quantized(graph: Graph, node: OpNode) -> bool:
    """Whether `node` reads or writes a quantized tensor."""
    return any(t and graph.tensor(t).quant is not None for t in (*node.inputs, *node.outputs))


def check_supported(graph: Graph) -> None:
    """One LoweringError naming the first quantized node the int8 lowering cannot emit."""
    for node in graph.nodes():
        if not is_quantized(graph, node):
            continue
        why = unsupported_reason(graph, node)
        if why:
            raise LoweringError(f"node '{node.name}' ({node.op_type}) on quantized tensors: {why}")


def unsupported_reason(graph: Graph, node: OpNode) -> str:
    """Why the int8 lowering cannot emit `node` ('' when it can)."""
    op = node.op_type
    if op not in SUPPORTED:
        return f"the int8 lowering has no {op} yet (supported: {', '.join(SUPPORTED)})"
    outs = [graph.tensor(t) for t in node.outputs]
    ins = [graph.tensor(t) for t in node.inputs if t]
    if op in PRODUCTS:
        return _product_reason(graph, node)
    if op == "Add" and any(t.dtype == "int32" for t in ins):
        producer = graph.producer(node.inputs[0])
        if producer is None or producer.op_type != "MatMul":
            return "an int32 Add only as the bias of a MatMul's accumulator"
        return ""
    if op == LOOKUP:
        return _lookup_reason(graph, node)
    if op in ELEMENTWISE:
        runtime = [t for t in ins if not t.is_const]
        consts = [t for t in ins if t.is_const] if op not in ("QuantizeLinear", "DequantizeLinear") else []
        if consts and not (_channel_constant(consts[0], outs[0], op) or row_pattern(graph, node) is not None):
            return "constant operands of elementwise int8 ops only as real values or per-tensor quantized"
        if any(t.shape != outs[0].shape for t in runtime):
            return BROADCASTING
        if any(t.quant is not None and t.quant.per_channel for t in runtime + outs):
            return "per-channel quantized activations are not supported yet"
        if op not in ("QuantizeLinear", "DequantizeLinear") and outs[0].quant is None:
            return "a float result of quantized inputs is not supported"
        if any(t.quant is not None and t.quant.storage == "int32" for t in runtime + outs) and op != "DequantizeLinear":
            return "int32 tensors only as a MatMul's accumulator, a Conv's result (ConvInteger) or dequantized"
        return ""
    if requantising_view(graph, node):
        tensors = [graph.tensor(node.inputs[0]), *outs]
        if any(t.quant is None or t.quant.per_channel or t.quant.storage == "int32" for t in tensors):
            return "a Reshape between two quantizations only of per-tensor 8-bit tensors"
        return ""
    if op in MOVES and _same_bytes_move(graph, node):
        return ""
    if op in MOVES:
        return "moves only of 8-bit tensors sharing one per-tensor Quant"
    if op == "Concat":
        tensors = ins + outs
        if any(t.quant is None or t.quant.per_channel or t.quant.storage == "int32" or t.is_const for t in tensors):
            return "Concat only of per-tensor 8-bit quantized activations"
        return ""
    if op in POOLS:
        if len(graph.tensor(node.inputs[0]).shape) != 4:
            return "only 2-D pooling of NCHW tensors"
        if node.attr("ceil_mode", 0):
            return "ceil_mode pooling is not supported yet"
    return ""


def _lookup_reason(graph: Graph, node: OpNode) -> str:
    """Why the int8 lowering cannot emit a LookupTable ('' when it can)."""
    x, table, y = (graph.tensor(t) for t in (*node.inputs[:2], node.outputs[0]))
    eight_bit = [t.quant is not None and not t.quant.per_channel and t.quant.storage in ("int8", "uint8")
                 for t in (x, y)]
    if not all(eight_bit) or x.is_const or not table.is_const or table.size != 256 or x.shape != y.shape:
        return "a lookup table only from a per-tensor 8-bit tensor to one of its shape, by 256 constant codes"
    return ""


def _same_bytes_move(graph: Graph, node: OpNode) -> bool:
    """A movement node whose moved tensors are 8-bit, quantized per tensor with one Quant: it moves
    stored bytes exactly."""
    tensors = [graph.tensor(t) for t in (node.inputs[0], *node.outputs)]
    first = tensors[0].quant
    return all(t.quant is not None and t.quant == first for t in tensors) and first.storage != "int32" \
        and not first.per_channel


def row_pattern(graph: Graph, node: OpNode) -> np.ndarray | None:
    """The constant operand of an Add / Mul on quantized tensors as the real values (fp32) of its
    smallest repeating unit along the flattened output: the output's trailing axes from the first
    one the constant varies along (a LayerNorm / RMSNorm gain: one last-axis vector; a per-channel
    (C, 1, 1) constant: C * H * W values). None when the node has no such constant (a quantized
    per-channel or int32 constant, or none)."""
    from tpuflow.frontend.quant import dequantize
    if node.op_type not in ("Add", "Mul"):
        return None
    consts = [graph.tensor(t) for t in node.inputs if t and graph.tensor(t).is_const]
    out = graph.tensor(node.outputs[0])
    if len(consts) != 1 or (consts[0].quant is not None and (consts[0].quant.per_channel
                                                             or consts[0].quant.storage == "int32")):
        return None
    const = np.asarray(consts[0].const)
    real = (dequantize(const, consts[0].quant) if consts[0].quant is not None else const).astype(np.float32)
    if real.ndim > len(out.shape):
        return None
    aligned = real.reshape((1,) * (len(out.shape) - real.ndim) + real.shape)
    first = next((k for k, d in enumerate(aligned.shape) if d > 1), len(out.shape))
    return np.broadcast_to(aligned[(0,) * first], tuple(out.shape[first:])).reshape(-1).copy()


def _channel_constant(const, out, op: str) -> bool:
    """An Add / Mul constant the int8 lowering takes: a scalar, or one value per channel of the result's
    held view (channel_view_constant), quantized per tensor or not at all."""
    if op not in ("Add", "Mul") or (const.quant is not None and (const.quant.per_channel
                                                                    or const.quant.storage == "int32")):
        return False
    size = 1
    for d in const.shape:
        size *= d
    return size == 1 or channel_view_constant(const.shape, out.shape)


def channel_view_constant(const_shape, out_shape) -> bool:
    """A constant holding one value per channel of the result's held_view: (C, 1, 1) or (1, C, 1, 1) on an
    NCHW result, or on another rank one value per row of (leading dims, last axis), e.g. a (1, C, 1)
    bias on a (1, C, W) 1-D conv result (the flat view would put it all on one lane)."""
    const_shape, out_shape = tuple(const_shape), tuple(out_shape)
    if len(out_shape) == 4:
        return const_shape in ((out_shape[1], 1, 1), (1, out_shape[1], 1, 1))
    if len(out_shape) < 2 or len(const_shape) > len(out_shape):
        return False
    aligned = (1,) * (len(out_shape) - len(const_shape)) + const_shape
    return aligned == out_shape[:-1] + (1,) and any(d > 1 for d in aligned)


def product_of_activations(graph: Graph, node: OpNode) -> bool:
    """A MatMul of two runtime tensors (attention's Q.K^T, P.V)."""
    return node.op_type == "MatMul" and not any(graph.tensor(t).is_const for t in node.inputs[:2])


def _activations_reason(graph: Graph, node: OpNode) -> str:
    """Why the int8 lowering cannot emit a MatMul of two activations ('' when it can: ActMatMulQuant)."""
    a, b, out = (graph.tensor(t) for t in (node.inputs[0], node.inputs[1], node.outputs[0]))
    if any(t.quant is None or t.quant.per_channel or t.quant.storage == "int32" for t in (a, b, out)):
        return "a product of two activations only of per-tensor 8-bit tensors into a per-tensor 8-bit result"
    if len(a.shape) < 2 or len(b.shape) < 2 or tuple(a.shape[:-2]) != tuple(b.shape[:-2]):
        return "a product of two activations only with equal batch dimensions (no broadcasting)"
    return ""


def _product_reason(graph: Graph, node: OpNode) -> str:
    if product_of_activations(graph, node):
        return _activations_reason(graph, node)
    x, w = graph.tensor(node.inputs[0]), graph.tensor(node.inputs[1])
    out = graph.tensor(node.outputs[0])
    if x.quant is None or w.quant is None or not w.is_const:
        return "only products of a quantized activation by constant int8 weights"
    if x.quant.per_channel or w.quant.storage not in ("int8", "uint8"):
        return "weights must be int8 or uint8, the activation per-tensor"
    if node.op_type == "Conv" and w.quant.per_channel and w.quant.axis != 0:
        return "Conv weights quantized per output channel (axis 0) or per tensor"
    if node.op_type != "Conv" and (w.quant.zero_point == storage_range(w.quant.storage)[0]).any():
        return "MatMul weights with a zero point of -128 (int8) or 0 (uint8)"
    if node.op_type == "Conv":
        if out.quant is None:
            return "a Conv with a float result is not supported yet"
        if out.quant.storage == "int32" and node.attr("group", 1) == graph.tensor(node.inputs[0]).shape[1] > 1:
            return "an int32 Conv result (ConvInteger) of a depthwise Conv is not supported yet"
        return ""
    if len(w.shape) != 2 or node.attr("a_perm") is not None or node.attr("y_perm") is not None:
        return "MatMul only by a 2-D constant, untransposed"
    if out.quant is not None and out.quant.storage == "int32":
        users = graph.consumers(node.outputs[0])
        if len(users) != 1 or users[0].op_type != "Add" or not graph.tensor(users[0].inputs[1]).is_const \
                or graph.tensor(users[0].outputs[0]).quant is None:
            return "an int32 MatMul result must feed one Add of a constant int32 bias"
    elif out.quant is None:
        return "a MatMul with a float result is not supported yet"
    return ""


@dataclass
class QuantChain(Group):
    """Consecutive "quant" groups emitted as one (lowering/ops/quant_ops.ChainQuant): a tensor made
    and read inside the chain stays whole in LMEM (its DDR buffer is kept, unused, so the chain can
    still run member by member when it does not fit). `views`: {output: source} of the Reshapes
    between members that keep the held layout (held_view): their groups follow the chain, and a
    member reading a view's output reads its source's held tile."""

    members: list[Group] = field(default_factory=list)
    views: dict[str, str] = field(default_factory=dict)


def held_view(shape) -> tuple[int, int, int, int]:
    """The NCHW shape a chain holds a tensor in: an NCHW tensor as it is, any other one as its rows
    (the product of the leading dims) on lanes by its last axis, (1, rows, 1, last): MM2's operand
    layout, so a MatMul reads and writes held rows in place."""
    shape = tuple(shape)
    if len(shape) == 4:
        return shape
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return (1, rows, 1, shape[-1] if shape else 1)


# The share of a lane's LMEM the tensors a chain holds may take at once (estimated at one byte per
# element in the aligned layout); the rest is its members' working area. A compiler policy.
CHAIN_RESIDENT_SHARE = 0.4


def quantized_groups(graph: Graph, groups: list[Group], chip=None, slices_first: bool = False) -> list[Group]:
    """`groups` with every group holding a quantized node re-formed as "quant" groups: a Conv /
    MatMul with its bias Add and a following Relu / Clip, every other quantized node alone
    (quantized Reshapes stay "view" groups), then runs of consecutive quant groups on NCHW
    tensors joined into chains (QuantChain) when `chip` is given (with `slices_first`, only the
    groups a sliced run cannot take: _chains). Float groups are returned as they are."""
    if not any(is_quantized(graph, n) for g in groups for n in g.nodes):
        return groups
    out: list[Group] = []
    claimed: set[str] = set()
    for group in groups:
        if not any(is_quantized(graph, n) for n in group.nodes):
            out.append(group)
            continue
        for node in group.nodes:
            if node.name in claimed:
                continue
            if not is_quantized(graph, node):
                raise LoweringError(f"node '{node.name}' ({node.op_type}): a float node the fusion put in one group "
                                    "with quantized nodes is not supported by the int8 lowering yet")
            if node.op_type in VIEWS and not requantising_view(graph, node):
                made = Group("view", [node])
            else:
                fused = node.op_type in PRODUCTS and not product_of_activations(graph, node)
                made = Group("quant", [node] + (_fused_after(graph, node) if fused else []))
            claimed.update(n.name for n in made.nodes)
            made.stored = _stored(graph, made)
            out.append(made)
    return _chains(graph, out, chip, slices_first) if chip is not None else out


def takes_held(graph: Graph, group: Group) -> bool:
    """A quant group whose emitter takes held tensors: CHAINABLE kinds on 4-D tensors, and the Gemm
    form (a MatMul by constant int8 weights, its operand and result not 4-D) with elementwise members
    on tensors of any other rank (held as rows: held_view)."""
    if group.kind != "quant":
        return False
    node = group.anchor
    if node.op_type == "MatMul":
        return not product_of_activations(graph, node) and all(
            len(graph.tensor(t).shape) != 4 for t in (node.inputs[0], group.nodes[-1].outputs[0]))
    if node.op_type == "DequantizeLinear":       # on rows only (see CHAINABLE)
        return all(len(graph.tensor(t).shape) != 4 for t in (node.inputs[0], node.outputs[0]))
    if node.op_type not in CHAINABLE:
        return False
    if node.op_type in ("Add", "Mul") and any(graph.tensor(t).is_const for t in node.inputs if t) and \
            not _channel_constant(next(graph.tensor(t) for t in node.inputs if t and graph.tensor(t).is_const),
                                  graph.tensor(node.outputs[0]), node.op_type):
        pattern, out = row_pattern(graph, node), graph.tensor(node.outputs[0]).shape
        # a row constant: the flat view, or on held rows when it repeats along each (a norm's gain)
        return len(out) != 4 and pattern is not None and held_view(out)[3] % pattern.size == 0
    if node.op_type == "Conv" and 1 < node.attr("group", 1) and not \
            node.attr("group", 1) == graph.tensor(node.inputs[0]).shape[1] == graph.tensor(node.outputs[0]).shape[1]:
        return False                  # grouped (not depthwise): each group's input loads from DDR at lane 0
    runtime = [graph.tensor(t).shape for n in group.nodes for t in (*n.inputs, *n.outputs)
               if t and not graph.tensor(t).is_const]
    if node.op_type == "Concat" and node.attr("axis") % 4 != 1:
        return False                  # along another axis than channels: in DDR (ConcatQuant's view)
    if node.op_type in ("Conv", "Concat") + POOLS:
        return all(len(shape) == 4 for shape in runtime)
    return all(len(shape) >= 1 for shape in runtime)


def sliceable_quant(graph: Graph, group: Group) -> bool:
    """A lone quant group a sliced run (lowering.slicing) can run on bands of output rows of one
    sample: a Conv (standard or depthwise, an 8-bit result) or a MaxPool / AveragePool (windows of
    input rows), or an elementwise op whose runtime tensors all have the output's NCHW shape and
    whose constant is a scalar or per channel (the same rows in as out)."""
    if isinstance(group, QuantChain) or group.kind != "quant":
        return False
    node, out = group.anchor, graph.tensor(group.nodes[-1].outputs[0])
    runtime = [graph.tensor(t) for n in group.nodes for t in (*n.inputs, *n.outputs) if t and not graph.tensor(t).is_const]
    if len(out.shape) != 4 or any(len(info.shape) != 4 for info in runtime):
        return False
    if node.op_type == "Conv":
        g, cin = node.attr("group", 1), graph.tensor(node.inputs[0]).shape[1]
        return out.quant.storage != "int32" and (g == 1 or g == cin == out.shape[1])
    if node.op_type in ("MaxPool", "AveragePool"):
        return True
    if node.op_type not in ELEMENTWISE or len(group.nodes) != 1:
        return False
    consts = [graph.tensor(t) for t in node.inputs if t and graph.tensor(t).is_const]
    direct = node.op_type in ("QuantizeLinear", "DequantizeLinear", LOOKUP)     # no constant operand
    return all(tuple(info.shape) == tuple(out.shape) for info in runtime) and \
        (direct or all(_channel_constant(c, out, node.op_type) for c in consts))


def _chain_view(graph: Graph, group: Group, made: set[str]) -> bool:
    """A (non-requantising) Reshape of a tensor made in the open run that keeps its held layout."""
    if group.kind != "view" or group.anchor.inputs[0] not in made:
        return False
    src, out = (graph.tensor(t) for t in (group.anchor.inputs[0], group.anchor.outputs[0]))
    return src.quant is not None and held_view(src.shape) == held_view(out.shape)


def _chains(graph: Graph, groups: list[Group], chip, slices_first: bool = False) -> list[Group]:
    """Runs of chainable groups joined while the tensors they would hold fit CHAIN_RESIDENT_SHARE;
    the layout-keeping Reshapes of tensors made in a run (_chain_view) do not end it: their view
    groups are moved after the chain (they emit nothing). With `slices_first`, groups a sliced run
    can take (sliceable_quant) stay alone: the layer groups keep their tensors in LMEM, whole or in
    row slices."""
    out: list[Group] = []
    run: list[Group] = []
    views: list[Group] = []

    def flush():
        if len(run) > 1:
            chain = QuantChain("quant", [n for g in run for n in g.nodes], members=list(run),
                               views={v.anchor.outputs[0]: v.anchor.inputs[0] for v in views})
            chain.stored = [t for g in run for t in g.stored]
            out.append(chain)
        else:
            out.extend(run)
        out.extend(views)
        run.clear()
        views.clear()

    budget = CHAIN_RESIDENT_SHARE * chip.lmem_bytes_per_lane
    for group in groups:
        made = {t for g in run + views for n in g.nodes for t in n.outputs}
        if run and _chain_view(graph, group, made):
            views.append(group)
            continue
        if not takes_held(graph, group) or (slices_first and sliceable_quant(graph, group)):
            flush()
            out.append(group)
            continue
        aliases = {v.anchor.outputs[0]: v.anchor.inputs[0] for v in views}
        if run and held_peak(graph, run + [group], chip.lanes, aliases) > budget:
            flush()
        run.append(group)
    flush()
    return out


# Input channels per block of the int8 cube's weight layout (tpuflow.isa.ConvTiu.ALIGNED_IC_BLOCK of INT8).
CUBE_INT8_CHANNELS = 64


def folds_kernel_rows(graph: Graph, node: OpNode) -> bool:
    """A Conv whose input channels, times its kernel rows, fit one block of the int8 cube: it runs with
    the kh row-shifted copies of its input stacked as channels and a 1 x kw kernel (an RGB stem fills
    3 of the block's 64 channels, its 7 stacked rows 21), reading its input from DDR."""
    if node.op_type != "Conv" or node.attr("group", 1) != 1:
        return False
    cin, kh = graph.tensor(node.inputs[0]).shape[1], graph.tensor(node.inputs[1]).shape[2]
    return kh > 1 and cin * kh <= CUBE_INT8_CHANNELS


def tail_boundary(graph: Graph) -> set[str]:
    """The quantized tensors the float tails of the graph's float outputs read: a chain still stores
    them, so verify can read the program's boundary from DDR and check the float tail on it
    (tpuflow.pipeline's decomposed check)."""
    return {t for out in graph.outputs if graph.tensor(out).quant is None for t in float_tail_boundary(graph, out)}


def float_tail_boundary(graph: Graph, output: str) -> set[str]:
    """The quantized tensors `output`'s float tail reads, walking producers back through float runtime
    tensors (graph inputs and constants end the walk)."""
    boundary: set[str] = set()
    seen: set[str] = set()
    todo = [output]
    while todo:
        tensor = todo.pop()
        info = graph.tensor(tensor)
        if tensor in seen or info.is_const or tensor in graph.inputs:
            continue
        seen.add(tensor)
        if info.quant is not None:
            boundary.add(tensor)
            continue
        producer = graph.producer(tensor)
        todo.extend(t for t in (producer.inputs if producer is not None else ()) if t)
    return boundary


def view_source(views: dict[str, str], tensor: str) -> str:
    """The tensor a chain holds for `tensor`: itself, or the source of the views it is made by."""
    while tensor in views:
        tensor = views[tensor]
    return tensor


def held_tensors(graph: Graph, members: list[Group], views: dict[str, str] | None = None) -> dict[str, tuple[int, int]]:
    """{tensor: (index of its producer, index of its last reader)} of the tensors a chain holds:
    made by one member and read by a later one (directly or through the chain's `views`)."""
    views = views or {}
    made = {t: i for i, g in enumerate(members) for n in g.nodes for t in n.outputs
            if t and graph.tensor(t).quant is not None and graph.tensor(t).quant.storage != "int32"}
    held: dict[str, tuple[int, int]] = {}
    for i, g in enumerate(members):
        for t in (view_source(views, t) for n in g.nodes for t in n.inputs if t):
            if t in made and made[t] < i:
                held[t] = (made[t], max(i, held.get(t, (0, 0))[1]))
    return held


def held_layout(lifetimes: dict[str, tuple[int, int]], sizes: dict[str, int], align: int) -> tuple[dict[str, int], int]:
    """Offsets of held tensors (first fit over their lifetimes, in member order: a tensor's space is
    free again for the members after its last reader) and the extent they span."""
    pool = FirstFit(0, align)
    offsets: dict[str, int] = {}
    for i in range(max((b for _, b in lifetimes.values()), default=-1) + 1):
        for t, (_, last) in sorted(lifetimes.items()):
            if last == i - 1:
                pool.release(offsets[t], sizes[t])
        for t, (first, _) in sorted(lifetimes.items()):
            if first == i:
                offsets[t] = pool.alloc(sizes[t])
    return offsets, pool.end


def held_placement(graph: Graph, lifetimes: dict[str, tuple[int, int]], chip) -> tuple[dict[str, int], int]:
    """held_layout of held tensors at their held_bytes sizes: (offsets, extent)."""
    sizes = {t: held_bytes(graph, t, chip.lanes) for t in lifetimes}
    return held_layout(lifetimes, sizes, chip.core.lmem_align_bytes)


def held_bytes(graph: Graph, tensor: str, lanes: int) -> int:
    """Bytes per lane of a held int8 tensor in its held_view (aligned: 64-element rows of each channel plane)."""
    n, c, h, w = held_view(graph.tensor(tensor).shape)
    return n * -(-c // lanes) * -(-(h * w) // 64) * 64


def held_peak(graph: Graph, members: list[Group], lanes: int, views: dict[str, str] | None = None) -> int:
    """The most bytes per lane the chain's held tensors take at once."""
    held = held_tensors(graph, members, views)
    return max((sum(held_bytes(graph, t, lanes) for t, (a, b) in held.items() if a <= i <= b)
                for i in range(len(members))), default=0)


def chain_reserve(graph: Graph, groups: list[Group], chip) -> dict[int, int]:
    """{index of a QuantChain: the per-lane LMEM extent of the tensors it holds} (held_placement): what the
    layer groups' residents leave free while it runs, so it can still hold them (else its members run
    one by one through DDR)."""
    return {i: held_placement(graph, held_tensors(graph, group.members, group.views), chip)[1]
            for i, group in enumerate(groups) if isinstance(group, QuantChain)}


def _fused_after(graph: Graph, node: OpNode) -> list[OpNode]:
    """The bias Add of a MatMul's int32 accumulator, then one Relu / Clip on the 8-bit result (none after a
    Conv's int32 result: ConvInteger's)."""
    fused, value = [], node.outputs[0]
    if graph.tensor(value).dtype == "int32" and node.op_type == "Conv":
        return []
    if graph.tensor(value).dtype == "int32":
        fused.append(graph.consumers(value)[0])
        value = fused[-1].outputs[0]
    users = graph.consumers(value)
    if (len(users) == 1 and value not in graph.outputs and users[0].op_type in ACTIVATIONS
            and graph.tensor(users[0].outputs[0]).quant is not None):
        fused.append(users[0])
    return fused


def _stored(graph: Graph, group: Group) -> list[str]:
    """The group's outputs read outside it (or graph outputs): they get DDR buffers."""
    inside = {n.name for n in group.nodes}
    return [t for n in group.nodes for t in n.outputs
            if t and (t in graph.outputs or any(c.name not in inside for c in graph.consumers(t)))]
