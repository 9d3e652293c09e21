"""The int8 lowering's pieces (issue 15): per-tensor storage precision in the DDR plan, quant groups and
chains (lowering/quant.py), the held tensors' LMEM layout, the folded conv bias and requant words, and the
one-line refusals of what it cannot emit."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "frontend"))

from quant_models import quantized  # noqa: E402
from tpuflow.chip import load_chip  # noqa: E402
from tpuflow.errors import LoweringError  # noqa: E402
from tpuflow.frontend import load  # noqa: E402
from tpuflow.isa import Prec  # noqa: E402
from tpuflow.lowering.ddrplan import plan_ddr, stored_dtype  # noqa: E402
from tpuflow.lowering.groups import form_groups  # noqa: E402
from tpuflow.lowering.prepare import fold_matmul_transposes, materialize_broadcasts  # noqa: E402
from tpuflow.lowering.quant import (QuantChain, check_supported, folds_kernel_rows, held_layout, held_view,  # noqa: E402
                                    held_peak, quantized_groups)
from tpuflow.lowering.tensors import storage_prec  # noqa: E402
from tpuflow import models  # noqa: E402

CHIP = load_chip("sg2260")


def prepared(model):
    return materialize_broadcasts(fold_matmul_transposes(load(model)))


def test_float_tensors_keep_dtype_quantized_ones_their_storage():
    g = prepared(quantized("cnn", "QDQ", True, "QUInt8"))
    for name, info in g.tensors.items():
        want = info.quant.storage if info.quant is not None else "bf16"
        assert stored_dtype(g, name, "bf16") == want
        assert storage_prec(info, Prec.BF16) == {"uint8": Prec.INT8, "int8": Prec.INT8, "int32": Prec.INT32,
                                                 "bf16": Prec.BF16}[want]
    groups = quantized_groups(g, form_groups(g), CHIP)
    ddr = plan_ddr(g, groups, CHIP, "fp16", 0)
    assert ddr.tensors["x"].nbytes == 2 * 3 * 12 * 12 and ddr.tensors["x"].dtype == "fp16"
    q = [t for t in ddr.tensors.values() if g.tensor(t.name).quant is not None]
    assert q and all(t.dtype == "uint8" and t.nbytes == int(np.prod(t.shape)) for t in q)


def test_float_graphs_keep_their_groups():
    g = prepared(models.build_model("small_cnn"))
    groups = form_groups(g)
    assert quantized_groups(g, groups, CHIP) is groups


def test_cnn_groups_chain_and_fuse():
    g = prepared(quantized("cnn", "QDQ", True, "QInt8"))
    groups = quantized_groups(g, form_groups(g), CHIP)
    # both convs (3 and 8 input channels x 3 kernel rows <= 64) fold their kernel rows, copying them from
    # their held input: one chain from the QuantizeLinear to the pool; the classifier's rows (not NCHW: held
    # as rows) chain with their DequantizeLinear
    assert [(type(x).__name__, x.kind, [n.op_type for n in x.nodes]) for x in groups] == [
        ("QuantChain", "quant", ["QuantizeLinear", "Conv", "MaxPool", "Conv", "Add", "GlobalAveragePool"]),
        ("Group", "view", ["Reshape"]), ("QuantChain", "quant", ["MatMul", "Add", "DequantizeLinear"])]
    chain = groups[0]
    assert [[n.op_type for n in m.nodes] for m in chain.members] == [
        ["QuantizeLinear"], ["Conv"], ["MaxPool"], ["Conv"], ["Add"], ["GlobalAveragePool"]]
    assert all(folds_kernel_rows(g, m.anchor) for m in chain.members if m.anchor.op_type == "Conv")
    assert held_peak(g, chain.members, CHIP.lanes) > 0
    taken = [n.name for x in groups for n in x.nodes]
    assert sorted(taken) == sorted(n.name for n in g.nodes())


def test_no_chain_without_a_chip_or_a_budget(monkeypatch):
    import tpuflow.lowering.quant as quant
    g = prepared(quantized("cnn", "QDQ", True, "QInt8"))
    assert not any(isinstance(x, QuantChain) for x in quantized_groups(g, form_groups(g)))
    monkeypatch.setattr(quant, "CHAIN_RESIDENT_SHARE", 0)
    assert not any(isinstance(x, QuantChain) for x in quantized_groups(g, form_groups(g), CHIP))


lifetimes = st.lists(st.tuples(st.integers(0, 8), st.integers(1, 4), st.integers(1, 5000)), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(lifetimes)
def test_held_tensors_never_share_bytes_while_both_live(spans):
    lives = {f"t{i}": (a, a + d) for i, (a, d, _) in enumerate(spans)}
    sizes = {f"t{i}": s for i, (_, _, s) in enumerate(spans)}
    offsets, extent = held_layout(lives, sizes, 32)
    assert set(offsets) == set(lives)
    for a in lives:
        assert offsets[a] % 32 == 0 and offsets[a] + sizes[a] <= extent
        for b in lives:
            overlap_time = lives[a][0] <= lives[b][1] and lives[b][0] <= lives[a][1]
            if a < b and overlap_time:
                assert offsets[a] + sizes[a] <= offsets[b] or offsets[b] + sizes[b] <= offsets[a], (a, b)
    assert extent <= sum(-(-s // 32) * 32 for s in sizes.values())


def test_folded_bias_and_requant_words():
    """bias' = bias - zp_x * sum of the channel's weights (zp_x is also the padding value); rq0 words are the
    fp32 scale s_x * s_w[c] / s_y and the offset zp_y."""
    from tpuflow.lowering.context import LowerCtx
    from tpuflow.lowering.emitter import Emitter
    from tpuflow.lowering.ops.quant_ops import ProductQuant
    from tpuflow.lowering.weights import WeightImage
    from tpuflow.options import CompileOptions
    g = prepared(quantized("cnn", "QDQ", True, "QUInt8"))
    groups = quantized_groups(g, form_groups(g))
    conv = next(x for x in groups if x.anchor.op_type == "Conv" and len(x.anchor.inputs) > 2)
    ctx = LowerCtx(g, CHIP, CompileOptions(), Emitter(CHIP), plan_ddr(g, groups, CHIP, "fp16", 0), WeightImage(0))
    emitter = ProductQuant(ctx, conv)
    x, w, b = (g.tensor(t) for t in conv.anchor.inputs)
    y = g.tensor(conv.nodes[-1].outputs[0])
    zp_x = int(x.quant.zero_point)
    assert zp_x != 0 and emitter.zp_x == zp_x
    want = b.const.astype(np.int64) - zp_x * w.const.astype(np.int64).reshape(w.shape[0], -1).sum(axis=1)
    assert np.array_equal(emitter.bias, want)
    words = emitter.requant.words.view(np.float32)
    scale = (np.float32(x.quant.scale) * w.quant.scale.astype(np.float32)).astype(np.float64) / float(y.quant.scale)
    assert np.array_equal(words[:, 0], scale.astype(np.float32))
    assert np.all(words[:, 1] == np.float32(int(y.quant.zero_point)))


def broadcast_product():
    """scores = q (2, 4, 8) . k (8, 4): a product of two activations whose batch dimensions broadcast,
    quantized by quantize_static (QDQ, seeded calibration)."""
    import logging
    import tempfile
    import onnx
    from onnx import TensorProto as T, helper
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static
    from quant_models import RandomReader
    graph = helper.make_graph([helper.make_node("MatMul", ["q", "k"], ["y"], name="scores")], "broadcast_product",
                              [helper.make_tensor_value_info("q", T.FLOAT, [2, 4, 8]),
                               helper.make_tensor_value_info("k", T.FLOAT, [8, 4])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [2, 4, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    logging.getLogger().setLevel(logging.ERROR)
    reader = type("Reader", (RandomReader, CalibrationDataReader), {})(model)
    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(model, f"{tmp}/f.onnx")
        quantize_static(f"{tmp}/f.onnx", f"{tmp}/q.onnx", reader, quant_format=QuantFormat.QDQ)
        return onnx.load(f"{tmp}/q.onnx")


def test_unsupported_quantized_nodes_are_named():
    g = load(broadcast_product())
    with pytest.raises(LoweringError) as err:
        check_supported(g)
    message = str(err.value)
    assert "node 'scores'" in message and "equal batch dimensions" in message and "\n" not in message


def test_supported_models_pass_the_check():
    for case in (("cnn", "QDQ", True, "QInt8"), ("cnn", "QOperator", False, "QUInt8"),
                 ("concat_net", "QDQ", False, "QInt8"),           # its Slice on int8 (a byte move)
                 ("attention", "QDQ", False, "QInt8"),            # Q.K^T of two activations
                 ("matmul_chain", "QDQ", True, "QUInt8")):        # bias and gain rows along the last axis
        check_supported(load(quantized(*case)))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=5))
def test_held_view_keeps_nchw_and_lays_other_tensors_as_rows(shape):
    """An NCHW tensor is held as it is; any other one as (1, rows, 1, last axis), row-major like its DDR
    bytes (so a layout-keeping Reshape is a view of the same held tile)."""
    view = held_view(shape)
    assert int(np.prod(view)) == int(np.prod(shape))
    if len(shape) == 4:
        assert view == tuple(shape)
    else:
        assert view == (1, int(np.prod(shape[:-1])), 1, shape[-1])
        if len(shape) != 3:                   # a leading 1 (a Reshape adding a batch dim) holds the same rows
            assert held_view([1, *shape]) == view


def test_chain_members_plan_in_the_ring_after_each_other():
    """A chain's members are planned as groups follow each other in the LMEM ring: where the region
    has room, consecutive members' buffers do not overlap (a member's constant loads need not wait for
    the previous member's compute), and emitting the chain leaves the ring where the group found it."""
    from tpuflow.lowering.context import LowerCtx
    from tpuflow.lowering.emitter import Emitter
    from tpuflow.lowering.ops.quant_ops import ChainQuant
    from tpuflow.lowering.weights import WeightImage
    from tpuflow.options import CompileOptions
    g = prepared(quantized("cnn", "QDQ", True, "QInt8"))
    groups = quantized_groups(g, form_groups(g), CHIP)
    chain = next(x for x in groups if isinstance(x, QuantChain) and len(x.members) > 3)
    ctx = LowerCtx(g, CHIP, CompileOptions(), Emitter(CHIP), plan_ddr(g, groups, CHIP, "fp16", 0), WeightImage(0))
    before = ctx.previous
    plan = ChainQuant(ctx, chain).plan("ring")
    assert ctx.previous == before and len(plan.members) == len(chain.members)
    spans = [(min(o for _, o, _ in p.buffers), p.peak) for p in plan.members if p.buffers]
    assert len(spans) > 3
    apart = [a[1] <= b[0] or b[1] <= a[0] for a, b in zip(spans, spans[1:])]
    assert sum(apart) >= len(apart) - 1, spans      # the global pool's whole input tile fits only over the region


def test_residents_leave_a_chain_room_for_the_tensors_it_holds():
    """The residency planner keeps the LMEM a group's reserve asks for free while it runs (every
    resident live there fits below the budget less the reserve); lowering.quant.chain_reserve asks a
    chain's held extent, so it can still hold its tensors instead of running its members through DDR."""
    from tpuflow.lowering.compiler import plan_layer_groups
    from tpuflow.lowering.mathops import CONST_REGION_BYTES
    from tpuflow.lowering.quant import chain_reserve
    from tpuflow.lowering.residency import plan_residency
    from tpuflow.options import CompileOptions
    g = prepared(quantized("cnn", "QDQ", True, "QInt8"))
    groups = quantized_groups(g, form_groups(g), CHIP)
    reserve = chain_reserve(g, groups, CHIP)
    chain = next(i for i, x in enumerate(groups) if isinstance(x, QuantChain) and len(x.members) > 3)
    assert reserve[chain] >= held_peak(g, groups[chain].members, CHIP.lanes) > 0
    f = prepared(models.build_model("small_cnn"))
    float_groups = form_groups(f)
    ports = lambda grp: __import__("tpuflow.lowering.compiler", fromlist=["x"]).resident_ports(  # noqa: E731
        f, grp, CHIP, CompileOptions(dtype="fp16"))
    free = plan_residency(f, float_groups, CHIP, Prec.FP16, CONST_REGION_BYTES, ports, None)
    busiest = max(range(len(float_groups)), key=lambda i: sum(t.size for t in free.tensors.values() if t.live_at(i)))
    top = CHIP.tile_window_offset // CHIP.bank_bytes * CHIP.bank_bytes
    budget = int((top - CONST_REGION_BYTES) * 0.7) // CHIP.bank_bytes * CHIP.bank_bytes
    extent = max(top - t.addr for t in free.tensors.values() if t.live_at(busiest))
    held = budget - extent + 1               # leaves one byte less than the unreserved plan used there
    kept = plan_residency(f, float_groups, CHIP, Prec.FP16, CONST_REGION_BYTES, ports, None, reserve={busiest: held})
    assert all(top - t.addr <= budget - held for t in kept.tensors.values() if t.live_at(busiest))
    assert set(kept.tensors) != set(free.tensors) or any(kept.tensors[t].addr != free.tensors[t].addr for t in kept.tensors)
    assert plan_layer_groups(g, groups, CHIP, CompileOptions(dtype="fp16")) is not None


def test_a_chain_plan_holding_nothing_wants_a_wider_region():
    from tpuflow.lowering.context import LowerCtx
    from tpuflow.lowering.emitter import Emitter
    from tpuflow.lowering.ops.quant_ops import ChainPlan, ChainQuant
    from tpuflow.lowering.weights import WeightImage
    from tpuflow.options import CompileOptions
    g = prepared(quantized("cnn", "QDQ", True, "QInt8"))
    groups = quantized_groups(g, form_groups(g), CHIP)
    chain = next(x for x in groups if isinstance(x, QuantChain) and len(x.members) > 3)
    ctx = LowerCtx(g, CHIP, CompileOptions(), Emitter(CHIP), plan_ddr(g, groups, CHIP, "fp16", 0), WeightImage(0))
    emitter = ChainQuant(ctx, chain)
    holding = emitter.plan("ring")
    flat = ChainPlan("ring", holding.window, holding.buffers, (), holding.members, None)
    assert holding.held and not emitter.wants_wider(holding) and emitter.wants_wider(flat)
    assert emitter.prefers(holding, flat) and not emitter.prefers(flat, holding)
