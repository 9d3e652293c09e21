"""A large program with a made-up simulation (no timing run): for size and scaling tests of the
report, the trace and the timeline without simulating a hundred thousand instructions."""

from __future__ import annotations

import numpy as np

from tpuflow.chip import load_chip
from tpuflow.hwmodel.timing.result import STAGES, STALLS, DramResult, SimResult, busy_union_ps
from tpuflow.hwmodel.timing.synthetic import ar, conv, load, store
from tpuflow.program import LayerInfo, Program


def fake_run(n_tiu: int, n_gdma: int, n_layers: int = 60, seed: int = 0, name: str = "fake"):
    """(program, sim): TIU convs and adds, GDMA loads and stores, layers in contiguous blocks,
    random durations and stalls, every engine in order with gaps."""
    chip = load_chip("sg2260")
    rng = np.random.default_rng(seed)
    tiu_kinds = [conv(0, 4096, 8192, n=1, cin=16, h=8, w=8, cout=16), ar("add", 0, 4096, 8192, (1, 16, 8, 8))]
    gdma_kinds = [load(chip, 1 << 20, 0, (1, 16, 8, 8)), store(chip, 0, 1 << 21, (1, 16, 8, 8))]
    tiu = [tiu_kinds[k] for k in rng.integers(0, 2, n_tiu)]
    gdma = [gdma_kinds[k] for k in rng.integers(0, 2, n_gdma)]
    layer_names = [f"layer<{k}>&" for k in range(n_layers)]
    tiu_layers = [layer_names[k * n_layers // max(n_tiu, 1)] for k in range(n_tiu)]
    gdma_layers = [layer_names[k * n_layers // max(n_gdma, 1)] for k in range(n_gdma)]
    layers = {n: LayerInfo(n, "Conv", macs=1000 + k, fused_group=f"g{k // 3}") for k, n in enumerate(layer_names)}
    program = Program(chip, tiu=tiu, gdma=gdma, tiu_layers=tiu_layers, gdma_layers=gdma_layers, layers=layers,
                      options={"dtype": "fp32", "matmul": "tiu", "dep_mode": "bitmap", "schedule": "program",
                               "time_limit_s": "20.0"}, model_name=name)
    return program, _fake_sim(program, rng)


def _engine_times(rng, n: int) -> tuple[np.ndarray, np.ndarray]:
    duration = rng.integers(1_000, 400_000, n)             # ps
    gap = np.where(rng.random(n) < 0.1, rng.integers(0, 2_000_000, n), 0)
    start = np.cumsum(gap + np.r_[0, duration[:-1]])
    return start.astype(np.int64), (start + duration).astype(np.int64)


def _fake_sim(program: Program, rng) -> SimResult:
    counts = [len(program.tiu), len(program.gdma), 0]
    times = [_engine_times(rng, n) for n in counts]
    engine = np.concatenate([np.full(n, code, dtype=np.int8) for code, n in enumerate(counts)])
    start = np.concatenate([t[0] for t in times])
    end = np.concatenate([t[1] for t in times])
    cols = {s: start.copy() for s in STAGES}
    cols["end"] = end
    n = len(engine)
    stalls = {c: np.where(rng.random(n) < 0.3, rng.integers(0, 50_000, n), 0).astype(np.int64) for c in STALLS}
    cmd_id = np.concatenate([np.arange(1, k + 1) for k in counts]).astype(np.int64)
    dep = np.where(engine == 0, np.minimum(cmd_id, counts[1]), np.where(engine == 1, np.maximum(cmd_id - 1, 0), 0))
    zero = np.zeros(n, dtype=np.int64)
    waits = {"tiu": np.where(engine == 1, dep, zero), "gdma": np.where(engine == 0, dep, zero), "tile": zero}
    ops = [i.op_name for i in program.tiu] + [i.op_name for i in program.gdma]
    layer = list(program.tiu_layers) + list(program.gdma_layers)
    busy = {e: busy_union_ps(t[0], t[1]) for e, t in zip(("tiu", "gdma", "tile"), times)}
    umcs = 16
    dram = DramResult(n * 1000, n * 300, n * 10, np.full(umcs, 900), np.full(umcs, 80), np.full(umcs, 20),
                      int(end.max()), program.chip.dram.peak_gbps)
    return SimResult(engine, cmd_id, dep.astype(np.int64), ops, layer, cols, stalls, (1000, 1000, 1000), busy, dram,
                     int(end.max()), waits=waits)
