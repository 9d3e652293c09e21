"""Design-space sweeps on Dask: the sweep spec and its points, compile-once execution on a Dask
`Client` (a LocalCluster by default), one estimate row per point, Parquet / CSV / HTML outputs.

Compile cache. A point's Program depends only on the model, its inputs, the options and the chip
keys the compiler reads. Each compile runs on a chip whose sections record every key read (the
traced chip below); because the compiler is deterministic, any other point that agrees with the
compiled one on every key that was read takes the same path and gets the same Program (or the same
error), so it is only simulated. Points that differ on a read key are compiled on their own
(checked again against their own read set). No key is assumed timing-only by name: a key is
compilation-relevant exactly when this compile read it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from tpuflow.chip import (SECTIONS, ChipConfig, _builtin_path, builtin_chip_names, chip_from_dict, read_toml,
                          load_chip)
from tpuflow.errors import TpuflowError, UserError
from tpuflow.options import CompileOptions

SPEC_KEYS = ("models", "dtypes", "chip", "cores", "grid", "options", "inputs")
OPTION_KEYS = ("matmul", "schedule", "layer_group", "dep_mode", "time_limit_s", "calibration", "calibration_data")
INT8_ONLY_OPTIONS = ("calibration", "calibration_data")   # quantizer inputs: they apply to int8 points only
ENGINES = ("tiu", "gdma", "tile")
FORMAT_VERSION = 1


class SweepSpecError(UserError):
    """A sweep spec that cannot run: an unknown key, an impossible chip value, a model that does not load."""


# ------------------------------------------------------------------ spec

@dataclass(frozen=True)
class Point:
    """One combination of the spec: a model, a dtype, a core count, options and chip-key values."""

    model: str
    dtype: str
    cores: int
    options: tuple[tuple[str, Any], ...]
    grid: tuple[tuple[str, Any], ...]

    @property
    def compile_group(self) -> tuple:
        """What a Program depends on besides the chip."""
        return (self.model, self.dtype, self.cores, self.options)

    def compile_options(self) -> CompileOptions:
        return CompileOptions(dtype=self.dtype, cores=self.cores, **dict(self.options))


@dataclass(frozen=True)
class Spec:
    """A validated-shape sweep spec (values are checked by `validate`)."""

    models: tuple[str, ...]
    dtypes: tuple[str, ...]
    chip: str
    cores: tuple[int, ...] = (1,)
    grid: tuple[tuple[str, tuple], ...] = ()
    options: tuple[tuple[str, tuple], ...] = ()
    inputs: tuple[tuple[str, tuple], ...] = ()     # (model, ((input, shape tuple | value), ...))
    base_dir: str = "."

    def points(self) -> list[Point]:
        axes = [self.models, self.dtypes, self.cores,
                list(itertools.product(*[[(k, v) for v in vs] for k, vs in self.options])),
                list(itertools.product(*[[(k, v) for v in vs] for k, vs in self.grid]))]
        points = (Point(m, d, c, self._applicable(d, o), tuple(g)) for m, d, c, o, g in itertools.product(*axes))
        return list(dict.fromkeys(points))

    def _applicable(self, dtype: str, options) -> tuple[tuple[str, Any], ...]:
        """A point's options: the quantizer's (calibration, calibration_data) only on int8 points, a
        calibration folder relative to the spec file."""
        kept = [(k, v) for k, v in options if dtype == "int8" or k not in INT8_ONLY_OPTIONS]
        return tuple((k, self._data_dir(v) if k == "calibration_data" else v) for k, v in kept)

    def _data_dir(self, folder) -> str:
        path = Path(self.base_dir) / str(folder)
        return str(path.resolve()) if not Path(str(folder)).is_absolute() else str(folder)

    def model_inputs(self, model: str) -> dict:
        from tpuflow.frontend.pinning import InputValue
        items = dict(self.inputs).get(model, ())
        return {name: InputValue.parse(v) if isinstance(v, str) else v for name, v in items}

    def model_path(self, model: str) -> str:
        """A model file relative to the spec file, or a bundled model's name."""
        path = Path(self.base_dir) / model
        return str(path.resolve()) if not Path(model).is_absolute() and path.is_file() else model


def load_spec(source: str | Path | Mapping) -> Spec:
    """A Spec from a TOML file or a dict of the same shape (shape errors name the key)."""
    if isinstance(source, Spec):
        return source
    if isinstance(source, Mapping):
        raw, base_dir = dict(source), "."
    else:
        raw, base_dir = _read_spec_file(Path(source)), str(Path(source).parent)
    unknown = [k for k in raw if k not in SPEC_KEYS]
    if unknown:
        raise SweepSpecError(f"sweep spec: unknown key '{unknown[0]}' (known: {', '.join(SPEC_KEYS)})")
    return Spec(models=_str_list(raw, "models"), dtypes=_str_list(raw, "dtypes", ["fp32"]),
                chip=_chip_entry(raw.get("chip", "sg2260")), cores=_int_list(raw.get("cores", [1])),
                grid=_table_of_lists(raw, "grid"), options=_options(raw), inputs=_inputs(raw), base_dir=base_dir)


def _read_spec_file(path: Path) -> dict:
    return read_toml(path, str(path), "sweep spec", SweepSpecError)


def _str_list(raw: dict, key: str, default=None) -> tuple[str, ...]:
    value = raw.get(key, default)
    if isinstance(value, str):
        value = [value]
    if not value or not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SweepSpecError(f"sweep spec: key '{key}' must be a non-empty list of strings")
    return tuple(value)


def _chip_entry(value) -> str:
    if not isinstance(value, str) or not value:
        raise SweepSpecError("sweep spec: key 'chip' must be a built-in chip name or a chip file")
    return value


def _int_list(value) -> tuple[int, ...]:
    value = [value] if isinstance(value, int) else value
    if not value or not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                                                           for v in value):
        raise SweepSpecError("sweep spec: key 'cores' must be a list of positive integers")
    return tuple(value)


def _table_of_lists(raw: dict, key: str) -> tuple[tuple[str, tuple], ...]:
    table = raw.get(key, {})
    if not isinstance(table, dict):
        raise SweepSpecError(f"sweep spec: '{key}' must be a table")
    out = []
    for name, values in table.items():
        values = values if isinstance(values, list) else [values]
        if not values or any(isinstance(v, (dict, list)) for v in values):
            raise SweepSpecError(f"sweep spec: [{key}] '{name}' must be a value or a non-empty list of values")
        out.append((name, tuple(values)))
    return tuple(out)


def _options(raw: dict) -> tuple[tuple[str, tuple], ...]:
    options = _table_of_lists(raw, "options")
    for name, _ in options:
        if name not in OPTION_KEYS:
            raise SweepSpecError(f"sweep spec: unknown key 'options.{name}' (known: {', '.join(OPTION_KEYS)})")
    return options


def _inputs(raw: dict) -> tuple[tuple[str, tuple], ...]:
    table = raw.get("inputs", {})
    if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
        raise SweepSpecError("sweep spec: [inputs] must hold one table per model: input = [dims] or \"value\"")
    out = []
    for model, entries in table.items():
        items = []
        for name, v in entries.items():
            if isinstance(v, list) and all(isinstance(d, int) for d in v):
                items.append((name, tuple(v)))
            elif isinstance(v, (str, int, float)):
                items.append((name, str(v)))
            else:
                raise SweepSpecError(f"sweep spec: key 'inputs.{model}.{name}' must be a shape list or a value")
        out.append((model, tuple(items)))
    return tuple(out)


# ------------------------------------------------------------------ chips of points

def base_chip_raw(spec: Spec) -> tuple[dict, str]:
    """(raw TOML dict, name) of the spec's base chip (a built-in one's own file), its core.name and
    core.description written in, so a chip's identity never depends on the name of a file."""
    chip = spec.chip
    try:
        if chip in builtin_chip_names() and not chip.endswith(".toml"):
            path, loaded = _builtin_path(chip), load_chip(chip)
        else:
            path = Path(chip) if Path(chip).is_absolute() else Path(spec.base_dir) / chip
            path = path if path.is_file() else Path(chip)
            loaded = load_chip(path)
        raw = read_toml(path, str(chip))
    except TpuflowError as exc:
        raise SweepSpecError(f"sweep spec: key 'chip': {exc}") from None
    core = raw.setdefault("core", {})
    core.setdefault("name", loaded.name)
    core.setdefault("description", loaded.core.description)
    return raw, loaded.name


def point_chip_raw(base_raw: dict, base_name: str, grid: Iterable[tuple[str, Any]]) -> dict:
    """The chip file (as a dict) of one point: the base chip with the point's grid values. With
    any grid value it is named '<base>-sweep' on every point (a constant name keeps the compile
    cache useful: the compiler reads core.name) and described by its changes."""
    grid = list(grid)
    raw = json.loads(json.dumps(base_raw))
    for key, value in grid:
        *path, leaf = key.split(".")
        table = raw
        for part in path:
            table = table.setdefault(part, {})
        table[leaf] = value
    if grid:
        changes = ", ".join(f"{k} = {v}" for k, v in grid)
        swept = {k for k, _ in grid}
        core = raw.setdefault("core", {})
        if "core.name" not in swept:
            core["name"] = f"{base_name}-sweep"
        if "core.description" not in swept:
            core["description"] = f"{base_name} with {changes} (tpuflow sweep point)"
    return raw


def point_chip_toml(spec: Spec, point: Point) -> str:
    """The chip file of a point: `tpuflow estimate --chip` on it gives the point's row."""
    raw, name = base_chip_raw(spec)
    return to_toml(point_chip_raw(raw, name, point.grid))


def to_toml(raw: dict) -> str:
    """A chip dict as TOML (top-level values, then tables, nested tables as dotted headers)."""
    lines = [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in raw.items() if not isinstance(v, dict)]

    def tables(prefix: str, table: dict) -> None:
        scalars = [(k, v) for k, v in table.items() if not isinstance(v, dict)]
        lines.extend(["", f"[{prefix}]", *(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in scalars)])
        for k, v in table.items():
            if isinstance(v, dict):
                tables(f"{prefix}.{_toml_key(k)}", v)
    for k, v in raw.items():
        if isinstance(v, dict):
            tables(_toml_key(k), v)
    return "\n".join(lines) + "\n"


def _toml_key(key: str) -> str:
    """A bare key when TOML allows one (A-Za-z0-9_-), else a quoted one."""
    return key if key and all(c.isascii() and (c.isalnum() or c in "_-") for c in key) else _toml_string(key)


def _toml_string(text: str) -> str:
    """A TOML basic string (JSON's escapes, which TOML shares, for every control character)."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return _toml_string(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {v!r}")


def build_point_chip(base_raw: dict, base_name: str, grid) -> ChipConfig:
    return chip_from_dict(point_chip_raw(base_raw, base_name, grid), f"{base_name}-sweep.toml")


# ------------------------------------------------------------------ validation

def validate(spec: Spec) -> dict[Point, ChipConfig]:
    """Every point's chip, after checking the whole spec: chip keys exist, every combination of
    values is a valid chip, options and cores are valid, every model loads. SweepSpecError
    (naming the key or the model) on the first problem; nothing runs before this passes."""
    base_raw, base_name = base_chip_raw(spec)
    for key, _ in spec.grid:
        _check_chip_key(key)
    chips = {}
    for grid in dict.fromkeys(p.grid for p in spec.points()):
        chips[grid] = _point_chip_or_error(base_raw, base_name, grid)
    for point in spec.points():
        try:
            point.compile_options()
            chips[point.grid].check_cores(point.cores)
        except TpuflowError as exc:
            raise SweepSpecError(f"sweep spec: {_point_label(point)}: {exc}") from None
    for model, _ in spec.inputs:
        if model not in spec.models:
            raise SweepSpecError(f"sweep spec: [inputs.{model}] names no model of 'models'")
    folders = sorted({v for p in spec.points() for k, v in p.options if k == "calibration_data"})
    for model in spec.models:
        _check_model_loads(spec, model, folders)
    return {p: chips[p.grid] for p in spec.points()}


def _check_chip_key(key: str) -> None:
    sec, _, rest = key.partition(".")
    name, _, sub = rest.partition(".")
    cls = SECTIONS.get(sec)
    fields = {f.name: f for f in dataclasses.fields(cls)} if cls else {}
    field = fields.get(name)
    is_table = field is not None and "Mapping" in str(field.type)
    if field is None or bool(sub) != is_table or (sub and field.metadata.get("keys") and sub not in field.metadata["keys"]):
        raise SweepSpecError(f"sweep spec: unknown chip key '{key}' in [grid]")


def _point_chip_or_error(base_raw: dict, base_name: str, grid) -> ChipConfig:
    try:
        return build_point_chip(base_raw, base_name, grid)
    except TpuflowError as exc:
        values = ", ".join(f"{k} = {v}" for k, v in grid)
        message = str(exc).split(": ", 1)[-1] if str(exc).startswith("chip file") else str(exc)
        raise SweepSpecError(f"sweep spec [grid] ({values}): {message}") from None


def _check_model_loads(spec: Spec, model: str, calibration_folders=()) -> None:
    """The model loads, and every calibration folder of the spec's int8 points holds samples it takes."""
    from tpuflow.pipeline import _check_quantized, load_graph
    from tpuflow.quantize import calibration_files
    try:
        graph = load_graph(spec.model_path(model), spec.model_inputs(model) or None)
        _check_quantized(graph)
        for folder in calibration_folders:
            calibration_files(graph, Path(folder))
    except TpuflowError as exc:
        raise SweepSpecError(f"sweep spec: model '{model}' does not load: {exc}") from None


def _point_label(point: Point) -> str:
    return ", ".join([f"model {point.model}", f"dtype {point.dtype}", f"cores {point.cores}",
                      *(f"{k} = {v}" for k, v in point.options + point.grid)])


def point_id(spec: Spec, point: Point, base_raw: dict | None = None) -> str:
    """Stable identity of a point for resuming: everything that determines its row (a model file
    by its bytes, so an edited model is run again)."""
    raw = base_raw if base_raw is not None else base_chip_raw(spec)[0]
    blob = json.dumps([raw, point.model, _file_digest(spec.model_path(point.model)), dict(spec.inputs).get(point.model, ()), point.dtype, point.cores,
                       point.options, point.grid], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


_DIGESTS: dict[tuple, str] = {}


def _file_digest(path: str) -> str:
    """sha256 of a model file ('' for a bundled model's name), cached by path, size and mtime."""
    if not Path(path).is_file():
        return ""
    stat = Path(path).stat()
    key = (path, stat.st_size, stat.st_mtime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return _DIGESTS[key]


# ------------------------------------------------------------------ the traced chip (compile cache)

_TRACED_CLASSES: dict[type, type] = {}


def _traced_class(cls: type) -> type:
    """A subclass of a chip section that records the name of every field read. Reads that bypass
    attributes (`__dict__`, copy / deepcopy / pickle) count as reading every field; a copy made by
    dataclasses.replace read every field of the original already."""
    if cls not in _TRACED_CLASSES:
        names = frozenset(f.name for f in dataclasses.fields(cls))

        def record(self, read: Iterable[str]) -> None:
            try:
                object.__getattribute__(self, "_reads").update(read)
            except AttributeError:      # a copy built through __init__ (dataclasses.replace): see above
                pass

        def __getattribute__(self, name):
            if name in names:
                record(self, (name,))
            elif name == "__dict__":
                record(self, names)
            return object.__getattribute__(self, name)

        def __reduce_ex__(self, protocol):
            record(self, names)
            return cls(**{n: object.__getattribute__(self, n) for n in names}).__reduce_ex__(protocol)
        _TRACED_CLASSES[cls] = type(f"Traced{cls.__name__}", (cls,), {"__getattribute__": __getattribute__,
                                                                       "__reduce_ex__": __reduce_ex__})
    return _TRACED_CLASSES[cls]


def traced_chip(chip: ChipConfig) -> tuple[ChipConfig, Callable[[], frozenset]]:
    """A copy of `chip` whose sections record reads, and a function giving the 'section.field' keys read."""
    logs, sections = {}, {}
    for sec in SECTIONS:
        plain = getattr(chip, sec)
        traced = object.__new__(_traced_class(type(plain)))
        for f in dataclasses.fields(plain):
            object.__setattr__(traced, f.name, getattr(plain, f.name))
        logs[sec] = set()
        object.__setattr__(traced, "_reads", logs[sec])
        sections[sec] = traced
    copy = ChipConfig(**sections, source=chip.source)
    return copy, lambda: frozenset(f"{sec}.{name}" for sec, names in logs.items() for name in names)


def chip_value(chip: ChipConfig, key: str) -> Any:
    sec, _, name = key.partition(".")
    value = getattr(getattr(chip, sec), name)
    return dict(value) if isinstance(value, Mapping) else value


def same_on(keys: Iterable[str], a: ChipConfig, b: ChipConfig) -> bool:
    return all(chip_value(a, k) == chip_value(b, k) for k in keys)


# ------------------------------------------------------------------ tasks (run on Dask workers)

@dataclass
class Compiled:
    """A compile task's result: the Program without its chip (or the error), and the chip keys read."""

    program: Any
    reads: frozenset
    error: str = ""


@dataclass(frozen=True)
class Job:
    """Everything a worker needs for one point (small and picklable)."""

    point: Point
    point_id: str
    model_path: str
    inputs: tuple
    base_raw: dict
    base_name: str

    def chip(self) -> ChipConfig:
        return build_point_chip(self.base_raw, self.base_name, self.point.grid)


def compile_job(job: Job) -> Compiled:
    """Compile one point's model on a traced copy of its chip."""
    from tpuflow.pipeline import compile_model
    chip, reads = traced_chip(job.chip())
    try:
        _, program = compile_model(job.model_path, chip, job.point.compile_options(), _job_inputs(job))
    except Exception as exc:      # a failing compile is the error row of every point it stands for
        return Compiled(None, reads(), _one_line(exc))
    return Compiled(dataclasses.replace(program, chip=None), reads())


def _job_inputs(job: Job) -> dict | None:
    from tpuflow.frontend.pinning import InputValue
    return {n: InputValue.parse(v) if isinstance(v, str) else v for n, v in job.inputs} or None


def compiled_reads(compiled: Compiled) -> tuple[frozenset, str]:
    return compiled.reads, compiled.error


def simulate_jobs(compiled: Compiled, jobs: list[Job]) -> list[dict]:
    """Rows of points that share `compiled`: each simulated on its own chip."""
    return [_simulate_one(compiled, job) for job in jobs]


def _simulate_one(compiled: Compiled, job: Job) -> dict:
    from tpuflow.estimate import estimate_report
    from tpuflow.hwmodel.timing import simulate
    began, cpu = time.perf_counter(), time.process_time()
    if compiled.error:
        return error_row(job, compiled.error)
    try:
        chip = job.chip()
        program = dataclasses.replace(compiled.program, chip=chip)
        report = estimate_report(program, simulate(program))
    except Exception as exc:      # a failing point is a row with its error, not a crashed sweep
        return error_row(job, _one_line(exc))
    row = report_row(job.point, report, chip, job.point_id)
    row.update(_seconds=time.perf_counter() - began, _cpu_seconds=time.process_time() - cpu)   # for benchmarks
    return row


def _one_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text if isinstance(exc, TpuflowError) else f"{type(exc).__name__}: {text}"


# ------------------------------------------------------------------ rows

def report_row(point: Point, report: dict, chip: ChipConfig, pid: str = "") -> dict:
    """The row of one point from its estimate report (the numbers of `tpuflow estimate --json`)."""
    engines, dram = report["engines"], report["dram"]
    matmul = report["options"].get("matmul", "tiu")
    row = _point_columns(point, pid)
    row.update({
        "latency_us": report["latency_us"], "latency_cycles": report["latency_cycles"],
        "lower_bound_us": report["lower_bound_us"], "model_bound_us": report["model_bound_us"],
        "macs": report["macs"], "achieved_tops": report["achieved_tops"],
        "peak_tops": 2 * chip.peak_macs_per_second(point.dtype, "tile" if matmul == "tile" else "tiu") / 1e12,
        **{f"util_{e}": engines[e]["utilisation"] for e in ENGINES},
        "dram_bytes_read": dram["bytes_read"], "dram_bytes_written": dram["bytes_written"],
        "dram_bytes": dram["bytes_read"] + dram["bytes_written"],
        "dram_achieved_gbps": dram["achieved_gbps"], "dram_peak_gbps": dram["peak_gbps"],
        "chip": report["chip"], "chip_fingerprint": report["chip_fingerprint"], "status": "ok", "error": "",
    })
    return row


NUMERIC = ("latency_us", "latency_cycles", "lower_bound_us", "model_bound_us", "macs", "achieved_tops", "peak_tops",
           *(f"util_{e}" for e in ENGINES), "dram_bytes_read", "dram_bytes_written", "dram_bytes",
           "dram_achieved_gbps", "dram_peak_gbps")


INTEGER = ("latency_cycles", "macs", "dram_bytes_read", "dram_bytes_written", "dram_bytes")


def error_row(job: Job, message: str) -> dict:
    row = _point_columns(job.point, job.point_id)
    row.update({k: None for k in NUMERIC})
    try:
        chip = job.chip()
        row.update(chip=chip.name, chip_fingerprint=chip.fingerprint())
    except TpuflowError:
        row.update(chip="", chip_fingerprint="")
    row.update(status="error", error=message)
    return row


def _point_columns(point: Point, pid: str) -> dict:
    return {"point_id": pid, "model": point.model, "dtype": point.dtype, "cores": point.cores,
            **{f"options.{k}": v for k, v in point.options}, **dict(point.grid)}


# ------------------------------------------------------------------ execution

@contextmanager
def local_client(workers: int | None = None) -> Iterator[Any]:
    """A Dask LocalCluster: one single-threaded worker process per core, no dashboard, scratch in a
    temporary folder (removed afterwards)."""
    from dask.distributed import Client, LocalCluster
    workers = workers or os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="tpuflow-sweep-") as scratch:
        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                          local_directory=scratch, silence_logs=50) as cluster, Client(cluster) as client:
            yield client


@contextmanager
def connect(scheduler: str | None, workers: int | None = None) -> Iterator[Any]:
    """A Client of a running scheduler (ADDRESS), or of a new LocalCluster."""
    if scheduler is None:
        with local_client(workers) as client:
            yield client
        return
    from dask.distributed import Client
    try:
        client = Client(scheduler, timeout="10s")
    except (OSError, TimeoutError, ValueError) as exc:
        from tpuflow.errors import OptionError
        raise OptionError(f"option --scheduler {scheduler}: no Dask scheduler answers ({_one_line(exc)})") from None
    with client:
        yield client


@dataclass
class Outcome:
    """What a sweep did: the new rows (spec order), and how many compiles served how many points."""

    rows: list[dict]
    compiles: int
    points: int


def execute(spec: Spec, chips: dict[Point, ChipConfig], client, skip: frozenset = frozenset(),
            on_rows: Callable[[list[dict]], None] | None = None) -> Outcome:
    """Run every point of a validated spec (`chips`: validate's result) not in `skip` (point ids) on `client`."""
    base_raw, base_name = base_chip_raw(spec)
    ids = {p: point_id(spec, p, base_raw) for p in chips}
    jobs = {p: Job(p, ids[p], spec.model_path(p.model), dict(spec.inputs).get(p.model, ()), base_raw, base_name)
            for p in chips if ids[p] not in skip}
    done: dict[Point, dict] = {}
    compiles = _run_jobs(client, jobs, chips, done, on_rows, _batch_size(len(jobs), client))
    rows = [done[p] for p in chips if p in done]
    return Outcome(rows, compiles, len(jobs))


def _batch_size(points: int, client) -> int:
    """About four batches per worker, so small points do not drown in task overhead."""
    workers = max(1, len(client.scheduler_info().get("workers", {})))
    return max(1, math.ceil(points / (4 * workers)))


def _run_jobs(client, jobs: dict, chips: dict, done: dict, on_rows, batch: int) -> int:
    """The compile worklist: compile a representative of each group, simulate every point that
    agrees with it on the keys it read, recompile for the rest. Returns the number of compiles."""
    from dask.distributed import as_completed
    groups: dict[tuple, list[Point]] = {}
    for p in jobs:
        groups.setdefault(p.compile_group, []).append(p)
    waiting, compiles = {}, 0
    queue = as_completed()

    def start_compile(points: list[Point]) -> None:
        nonlocal compiles
        compiles += 1
        compiled = client.submit(compile_job, jobs[points[0]], pure=False)
        reads = client.submit(compiled_reads, compiled, pure=False)
        waiting[reads] = ("compile", compiled, points)
        queue.add(reads)

    for points in groups.values():
        start_compile(points)
    for future in queue:
        kind, compiled, points = waiting.pop(future)
        if kind == "rows":
            rows = future.result()
            done.update(zip(points, rows))
            if on_rows:
                on_rows(rows)
            continue
        reads, _ = future.result()
        served = [p for p in points if same_on(reads, chips[p], chips[points[0]])]
        rest = [p for p in points if p not in served]
        for i in range(0, len(served), batch):
            part = served[i:i + batch]
            rows = client.submit(simulate_jobs, compiled, [jobs[p] for p in part], pure=False)
            waiting[rows] = ("rows", None, part)
            queue.add(rows)
        if rest:
            start_compile(rest)
    return compiles


def run(spec, client=None, *, skip: Iterable[str] = (), workers: int | None = None,
        on_rows: Callable[[list[dict]], None] | None = None):
    """Run a sweep (a Spec, a spec dict or a TOML path) and return one pandas row per point, in
    spec order. `client`: a dask.distributed Client (default: a new LocalCluster); `skip`: point
    ids already done. The frame's attrs hold 'compiles' and 'points'."""
    spec = load_spec(spec)
    chips = validate(spec)               # before any cluster starts
    if client is None:
        with local_client(workers) as local:
            outcome = execute(spec, chips, local, frozenset(skip), on_rows)
    else:
        outcome = execute(spec, chips, client, frozenset(skip), on_rows)
    frame = to_frame(outcome.rows, spec)
    frame.attrs.update(compiles=outcome.compiles, points=outcome.points)
    return frame


def to_frame(rows: list[dict], spec: Spec):
    """Rows as a DataFrame with a fixed column order (identity, swept keys, numbers, chip, status)."""
    import pandas as pd
    columns = columns_of(spec)
    frame = pd.DataFrame([{c: r.get(c) for c in columns} for r in rows], columns=columns)
    for c in NUMERIC:
        frame[c] = pd.to_numeric(frame[c]).astype("Int64" if c in INTEGER else "float64")
    return frame


def columns_of(spec: Spec) -> list[str]:
    return ["point_id", "model", "dtype", "cores", *(f"options.{k}" for k, _ in spec.options),
            *(k for k, _ in spec.grid), *NUMERIC, "chip", "chip_fingerprint", "status", "error"]


# ------------------------------------------------------------------ output files (resumable)

OUTPUT_SUFFIXES = (".parquet", ".pq", ".csv")


def check_output(path: Path) -> None:
    if Path(path).suffix.lower() not in OUTPUT_SUFFIXES:
        from tpuflow.errors import OptionError
        raise OptionError(f"option -o {path}: the sweep writes .parquet (or .csv), not '{Path(path).suffix}'")


def read_output(path: Path, spec: Spec):
    """The rows already in OUT (None when it does not exist), in the sweep's column types."""
    import pandas as pd
    from tpuflow.errors import InputFileError
    path = Path(path)
    if not path.exists():
        return None
    try:
        frame = pd.read_csv(path, dtype={"point_id": str}, keep_default_na=False, na_values=[""]) \
            if path.suffix.lower() == ".csv" else pd.read_parquet(path)
    except Exception as exc:      # pyarrow / pandas raise many kinds for a damaged file
        raise InputFileError(f"{path}: cannot read the earlier sweep output ({_one_line(exc)})") from None
    if "point_id" not in frame.columns:
        raise InputFileError(f"{path}: not a tpuflow sweep output (no 'point_id' column)")
    return normalise(frame, spec)


def normalise(frame, spec: Spec):
    """Column order and types of `columns_of(spec)` (then any other columns), whatever file it came from."""
    import pandas as pd
    columns = columns_of(spec)
    for c in columns:
        if c not in frame.columns:
            frame[c] = None
    frame = frame[columns + [c for c in frame.columns if c not in columns]].copy()
    for c in NUMERIC:
        frame[c] = pd.to_numeric(frame[c]).astype("Int64" if c in INTEGER else "float64")
    for c in ("point_id", "model", "dtype", "chip", "chip_fingerprint", "status", "error"):
        frame[c] = frame[c].astype(object).where(frame[c].notna(), "").astype(str)
    frame["cores"] = frame["cores"].astype("int64")
    return frame.reset_index(drop=True)


def merge_rows(spec: Spec, earlier, rows: list[dict]):
    """Earlier rows and new ones in spec order (earlier rows of points no longer in the spec last)."""
    import pandas as pd
    new = normalise(to_frame(rows, spec), spec)
    frame = new if earlier is None else pd.concat([earlier, new], ignore_index=True)
    frame = frame.drop_duplicates("point_id", keep="first")
    raw = base_chip_raw(spec)[0]
    order = {point_id(spec, p, raw): i for i, p in enumerate(spec.points())}
    rank = frame["point_id"].map(lambda pid: order.get(pid, len(order)))
    frame = frame.assign(_rank=rank).sort_values("_rank", kind="stable").drop(columns="_rank")
    return normalise(frame.reset_index(drop=True), spec)


def write_output(path: Path, frame) -> None:
    """Parquet (or CSV by suffix), written beside OUT and renamed over it: never half-written."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent if str(path.parent) else ".")
    os.close(fd)
    try:
        if path.suffix.lower() == ".csv":
            frame.to_csv(tmp, index=False, lineterminator="\n")
        else:
            frame.to_parquet(tmp, index=False)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ------------------------------------------------------------------ progress

class Progress:
    """Sweep progress on stderr: a redrawn bar with done/total and ETA on a terminal, else one
    line per 10 %."""

    def __init__(self, total: int, stream=None, terminal: bool | None = None, clock=time.monotonic):
        self.stream = stream or sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.terminal = bool(isatty and isatty()) if terminal is None else terminal
        self.total, self.done, self.clock = total, 0, clock
        self.began, self.decile = clock(), 0

    def advance(self, count: int) -> None:
        self.done += count
        if self.terminal:
            self._write("\r" + self.line() + ("\n" if self.done >= self.total else ""))
            return
        decile = 10 * self.done // max(1, self.total)
        if decile > self.decile:
            self.decile = decile
            self._write(self.line() + "\n")

    def line(self) -> str:
        elapsed = self.clock() - self.began
        eta = elapsed / self.done * (self.total - self.done) if self.done else 0.0
        filled = 30 * self.done // max(1, self.total)
        bar = f"[{'#' * filled}{'.' * (30 - filled)}] " if self.terminal else ""
        return (f"tpuflow: sweep {bar}{self.done}/{self.total} points ({100 * self.done // max(1, self.total)}%), "
                f"elapsed {elapsed:.0f} s, ETA {eta:.0f} s")

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()


# ------------------------------------------------------------------ HTML page

PLOT_W, PLOT_H, PAD = 560, 300, 48
SERIES_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")


def _scale(values: list[float], lo_px: float, hi_px: float) -> Callable[[float], float]:
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    return lambda v: lo_px + (v - lo) / span * (hi_px - lo_px)


def _axes(xs: list[float], ys: list[float], labels: dict | None = None) -> tuple[Callable, Callable, dict]:
    sx = _scale(xs, PAD, PLOT_W - 12)
    sy = _scale(ys, PLOT_H - PAD, 16)
    ticks = {"x": [(sx(v), (labels or {}).get(v, _fmt(v))) for v in sorted(set(xs))][:12],
             "y": [(sy(v), _fmt(v)) for v in (min(ys), (min(ys) + max(ys)) / 2, max(ys))]}
    return sx, sy, ticks


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def key_plot(frame, key: str, spec: Spec) -> dict:
    """Latency against one swept key: one line per model (the other swept axes at their first
    values), and a dot for every other point of that model."""
    ok = frame[frame["status"] == "ok"]
    values = dict(spec.grid)[key]
    numeric = all(isinstance(v, (int, float)) for v in values)
    position = float if numeric else (lambda v: float([str(x) for x in values].index(str(v))))
    labels = None if numeric else {float(i): str(v) for i, v in enumerate(values)}
    xs, ys = [position(v) for v in ok[key]], [float(v) for v in ok["latency_us"]]
    if not xs:
        return {"key": key, "series": [], "ticks": {"x": [], "y": []}, "w": PLOT_W, "h": PLOT_H}
    sx, sy, ticks = _axes(xs, ys, labels)
    first = {"dtype": spec.dtypes[0], "cores": spec.cores[0], **{f"options.{k}": v[0] for k, v in spec.options},
             **{k: v[0] for k, v in spec.grid if k != key}}
    series = []
    for i, model in enumerate(spec.models):
        rows = ok[ok["model"] == model]
        line = rows
        for col, value in first.items():
            line = line[line[col] == value]
        line = sorted((position(x), float(y)) for x, y in zip(line[key], line["latency_us"]))
        series.append({"model": model, "colour": SERIES_COLOURS[i % len(SERIES_COLOURS)],
                       "line": " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in line),
                       "dots": [(round(sx(position(x)), 1), round(sy(float(y)), 1), str(x), _fmt(float(y)))
                                for x, y in zip(rows[key], rows["latency_us"])]})
    return {"key": key, "series": series, "ticks": ticks, "w": PLOT_W, "h": PLOT_H}


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point beats on both peak TOPS (lower) and latency (lower), by peak TOPS."""
    front, best = [], math.inf
    for tops, latency in sorted(set(points)):
        if latency < best:
            front.append((tops, latency))
            best = latency
    return front


def pareto_plot(frame, spec: Spec) -> dict:
    ok = frame[frame["status"] == "ok"]
    xs, ys = [float(v) for v in ok["peak_tops"]], [float(v) for v in ok["latency_us"]]
    if not xs:
        return {"series": [], "ticks": {"x": [], "y": []}, "w": PLOT_W, "h": PLOT_H}
    sx, sy, ticks = _axes(xs, ys)
    series = []
    for i, model in enumerate(spec.models):
        rows = ok[ok["model"] == model]
        pts = [(float(t), float(l)) for t, l in zip(rows["peak_tops"], rows["latency_us"])]
        front = pareto_front(pts)
        series.append({"model": model, "colour": SERIES_COLOURS[i % len(SERIES_COLOURS)],
                       "line": " ".join(f"{sx(t):.1f},{sy(l):.1f}" for t, l in front),
                       "front": [(_fmt(t), _fmt(l)) for t, l in front],
                       "dots": [(round(sx(t), 1), round(sy(l), 1), _fmt(t), _fmt(l)) for t, l in pts]})
    return {"series": series, "ticks": ticks, "w": PLOT_W, "h": PLOT_H}


def html_context(frame, spec: Spec, compiles: int | None = None) -> dict:
    from tpuflow import __version__
    columns = [c for c in columns_of(spec) if c != "point_id"]
    table = [[_cell(row[c]) for c in columns] for _, row in frame.iterrows()]
    return {"spec": spec, "version": __version__, "plots": [key_plot(frame, k, spec) for k, _ in spec.grid],
            "pareto": pareto_plot(frame, spec), "columns": columns, "table": table,
            "ok": int((frame["status"] == "ok").sum()), "errors": int((frame["status"] != "ok").sum()),
            "compiles": compiles}


def _cell(value) -> str:
    import pandas as pd
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return ""
    return _fmt(float(value)) if isinstance(value, float) else str(value)


def render_html(frame, spec: Spec, compiles: int | None = None) -> str:
    """The self-contained sweep page (codegen/templates/sweep.html.j2: inline CSS and SVG, no script, nothing fetched)."""
    import jinja2
    from tpuflow.codegen.report import TEMPLATES
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    return env.get_template("sweep.html.j2").render(**html_context(frame, spec, compiles))


# ------------------------------------------------------------------ the command

def cmd_sweep(spec_path: Path, output: Path, scheduler: str | None, workers: int | None, html: Path | None,
              as_json: bool) -> int:
    """`tpuflow sweep`: validate, skip the points OUT already holds, run the rest on Dask, write OUT
    (every 10 % and at the end, atomically: an interrupted sweep resumes) and the HTML page."""
    check_output(output)
    if workers is not None and workers < 1:
        from tpuflow.errors import OptionError
        raise OptionError(f"option --workers: must be a positive integer, got {workers}")
    spec = load_spec(spec_path)
    chips = validate(spec)
    earlier = read_output(output, spec)
    skip = frozenset(earlier["point_id"]) if earlier is not None else frozenset()
    raw = base_chip_raw(spec)[0]
    todo = sum(1 for p in chips if point_id(spec, p, raw) not in skip)
    progress, rows, outcome = Progress(todo), [], None
    checkpoint = {"decile": 0}

    def on_rows(batch: list[dict]) -> None:
        rows.extend(batch)
        progress.advance(len(batch))
        decile = 10 * len(rows) // max(1, todo)
        if decile > checkpoint["decile"] and len(rows) < todo:
            checkpoint["decile"] = decile
            write_output(output, merge_rows(spec, earlier, rows))
    try:
        if todo:
            with connect(scheduler, workers) as client:
                outcome = execute(spec, chips, client, skip, on_rows)
    finally:
        frame = merge_rows(spec, earlier, rows)
        if rows or earlier is None:
            write_output(output, frame)
    if html is not None:
        from tpuflow.codegen.profile import write_atomically
        write_atomically(html, render_html(frame, spec, outcome.compiles if outcome else None))
    _print_summary(frame, output, len(chips), todo, outcome, as_json)
    return 0


def _print_summary(frame, output: Path, total: int, todo: int, outcome: Outcome | None, as_json: bool) -> None:
    errors = int((frame["status"] != "ok").sum())
    compiles = outcome.compiles if outcome else 0
    if as_json:
        sys.stdout.write(json.dumps({"ok": True, "output": str(output), "points": total, "run": todo,
                                     "skipped": total - todo, "errors": errors, "compiles": compiles,
                                     "compile_cache_hits": todo - compiles if todo else 0}, indent=2) + "\n")
        return
    print(f"sweep: {total} points ({total - todo} already in {output.name}, {todo} run, {errors} error rows), "
          f"{compiles} compiles for {todo} points ({todo - compiles if todo else 0} compile cache hits) -> {output}")
