"""The Python API: compile / estimate / verify / inspect as plain functions, and the `cmd_*`
functions the CLI calls (they print and return an exit code)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from tpuflow.chip import ChipConfig, builtin_chip_names, load_chip
from tpuflow.options import CompileOptions
from tpuflow.progress import step


def _print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


def _table(rows: list[tuple], header: tuple) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(header, widths)).rstrip()]
    lines += ["  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


# ------------------------------------------------------------------ disasm

def cmd_disasm(path: Path, chip: str | None) -> int:
    """Print one line per instruction of an output directory or of one stream file."""
    from tpuflow.codegen.bmodel import bmodel_lines, is_bmodel
    from tpuflow.codegen.disasm import path_lines

    if is_bmodel(path):  # tpu-mlir's .bmodel: the command buffers of every core
        lines = list(bmodel_lines(path, load_chip(chip)))
    else:
        lines = list(path_lines(path, chip))  # decode everything before printing anything
    sys.stdout.write("".join(line + "\n" for line in lines))
    return 0


# ------------------------------------------------------------------ models, inspect

def load_graph(model=None, input_shapes=None):
    """A canonical frontend Graph from a bundled model name (None: the default model), an ONNX
    file path, an onnx.ModelProto or serialized bytes; `input_shapes` fixes symbolic dims, and its
    frontend.InputValue entries pin inputs to constants (--input-value)."""
    from tpuflow import frontend, models
    if model is None or (isinstance(model, str) and models.is_bundled(model) and not Path(model).is_file()):
        name = model or models.DEFAULT_MODEL
        return frontend.load(models.build_model(name), input_shapes, name=name)
    if isinstance(model, (str, Path)) and not Path(model).exists() and Path(model).suffix != ".onnx" \
            and len(Path(model).parts) == 1:
        models.resolve(model)               # raises: neither a file nor a bundled model
    return frontend.load(model, input_shapes)


def cmd_inspect(model, chip: str | None, dtype: str, input_shapes, as_json: bool) -> int:
    """Print the summary. A model with unsupported operators still gets one (tpuflow.partial_inspect),
    its unsupported nodes marked, and then fails like compile does (exit code 2, the one-line error);
    with --json the summary's keys go into the error document (the CLI prints it)."""
    from tpuflow.errors import UnsupportedOpError
    from tpuflow.frontend.summary import format_summary, inspect_summary
    from tpuflow.partial_inspect import format_partial, partial_summary
    chip = load_chip(chip)
    try:
        summary = inspect_summary(load_graph(model, input_shapes), chip, dtype)
        summary.update(supported=True, unsupported={}, model_bound_us=summary["lower_bound_us"])  # estimate's key
    except UnsupportedOpError as exc:
        summary = partial_summary(model, input_shapes, chip, dtype, exc)
        if as_json:
            exc.partial_result = summary
        else:
            print(format_partial(summary), flush=True)
        raise
    if as_json:
        _print_json(summary)
    else:
        print(format_summary(summary))
    return 0


def cmd_models(as_json: bool) -> int:
    from tpuflow import models
    rows = [(n, models.describe(n)) for n in models.names()]
    if as_json:
        _print_json([{"name": n, "description": d, "default": n == models.DEFAULT_MODEL} for n, d in rows])
    else:
        print(_table([(n + (" (default)" if n == models.DEFAULT_MODEL else ""), d) for n, d in rows],
                     ("model", "description")))
    return 0


# ------------------------------------------------------------------ chips

def cmd_chips(name: str | None, as_json: bool) -> int:
    if name is None:
        chips = [load_chip(n) for n in builtin_chip_names()]
        if as_json:
            _print_json([{"name": c.name, "description": c.core.description, "fingerprint": c.fingerprint()}
                         for c in chips])
        else:
            print(_table([(c.name, c.fingerprint(), c.core.description) for c in chips],
                         ("chip", "fingerprint", "description")))
        return 0
    chip = load_chip(name)
    if as_json:
        _print_json({"name": chip.name, "fingerprint": chip.fingerprint(), "config": chip.as_dict()})
        return 0
    print(f"{chip.name}: {chip.core.description}\nfingerprint {chip.fingerprint()}  (source: {chip.source})\n")
    print(_table(chip.describe(), ("key", "value", "unit", "meaning")))
    return 0


# ------------------------------------------------------------------ model -> graph -> program

# (model -> Graph is load_graph, in the "models, inspect" section above)

def compile_model(model, chip: ChipConfig | str | None = None, options: CompileOptions | None = None,
                  input_shapes: dict | None = None, emit_qdq: Path | None = None):
    """(Graph, Program) for a model: frontend, lowering, then the scheduler's ordering. With
    --dtype int8 a float model is quantized first (tpuflow.quantize: onnxruntime's post-training
    quantizer, QDQ, calibrated as the options say; written to `emit_qdq` when given), the rest of
    it compiled in fp16; the Graph is then the QDQ model's and Program.quantization its record."""
    from tpuflow.lowering import lower
    chip = chip if isinstance(chip, ChipConfig) else load_chip(chip)
    options = options or CompileOptions()
    quantization = None
    _check_emit_qdq(options, emit_qdq)
    if options.dtype == "int8":
        from tpuflow.quantize import FLOAT_REST
        model, input_shapes, quantization = _quantize(model, options, input_shapes, emit_qdq)
        options = replace(options, dtype=FLOAT_REST, calibration=CompileOptions.calibration, calibration_data="")
    with step("import and canonicalise the model"):
        graph = load_graph(model, input_shapes)
    _check_quantized(graph)
    chip.check_cores(options.cores)
    with step(f"lower {graph.name} for {chip.name} ({options.dtype}, matmul={options.matmul})"):
        program = lower(graph, chip, options)
    _check_core_split(program, options.cores)
    if options.schedule != "program":
        from tpuflow.scheduler import schedule
        with step(f"{options.schedule} schedule of {program.total_instruction_count} instructions"):
            program = schedule(program, options.schedule, time_limit_s=options.time_limit_s)
    if quantization is not None:
        program.quantization = quantization.record()
    return graph, program


def _check_emit_qdq(options: CompileOptions, emit_qdq: Path | None) -> None:
    """--emit-qdq is refused before any work: without --dtype int8, or a path that cannot be a file."""
    from tpuflow.errors import InputFileError, OptionError
    if emit_qdq is None:
        return
    if options.dtype != "int8":
        raise OptionError("option --emit-qdq: only with --dtype int8 (it writes the model tpuflow quantized)")
    if Path(emit_qdq).is_dir() or not Path(emit_qdq).parent.is_dir():
        what = "is a directory" if Path(emit_qdq).is_dir() else "its folder does not exist"
        raise InputFileError(f"{emit_qdq}: cannot write the QDQ model there ({what})")


def _quantize(model, options: CompileOptions, input_shapes, emit_qdq: Path | None):
    """--dtype int8: (the QDQ model, the input shapes left for it, the Quantization record)."""
    from tpuflow.frontend.pinning import split_inputs
    from tpuflow.quantize import quantize, write_qdq
    source = f"npz files of {options.calibration_data}" if options.calibration_data else \
        f"{options.calibration} seeded random inputs"
    with step(f"post-training int8 quantization (onnxruntime, calibrated on {source})"):
        quantization = quantize(model, input_shapes, options.calibration, options.calibration_data)
    if emit_qdq is not None:
        write_qdq(quantization.model, emit_qdq)
    # pinned inputs are initializers of the QDQ model
    return quantization.model, split_inputs(input_shapes)[0], quantization


def _check_quantized(graph) -> None:
    """A pre-quantized model (QDQ / QOperator) compiles through the int8 lowering (issue 15) when
    every quantized node is one it supports; otherwise one clear error naming the first node it
    cannot emit, instead of a failure inside the lowering."""
    from tpuflow.lowering.quant import check_supported
    check_supported(graph)


def _check_core_split(program, cores: int) -> None:
    """--cores N is honoured or refused, never silently run on fewer cores (issue 14: until lowering
    splits over cores, a program with fewer cores than asked is an error)."""
    if program.core_count < cores:
        from tpuflow.errors import OptionError
        raise OptionError(f"option --cores {cores}: the compiler does not split over cores yet "
                          f"(the program has {program.core_count})")


def cmd_compile(model, chip, options: CompileOptions, input_shapes: dict, output: Path,
                emit_qdq: Path | None = None) -> int:
    from tpuflow.codegen import write_program
    graph, program = compile_model(model, chip, options, input_shapes, emit_qdq)
    path = write_program(program, output, name=graph.name)
    counts = {e: sum(c[e] for c in program.core_counts()) for e in ("tiu", "gdma", "tile")}
    cores = f" on {program.core_count} cores" if program.core_count > 1 else ""
    print(f"compiled {graph.name} for {program.chip.name} (fingerprint {program.chip.fingerprint()}; "
          f"{options.dtype}, matmul={options.matmul}, "
          f"schedule={options.schedule}): {counts['tiu']} TIU, {counts['gdma']} GDMA, {counts['tile']} TILE "
          f"instructions{cores} -> {path}")
    if program.quantization:
        from tpuflow.quantize import float_op_lines
        print("\n".join(float_op_lines(program.quantization)))
    return 0


# ------------------------------------------------------------------ verify

def verify(model=None, chip: ChipConfig | str | None = None, options: CompileOptions | None = None,
           input_shapes: dict | None = None, seed: int = 0, race_check: bool = True,
           emit_qdq: Path | None = None) -> dict:
    """Compile, then verify_program: the binaries, run on the functional model, against onnxruntime.
    --dtype int8 on a float model: the bound is against onnxruntime on the QDQ model tpuflow made,
    and each output also carries its error against the float model (`vs_float`)."""
    options = options or CompileOptions()
    graph, program = compile_model(model, chip, options, input_shapes, emit_qdq)
    float_graph = load_graph(model, input_shapes) if program.quantization else None
    return verify_program(graph, program, seed, race_check, float_graph)


def verify_program(graph, program, seed: int = 0, race_check: bool = True, float_graph=None) -> dict:
    """Verify a program compile_model gave (with its graph): write its binaries, read and decode
    them back, run them on the functional model (race detector on) with seeded random inputs, and
    compare every output with onnxruntime. With `float_graph` (the float model a --dtype int8
    program was quantized from) each output also gets its error against onnxruntime on that model,
    for our outputs (`vs_float`) and for onnxruntime's on the QDQ model (`qdq_vs_float`)."""
    import tempfile
    from tpuflow.codegen import read_program, write_program
    from tpuflow.compare import REFERENCE_ATOL, TOLERANCES, compare, random_inputs, reference_outputs
    from tpuflow.estimate import typed_options
    from tpuflow.frontend.inputs import tolerance_dtype
    from tpuflow.hwmodel.functional import run
    options = CompileOptions(**{k: v for k, v in typed_options(program.options).items()
                                if k in CompileOptions.__dataclass_fields__})
    with tempfile.TemporaryDirectory(prefix="tpuflow-verify-") as tmp:
        write_program(program, Path(tmp), name=graph.name)
        decoded = read_program(Path(tmp), program.chip)
    inputs = random_inputs(graph, seed)
    with step("functional model" + (" with the race detector" if race_check else "")):
        ours = run(decoded, inputs, race_check=race_check)
    steps = quantized_output_steps(graph)
    with step("onnxruntime reference"):
        ref = reference_outputs(graph, _in_program_floats(inputs, options.dtype) if _is_quantized(graph) else inputs)
    errors = [compare(name, ours[name], ref[name]) for name in graph.outputs]
    bound = tolerance_dtype(graph, options.dtype)        # an fp16 model's reference is itself fp16
    tol = TOLERANCES[bound]
    passed = [_quantized_ok(e, steps[e.name]) if steps.get(e.name) else e.ok(bound) for e in errors]
    rows = _output_rows(errors, passed, steps)
    if float_graph is not None:
        _add_float_errors(rows, ours, ref, float_graph, inputs)
    return {"ok": all(passed), "model": graph.name, "chip": program.chip.name,
            "chip_fingerprint": program.chip.fingerprint(), "dtype": options.dtype, "matmul": options.matmul,
            "schedule": options.schedule, "seed": seed, "race_check": race_check,
            "rtol": tol["rtol"], "min_cosine": tol["min_cosine"], "atol": REFERENCE_ATOL,
            "instructions": program.counts(),
            "outputs": rows,
            **({"cores": program.core_count, "core_instructions": program.core_counts()}
               if program.core_count > 1 else {}),
            **({"quantization": program.quantization} if program.quantization else {})}


def _add_float_errors(rows: list[dict], ours: dict, ref: dict, float_graph, inputs: dict) -> None:
    """Add `vs_float` and `qdq_vs_float` to verify's output rows: the error of our outputs and of
    onnxruntime's on the QDQ model against onnxruntime on the float model (information: the cost
    of quantization, no bound)."""
    from tpuflow.compare import compare, reference_outputs
    with step("onnxruntime on the float model"):
        float_ref = reference_outputs(float_graph, inputs)
    for row in rows:
        name = row["name"]
        for key, values in (("vs_float", ours[name]), ("qdq_vs_float", ref[name])):
            e = compare(name, values, float_ref[name])
            row[key] = {"max_abs_err": e.max_abs_err, "max_rel_err": e.max_rel_err, "cosine": e.cosine}


def _output_rows(errors, passed, steps) -> list[dict]:
    return [dict(e.as_dict(), ok=ok, **({"quant_step": steps[e.name], "max_abs_bound": QUANT_STEPS_ALLOWED
                                          * steps[e.name], "quant_min_cosine": QUANT_MIN_COSINE}
                                         if steps.get(e.name) else {}))
            for e, ok in zip(errors, passed)]


# verify's bound on an output of a quantized model (issue 15, deliverable 5): the functional model
# against onnxruntime running the same QDQ / QOperator model, within this many quantization steps of
# the output (the scale of the quantized tensor it is read from: a 1-LSB difference in a requantised
# tensor upstream can move it by a step or so) and at least this cosine similarity.
QUANT_STEPS_ALLOWED = 2
QUANT_MIN_COSINE = 0.999
_STEP_THROUGH = ("DequantizeLinear", "Reshape", "Transpose", "Slice", "Identity", "Flatten", "Squeeze", "Unsqueeze")


def quantized_output_steps(graph) -> dict[str, float]:
    """{output: its quantization step} for the outputs of `graph` that hold quantized values: an
    integer output (step 1: compared as stored integers), or a float one read through
    DequantizeLinear (and moves) from a quantized tensor (step: its largest scale)."""
    out = {}
    for name in graph.outputs:
        tensor, seen = name, 0
        while seen < 16:
            quant = graph.tensor(tensor).quant
            if quant is not None:
                out[name] = 1.0 if tensor == name else max(float(v) for v in quant.scale.reshape(-1))
                break
            producer = graph.producer(tensor)
            if producer is None or producer.op_type not in _STEP_THROUGH:
                break
            tensor, seen = producer.inputs[0], seen + 1
    return out


def _is_quantized(graph) -> bool:
    """A graph with quantized tensors (a QDQ / QOperator model, or --dtype int8's)."""
    return any(t.quant is not None for t in graph.tensors.values())


def _in_program_floats(inputs: dict, dtype: str) -> dict:
    """Float inputs rounded to the program's float type, as the chip reads them: a quantized model's
    reference then sees the values the chip's QuantizeLinear sees (an fp16-rounded input can flip
    an input integer, which no int8 program can avoid)."""
    import numpy as np
    from tpuflow.isa import Prec
    from tpuflow.lowering.weights import to_storage
    out = {}
    for name, value in inputs.items():
        if value.dtype != np.float32 or dtype == "fp32":
            out[name] = value
        elif dtype == "bf16":
            out[name] = (to_storage(value, Prec.BF16).astype(np.uint32) << 16).view(np.float32)
        else:
            out[name] = value.astype(np.float16).astype(np.float32)
    return out


def _quantized_ok(error, step: float) -> bool:
    return error.max_abs_err <= QUANT_STEPS_ALLOWED * step and error.cosine >= QUANT_MIN_COSINE


def cmd_verify(model, chip, options: CompileOptions, input_shapes: dict, seed: int, race_check: bool,
               as_json: bool, emit_qdq: Path | None = None) -> int:
    result = verify(model, chip, options, input_shapes, seed, race_check, emit_qdq)
    if as_json:
        _print_json(result)
    else:
        rows = [(o["name"], f"{o['max_abs_err']:.3e}", f"{o['max_rel_err']:.3e}", f"{o['cosine']:.6f}",
                 "ok" if o["ok"] else "FAIL")
                for o in result["outputs"]]
        dtype = f"int8, the rest {result['dtype']}" if result.get("quantization") else result["dtype"]
        print(f"verify {result['model']} on {result['chip']} (fingerprint {result['chip_fingerprint']}; "
              f"{dtype}, matmul={result['matmul']}, "
              f"seed {result['seed']}, race check {'on' if race_check else 'off'})")
        print(_table(rows, ("output", "max_abs_err", "max_rel_err", "cosine", "")))
        print(f"{'PASS' if result['ok'] else 'FAIL'}: bounds max_rel_err <= {result['rtol']:g} and "
              f"cosine >= {result['min_cosine']:g}, or max_abs_err <= {result['atol']:g} (the reference's own accuracy)")
        for o in (o for o in result["outputs"] if "quant_step" in o):
            print(f"  {o['name']} holds quantized values: bound max_abs_err <= {QUANT_STEPS_ALLOWED} x its quantization "
                  f"step {o['quant_step']:.4g} = {o['max_abs_bound']:.4g} and cosine >= {QUANT_MIN_COSINE:g}")
        if result.get("quantization"):
            print("\n".join(_int8_verify_lines(result)))
    return 0 if result["ok"] else 1


def _int8_verify_lines(result: dict) -> list[str]:
    """verify's text for --dtype int8 on a float model: what was compared, how it was quantized, and
    the error against the float model (no bound: the cost of quantization)."""
    from tpuflow.quantize import float_op_lines
    rows = [(o["name"], f"{o['vs_float']['max_abs_err']:.3e}", f"{o['vs_float']['cosine']:.6f}",
             f"{o['qdq_vs_float']['max_abs_err']:.3e}", f"{o['qdq_vs_float']['cosine']:.6f}")
            for o in result["outputs"] if "vs_float" in o]
    return ["the reference above is onnxruntime on the QDQ model tpuflow quantized (--emit-qdq writes it)",
            *float_op_lines(result["quantization"]),
            "against onnxruntime on the float model (information, no bound):",
            _table(rows, ("output", "max_abs_err", "cosine", "qdq max_abs_err", "qdq cosine"))]


# ------------------------------------------------------------------ estimate

def estimate(model=None, chip: ChipConfig | str | None = None, options: CompileOptions | None = None,
             input_shapes: dict | None = None, with_sim: bool = False, emit_qdq: Path | None = None):
    """Compile and simulate; the estimate report dict (and the Program and SimResult if asked).
    `model` may be a folder of raw <name>.BD.0 / <name>.GDMA.0 streams (no manifest, e.g. tpu-mlir's)
    or a `compile` output folder: the binaries are simulated as they are (no graph, no compile)."""
    from tpuflow.codegen.vendor import is_stream_dir, read_stream_dir
    from tpuflow.estimate import estimate_report
    from tpuflow.hwmodel.timing import simulate
    from tpuflow.codegen.bmodel import is_bmodel, read_bmodel_program
    if model is not None and isinstance(model, (str, Path)) and is_bmodel(model):  # tpu-mlir's .bmodel
        program, _ = read_bmodel_program(model, chip if isinstance(chip, ChipConfig) else load_chip(chip))
        with step("timing simulation"):
            sim = simulate(program, check=False)
        report = estimate_report(program, sim)
        return (report, program, sim) if with_sim else report
    if model is not None and isinstance(model, (str, Path)) and Path(model).is_dir():
        from tpuflow.codegen import read_program
        if is_stream_dir(model):  # raw streams: their own dependencies, no bitmap check
            program, _ = read_stream_dir(model, chip if isinstance(chip, ChipConfig) else load_chip(chip))
        else:  # a `compile` output folder (manifest.json)
            program = read_program(Path(model), chip)
        with step("timing simulation"):
            sim = simulate(program, check=not is_stream_dir(model))
        report = estimate_report(program, sim)
        return (report, program, sim) if with_sim else report
    options = options or CompileOptions()
    graph, program = compile_model(model, chip, options, input_shapes, emit_qdq)
    with step("timing simulation"):
        sim = simulate(program)
    report = estimate_report(program, sim)
    return (report, program, sim) if with_sim else report


def cmd_estimate(model, chip, options: CompileOptions, input_shapes: dict, as_json: bool,
                 trace: Path | None, profile: Path | None, emit_qdq: Path | None = None) -> int:
    from tpuflow.codegen.profile import write_profile, write_trace
    from tpuflow.estimate import render_text
    report, program, sim = estimate(model, chip, options, input_shapes, with_sim=True, emit_qdq=emit_qdq)
    if trace is not None:
        write_trace(trace, program, sim)
    if profile is not None:
        write_profile(profile, sim, program)
    if as_json:
        _print_json(report)
    else:
        print(render_text(report))
    return 0


# ------------------------------------------------------------------ report

def cmd_report(model, chip, options: CompileOptions, input_shapes: dict, output: Path,
               trace: Path | None, profile: Path | None, emit_qdq: Path | None = None) -> int:
    """Compile in emission order, run every schedule for the comparison, and write the HTML report of
    the requested one (and its trace / profile)."""
    from dataclasses import replace
    from tpuflow.codegen.profile import write_profile, write_trace
    from tpuflow.codegen.report import compare_schedules, write_report
    from tpuflow.estimate import estimate_report
    graph, emitted = compile_model(model, chip, replace(options, schedule="program"), input_shapes, emit_qdq)
    with step("program / list / cpsat schedules, each simulated"):
        runs = compare_schedules(emitted, options.schedule, options.time_limit_s)
    program, sim = runs[options.schedule].program, runs[options.schedule].sim
    program.options["schedule"] = options.schedule
    program.quantization = emitted.quantization
    report = estimate_report(program, sim)
    with step("HTML report"):
        size = write_report(output, program, sim, report, runs)
    if trace is not None:
        write_trace(trace, program, sim)
    if profile is not None:
        write_profile(profile, sim, program)
    print(f"report of {graph.name} on {program.chip.name} ({options.schedule} schedule, {sim.total_us:.1f} us, "
          f"{program.instruction_count} instructions) -> {output} ({size / 1e6:.2f} MB)")
    return 0
