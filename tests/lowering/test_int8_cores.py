"""int8 programs split over cores (lowering.cores._split_quant): every quant group's parts cover its
samples, rows, channels or matrix columns exactly once, channel parts start on lane 0 of a lane
group, chains stay whole on core 0, and int8 programs split group by group (chains broken up:
the "unchained_split" variant) compute what onnxruntime computes with the race detector on."""

from __future__ import annotations

import pytest

from tpuflow.chip import load_chip
from tpuflow.lowering.cores import WHOLE, core_parts
from tpuflow.lowering.groups import form_groups
from tpuflow.lowering.prepare import (fold_matmul_transposes, fold_reduction_scales, materialize_broadcasts,
                                      merge_duplicates)
from tpuflow.lowering.quant import QuantChain, quantized_groups
from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model, verify

CHIP = load_chip("sg2260")


def _quantized_graph(model: str, monkeypatch):
    """The QDQ graph `tpuflow compile --dtype int8` lowers (captured at lower())."""
    import tpuflow.lowering as lowering
    from tpuflow.lowering.compiler import lower_split
    seen = {}

    def capture(graph, chip, options):
        seen["graph"] = graph
        return lower_split(graph, chip, options)
    monkeypatch.setattr(lowering, "lower", capture)
    compile_model(model, "sg2260", CompileOptions(dtype="int8"))
    graph = seen["graph"]
    return materialize_broadcasts(fold_matmul_transposes(fold_reduction_scales(merge_duplicates(graph))))


def _span(part, attr):
    value = getattr(part, attr)
    return list(value) if isinstance(value, range) else list(range(*value))


@pytest.mark.parametrize("model, cores", [("small_cnn", 4), ("mobilenetv2", 4), ("bert_layer", 4), ("mlp", 2)])
def test_quant_parts_cover_their_group_once_and_channel_parts_start_on_lane_0(model, cores, monkeypatch):
    graph = _quantized_graph(model, monkeypatch)
    formed = form_groups(graph, lanes=CHIP.lanes)
    options = CompileOptions(cores=cores, dtype="int8")
    split_kinds = set()
    for chained in (quantized_groups(graph, formed, CHIP), quantized_groups(graph, formed)):
        for group in (g for g in chained if g.kind == "quant"):
            parts = core_parts(graph, group, cores, options, chip=CHIP)
            assert len(parts) == cores
            if parts[0] == WHOLE and parts[1:] == [None] * (cores - 1):
                continue
            assert not isinstance(group, QuantChain)
            used = [p for p in parts if p is not None]
            attrs = {a for p in used for a in ("samples", "rows", "channels", "view_rows", "view_cols")
                     if getattr(p, a) is not None}
            assert len(attrs) == 1
            attr = attrs.pop()
            split_kinds.add(attr)
            covered = sorted(i for p in used for i in _span(p, attr))
            out = graph.tensor(group.nodes[-1].outputs[0]).shape
            whole = {"samples": out[0], "rows": out[-2] if len(out) == 4 else None,
                     "channels": out[1] if len(out) == 4 else None}.get(attr)
            if attr == "view_cols":
                whole = graph.tensor(group.anchor.inputs[1]).shape[1]
            if attr == "view_rows":
                whole = 1
                for d in graph.tensor(group.anchor.inputs[0]).shape[:-1]:
                    whole *= d
            assert covered == list(range(whole)), (group.name, attr)
            if attr == "channels":
                assert all(p.channels[0] % CHIP.lanes == 0 for p in used)
    assert split_kinds          # some quant group splits on every model


@pytest.mark.parametrize("model, cores", [("small_cnn", 4), ("small_cnn", 2), ("mlp", 2)])
def test_int8_programs_split_group_by_group_match_onnxruntime(model, cores, monkeypatch):
    import tpuflow.lowering as lowering
    from tpuflow.lowering import compiler
    chosen = []

    def unchained(variants):
        name = "unchained_split" if "unchained_split" in variants else "split"
        chosen.append(name)
        return variants[name]
    monkeypatch.setattr(lowering, "lower", compiler.lower_split)     # split even where one core is faster
    monkeypatch.setattr(compiler, "_fastest", unchained)
    options = CompileOptions(cores=cores, dtype="int8")
    _, program = compile_model(model, "sg2260", options)
    assert program.core_count == cores
    busy = [k for k, s in enumerate(program.core_split) if s["groups"]]
    assert len(busy) == cores, program.core_split                   # every core computes a part
    result = verify(model, "sg2260", options, race_check=True)
    assert result["ok"], result


def _force_unchained_split(monkeypatch):
    import tpuflow.lowering as lowering
    from tpuflow.lowering import compiler
    monkeypatch.setattr(lowering, "lower", compiler.lower_split)
    monkeypatch.setattr(compiler, "_fastest",
                        lambda variants: variants.get("unchained_split") or variants["split"])


@pytest.mark.slow
@pytest.mark.parametrize("model", ["squeezenet", "mobilenetv2", "bert_layer"])
def test_whole_int8_models_split_over_4_cores_match_onnxruntime(model, monkeypatch):
    _force_unchained_split(monkeypatch)
    options = CompileOptions(cores=4, dtype="int8")
    _, program = compile_model(model, "sg2260", options)
    assert sum(1 for s in program.core_split if s["groups"]) == 4
    result = verify(model, "sg2260", options, race_check=True)
    assert result["ok"], result


@pytest.mark.slow
def test_int8_resnet50_over_4_cores_verifies(monkeypatch):
    """Its Softmax tail is checked on the int8 boundary the cores store in parts (pipeline's several-core
    DDR reads)."""
    _force_unchained_split(monkeypatch)
    result = verify("resnet50", "sg2260", CompileOptions(cores=4, dtype="int8"), race_check=True)
    assert result["ok"], result
