"""Importers of ops lowered by their own TIU/GDMA kernels: comparisons, logic, Where on a live
condition, rounding, Sign, Mod, Sin/Cos, ThresholdedRelu."""

from __future__ import annotations

from tpuflow.frontend.onnx_view import ONode
from tpuflow.frontend.ops import OpKind
from tpuflow.frontend.registry import IMPORTERS, Importer, importer

K = OpKind
SAME = {k.value: k for k in (K.EQUAL, K.LESS, K.GREATER, K.LESS_OR_EQUAL, K.GREATER_OR_EQUAL, K.NOT, K.AND,
                             K.OR, K.XOR, K.FLOOR, K.CEIL, K.ROUND, K.SIGN, K.SIN, K.COS)}


@importer(*SAME)
def same_name(node: ONode, ctx) -> None:
    ctx.emit(SAME[node.op_type], node.inputs, node.outputs)


@importer("Mod")
def mod(node: ONode, ctx) -> None:
    """fmod = 0 (integers: the result takes the divisor's sign) or 1 (C fmod: the dividend's)."""
    ctx.emit(K.MOD, node.inputs, node.outputs, fmod=int(node.attr("fmod", 0)))


@importer("ThresholdedRelu")
def thresholded_relu(node: ONode, ctx) -> None:
    ctx.emit(K.THRESHOLDED_RELU, node.inputs, node.outputs, alpha=float(node.attr("alpha", 1.0)))


def where(node: ONode, ctx) -> None:
    """Where(condition, x, y): the condition may be a runtime tensor (a compare-select on TIU)."""
    ctx.emit(K.WHERE, node.inputs, node.outputs)


# Where's condition no longer has to be constant: this importer replaces the constant-condition one.
IMPORTERS["Where"] = Importer(where)
