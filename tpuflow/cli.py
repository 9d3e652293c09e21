"""The `tpuflow` command line: parses options, calls tpuflow.pipeline, prints, maps errors to exit codes."""

from __future__ import annotations

import argparse
import json
import re
import sys
import traceback
from pathlib import Path

from tpuflow import __version__
from tpuflow.errors import OptionError, TpuflowError

NODE_IN_MESSAGE = re.compile(r"\bnode '([^']+)'")
DEFAULT_MODEL_HELP = "model file (.onnx) or bundled model name (see `tpuflow models`); default: the default model"


def _shape_arg(text: str) -> tuple[str, tuple[int, ...]]:
    name, sep, dims = text.rpartition("=")
    try:
        if not sep or not name:
            raise ValueError
        return name, tuple(int(d) for d in dims.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--input-shape expects name=d0,d1,..., got '{text}'") from None


def _value_arg(text: str):
    from tpuflow.frontend.pinning import InputValue
    name, sep, value = text.partition("=")
    try:
        if not sep or not name:
            raise ValueError
        return name, InputValue.parse(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--input-value expects name=value or name=v0,v1,..., got '{text}'") from None


def _add_model(p: argparse.ArgumentParser, optional: bool = False) -> None:
    if optional:
        p.add_argument("model", nargs="?", default=None, help=DEFAULT_MODEL_HELP)
    else:
        p.add_argument("model", help=DEFAULT_MODEL_HELP.replace("; default: the default model", ""))
    p.add_argument("--input-shape", action="append", type=_shape_arg, default=[], metavar="NAME=D0,D1,...",
                   help="fix the shape of a graph input with symbolic dimensions (repeatable)")
    p.add_argument("--input-value", action="append", type=_value_arg, default=[], metavar="NAME=VALUE",
                   help="pin a graph input to a constant (scalar or comma list, e.g. sr=16000) before "
                        "folding, so branches that depend on it fold away (repeatable)")


def _add_chip(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chip", default=None, help="built-in chip name or chip TOML file (default: sg2260)")
    p.add_argument("--dtype", default="fp32", help="fp32 | fp16 | bf16 (f32/f16 accepted) | int8 (post-training "
                   "quantization of a float model, the rest fp16)")


def _add_compile(p: argparse.ArgumentParser) -> None:
    _add_chip(p)
    p.add_argument("--matmul", default="tiu", help="tiu | tile: engine for MatMul/Gemm")
    p.add_argument("--tile-engine", default="fit",
                   help="with --matmul tile, which convs and MatMuls run on the cube: fit (default: where the "
                        "shared cost model's busiest unit of their instructions is less busy than on the TIU) | all "
                        "(every conv / MatMul the cube can take) | cost (the faster on the timing model, per group)")
    p.add_argument("--schedule", default="list", help="program | list (default) | cpsat")
    p.add_argument("--dep-mode", default="bitmap", help="bitmap | auto: how cmd_id_dep is computed")
    p.add_argument("--time-limit", type=float, default=20.0, help="CP-SAT budget in seconds (deterministic)")
    p.add_argument("--layer-group", default="on",
                   help="on (default) | off: keep activations in LMEM across fused groups, or round-trip DDR")
    p.add_argument("--cores", type=int, default=1,
                   help="cores to split the model over (default 1, at most the chip's core.cores)")
    _add_int8(p)


def _add_int8(p: argparse.ArgumentParser) -> None:
    """The options of tpuflow's post-training quantization (--dtype int8 on a float model)."""
    p.add_argument("--calibration", type=int, default=None, metavar="N",
                   help="--dtype int8: calibrate activations on N seeded random inputs (default 8)")
    p.add_argument("--calibration-data", default=None, metavar="DIR",
                   help="--dtype int8: calibrate on DIR/*.npz instead, one sample per file, arrays keyed by "
                        "the model's input names")
    p.add_argument("--emit-qdq", type=Path, default=None, metavar="OUT.onnx",
                   help="--dtype int8: also write the quantized model that is compiled, as QDQ ONNX")


def _add_outputs(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", type=Path, default=None, help="write a Perfetto / Chrome trace-event JSON file")
    p.add_argument("--profile", type=Path, default=None, help="write one CSV row per instruction")


class UsageError(OptionError):
    """A command line argparse rejects; carries the usage line of the (sub)command."""

    def __init__(self, message: str, usage: str):
        super().__init__(message)
        self.usage = usage


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so a bad command line is reported like any other error."""

    def error(self, message: str):
        raise UsageError(message, self.format_usage())


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tpuflow", description="ONNX compiler and performance estimator "
                                     "for TPU-class accelerators (SG2260 family).")
    parser.add_argument("--version", action="version", version=f"tpuflow {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("inspect", help="graph summary: ops, shapes, MACs, bytes, roofline bound")
    _add_model(p, optional=True)
    _add_chip(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser("compile", help="compile to instruction binaries + manifest.json")
    _add_model(p, optional=True)
    _add_compile(p)
    p.add_argument("-o", "--output", type=Path, required=True, help="output directory")

    p = sub.add_parser("estimate", help="latency, utilisation, stalls, per-layer table (MODEL may also be a "
                       "`compile` output folder, a folder of raw .BD.0/.GDMA.0 streams or a tpu-mlir .bmodel, "
                       "simulated as they are)")
    _add_model(p, optional=True)
    _add_compile(p)
    _add_outputs(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser("report", help="self-contained HTML report of the schedule")
    _add_model(p, optional=True)
    _add_compile(p)
    _add_outputs(p)
    p.add_argument("-o", "--output", type=Path, required=True, help="report.html to write")

    p = sub.add_parser("verify", help="run the binaries on the functional model and compare with onnxruntime")
    _add_model(p, optional=True)
    _add_compile(p)
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--no-race-check", action="store_true", help="skip the LMEM race detector (faster)")
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser("disasm", help="human-readable listing of compiled binaries")
    p.add_argument("path", type=Path, help="output directory of `compile`, a folder of raw <name>.BD.0 / "
                   "<name>.GDMA.0 streams (e.g. tpu-mlir's), one .BD/.GDMA/.TILE file, or a tpu-mlir .bmodel")
    p.add_argument("--chip", default=None, help="chip the binaries were compiled for (default: from manifest)")

    p = sub.add_parser("chips", help="list the built-in chips, or print one with units")
    p.add_argument("name", nargs="?", default=None, help="chip name or chip TOML file")
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser("models", help="list the bundled models")
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser("sweep", help="design-space sweep on Dask: every combination of a spec's models, dtypes "
                       "and chip-key values, one row per point (local cluster, or --scheduler ADDRESS)")
    p.add_argument("spec", type=Path, help="sweep spec TOML (models, dtypes, chip, cores, [grid], [options], [inputs])")
    p.add_argument("-o", "--output", type=Path, required=True,
                   help="OUT.parquet (or .csv); points already in it are skipped (resume)")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="a running Dask scheduler (tcp://HOST:8786); default: a local cluster")
    p.add_argument("--workers", type=int, default=None, help="local cluster workers (default: one per core)")
    p.add_argument("--html", type=Path, default=None, help="also write a self-contained sweep.html")
    p.add_argument("--json", action="store_true", help="machine-readable summary")
    return parser


def _print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False) + "\n")


def _options(args):
    from tpuflow.options import CALIBRATION_DEFAULT, CompileOptions
    if args.calibration is not None and args.calibration_data is not None:
        raise OptionError("options --calibration and --calibration-data: give one of them")
    return CompileOptions(dtype=args.dtype, matmul=args.matmul, dep_mode=args.dep_mode,
                          schedule=args.schedule, time_limit_s=args.time_limit,
                          layer_group=args.layer_group, cores=args.cores, tile_engine=args.tile_engine,
                          calibration=CALIBRATION_DEFAULT if args.calibration is None else args.calibration,
                          calibration_data=args.calibration_data or "")


def _shapes(args) -> dict[str, tuple[int, ...]]:
    return {**dict(args.input_shape), **dict(getattr(args, "input_value", []))}


def run(args) -> int:
    from tpuflow import pipeline

    if args.command == "chips":
        return pipeline.cmd_chips(args.name, args.json)
    if args.command == "models":
        return pipeline.cmd_models(args.json)
    if args.command == "inspect":
        return pipeline.cmd_inspect(args.model, args.chip, args.dtype, _shapes(args), args.json)
    if args.command == "disasm":
        return pipeline.cmd_disasm(args.path, args.chip)
    if args.command == "compile":
        return pipeline.cmd_compile(args.model, args.chip, _options(args), _shapes(args), args.output,
                                    emit_qdq=args.emit_qdq)
    if args.command == "verify":
        return pipeline.cmd_verify(args.model, args.chip, _options(args), _shapes(args), args.seed,
                                   not args.no_race_check, args.json, emit_qdq=args.emit_qdq)
    if args.command == "estimate":
        return pipeline.cmd_estimate(args.model, args.chip, _options(args), _shapes(args), args.json,
                                     args.trace, args.profile, emit_qdq=args.emit_qdq)
    if args.command == "sweep":
        from tpuflow.sweep import cmd_sweep
        return cmd_sweep(args.spec, args.output, args.scheduler, args.workers, args.html, args.json)
    if args.command == "report":
        return pipeline.cmd_report(args.model, args.chip, _options(args), _shapes(args), args.output,
                                   args.trace, args.profile, emit_qdq=args.emit_qdq)
    raise OptionError("no command given (try `tpuflow --help`)")


def error_document(exc: BaseException, code: int, message: str) -> dict:
    """The --json form of an error: {"ok": false, "error": {"code", "message", "node", ...}}. `node` names
    the ONNX node at fault when the error knows one (its `node` attribute, the first of a list of
    unsupported operators, or the node the message names as "node 'NAME'"), else null; an unsupported-operator error also lists them all as {op: [node, ...]}."""
    named = NODE_IN_MESSAGE.search(message)
    error = {"code": code, "message": message, "type": type(exc).__name__,
             "node": getattr(exc, "node", None) or (named.group(1) if named else None)}
    unsupported = getattr(exc, "unsupported", None)
    if unsupported:
        error["unsupported"] = unsupported
        error["node"] = error["node"] or next(iter(unsupported.values()))[0]
    return {"ok": False, "error": error}


def _report_error(exc: BaseException, code: int, prefix: str, message: str, as_json: bool) -> int:
    """One line on stderr always; with --json also the error document on stdout."""
    print(f"tpuflow: {prefix}: {message}", file=sys.stderr)
    if as_json:      # a command's partial result (inspect of a rejected model) joins the document
        _print_json({**error_document(exc, code, message), **getattr(exc, "partial_result", {})})
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    as_json = "--json" in argv
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        sys.stderr.write(exc.usage)
        return _report_error(exc, exc.exit_code, "error", str(exc), as_json)
    debug, as_json = args.debug, getattr(args, "json", False)
    try:
        return run(args)
    except TpuflowError as exc:
        if debug:
            traceback.print_exc()
        return _report_error(exc, exc.exit_code, "error", str(exc), as_json)
    except KeyboardInterrupt:
        print("tpuflow: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # an internal error: one line unless --debug
        if debug:
            traceback.print_exc()
        return _report_error(exc, 1, "internal error", f"{type(exc).__name__}: {exc} "
                             "(rerun with --debug for the traceback)", as_json)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
