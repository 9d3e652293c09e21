"""The compiler's split over cores (lowering.cores): every group's parts cover its samples, rows
or view rows exactly once, groups that do not split run on core 0, programs split over 2-4 cores
compute what onnxruntime computes with the cross-core race detector on, and a strided DMA's DDR
ranges are exact enough that cores writing interleaved rows of one tensor do not collide."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuflow.isa.base import ddr_range
from tpuflow.lowering.cores import WHOLE, core_parts
from tpuflow.lowering.groups import form_groups
from tpuflow.lowering.slicing import output_height
from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model, load_graph, verify


def _covered(parts, attr: str) -> list[int]:
    out = []
    for part in parts:
        if part is not None:
            span = getattr(part, attr)
            out += list(span) if isinstance(span, range) else list(range(*span))
    return out


@pytest.mark.parametrize("model", ["small_cnn", "mobilenetv2", "bert_layer", "gpt_block"])
@pytest.mark.parametrize("cores", [2, 3, 8])
def test_parts_cover_every_row_once_and_unsplit_groups_run_on_core_0(model, cores):
    graph = load_graph(model)
    options = CompileOptions(cores=cores)
    for group in form_groups(graph, lanes=64):
        parts = core_parts(graph, group, cores, options)
        assert len(parts) == cores
        if parts[1:] == [None] * (cores - 1) and parts[0] == WHOLE:
            continue                                                # core 0 runs it whole
        first = next(p for p in parts if p is not None)
        if first.samples is not None:
            assert _covered(parts, "samples") == list(range(graph.tensor(group.nodes[-1].outputs[0]).shape[0]))
        elif first.rows is not None:
            assert _covered(parts, "rows") == list(range(output_height(graph, group)))
        elif first.channels is not None:
            assert _covered(parts, "channels") == list(range(graph.tensor(group.anchor.inputs[1]).shape[0]))
        else:
            axis = "view_rows" if first.view_rows is not None else "view_cols"
            rows = _covered(parts, axis)
            assert rows == list(range(len(rows))) and rows


def test_weight_heavy_matmuls_split_columns_and_activation_heavy_ones_rows():
    graph = load_graph("gpt_block")
    splits = {}
    for group in form_groups(graph, lanes=64):
        if group.kind == "matmul":
            first = core_parts(graph, group, 2, CompileOptions(cores=2))[0]
            weights = graph.tensor(group.anchor.inputs[1]).is_const
            splits[group.name] = (weights, first.view_cols is not None)
    assert any(w and cols for w, cols in splits.values())            # projections by their weights
    assert all(w for w, cols in splits.values() if cols)             # only constant weights split columns
    assert any(not w and not cols for w, cols in splits.values())    # attention: by rows


def test_a_batch_splits_by_sample_an_image_by_rows_and_weight_heavy_convs_by_channels():
    graph = load_graph("resnet50")
    convs = [g for g in form_groups(graph) if g.kind == "conv"]
    parts = core_parts(graph, convs[0], 2, CompileOptions(cores=2))          # the stem: a large image
    assert all(p.rows is not None and p.samples is None for p in parts)
    deep = core_parts(graph, convs[-1], 2, CompileOptions(cores=2))          # 7 x 7 x 512 -> 2048
    assert all(p.channels is not None for p in deep)
    graph = load_graph("small_cnn")
    conv = next(g for g in form_groups(graph) if g.kind == "conv")
    tile = core_parts(graph, conv, 2, CompileOptions(cores=2, matmul="tile"))
    assert tile == [WHOLE, None]                                   # the TILE path is not split


@pytest.mark.parametrize("model, cores", [("small_cnn", 2), ("small_cnn", 4), ("mlp", 2), ("gpt_block", 2)])
def test_programs_split_over_cores_match_onnxruntime(model, cores, monkeypatch):
    import tpuflow.lowering as lowering
    from tpuflow.lowering.compiler import lower_split
    monkeypatch.setattr(lowering, "lower", lower_split)     # split even where one core would be faster
    options = CompileOptions(cores=cores)
    _, program = compile_model(model, "sg2260", options)
    assert program.core_count == cores
    assert len(program.core_split) == cores and program.core_split[0]["groups"]
    assert all(s.instruction_count for s in program.cores)
    result = verify(model, "sg2260", options, race_check=True)
    assert result["ok"], result


def test_one_core_compiles_exactly_as_without_the_option():
    _, plain = compile_model("small_cnn", "sg2260", CompileOptions())
    _, one = compile_model("small_cnn", "sg2260", CompileOptions(cores=1))
    assert one.core_count == 1 and [i for i in one.gdma] == [i for i in plain.gdma] and one.tiu == plain.tiu


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=4, max_size=4), st.lists(st.integers(-40, 40), min_size=4, max_size=4),
       st.sampled_from([1, 2, 4]))
def test_ddr_ranges_hold_every_byte_in_disjoint_pieces_within_the_hull(shape, strides, elem):
    addr = 1 << 20
    touched = set()
    for index in itertools.product(*(range(s) for s in shape)):
        e = sum(i * s for i, s in zip(index, strides))
        touched |= set(range(addr + e * elem, addr + (e + 1) * elem))
    ranges = ddr_range(addr, shape, strides, elem)
    covered = set().union(*(range(r.lo, r.hi) for r in ranges))
    assert touched <= covered and (min(covered), max(covered)) == (min(touched), max(touched))
    assert all(a.hi < b.lo for a, b in zip(ranges, ranges[1:]))


def test_interleaved_row_bands_of_one_tensor_have_disjoint_ranges():
    top = ddr_range(0, (1, 16, 8, 16), (4096, 256, 16, 1), 2)      # rows 0-7 of 16 channels of 16 x 16
    bottom = ddr_range(8 * 16 * 2, (1, 16, 8, 16), (4096, 256, 16, 1), 2)
    assert len(top) == 16 and not any(a.overlaps(b) for a in top for b in bottom)
