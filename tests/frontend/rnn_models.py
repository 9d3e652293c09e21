"""One-node LSTM / GRU / RNN models with seeded weights for the unrolling tests."""

from __future__ import annotations

import numpy as np
from op_models import node_model, weights

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def rnn_model(op: str, steps=3, batch=2, inputs=4, hidden=5, direction="forward", layout=0, bias=True,
              init=None, peepholes=False, seq=False, outputs=3, seed=0, **attrs):
    """`init`: None (zero states), 'const' or 'runtime' initial states; runtime ones are inputs h0 / c0."""
    rng = np.random.default_rng(seed)
    g, dirs = GATES[op], 2 if direction == "bidirectional" else 1
    ins = {"x": (batch, steps, inputs) if layout else (steps, batch, inputs)}
    consts = {"W": weights(rng, dirs, g * hidden, inputs), "R": weights(rng, dirs, g * hidden, hidden)}
    order = ["x", "W", "R", "B" if bias else "", "seq" if seq else ""]
    if bias:
        consts["B"] = weights(rng, dirs, 2 * g * hidden)
    if seq:
        consts["seq"] = np.full(batch, steps, np.int32)
    state = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    for name in ("h0", "c0") if op == "LSTM" else ("h0",):
        if init == "const":
            consts[name] = weights(rng, *state)
        elif init == "runtime":
            ins[name] = state
        order.append(name if init else "")
    if op == "LSTM" and peepholes:
        consts["P"] = weights(rng, dirs, 3 * hidden)
        order.append("P")
    while order[-1] == "":
        order.pop()
    count = min(outputs, 3 if op == "LSTM" else 2)
    return node_model(op, ins, consts, opset=14, outputs=count, order=order, hidden_size=hidden,
                      direction=direction, layout=layout, **attrs)
