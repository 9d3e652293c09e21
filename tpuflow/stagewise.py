"""verify's stage-wise check of quantized programs: each quantized tensor the program stores in DDR,
recomputed by onnxruntime from the program's own values of the stored tensors it reads (teacher
forcing), must be within the step bound; it localises a divergence to the stage that made it."""

from __future__ import annotations

import numpy as np


def snapshot_points(graph, program, names, held: dict | None = None) -> dict[str, tuple]:
    """{tensor: ({(core, engine): instruction index}, DdrTensor | LocalTensor)} for the tensors of
    `names` the program holds whole somewhere after their producer ran: stored in DDR (no TIU / TILE
    write into its range, its producer's GDMA writes on all cores together cover every byte; the
    indices are each core's last such write), else, on a single core, held whole in LMEM by an int8
    chain (`held`, default program.held_tensors: the indices are the last TIU and GDMA instructions of
    its producer writing into its tile). Each is complete right after those instructions, and nothing
    may overwrite it before its readers have run."""
    if any(len(core.gdma_layers) != len(core.gdma) for core in program.cores):
        return {}
    held = program.held_tensors if held is None else held
    points = _ddr_points(graph, program, names)
    for name in names:
        if name not in points and name in held and program.core_count == 1:
            needs = _lmem_writers(program, *held[name])
            if needs:
                points[name] = ({(0, engine): index for engine, index in needs.items()}, held[name][0])
    return points


def _ddr_points(graph, program, names) -> dict[str, tuple]:
    from tpuflow.isa import Engine
    from tpuflow.pipeline import _layers_computing
    by_layer: dict[str, list[tuple[int, int]]] = {}
    for k, core in enumerate(program.cores):
        for index, layer in enumerate(core.gdma_layers):
            by_layer.setdefault(layer, []).append((k, index))
    compute_writes = compute_ddr_writes(program)
    points = {}
    for name in names:
        tensor, producer = program.memory.tensors.get(name), graph.producer(name)
        if tensor is None or producer is None:
            continue
        lo, hi = tensor.addr, tensor.addr + tensor.nbytes
        if any(r.lo < hi and lo < r.hi for r in compute_writes):
            continue
        writes = sorted(w for layer in _layers_computing(program, producer.name) for w in by_layer.get(layer, ()))
        covered, last = np.zeros(tensor.nbytes, bool), {}
        for k, index in writes:
            for r in program.cores[k].gdma[index].accesses(program.chip).ddr_writes:
                a, b = max(r.lo - lo, 0), min(r.hi - lo, tensor.nbytes)
                if a < b:
                    covered[a:b], last[(k, Engine.GDMA)] = True, index
        if last and covered.all():
            points[name] = (last, tensor)
    return points


def compute_ddr_writes(program) -> list:
    """The DDR ranges the TIU and TILE instructions of every core write."""
    return [r for core in program.cores for queue in (core.tiu, core.tile) for instr in queue
            for r in instr.accesses(program.chip).ddr_writes]


def _lmem_writers(program, tile, layers) -> dict:
    """{engine: index of the last instruction of `layers` writing into `tile`'s LMEM range}."""
    from tpuflow.isa import Engine, lmem_ranges
    chip = program.chip
    extent = lmem_ranges(tile.addr, tile.shape, tile.strides, tile.prec.bytes, chip)
    wanted, needs = set(layers), {}
    for engine in (Engine.TIU, Engine.GDMA):
        queue, names = program.queue(engine), program.layer_names(engine)
        for index in range(len(queue) - 1, -1, -1):
            if names[index] in wanted and any(r.overlaps(e) for r in queue[index].accesses(chip).lmem_writes
                                              for e in extent):
                needs[engine] = index
                break
    return needs


def as_onnx_tensor(graph, name: str, value: np.ndarray) -> np.ndarray:
    """A snapshot as the ONNX tensor: its shape, uint8 when its Quant stores uint8 (an LMEM tile holds
    it as int8 storage, rows on lanes or NCHW)."""
    info = graph.tensor(name)
    value = np.asarray(value)
    if info.quant is not None and info.quant.storage == "uint8" and value.dtype == np.int8:
        value = value.view(np.uint8)
    return value.reshape(tuple(info.shape))


def teacher_forced(model, feeds: dict, stored: dict[str, np.ndarray], outputs: list[str],
                   optimize: bool) -> dict[str, np.ndarray]:
    """onnxruntime on ONNX `model` with every tensor of `stored` fed with the program's values: each
    stored tensor's producer still runs (from the program's values of what it reads) and is returned
    under the tensor's own name, as are `outputs` (computed from the fed tensors)."""
    from onnx import helper
    from onnx.helper import np_dtype_to_tensor_dtype
    from tpuflow.compare import _copy, _set_outputs, run_onnxruntime
    model = _copy(model)
    for node in model.graph.node:
        for i, out in enumerate(node.output):
            if out in stored:
                node.output[i] = f"{out}/stage"
    model.graph.input.extend(helper.make_tensor_value_info(name, np_dtype_to_tensor_dtype(value.dtype), list(value.shape))
                             for name, value in stored.items())
    keep = [o for o in outputs if o not in stored]
    _set_outputs(model, [f"{name}/stage" for name in stored] + keep)
    ran = run_onnxruntime(model, {**feeds, **stored}, optimize=optimize)
    return {**{name: ran[f"{name}/stage"] for name in stored}, **{o: ran[o] for o in keep}}


def stage_steps(stored: dict[str, np.ndarray], forced: dict[str, dict[str, np.ndarray]]) -> dict[str, dict]:
    """{stored tensor: its largest code difference from each execution's teacher-forced value, and
    the smaller of the two (the stage's steps)}, in `stored` order."""
    rows = {}
    for name, ours in stored.items():
        by = {label: int(np.max(np.abs(np.asarray(ours, np.int64) - np.asarray(values[name], np.int64)), initial=0))
              for label, values in forced.items()}
        rows[name] = {"steps": min(by.values()), "by_execution": by}
    return rows


def stage_check(graph, model, signed, shifted: set, feeds: dict, ours: dict, stages: dict, bound: str) -> dict:
    """Rule 4 of verify_program for the whole program: every stage's steps (against either
    execution), and each graph output recomputed from the program's stage values checked by rules
    2-3 ({output: (ok, fields)}). Returns {"stages", "worst", "over_bound", "outputs", "ok_stages"}."""
    from tpuflow.compare import compare, unshifted
    from tpuflow.pipeline import QUANT_STEPS_ALLOWED, REFERENCE_EXECUTIONS, _code_row, output_quants
    outputs = list(graph.outputs)
    forced = {}
    for optimize, onnx_model, moved in ((False, model, set()), (True, signed, shifted)):
        fed = {k: (v.astype(np.int16) - 128).astype(np.int8) if k in moved else v for k, v in stages.items()}
        forced[REFERENCE_EXECUTIONS[optimize]] = unshifted(teacher_forced(onnx_model, feeds, fed, outputs, optimize), moved)
    steps = stage_steps(stages, forced)
    worst = max(steps, key=lambda t: steps[t]["steps"])
    over = [t for t, s in steps.items() if s["steps"] > QUANT_STEPS_ALLOWED]
    quants, checked = output_quants(graph), {}
    for name in outputs:
        best = None
        for label, values in forced.items():
            e = compare(name, ours[name], values[name])
            fields = dict(e.as_dict(), reference=label)
            ok = _code_row(fields, quants[name], ours[name], values[name], e.cosine) if name in quants else e.ok(bound)
            if best is None or (ok and not best[0]):
                best = (ok, fields)
        checked[name] = best
    return {"stages": len(stages), "worst": {"tensor": worst, **steps[worst]}, "over_bound": over,
            "outputs": checked, "ok_stages": not over}


def apply(rows: list[dict], passed: list[bool], result: dict, stored_total: int) -> None:
    """Mark the failing output rows that pass rule 4 (every stage and the output from its stages
    within bound), and attach the stage check's summary to every failing row."""
    for i, row in enumerate(rows):
        if passed[i]:
            continue
        ok_output, fields = result["outputs"][row["name"]]
        ok = result["ok_stages"] and ok_output
        row["stage_check"] = {"stages": result["stages"], "quantized_tensors": stored_total,
                              "worst_stage": result["worst"], "stages_over_bound": result["over_bound"][:8],
                              "output_from_stages": dict(fields, ok=ok_output), "ok": ok}
        if ok:
            row["ok"], passed[i] = True, True
            row["check"] = f"stage-wise ({result['stages']} stored stages within bound); end to end: {row['check']}"
