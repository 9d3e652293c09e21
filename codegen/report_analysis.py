"""What the report says about a simulated program: per-layer busy and stall data (which engine and
which kind of instruction each layer waits on), stalls by cause and engine, DRAM pages per UMC,
bank conflicts, and the top bottlenecks in plain words."""

from __future__ import annotations

import numpy as np

from tpuflow.codegen.report_data import ENGINE_NAMES, OP_CLASSES, waited_rows
from tpuflow.hwmodel.timing.result import STALLS

WAIT_KINDS = ("GDMA loads", "GDMA stores", "GDMA LMEM moves", "GDMA DDR copies", "GDMA sync", "TIU compute",
              "TIU sync", "TILE")
_GDMA_KIND = {"dma load": "GDMA loads", "dma store": "GDMA stores", "dma lmem": "GDMA LMEM moves",
              "dma ddr": "GDMA DDR copies", "sync": "GDMA sync"}


def wait_kinds(sim, classes: np.ndarray) -> np.ndarray:
    """Per row the kind of instruction its dependency stall waited for (index into WAIT_KINDS,
    -1: no dependency stall). With waits on several engines, the one that finished last binds."""
    waited = waited_rows(sim)
    end = sim.times["end"]
    best_row = np.full(len(sim.engine), -1, dtype=np.int64)
    best_end = np.full(len(sim.engine), -1, dtype=np.int64)
    for engine in ENGINE_NAMES:
        rows = waited[engine]
        ends = np.where(rows >= 0, end[np.maximum(rows, 0)], -1)
        better = ends > best_end
        best_row, best_end = np.where(better, rows, best_row), np.where(better, ends, best_end)
    table = np.asarray([[WAIT_KINDS.index(_kind_of(code, cls)) for cls in OP_CLASSES] for code in range(3)])
    kinds = np.full(len(sim.engine), -1, dtype=np.int64)
    stalled = np.flatnonzero((sim.stalls["dependency"] > 0) & (best_row >= 0))
    target = best_row[stalled]
    kinds[stalled] = table[sim.engine[target].astype(np.int64), classes[target].astype(np.int64)]
    return kinds


def _kind_of(engine_code: int, cls: str) -> str:
    if engine_code == 1:
        return _GDMA_KIND.get(cls, "GDMA loads")
    if engine_code == 0:
        return "TIU sync" if cls == "sync" else "TIU compute"
    return "TILE"


def layer_stats(sim, layers: list[dict], kinds: np.ndarray) -> list[dict]:
    """Per layer (the estimate's rows, same order): instruction counts and stall ps by cause, the
    dependency wait per engine, and the engine that waits most with what it waits on."""
    index = {row["name"]: k for k, row in enumerate(layers)}
    ids = np.asarray([index.get(name or "(program)", -1) for name in sim.layer], dtype=np.int64)
    if np.any(ids < 0):
        raise ValueError("a simulated row belongs to no layer of the estimate")
    n = len(layers)
    count = np.bincount(ids, minlength=n)
    stalls = {c: np.bincount(ids, weights=sim.stalls[c], minlength=n) for c in STALLS}
    dep = {e: np.bincount(ids[sim.engine == code], weights=sim.stalls["dependency"][sim.engine == code], minlength=n)
           for code, e in enumerate(ENGINE_NAMES)}
    kinds_ps = np.zeros((n, len(WAIT_KINDS)))
    has = kinds >= 0
    np.add.at(kinds_ps, (ids[has], kinds[has]), sim.stalls["dependency"][has])
    out = []
    for k, row in enumerate(layers):
        waiter = max(ENGINE_NAMES, key=lambda e: (dep[e][k], e))
        per_engine_kinds = _engine_kinds(sim, ids, kinds, k, waiter)
        top_kind = max(per_engine_kinds, key=lambda kv: kv[1])[0] if per_engine_kinds else ""
        busy_ps = row["busy_us"].get(waiter, 0.0) * 1e6
        engaged_ps = {e: row["busy_us"].get(e, 0.0) * 1e6 + dep[e][k] for e in ENGINE_NAMES}
        span_ps = (row["end_us"] - row["start_us"]) * 1e6
        out.append({"instructions": int(count[k]), "stalls_ps": {c: int(stalls[c][k]) for c in STALLS},
                    "dependency_ps": {e: int(dep[e][k]) for e in ENGINE_NAMES},
                    "waiter": waiter if dep[waiter][k] > 0 else "", "waits_on": top_kind,
                    "wait_share": dep[waiter][k] / (busy_ps + dep[waiter][k]) if dep[waiter][k] > 0 else 0.0,
                    "occupied_us": min(max(engaged_ps.values()), span_ps) / 1e6,
                    "wait_kinds_ps": {WAIT_KINDS[j]: int(v) for j, v in enumerate(kinds_ps[k]) if v > 0}})
    return out


def _engine_kinds(sim, ids, kinds, layer: int, engine: str) -> list[tuple[str, float]]:
    rows = np.flatnonzero((ids == layer) & (sim.engine == ENGINE_NAMES.index(engine)) & (kinds >= 0))
    if not len(rows):
        return []
    totals = np.bincount(kinds[rows], weights=sim.stalls["dependency"][rows], minlength=len(WAIT_KINDS))
    return [(WAIT_KINDS[j], float(v)) for j, v in enumerate(totals) if v > 0]


def stall_table(sim) -> list[dict]:
    """Per cause: total us per engine (summed over instructions) and how many instructions stalled."""
    rows = []
    for cause in STALLS:
        per = {e: float(sim.stalls[cause][sim.engine == code].sum()) / 1e6 for code, e in enumerate(ENGINE_NAMES)}
        rows.append({"cause": cause, "us": per, "total_us": sum(per.values()),
                     "instructions": int(np.count_nonzero(sim.stalls[cause]))})
    return rows


def umc_table(sim) -> list[dict]:
    d = sim.dram
    out = []
    for u in range(len(d.page_hits)):
        hits, misses, opens = int(d.page_hits[u]), int(d.page_misses[u]), int(d.page_opens[u])
        total = hits + misses + opens
        out.append({"umc": u, "hits": hits, "misses": misses, "opens": opens,
                    "hit_rate": hits / total if total else None})
    return out


def bank_conflicts(sim, layers: list[dict], stats: list[dict], top: int = 5) -> dict:
    tiu = sim.engine == 0
    cycles = int((sim.stalls["bank_conflict"][tiu] // sim.periods_ps[0]).sum())
    ranked = sorted(range(len(layers)), key=lambda k: (-stats[k]["stalls_ps"]["bank_conflict"], k))
    worst = [{"name": layers[k]["name"], "us": stats[k]["stalls_ps"]["bank_conflict"] / 1e6,
              "cycles": stats[k]["stalls_ps"]["bank_conflict"] // sim.periods_ps[0]}
             for k in ranked[:top] if stats[k]["stalls_ps"]["bank_conflict"] > 0]
    return {"cycles": cycles, "us": float(sim.stalls["bank_conflict"][tiu].sum()) / 1e6,
            "instructions": int(np.count_nonzero(sim.stalls["bank_conflict"][tiu])), "layers": worst}


# ------------------------------------------------------------------ plain words

def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def layer_sentence(row: dict, stat: dict, latency_us: float, peak_gbps: float) -> str:
    """One bottleneck sentence for a layer, e.g. 'layer conv2_1 (Conv) waits 61% of its TIU time on
    GDMA loads ...': the engine that waits most, what it waits on, then the layer's bound."""
    span = max(row["end_us"] - row["start_us"], 1e-9)
    busy = {e: row["busy_us"].get(e, 0.0) for e in ENGINE_NAMES}
    head = f"layer {row['name']} ({row['op'] or 'program'})"
    waiter = stat["waiter"]
    if waiter and stat["waits_on"] and stat["wait_share"] >= 0.2:
        wait_us = stat["dependency_ps"][waiter] / 1e6
        head += (f" waits {_pct(stat['wait_share'])} of its {waiter.upper()} time on {stat['waits_on']} "
                 f"({wait_us:.1f} us waiting, {busy[waiter]:.1f} us busy)")
    else:
        engine = max(ENGINE_NAMES, key=lambda e: (busy[e], e))
        head += f" keeps {engine.upper()} busy {busy[engine]:.1f} us with little waiting"
    where = f"it spans {span:.1f} us ({_pct(span / latency_us if latency_us else 0)} of the run)"
    share = {e: _pct(min(v / span, 1)) for e, v in busy.items()}
    if row["bound"] == "memory":
        gbps = row["bytes"] / (span * 1e3)
        why = (f"memory-bound: GDMA busy {share['gdma']} of it, {row['bytes'] / 1e6:.2f} MB "
               f"at {gbps:.1f} GB/s ({_pct(gbps / peak_gbps if peak_gbps else 0)} of DRAM peak)")
    elif row["bound"] == "compute":
        engine = "tile" if busy["tile"] > busy["tiu"] else "tiu"
        why = f"compute-bound: {engine.upper()} busy {share[engine]} of it, at {_pct(row['utilisation'])} of peak MACs"
    else:
        why = (f"dependency-bound: its DMAs waited longer for other instructions than they moved data "
               f"(TIU busy {share['tiu']}, GDMA {share['gdma']}, TILE {share['tile']} of the span)")
    return f"{head}; {where}; {why}."


def bottlenecks(report: dict, stats: list[dict], schedules: list[dict], top: int = 5) -> list[str]:
    """Plain-word findings: the gap to the bound, the busiest engine, schedules, then the layers
    that take the most time."""
    latency = report["latency_us"]
    lines = [_gap_sentence(report), _engine_sentence(report)]
    lines += _schedule_sentences(report, schedules)
    stall = max(report["stalls"].items(), key=lambda kv: (kv[1], kv[0]))
    if stall[1] > 0:
        lines.append(f"The largest stall cause is {stall[0].replace('_', ' ')}: {stall[1]:.1f} us summed over "
                     f"instructions ({stall[1] / latency:.2f}x the run, as stalls on different engines overlap).")
    hit = report["dram"]["page_hit_rate"]
    if report["dram"]["bytes_read"] + report["dram"]["bytes_written"] and hit < 0.8:
        lines.append(f"DRAM page hit rate is only {_pct(hit)}: accesses jump between rows.")
    layers = report["layers"]
    ranked = sorted(range(len(layers)), key=lambda k: (-stats[k]["occupied_us"], k))[:top]
    lines += [layer_sentence(layers[k], stats[k], latency, report["dram"]["peak_gbps"]) for k in ranked]
    return lines


def _gap_sentence(report: dict) -> str:
    bound_name = max(report["bounds"], key=lambda k: report["bounds"][k])
    ratio = report["latency_over_bound"] or 0.0
    text = (f"The run takes {report['latency_us']:.1f} us, {ratio:.2f}x its program bound of "
            f"{report['lower_bound_us']:.1f} us ({bound_name.replace('_us', '').replace('_', ' ')})")
    if report.get("model_bound_us"):
        text += f" and {report['latency_us'] / report['model_bound_us']:.2f}x the model bound of {report['model_bound_us']:.1f} us"
    return text + f": the model is {report.get('bound', 'memory')}-bound at the chip's peaks."


def _engine_sentence(report: dict) -> str:
    engines = {e: v for e, v in report["engines"].items() if v["instructions"]}
    busiest = max(engines, key=lambda e: (engines[e]["utilisation"], e))
    others = ", ".join(f"{e.upper()} {_pct(v['utilisation'])}" for e, v in engines.items() if e != busiest)
    text = f"{busiest.upper()} is busy {_pct(engines[busiest]['utilisation'])} of the run"
    text += f" ({others})" if others else ""
    if engines[busiest]["utilisation"] < 0.7:
        return text + ": no engine is saturated, so the time goes to waiting between engines."
    return text + f": {busiest.upper()} is the bottleneck engine."


def _schedule_sentences(report: dict, schedules: list[dict]) -> list[str]:
    current = report["options"].get("schedule", "program")
    done = {s["method"]: s for s in schedules if s["makespan_us"] is not None}
    if current not in done:
        return []
    best = min(done.values(), key=lambda s: (s["makespan_us"], s["method"]))
    if best["method"] == current or best["makespan_us"] >= done[current]["makespan_us"] * 0.99:
        return []
    gain = 1 - best["makespan_us"] / done[current]["makespan_us"]
    return [f"Scheduling with --schedule {best['method']} would cut the latency to {best['makespan_us']:.1f} us "
            f"({_pct(gain)} less than {current} order)."]
