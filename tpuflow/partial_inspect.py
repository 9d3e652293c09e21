"""`tpuflow inspect` of a model the frontend rejects: what is known without importing it, unsupported nodes marked.

The frontend refuses a model with unsupported operators before importing anything, so there is no
Graph to count MACs on. This summary reads the same ONNX view instead: inputs and outputs, every
node with its inferred output shape and constant parameters, the op counts, and which nodes are
unsupported and why. It has no MAC count and no lower bound (JSON: `macs` and `lower_bound_us` are
null). `tpuflow inspect` prints it and then exits 2 with the unsupported-operator error; with
--json these keys join the error document ({"ok": false, "error": {...}, ...}). JSON keys: model, chip, chip_fingerprint, dtype, supported (false), unsupported ({op key:
[node, ...]}, as in the error), unsupported_in_subgraphs (nodes of that list not at the top level,
e.g. inside If branches), inputs / outputs ([{name, shape, dtype}], a symbolic dimension as its
name), params, weight_bytes, ops, layers ([{name, op, output_shape, params, weight_bytes,
supported, reason}]), notes (why shapes may be missing), macs, lower_bound_us.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from onnx import helper

from tpuflow.chip import ChipConfig
from tpuflow.errors import TpuflowError, UnsupportedOpError
from tpuflow.options import DTYPE_ALIASES

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
MAX_TEXT_LAYERS = 400


def _view(model: Any, input_shapes) -> tuple[Any, list[str]]:
    """The model's ONNX view, folded and shape-inferred as far as it goes (notes say where it stopped)."""
    from tpuflow.frontend import folding, reader
    from tpuflow.frontend.onnx_view import infer_types
    proto, label = reader.read_model(model)
    name = Path(model).stem if isinstance(model, (str, Path)) else (proto.graph.name or label)
    view = reader.view_of(proto, label, name)
    notes = []
    steps = (("initializers", view.load_constants), ("input shapes", lambda: reader.fix_input_shapes(view, input_shapes)),
             ("shape inference", lambda: infer_types(view, declared=True)),
             ("constant folding", lambda: folding.fold_constants(view)))
    for what, run in steps:                      # each step as far as it goes; a failure is a note
        try:
            run()
        except TpuflowError as exc:
            notes.append(f"{what}: {exc}")
        except Exception as exc:  # noqa: BLE001 - an op tpuflow does not know may break folding; say so
            notes.append(f"{what} stopped: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
    return view, notes


def _dims(view, name: str) -> list:
    if name in view.consts:
        return list(view.consts[name].shape)
    dims = view.types.get(name, (None, 0))[0]
    if dims is None and name in view.inputs:
        dims = view.inputs[name][0]
    return ["?"] if dims is None else [d if d is not None else "?" for d in dims]


def _io(view, names) -> list[dict[str, Any]]:
    out = []
    for n in names:
        elem = view.types.get(n, view.inputs.get(n, (None, 0)))[1]
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem)).name if elem else "?"
        out.append({"name": n, "shape": _dims(view, n), "dtype": dtype})
    return out


def partial_summary(model: Any, input_shapes, chip: ChipConfig, dtype: str, error: UnsupportedOpError) -> dict:
    """The inspect summary of a rejected model (see the module docstring for its keys)."""
    view, notes = _view(model, input_shapes)
    dtype = DTYPE_ALIASES.get(dtype, dtype)
    reason = {node: key for key, nodes in error.unsupported.items() for node in nodes}
    top_level = {n.name for n in view.proto.graph.node} | {n.name for n in view.nodes}
    rows, ops = [], {}
    for node in view.nodes:
        op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        params = sum(int(view.consts[t].size) for t in node.inputs if t in view.consts)
        rows.append({"name": node.name, "op": op, "output_shape": _dims(view, node.outputs[0]) if node.outputs else [],
                     "params": params, "weight_bytes": params * DTYPE_BYTES.get(dtype, 4),
                     "supported": node.name not in reason, "reason": reason.get(node.name)})
        ops[op] = ops.get(op, 0) + 1
    return {
        "model": view.name, "chip": chip.name, "chip_fingerprint": chip.fingerprint(), "dtype": dtype,
        "supported": False, "unsupported": error.unsupported,
        "unsupported_in_subgraphs": sorted(n for n in reason if n not in top_level),
        "inputs": _io(view, view.inputs), "outputs": _io(view, view.outputs),
        "params": sum(r["params"] for r in rows), "weight_bytes": sum(r["weight_bytes"] for r in rows),
        "ops": dict(sorted(ops.items(), key=lambda kv: -kv[1])), "layers": rows, "notes": notes,
        "macs": None, "lower_bound_us": None,
    }


def _shape(shape) -> str:
    return "x".join(str(d) for d in shape) or "scalar"


def _names(names: list[str], shown: int = 5) -> str:
    return ", ".join(names[:shown]) + (f", ... ({len(names)} nodes)" if len(names) > shown else "")


def format_partial(s: dict) -> str:
    """The text form: header, per-node table with UNSUPPORTED marks, op counts, what is unsupported."""
    from tpuflow.frontend.summary import si
    ios = lambda items: ", ".join(f"{t['name']} {_shape(t['shape'])} {t['dtype']}" for t in items)  # noqa: E731
    bad = sum(not r["supported"] for r in s["layers"])
    lines = [f"model {s['model']}: {len(s['layers'])} ops, {bad} unsupported (marked below; compile, estimate and "
             f"verify reject this model); inputs {ios(s['inputs'])}; outputs {ios(s['outputs'])}",
             f"chip {s['chip']} (fingerprint {s['chip_fingerprint']}), dtype {s['dtype']}", ""]
    shown = s["layers"][:MAX_TEXT_LAYERS]
    rows = [(r["name"], r["op"], _shape(r["output_shape"]), si(r["params"]), si(r["weight_bytes"], "B"),
             "" if r["supported"] else f"UNSUPPORTED {r['reason']}") for r in shown]
    widths = [max(len(str(r[i])) for r in [("layer", "op", "output", "params", "weights", ""), *rows]) for i in range(6)]
    for row in [("layer", "op", "output", "params", "weights", ""), *rows]:
        lines.append("  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip())
    if len(s["layers"]) > len(shown):
        lines.append(f"... {len(s['layers']) - len(shown)} more layers (--json lists all)")
    lines += ["", f"total: {si(s['params'])} params, weights {si(s['weight_bytes'], 'B')}; no MAC count or lower "
              "bound (the model does not import)",
              "ops: " + ", ".join(f"{op} {n}" for op, n in s["ops"].items()),
              "unsupported: " + "; ".join(f"{op} ({_names(nodes)})" for op, nodes in s["unsupported"].items())]
    if s["unsupported_in_subgraphs"]:
        lines.append(f"  of which inside subgraphs (If/Loop bodies): {_names(s['unsupported_in_subgraphs'])}")
    lines += [f"note: {n}" for n in s["notes"]]
    return "\n".join(lines)
