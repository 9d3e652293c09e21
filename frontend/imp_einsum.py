"""Einsum as Transpose / Reshape / ReduceSum / MatMul: operands are contracted pairwise, each pair as
one batched MatMul [batch, free_a, k] @ [batch, k, free_b] (the equations exporters write:
attention 'bhqd,bhkd->bhqk', projections 'bld,dh->blh', batch matmuls, outer products, sums)."""

from __future__ import annotations

import math

from tpuflow.frontend.onnx_view import ONode
from tpuflow.frontend.ops import OpKind
from tpuflow.frontend.registry import importer
from tpuflow.frontend.rewrite import Rewriter

K = OpKind
ELLIPSIS_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


class EinsumError(ValueError):
    """An equation this rewrite does not handle (the message is the unsupported reason)."""


def parse(equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """Operand subscripts and output subscript, with '...' spelled out as capital letters."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise EinsumError("operand count")
    width = max([r - len(t.replace("...", "")) for t, r in zip(terms, ranks) if "..." in t] or [0])
    dots = ELLIPSIS_LETTERS[:width]
    spelled = []
    for t, r in zip(terms, ranks):
        if "..." in t:
            t = t.replace("...", dots[width - (r - len(t.replace("...", ""))):])
        if len(t) != r or len(set(t)) != len(t):
            raise EinsumError("repeated subscript (diagonal)" if len(set(t)) != len(t) else "rank")
        spelled.append(t)
    if arrow:
        out = rhs.replace("...", dots)
    else:
        letters = "".join(spelled)
        out = dots + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c not in dots))
    return spelled, out


class Contraction:
    """Tensors with their subscripts, reduced and multiplied until one is left in output order."""

    def __init__(self, rw: Rewriter, sizes: dict[str, int]):
        self.rw, self.sizes = rw, sizes

    def sum_out(self, t: str, subs: str, keep: set[str]) -> tuple[str, str]:
        gone = [i for i, c in enumerate(subs) if c not in keep]
        if not gone:
            return t, subs
        return self.rw.reduce(K.REDUCE_SUM, t, gone, keepdims=False), "".join(c for c in subs if c in keep)

    def arrange(self, t: str, subs: str, batch: str, groups: list[str]) -> str:
        """t transposed to batch + the groups' order and viewed as [batch..., one axis per group]."""
        order = batch + "".join(groups)
        moved = self.rw.transpose(t, [subs.index(c) for c in order])
        shape = tuple(self.sizes[c] for c in batch) + tuple(math.prod(self.sizes[c] for c in g) for g in groups)
        return self.rw.reshape(moved, shape)

    def pair(self, a: str, sa: str, b: str, sb: str, keep: set[str]) -> tuple[str, str]:
        rw = self.rw
        sa_set, sb_set = set(sa), set(sb)
        a, sa = self.sum_out(a, sa, sb_set | keep)
        b, sb = self.sum_out(b, sb, sa_set | keep)
        batch = "".join(c for c in sa if c in sb and c in keep)
        contract = "".join(c for c in sa if c in sb and c not in keep)
        free_a = "".join(c for c in sa if c not in sb)
        free_b = "".join(c for c in sb if c not in sa)
        if rw.ctx.const(a) is not None and rw.ctx.const(b) is None:
            a, sa, b, sb, free_a, free_b = b, sb, a, sa, free_b, free_a
        # without batch letters A keeps its free axes (numpy MatMul broadcasting): no flattening copy
        left = self.arrange(a, sa, free_a if not batch else batch, [contract] if not batch else [free_a, contract])
        right = self.arrange(b, sb, batch, [contract, free_b])
        product = rw.matmul(left, right)
        subs = batch + free_a + free_b
        return rw.reshape(product, tuple(self.sizes[c] for c in subs)), subs


def _sizes(terms: list[str], shapes: list[tuple[int, ...]]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for t, shape in zip(terms, shapes):
        for c, d in zip(t, shape):
            if sizes.setdefault(c, d) != d:
                raise EinsumError(f"subscript {c} has sizes {sizes[c]} and {d} (broadcast)")
    return sizes


def rewrite(rw: Rewriter, equation: str, inputs: list[str], y: str) -> None:
    shapes = [rw.shape(t) for t in inputs]
    terms, out = parse(equation, [len(s) for s in shapes])
    sizes = _sizes(terms, shapes)
    c = Contraction(rw, sizes)
    current, subs = inputs[0], terms[0]
    for i in range(1, len(inputs)):
        later = set(out) | set("".join(terms[i + 1:]))
        current, subs = c.pair(current, subs, inputs[i], terms[i], later)
    current, subs = c.sum_out(current, subs, set(out))
    result = rw.transpose(current, [subs.index(ch) for ch in out])
    rw.reshape(result, rw.shape(y), out=y)


@importer("Einsum")
def einsum(node: ONode, ctx) -> None:
    rw = Rewriter(ctx)
    try:
        rewrite(rw, str(node.attr("equation")), list(node.inputs), node.outputs[0])
    except EinsumError as exc:
        ctx.unsupported(f"equation '{node.attr('equation')}': {exc}")
