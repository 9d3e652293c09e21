"""int8 groups in sliced runs (issue 15): convs, pools and elementwise int8 ops whose activations do not
fit LMEM whole run on bands of output rows with their tensors in slice buffers, and verify against
onnxruntime on the QDQ model; a GlobalAveragePool too large for one step sums steps of input rows; the
compiler keeps an int8 program's chains or lets the layer groups slice, whichever its timing model
finds faster."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

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
    assert {m.split("_")[0] for m in sliced} >= {"conv"} and any("lookup_table" in m for m in sliced), sliced
    # int8 layers: the convs and the hard-swish's lookup table (frontend/lookup.py)
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
    assert kinds["Conv"] and kinds["MaxPool"] and kinds["QuantizeLinear"] and kinds["LookupTable"]
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


def test_the_faster_of_chains_and_slices_is_kept(variant_times, tmp_path):
    chip = small_lmem_chip(tmp_path)
    _, program = compile_model(hard_swish_net(), chip, replace(INT8, schedule="program"))   # as lowered
    assert set(variant_times) == {"chains", "slices_first"}
    assert simulate(program).total_ps == min(variant_times.values())


@pytest.mark.parametrize("model", ["mlp"])
def test_float_programs_lower_once(monkeypatch, model):
    import tpuflow.lowering.compiler as compiler
    calls = []
    monkeypatch.setattr(compiler, "_fastest", lambda variants: calls.append(variants) or next(iter(variants.values())))
    compile_model(model, "sg2260", CompileOptions(dtype="fp16"))
    assert not calls


def qdq_conv_pair(k: int, stride: int, pad: int, dilation: int, depthwise: bool, zero_point: int):
    """A hand-written QDQ model: x -> Q/DQ -> Conv (k x k, stride, pad, dilation; depthwise or not,
    per-channel int8 weights) -> Q/DQ -> 3 x 3 Conv -> Q/DQ -> output; 16 channels of 512 x 96."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(k * 100 + stride * 10 + pad + dilation)
    c = 16

    def arr(name, value, dtype):
        return numpy_helper.from_array(np.asarray(value, dtype), name)

    def qdq(x, tag, scale):
        return ([helper.make_node("QuantizeLinear", [x, f"s_{tag}", f"z_{tag}"], [f"{tag}_q"], name=f"{tag}_quantize"),
                 helper.make_node("DequantizeLinear", [f"{tag}_q", f"s_{tag}", f"z_{tag}"], [f"{tag}_real"],
                                  name=f"{tag}_dequantize")],
                [arr(f"s_{tag}", scale, np.float32), arr(f"z_{tag}", zero_point, np.int8)])

    def conv(x, tag, kernel, cin, **attrs):
        w = rng.integers(-127, 128, (c, cin, kernel, kernel))
        nodes = [helper.make_node("DequantizeLinear", [f"w_{tag}", f"sw_{tag}", f"zw_{tag}"], [f"{tag}_w"],
                                  name=f"{tag}_w_dequantize", axis=0),
                 helper.make_node("Conv", [x, f"{tag}_w", f"b_{tag}"], [tag], name=tag, **attrs)]
        inits = [arr(f"w_{tag}", w, np.int8), arr(f"sw_{tag}", rng.uniform(0.002, 0.01, c), np.float32),
                 arr(f"zw_{tag}", [0] * c, np.int8), arr(f"b_{tag}", rng.uniform(-0.5, 0.5, c), np.float32)]
        return nodes, inits

    n0, i0 = qdq("x", "x", 0.05)
    n1, i1 = conv("x_real", "a", k, 1 if depthwise else c, kernel_shape=[k, k], strides=[stride] * 2,
                  pads=[pad] * 4, dilations=[dilation] * 2, group=c if depthwise else 1)
    n2, i2 = qdq("a", "a", 0.08)
    n3, i3 = conv("a_real", "b", 3, c, kernel_shape=[3, 3], pads=[1] * 4)
    n4, i4 = qdq("b", "b", 0.1)
    height = (512 + 2 * pad - dilation * (k - 1) - 1) // stride + 1
    width = (96 + 2 * pad - dilation * (k - 1) - 1) // stride + 1
    graph = helper.make_graph(n0 + n1 + n2 + n3 + n4, "int8_pair",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 512, 96])],
                              [helper.make_tensor_value_info("b_real", TensorProto.FLOAT, [1, c, height, width])],
                              i0 + i1 + i2 + i3 + i4)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _outputs(model, chip: str) -> tuple[dict, list]:
    """The functional model's outputs of the compiled program on seeded inputs, and its sliced runs."""
    from tpuflow.hwmodel.functional import run
    from tpuflow.compare import random_inputs
    graph, program = compile_model(model, chip, CompileOptions(dtype="fp32"))
    runs = [r for lg in program.layer_groups for r in lg["sliced_runs"]]
    return run(program, random_inputs(graph, 0), race_check=True), runs


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(k=st.sampled_from([1, 3, 5]), stride=st.sampled_from([1, 2]), pad=st.integers(0, 2),
       dilation=st.sampled_from([1, 2]), depthwise=st.booleans(), zero_point=st.sampled_from([0, -7]))
def test_sliced_int8_convs_give_the_whole_programs_integers(monkeypatch, tmp_path, k, stride, pad, dilation,
                                                            depthwise, zero_point):
    """Pre-quantized convs of any kernel, stride, padding (the zero point pads), dilation, standard or
    depthwise, run on bands of rows whose halos cross band borders (race detector on) give exactly the
    integers of the program that runs them whole, and verify against onnxruntime."""
    model = qdq_conv_pair(k, stride, pad, dilation, depthwise, zero_point)
    whole, _ = _outputs(model, "sg2260")
    chip = small_lmem_chip(tmp_path)
    with monkeypatch.context() as patched:
        _slices_first(patched)
        sliced, runs = _outputs(model, chip)
        assert runs and any({"a", "b"} & set(r["members"]) for r in runs)
        assert verify(model, chip, CompileOptions(dtype="fp32"), race_check=False)["ok"]
    assert all(np.array_equal(whole[name], sliced[name]) for name in whole)


def test_a_clip_keeping_its_inputs_quant_clamps_the_codes(monkeypatch):
    """The hard-swish's Clip(0, 6) has its input's Quant (onnxruntime's quantizer shares it): two int8
    instructions clamp the stored codes to quantize(0) / quantize(6), no dequantisation; the program verifies.
    (The hard-swish is left un-collapsed here: as one lookup table it has no Clip.)"""
    import tpuflow.frontend.lookup as lookup
    from tpuflow.isa import Engine, Prec, RqDqTiu
    monkeypatch.setattr(lookup, "collapse_lookup_tables", lambda graph: graph)
    model = hard_swish_net(32, 16)
    graph, program = compile_model(model, "sg2260", INT8)
    clip = next(n for n in graph.nodes() if n.op_type == "Clip")
    assert graph.tensor(clip.inputs[0]).quant == graph.tensor(clip.outputs[0]).quant
    mine = [i for i, layer in zip(program.tiu, program.layer_names(Engine.TIU)) if layer == clip.name]
    assert mine and not any(isinstance(i, RqDqTiu) for i in mine)
    assert sorted(i.op for i in mine) == ["max", "min"] and all(i.opt_res0_prec == Prec.INT8 for i in mine)
    assert verify(model, "sg2260", INT8)["ok"]


@settings(max_examples=200, deadline=None)
@given(scale=st.floats(2 ** -13, 10.0, width=32), zero_point=st.integers(-128, 127),
       lo=st.one_of(st.none(), st.floats(-50, 50, width=32)), width=st.floats(0, 100, width=32))
def test_clamping_codes_is_quantize_of_the_clipped_reals(scale, zero_point, lo, width):
    """For every int8 code: quantize(clip(dequantize(q))) with one Quant in and out equals q clamped to
    quantize(min) / quantize(max), onnxruntime's DequantizeLinear -> Clip -> QuantizeLinear in fp32."""
    from tpuflow.frontend.quant import Quant, dequantize, quantize
    quant = Quant(np.float32(scale), np.int8(zero_point), None, "int8")
    hi = None if lo is None else np.float32(lo + width)
    codes = np.arange(-128, 128, dtype=np.int8)
    real = dequantize(codes, quant)
    clipped = np.clip(real, -np.inf if lo is None else np.float32(lo), np.inf if hi is None else hi)
    ort = np.clip(np.rint(clipped / np.float32(scale)) + zero_point, -128, 127)       # fp32 division, as ORT
    bound = [None if v is None else int(quantize(np.float32(v), quant)) for v in (lo, hi)]
    ours = np.clip(codes.astype(np.int64), -128 if bound[0] is None else bound[0], 127 if bound[1] is None else bound[1])
    assert np.array_equal(ort.astype(np.int64), ours)


def test_a_per_row_constant_on_a_1d_signal_is_a_per_channel_operand():
    """A (1, C, 1) bias added to a (1, C, W) signal (a 1-D conv's, as jax2tf writes it) is one value per row of
    the held view: loaded once per channel and applied across the C lanes, not a C x W pattern on one lane."""
    from tpuflow.isa import ArTiu, Engine
    from tpuflow.lowering.quant import channel_view_constant
    assert channel_view_constant((1, 64, 1), (1, 64, 256)) and channel_view_constant((64, 1), (1, 64, 256))
    assert not channel_view_constant((1, 1, 256), (1, 64, 256)) and not channel_view_constant((1, 1, 1), (1, 64, 256))
    b = ModelBuilder(seed=9)
    x = b.node("Relu", [b.input("x", (1, 64, 256))], "r")
    b.output(b.node("Add", [x, b.const("bias", np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64, 1))], "y"))
    model = b.model()
    graph, program = compile_model(model, "sg2260", INT8)
    add = next(n for n in graph.nodes() if n.op_type == "Add")
    adds = [i for i, layer in zip(program.tiu, program.layer_names(Engine.TIU)) if layer == add.name
            and isinstance(i, ArTiu) and i.op == "add"]
    assert adds and all(i.res0_c == 64 for i in adds)
    assert verify(model, "sg2260", INT8)["ok"]
