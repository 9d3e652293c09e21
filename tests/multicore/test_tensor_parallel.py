"""Tensor-parallel MLP pairs over cores (lowering.tensor_parallel): the rewrite's structure, the
exact DDR bytes every core moves for an MLP (its share of both weight matrices once, the input
once, its partial result written once, its rows of every partial read once), weights read once
chip-wide, and 2-layer encoders split over 4 cores computing what onnxruntime computes."""

from __future__ import annotations

import onnx
import pytest

from tpuflow.lowering.tensor_parallel import split_mlp_pairs
from tpuflow.models.builder import ModelBuilder
from tpuflow.models.transformer import Dims, encoder
from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model, load_graph, verify

ROWS, WIDTH, HIDDEN = 128, 256, 1024
FP16 = 2


def _mlp(hidden: int = HIDDEN) -> onnx.ModelProto:
    b = ModelBuilder("mlp_pair", opset=17)
    x = b.input("x", (1, ROWS, WIDTH))
    h = b.op("MatMul", [x, b.linear_weight("w1", WIDTH, hidden)], name="fc1")
    g = b.op("Relu", [h], name="act")
    b.op("MatMul", [g, b.linear_weight("w2", hidden, WIDTH)], name="fc2", outputs=["y"])
    b.output("y", (1, ROWS, WIDTH))
    return b.build()


def _encoder(layers: int, heads: int) -> onnx.ModelProto:
    return encoder(f"encoder{layers}", layers, Dims(seq=64, hidden=256, heads=heads, ffn=1024))


def _per_core_bytes(program, area) -> list[tuple[int, int]]:
    """Per core (DDR bytes read, written) by its GDMA inside `area` [lo, hi), the SFU table prologue aside."""
    out = []
    for core in program.cores:
        read = written = 0
        for instr, layer in zip(core.gdma, core.gdma_layers):
            if layer == "__prologue__":
                continue
            acc = instr.accesses(program.chip)
            read += sum(min(r.hi, area[1]) - max(r.lo, area[0]) for r in acc.ddr_reads if r.hi > area[0] and r.lo < area[1])
            written += sum(min(r.hi, area[1]) - max(r.lo, area[0]) for r in acc.ddr_writes
                           if r.hi > area[0] and r.lo < area[1])
        out.append((read, written))
    return out


def test_an_mlp_pair_becomes_a_pinned_chain_per_core_and_a_sum():
    graph, pins = split_mlp_pairs(load_graph(_mlp()), 4, 64)
    ops = [(n.name, n.op_type) for n in graph.nodes()]
    assert [n for n, _ in ops if pins.get(n) == 2] == ["fc1@core2", "act@core2", "fc2@core2", "fc2@core2/view"]
    assert graph.tensor("w1@512:768").shape == (WIDTH, 256) and graph.tensor("w2@512:768").shape == (256, WIDTH)
    assert [n for n, t in ops if t == "Add"] == ["fc2/sum1", "fc2/sum2", "fc2/sum3"]
    assert graph.producer("y").name == "fc2/sum3"
    _, none = split_mlp_pairs(load_graph(_mlp(WIDTH)), 4, 64)   # no wider hidden: (4 + 3) |G| < 2 x 4 |Y|
    assert not none
    _, none = split_mlp_pairs(load_graph(_mlp()), 32, 64)        # 1024 hidden columns: 32 per core, not a lane each
    assert not none


def test_each_core_moves_the_bytes_the_plan_predicts_and_weights_are_read_once_chip_wide(split_lowering):
    cores = 4
    _, program = compile_model(_mlp(), "sg2260", CompileOptions(dtype="fp16", cores=cores))
    weights = program.memory.weight_base
    per_core = _per_core_bytes(program, (0, weights))
    band = ROWS // cores * WIDTH * FP16
    x, partial = ROWS * WIDTH * FP16, ROWS * WIDTH * FP16
    # activations: read the input, write its partial, read its rows of every partial, write its rows of y
    assert per_core == [(x + cores * band, partial + band)] * cores
    weight_reads = _per_core_bytes(program, (weights, weights + len(program.memory.weight_image)))
    block = WIDTH * HIDDEN // cores * FP16
    assert [r for r, _ in weight_reads] == [2 * block] * cores          # its block of each matrix, once
    assert sum(r for r, _ in weight_reads) == 2 * WIDTH * HIDDEN * FP16   # every weight once chip-wide


def test_an_mlp_split_over_cores_matches_onnxruntime(split_lowering):
    result = verify(_mlp(), "sg2260", CompileOptions(dtype="fp16", cores=4), race_check=True)
    assert result["ok"], result


@pytest.mark.parametrize("heads", [4, 8])
def test_a_two_layer_encoder_on_four_cores_matches_onnxruntime(heads, split_lowering):
    result = verify(_encoder(2, heads), "sg2260", CompileOptions(dtype="fp16", cores=4), race_check=True)
    assert result["ok"], result


def test_a_gated_mlp_splits_both_input_projections_and_matches_onnxruntime(split_lowering):
    graph, pins = split_mlp_pairs(load_graph("llama_mlp"), 4, 64)
    on_core_1 = [n.name for n in graph.nodes() if pins.get(n.name) == 1]
    assert on_core_1[:2] == ["mlp/gate_proj/matmul@core1", "mlp/up_proj/matmul@core1"]
    assert "mlp/down_proj/matmul@core1" in on_core_1
    assert graph.producer("mlp/down_proj/matmul").name == "mlp/down_proj/matmul/sum3"
    result = verify("llama_mlp", "sg2260", CompileOptions(dtype="fp16", cores=4), race_check=True)
    assert result["ok"], result
