"""Per-command comparison of tpu-mlir's static cost model (compiler_profile.txt) with tpuflow's cost model.

    python benchmarks/vendor_profile.py [--corpus ../shared/peers/tpu-mlir] [--out benchmarks/results/vendor_profile.json]

For every `<model>/<chip>_<dtype>/compiler_profile.txt` of the tpu-mlir 1.30.2 corpus (format in its HOWTO.md),
each command cell (`<Op>_<line>|<kind>|s:..|e:..|t:<cycles>[|dr:<dir>|sz:<bytes>]`) is paired with an equivalent
tpuflow instruction and costed by hwmodel.timing.cost (the one per-instruction cost the scheduler, the bounds
and the tiler use) and, for GDMA, also by the simulator's own command timeline (gdma.CommandModel) alone on an
idle memory system:
  * GDMA_TENSOR of a 4-D tpu.Load / tpu.Store: the real transfer of its ginfo slice (DDR NCHW strides of the
    tensor -> LMEM aligned, or back for whole-plane stores) when its bytes match `sz`;
  * other GDMA_TENSOR / GDMA_MATRIX: a transfer of `sz` bytes in direction `dr` (S2L: DDR NCHW -> LMEM spread
    over the lanes; L2S the reverse; S2S / L2L one contiguous run); both bucketed by size;
  * CONV: the tpu.Conv2D at that line of final.mlir, with the output slice of its `ginfo` (commands of one op
    take the slices in n, c, h, w order) and the input channels / kernel of the op;
  * MM / MM2: the tpu.MatMul at that line (M x K x N from its operand types);
  * AR: an elementwise op over the op's output slice (the profile does not say which operand shapes it used).
Chip pairing: bm1684x -> tpuflow's bm1684x, bm1690 -> sg2260. Results: per class the median, p10 and p90 of
ours / tpu-mlir's cycles and the cycle totals; and per ResNet-50 conv layer on bm1684x (each compiler's own
program: tpu-mlir's TIU cycles of the op against tpuflow's simulated TIU busy time of the same layer);
written to benchmarks/results/vendor_profile.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from tpuflow.chip import load_chip
from tpuflow.hwmodel.timing.clocks import Clocks
from tpuflow.hwmodel.timing.cost import instruction_cycles
from tpuflow.hwmodel.timing.gdma import CommandModel
from tpuflow.hwmodel.timing.synthetic import ar, conv, copy_bytes, load, matmul, store
from tpuflow.isa import Prec

ROOT = Path(__file__).resolve().parent
CORPUS = ROOT.parent.parent / "shared" / "peers" / "tpu-mlir"
RESULTS = ROOT / "results" / "vendor_profile.json"
OUR_CHIP = {"bm1684x": "bm1684x", "bm1690": "sg2260"}
PREC = {"f32": int(Prec.FP32), "f16": int(Prec.FP16)}
DIRECTIONS = {0: "S2L", 1: "L2S", 2: "S2S", 3: "L2L"}
SIZE_BUCKETS = ((1024, "<=1K"), (16384, "1K-16K"), (262144, "16K-256K"), (1 << 62, ">256K"))
CELL = re.compile(r"^(?P<op>[A-Za-z0-9]+)_(?P<line>\d+)\|(?P<kind>[A-Z0-9_]+)\|(?P<fields>.*)$")
TENSOR = re.compile(r"tensor<([0-9x]+)x(f32|f16|bf16|i8|si8|ui8|i32|si32)")
DDR_BASE = 1 << 30
MIN_LANE_BYTES = 512           # one full GDMA burst (bus_bytes x max_burst_beats) per lane
BANK = 1 << 14                 # operands of the synthetic TIU commands sit in different LMEM banks (no conflicts)
RES, OPD0, OPD1 = 0, 4 * BANK, 8 * BANK
PER_OP = ("MM", "MM2")         # matmul commands are compared per op: the profile does not say how it was split


def parse_profile(path: Path) -> list[dict]:
    """Every command cell of a compiler_profile.txt: op, line, kind, t, its own command id (b on TIU
    cells, g on GDMA cells) and (GDMA) dr, sz."""
    cells = []
    for token in path.read_text().split():
        m = CELL.match(token)
        if not m:
            continue
        fields = dict(f.split(":", 1) for f in m["fields"].split("|") if ":" in f)
        cell = {"op": m["op"], "line": int(m["line"]), "kind": m["kind"], "t": int(fields["t"]),
                "id": int(fields["g" if "dr" in fields else "b"])}
        if "dr" in fields:
            cell.update(dr=int(fields["dr"]), sz=int(fields["sz"]))
        cells.append(cell)
    return cells


def _ints(text: str, key: str) -> list[int]:
    m = re.search(rf"\b{key} = \[([^\]]*)\]", text)
    return [int(v) for v in m[1].replace(" : i64", "").split(",") if v.strip()] if m else []


def op_info(line_text: str) -> dict:
    """Shapes, kernel and output slices of one final.mlir op line."""
    types = [(tuple(int(d) for d in s.split("x")), dt) for s, dt in TENSOR.findall(line_text)]
    out_shape = types[-1][0] if types else ()
    slices = {d: _ints(line_text, f"{d}_slice") for d in "nchw"}
    return {"types": types, "out": out_shape, "kernel": _ints(line_text, "kernel_shape"),
            "strides": _ints(line_text, "strides"), "slices": slices}


def _nchw(shape: tuple) -> tuple[int, int, int, int]:
    shape = tuple(shape) + (1,) * (4 - len(shape))
    return shape[0], shape[1], shape[2], int(np.prod(shape[3:]))


def slice_shape(info: dict, index: int) -> tuple[int, int, int, int]:
    """Output (n, c, h, w) of the index-th command of an op (its ginfo slices in n, c, h, w order)."""
    full = _nchw(info["out"])
    lists = [info["slices"][d] or [full[i]] for i, d in enumerate("nchw")]
    combos = math.prod(len(v) for v in lists)
    k, dims = index % combos, []
    for v in reversed(lists):
        dims.append(v[k % len(v)])
        k //= len(v)
    return tuple(reversed(dims))


def tiu_instr(kind: str, info: dict, index: int, prec: int):
    """The tpuflow TIU instruction equivalent to the index-th `kind` command of an op (None if unknown)."""
    n, c, h, w = slice_shape(info, index)
    if kind == "CONV" and len(info["kernel"]) == 2 and len(info["types"]) >= 2:
        cin = info["types"][0][0][1]
        base = conv(RES, OPD0, OPD1, n=n, cin=cin, h=h, w=w, cout=c, k=1, pad=0, prec=prec)
        return dataclasses.replace(base, opd1_h=info["kernel"][0], opd1_w=info["kernel"][1])
    if kind in PER_OP and len(info["types"]) >= 2:
        left, right = info["types"][0][0], info["types"][1][0]
        return matmul(RES, OPD0, OPD1, m=int(np.prod(left[:-1])), k=left[-1], n=right[-1], prec=prec)
    if kind == "AR":
        return ar("add", RES, OPD0, OPD1, (n, c, h, w), prec=prec)
    return None


def gdma_instr(chip, direction: int, nbytes: int, prec: int):
    """A contiguous transfer of nbytes in the given direction: one DDR run; the LMEM side spread over
    as many lanes as keep at least MIN_LANE_BYTES in each (one contiguous run per lane)."""
    elem = Prec(prec).bytes
    count = max(1, nbytes // elem)
    lanes = math.gcd(count, max(1, min(chip.lanes, nbytes // MIN_LANE_BYTES)))
    shape = (1, lanes, 1, count // lanes)
    if direction == 0:
        return load(chip, DDR_BASE, 0, shape, prec)
    if direction == 1:
        return store(chip, 0, DDR_BASE, shape, prec)
    if direction == 2:
        return copy_bytes(chip, DDR_BASE, DDR_BASE + (1 << 28), nbytes)
    return copy_bytes(chip, 0, chip.lmem_bytes_per_lane // 2, min(nbytes, chip.lmem_bytes_per_lane // 2),
                      src_lmem=True, dst_lmem=True)


ELEMENT_PREC = {"f32": Prec.FP32, "i32": Prec.INT32, "si32": Prec.INT32, "f16": Prec.FP16, "bf16": Prec.BF16,
                "i8": Prec.INT8, "si8": Prec.INT8, "ui8": Prec.INT8}


def shaped_gdma_instr(chip, cell: dict, info: dict | None, index: int):
    """The real tensor transfer of a 4-D tpu.Load / tpu.Store cell (its ginfo slice, the DDR tensor's NCHW
    strides, LMEM aligned), when its bytes match the cell's; None otherwise (then gdma_instr stands in).
    Stores only when the slice keeps whole planes (the DDR side is then contiguous)."""
    if info is None or cell["kind"] != "GDMA_TENSOR" or cell["op"] not in ("Load", "Store"):
        return None
    if len(info["out"]) != 4 or not info["types"] or info["types"][-1][1] not in ELEMENT_PREC:
        return None
    prec = int(ELEMENT_PREC[info["types"][-1][1]])
    shape, full = slice_shape(info, index), info["out"]
    if math.prod(shape) * Prec(prec).bytes != cell["sz"]:
        return None
    if cell["op"] == "Load" and cell["dr"] == 0:
        return load(chip, DDR_BASE, 0, shape, prec, ddr_strides=(full[1] * full[2] * full[3], full[2] * full[3],
                                                                 full[3], 1))
    if cell["op"] == "Store" and cell["dr"] == 1 and shape[2:] == tuple(full[2:]):
        return store(chip, 0, DDR_BASE, shape, prec)
    return None


def bucket(nbytes: int) -> str:
    return next(name for limit, name in SIZE_BUCKETS if nbytes <= limit)


def simulated_cycles(chip, instr) -> int:
    """Cycles of one GDMA command alone on the simulator's command model (idle memory)."""
    clocks = Clocks.of(chip)
    table = CommandModel(chip, clocks).table([instr])
    return -(-int(table.end[0]) // clocks.gdma.period)


def compare_run(run_dir: Path) -> list[dict]:
    chip_name, dtype = run_dir.name.split("_")
    chip, prec = load_chip(OUR_CHIP[chip_name]), PREC[dtype]
    lines = (run_dir / "final.mlir").read_text().splitlines()
    seen: dict[int, int] = defaultdict(int)
    per_op: dict[tuple[int, str], dict] = {}
    rows = []
    for cell in parse_profile(run_dir / "compiler_profile.txt"):
        index = seen[cell["line"]]
        seen[cell["line"]] += 1
        info = op_info(lines[cell["line"] - 1]) if cell["line"] <= len(lines) else None
        if "dr" in cell:
            instr = shaped_gdma_instr(chip, cell, info, index) or gdma_instr(chip, cell["dr"], cell["sz"], prec)
            klass = f"{cell['kind']} {DIRECTIONS[cell['dr']]} {bucket(cell['sz'])}"
            sim = simulated_cycles(chip, instr)
        else:
            instr = tiu_instr(cell["kind"], info, index, prec) if info else None
            klass, sim = cell["kind"], None
        if instr is None:
            continue
        row = {"class": klass, "op": f"{cell['op']}_{cell['line']}", "theirs": cell["t"],
               "ours": instruction_cycles(instr, chip), "ours_sim": sim, "sz": cell.get("sz")}
        if cell["kind"] in PER_OP:
            key = (cell["line"], cell["kind"])
            if key in per_op:
                per_op[key]["theirs"] += cell["t"]
                continue
            per_op[key] = row
        rows.append(row)
    return rows


LOC_DEF = re.compile(r'^#(loc\d+) = loc\("([^"]*)"\)')
LOC_USE = re.compile(r"loc\(#(loc\d+)\)\s*$")
TENSOR_NAME = re.compile(r"^r(\d+)_")


def layer_names(lines: list[str]) -> dict[int, str]:
    """final.mlir line -> the ONNX tensor its op's location names (e.g. 'r2_Relu_filter_reorderd' -> r2)."""
    locs = {m[1]: m[2] for m in map(LOC_DEF.match, lines) if m}
    out = {}
    for number, text in enumerate(lines, 1):
        m = LOC_USE.search(text)
        name = locs.get(m[1], "") if m else ""
        t = TENSOR_NAME.match(name)
        if t:
            out[number] = f"r{t[1]}"
    return out


def compare_layers(run_dir: Path, model: str) -> list[dict]:
    """Per conv layer of a tpuflow-built model: tpu-mlir's TIU cycles (CONV and AR cells of the op)
    against the TIU busy time of tpuflow's layer that computes the same tensor (the first Conv at or
    before it: tpuflow names node nK's output rK), both compiled and costed by their own compiler."""
    from tpuflow.options import CompileOptions
    from tpuflow.pipeline import estimate
    chip_name, dtype = run_dir.name.split("_")
    lines = (run_dir / "final.mlir").read_text().splitlines()
    names = layer_names(lines)
    theirs: dict[int, int] = defaultdict(int)
    for cell in parse_profile(run_dir / "compiler_profile.txt"):
        if cell["op"] == "Conv2D" and "dr" not in cell and cell["line"] in names:
            theirs[int(names[cell["line"]][1:])] += cell["t"]
    report = estimate(model, OUR_CHIP[chip_name], CompileOptions(dtype={"f32": "fp32", "f16": "fp16"}[dtype]))
    ours = {int(r["name"][1:]): r for r in report["layers"] if r["op"] == "Conv" and r["name"][1:].isdigit()}
    rows = []
    for tensor, cycles in sorted(theirs.items()):
        node = max((k for k in ours if k <= tensor), default=None)
        if node is None:
            continue
        busy = ours[node]["busy_us"]["tiu"] * chip_clock_mhz(OUR_CHIP[chip_name])
        rows.append({"layer": f"n{node}", "macs": ours[node]["macs"], "theirs": cycles, "ours": int(round(busy)),
                     "ratio": busy / cycles})
    return rows


def chip_clock_mhz(name: str) -> float:
    return load_chip(name).clocks.tiu_clock_mhz


def summarise(rows: list[dict]) -> dict:
    ratio = np.asarray([r["ours"] / r["theirs"] for r in rows if r["theirs"] > 0])
    out = {"count": len(rows), "theirs_cycles": int(sum(r["theirs"] for r in rows)),
           "ours_cycles": int(sum(r["ours"] for r in rows)),
           "median_ratio": float(np.median(ratio)), "p10_ratio": float(np.percentile(ratio, 10)),
           "p90_ratio": float(np.percentile(ratio, 90))}
    sims = [r for r in rows if r["ours_sim"] is not None]
    if sims:
        out["median_sim_ratio"] = float(np.median([r["ours_sim"] / r["theirs"] for r in sims if r["theirs"] > 0]))
        out["ours_sim_cycles"] = int(sum(r["ours_sim"] for r in sims))
        out["bytes"] = int(sum(r["sz"] for r in sims))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--chips", default="bm1684x,bm1690")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    runs = sorted(p.parent for p in args.corpus.glob("*/*/compiler_profile.txt")
                  if p.parent.name.split("_")[0] in args.chips.split(","))
    by_class: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for run in runs:
        for r in compare_run(run):
            chip, dtype = run.name.split("_")
            by_class[(chip, dtype, r["class"])].append(r)
    table = [{"chip": c, "dtype": d, "class": k, **summarise(rows)} for (c, d, k), rows in sorted(by_class.items())]
    print(f"{'chip':8s} {'dt':3s} {'class':28s} {'n':>5s} {'ours/theirs p50':>15s} {'p10':>6s} {'p90':>6s} "
          f"{'sim/theirs':>10s} {'theirs Mcyc':>11s} {'ours Mcyc':>9s}")
    for r in table:
        sim = f"{r['median_sim_ratio']:10.2f}" if "median_sim_ratio" in r else f"{'':10s}"
        print(f"{r['chip']:8s} {r['dtype']:3s} {r['class']:28s} {r['count']:5d} {r['median_ratio']:15.2f} "
              f"{r['p10_ratio']:6.2f} {r['p90_ratio']:6.2f} {sim} {r['theirs_cycles'] / 1e6:11.3f} "
              f"{r['ours_cycles'] / 1e6:9.3f}")
    layers = {}
    for run in runs:
        if run.parent.name == "resnet50" and run.name.startswith("bm1684x"):
            rows = compare_layers(run, "resnet50")
            ratio = np.asarray([r["ratio"] for r in rows])
            layers[run.name] = {"layers": rows, "count": len(rows), "median_ratio": float(np.median(ratio)),
                                "p10_ratio": float(np.percentile(ratio, 10)), "p90_ratio": float(np.percentile(ratio, 90)),
                                "theirs_cycles": int(sum(r["theirs"] for r in rows)),
                                "ours_cycles": int(sum(r["ours"] for r in rows))}
            w = layers[run.name]
            print(f"resnet50 {run.name}: {w['count']} conv layers, TIU ours/theirs median {w['median_ratio']:.2f} "
                  f"(p10 {w['p10_ratio']:.2f}, p90 {w['p90_ratio']:.2f}), total {w['ours_cycles'] / 1e6:.3f} vs "
                  f"{w['theirs_cycles'] / 1e6:.3f} Mcycles")
    doc = {"corpus": "tpu-mlir 1.30.2 compiler_profile.txt (peers/tpu-mlir)", "chip_pairing": OUR_CHIP,
           "runs": [f"{p.parent.name}/{p.name}" for p in runs], "classes": table, "resnet50_layers": layers}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
