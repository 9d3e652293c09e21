"""verify's stage-wise snapshots on programs split over cores: a quantized tensor the cores store in
parts is snapshotted when every core's last write of it has run, and holds what the single-core
program computes (int8 arithmetic is exact, however the work is split)."""

from __future__ import annotations

import numpy as np

from tpuflow.compare import random_inputs
from tpuflow.hwmodel.functional import run
from tpuflow.isa import Engine
from tpuflow.options import CompileOptions
from tpuflow.pipeline import _quantized_produced, compile_model
from tpuflow.stagewise import snapshot_points


def _split_group_by_group(monkeypatch):
    import tpuflow.lowering as lowering
    from tpuflow.lowering import compiler
    monkeypatch.setattr(lowering, "lower", compiler.lower_split)     # split even where one core is faster
    monkeypatch.setattr(compiler, "_fastest", lambda v: v.get("unchained_split") or v["split"])


def _snapshots(program, graph, inputs):
    points = snapshot_points(graph, program, _quantized_produced(graph))
    taken = run(program, inputs, race_check=True, snapshots=points)
    return points, {name: taken[name] for name in points}


def test_stages_of_a_four_core_program_are_the_single_core_values(monkeypatch):
    graph, single = compile_model("small_cnn", "sg2260", CompileOptions(dtype="int8"))
    inputs = random_inputs(graph, 0)
    _, alone = _snapshots(single, graph, inputs)
    _split_group_by_group(monkeypatch)
    graph4, split = compile_model("small_cnn", "sg2260", CompileOptions(dtype="int8", cores=4))
    assert split.core_count == 4
    points, parts = _snapshots(split, graph4, inputs)
    shared = [(name, needs) for name, (needs, _) in points.items() if len({core for core, _ in needs}) > 1]
    assert shared                                              # some tensors are written by several cores
    assert all(engine == Engine.GDMA for name, needs in shared for _, engine in needs)
    common = sorted(set(parts) & set(alone))
    assert common
    for name in common:
        np.testing.assert_array_equal(np.asarray(parts[name]).reshape(-1), np.asarray(alone[name]).reshape(-1),
                                      err_msg=name)
