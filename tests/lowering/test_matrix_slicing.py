"""Row slicing of matmul / row-wise chains (long-sequence attention): a run of matmuls and row
groups over the same view rows executes band by band of rows (scores, mask, softmax, context), the
right operands whole; on a small-LMEM chip the attention of bert_layer and of the causal
gpt_block run that way and compute what onnxruntime computes with the race detector on."""

from __future__ import annotations

import pytest

from tpuflow.lowering.groups import form_groups
from tpuflow.lowering.prepare import fold_matmul_transposes, materialize_broadcasts
from tpuflow.lowering.slicing import candidate_runs, slice_region
from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model, load_graph, verify


def _graph(model: str):
    return materialize_broadcasts(fold_matmul_transposes(load_graph(model)))


def test_attention_is_a_matrix_run_and_its_bands_cover_every_row_once():
    graph = _graph("bert_layer")
    groups = form_groups(graph, lanes=64)
    assert not any(groups[i].kind == "matmul" for run in candidate_runs(graph, groups) for i in run)
    runs = candidate_runs(graph, groups, matrix=True)
    attention = next(run for run in runs if any(groups[i].name == "attention/softmax" for i in run))
    names = [groups[i].name for i in attention]
    assert names[0] == "attention/scores" and "attention/context" in names
    for slices in (3, 8):
        region = slice_region(graph, groups, attention, slices, set())
        assert region.matrix and region.axes == "rows"
        for m in attention:
            rows = [r for lo, hi in region.rows[m] for r in range(lo, hi)]
            assert rows == list(range(len(rows)))                       # disjoint, in order, complete


def test_a_matmul_reading_a_right_operand_made_in_the_run_breaks_it():
    graph = _graph("bert_layer")
    groups = form_groups(graph, lanes=64)
    for run in candidate_runs(graph, groups, matrix=True):
        made = set()
        for i in run:
            if groups[i].kind == "matmul":
                assert groups[i].anchor.inputs[1] not in made
            made |= groups[i].produced()


def _long_encoder():
    """One post-LN encoder layer at seq 512 (hidden 128, 4 heads): its attention scores (2 MiB in
    fp16) do not stay whole in a 2 MiB LMEM."""
    from tpuflow.models import transformer as T
    dims = T.Dims(seq=512, hidden=128, heads=4, ffn=256)
    b = T.ModelBuilder("long_encoder", opset=17)
    x = b.input("hidden_states", (1, dims.seq, dims.hidden))
    b.op("Identity", [T._encoder_layer(b, x, "", dims)], name="output", outputs=["output"])
    b.output("output", (1, dims.seq, dims.hidden))
    return b.build()


def test_sliced_attention_matches_onnxruntime(monkeypatch, tmp_path):
    import tpuflow.lowering.compiler as compiler
    chip = tmp_path / "small_lmem.toml"
    chip.write_text('base = "sg2260"\n[core]\nlmem_bytes_per_lane = 32768\n')
    monkeypatch.setattr(compiler, "_members_cost",              # keep every sliced run the planner finds
                        lambda graph, groups, chip, options, residency, members:
                        0 if any(r.first in members for r in residency.regions) else 1)
    options = CompileOptions(dtype="fp16")
    model = _long_encoder()
    _, program = compile_model(model, str(chip), options)
    runs = [r for lg in program.layer_groups for r in lg["sliced_runs"]]
    assert any(r["axes"] == "rows" and "attention/softmax" in r["members"] for r in runs), runs
    assert verify(model, str(chip), options, race_check=True)["ok"]
