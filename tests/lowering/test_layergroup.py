"""Layer groups: the residency plan (activations kept in LMEM across fused groups) is valid, the
emitted programs compute the right numbers, and DDR traffic drops to the compulsory bytes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tpuflow.chip import load_chip
from tpuflow.isa import Prec
from tpuflow.errors import LoweringError
from tpuflow.lowering.compiler import _lower_planned, plan_layer_groups
from tpuflow.lowering.groups import form_groups
from tpuflow.lowering.layergroup import RESIDENT_SHARE
from tpuflow.lowering.residency import lowest_free_offset
from tpuflow.lowering.mathops import CONST_REGION_BYTES
from tpuflow.lowering.prepare import fold_matmul_transposes, materialize_broadcasts
from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model, load_graph, verify


# ---------------------------------------------------------------- the allocator

ranges = st.lists(st.tuples(st.integers(0, 200), st.integers(1, 60)).map(lambda t: (t[0], t[0] + t[1])),
                  max_size=12)


@given(ranges, st.integers(1, 80))
def test_lowest_free_offset_is_free_and_lowest(busy, size):
    offset = lowest_free_offset(busy, size)
    overlaps = lambda o: any(o < hi and lo < o + size for lo, hi in busy)  # noqa: E731
    assert offset >= 0 and not overlaps(offset)
    assert all(overlaps(o) for o in range(offset)), "a lower free offset exists"


# ---------------------------------------------------------------- the plan on real models

def _plan(model: str, dtype: str, chip_name: str = "sg2260"):
    chip = load_chip(chip_name)
    graph = materialize_broadcasts(fold_matmul_transposes(load_graph(model)))
    groups = form_groups(graph)
    return chip, graph, groups, plan_layer_groups(graph, groups, chip, CompileOptions(dtype=dtype))


@pytest.mark.parametrize("model,dtype", [("resnet50", "fp32"), ("mobilenetv2", "fp16"), ("bert_layer", "fp16"),
                                         ("gpt_block", "fp32"), ("squeezenet", "fp16"), ("densenet121", "fp16")])
def test_resident_tensors_never_overlap_while_live_and_stay_in_their_share(model, dtype):
    chip, graph, groups, plan = _plan(model, dtype)
    assert plan.tensors, "nothing was kept in LMEM"
    floor = plan.region_top - int((plan.region_top - CONST_REGION_BYTES) * RESIDENT_SHARE)
    items = list(plan.tensors.values())

    def root(t):                      # the buffer a tensor lives in (Concat slices, Reshape aliases)
        while t.inside:
            t = plan.tensors[t.inside]
        return t.name

    for t in items:
        assert floor - chip.bank_bytes < t.addr and t.addr + t.size <= plan.region_top
        assert t.prec == Prec.from_name(dtype) and t.first < t.last
    for i, a in enumerate(items):
        for b in items[i + 1:]:
            if root(a) == root(b):
                continue                       # one buffer: a Concat and its in-place inputs, a Reshape alias
            if a.first <= b.last and b.first <= a.last:
                assert a.addr + a.size <= b.addr or b.addr + b.size <= a.addr, (a.name, b.name)


@pytest.mark.parametrize("model", ["resnet50", "bert_layer"])
def test_each_group_works_below_every_buffer_live_during_it(model):
    chip, graph, groups, plan = _plan(model, "fp16")
    for index in range(len(groups)):
        top = plan.arena_top(index, chip.tile_window_offset)
        assert all(top <= t.addr for t in plan.tensors.values() if t.live_at(index))


def test_graph_inputs_and_outputs_stay_in_ddr_and_concat_inputs_alias_only_on_lane_0():
    chip, graph, groups, plan = _plan("inception_v1", "fp16")
    assert not set(plan.tensors) & (set(graph.inputs) | set(graph.outputs))
    aliased = [t for t in plan.tensors.values() if t.inside]
    assert aliased, "no Concat input was written in place"
    for t in aliased:
        owner = plan.tensors[t.inside]
        assert (t.addr // chip.lmem_bytes_per_lane) % chip.lanes == 0 and t.first <= owner.first


def test_off_keeps_nothing_in_lmem():
    chip = load_chip("sg2260")
    graph = load_graph("small_cnn")
    groups = form_groups(graph)
    assert not plan_layer_groups(graph, groups, chip, CompileOptions(layer_group="off")).tensors


# ---------------------------------------------------------------- programs

def _ddr(program) -> int:
    from tpuflow.estimate import ddr_traffic
    t = ddr_traffic(program)
    return t["weight_bytes"] + t["activation_bytes"]


def test_resnet50_fp16_moves_about_its_compulsory_bytes_and_forms_one_group():
    graph, on = compile_model("resnet50", "sg2260", CompileOptions(dtype="fp16", schedule="program"))
    _, off = compile_model("resnet50", "sg2260", CompileOptions(dtype="fp16", schedule="program", layer_group="off"))
    assert _ddr(on) <= 1.10 * on.compulsory_ddr_bytes
    assert _ddr(off) >= 1.8 * off.compulsory_ddr_bytes
    assert not off.layer_groups
    (group,) = on.layer_groups
    convs = {n.name for n in graph.nodes() if n.op_type == "Conv"}
    assert len(convs) == 53 and convs <= set(group["nodes"]) and group["lmem_resident_peak_bytes_per_lane"] > 0


def test_estimate_json_lists_layer_groups_with_their_ddr_bytes():
    from tpuflow.pipeline import estimate
    report = estimate("small_cnn", "sg2260", CompileOptions(dtype="fp16"))
    dram = report["dram"]
    assert {"weight_bytes", "activation_bytes", "compulsory_bytes"} <= set(dram)
    assert 0 < dram["weight_bytes"] and 0 <= dram["activation_bytes"] and 0 < dram["compulsory_bytes"]
    # the instructions' distinct DDR bytes: what the DRAM model moves, up to whole bursts
    moved = dram["bytes_read"] + dram["bytes_written"]
    assert 0.9 * moved <= dram["weight_bytes"] + dram["activation_bytes"] <= moved
    for lg in report["layer_groups"]:
        assert {"members", "nodes", "resident", "slices", "ddr_bytes_in", "ddr_bytes_out"} <= set(lg)
        assert len(lg["members"]) >= 2 and lg["resident"]


def test_manifest_records_layer_groups(tmp_path):
    import json
    from tpuflow.codegen.writer import read_program, write_program
    _, program = compile_model("small_cnn", "sg2260", CompileOptions(dtype="fp16"))
    out = write_program(program, tmp_path / "out", name="small_cnn")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["layer_groups"] == program.layer_groups and manifest["compulsory_ddr_bytes"] > 0
    assert read_program(out).layer_groups == program.layer_groups


@pytest.mark.parametrize("model,dtype,layer_group", [("small_cnn", "fp32", "off"), ("bert_layer", "fp16", "on"),
                                                     ("gpt_block", "fp32", "on")])
def test_layer_group_programs_match_onnxruntime(model, dtype, layer_group):
    result = verify(model, "sg2260", CompileOptions(dtype=dtype, layer_group=layer_group), race_check=True)
    assert result["ok"], result


def test_transformer_attention_stays_in_lmem_and_reshapes_alias_their_input():
    chip, graph, groups, plan = _plan("bert_layer", "fp16")
    q, q_heads = plan.tensors["attention/query/bias"], plan.tensors["attention/q/reshape"]
    assert (q.layout, q_heads.layout) == ("matrix", "nchw") and q.addr == q_heads.addr
    assert q.shape == (1, 64, 1, 256) and q_heads.shape == (1, 64, 4, 64)
    assert plan.tensors["attention/scale"].layout == "matrix"          # scores: rows (head, query) on lanes
    _, program = compile_model("bert_layer", "sg2260", CompileOptions(dtype="fp16", schedule="program"))
    assert not program.memory.by_role("activation")                    # nothing but the I/O in DDR
    (group,) = program.layer_groups
    assert len(group["members"]) == len(groups)


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_batched_nchw_activations_stay_in_lmem(dtype):
    """N > 1: convs, pools, depthwise convs and row groups (rows = N*C, tiled sample by sample)
    keep their activations in LMEM (sample by sample views)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parents[1] / "e2e"))
    from onnx_build import ModelBuilder
    b = ModelBuilder(seed=2)
    y = b.node("Relu", [b.node("Conv", [b.input("x", (4, 16, 20, 20)), b.weight("w0", (32, 16, 3, 3))], "c0",
                                       pads=[1, 1, 1, 1])], "r0")
    y = b.node("MaxPool", [y], "p", kernel_shape=[2, 2], strides=[2, 2])
    z = b.node("Add", [b.node("Conv", [y, b.weight("w1", (32, 32, 3, 3))], "c1", pads=[1, 1, 1, 1]), y], "a")
    z = b.node("Conv", [z, b.weight("w2", (32, 1, 3, 3))], "dw", pads=[1, 1, 1, 1], group=32)
    b.output(b.node("GlobalAveragePool", [z], "gap"))
    _, program = compile_model(b.model(), "sg2260", CompileOptions(dtype=dtype))
    (group,) = program.layer_groups
    assert len(group["members"]) == 4 and group["resident"]
    assert not program.memory.by_role("activation")
    assert verify(b.model(), "sg2260", CompileOptions(dtype=dtype), race_check=True)["ok"]


def test_a_graph_input_read_by_several_groups_is_loaded_into_lmem_once():
    chip, graph, groups, plan = _plan("bert_layer", "fp16")
    x = plan.tensors["hidden_states"]                # read by Q, K, V and the residual add
    assert x.layout == "matrix" and x.first < x.last
    _, program = compile_model("bert_layer", "sg2260", CompileOptions(dtype="fp16", schedule="program"))
    base = program.memory.tensors["hidden_states"].addr
    reads = [i for i in program.gdma if getattr(i, "src_start_addr", None) == base]
    assert len(reads) == 1


# ---------------------------------------------------------------- in place and share fallbacks

def _attention_like(seq: int, width: int, cols: int):
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parents[1] / "e2e"))
    from onnx_build import ModelBuilder
    b = ModelBuilder(seed=2)
    x = b.input("x", (1, seq, width))
    s = b.node("MatMul", [x, b.weight("w1", (width, cols))], "scores")
    p = b.node("Softmax", [s], "probs", axis=-1)
    b.output(b.node("MatMul", [p, b.weight("w2", (cols, width))], "ctx"))
    return b.model()


@pytest.mark.parametrize("seq,apart", [(256, True), (1024, False)])
def test_a_row_group_writes_over_its_input_only_when_the_two_do_not_fit_apart(tmp_path, seq, apart):
    chip_file = tmp_path / "small_lmem.toml"
    chip_file.write_text('base = "sg2260"\n[core]\nlmem_bytes_per_lane = 65536\n')
    model = _attention_like(seq, 64, 512)
    graph = materialize_broadcasts(fold_matmul_transposes(load_graph(model)))
    plan = plan_layer_groups(graph, form_groups(graph), load_chip(str(chip_file)), CompileOptions())
    scores, probs = plan.tensors["scores"], plan.tensors["probs"]
    if apart:
        assert probs.inside is None and probs.addr != scores.addr
    else:                         # softmax rows written over the scores rows they were read from
        assert probs.inside == "scores" and probs.addr == scores.addr and probs.size == 0
    assert verify(model, str(chip_file), CompileOptions(), race_check=True)["ok"]


def test_a_group_that_does_not_fit_beside_the_residents_gets_a_smaller_share(tmp_path):
    """fp16 rows of 1024 need more working area than 30% of a 64 KiB lane: planned again at a
    smaller share, the program compiles and verifies."""
    chip_file = tmp_path / "small_lmem.toml"
    chip_file.write_text('base = "sg2260"\n[core]\nlmem_bytes_per_lane = 65536\n')
    model = _attention_like(1024, 32, 1024)
    graph = materialize_broadcasts(fold_matmul_transposes(load_graph(model)))
    chip = load_chip(str(chip_file))
    groups, fp16 = form_groups(graph, fuse_pool=True), CompileOptions(dtype="fp16")
    full = plan_layer_groups(graph, groups, chip, fp16)
    assert full.tensors                          # the first plan keeps them, and cannot be emitted
    with pytest.raises(LoweringError, match="does not fit LMEM"):
        _lower_planned(graph, graph, groups, chip, fp16, full)
    assert verify(model, str(chip_file), CompileOptions(dtype="fp16"), race_check=True)["ok"]


def test_a_column_split_of_a_matmul_result_is_written_in_place_by_the_matmul():
    """GPT's fused QKV projection writes q, k and v straight into their own LMEM buffers; the
    Split moves nothing, and DDR traffic stays near the compulsory bytes."""
    chip, graph, groups, plan = _plan("gpt_block", "fp16")
    (source, parts), = plan.splits.items()
    assert [w for _, _, w in parts] == [256, 256, 256] and [c for _, c, _ in parts] == [0, 256, 512]
    assert plan.tensors[source].size == 0 and all(plan.tensors[p].size > 0 for p, _, _ in parts)
    producer = next(i for i, g in enumerate(groups) if source in g.produced())
    assert all(plan.tensors[p].first == producer for p, _, _ in parts)   # reserved from the MatMul on
    _, program = compile_model("gpt_block", "sg2260", CompileOptions(dtype="fp16"))
    assert "attn/split" not in set(program.gdma_layers) | set(program.tiu_layers)
    assert program.compulsory_ddr_bytes > 0
