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

from tpuflow.chip import SECTIONS, ChipConfig, _read_toml, builtin_chip_names, chip_from_dict, load_chip
from tpuflow.errors import TpuflowError, UserError
from tpuflow.options import CompileOptions

SPEC_KEYS = ("models", "dtypes", "chip", "cores", "grid", "options", "inputs")
OPTION_KEYS = ("matmul", "schedule", "layer_group", "dep_mode", "time_limit_s")
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
        return [Point(m, d, c, tuple(o), tuple(g)) for m, d, c, o, g in itertools.product(*axes)]

    def model_inputs(self, model: str) -> dict:
        from tpuflow.frontend.pinning import InputValue
        items = dict(self.inputs).get(model, ())
        return {name: InputValue.parse(v) if isinstance(v, str) else v for name, v in items}

    def model_path(self, model: str) -> str:
        """A model file relative to the spec file, or a bundled model's name."""
        path = Path(self.base_dir) / model
        return str(path) if not Path(model).is_absolute() and path.is_file() else model


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
    from tpuflow.chip import tomllib
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise SweepSpecError(f"sweep spec {path}: not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise SweepSpecError(f"sweep spec {path}: not valid TOML: {exc}") from None


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
    """(raw TOML dict, name) of the spec's base chip: {"base": name} for a built-in chip."""
    chip = spec.chip
    if chip in builtin_chip_names() and not chip.endswith(".toml"):
        return {"base": chip}, chip
    path = Path(chip) if Path(chip).is_absolute() else Path(spec.base_dir) / chip
    if not path.is_file():
        path = Path(chip)
    try:
        raw = _read_toml(path, str(chip))
        name = load_chip(path).name
    except TpuflowError as exc:
        raise SweepSpecError(f"sweep spec: key 'chip': {exc}") from None
    return raw, name


def point_chip_raw(base_raw: dict, base_name: str, grid: Iterable[tuple[str, Any]]) -> dict:
    """The chip file (as a dict) of one point: the base chip with the point's grid values, named
    '<base>-sweep' on every point (a constant name keeps the compile cache valid: the compiler
    reads core.name) and described by its changes."""
    grid = list(grid)
    if not grid:
        return base_raw
    raw = json.loads(json.dumps(base_raw))
    for key, value in grid:
        *path, leaf = key.split(".")
        table = raw
        for part in path:
            table = table.setdefault(part, {})
        table[leaf] = value
    changes = ", ".join(f"{k} = {v}" for k, v in grid)
    core = raw.setdefault("core", {})
    core.setdefault("name", f"{base_name}-sweep")
    core.setdefault("description", f"{base_name} with {changes} (tpuflow sweep point)")
    return raw


def point_chip_toml(spec: Spec, point: Point) -> str:
    """The chip file of a point: `tpuflow estimate --chip` on it gives the point's row."""
    raw, name = base_chip_raw(spec)
    return to_toml(point_chip_raw(raw, name, point.grid))


def to_toml(raw: dict) -> str:
    """A chip dict as TOML (top-level values, then tables, nested tables as dotted headers)."""
    lines = [f"{k} = {_toml_value(v)}" for k, v in raw.items() if not isinstance(v, dict)]

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
    return key if key.replace("_", "").replace("-", "").isalnum() else json.dumps(key)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (int, str)):
        return json.dumps(v)
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
    for model in spec.models:
        _check_model_loads(spec, model)
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


def _check_model_loads(spec: Spec, model: str) -> None:
    from tpuflow.pipeline import _check_quantized, load_graph
    try:
        _check_quantized(load_graph(spec.model_path(model), spec.model_inputs(model) or None))
    except TpuflowError as exc:
        raise SweepSpecError(f"sweep spec: model '{model}' does not load: {exc}") from None


def _point_label(point: Point) -> str:
    return ", ".join([f"model {point.model}", f"dtype {point.dtype}", f"cores {point.cores}",
                      *(f"{k} = {v}" for k, v in point.options + point.grid)])


def point_id(spec: Spec, point: Point) -> str:
    """Stable identity of a point for resuming: everything that determines its row."""
    raw, _ = base_chip_raw(spec)
    blob = json.dumps([raw, point.model, dict(spec.inputs).get(point.model, ()), point.dtype, point.cores,
                       point.options, point.grid], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# ------------------------------------------------------------------ the traced chip (compile cache)

_TRACED_CLASSES: dict[type, type] = {}


def _traced_class(cls: type) -> type:
    """A subclass of a chip section that records the name of every field read."""
    if cls not in _TRACED_CLASSES:
        names = frozenset(f.name for f in dataclasses.fields(cls))

        def __getattribute__(self, name):
            if name in names:
                object.__getattribute__(self, "_reads").add(name)
            return object.__getattribute__(self, name)
        _TRACED_CLASSES[cls] = type(f"Traced{cls.__name__}", (cls,), {"__getattribute__": __getattribute__})
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
    began = time.perf_counter()
    if compiled.error:
        return error_row(job, compiled.error)
    try:
        chip = job.chip()
        program = dataclasses.replace(compiled.program, chip=chip)
        report = estimate_report(program, simulate(program))
    except Exception as exc:      # a failing point is a row with its error, not a crashed sweep
        return error_row(job, _one_line(exc))
    row = report_row(job.point, report, chip)
    row["_seconds"] = time.perf_counter() - began
    return row


def _one_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text if isinstance(exc, TpuflowError) else f"{type(exc).__name__}: {text}"


# ------------------------------------------------------------------ rows

def report_row(point: Point, report: dict, chip: ChipConfig) -> dict:
    """The row of one point from its estimate report (the numbers of `tpuflow estimate --json`)."""
    engines, dram = report["engines"], report["dram"]
    matmul = report["options"].get("matmul", "tiu")
    row = _point_columns(point)
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
    row = _point_columns(job.point)
    row.update({k: None for k in NUMERIC})
    try:
        chip = job.chip()
        row.update(chip=chip.name, chip_fingerprint=chip.fingerprint())
    except TpuflowError:
        row.update(chip="", chip_fingerprint="")
    row.update(status="error", error=message)
    return row


def _point_columns(point: Point) -> dict:
    return {"model": point.model, "dtype": point.dtype, "cores": point.cores,
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
    except (OSError, TimeoutError) as exc:
        raise SweepSpecError(f"--scheduler {scheduler}: no Dask scheduler answers ({exc})") from None
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
    ids = {p: point_id(spec, p) for p in chips}
    jobs = {p: Job(p, spec.model_path(p.model), dict(spec.inputs).get(p.model, ()), base_raw, base_name)
            for p in chips if ids[p] not in skip}
    done: dict[Point, dict] = {}
    compiles = _run_jobs(client, jobs, chips, done, on_rows, _batch_size(len(jobs), client))
    rows = [dict(done[p], point_id=ids[p]) for p in chips if p in done]
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
