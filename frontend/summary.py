"""The `tpuflow inspect` summary: per-layer rows, totals and the roofline bound, as a dict and as text.

JSON keys (stable): model, chip, chip_fingerprint, dtype, inputs / outputs ([{name, shape, dtype}]),
macs, vector_ops, params, weight_bytes, activation_bytes, input_bytes, output_bytes,
compulsory_bytes, ops (op type -> count), peak_macs_per_second, int8_macs (MACs of products of
quantized tensors, counted at int8_peak_macs_per_second; quantized tensors count at their stored
size), int8_peak_macs_per_second, ddr_peak_bytes_per_second,
compute_bound_us, memory_bound_us, lower_bound_us, bound ("compute" | "memory"), and layers: one
row per node {name, op, output_shape, macs, vector_ops, params, weight_bytes, activation_bytes,
lower_bound_us, bound, quant}, where a layer's bound uses its own weights + inputs + outputs as traffic;
`quant` says how its output and constant inputs are quantized ("" in float graphs), and the top-level
`quantized` lists every quantized tensor {name, dtype, granularity (per-tensor | per-channel), axis,
const} (empty for float models; frontend/quant.py says what they mean).
"""

from __future__ import annotations

from typing import Any

from tpuflow.chip import ChipConfig
from tpuflow.frontend.graph import Graph
from tpuflow.frontend.stats import compute_dtype, graph_stats, layer_stats, roofline

MAX_TEXT_LAYERS = 400


def _io(graph: Graph, names: list[str]) -> list[dict[str, Any]]:
    return [{"name": n, "shape": list(graph.tensor(n).shape), "dtype": graph.tensor(n).dtype} for n in names]


def inspect_summary(graph: Graph, chip: ChipConfig, dtype: str) -> dict[str, Any]:
    dtype = compute_dtype(dtype)
    layers = layer_stats(graph, dtype)
    totals = graph_stats(graph, layers, dtype)
    int8_macs = [l.macs if _quantized_product(graph, node) else 0 for l, node in zip(layers, graph.nodes())]
    bound = roofline(totals.macs, totals.compulsory_bytes, chip, dtype, sum(int8_macs))
    rows = []
    for l, node, int8 in zip(layers, graph.nodes(), int8_macs):
        r = roofline(l.macs, l.weight_bytes + l.activation_bytes, chip, dtype, int8)
        rows.append({"name": l.name, "op": l.op_type, "output_shape": list(l.output_shape), "macs": l.macs,
                     "vector_ops": l.vector_ops, "params": l.params, "weight_bytes": l.weight_bytes,
                     "activation_bytes": l.activation_bytes, "lower_bound_us": r.lower_bound_s * 1e6,
                     "bound": r.bound, "quant": _layer_quant(graph, node)})
    return {
        "model": graph.name, "chip": chip.name, "chip_fingerprint": chip.fingerprint(), "dtype": dtype,
        "inputs": _io(graph, graph.inputs), "outputs": _io(graph, graph.outputs),
        "macs": totals.macs, "vector_ops": totals.vector_ops, "params": totals.params,
        "weight_bytes": totals.weight_bytes, "activation_bytes": totals.activation_bytes,
        "input_bytes": totals.input_bytes, "output_bytes": totals.output_bytes,
        "compulsory_bytes": totals.compulsory_bytes, "ops": totals.ops,
        "peak_macs_per_second": chip.peak_macs_per_second(dtype), "int8_macs": sum(int8_macs),
        "int8_peak_macs_per_second": chip.peak_macs_per_second("int8"),
        "ddr_peak_bytes_per_second": chip.ddr_peak_bytes_per_second,
        "compute_bound_us": bound.compute_s * 1e6, "memory_bound_us": bound.memory_s * 1e6,
        "lower_bound_us": bound.lower_bound_s * 1e6, "bound": bound.bound, "layers": rows,
        "quantized": _quantized_tensors(graph),
    }


def _quantized_product(graph: Graph, node) -> bool:
    """A Conv / MatMul on quantized tensors: the chip computes it at its int8 rate."""
    return node.op_type in ("Conv", "MatMul") and graph.tensor(node.inputs[0]).quant is not None


def _layer_quant(graph: Graph, node) -> str:
    """'uint8 per-tensor; w int8 per-channel(axis 0, 64); b int32 ...' for a node on quantized tensors."""
    out = graph.tensor(node.outputs[0]).quant
    parts = [out.describe()] if out else []
    consts = [graph.tensor(t).quant for t in node.inputs[1:] if graph.tensor(t).is_const and graph.tensor(t).quant]
    parts += [f"{'b' if q.storage == 'int32' else 'w'} {q.describe()}" for q in consts]
    return "; ".join(parts)


def _quantized_tensors(graph: Graph) -> list[dict[str, Any]]:
    return [{"name": t.name, "dtype": t.dtype, "granularity": "per-channel" if t.quant.per_channel else "per-tensor",
             "axis": t.quant.axis, "const": t.is_const} for t in graph.tensors.values() if t.quant is not None]


def si(value: float, unit: str = "") -> str:
    """1234567 -> '1.23 M' (decimal prefixes)."""
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}".rstrip()


def us(value: float) -> str:
    return f"{value:.1f} us" if value >= 10 else f"{value:.3g} us"


def _shape(shape) -> str:
    return "x".join(str(d) for d in shape) or "scalar"


def _table(rows: list[tuple], header: tuple) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return ["  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip() for r in [header, *rows]]


def format_summary(s: dict[str, Any]) -> str:
    ios = lambda items: ", ".join(f"{t['name']} {_shape(t['shape'])} {t['dtype']}" for t in items)  # noqa: E731
    lines = [f"model {s['model']}: {len(s['layers'])} ops; inputs {ios(s['inputs'])}; outputs {ios(s['outputs'])}",
             f"chip {s['chip']} (fingerprint {s['chip_fingerprint']}), dtype {s['dtype']}"
             + (f" (the rest {s['float_rest']})" if s.get("float_rest") else ""), *_quantization_lines(s), ""]
    shown = s["layers"][:MAX_TEXT_LAYERS]
    rows = [(l["name"], l["op"], _shape(l["output_shape"]), si(l["macs"]), si(l["params"]), si(l["weight_bytes"], "B"),
             si(l["activation_bytes"], "B"), f"{l['lower_bound_us']:.3g}", l["bound"]) for l in shown]
    header = ("layer", "op", "output", "MACs", "params", "weights", "activations", "bound us", "by")
    if s["quantized"]:
        rows = [r + (l["quant"],) for r, l in zip(rows, shown)]
        header += ("quantized",)
    lines += _table(rows, header)
    if len(s["layers"]) > len(shown):
        lines.append(f"... {len(s['layers']) - len(shown)} more layers (--json lists all)")
    lines += ["", f"total: {si(s['macs'], 'MAC')}s, {si(s['params'])} params, weights {si(s['weight_bytes'], 'B')}, "
              f"activations {si(s['activation_bytes'], 'B')}, vector ops {si(s['vector_ops'])}",
              "ops: " + ", ".join(f"{op} {n}" for op, n in s["ops"].items()),
              *_quantized_line(s["quantized"]),
              f"roofline: compute {si(s['macs'], 'MAC')} / {si(s['peak_macs_per_second'], 'MAC/s')}"
              + (f" ({si(s['int8_macs'], 'MAC')} of them int8, at {si(s['int8_peak_macs_per_second'], 'MAC/s')})"
                 if s["int8_macs"] else "") + " = "
              f"{us(s['compute_bound_us'])}; memory {si(s['compulsory_bytes'], 'B')} (weights + inputs + outputs)"
              f" / {si(s['ddr_peak_bytes_per_second'], 'B/s')} = {us(s['memory_bound_us'])}",
              f"lower bound {us(s['lower_bound_us'])} ({s['bound']}-bound)"]
    return "\n".join(lines)


def _quantization_lines(s: dict[str, Any]) -> list[str]:
    """--dtype int8 on a float model: how tpuflow quantized it (calibration, the ops left float)."""
    from tpuflow.quantize import float_op_lines
    return float_op_lines(s["quantization"]) if s.get("quantization") else []


def _quantized_line(tensors: list[dict[str, Any]]) -> list[str]:
    """'quantized tensors: 9 (uint8 per-tensor 6, int8 per-channel 2 constant, ...)', or nothing."""
    if not tensors:
        return []
    counts: dict[str, int] = {}
    for t in tensors:
        key = f"{t['dtype']} {t['granularity']}" + (" constant" if t["const"] else "")
        counts[key] = counts.get(key, 0) + 1
    return [f"quantized tensors: {len(tensors)} (" + ", ".join(f"{k} {n}" for k, n in sorted(counts.items())) + ")"]
