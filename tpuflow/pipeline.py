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
    from tpuflow.frontend.summary import format_summary
    from tpuflow.partial_inspect import format_partial, partial_summary
    chip = load_chip(chip)
    try:
        summary = _inspect_summary(model, chip, dtype, input_shapes)
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


def _inspect_summary(model, chip, dtype: str, input_shapes) -> dict:
    """inspect's summary. --dtype int8 on a float model summarises the model compile would build:
    quantized first (default calibration: which ops stay float does not depend on it), int8 where
    the quantizer put it and the float rest at its type, with the quantization record."""
    from tpuflow.frontend.stats import compute_dtype
    from tpuflow.frontend.summary import inspect_summary
    quantization = None
    if compute_dtype(dtype) == "int8":
        from tpuflow.quantize import FLOAT_REST
        model, input_shapes, quantization = _quantize(model, CompileOptions(dtype="int8"), input_shapes, None)
        dtype = FLOAT_REST
    summary = inspect_summary(load_graph(model, input_shapes), chip, dtype)
    summary.update(supported=True, unsupported={}, model_bound_us=summary["lower_bound_us"])  # estimate's key
    if quantization is not None:
        summary.update(dtype="int8", float_rest=dtype, quantization=quantization.record())
    return summary


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
    engine = f", tile-engine={options.tile_engine}" if options.matmul == "tile" else ""
    with step(f"lower {graph.name} for {chip.name} ({options.dtype}, matmul={options.matmul}{engine})"):
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
    for our outputs (`vs_float`) and for onnxruntime's on the QDQ model (`qdq_vs_float`).

    A quantized graph (QDQ / QOperator, or --dtype int8's QDQ model) is checked as follows.
    1. The reference is onnxruntime running the model with the float inputs and every float tensor the
       program stores at its float type rounded to that type (compare.stored_float_tensors: the
       canonical graph's float runtime tensors; not the float results inside an absorbed
       DequantizeLinear -> op -> QuantizeLinear, which the program computes in integers, and which
       reads the unrounded value of a tensor stored for other readers: compare.integer_readers), in both of
       its executions: as written (graph optimizations off: DequantizeLinear -> float op ->
       QuantizeLinear) and optimized (fused integer kernels that requantize with their own rounding;
       uint8 activations run there as int8, compare.signed_activations: the same values, and
       onnxruntime's int8 x int8 kernels are exact on every x86 CPU while its uint8 x int8 ones
       saturate pairs of products to int16 on those without VNNI).
       The two differ from each other by more than the bound on --dtype int8's QDQ models of the
       bundled CNNs (MobileNetV2 4 output steps, VGG-19's softmax cosine 0.9987: near-ties resolve one
       way or the other and compound with depth), so an output passes when it meets rules 2-3 against
       either; the row names the execution that decided it (`reference`) and carries the other
       (`vs_other_execution`). The fp32 run as written stays as information (`vs_qdq_fp32`), and so
       does how far onnxruntime's two executions are from each other (`executions_apart`).
    2. An output holding quantized values (read through DequantizeLinear and moves from a quantized
       tensor, or an integer output) passes when its integer codes, round(y / scale) + zero point
       for ours and the reference, differ by at most QUANT_STEPS_ALLOWED and the cosine of the values
       is at least QUANT_MIN_COSINE (fp16 rounding of a dequantized output is under half a step, so
       the codes are the program's integers).
    3. Any other output passes the float bound of the program's float type; failing that, it passes
       decomposed when every quantized tensor feeding its float tail (the boundary), read from the
       functional model's DDR, is within the step bound of the reference's, and the tail, run by
       onnxruntime on the program's boundary values, is within the float bound of our output. A
       boundary the program keeps out of DDR cannot be read: the row says the tail was checked
       against the reference boundary only, which is the direct check.
    4. An output that fails rules 2-3 end to end passes stage-wise (tpuflow.stagewise) when every
       quantized tensor the program stores in DDR or an int8 chain holds in LMEM (snapshotted right
       after its producer's last write), recomputed by onnxruntime from the program's own values of
       the stored tensors it reads (teacher forcing, in either execution), is within
       QUANT_STEPS_ALLOWED codes, and the
       output recomputed from the program's stored tensors meets rule 2 or 3. One-step rounding
       differences (fp32 float arithmetic against integer kernels, fp16 float ops between int8
       layers, onnxruntime's QLinearAdd formula) compound with depth; rule 4 checks each stage
       against its own inputs, as tpu-mlir compares per-layer tensors. The row keeps its end-to-end
       numbers, says `check: stage-wise ...` and carries `stage_check` (stages, worst stage, those
       over the bound); a failing row gets it too, naming where the divergence starts."""
    import tempfile
    from tpuflow.codegen import read_program, write_program
    from tpuflow.compare import REFERENCE_ATOL, TOLERANCES, compare, random_inputs, reference_outputs
    from tpuflow.estimate import typed_options
    from tpuflow.frontend.inputs import tolerance_dtype
    from tpuflow.hwmodel.functional import run
    from tpuflow.stagewise import as_onnx_tensor, snapshot_points
    options = CompileOptions(**{k: v for k, v in typed_options(program.options).items()
                                if k in CompileOptions.__dataclass_fields__})
    with tempfile.TemporaryDirectory(prefix="tpuflow-verify-") as tmp:
        write_program(program, Path(tmp), name=graph.name)
        decoded = read_program(Path(tmp), program.chip)
    inputs = random_inputs(graph, seed)
    quantized = _is_quantized(graph)
    tails = _float_tails(graph) if quantized else {}
    readable = _ddr_readable(graph, decoded, {t for b in tails.values() for t in b})
    # the binaries hold no record of what int8 chains keep in LMEM: the lowering's (same instruction order)
    points = snapshot_points(graph, decoded, _quantized_produced(graph), program.held_tensors) if quantized else {}
    with step("functional model" + (" with the race detector" if race_check else "")):
        ours = run(_with_outputs(decoded, readable), inputs, race_check=race_check,
                   snapshots={STAGE_PREFIX + k: v for k, v in points.items()})
    stages = {k[len(STAGE_PREFIX):]: as_onnx_tensor(graph, k[len(STAGE_PREFIX):], ours.pop(k))
              for k in list(ours) if k.startswith(STAGE_PREFIX)}
    bound = tolerance_dtype(graph, options.dtype)        # an fp16 model's reference is itself fp16
    tol = TOLERANCES[bound]
    if quantized:
        rows, passed, ref = _quantized_rows(graph, options.dtype, bound, inputs, ours, tails, readable, stages)
    else:
        with step("onnxruntime reference"):
            ref = reference_outputs(graph, inputs)
        errors = [compare(name, ours[name], ref[name]) for name in graph.outputs]
        passed = [e.ok(bound) for e in errors]
        rows = [dict(e.as_dict(), ok=ok) for e, ok in zip(errors, passed)]
    if float_graph is not None:
        _add_float_errors(rows, ours, ref, float_graph, inputs)
    return {"ok": all(passed), "model": graph.name, "chip": program.chip.name,
            "chip_fingerprint": program.chip.fingerprint(), "dtype": options.dtype, "matmul": options.matmul,
            **({"tile_engine": options.tile_engine} if options.matmul == "tile" else {}),
            "schedule": options.schedule, "seed": seed, "race_check": race_check,
            "rtol": tol["rtol"], "min_cosine": tol["min_cosine"], "atol": REFERENCE_ATOL,
            "instructions": program.counts(),
            "outputs": rows,
            **({"cores": program.core_count, "core_instructions": program.core_counts()}
               if program.core_count > 1 else {}),
            **({"quantization": program.quantization} if program.quantization else {})}


STAGE_PREFIX = "stage:"          # functional-model snapshots of the stored quantized tensors (rule 4)


def _quantized_produced(graph) -> list[str]:
    """The quantized runtime tensors an ONNX node of the model produces, in node order."""
    return [o for node in graph.model.graph.node for o in node.output
            if o in graph.tensors and graph.tensor(o).quant is not None and not graph.tensor(o).is_const]


def _quantized_rows(graph, dtype: str, bound: str, inputs: dict, ours: dict, tails: dict, readable: set,
                    stages: dict):
    """(rows, passed, reference outputs) of a quantized graph's outputs under verify_program's rules 1-4."""
    from tpuflow.compare import (compare, integer_readers, rounded_model, run_onnxruntime, signed_activations,
                                 stored_float_tensors, unshifted, with_outputs)
    feeds = _in_program_floats(inputs, dtype)
    produced = {o for node in graph.model.graph.node for o in node.output}
    boundaries = sorted({t for b in tails.values() for t in b} & produced)
    stored = stored_float_tensors(graph) if dtype != "fp32" else []
    model = rounded_model(graph.model, stored, dtype, integer_readers(graph))
    wanted = with_outputs(model, list(graph.outputs) + boundaries)
    signed, shifted = signed_activations(wanted)
    with step("onnxruntime references (the quantized model as written and optimized, float tensors at " + dtype + ")"):
        refs = {False: run_onnxruntime(wanted, feeds, optimize=False),
                True: unshifted(run_onnxruntime(signed, feeds, optimize=True), shifted)}
        plain = run_onnxruntime(graph.model, inputs, optimize=False)
    quants = output_quants(graph)
    rows, passed = [], []
    for name in graph.outputs:
        checked = [_checked_row(graph, model, feeds, ours, ref, quants, tails, readable, bound, name, optimize)
                   for optimize, ref in refs.items()]
        row, other = checked if checked[0]["ok"] or not checked[1]["ok"] else checked[::-1]
        row["vs_other_execution"] = {k: other[k] for k in ("reference", "ok", "max_abs_err", "max_rel_err", "cosine",
                                                           "steps") if k in other}
        info = compare(name, ours[name], plain[name])
        row["vs_qdq_fp32"] = {"max_abs_err": info.max_abs_err, "max_rel_err": info.max_rel_err, "cosine": info.cosine}
        apart = compare(name, refs[True][name], refs[False][name])
        row["executions_apart"] = {"max_abs_err": apart.max_abs_err, "max_rel_err": apart.max_rel_err,
                                   "cosine": apart.cosine}
        if name in quants:
            _code_row(row["vs_qdq_fp32"], quants[name], ours[name], plain[name], info.cosine)
            _code_row(row["executions_apart"], quants[name], refs[True][name], refs[False][name], apart.cosine)
        rows.append(row)
        passed.append(row["ok"])
    if not all(passed) and stages:
        from tpuflow import stagewise
        with step(f"stage-wise check: {len(stages)} stored quantized tensors recomputed from the program's values"):
            result = stagewise.stage_check(graph, model, signed, shifted, feeds, ours, stages, bound)
        stagewise.apply(rows, passed, result, len(_quantized_produced(graph)))
    return rows, passed, refs[False]


def _checked_row(graph, model, feeds, ours, ref, quants, tails, readable, bound, name, optimize: bool) -> dict:
    """An output row of a quantized graph checked by rules 2-3 against one of onnxruntime's two
    executions of the rounded model (`reference` says which)."""
    from tpuflow.compare import compare
    e = compare(name, ours[name], ref[name])
    row = dict(e.as_dict(), reference=REFERENCE_EXECUTIONS[optimize])
    if name in quants:
        ok = _code_row(row, quants[name], ours[name], ref[name], e.cosine)
    else:
        ok = e.ok(bound)
        if not ok and name in tails:
            ok = _tail_check(row, graph, model, feeds, ours, ref, tails[name], readable, bound, name, optimize)
    row["ok"] = ok
    row["check"] = _check_name(row)
    return row


# onnxruntime's two executions of a quantized model: they differ from each other by up to 4 output
# steps (MobileNetV2 --dtype int8) / cosine 0.9987 (VGG-19 softmax), more than verify's bound, so an
# output passes when it meets the bound against either (each row names the one that decided it and
# carries the other as `vs_other_execution`).
REFERENCE_EXECUTIONS = {False: "as written (optimizations off)", True: "optimized (onnxruntime's fused integer kernels)"}


def _check_name(row: dict) -> str:
    """Which of verify_program's rules decided an output row of a quantized graph (JSON `check`)."""
    if "steps" in row:
        return f"steps on {row['steps_counted_on']}"
    tail = row.get("tail_check")
    if tail is None:
        return "float bound, direct"
    if tail["boundary_values"].startswith("program"):
        return "float bound failed directly; decomposed: boundary read from the program's DDR, tail fed with it"
    return f"float bound, direct; {tail['note']}"


def _code_row(row: dict, quant: tuple, ours, ref, cosine: float) -> bool:
    """Fill an output row's step fields (rule 2) and return whether it meets the step bound. The
    codes are counted on integers when the output's Quant applies to it; a per-channel Quant read
    through moves falls back to |value difference| / largest scale."""
    import numpy as np
    from tpuflow.compare import code_steps, codes
    q, axis_ok, step = quant
    if q is None:                                       # an integer output: its values are the codes
        ours_c, ref_c = np.asarray(ours, np.int64), np.asarray(ref, np.int64)
    else:
        ours_c, ref_c = codes(ours, q, axis_ok), codes(ref, q, axis_ok)
    if ours_c is None:
        steps, counted = row["max_abs_err"] / step, "values / largest scale"
    else:
        steps, counted = float(code_steps(ours_c, ref_c)), "integer codes"
    row.update(quant_step=step, max_abs_bound=QUANT_STEPS_ALLOWED * step, quant_min_cosine=QUANT_MIN_COSINE,
               steps=steps, steps_counted_on=counted)
    return steps <= QUANT_STEPS_ALLOWED and cosine >= QUANT_MIN_COSINE


def _tail_check(row: dict, graph, model, feeds: dict, ours: dict, ref: dict, boundary: list[str],
                readable: set, bound: str, name: str, optimize: bool = False) -> bool:
    """Rule 3 for a float output that failed the float bound: fill row['tail_check'], return its result."""
    import numpy as np
    from tpuflow.compare import compare, fed_model, run_onnxruntime
    missing = [t for t in boundary if t not in ref] or [t for t in boundary if t not in readable]
    if not boundary or missing:
        why = "the float tail reads no quantized tensor" if not boundary else \
            f"{missing[0]} is not a tensor of the ONNX model" if missing[0] not in ref else \
            f"the program keeps {missing[0]} out of DDR"
        row["tail_check"] = {"boundary_values": "reference", "boundary": boundary, "ok": False,
                             "note": f"{why}: the tail was checked against the reference boundary only (the direct check)"}
        return False
    parts = []
    for tensor in boundary:
        part = {"name": tensor}
        ok = _code_row(part, (None, True, 1.0), ours[tensor], ref[tensor], _cosine_dequantized(graph, tensor, ours, ref))
        parts.append(dict(part, ok=ok))
    program_boundary = {t: np.asarray(ours[t]).astype(ref[t].dtype) for t in boundary}
    with step(f"onnxruntime on the float tail of {name} from the program's boundary"):
        tail_ref = run_onnxruntime(fed_model(model, program_boundary, [name]),
                                   {**feeds, **program_boundary}, optimize=optimize)[name]
    tail = compare(name, ours[name], tail_ref)
    tail_ok = tail.ok(bound)
    ok = tail_ok and all(p["ok"] for p in parts)
    row["tail_check"] = {"boundary_values": "program (read from DDR)", "boundary": parts,
                         "tail": dict(tail.as_dict(), ok=tail_ok), "ok": ok}
    return ok


def _cosine_dequantized(graph, tensor: str, ours: dict, ref: dict) -> float:
    import numpy as np
    from tpuflow.compare import compare
    quant = graph.tensor(tensor).quant
    def real(v):
        return (np.asarray(v, np.float64) - _channel(quant.zero_point, quant.axis, np.ndim(v))) \
            * _channel(quant.scale, quant.axis, np.ndim(v))
    return compare(tensor, real(ours[tensor]), real(ref[tensor])).cosine


def _channel(values, axis, ndim: int):
    import numpy as np
    values = np.asarray(values, np.float64)
    if axis is None:
        return values
    shape = [1] * ndim
    shape[axis] = values.size
    return values.reshape(shape)


def _float_tails(graph) -> dict[str, list[str]]:
    """{float output of a quantized graph: the quantized tensors its float tail reads (the boundary)}."""
    from tpuflow.lowering.quant import float_tail_boundary
    quants = output_quants(graph)
    return {name: sorted(float_tail_boundary(graph, name)) for name in graph.outputs
            if name not in quants and graph.tensor(name).dtype == "float32"}


def _ddr_readable(graph, program, names: set) -> set:
    """The tensors of `names` whose bytes in the program's DDR after the run are theirs: the last write
    of every byte of the tensor's DDR range is an instruction of the tensor's producer (on several
    cores: only its producer's instructions write the range, the cores' orders being unrelated). A
    tensor kept in local memory (a fused group) has no such writes, and a range that a later tensor
    reuses has later writers."""
    tensors = program.memory.tensors
    out = set()
    for name in names:
        t, producer = tensors.get(name), graph.producer(name)
        if t is None or producer is None:
            continue
        layers = _layers_computing(program, producer.name)
        if program.core_count == 1:
            readable = _last_written_by(program, t.addr, t.nbytes, layers)
        else:
            readable = _only_written_by(program, t.addr, t.nbytes, layers)
        if readable:
            out.add(name)
    return out


def _only_written_by(program, addr: int, nbytes: int, layers: set[str]) -> bool:
    """Whether GDMA instructions of `layers`, on any core, write every byte of DDR [addr, addr + nbytes)
    and no other instruction of any core writes into it."""
    import numpy as np
    from tpuflow.stagewise import compute_ddr_writes
    if any(len(core.gdma_layers) != len(core.gdma) for core in program.cores) or \
            any(r.lo < addr + nbytes and addr < r.hi for r in compute_ddr_writes(program)):
        return False
    covered = np.zeros(nbytes, bool)
    for core in program.cores:
        for instr, owner in zip(core.gdma, core.gdma_layers):
            for r in instr.accesses(program.chip).ddr_writes:
                lo, hi = max(r.lo - addr, 0), min(r.hi - addr, nbytes)
                if lo < hi:
                    if owner not in layers:
                        return False
                    covered[lo:hi] = True
    return bool(covered.all())


def _layers_computing(program, node: str) -> set[str]:
    """The layer names a node's results are stored under: its own, or any of its fused group's (a
    group's instructions carry its anchor's name, e.g. a Conv with its bias Add)."""
    return {node}.union(*(set(g) for g in program.fused_groups if node in g))


def _last_written_by(program, addr: int, nbytes: int, layers: set[str]) -> bool:
    """Whether instructions of `layers` are the last to write every byte of DDR [addr, addr + nbytes):
    GDMA queue order, walked from its end; any TIU / TILE write to the range answers no."""
    import numpy as np
    from tpuflow.stagewise import compute_ddr_writes
    if len(program.gdma_layers) != len(program.gdma):
        return False
    if any(r.lo < addr + nbytes and addr < r.hi for r in compute_ddr_writes(program)):
        return False
    decided = np.zeros(nbytes, bool)
    for instr, owner in zip(reversed(program.gdma), reversed(program.gdma_layers)):
        for r in instr.accesses(program.chip).ddr_writes:
            lo, hi = max(r.lo - addr, 0), min(r.hi - addr, nbytes)
            if lo < hi:
                if owner not in layers and not decided[lo:hi].all():
                    return False
                decided[lo:hi] = True
        if decided.all():
            return True
    return False


def _with_outputs(program, names: set):
    """`program` with the DDR tensors `names` read back as outputs too (MemoryPlan roles only)."""
    if not names:
        return program
    import copy
    from dataclasses import replace as dc_replace
    out = copy.copy(program)
    out.memory = copy.copy(program.memory)
    out.memory.tensors = {k: dc_replace(t, role="output") if k in names else t for k, t in program.memory.tensors.items()}
    return out


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
    return {name: step for name, (_, _, step) in output_quants(graph).items()}


def output_quants(graph) -> dict[str, tuple]:
    """{output holding quantized values: (its Quant, whether that Quant's channel axis applies to
    the output, its step)}: an integer output is (None, True, 1.0) (its values are the codes); a
    float one read through DequantizeLinear and moves from a quantized tensor carries that tensor's
    Quant (a per-channel axis applies only when nothing but the DequantizeLinear lies between) and
    its largest scale."""
    out = {}
    for name in graph.outputs:
        tensor, ops = name, []
        while len(ops) < 16:
            quant = graph.tensor(tensor).quant
            if quant is not None:
                step = max(float(v) for v in quant.scale.reshape(-1))
                out[name] = (None, True, 1.0) if tensor == name else (quant, ops == ["DequantizeLinear"], step)
                break
            producer = graph.producer(tensor)
            if producer is None or producer.op_type not in _STEP_THROUGH:
                break
            tensor = producer.inputs[0]
            ops.append(producer.op_type)
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
        if any("vs_qdq_fp32" in o for o in result["outputs"]):
            print("\n".join(_quantized_verify_lines(result)))
        if result.get("quantization"):
            print("\n".join(_int8_verify_lines(result)))
    return 0 if result["ok"] else 1


def _quantized_verify_lines(result: dict) -> list[str]:
    """verify's text for a quantized graph: the reference, each quantized output's steps, each float
    tail check, and the pure-fp32 / optimized onnxruntime runs (information)."""
    lines = [f"  reference: onnxruntime on the quantized model, its float tensors rounded to {result['dtype']} as the "
             "program stores them, in both its executions (as written / optimized); an output passes against either"]
    for o in result["outputs"]:
        lines.append(f"  {o['name']} decided against onnxruntime {o['reference']}")
        if "quant_step" in o:
            lines.append(f"  {o['name']} holds quantized values: {o['steps']:g} steps (on {o['steps_counted_on']}) of "
                         f"{o['quant_step']:.4g}; bound <= {QUANT_STEPS_ALLOWED} steps and cosine >= {QUANT_MIN_COSINE:g}")
        elif "tail_check" not in o:
            lines.append(f"  {o['name']}: float bound, direct")
        tail = o.get("tail_check")
        if tail and tail["boundary_values"].startswith("program"):
            worst = max((b["steps"] for b in tail["boundary"]), default=0.0)
            lines.append(f"  {o['name']} checked decomposed, boundary read from the program's DDR: "
                         f"{len(tail['boundary'])} quantized tensor(s) within {worst:g} steps, float tail fed with "
                         f"them max_rel_err {tail['tail']['max_rel_err']:.3e} cosine {tail['tail']['cosine']:.6f}: "
                         f"{'ok' if tail['ok'] else 'FAIL'}")
        elif tail:
            lines.append(f"  {o['name']}: {tail['note']}")
        for key in ("vs_qdq_fp32", "vs_other_execution"):
            info = o[key]
            what = "fp32 as written" if key == "vs_qdq_fp32" else \
                f"{info['reference']} ({'within' if info['ok'] else 'outside'} the bound)"
            steps = f", {info['steps']:g} steps" if "steps" in info else ""
            lines.append(f"    information, against onnxruntime {what}: max_abs_err {info['max_abs_err']:.3e} "
                         f"cosine {info['cosine']:.6f}{steps}")
    return lines


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
