"""LSTM, GRU and RNN unrolled at compile time into MatMul / Add / Mul / activations / Slice / Concat /
Reshape: the input projection of every step is one MatMul per gate (all steps at once, biases folded
in), each step adds one MatMul per gate with the recurrent weights. Forward, reverse and bidirectional;
layout 0 and 1; initial states constant or runtime; sequence_lens absent (or all equal to T)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tpuflow.frontend.onnx_view import ONode
from tpuflow.frontend.ops import OpKind
from tpuflow.frontend.registry import Facts, importer
from tpuflow.frontend.rewrite import Rewriter

K = OpKind
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}
USES_ALPHA = {"leakyrelu": 0.01, "hardsigmoid": 0.2, "affine": 1.0, "scaledtanh": 1.0, "elu": 1.0}
USES_BETA = {"hardsigmoid": 0.5, "affine": 0.0, "scaledtanh": 1.0}
SUPPORTED = {"sigmoid", "tanh", "relu", "softsign", "softplus"} | set(USES_ALPHA)


@dataclass
class Act:
    name: str
    alpha: float | None = None
    beta: float | None = None

    def apply(self, rw: Rewriter, x: str) -> str:
        n = self.name
        if n in ("sigmoid", "tanh", "relu"):
            return rw.unary({"sigmoid": K.SIGMOID, "tanh": K.TANH, "relu": K.RELU}[n], x)
        if n == "leakyrelu":
            return rw.unary(K.LEAKY_RELU, x, alpha=self.alpha)
        if n == "hardsigmoid":
            return rw.unary(K.HARD_SIGMOID, x, alpha=self.alpha, beta=self.beta)
        if n == "affine":
            return rw.add(rw.mul(x, self.alpha), self.beta)
        if n == "scaledtanh":
            return rw.mul(rw.unary(K.TANH, rw.mul(x, self.beta)), self.alpha)
        if n == "softsign":
            return rw.div(x, rw.add(rw.unary(K.ABS, x), 1.0))
        if n == "softplus":
            from tpuflow.frontend.imp_activation import softplus_of
            return softplus_of(rw, x)
        m = rw.min0(x)                                                # elu
        return rw.add(rw.relu(x), rw.mul(rw.sub(rw.unary(K.EXP, m), 1.0), self.alpha))


def activations(node: ONode, directions: int) -> list[list[Act]] | str:
    """Per direction, the activation functions with their alpha / beta; or why they are unsupported."""
    names = [str(a) for a in node.attr("activations") or DEFAULT_ACTIVATIONS[node.op_type] * directions]
    alphas, betas = list(node.attr("activation_alpha") or []), list(node.attr("activation_beta") or [])
    acts = []
    for name in names:
        key = name.lower()
        if key not in SUPPORTED:
            return f"activation {name}"
        alpha = (alphas.pop(0) if alphas else USES_ALPHA[key]) if key in USES_ALPHA else None
        beta = (betas.pop(0) if betas else USES_BETA[key]) if key in USES_BETA else None
        acts.append(Act(key, alpha, beta))
    per = len(acts) // directions
    return [acts[d * per:(d + 1) * per] for d in range(directions)]


def _check(node: ONode, facts: Facts) -> str | None:
    if node.input(4) and not facts.is_const(node.input(4)):
        return "runtime sequence_lens"
    if node.op_type == "LSTM" and node.attr("input_forget", 0):
        return "input_forget"
    return None


class Unroller:
    """One RNN-family node unrolled: shared state and the per-direction step loop."""

    def __init__(self, node: ONode, ctx):
        self.node, self.ctx, self.rw = node, ctx, Rewriter(ctx, ctx.dtype(node.input(0)))
        self.kind = node.op_type
        self.gates = GATES[self.kind]
        self.layout = int(node.attr("layout", 0))
        x = node.input(0)
        shape = ctx.shape(x)
        self.steps, self.batch = (shape[1], shape[0]) if self.layout else (shape[0], shape[1])
        self.hidden = int(node.attr("hidden_size"))
        self.dirs = 2 if node.attr("direction", "forward") == "bidirectional" else 1
        self.clip = node.attr("clip")
        self.w, self.r = ctx.const(node.input(1)), ctx.const(node.input(2))
        b = ctx.const(node.input(3)) if node.input(3) else None
        self.b = np.zeros((self.dirs, 2 * self.gates * self.hidden), self.w.dtype) if b is None else b

    def wanted(self, i: int) -> str | None:
        name = self.node.outputs[i] if i < len(self.node.outputs) else ""
        return name if name and name in self.ctx.draft.tensors else None

    def initial(self, i: int, d: int) -> str | None:
        """Initial state i (5: h, 6: c) of direction d as [B, H] (layout 0: [1, B, H]), or None for zeros."""
        name = self.node.input(i)
        if not name:
            return None
        rw = self.rw
        if self.layout:
            return rw.reshape(rw.slice(name, 1, d, d + 1), (self.batch, self.hidden))
        return rw.slice(name, 0, d, d + 1)          # [1, B, H]: broadcasts, and needs no view of an input

    def projection(self, d: int) -> list[str]:
        """Per gate, X W_g^T + biases for every step: [T, B, H] (layout 0) or [B, T, H], so each
        step's input is one contiguous Slice."""
        rw, h, g = self.rw, self.hidden, self.gates
        x = self.node.input(0)
        dims = self.ctx.shape(x)
        flat = rw.reshape(x, (dims[0] * dims[1], dims[2]))
        wb, rb = self.b[d, :g * h].astype(np.float64), self.b[d, g * h:].astype(np.float64)
        bias = wb + rb
        if self.kind == "GRU" and self.node.attr("linear_before_reset", 0):
            bias[2 * h:] = wb[2 * h:]                      # Rb_h stays inside r * (...)
        gates = []
        for k in range(g):
            weights = rw.const(self.w[d, k * h:(k + 1) * h].T.copy())
            xw = rw.add(rw.matmul(flat, weights), rw.const(bias[k * h:(k + 1) * h]))
            gates.append(rw.reshape(xw, (dims[0], dims[1], h)))
        return gates

    def step_input(self, xw: list[str], t: int, gate: int) -> str:
        taken = self.rw.slice(xw[gate], 1 if self.layout else 0, t, t + 1)
        return self.rw.reshape(taken, (self.batch, self.hidden))

    def recurrent(self, state: str | None, d: int, gate: int) -> str | None:
        if state is None:
            return None
        h = self.hidden
        return self.rw.matmul(state, self.rw.const(self.r[d, gate * h:(gate + 1) * h].T.copy()))

    def pre(self, parts: list[str | None]) -> str:
        """Sum of the non-None parts, clipped when the node says so."""
        rw = self.rw
        live = [p for p in parts if p is not None]
        total = live[0]
        for p in live[1:]:
            total = rw.add(total, p)
        if self.clip is not None:
            total = rw.unary(K.CLIP, total, min=-float(self.clip), max=float(self.clip))
        return total

    def run(self) -> None:
        acts = activations(self.node, self.dirs)
        if isinstance(acts, str):
            self.ctx.unsupported(acts)
            return
        seq = self.ctx.const(self.node.input(4)) if self.node.input(4) else None
        if seq is not None and not np.all(seq == self.steps):
            self.ctx.unsupported("sequence_lens shorter than the sequence")
            return
        reverse = self.node.attr("direction", "forward") == "reverse"
        results = []
        for d in range(self.dirs):
            order = range(self.steps - 1, -1, -1) if (reverse or d == 1) else range(self.steps)
            step = getattr(self, f"_{self.kind.lower()}_step")
            results.append(self.direction(d, list(order), acts[d], step))
        self.outputs(results)

    def direction(self, d: int, order: list[int], acts: list[Act], step) -> tuple[list[str], str, str | None]:
        xw = self.projection(d)
        h, c = self.initial(5, d), self.initial(6, d) if self.kind == "LSTM" else None
        hs: dict[int, str] = {}
        for t in order:
            h, c = step(xw, t, d, h, c, acts)
            hs[t] = h
        return [hs[t] for t in range(self.steps)], h, c

    def _lstm_step(self, xw, t, d, h, c, acts):
        rw, f, g, hact = self.rw, acts[0], acts[1], acts[2]
        peep = self.ctx.const(self.node.input(7)) if self.node.input(7) else None
        def peephole(k: int, cell):
            if peep is None or cell is None:
                return None
            return rw.mul(cell, rw.const(peep[d, k * self.hidden:(k + 1) * self.hidden]))
        gate = lambda k, extra=None: self.pre([self.step_input(xw, t, k), self.recurrent(h, d, k), extra])
        i = f.apply(rw, gate(0, peephole(0, c)))
        fg = f.apply(rw, gate(2, peephole(2, c)))
        cand = g.apply(rw, gate(3))
        new_c = rw.mul(i, cand) if c is None else rw.add(rw.mul(fg, c), rw.mul(i, cand))
        o = f.apply(rw, gate(1, peephole(1, new_c)))
        return rw.mul(o, hact.apply(rw, new_c)), new_c

    def _gru_step(self, xw, t, d, h, c, acts):
        rw, f, g, hid = self.rw, acts[0], acts[1], self.hidden
        z = f.apply(rw, self.pre([self.step_input(xw, t, 0), self.recurrent(h, d, 0)]))
        r = f.apply(rw, self.pre([self.step_input(xw, t, 1), self.recurrent(h, d, 1)]))
        rb_h = self.b[d, 3 * hid + 2 * hid:3 * hid + 3 * hid]
        if h is None:
            hidden_part = None
            if self.node.attr("linear_before_reset", 0):
                hidden_part = rw.mul(r, rw.const(rb_h))
        elif self.node.attr("linear_before_reset", 0):
            hidden_part = rw.mul(r, rw.add(self.recurrent(h, d, 2), rw.const(rb_h)))
        else:
            hidden_part = self.recurrent(rw.mul(r, h), d, 2)
        cand = g.apply(rw, self.pre([self.step_input(xw, t, 2), hidden_part]))
        if h is None:                                  # (1 - z) * cand
            return rw.sub(cand, rw.mul(z, cand)), None
        return rw.add(cand, rw.mul(z, rw.sub(h, cand))), None

    def _rnn_step(self, xw, t, d, h, c, acts):
        return acts[0].apply(self.rw, self.pre([self.step_input(xw, t, 0), self.recurrent(h, d, 0)])), None

    def outputs(self, results) -> None:
        rw, b, hid = self.rw, self.batch, self.hidden
        y = self.wanted(0)
        if y:
            if self.layout:
                per_dir = [rw.concat([rw.reshape(h, (b, 1, 1, hid)) for h in hs], 1) for hs, _, _ in results]
                self._join(per_dir, 2, y)
            else:
                per_dir = [rw.concat([rw.reshape(h, (1, 1, b, hid)) for h in hs], 0) for hs, _, _ in results]
                self._join(per_dir, 1, y)
        for pos, idx in ((1, 1), (2, 2)):
            name = self.wanted(pos)
            if name:
                last = [r[idx] for r in results]
                shape = (b, 1, hid) if self.layout else (1, b, hid)
                self._join([rw.reshape(v, shape) for v in last], 1 if self.layout else 0, name)

    def _join(self, parts: list[str], axis: int, out: str) -> None:
        if len(parts) == 1:
            self.rw.reshape(parts[0], self.ctx.shape(out), out=out)
        else:
            self.rw.concat(parts, axis, out=out)


@importer("LSTM", "GRU", "RNN", check=_check,
          const_inputs=((1, "W"), (2, "R"), (3, "B"), (4, "sequence_lens"), (7, "peepholes")))
def recurrent(node: ONode, ctx) -> None:
    Unroller(node, ctx).run()
