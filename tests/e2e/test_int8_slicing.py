"""int8 groups in sliced runs (issue 15): convs, pools and elementwise int8 ops whose activations do not
fit LMEM whole run on bands of output rows with their tensors in slice buffers, and verify against
onnxruntime on the QDQ model; a GlobalAveragePool too large for one step sums steps of input rows; the
compiler keeps an int8 program's chains or lets the layer groups slice, whichever its timing model
finds faster."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from onnx_build import ModelBuilder
from tpuflow.hwmodel.timing import simulate
from tpuflow.lowering.quant import QuantChain, sliceable_quant
from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model, verify

INT8 = CompileOptions(dtype="int8", calibration=2)


def small_lmem_chip(folder) -> str:
    path = folder / "small_lmem.toml"
    path.write_text('base = "sg2260"\n[core]\nlmem_bytes_per_lane = 65536\n')
    return str(path)


def hard_swish_net(height: int = 256, width: int = 160, channels: int = 16):
    """Conv -> hard-swish in primitives (Add 3, Clip 0..6, Mul, Mul 1/6) -> strided Conv + Relu -> MaxPool:
    with --dtype int8 every piece is an int8 op of the same NCHW shape (a band of rows in, the same band out)."""
    b = ModelBuilder(seed=7)
    x = b.input("x", (1, 3, height, width))
    x = b.node("Conv", [x, b.weight("w0", (channels, 3, 3, 3)), b.weight("b0", (channels,))], "c0",
               kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
    shifted = b.node("Add", [x, b.const("three", np.array(3.0, np.float32))], "add3")
    clipped = b.node("Clip", [shifted, b.const("lo", np.array(0.0, np.float32)),
                              b.const("hi", np.array(6.0, np.float32))], "clip")
    gated = b.node("Mul", [x, clipped], "gate")
    x = b.node("Mul", [gated, b.const("sixth", np.array(1 / 6, np.float32))], "hswish")
    x = b.node("Conv", [x, b.weight("w1", (channels, channels, 3, 3)), b.weight("b1", (channels,))], "c1",
               kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    x = b.node("Relu", [x], "r1")
    x = b.node("MaxPool", [x], "pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    b.output(x)
    return b.model()


def _slices_first(monkeypatch):
    """Every int8 group a sliced run can take stays out of chains, and the planner keeps every sliced run
    it finds (the choice between the variants is tested on its own below)."""
    import tpuflow.lowering.compiler as compiler
    chained = compiler.quantized_groups
    monkeypatch.setattr(compiler, "quantized_groups",
                        lambda graph, formed, chip, slices_first=False: chained(graph, formed, chip, True))
    monkeypatch.setattr(compiler, "_members_cost", lambda graph, groups, chip, options, residency, members:
                        0 if residency.region_at(members[0]) else 1)


def test_int8_groups_run_sliced_and_verify(monkeypatch, tmp_path):
    chip = small_lmem_chip(tmp_path)
    _slices_first(monkeypatch)
    model = hard_swish_net()
    _, program = compile_model(model, chip, INT8)
    runs = [r for lg in program.layer_groups for r in lg["sliced_runs"]]
    sliced = {m for r in runs for m in r["members"]}
    assert runs and all(r["slices"] >= 2 for r in runs)
    assert {m.split("_")[0] for m in sliced} >= {"conv", "add", "clip", "mul"}, sliced     # int8 layers
    result = verify(model, chip, INT8, race_check=True)
    assert result["ok"], result["outputs"]


def test_sliceable_int8_groups_are_nchw_same_shape_or_windowed():
    from tpuflow.frontend import load
    from tpuflow.lowering.groups import form_groups
    from tpuflow.lowering.quant import quantized_groups
    from tpuflow.quantize import quantize
    quantization = quantize(hard_swish_net(32, 16), {}, 2, "")
    graph = load(quantization.model)
    groups = quantized_groups(graph, form_groups(graph), None)
    kinds = {g.anchor.op_type: sliceable_quant(graph, g) for g in groups if g.kind == "quant"}
    assert kinds["Conv"] and kinds["MaxPool"] and kinds["QuantizeLinear"] and kinds["Mul"] and kinds["Clip"]
    assert not sliceable_quant(graph, QuantChain("quant", [g.anchor for g in groups[:2]], members=groups[:2]))


def global_pool_net(channels: int = 64, size: int = 96):
    b = ModelBuilder(seed=8)
    x = b.input("x", (1, 3, size, size))
    x = b.node("Conv", [x, b.weight("w0", (channels, 3, 1, 1)), b.weight("b0", (channels,))], "c0",
               kernel_shape=[1, 1], strides=[1, 1], pads=[0, 0, 0, 0])
    x = b.node("Relu", [x], "r0")
    x = b.node("GlobalAveragePool", [x], "gap")
    b.output(x)
    return b.model()


def test_a_large_int8_global_average_pool_sums_steps_of_rows(tmp_path):
    """64 channels of 96 x 96 as fp32 take 36 KiB a lane: on a 64 KiB-a-lane chip the mean is summed over
    steps of input rows (one pooling per step), and verifies."""
    chip = small_lmem_chip(tmp_path)
    model = global_pool_net()
    _, program = compile_model(model, chip, INT8)
    pools = [i for i, layer in zip(program.tiu, program.tiu_layers) if layer.startswith("globalaveragepool")
             and getattr(i, "op", "") == "avgpooling"]
    assert len(pools) >= 2
    result = verify(model, chip, INT8)
    assert result["ok"], result["outputs"]


def test_the_faster_of_chains_and_slices_is_kept(monkeypatch, tmp_path):
    import tpuflow.lowering.compiler as compiler
    chip = small_lmem_chip(tmp_path)
    seen = {}
    fastest = compiler._fastest

    def record(variants):
        seen.update({name: simulate(p).total_ps for name, p in variants.items()})
        return fastest(variants)

    monkeypatch.setattr(compiler, "_fastest", record)
    _, program = compile_model(hard_swish_net(), chip, replace(INT8, schedule="program"))   # as lowered
    assert set(seen) == {"chains", "slices_first"}
    assert simulate(program).total_ps == min(seen.values())


@pytest.mark.parametrize("model", ["mlp"])
def test_float_programs_lower_once(monkeypatch, model):
    import tpuflow.lowering.compiler as compiler
    calls = []
    monkeypatch.setattr(compiler, "_fastest", lambda variants: calls.append(variants) or next(iter(variants.values())))
    compile_model(model, "sg2260", CompileOptions(dtype="fp16"))
    assert not calls
