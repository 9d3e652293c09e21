"""Per-layer comparison of ResNet-50 on BM1684X: our program, tpu-mlir's program on our model, tpu-mlir's profile.

    python benchmarks/vendor_layers.py [--dtypes fp16,fp32] [--chip bm1684x|FILE.toml] [--corpus DIR]

For each dtype the programs of the same model are cut into layers: a layer is one ONNX Conv node
and the nodes after it up to the next Conv (BN, ReLU, the residual Add, pooling, the FC at the end
joins the last conv); ResNet-50 has 53.
  ours     tpuflow's default compile, simulated (instruction -> ONNX node: the Program's layer map);
  vendor   tpu-mlir's bm1690 raw streams (peers/tpu-mlir/resnet50/bm1690_<dt>) simulated on the same
           chip model (codegen/vendor.py reads them); each command is attributed through the bm1690
           compiler_profile.txt cell carrying its own id: `<Op>_<line>` names the final.mlir op, whose
           loc names the ONNX tensor rK (node nK's output); a tpu.Load belongs to the op that reads
           it, a tpu.Store to the op that wrote it;
  tpu-mlir tpu-mlir's own per-command cycles (compiler_profile.txt, 1 cycle = 1 ns) of bm1684x_<dt>
           (its program for the chip that was measured) and bm1690_<dt> (the program simulated as
           `vendor`, costed for bm1690).
Per layer and program: MACs, TIU busy and GDMA busy (us, sum of command times), GDMA bytes, TIU /
GDMA command counts. Per program: latency, busy per engine and how the wall time splits into TIU
only / GDMA only / both / neither; per GDMA size class the bytes, busy time and achieved B/ns.
Writes results/vendor_layers_<dtype>.json and .md (temp file, then rename).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from fidelity import bm1684x_forms
from vendor_profile import CORPUS, LOC_DEF, LOC_USE, TENSOR_NAME, parse_profile

from tpuflow.chip import load_chip
from tpuflow.codegen.vendor import read_stream_dir
from tpuflow.estimate import estimate_report
from tpuflow.hwmodel.timing import simulate
from tpuflow.hwmodel.timing.gdma import run_elements
from tpuflow.hwmodel.timing.segments import transfer_sides
from tpuflow.models import build_model
from tpuflow.options import CompileOptions
from tpuflow.pipeline import estimate

RESULTS = Path(__file__).resolve().parent / "results"
CORPUS_DTYPE = {"fp32": "f32", "fp16": "f16"}
OP_LINE = re.compile(r'^\s*(%\d+) = "([\w.]+)"\(([^)]*)\)')
OTHER = "other"
RUN_CLASSES = ("one-element runs", "runs < 256 B", "runs >= 256 B", "no DDR side")


def conv_layers(model: str = "resnet50") -> tuple[list[int], dict[int, str]]:
    """Indices of the ONNX Conv nodes and, for every node index, the layer (its Conv at or before it)."""
    nodes = list(build_model(model).graph.node)
    convs = [i for i, n in enumerate(nodes) if n.op_type == "Conv"]
    layer_of, current = {}, OTHER
    for i, _ in enumerate(nodes):
        if i in convs:
            current = f"n{i}"
        layer_of[i] = current
    return convs, layer_of


def node_index(name: str) -> int | None:
    return int(name[1:]) if name[:1] == "n" and name[1:].isdigit() else None


def mlir_line_layers(final_mlir: Path, layer_of: dict[int, str]) -> dict[int, str]:
    """final.mlir line -> layer: the op's loc rK; a tpu.Load takes its reader's, a tpu.Store its writer's."""
    lines = final_mlir.read_text().splitlines()
    locs = {m[1]: m[2] for m in map(LOC_DEF.match, lines) if m}
    producer, readers, ops, own, scope = {}, defaultdict(list), {}, {}, 0
    for number, text in enumerate(lines, 1):
        scope += "func.func" in text or '"tpu.Group"' in text   # SSA names restart in functions and groups
        m = OP_LINE.match(text)
        if not m:
            continue
        ops[number] = (m[2], [(scope, o.strip()) for o in m[3].split(",") if o.strip()], (scope, m[1]))
        producer[ops[number][2]] = number
        for operand in ops[number][1]:
            readers[operand].append(number)
        use = LOC_USE.search(text)
        tensor = TENSOR_NAME.match(locs.get(use[1], "")) if use else None
        if tensor:
            own[number] = layer_of.get(int(tensor[1]), OTHER)
    out = dict(own)
    for number, (op, operands, result) in ops.items():
        if number in own:
            continue
        if op == "tpu.Load":
            out[number] = next((own[r] for r in readers[result] if r in own), OTHER)
        elif op == "tpu.Store" and operands:
            out[number] = own.get(producer.get(operands[0], -1), OTHER)
    return out


def _new_row() -> dict:
    return {"tiu_us": 0.0, "gdma_us": 0.0, "bytes": 0, "tiu_n": 0, "gdma_n": 0}


def run_class(instr, chip) -> str:
    """Which per-run regime a GDMA command is in: its contiguous runs (both sides) are one element, shorter
    than 256 B (tpu-mlir's BM1684X minimum charge), or longer; DDR-less copies apart."""
    sides = transfer_sides(instr, chip) if hasattr(instr, "nbytes") else (None, None)
    if all(side is None or side.lmem for side in sides):
        return RUN_CLASSES[3]
    elements = run_elements(*sides)
    esize = next(side.esize for side in sides if side is not None and not side.lmem)
    return RUN_CLASSES[0] if elements == 1 else RUN_CLASSES[1] if elements * esize < 256 else RUN_CLASSES[2]


def simulated_layers(program, sim, layer_at) -> tuple[dict[str, dict], dict]:
    """Per layer busy/bytes/counts of a simulated program; layer_at(engine_code, index) -> layer."""
    rows: dict[str, dict] = defaultdict(_new_row)
    sizes: dict[str, dict] = defaultdict(lambda: {"n": 0, "bytes": 0, "us": 0.0})
    start, end = sim.times["start"], sim.times["end"]
    for i in range(len(sim)):
        code, index = int(sim.engine[i]), int(sim.cmd_id[i]) - 1
        if code == 2:
            continue
        row, us = rows[layer_at(code, index)], (int(end[i]) - int(start[i])) / 1e6
        if code == 0:
            row["tiu_us"] += us
            row["tiu_n"] += 1
            continue
        nbytes = int(getattr(program.gdma[index], "nbytes", 0) or 0)
        row["gdma_us"] += us
        row["gdma_n"] += 1
        row["bytes"] += nbytes
        size = sizes[run_class(program.gdma[index], program.chip)]
        size["n"] += 1
        size["bytes"] += nbytes
        size["us"] += us
    return dict(rows), dict(sizes)


def union_ps(intervals: np.ndarray) -> int:
    """Length of the union of [start, end) intervals (rows of a (k, 2) array)."""
    if len(intervals) == 0:
        return 0
    order = intervals[np.argsort(intervals[:, 0], kind="stable")]
    reach = np.maximum.accumulate(order[:, 1])
    prev = np.concatenate(([order[0, 0]], reach[:-1]))
    return int(np.clip(order[:, 1] - np.maximum(order[:, 0], prev), 0, None).sum())


def overlap(sim) -> dict:
    """Wall time (us) split into TIU only, GDMA only, both busy, neither."""
    spans = np.stack([sim.times["start"], sim.times["end"]], axis=1).astype(np.int64)
    tiu, gdma = spans[sim.engine == 0], spans[sim.engine == 1]
    t, g, either = union_ps(tiu), union_ps(gdma), union_ps(np.concatenate([tiu, gdma]))
    both = t + g - either
    return {"tiu_only_us": (t - both) / 1e6, "gdma_only_us": (g - both) / 1e6, "both_us": both / 1e6,
            "neither_us": (sim.total_ps - either) / 1e6}


def program_summary(report, sim, sizes: dict) -> dict:
    busy = {k: round(v["busy_us"], 2) for k, v in report["engines"].items() if k != "tile"}
    return {"latency_us": round(report["latency_us"], 2), "busy_us": busy,
            "overlap_us": {k: round(v, 2) for k, v in overlap(sim).items()},
            "gdma_sizes": {k: {"n": v["n"], "bytes": v["bytes"], "us": round(v["us"], 2),
                               "bytes_per_ns": round(v["bytes"] / (v["us"] * 1e3), 2) if v["us"] else None}
                           for k, v in sorted(sizes.items(), key=lambda kv: RUN_CLASSES.index(kv[0]))}}


def ours(dtype: str, chip: str, layer_of: dict[int, str]) -> tuple[dict, dict, dict]:
    report, program, sim = estimate("resnet50", chip, CompileOptions(dtype=dtype), with_sim=True)
    names = {0: program.tiu_layers, 1: program.gdma_layers}

    def layer_at(code: int, index: int) -> str:
        k = node_index(names[code][index]) if index < len(names[code]) else None
        return layer_of.get(k, OTHER) if k is not None else OTHER

    rows, sizes = simulated_layers(program, sim, layer_at)
    macs: dict[str, int] = defaultdict(int)
    for layer in report["layers"]:
        k = node_index(layer["name"])
        macs[layer_of.get(k, OTHER) if k is not None else OTHER] += int(layer["macs"])
    return rows, program_summary(report, sim, sizes), dict(macs)


def vendor(dtype: str, chip: str, corpus: Path, layer_of: dict[int, str], forms: bool) -> tuple[dict, dict]:
    """tpu-mlir's bm1690 program on our chip model, as read, or (forms) with the FC and stem conv in the forms
    of its BM1684X program (benchmarks/fidelity.py bm1684x_forms)."""
    run = corpus / "resnet50" / f"bm1690_{CORPUS_DTYPE[dtype]}"
    program, _ = read_stream_dir(run, load_chip(chip))
    if forms:
        program = bm1684x_forms(program, run.parent, dtype)
    sim = simulate(program, check=False)
    report = estimate_report(program, sim)
    line_layer = mlir_line_layers(run / "final.mlir", layer_of)
    by_id = {(0 if "dr" not in c else 1, c["id"]): line_layer.get(c["line"], OTHER)
             for c in parse_profile(run / "compiler_profile.txt")}
    rows, sizes = simulated_layers(program, sim, lambda code, index: by_id.get((code, index + 1), OTHER))
    return rows, program_summary(report, sim, sizes)


def profile_layers(run: Path, layer_of: dict[int, str]) -> tuple[dict[str, dict], dict]:
    """tpu-mlir's per-command cycles of one corpus run, per layer, and its totals."""
    line_layer = mlir_line_layers(run / "final.mlir", layer_of)
    rows: dict[str, dict] = defaultdict(_new_row)
    for cell in parse_profile(run / "compiler_profile.txt"):
        row = rows[line_layer.get(cell["line"], OTHER)]
        if "dr" in cell:
            row["gdma_us"] += cell["t"] / 1e3
            row["gdma_n"] += 1
            row["bytes"] += cell["sz"]
        else:
            row["tiu_us"] += cell["t"] / 1e3
            row["tiu_n"] += 1
    tcyc = re.search(r"TCYC : (\d+)", (run / "compiler_profile.txt").read_text())
    totals = {k: round(sum(r[f"{k}_us"] for r in rows.values()), 2) for k in ("tiu", "gdma")}
    return dict(rows), {"latency_us": int(tcyc[1]) / 1e3 if tcyc else None, "busy_us": totals}


PROGRAMS = ("ours", "vendor", "vendor_forms", "tpu_mlir_bm1684x", "tpu_mlir_bm1690")


def compare(dtype: str, chip: str, corpus: Path) -> dict:
    convs, layer_of = conv_layers()
    ours_rows, ours_sum, macs = ours(dtype, chip, layer_of)
    vendor_rows, vendor_sum = vendor(dtype, chip, corpus, layer_of, forms=False)
    forms_rows, forms_sum = vendor(dtype, chip, corpus, layer_of, forms=True)
    x_rows, x_sum = profile_layers(corpus / "resnet50" / f"bm1684x_{CORPUS_DTYPE[dtype]}", layer_of)
    v_rows, v_sum = profile_layers(corpus / "resnet50" / f"bm1690_{CORPUS_DTYPE[dtype]}", layer_of)
    layers = []
    for name in [f"n{i}" for i in convs] + [OTHER]:
        entry = {"layer": name, "macs": macs.get(name, 0)}
        for key, rows in zip(PROGRAMS, (ours_rows, vendor_rows, forms_rows, x_rows, v_rows)):
            entry[key] = {k: round(v, 3) if isinstance(v, float) else v for k, v in rows.get(name, _new_row()).items()}
        layers.append(entry)
    doc = {"model": "resnet50", "chip": chip, "dtype": dtype, "layers": layers,
            "programs": {"ours": ours_sum, "vendor": vendor_sum, "vendor_forms": forms_sum,
                         "tpu_mlir_bm1684x": x_sum, "tpu_mlir_bm1690": v_sum}}
    doc["differences"] = differences(doc)
    return doc


SHOWN = ("ours", "vendor_forms", "tpu_mlir_bm1684x", "tpu_mlir_bm1690")


def _cells(r: dict, counts: bool = True) -> list[str]:
    out = [f"{r['tiu_us']:.1f}", f"{r['gdma_us']:.1f}"]
    return out + [f"{r['bytes'] / 1e6:.2f}", f"{r['tiu_n']}/{r['gdma_n']}"] if counts else out


def layer_table(doc: dict) -> list[str]:
    head = ("| layer | MMAC | ours TIU | ours GDMA | ours MB | ours nT/nG | vendor TIU | vendor GDMA | vendor MB | "
            "vendor nT/nG | tpu-mlir 1684x TIU | GDMA | MB | nT/nG | tpu-mlir 1690 TIU | GDMA |")
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for e in doc["layers"]:
        cells = [e["layer"], f"{e['macs'] / 1e6:.1f}"]
        for p in SHOWN:
            cells += _cells(e[p], counts=p != "tpu_mlir_bm1690")
        out.append("| " + " | ".join(cells) + " |")
    return out


def program_table(doc: dict) -> list[str]:
    out = ["| program | latency us | TIU busy | GDMA busy | TIU only | GDMA only | both | neither |",
           "|---|---|---|---|---|---|---|---|"]
    for p, s in doc["programs"].items():
        o = s.get("overlap_us", {})
        out.append(f"| {p} | {s['latency_us']} | {s['busy_us']['tiu']:.1f} | {s['busy_us']['gdma']:.1f} | "
                   + " | ".join(f"{o[k]:.1f}" if k in o else "" for k in
                                ("tiu_only_us", "gdma_only_us", "both_us", "neither_us")) + " |")
    out += ["", "| program | GDMA commands | n | MB | busy us | B/ns |", "|---|---|---|---|---|---|"]
    for p in ("ours", "vendor_forms"):
        for k, v in doc["programs"][p]["gdma_sizes"].items():
            out.append(f"| {p} | {k} | {v['n']} | {v['bytes'] / 1e6:.3f} | {v['us']:.1f} | {v['bytes_per_ns']} |")
    return out


def differences(doc: dict) -> dict:
    """Where ours and the vendor's program (BM1684X forms) differ on our model, in busy us."""
    convs = [e for e in doc["layers"] if e["layer"] != OTHER]
    stem, last = convs[0], convs[-1]
    body = convs[1:-1]
    ratio = [e["ours"]["tiu_us"] / e["vendor_forms"]["tiu_us"] for e in body if e["vendor_forms"]["tiu_us"]]
    ours, theirs = doc["programs"]["ours"], doc["programs"]["vendor_forms"]
    runs = {k: round(ours["gdma_sizes"].get(k, {}).get("us", 0.0) - theirs["gdma_sizes"].get(k, {}).get("us", 0.0), 1)
            for k in RUN_CLASSES}
    overlap = {k: round(ours["overlap_us"][k] - theirs["overlap_us"][k], 1) for k in ours["overlap_us"]}
    return {"latency_us": round(ours["latency_us"] - theirs["latency_us"], 1),
            "tiu_body_convs_us": round(sum(e["ours"]["tiu_us"] - e["vendor_forms"]["tiu_us"] for e in body), 1),
            "tiu_body_ratio_median": round(float(np.median(ratio)), 3) if ratio else None,
            "tiu_body_ratio_p10_p90": [round(float(np.percentile(ratio, q)), 3) for q in (10, 90)] if ratio else None,
            "tiu_stem_us": round(stem["ours"]["tiu_us"] - stem["vendor_forms"]["tiu_us"], 1),
            "tiu_last_block_and_fc_us": round(last["ours"]["tiu_us"] - last["vendor_forms"]["tiu_us"], 1),
            "gdma_by_run_class_us": runs, "overlap_us": overlap}


def markdown(doc: dict) -> str:
    d = doc["differences"]
    out = [f"# ResNet-50 {doc['dtype']} on {doc['chip']}: per layer (benchmarks/vendor_layers.py)", "",
           "ours / vendor = simulated on our chip model (vendor = tpu-mlir's bm1690 streams in the forms of its "
           "BM1684X program: FC with N on the lanes, stem conv folded when the bm1684x build folds it; "
           "`vendor` in the JSON is the same streams as read). tpu-mlir = its compiler_profile.txt cycles "
           "(1 ns). Busy = sum of command times (us); MB = GDMA bytes. A layer = one Conv node and the "
           "nodes after it up to the next Conv.", ""]
    out += layer_table(doc) + [""] + program_table(doc) + [""]
    out += ["## ours - vendor (BM1684X forms), on our model", "",
            f"* latency {d['latency_us']:+.1f} us",
            f"* TIU, 51 body convs: {d['tiu_body_convs_us']:+.1f} us (ours/vendor per layer median "
            f"{d['tiu_body_ratio_median']}, p10-p90 {d['tiu_body_ratio_p10_p90']}); stem conv "
            f"{d['tiu_stem_us']:+.1f} us; last block + FC {d['tiu_last_block_and_fc_us']:+.1f} us",
            "* GDMA busy by run class: " + ", ".join(f"{k} {v:+.1f} us" for k, v in d["gdma_by_run_class_us"].items()),
            "* wall time split: " + ", ".join(f"{k} {v:+.1f}" for k, v in d["overlap_us"].items())]
    return "\n".join(out) + "\n"


def write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="fp16,fp32")
    ap.add_argument("--chip", default="bm1684x")
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    args = ap.parse_args()
    for dtype in args.dtypes.split(","):
        doc = compare(dtype, args.chip, args.corpus)
        for p, s in doc["programs"].items():
            print(f"{dtype} {p:18s} latency {s['latency_us']} us busy {s['busy_us']}")
        args.out_dir.mkdir(parents=True, exist_ok=True)
        write(args.out_dir / f"vendor_layers_{dtype}.json", json.dumps(doc, indent=1) + "\n")
        write(args.out_dir / f"vendor_layers_{dtype}.md", markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
