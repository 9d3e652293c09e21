"""Nearest-neighbour upsampling as a layer-group member (lowering/ops/resize_lmem.py): a feature
pyramid's upsampled map stays in LMEM between the convs around it, a Resize runs sliced (sample by
sample, band by band, rows not aligned to its repeats) inside a sliced run, and every program
computes what onnxruntime computes with the race detector on."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tpuflow.lowering.slicing import candidate_runs, input_rows
from tpuflow.lowering.groups import form_groups
from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model, load_graph, verify

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e"))
from onnx_build import ModelBuilder  # noqa: E402


def _pyramid(batch: int = 1, size: int = 16, repeats=(2, 2)):
    """A small map upsampled to a large one's size, added to it, then convolved (an FPN step)."""
    b = ModelBuilder(seed=7)
    x = b.input("x", (batch, 8, size * repeats[0], size * repeats[1]))
    big = b.node("Relu", [b.node("Conv", [x, b.weight("w0", (16, 8, 3, 3))], "c0", pads=[1] * 4)], "r0")
    small = b.node("Conv", [big, b.weight("w1", (16, 16, repeats[0], repeats[1]))], "c1",
                   kernel_shape=list(repeats), strides=list(repeats))
    scales = b.const("scales", np.asarray([1, 1, *repeats], np.float32))
    up = b.node("Resize", [small, "", scales], "up", mode="nearest")
    y = b.node("Conv", [b.node("Add", [up, big], "sum"), b.weight("w2", (8, 16, 3, 3))], "c2", pads=[1] * 4)
    b.output(y)
    return b.model()


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_an_upsampled_map_stays_in_lmem(dtype):
    model = _pyramid()
    _, program = compile_model(model, "sg2260", CompileOptions(dtype=dtype))
    assert not program.memory.by_role("activation")             # nothing between the convs in DDR
    assert verify(model, "sg2260", CompileOptions(dtype=dtype), race_check=True)["ok"]


def test_a_resize_reads_the_input_rows_its_output_band_repeats():
    graph = load_graph(_pyramid(repeats=(3, 2)))
    groups = form_groups(graph)
    index, resize = next((i, g) for i, g in enumerate(groups) if g.anchor.op_type == "Resize")
    assert any(index in run for run in candidate_runs(graph, groups))      # it can run sliced
    x = resize.anchor.inputs[0]
    assert input_rows(graph, resize, (0, 3)) == {x: (0, 1)}
    assert input_rows(graph, resize, (4, 8)) == {x: (1, 3)}      # rows 4..7 repeat input rows 1 and 2


@pytest.mark.parametrize("batch, repeats", [(1, (2, 2)), (2, (3, 2))])
def test_a_sliced_run_through_a_resize_matches_onnxruntime(monkeypatch, tmp_path, batch, repeats):
    import tpuflow.lowering.compiler as compiler
    chip = tmp_path / "small_lmem.toml"
    chip.write_text('base = "sg2260"\n[core]\nlmem_bytes_per_lane = 65536\n')
    monkeypatch.setattr(compiler, "_members_cost",              # keep every sliced run the planner finds
                        lambda graph, groups, chip, options, residency, members:
                        0 if any(r.first in members for r in residency.regions) else 1)
    model = _pyramid(batch, size=40, repeats=repeats)
    _, program = compile_model(model, str(chip), CompileOptions())
    runs = [r for lg in program.layer_groups for r in lg["sliced_runs"]]
    assert any(m.startswith("resize") for r in runs for m in r["members"])
    assert verify(model, str(chip), CompileOptions(), race_check=True)["ok"]
