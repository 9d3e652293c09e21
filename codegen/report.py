"""`tpuflow report`: one self-contained HTML file (jinja2 templates in codegen/templates, inline CSS,
SVG and a tiny script, nothing fetched) with the summary, the timeline, the per-layer table,
stalls, DRAM, the schedule comparison and the top bottlenecks.

    runs = compare_schedules(program, "program", time_limit_s)   # program / list / cpsat, simulated
    html = render_report(report_context(program, sim, estimate_report(program, sim), runs))
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import jinja2
import numpy as np

from tpuflow import __version__
from tpuflow.codegen.profile import write_atomically
from tpuflow.codegen.report_analysis import (bank_conflicts, bottlenecks, layer_stats, stall_table, umc_table,
                                             wait_kinds)
from tpuflow.codegen.report_data import OP_CLASSES, row_classes, row_ddr_bytes
from tpuflow.codegen.report_timeline import LAYER_COLOURS, build_timeline
from tpuflow.errors import OptionError

TEMPLATES = Path(__file__).with_name("templates")
METHODS = ("program", "list", "cpsat")
REPORT_CPSAT_LIMIT_S = 2.0          # CP-SAT budget (deterministic units) for the comparison row
COMPARISON_MAX_INSTRUCTIONS = 200_000   # larger programs: only the requested schedule is run


@dataclass
class ScheduleRun:
    """One schedule of the comparison: its simulated makespan, or why there is none."""

    method: str
    status: str                     # "ok" | "not available" | "not run"
    note: str = ""
    program: object = None
    sim: object = None
    time_limit_s: float | None = None
    model_ps: int | None = None     # the scheduler's own (DAG model) makespan, when it reports one

    def as_dict(self, lower_bound_us: float) -> dict:
        makespan = self.sim.total_us if self.sim is not None else None
        return {"method": self.method, "status": self.status, "note": self.note, "makespan_us": makespan,
                "over_bound": makespan / lower_bound_us if makespan is not None and lower_bound_us else None,
                "time_limit_s": self.time_limit_s,
                "model_us": self.model_ps / 1e6 if self.model_ps is not None else None}


def _progress(text: str) -> None:
    if sys.stderr.isatty():
        print(f"report: {text}", file=sys.stderr, flush=True)


def compare_schedules(program, chosen: str, time_limit_s: float, simulate=None,
                      cpsat_limit_s: float = REPORT_CPSAT_LIMIT_S) -> dict[str, ScheduleRun]:
    """`program` (in emission order) under every method, simulated. The `chosen` method always
    runs (its errors propagate); the others show as 'not available' when the scheduler raises
    OptionError, and are 'not run' for programs above COMPARISON_MAX_INSTRUCTIONS."""
    if simulate is None:
        from tpuflow.hwmodel.timing import simulate
    runs = {}
    for method in METHODS:
        limit = (time_limit_s if method == chosen else cpsat_limit_s) if method == "cpsat" else None
        if method != chosen and program.instruction_count > COMPARISON_MAX_INSTRUCTIONS:
            runs[method] = ScheduleRun(method, "not run", f"{program.instruction_count} instructions: above the "
                                       f"report's comparison limit of {COMPARISON_MAX_INSTRUCTIONS}; run "
                                       f"`tpuflow estimate --schedule {method}`", time_limit_s=limit)
            continue
        _progress(f"schedule {method}" + (f" (CP-SAT limit {limit:g} s)" if limit else "") + ", simulate")
        try:
            scheduled, model_ps, note = _schedule(program, method, limit)
        except OptionError as exc:
            if method == chosen:
                raise
            runs[method] = ScheduleRun(method, "not available", str(exc), time_limit_s=limit)
            continue
        runs[method] = ScheduleRun(method, "ok", note, scheduled, simulate(scheduled), limit, model_ps)
    return runs


def _schedule(program, method: str, limit: float | None):
    """(scheduled program, the scheduler's model makespan in ps or None, a note)."""
    if method == "program":
        return program, None, "emission order"
    from tpuflow import scheduler
    with_report = getattr(scheduler, "schedule_with_report", None)
    if with_report is None:
        return scheduler.schedule(program, method, time_limit_s=limit or 20.0), None, ""
    scheduled, info = with_report(program, method, limit or 20.0)
    note = "" if info.chosen == method else f"kept the {info.chosen} order (no faster {method} order found)"
    return scheduled, info.model_ps.get(method), note


def layer_colour_ids(report: dict, sim) -> dict[str, int]:
    """Layer name (as in the simulation) -> colour order: the estimate's layer order."""
    ids = {}
    for row in report["layers"]:
        ids.setdefault("" if row["name"] == "(program)" else row["name"], len(ids))
    for name in sim.layer:
        ids.setdefault(name, len(ids))
    return ids


def report_context(program, sim, report: dict, runs: dict[str, ScheduleRun]) -> dict:
    """Everything the template shows, as plain data."""
    classes, nbytes = row_classes(program), row_ddr_bytes(program)
    layer_ids = layer_colour_ids(report, sim)
    stats = layer_stats(sim, report["layers"], wait_kinds(sim, classes))
    schedules = [runs[m].as_dict(report["lower_bound_us"]) for m in METHODS if m in runs]
    timeline = build_timeline(program, sim, classes, nbytes, layer_ids)
    longest = max([row["time_us"] for row in report["layers"]] + [1e-12])
    layers = [{**row, "stats": stat, "colour": layer_ids[""if row["name"] == "(program)" else row["name"]]
               % LAYER_COLOURS, "time_of_longest": row["time_us"] / longest}
              for row, stat in zip(report["layers"], stats)]
    return {"version": __version__, "report": report, "timeline": timeline, "layers": layers,
            "schedules": schedules, "current_schedule": report["options"].get("schedule", "program"),
            "bottlenecks": bottlenecks(report, stats, schedules), "stalls": stall_table(sim),
            "umcs": umc_table(sim), "banks": bank_conflicts(sim, report["layers"], stats),
            "class_counts": _class_counts(classes), "op_classes": OP_CLASSES, "layer_colours": LAYER_COLOURS,
            "ddr_bytes": int(nbytes.sum()), "instructions": len(sim.engine)}


def _class_counts(classes: np.ndarray) -> list[tuple[str, int]]:
    counts = np.bincount(classes.astype(np.int64), minlength=len(OP_CLASSES))
    return [(OP_CLASSES[k], int(c)) for k, c in enumerate(counts) if c]


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    env.filters["pct"] = lambda x: "–" if x is None else f"{100 * x:.0f}%"
    env.filters["num"] = lambda x, digits=1: "–" if x is None else f"{x:,.{digits}f}"
    return env


def render_report(context: dict) -> str:
    return _environment().get_template("report.html.j2").render(**context)


def write_report(path: Path, program, sim, report: dict, runs: dict[str, ScheduleRun]) -> int:
    """Render and write the report atomically; returns its size in bytes."""
    html = render_report(report_context(program, sim, report, runs))
    write_atomically(Path(path), html)
    return len(html.encode("utf-8"))
