"""Ops with their own TIU/GDMA kernels, compiled, written, decoded and run on the functional model
(race detector on) and compared with onnxruntime: comparisons, logic, Where on a live condition,
Max/Min, rounding, Sign, Mod, Sin/Cos, ThresholdedRelu, Cast to int/bool. Attribute variants and
broadcast shapes come from hypothesis; inputs of integer or bool type get values in their range."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from onnx import TensorProto, helper

from tpuflow.codegen import read_program, write_program
from tpuflow.compare import TOLERANCES, compare, reference_outputs
from tpuflow.hwmodel.functional import run
from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model

ONNX_TYPE = {"float32": TensorProto.FLOAT, "int64": TensorProto.INT64, "bool": TensorProto.BOOL,
             "int32": TensorProto.INT32}
SETTINGS = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make_model(nodes, inputs: dict, outputs: dict, opset: int = 17, inits=()) -> onnx.ModelProto:
    """inputs / outputs: name -> (dtype name, shape)."""
    vi = lambda n, t: helper.make_tensor_value_info(n, ONNX_TYPE[t[0]], list(t[1]))
    graph = helper.make_graph(nodes, "k", [vi(n, t) for n, t in inputs.items()],
                              [vi(n, t) for n, t in outputs.items()], list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def sample(rng, dtype: str, shape, low=-4.0, high=4.0):
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype in ("int64", "int32"):
        return rng.integers(int(low), int(high) + 1, shape).astype(dtype)
    return rng.uniform(low, high, shape).astype(np.float32)


def check(model, feeds: dict, dtype: str = "fp32", tmp_path=None, exact: bool = False):
    """Our outputs (through the binary writer and reader) against onnxruntime's."""
    graph, program = compile_model(model, None, CompileOptions(dtype=dtype))
    if tmp_path is not None:
        write_program(program, tmp_path, name=graph.name)
        program = read_program(tmp_path, program.chip)
    ours = run(program, feeds, race_check=True)
    ref = reference_outputs(graph, feeds)
    for name in graph.outputs:
        err = compare(name, ours[name], ref[name])
        if exact:
            assert err.max_abs_err == 0.0, (name, err)
        assert err.ok(dtype), (name, err)


BROADCASTS = st.sampled_from([((2, 3, 4, 5), (2, 3, 4, 5)), ((2, 3, 4, 5), (5,)), ((2, 3, 4, 5), (3, 1, 1)),
                              ((1, 6, 7), (1, 6, 1)), ((4, 9), (1,)), ((3, 1, 5), (1, 4, 5))])


@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
@SETTINGS
@given(shapes=BROADCASTS, integer=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_comparisons(op, shapes, integer, seed):
    rng = np.random.default_rng(seed)
    if op == "LessOrEqual" or op == "GreaterOrEqual":
        opset = 16
    else:
        opset = 13
    t = "int64" if integer else "float32"
    a, b = sample(rng, t, shapes[0], -3, 3), sample(rng, t, shapes[1], -3, 3)
    if not integer:                                  # ties must occur for Equal / <= / >=
        a, b = np.round(a), np.round(b)
    out = np.broadcast_shapes(shapes[0], shapes[1])
    model = make_model([helper.make_node(op, ["a", "b"], ["y"])], {"a": (t, a.shape), "b": (t, b.shape)},
                       {"y": ("bool", out)}, opset)
    check(model, {"a": a, "b": b}, exact=True)


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
@SETTINGS
@given(shapes=BROADCASTS, seed=st.integers(0, 2 ** 16))
def test_logic(op, shapes, seed):
    rng = np.random.default_rng(seed)
    a, b = sample(rng, "bool", shapes[0]), sample(rng, "bool", shapes[1])
    out = np.broadcast_shapes(shapes[0], shapes[1])
    nodes = [helper.make_node(op, ["a", "b"], ["t"]), helper.make_node("Not", ["t"], ["y"])]
    model = make_model(nodes, {"a": ("bool", a.shape), "b": ("bool", b.shape)}, {"y": ("bool", out), "t": ("bool", out)})
    check(model, {"a": a, "b": b}, exact=True)


@SETTINGS
@given(shapes=BROADCASTS, const_branch=st.sampled_from(["none", "x", "y", "both"]), seed=st.integers(0, 2 ** 16))
def test_where_with_a_live_condition(shapes, const_branch, seed):
    """Where(x > y, x * 2, y): the condition comes from a compare on live tensors; either branch
    may be a constant."""
    rng = np.random.default_rng(seed)
    a, b = sample(rng, "float32", shapes[0]), sample(rng, "float32", shapes[1])
    out = np.broadcast_shapes(shapes[0], shapes[1])
    inits, xs, ys = [], "a", "b"
    if const_branch in ("x", "both"):
        inits.append(onnx.numpy_helper.from_array(np.float32(rng.normal(size=shapes[1][-1:])), "cx"))
        xs = "cx"
    if const_branch in ("y", "both"):
        inits.append(onnx.numpy_helper.from_array(np.float32([1.5]), "cy"))
        ys = "cy"
    nodes = [helper.make_node("Greater", ["a", "b"], ["c"]), helper.make_node("Where", ["c", xs, ys], ["y"])]
    model = make_model(nodes, {"a": ("float32", a.shape), "b": ("float32", b.shape)}, {"y": ("float32", out)},
                       13, inits)
    check(model, {"a": a, "b": b}, exact=True)


def test_where_with_a_bool_graph_input(tmp_path):
    rng = np.random.default_rng(3)
    c, x = sample(rng, "bool", (2, 8, 16)), sample(rng, "float32", (2, 8, 16))
    y = sample(rng, "float32", (16,))
    model = make_model([helper.make_node("Where", ["c", "x", "y"], ["o"])],
                       {"c": ("bool", c.shape), "x": ("float32", x.shape), "y": ("float32", y.shape)},
                       {"o": ("float32", x.shape)})
    check(model, {"c": c, "x": x, "y": y}, exact=True)


@pytest.mark.parametrize("op", ["Floor", "Ceil", "Round", "Sign", "Not"])
@SETTINGS
@given(shape=st.sampled_from([(2, 3, 17), (1, 70, 9), (5,)]), scale=st.sampled_from([1.0, 100.0, 3e7]),
       seed=st.integers(0, 2 ** 16))
def test_rounding_and_sign(op, shape, scale, seed):
    """Half-way values (Round: to even), zeros and values beyond the int32 range all occur."""
    rng = np.random.default_rng(seed)
    x = (rng.uniform(-4, 4, shape) * scale).astype(np.float32)
    x.reshape(-1)[:4] = [2.5, -0.5, 0.0, -3.5][: x.size]
    t = "bool" if op == "Not" else "float32"
    if op == "Not":
        x = x > 0
    model = make_model([helper.make_node(op, ["x"], ["y"])], {"x": (t, shape)}, {"y": (t, shape)}, 13)
    check(model, {"x": x}, exact=True)


@SETTINGS
@given(fmod=st.sampled_from([0, 1]), shapes=BROADCASTS, seed=st.integers(0, 2 ** 16))
def test_mod(fmod, shapes, seed):
    """fmod 0 on integers (the divisor's sign), fmod 1 on floats (C fmod)."""
    rng = np.random.default_rng(seed)
    t = "float32" if fmod else "int64"
    a = sample(rng, t, shapes[0], -50, 50)
    b = sample(rng, t, shapes[1], 1, 9) * np.where(rng.random(shapes[1]) < 0.5, -1, 1).astype(a.dtype)
    out = np.broadcast_shapes(shapes[0], shapes[1])
    model = make_model([helper.make_node("Mod", ["a", "b"], ["y"], fmod=fmod)],
                       {"a": (t, a.shape), "b": (t, b.shape)}, {"y": (t, out)}, 13)
    check(model, {"a": a, "b": b.astype(a.dtype)}, exact=not fmod)


@pytest.mark.parametrize("op", ["Sin", "Cos"])
@pytest.mark.parametrize("scale", [1.0, 10.0, 300.0])
def test_sin_cos(op, scale):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((3, 40, 33)) * scale).astype(np.float32)
    model = make_model([helper.make_node(op, ["x"], ["y"])], {"x": ("float32", x.shape)}, {"y": ("float32", x.shape)})
    check(model, {"x": x})


@SETTINGS
@given(alpha=st.floats(-1.0, 2.0), seed=st.integers(0, 2 ** 16))
def test_thresholded_relu(alpha, seed):
    x = sample(np.random.default_rng(seed), "float32", (2, 16, 9))
    model = make_model([helper.make_node("ThresholdedRelu", ["x"], ["y"], alpha=alpha)],
                       {"x": ("float32", x.shape)}, {"y": ("float32", x.shape)}, 10)
    check(model, {"x": x}, exact=True)


@pytest.mark.parametrize("to", ["int64", "bool", "int32"])
def test_cast_to_int_truncates_and_to_bool_tests_nonzero(to):
    x = np.array([[-2.7, -0.5, 0.0, 0.4, 1.5, 2.5, 3.99, -1e9]], np.float32)
    model = make_model([helper.make_node("Cast", ["x"], ["y"], to=ONNX_TYPE[to])], {"x": ("float32", x.shape)},
                       {"y": (to, x.shape)}, 13)
    check(model, {"x": x}, exact=True)


@pytest.mark.parametrize("op", ["Max", "Min"])
@SETTINGS
@given(shapes=BROADCASTS, seed=st.integers(0, 2 ** 16))
def test_binary_max_min_broadcast(op, shapes, seed):
    from tpuflow.frontend.registry import IMPORTERS
    if op not in IMPORTERS:
        pytest.skip(f"no ONNX importer for {op} yet (the frontend's variadic importer builds on the kernel)")
    rng = np.random.default_rng(seed)
    a, b = sample(rng, "float32", shapes[0]), sample(rng, "float32", shapes[1])
    out = np.broadcast_shapes(shapes[0], shapes[1])
    model = make_model([helper.make_node(op, ["a", "b"], ["y"])], {"a": ("float32", a.shape), "b": ("float32", b.shape)},
                       {"y": ("float32", out)}, 13)
    check(model, {"a": a, "b": b}, exact=True)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_low_precision_compare_where_round_sin(dtype, tmp_path):
    rng = np.random.default_rng(7)
    a, b = sample(rng, "float32", (2, 8, 30)), sample(rng, "float32", (30,))
    a, b = np.round(a * 4) / 4, np.round(b * 4) / 4     # exact in fp16/bf16: Floor and Less see the same values
    nodes = [helper.make_node("Less", ["a", "b"], ["c"]), helper.make_node("Floor", ["a"], ["f"]),
             helper.make_node("Sin", ["a"], ["s"]), helper.make_node("Where", ["c", "f", "s"], ["y"])]
    model = make_model(nodes, {"a": ("float32", a.shape), "b": ("float32", b.shape)},
                       {"y": ("float32", a.shape), "c": ("bool", a.shape)})
    check(model, {"a": a, "b": b}, dtype=dtype)


# ---------------------------------------------------------------- Resize / Upsample / Pad

def resize_model(shape, mode, ctm, nearest_mode, scales=None, sizes=None, opset=13, roi=None):
    inits = [onnx.numpy_helper.from_array(np.asarray(roi if roi is not None else [], np.float32), "roi")]
    names = ["x", "roi"]
    if sizes is None:
        inits.append(onnx.numpy_helper.from_array(np.asarray(scales, np.float32), "scales"))
        names.append("scales")
        out = [int(np.floor(d * s)) for d, s in zip(shape, scales)]
    else:
        inits += [onnx.numpy_helper.from_array(np.asarray(sizes, np.int64), "sizes")]
        names += ["", "sizes"]
        out = list(sizes)
    attrs = dict(mode=mode, coordinate_transformation_mode=ctm)
    if mode == "nearest":
        attrs["nearest_mode"] = nearest_mode
    node = helper.make_node("Resize", names, ["y"], **attrs)
    return make_model([node], {"x": ("float32", shape)}, {"y": ("float32", out)}, opset, inits)


CTMS = ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel", "tf_crop_and_resize"]


@settings(max_examples=int(os.environ.get("TPUFLOW_RESIZE_EXAMPLES", 30)), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(mode=st.sampled_from(["nearest", "linear"]),
       ctm=st.sampled_from(CTMS + ["half_pixel_symmetric"]),
       nearest_mode=st.sampled_from(["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]),
       factors=st.sampled_from([(2, 2), (3, 1), (0.5, 0.5), (1.5, 2.5), (2, 0.75)]), use_sizes=st.booleans(),
       seed=st.integers(0, 2 ** 16))
def test_resize_every_mode(mode, ctm, nearest_mode, factors, use_sizes, seed):
    shape = (1, 3, 6, 8)
    scales = [1.0, 1.0, *factors]
    sizes = [int(np.floor(d * s)) for d, s in zip(shape, scales)] if use_sizes else None
    roi = [0, 0, 0.1, 0.2, 1, 1, 0.9, 0.7] if ctm == "tf_crop_and_resize" else None
    opset = 19 if ctm == "half_pixel_symmetric" else 13
    model = resize_model(shape, mode, ctm, nearest_mode, None if use_sizes else scales, sizes, opset, roi)
    x = sample(np.random.default_rng(seed), "float32", shape)
    check(model, {"x": x}, exact=False)


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("shape,factors", [((1, 70, 5, 7), (2, 2)), ((2, 3, 9, 4), (3, 2)), ((1, 8, 40, 40), (2, 2))])
def test_resize_nearest_integer_upsample_kernel(shape, factors, dtype):
    """Integer nearest upsampling (YOLO / FPN necks) is the LMEM replication kernel, exact."""
    from tpuflow.isa import ArTiu, Mm2Tiu
    model = resize_model(shape, "nearest", "asymmetric", "floor", [1, 1, *factors])
    x = sample(np.random.default_rng(0), "float32", shape)
    check(model, {"x": x}, dtype=dtype, exact=dtype == "fp32")
    _, program = compile_model(model)
    assert not any(isinstance(i, Mm2Tiu) for i in program.tiu)
    assert any(isinstance(i, ArTiu) and i.op == "copy" for i in program.tiu)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample_opset9(mode):
    shape = (1, 4, 5, 6)
    inits = [onnx.numpy_helper.from_array(np.asarray([1, 1, 2, 3], np.float32), "s")]
    model = make_model([helper.make_node("Upsample", ["x", "s"], ["y"], mode=mode)], {"x": ("float32", shape)},
                       {"y": ("float32", (1, 4, 10, 18))}, 9, inits)
    check(model, {"x": sample(np.random.default_rng(2), "float32", shape)})


def test_resize_cubic_is_rejected_naming_the_node():
    from tpuflow.errors import UnsupportedOpError
    model = resize_model((1, 2, 4, 4), "cubic", "half_pixel", "floor", [1, 1, 2, 2])
    with pytest.raises(UnsupportedOpError, match=r"Resize\[mode=cubic\].*resize|Resize\[mode=cubic\]"):
        compile_model(model)


def test_resize_modes_onnxruntime_cannot_run_are_a_one_line_model_error():
    from tpuflow.errors import ModelError
    model = resize_model((1, 2, 4, 4), "nearest", "tf_half_pixel_for_nearest", "floor", [1, 1, 2, 2], opset=13)
    with pytest.raises(ModelError, match=r"node 'Resize_0' \(Resize\): onnxruntime cannot run its attributes"):
        compile_model(model)


@SETTINGS
@given(mode=st.sampled_from(["reflect", "edge"]), pads=st.lists(st.integers(0, 3), min_size=8, max_size=8),
       seed=st.integers(0, 2 ** 16))
def test_pad_reflect_edge(mode, pads, seed):
    shape = (1, 4, 5, 6)                            # reflect pads stay below every axis
    pads[0] = pads[4] = 0
    out = [d + pads[i] + pads[4 + i] for i, d in enumerate(shape)]
    inits = [onnx.numpy_helper.from_array(np.asarray(pads, np.int64), "p")]
    model = make_model([helper.make_node("Pad", ["x", "p"], ["y"], mode=mode)], {"x": ("float32", shape)},
                       {"y": ("float32", out)}, 13, inits)
    check(model, {"x": sample(np.random.default_rng(seed), "float32", shape)}, exact=True)


# ---------------------------------------------------------------- Gather family (runtime indices)

@SETTINGS
@given(data_shape=st.sampled_from([(50, 16), (7, 5, 9), (3, 4, 6, 5), (1000, 3)]), axis_pick=st.integers(0, 3),
       idx_shape=st.sampled_from([(4,), (2, 3), (1,), (5000,)]), const_table=st.booleans(),
       seed=st.integers(0, 2 ** 16))
def test_gather_runtime_indices(data_shape, axis_pick, idx_shape, const_table, seed):
    """Embedding lookups (constant table) and gathers of live data, any axis, negative indices."""
    rng = np.random.default_rng(seed)
    axis = axis_pick % len(data_shape)
    if idx_shape == (5000,) and (axis != 0 or data_shape[0] != 1000):
        idx_shape = (6,)
    dim = data_shape[axis]
    idx = rng.integers(-dim, dim, idx_shape).astype(np.int64)
    out = data_shape[:axis] + idx_shape + data_shape[axis + 1:]
    table = sample(rng, "float32", data_shape)
    inputs, inits, feeds = {"i": ("int64", idx_shape)}, [], {"i": idx}
    if const_table:
        inits.append(onnx.numpy_helper.from_array(table, "t"))
    else:
        inputs["t"] = ("float32", data_shape)
        feeds["t"] = table
    model = make_model([helper.make_node("Gather", ["t", "i"], ["y"], axis=axis)], inputs, {"y": ("float32", out)},
                       13, inits)
    check(model, feeds, exact=True)


def test_embedding_lookup_is_one_gather_dma_per_block():
    from tpuflow.isa import GatherDma
    table = onnx.numpy_helper.from_array(np.ones((300, 64), np.float32), "t")
    model = make_model([helper.make_node("Gather", ["t", "i"], ["y"])], {"i": ("int64", (2, 128))},
                       {"y": ("float32", (2, 128, 64))}, 13, [table])
    _, program = compile_model(model)
    gathers = [i for i in program.gdma if isinstance(i, GatherDma)]
    assert len(gathers) == 1 and gathers[0].index_hsize == 256 and gathers[0].src_wsize == 64


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_embedding_low_precision(dtype):
    rng = np.random.default_rng(5)
    table = onnx.numpy_helper.from_array(sample(rng, "float32", (200, 24)), "t")
    idx = rng.integers(-200, 200, (3, 7)).astype(np.int64)
    model = make_model([helper.make_node("Gather", ["t", "i"], ["y"])], {"i": ("int64", idx.shape)},
                       {"y": ("float32", (3, 7, 24))}, 13, [table])
    check(model, {"i": idx}, dtype=dtype)


@SETTINGS
@given(data_shape=st.sampled_from([(6, 5, 4), (9, 8), (3, 4, 5, 2)]), k_pick=st.integers(1, 3),
       lead=st.sampled_from([(3,), (2, 2)]), const_idx=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_gather_nd(data_shape, k_pick, lead, const_idx, seed):
    rng = np.random.default_rng(seed)
    k = min(k_pick, len(data_shape))
    idx = np.stack([rng.integers(-d, d, lead) for d in data_shape[:k]], axis=-1).astype(np.int64)
    data = sample(rng, "float32", data_shape)
    out = lead + data_shape[k:]
    inputs, inits, feeds = {"d": ("float32", data_shape)}, [], {"d": data}
    if const_idx:
        inits.append(onnx.numpy_helper.from_array(idx, "i"))
    else:
        inputs["i"] = ("int64", idx.shape)
        feeds["i"] = idx
    # data through a Neg: a Reshape view of a graph input is mis-planned by lowering/ddrplan.py (reported)
    nodes = [helper.make_node("Neg", ["d"], ["nd"]), helper.make_node("GatherND", ["nd", "i"], ["y"])]
    feeds["d"] = -data
    model = make_model(nodes, inputs, {"y": ("float32", out)}, 13, inits)
    check(model, feeds, exact=True)


@SETTINGS
@given(data_shape=st.sampled_from([(4, 5), (3, 4, 6)]), axis_pick=st.integers(0, 2), shrink=st.booleans(),
       const_idx=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_gather_elements(data_shape, axis_pick, shrink, const_idx, seed):
    rng = np.random.default_rng(seed)
    axis = axis_pick % len(data_shape)
    ishape = tuple(max(1, d - 1) if shrink else d for d in data_shape)
    idx = rng.integers(-data_shape[axis], data_shape[axis], ishape).astype(np.int64)
    data = sample(rng, "float32", data_shape)
    inputs, inits, feeds = {"d": ("float32", data_shape)}, [], {"d": data}
    if const_idx:
        inits.append(onnx.numpy_helper.from_array(idx, "i"))
    else:
        inputs["i"] = ("int64", idx.shape)
        feeds["i"] = idx
    nodes = [helper.make_node("Neg", ["d"], ["nd"]),          # see test_gather_nd
             helper.make_node("GatherElements", ["nd", "i"], ["y"], axis=axis)]
    feeds["d"] = -data
    model = make_model(nodes, inputs, {"y": ("float32", ishape)}, 13, inits)
    check(model, feeds, exact=True)


@SETTINGS
@given(rows=st.integers(1, 5000), width=st.integers(1, 300), count=st.integers(1, 600),
       index_lmem=st.booleans(), start_pos=st.integers(0, 3))
def test_gather_dma_descriptor_round_trip(rows, width, count, index_lmem, start_pos):
    """gdma.gather encodes into the DMA_gather register and decodes back unchanged."""
    from tpuflow.codegen.sg2260 import decode_descriptors, encode_descriptor
    from tpuflow.isa import Engine, GatherDma
    index = (31 << 40) + 4096 if index_lmem else 1 << 20
    g = GatherDma(src_start_addr=1 << 24, dst_start_addr=1 << 26, index_start_addr=index, src_csize=1,
                  src_hsize=rows, src_wsize=width, src_cstride=rows * width, src_hstride=width,
                  dst_cstride=count * width, dst_hstride=width, index_csize=1, index_hsize=count, index_cstride=0,
                  dst_csize=1, dst_hsize=count, dst_wsize=width, start_pos=start_pos)
    assert decode_descriptors(encode_descriptor(g), Engine.GDMA) == [g]


# ---------------------------------------------------------------- ArgMax / ArgMin / Hardmax / TopK

def _with_ties(rng, shape):
    """Values on a coarse grid, so maxima repeat and the tie rules matter."""
    return (rng.integers(-4, 5, shape) * 0.5).astype(np.float32)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@SETTINGS
@given(shape=st.sampled_from([(3, 7), (2, 5, 6), (2, 3, 4, 5)]), axis_pick=st.integers(0, 3), keepdims=st.booleans(),
       last=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_arg_extreme(op, shape, axis_pick, keepdims, last, seed):
    rng = np.random.default_rng(seed)
    axis = axis_pick % len(shape)
    x = _with_ties(rng, shape)
    out = tuple(1 if i == axis else d for i, d in enumerate(shape) if keepdims or i != axis)
    node = helper.make_node(op, ["x"], ["y"], axis=axis, keepdims=int(keepdims), select_last_index=int(last))
    check(make_model([node], {"x": ("float32", shape)}, {"y": ("int64", out)}, 13), {"x": x}, exact=True)


@SETTINGS
@given(shape=st.sampled_from([(3, 7), (2, 5, 6)]), axis_pick=st.integers(0, 2), seed=st.integers(0, 2 ** 16))
def test_hardmax(shape, axis_pick, seed):
    axis = axis_pick % len(shape)
    x = _with_ties(np.random.default_rng(seed), shape)
    model = make_model([helper.make_node("Hardmax", ["x"], ["y"], axis=axis)], {"x": ("float32", shape)},
                       {"y": ("float32", shape)}, 13)
    check(model, {"x": x}, exact=True)


@SETTINGS
@given(shape=st.sampled_from([(3, 9), (2, 4, 10), (1, 70)]), axis_pick=st.integers(0, 2), k=st.integers(1, 6),
       largest=st.booleans(), ties=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_topk(shape, axis_pick, k, largest, ties, seed):
    rng = np.random.default_rng(seed)
    axis = axis_pick % len(shape)
    k = min(k, shape[axis])
    x = _with_ties(rng, shape) if ties else sample(rng, "float32", shape)
    out = tuple(k if i == axis else d for i, d in enumerate(shape))
    kk = onnx.numpy_helper.from_array(np.asarray([k], np.int64), "k")
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=int(largest), sorted=1)
    model = make_model([node], {"x": ("float32", shape)}, {"v": ("float32", out), "i": ("int64", out)}, 13, [kk])
    check(model, {"x": x}, exact=True)


@pytest.mark.slow
def test_topk_64_of_a_row_of_1000():
    x = sample(np.random.default_rng(0), "float32", (2, 1000))
    kk = onnx.numpy_helper.from_array(np.asarray([64], np.int64), "k")
    model = make_model([helper.make_node("TopK", ["x", "k"], ["v", "i"])], {"x": ("float32", x.shape)},
                       {"v": ("float32", (2, 64)), "i": ("int64", (2, 64))}, 13, [kk])
    check(model, {"x": x}, exact=True)


# ---------------------------------------------------------------- ScatterND (constant indices)

@SETTINGS
@given(data_shape=st.sampled_from([(8, 5), (4, 3, 6), (2, 3, 4, 5)]), k_pick=st.integers(1, 3),
       count=st.integers(1, 6), const_data=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_scatter_nd_constant_indices(data_shape, k_pick, count, const_data, seed):
    """Rows overwritten in index order (duplicates: the last wins), negative indices, live updates."""
    rng = np.random.default_rng(seed)
    k = min(k_pick, len(data_shape))
    idx = np.stack([rng.integers(-d, d, (count,)) for d in data_shape[:k]], axis=-1).astype(np.int64)
    upd_shape = (count,) + data_shape[k:]
    data, upd = sample(rng, "float32", data_shape), sample(rng, "float32", upd_shape)
    inits = [onnx.numpy_helper.from_array(idx, "i")]
    inputs, feeds = {"u": ("float32", upd_shape)}, {"u": upd}
    if const_data:
        inits.append(onnx.numpy_helper.from_array(data, "d"))
    else:
        inputs["d"] = ("float32", data_shape)
        feeds["d"] = data
    model = make_model([helper.make_node("ScatterND", ["d", "i", "u"], ["y"])], inputs,
                       {"y": ("float32", data_shape)}, 13, inits)
    check(model, feeds, exact=True)


def test_scatter_nd_reduction_is_rejected_naming_the_node():
    from tpuflow.errors import UnsupportedOpError
    inits = [onnx.numpy_helper.from_array(np.asarray([[1]], np.int64), "i")]
    model = make_model([helper.make_node("ScatterND", ["d", "i", "u"], ["y"], reduction="add")],
                       {"d": ("float32", (4, 3)), "u": ("float32", (1, 3))}, {"y": ("float32", (4, 3))}, 16, inits)
    with pytest.raises(UnsupportedOpError, match=r"ScatterND\[reduction=add\]"):
        compile_model(model)


@SETTINGS
@given(mode=st.sampled_from(["reflect", "edge", "constant"]), shape=st.sampled_from([(6, 9), (3, 4, 7), (2, 70, 5, 6)]),
       data=st.data())
def test_pad_reflect_edge_any_rank(mode, shape, data):
    """Planes beyond one lane group, several images, pads on every axis (constant: a fill value)."""
    rank = len(shape)
    pads = [data.draw(st.integers(0, min(2, d - 1))) for d in shape * 2]
    out = [d + pads[i] + pads[rank + i] for i, d in enumerate(shape)]
    inits = [onnx.numpy_helper.from_array(np.asarray(pads, np.int64), "p")]
    names = ["x", "p"]
    if mode == "constant":
        inits.append(onnx.numpy_helper.from_array(np.asarray(-1.25, np.float32), "v"))
        names.append("v")
    model = make_model([helper.make_node("Pad", names, ["y"], mode=mode)], {"x": ("float32", shape)},
                       {"y": ("float32", out)}, 13, inits)
    check(model, {"x": sample(np.random.default_rng(1), "float32", shape)}, exact=True)


def test_pad_reflect_fp16():
    shape, pads = (1, 8, 12, 10), [0, 0, 2, 3, 0, 0, 1, 2]
    out = [d + pads[i] + pads[4 + i] for i, d in enumerate(shape)]
    inits = [onnx.numpy_helper.from_array(np.asarray(pads, np.int64), "p")]
    model = make_model([helper.make_node("Pad", ["x", "p"], ["y"], mode="reflect")], {"x": ("float32", shape)},
                       {"y": ("float32", out)}, 13, inits)
    check(model, {"x": sample(np.random.default_rng(4), "float32", shape)}, dtype="fp16")


def test_gather_reads_int32_indices_when_the_ddr_plan_keeps_them(monkeypatch):
    """Indices stored as int32 in DDR (exact beyond 2**24) skip the float conversion: the DDR plan is
    patched to keep the index input as int32 (fp32 activations: the same 4 bytes per element)."""
    import dataclasses
    from tpuflow.lowering import compiler
    real = compiler.plan_ddr

    def keep_int32(graph, *args, **kwargs):
        plan = real(graph, *args, **kwargs)
        plan.tensors["i"] = dataclasses.replace(plan.tensors["i"], dtype="int32")
        return plan

    monkeypatch.setattr(compiler, "plan_ddr", keep_int32)
    rng = np.random.default_rng(9)
    table = onnx.numpy_helper.from_array(sample(rng, "float32", (70000, 3)), "t")
    idx = np.concatenate([rng.integers(-70000, 70000, 20), [69999, -1]]).astype(np.int64)
    model = make_model([helper.make_node("Gather", ["t", "i"], ["y"])], {"i": ("int64", idx.shape)},
                       {"y": ("float32", (len(idx), 3))}, 13, [table])
    check(model, {"i": idx}, exact=True)


# ---------------------------------------------------------------- composites (fusion with conv / matmul groups)

def _conv_node(b_inits, rng, name, cin, cout, x, y, k=3):
    w = (rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)).astype(np.float32)
    b_inits.append(onnx.numpy_helper.from_array(w, name))
    return helper.make_node("Conv", [x, name], [y], pads=[k // 2] * 4)


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_yolo_style_neck_compare_where_resize_concat(dtype):
    """Conv -> (Greater, Where) fused as the conv epilogue, nearest x2 upsampling, concat with a
    skip branch, Sin/Floor on the way out, verified against onnxruntime."""
    rng = np.random.default_rng(0)
    inits = [onnx.numpy_helper.from_array(np.asarray([], np.float32), "roi"),
             onnx.numpy_helper.from_array(np.asarray([1, 1, 2, 2], np.float32), "sc"),
             onnx.numpy_helper.from_array(np.asarray(0.1, np.float32), "slope")]
    nodes = [_conv_node(inits, rng, "w0", 8, 16, "x", "c0"),
             helper.make_node("Greater", ["c0", "slope"], ["pos"]),
             helper.make_node("Mul", ["c0", "slope"], ["leak"]),
             helper.make_node("Where", ["pos", "c0", "leak"], ["a0"]),
             helper.make_node("Resize", ["a0", "roi", "sc"], ["up"], mode="nearest"),
             _conv_node(inits, rng, "w1", 4, 16, "skip", "c1", k=1),
             helper.make_node("Concat", ["up", "c1"], ["cat"], axis=1),
             helper.make_node("Sin", ["cat"], ["s"]),
             helper.make_node("Floor", ["cat"], ["f"]),
             helper.make_node("Max", ["s", "f"], ["y"])]
    from tpuflow.frontend.registry import IMPORTERS
    if "Max" not in IMPORTERS:
        nodes[-1] = helper.make_node("Add", ["s", "f"], ["y"])
    model = make_model(nodes, {"x": ("float32", (1, 8, 10, 12)), "skip": ("float32", (1, 4, 20, 24))},
                       {"y": ("float32", (1, 32, 20, 24))}, 13, inits)
    rng2 = np.random.default_rng(1)
    feeds = {"x": sample(rng2, "float32", (1, 8, 10, 12)), "skip": sample(rng2, "float32", (1, 4, 20, 24))}
    if dtype == "fp32":
        check(model, feeds)
    else:        # Floor jumps where fp16 rounding moves a value across an integer: compare the smooth part
        nodes[-3:] = [helper.make_node("Sin", ["cat"], ["y"])]
        check(make_model(nodes, {"x": ("float32", (1, 8, 10, 12)), "skip": ("float32", (1, 4, 20, 24))},
                         {"y": ("float32", (1, 32, 20, 24))}, 13, inits), feeds, dtype=dtype)


def test_attention_mask_from_token_ids():
    """Equal on int64 token ids -> a mask applied with Where to MatMul scores, then Softmax."""
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 3, (1, 16)).astype(np.int64)
    q = sample(rng, "float32", (1, 16, 32))
    inits = [onnx.numpy_helper.from_array(np.asarray(0, np.int64), "pad_id"),
             onnx.numpy_helper.from_array(np.asarray(-1e4, np.float32), "neg"),
             onnx.numpy_helper.from_array((rng.standard_normal((32, 16)) / 6).astype(np.float32), "wk")]
    nodes = [helper.make_node("MatMul", ["q", "wk"], ["scores"]),
             helper.make_node("Equal", ["ids", "pad_id"], ["is_pad"]),
             helper.make_node("Where", ["is_pad", "neg", "scores"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["y"], axis=-1)]
    model = make_model(nodes, {"q": ("float32", q.shape), "ids": ("int64", ids.shape)},
                       {"y": ("float32", (1, 16, 16))}, 13, inits)
    check(model, {"q": q, "ids": ids})


@pytest.mark.parametrize("case", ["pad_reflect", "resize_nearest", "compare_where_sin"])
def test_full_verify_through_the_binaries(case):
    """tpuflow.pipeline.verify: written .BD/.GDMA streams read back, race detector on."""
    from tpuflow.pipeline import verify
    if case == "pad_reflect":
        inits = [onnx.numpy_helper.from_array(np.asarray([0, 0, 1, 2, 0, 0, 2, 1], np.int64), "p")]
        model = make_model([helper.make_node("Pad", ["x", "p"], ["y"], mode="reflect")], {"x": ("float32", (1, 3, 5, 6))},
                           {"y": ("float32", (1, 3, 8, 9))}, 13, inits)
    elif case == "resize_nearest":
        model = resize_model((1, 70, 5, 7), "nearest", "asymmetric", "floor", [1, 1, 2, 2])
    else:
        nodes = [helper.make_node("Sin", ["x"], ["s"]), helper.make_node("Greater", ["s", "x"], ["g"]),
                 helper.make_node("Where", ["g", "s", "x"], ["y"])]
        model = make_model(nodes, {"x": ("float32", (2, 30, 17))}, {"y": ("float32", (2, 30, 17))})
    for dtype in ("fp32", "fp16"):
        result = verify(model, None, CompileOptions(dtype=dtype), race_check=True)
        assert result["ok"], result["outputs"]


def test_gather_dma_timing_reads_one_row_per_index():
    """The timing model's read side of gdma.gather: index_hsize rows of src_wsize elements, spread
    over the table (each its own segment), and the write side the contiguous output."""
    from tpuflow.chip import load_chip
    from tpuflow.hwmodel.timing.segments import _segments, transfer_sides
    from tpuflow.isa import GatherDma
    chip = load_chip("sg2260")
    g = GatherDma(src_start_addr=1 << 20, dst_start_addr=1 << 26, index_start_addr=(31 << 40), src_csize=1,
                  src_hsize=1000, src_wsize=64, src_cstride=64000, src_hstride=64, dst_cstride=640, dst_hstride=64,
                  index_csize=1, index_hsize=10, index_cstride=0, dst_csize=1, dst_hsize=10, dst_wsize=64)
    src, dst = transfer_sides(g, chip)
    starts, lengths = _segments(src, chip.lanes, chip.lmem_bytes_per_lane)
    assert len(starts) == 10 and set(lengths) == {256} and np.all(np.diff(starts) == 100 * 64 * 4)
    assert src.nbytes == dst.nbytes == 10 * 64 * 4 and not dst.lmem


def test_pad_and_upsample_of_rows_too_long_for_lmem():
    shape = (1, 1, 2, 40000)
    inits = [onnx.numpy_helper.from_array(np.asarray([0, 0, 1, 2, 0, 0, 1, 1], np.int64), "p")]
    model = make_model([helper.make_node("Pad", ["x", "p"], ["y"], mode="reflect")], {"x": ("float32", shape)},
                       {"y": ("float32", (1, 1, 4, 40003))}, 13, inits)
    x = sample(np.random.default_rng(0), "float32", shape)
    check(model, {"x": x}, exact=True)
    check(resize_model(shape, "nearest", "asymmetric", "floor", [1, 1, 2, 2]), {"x": x}, exact=True)


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("shape,scales,ctm", [((1, 70, 9, 13), (2.5, 1.7), "half_pixel"),
                                              ((1, 3, 150, 150), (2, 2), "align_corners"),
                                              ((2, 8, 20, 24), (0.5, 2), "pytorch_half_pixel")])
def test_linear_resize_is_the_two_tap_lmem_kernel(shape, scales, ctm, dtype):
    """Linear Resize runs as per-axis two-tap interpolation in LMEM (no MatMul); more planes than
    lanes, planes too large for one LMEM block (chunks of output rows with their input rows)."""
    from tpuflow.isa import Mm2Tiu
    model = resize_model(shape, "linear", ctm, "floor", [1, 1, *scales])
    graph, program = compile_model(model)
    assert [n.op_type for n in graph.nodes()] == ["Resample", "Resample"]
    assert not any(isinstance(i, Mm2Tiu) for i in program.tiu)
    check(model, {"x": sample(np.random.default_rng(3), "float32", shape)}, dtype=dtype)
