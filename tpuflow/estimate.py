"""The estimate: a simulated Program summarised for people and tools — latency, engines, stalls,
DRAM, the lower bound, and a per-layer table (the data behind `tpuflow estimate` and reports)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tpuflow.hwmodel.timing.segments import ddr_bytes
from tpuflow.isa import Engine, GeneralDma, MatrixDma, TensorDma, is_lmem
from tpuflow.program import Program

ENGINES = ("tiu", "gdma", "tile")
FORMAT_VERSION = 1


def _distinct_bytes(shape, strides, esize: int) -> int:
    """Bytes a strided side touches (a stride-0 dimension re-reads the same bytes)."""
    count = 1
    for size, stride in zip(shape, strides):
        count *= size if stride else 1
    return count * esize


def _ddr_sides(instr, chip) -> list[tuple[int, int]]:
    """(DDR address, distinct bytes) of each DDR side of a GDMA instruction."""
    if isinstance(instr, TensorDma):
        esize = instr.nbytes // max(1, int(np.prod(instr.dst_shape)))
        sides = [] if instr.fill_constant_en else [(instr.src_start_addr, instr.src_shape, instr.src_strides)]
        sides.append((instr.dst_start_addr, instr.dst_shape, instr.dst_strides))
        return [(a, _distinct_bytes(s, st, esize)) for a, s, st in sides if not is_lmem(a, chip)]
    if isinstance(instr, GeneralDma) and instr.op == "broadcast":
        return [(instr.src_start_addr, instr.nbytes // max(1, instr.dst_csize))]
    if isinstance(instr, (MatrixDma, GeneralDma)):
        return [(a, instr.nbytes) for a in (instr.src_start_addr, instr.dst_start_addr) if not is_lmem(a, chip)]
    return []


def ddr_traffic(program: Program) -> dict:
    """DDR bytes the GDMA instructions read and write (distinct bytes per side), split into
    weight-image reads and activation traffic, with the compulsory bytes (weights, graph inputs
    and outputs) they compare against."""
    chip, base = program.chip, program.memory.weight_base
    weights = activations = 0
    for instr in program.gdma:
        for addr, nbytes in _ddr_sides(instr, chip):
            if addr >= base:
                weights += nbytes
            else:
                activations += nbytes
    return {"weight_bytes": weights, "activation_bytes": activations,
            "compulsory_bytes": program.compulsory_ddr_bytes}


def layer_group_rows(program: Program) -> list[dict]:
    """Each layer group of the program with the DDR bytes its instructions load and store."""
    chip = program.chip
    owner = {node: lg["index"] for lg in program.layer_groups for node in lg["nodes"]}
    moved = {lg["index"]: [0, 0] for lg in program.layer_groups}
    for index, instr in enumerate(program.gdma):
        lg = owner.get(program.layer_of(Engine.GDMA, index))
        if lg is None:
            continue
        dst = getattr(instr, "dst_start_addr", None)
        moved[lg][0 if dst is not None and is_lmem(dst, chip) else 1] += ddr_bytes(instr, chip)
    return [dict(lg, ddr_bytes_in=moved[lg["index"]][0], ddr_bytes_out=moved[lg["index"]][1])
            for lg in program.layer_groups]


@dataclass
class LayerRow:
    name: str
    op: str
    start_us: float
    end_us: float
    busy_us: dict
    macs: int
    bytes: int
    bound: str
    fused_group: str
    utilisation: float

    @property
    def time_us(self) -> float:
        """The layer's cost: the busy time of its busiest engine (spans of reordered layers overlap)."""
        return max(self.busy_us.values())

    def as_dict(self) -> dict:
        return {"name": self.name, "op": self.op, "start_us": self.start_us, "end_us": self.end_us,
                "span_us": self.end_us - self.start_us, "time_us": self.time_us, "busy_us": self.busy_us,
                "macs": self.macs,
                "bytes": self.bytes, "bound": self.bound, "fused_group": self.fused_group,
                "utilisation": self.utilisation}


def _bound_of(busy: dict, compute_waited: float, dma_waited: float) -> str:
    """memory when GDMA is the busier side or the compute instructions spent longer waiting for
    their data than computing; compute when TIU/TILE is the busier side; dependency when the
    DMAs spent longer waiting for other instructions than moving data."""
    compute = busy["tiu"] + busy["tile"]
    if compute >= busy["gdma"]:
        return "memory" if compute_waited > compute else "compute"
    return "dependency" if dma_waited > busy["gdma"] and compute_waited <= compute else "memory"


def layer_rows(program: Program, sim) -> list[LayerRow]:
    """One row per layer (ONNX node) with instructions, in order of first start."""
    chip, dtype = program.chip, program.options.get("dtype", "fp32")
    start, end = sim.times["start"] / 1e6, sim.times["end"] / 1e6
    waited = sim.stalls["dependency"] / 1e6
    by_layer: dict[str, list[int]] = {}
    for i, name in enumerate(sim.layer):
        by_layer.setdefault(name, []).append(i)
    gdma_bytes = {}
    for index, instr in enumerate(program.gdma):
        layer = program.layer_of(Engine.GDMA, index)
        gdma_bytes[layer] = gdma_bytes.get(layer, 0) + ddr_bytes(instr, chip)
    peak = chip.peak_macs_per_second(dtype, "tile" if program.tile else "tiu") / 1e6
    from tpuflow.scheduler.bounds import int8_product_layers
    int8_peak, int8_layers = chip.peak_macs_per_second("int8") / 1e6, int8_product_layers(program)
    rows = []
    for name, idx in by_layer.items():
        idx = np.asarray(idx)
        s, e = float(start[idx].min()), float(end[idx].max())
        busy = {eng: float((end[idx] - start[idx])[sim.engine[idx] == code].sum()) for code, eng in enumerate(ENGINES)}
        info = program.layers.get(name)
        macs = info.macs if info else 0
        engine_time = max(max(busy.values()), 1e-9)
        layer_peak = int8_peak if name in int8_layers else peak
        rows.append(LayerRow(name or "(program)", info.op_type if info else "", s, e, busy, macs,
                             gdma_bytes.get(name, 0), _bound_of(busy, float(waited[idx][sim.engine[idx] != 1].sum()),
                                                                float(waited[idx][sim.engine[idx] == 1].sum())),
                             info.fused_group if info else "",
                             macs / (engine_time * layer_peak) if layer_peak else 0.0))
    rows.sort(key=lambda r: (r.start_us, r.name))
    return rows


def estimate_report(program: Program, sim) -> dict:
    """The stable --json document of `tpuflow estimate`. The lower bound is the largest of the
    roofline (MACs at the MAC engines' combined peak, DDR bytes at the DRAM peak: it holds for any
    schedule) and `schedule_us`, the scheduler's bound for this program (critical path and per-engine
    relaxation on hwmodel.timing.cost's per-instruction costs: no order of these instructions is faster)."""
    from tpuflow.hwmodel.timing.result import core_rows
    from tpuflow.scheduler.bounds import program_macs, roofline_ps, schedule_bound_ps
    chip = program.chip
    summary = sim.summary()
    layers = layer_rows(program, sim)
    macs = program_macs(program)
    compute_ps, memory_ps = roofline_ps(program)
    lower = {"roofline_compute_us": compute_ps / 1e6, "roofline_ddr_us": memory_ps / 1e6,
             "schedule_us": schedule_bound_ps(program) / 1e6}
    lower_us = max(lower.values())
    latency_us = summary["latency_us"]
    period_ns = 1e3 / chip.clocks.tiu_clock_mhz
    engines = {}
    for e in ENGINES:
        busy = summary["busy_us"].get(e, 0.0)
        engines[e] = {"busy_us": busy, "instructions": summary["instructions"][e],
                      "utilisation": busy / latency_us if latency_us else 0.0}
    top = sorted(layers, key=lambda r: r.time_us, reverse=True)[:10]
    return {
        "format_version": FORMAT_VERSION, "model": program.model_name, "chip": chip.name,
        "chip_fingerprint": chip.fingerprint(), "chip_description": chip.core.description,
        "options": typed_options(program.options), **model_bound(program),
        "latency_us": latency_us, "latency_cycles": int(round(latency_us * 1e3 / period_ns)),
        "clock_mhz": chip.clocks.tiu_clock_mhz, "lower_bound_us": lower_us, "bounds": lower,
        "latency_over_bound": latency_us / lower_us if lower_us else None,
        "bound": "compute" if compute_ps >= memory_ps else "memory",
        "macs": macs, "achieved_tops": 2 * macs / (latency_us * 1e6) if latency_us else 0.0,
        "engines": engines, "stalls": summary["stalls_us"], "dram": dict(summary["dram"], **ddr_traffic(program)),
        "layer_groups": layer_group_rows(program),
        "layers": [r.as_dict() for r in layers], "top_layers": [r.name for r in top],
        **({"cores": core_rows(sim)} if getattr(sim, "cores", None) else {}),
        **({"quantization": program.quantization} if program.quantization else {}),
        **({"matmul_path": tile_path} if (tile_path := matmul_path(program)) else {}),
        **({"layouts": layouts} if (layouts := _activation_layouts(program)) else {}),
    }


def _activation_layouts(program: Program) -> dict:
    from tpuflow.codegen.report_data import activation_layouts
    return activation_layouts(program)


def matmul_path(program: Program) -> dict:
    """Under --matmul tile, which products the TILE engine took and which ran on the TIU: int8 ones
    (CONV / MM2 with int32 accumulation) stay on the TIU, as the TILE lowering takes float products
    only. Empty for --matmul tiu or when no product stayed on the TIU."""
    from tpuflow.scheduler.bounds import int8_product_layers
    if program.options.get("matmul") != "tile":
        return {}
    on_tiu = sorted(int8_product_layers(program))
    if not on_tiu:
        return {}
    on_tile = sorted({program.layer_of(Engine.TILE, i) for i in range(len(program.tile))} & set(program.layers))
    return {"requested": "tile", "on_tile": on_tile, "int8_on_tiu": on_tiu,
            "why": "the TILE lowering takes float MatMul / Conv only; int8 products are TIU CONV / MM2 with int32 sums"}


from tpuflow.options import typed_options  # noqa: E402  (re-exported: estimate --json uses it)


def model_bound(program: Program) -> dict:
    """The model's roofline exactly as `tpuflow inspect` computes its lower bound (frontend.stats.roofline
    on the model's MACs and its compulsory DDR bytes: weights, graph inputs and outputs), so both
    commands print one number, whatever --matmul, --schedule or --layer-group say. None for
    programs without a model (vendor streams). It counts the MACs at one MAC engine's peak (TIU),
    those of int8 CONV / MM2 layers at its int8 peak; a program on N cores at N engines and the DDR
    bandwidth the cores share (inspect's bound is the one-core case)."""
    from tpuflow.frontend.stats import roofline
    from tpuflow.scheduler.bounds import int8_macs, program_macs
    if not program.compulsory_ddr_bytes:
        return {"model_bound_us": None, "model_bounds": None}
    r = roofline(program_macs(program), program.compulsory_ddr_bytes, program.chip, program.options.get("dtype", "fp32"),
                 int8_macs(program), program.core_count)
    return {"model_bound_us": r.lower_bound_s * 1e6,
            "model_bounds": {"compute_us": r.compute_s * 1e6, "compulsory_ddr_us": r.memory_s * 1e6}}


def _on_cores(report: dict) -> str:
    cores = len(report.get("cores") or ()) or 1
    return f" on {cores} cores sharing DDR" if cores > 1 else ", `tpuflow inspect`'s lower bound"


def _bound_lines(report: dict) -> list[str]:
    """The two bounds under different names: the model's (as inspect) and this program's."""
    latency, lines = report["latency_us"], []
    if report.get("model_bound_us"):
        b = report["model_bounds"]
        lines.append(f"model bound    {report['model_bound_us']:.1f} us  latency / bound = {latency / report['model_bound_us']:.2f}"
                     f"  (the model's roofline{_on_cores(report)}: compute {b['compute_us']:.1f} us, "
                     f"weights + inputs + outputs over DDR {b['compulsory_ddr_us']:.1f} us; the same for every --matmul)")
    lines.append(f"program bound  {report['lower_bound_us']:.1f} us  latency / bound = {report['latency_over_bound']:.2f}"
                 "  (no order of this program's instructions is faster: "
                 + ", ".join(f"{k.removesuffix('_us')} {v:.1f}" for k, v in report["bounds"].items()) + ")")
    return lines


def _layout_lines(report: dict) -> list[str]:
    from tpuflow.codegen.report_data import layout_line
    return layout_line(report.get("layouts", {}))


def render_text(report: dict, top: int = 10) -> str:
    from tpuflow.quantize import float_op_lines
    e, d, opts = report["engines"], report["dram"], report["options"]
    quant = report.get("quantization")
    dtype = f"int8, the rest {opts.get('dtype')}" if quant else opts.get("dtype")
    lines = [
        f"{report['model']} on {report['chip']} (fingerprint {report['chip_fingerprint']}; {dtype}, "
        f"matmul={opts.get('matmul')}, schedule={opts.get('schedule')})",
        f"chip           {report.get('chip_description', '')}",
        f"latency        {report['latency_us']:.1f} us  ({report['latency_cycles']} cycles at {report['clock_mhz']:g} MHz)",
        *_bound_lines(report),
        f"throughput     {report['achieved_tops']:.3f} T(FL)OPS over {report['macs'] / 1e9:.3f} GMAC",
        "engines        " + "  ".join(f"{k} {v['busy_us']:.1f} us busy ({100 * v['utilisation']:.0f}%), {v['instructions']} instr"
                                     for k, v in e.items() if v["instructions"]),
        "stalls         " + "  ".join(f"{k} {v:.1f} us" for k, v in report["stalls"].items())
        + f"  (summed over instructions, {sum(report['stalls'].values()):.1f} us in all: engines and queued "
        "instructions stall at the same time, so the total can exceed the latency)",
        f"dram           read {d['bytes_read'] / 1e6:.2f} MB, written {d['bytes_written'] / 1e6:.2f} MB, "
        f"{d['achieved_gbps']:.1f} GB/s achieved of {d['peak_gbps']:g}, page hit rate {100 * d['page_hit_rate']:.1f}%",
        *(float_op_lines(quant) if quant else []),
        *([f"matmul path    tile requested: {len(report['matmul_path']['int8_on_tiu'])} int8 product layers ran on "
           f"the TIU, {len(report['matmul_path']['on_tile'])} on the TILE engine ({report['matmul_path']['why']})"]
          if report.get("matmul_path") else []),
        *_layout_lines(report),
        "",
        f"top {top} layers by time (busy time of the layer's busiest engine; span = first start to last end):",
    ]
    rows = sorted(report["layers"], key=lambda r: r["time_us"], reverse=True)[:top]
    width = max([len(r["name"]) for r in rows] + [5])
    lines.append(f"{'layer':{width}s}  {'op':18s} {'time_us':>9s} {'span_us':>9s} {'MMAC':>9s} {'MB':>7s} {'util':>5s}  bound")
    for r in rows:
        lines.append(f"{r['name']:{width}s}  {r['op']:18s} {r['time_us']:9.1f} {r['span_us']:9.1f} {r['macs'] / 1e6:9.2f} "
                     f"{r['bytes'] / 1e6:7.2f} {100 * r['utilisation']:4.0f}%  {r['bound']}")
    return "\n".join(lines)
