"""Identity check of the timing model across a code change: every timeline field of simulate() on a fixed
set of programs, dumped by one checkout and compared by another.

    python benchmarks/timing_identity.py dump OUT.pkl [--programs DIR] [--only NAME,...]
    python benchmarks/timing_identity.py compare BEFORE.pkl AFTER.pkl

The programs (compiled once and pickled into --programs, default /tmp/timing_identity_programs, so both
checkouts simulate the very same instructions): the synthetic ResNet-50-like program (bitmap and auto
dependency modes, rate and per-burst memory), resnet50 / mobilenetv2 / bert_layer / gpt_block / shufflenet
/ inception_v1 in fp16 and fp32 (default compile options), bert_layer with the TILE matmul path (fp16,
fp32), small_cnn and gpt_block on 4 cores. Compared: per instruction the stage times, stalls, waits,
cmd_id_dep; busy_ps, total_ps, DRAM statistics; per core the same. `events` is reported, not required.
"""

from __future__ import annotations

import argparse
import copyreg
import pickle
import sys
import time
import types
from pathlib import Path

import numpy as np



def _read_only(d: dict):
    return types.MappingProxyType(d)


copyreg.pickle(types.MappingProxyType, lambda m: (_read_only, (dict(m),)))

MODELS = ("resnet50", "mobilenetv2", "bert_layer", "gpt_block", "shufflenet", "inception_v1")
PROGRAMS = ([("synthetic", {})]
            + [(f"{m}_{d}", {"dtype": d}) for m in MODELS for d in ("fp16", "fp32")]
            + [(f"bert_layer_tile_{d}", {"dtype": d, "matmul": "tile"}) for d in ("fp16", "fp32")]
            + [("small_cnn_4cores", {"cores": 4}), ("gpt_block_4cores", {"cores": 4})])
RUNS = {"synthetic": ({}, {"dep_mode": "auto"}, {"memory": "burst"}),
        "resnet50_fp16": ({}, {"memory": "burst"}), "bert_layer_tile_fp16": ({}, {"memory": "burst"})}


def program(name: str, options: dict, folder: Path, chip):
    path = folder / f"{name}.pkl"
    if path.exists():
        return pickle.loads(path.read_bytes())
    if name == "synthetic":
        from tpuflow.hwmodel.timing.synthetic import resnet50_like
        prog = resnet50_like(chip)
    else:
        from tpuflow.options import CompileOptions
        from tpuflow.pipeline import compile_model
        _, prog = compile_model(name.split("_fp")[0].replace("_tile", "").replace("_4cores", ""), chip,
                                CompileOptions(**options))
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps(prog))
    tmp.replace(path)
    return prog


def digest(result) -> dict:
    d = result.dram
    out = {"times": result.times, "stalls": result.stalls, "waits": result.waits, "cmd_id_dep": result.cmd_id_dep,
           "engine": result.engine, "cmd_id": result.cmd_id, "op": result.op, "layer": result.layer,
           "busy_ps": result.busy_ps, "total_ps": result.total_ps, "periods_ps": result.periods_ps,
           "dram": {k: getattr(d, k) for k in ("bytes_read", "bytes_written", "bursts", "page_hits", "page_misses",
                                               "page_opens", "active_ps", "peak_gbps")},
           "events": result.events}
    out["cores"] = [digest(c) for c in result.cores]
    return out


def dump(args) -> int:
    from tpuflow.chip import load_chip
    from tpuflow.hwmodel.timing import simulate
    chip = load_chip("sg2260")
    only = set(filter(None, (args.only or "").split(",")))
    report = {}
    for name, options in PROGRAMS:
        if only and name not in only:
            continue
        prog = program(name, options, args.programs, chip)
        for kwargs in RUNS.get(name, ({},)):
            key = name + "".join(f" {k}={v}" for k, v in kwargs.items())
            t = time.process_time()
            result = simulate(prog, **kwargs)
            cpu = time.process_time() - t
            report[key] = digest(result)
            print(f"{key:45s} {prog.total_instruction_count:7d} instr {cpu:7.3f} s cpu "
                  f"{prog.total_instruction_count / cpu:9.0f} instr/s  total {result.total_ps} ps", flush=True)
    args.out.write_bytes(pickle.dumps(report))
    return 0


def differences(a, b, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys {sorted(a)} != {sorted(b)}"]
        return [x for k in a for x in differences(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype or not np.array_equal(a, b):
            return [f"{path}: arrays differ ({a.dtype}{a.shape} vs {b.dtype}{b.shape})"]
        return []
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [x for i, (p, q) in enumerate(zip(a, b)) for x in differences(p, q, f"{path}[{i}]")]
    return [] if type(a) is type(b) and a == b else [f"{path}: {a!r} != {b!r}"]


def compare(args) -> int:
    before, after = pickle.loads(args.before.read_bytes()), pickle.loads(args.after.read_bytes())
    bad = 0
    for key in before:
        if key not in after:
            print(f"{key}: missing after")
            bad += 1
            continue
        ev = (before[key].pop("events"), after[key].pop("events"))
        for c in (*before[key]["cores"], *after[key]["cores"]):
            c.pop("events")
        diffs = differences(before[key], after[key])
        bad += bool(diffs)
        print(f"{key:45s} {'IDENTICAL' if not diffs else 'DIFFERS'}  events {ev[0]} -> {ev[1]}")
        for d in diffs[:10]:
            print("    " + d)
    print(f"{len(before)} runs compared, {bad} differ")
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    d = sub.add_parser("dump")
    d.add_argument("out", type=Path)
    d.add_argument("--programs", type=Path, default=Path("/tmp/timing_identity_programs"))
    d.add_argument("--only", default="")
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = ap.parse_args(argv)
    return dump(args) if args.command == "dump" else compare(args)


if __name__ == "__main__":
    sys.exit(main())
