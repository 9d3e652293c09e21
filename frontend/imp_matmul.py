"""Importers of matrix products: MatMul (numpy semantics) and Gemm (-> MatMul + Add of a bias)."""

from __future__ import annotations

import numpy as np

from tpuflow.frontend.onnx_view import ONode
from tpuflow.frontend.ops import OpKind
from tpuflow.frontend.registry import importer


@importer("MatMul")
def matmul(node: ONode, ctx) -> None:
    ctx.emit(OpKind.MATMUL, node.inputs[:2], node.outputs)


def _operand(ctx, name: str, transpose: bool, alpha: float | None, tag: str) -> tuple[str, bool]:
    """A Gemm operand in MatMul form. Constants absorb the transpose and (when `alpha` is given)
    the scale; a runtime operand gets a Transpose node. Returns (tensor, alpha_absorbed)."""
    value = ctx.const(name)
    if value is not None:
        if not transpose and alpha is None:
            return name, False
        m = value.T if transpose else value
        if alpha is not None:
            m = (m.astype(np.float64) * alpha).astype(value.dtype)
        return ctx.add_const(tag, np.require(m, requirements="C")), alpha is not None
    if not transpose:
        return name, False
    r, c = ctx.shape(name)
    out = ctx.temp(f"{tag}_t", (c, r), ctx.dtype(name))
    ctx.emit(OpKind.TRANSPOSE, (name,), (out,), suffix=f"transpose_{tag}", perm=(1, 0))
    return out, False


@importer("Gemm")
def gemm(node: ONode, ctx) -> None:
    """Y = alpha * A' B' + beta * C with A' = A^T if transA, B' = B^T if transB."""
    a, b, c, y = node.input(0), node.input(1), node.input(2), node.outputs[0]
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    scale = None if alpha == 1.0 else alpha
    b_in, absorbed = _operand(ctx, b, bool(node.attr("transB", 0)), scale, "B")
    a_in, absorbed_a = _operand(ctx, a, bool(node.attr("transA", 0)),
                                None if absorbed or scale is None or ctx.const(a) is None else scale, "A")
    absorbed = absorbed or absorbed_a
    dtype, shape = ctx.dtype(y), ctx.shape(y)
    steps = []                                    # (kind, inputs, suffix) applied in order
    if scale is not None and not absorbed:
        steps.append((OpKind.MUL, ctx.add_const("alpha", np.asarray(alpha, dtype)), "alpha"))
    if c and beta != 0.0:
        steps.append((OpKind.ADD, _bias(ctx, c, beta, dtype), "bias"))
    current = ctx.temp("matmul", shape, dtype) if steps else y
    ctx.emit(OpKind.MATMUL, (a_in, b_in), (current,))
    for i, (kind, operand, suffix) in enumerate(steps):
        out = y if i == len(steps) - 1 else ctx.temp(suffix, shape, dtype)
        ctx.emit(kind, (current, operand), (out,), suffix=suffix)
        current = out


def _bias(ctx, c: str, beta: float, dtype: str) -> str:
    value = ctx.const(c)
    if beta == 1.0:
        return c
    if value is not None:
        return ctx.add_const("C", (value.astype(np.float64) * beta).astype(value.dtype))
    out = ctx.temp("beta_c", ctx.shape(c), ctx.dtype(c))
    ctx.emit(OpKind.MUL, (c, ctx.add_const("beta", np.asarray(beta, dtype))), (out,), suffix="beta")
    return out
