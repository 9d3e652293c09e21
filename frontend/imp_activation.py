"""Importers of activations built from canonical elementwise ops: PRelu, Elu, Selu, Celu, Gelu,
Mish, Softplus, Softsign (min(x, 0) is -relu(-x) throughout)."""

from __future__ import annotations

import math

from tpuflow.frontend.onnx_view import ONode
from tpuflow.frontend.ops import OpKind
from tpuflow.frontend.registry import importer
from tpuflow.frontend.rewrite import Rewriter

K = OpKind


@importer("PRelu")
def prelu(node: ONode, ctx) -> None:
    """A scalar constant slope is LeakyRelu; otherwise relu(x) - slope * relu(-x)."""
    x, slope, y = node.input(0), node.input(1), node.outputs[0]
    value = ctx.const(slope)
    if value is not None and value.size == 1:
        ctx.emit(K.LEAKY_RELU, (x,), (y,), alpha=float(value.reshape(-1)[0]))
        return
    rw = Rewriter(ctx)
    negative = rw.mul(rw.relu(rw.neg(x)), slope)
    rw.sub(rw.relu(x), negative, out=y)


def _exp_minus_one_of_negative_part(rw: Rewriter, x: str, inner_scale: float = 1.0) -> str:
    """exp(min(x, 0) * inner_scale) - 1 (zero for x >= 0)."""
    m = rw.min0(x)
    if inner_scale != 1.0:
        m = rw.mul(m, inner_scale)
    return rw.sub(rw.unary(K.EXP, m), 1.0)


@importer("Elu")
def elu(node: ONode, ctx) -> None:
    x, y = node.input(0), node.outputs[0]
    alpha = float(node.attr("alpha", 1.0))
    rw = Rewriter(ctx)
    rw.add(rw.relu(x), rw.mul(_exp_minus_one_of_negative_part(rw, x), alpha), out=y)


@importer("Selu")
def selu(node: ONode, ctx) -> None:
    x, y = node.input(0), node.outputs[0]
    alpha = float(node.attr("alpha", 1.67326319217681884765625))
    gamma = float(node.attr("gamma", 1.05070102214813232421875))
    rw = Rewriter(ctx)
    inner = rw.add(rw.relu(x), rw.mul(_exp_minus_one_of_negative_part(rw, x), alpha))
    rw.mul(inner, gamma, out=y)


@importer("Celu")
def celu(node: ONode, ctx) -> None:
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1)) = relu(x) + alpha * (exp(min(x, 0) / alpha) - 1)."""
    x, y = node.input(0), node.outputs[0]
    alpha = float(node.attr("alpha", 1.0))
    rw = Rewriter(ctx)
    rw.add(rw.relu(x), rw.mul(_exp_minus_one_of_negative_part(rw, x, 1.0 / alpha), alpha), out=y)


@importer("Gelu")
def gelu(node: ONode, ctx) -> None:
    """approximate='none': x/2 (1 + erf(x / sqrt 2)); 'tanh': x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    x, y = node.input(0), node.outputs[0]
    rw = Rewriter(ctx)
    if node.attr("approximate", "none") == "tanh":
        cube = rw.mul(rw.mul(x, x), x)
        inner = rw.mul(rw.add(x, rw.mul(cube, 0.044715)), math.sqrt(2.0 / math.pi))
        t = rw.unary(K.TANH, inner)
    else:
        t = rw.unary(K.ERF, rw.mul(x, 1.0 / math.sqrt(2.0)))
    half_x = rw.mul(x, 0.5)
    rw.mul(half_x, rw.add(t, 1.0), out=y)


def softplus_of(rw: Rewriter, x: str, out: str | None = None) -> str:
    """log(1 + exp(x)) without overflow: relu(x) + log(1 + exp(-|x|))."""
    tail = rw.unary(K.LOG, rw.add(rw.unary(K.EXP, rw.neg(rw.unary(K.ABS, x))), 1.0))
    return rw.add(rw.relu(x), tail, out=out)


@importer("Softplus")
def softplus(node: ONode, ctx) -> None:
    softplus_of(Rewriter(ctx), node.input(0), out=node.outputs[0])


@importer("Mish")
def mish(node: ONode, ctx) -> None:
    x, y = node.input(0), node.outputs[0]
    rw = Rewriter(ctx)
    rw.mul(x, rw.unary(K.TANH, softplus_of(rw, x)), out=y)


@importer("Softsign")
def softsign(node: ONode, ctx) -> None:
    x, y = node.input(0), node.outputs[0]
    rw = Rewriter(ctx)
    rw.div(x, rw.add(rw.unary(K.ABS, x), 1.0), out=y)
