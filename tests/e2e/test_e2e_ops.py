"""Every op family compiled, written, decoded and run on the functional model (race detector on),
compared with onnxruntime through tpuflow.pipeline.verify — on the TIU and TILE matmul paths."""

from __future__ import annotations

import numpy as np
import pytest
from onnx_build import ModelBuilder

from tpuflow.options import CompileOptions
from tpuflow.pipeline import verify


def check(model, matmul="tiu", dtype="fp32", seed=0):
    result = verify(model, None, CompileOptions(dtype=dtype, matmul=matmul), seed=seed, race_check=True)
    assert result["ok"], result["outputs"]
    return result


def conv_model(cin=8, cout=16, hw=12, k=3, stride=1, pad=1, dil=1, group=1, bias=True, act=None, pool=None):
    b = ModelBuilder()
    x = b.input("x", [1, cin, hw, hw])
    ins = [x, b.weight("w", [cout, cin // group, k, k])] + ([b.weight("b", [cout], 0.1)] if bias else [])
    y = b.node("Conv", ins, "c", strides=[stride] * 2, pads=[pad] * 4, dilations=[dil] * 2, group=group)
    if act:
        y = b.node(act, [y], "a")
    if pool:
        y = b.node(pool, [y], "p", kernel_shape=[2, 2], strides=[2, 2])
    b.output(y)
    return b.model()


CONVS = {
    "plain": {}, "strided": dict(stride=2), "dilated": dict(dil=2, pad=2), "grouped": dict(group=2),
    "depthwise": dict(cin=16, group=16), "no_bias_1x1": dict(k=1, pad=0, bias=False),
    "relu_maxpool": dict(act="Relu", pool="MaxPool"), "relu_avgpool": dict(act="Relu", pool="AveragePool"),
    "wide": dict(cin=70, cout=130, hw=9),
    # several staging blocks per group on the TILE path, and a bias row every group still needs
    "grouped_large": dict(cin=96, cout=64, hw=27, k=5, pad=2, group=2, act="Relu"),
}


@pytest.mark.parametrize("matmul", ["tiu", "tile"])
@pytest.mark.parametrize("case", sorted(CONVS))
def test_conv(case, matmul):
    check(conv_model(**CONVS[case]), matmul)


def test_per_channel_constants_load_one_run_per_lane():
    """Depthwise weights and the bias of 150 channels (3 per lane, the last group partial) come
    from a lane-major copy in the weight image: one DMA writing a 3 x 9-element run into each of
    64 lanes, not 150 short unaligned ones; numerics on both dtypes."""
    from tpuflow.isa import TensorDma
    from tpuflow.pipeline import compile_model
    model = conv_model(cin=150, cout=150, hw=8, group=150)
    _, program = compile_model(model)
    shapes = [(i.dst_csize, i.dst_wsize) for i in program.gdma if isinstance(i, TensorDma)]
    assert (64, 3 * 9) in shapes and (64, 3) in shapes
    for dtype in ("fp32", "fp16"):
        check(model, "tiu", dtype)


def test_conv_bn_residual_relu_fp16():
    b = ModelBuilder()
    x = b.input("x", [1, 16, 10, 10])
    c = b.node("Conv", [x, b.weight("w", [16, 16, 3, 3])], "c", pads=[1, 1, 1, 1])
    n = b.node("BatchNormalization", [c, b.weight("g", [16], positive=True), b.weight("be", [16], 0.1),
                                      b.weight("m", [16], 0.1), b.weight("v", [16], positive=True)], "n")
    a = b.node("Add", [n, x], "a")
    b.output(b.node("Relu", [a], "r"))
    for dtype in ("fp32", "fp16", "bf16"):
        check(b.model(), "tiu", dtype)


@pytest.mark.parametrize("kind,attrs", [
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1], count_include_pad=1)),
    ("AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)),
])
def test_pool(kind, attrs):
    b = ModelBuilder()
    b.output(b.node(kind, [b.input("x", [1, 8, 11, 11])], "p", **attrs))
    check(b.model())


def test_lrn_and_global_pool():
    b = ModelBuilder()
    x = b.input("x", [1, 20, 7, 7])
    y = b.node("LRN", [x], "l", size=5, alpha=1e-3, beta=0.75, bias=1.0)
    b.output(b.node("GlobalAveragePool", [y], "g"))
    check(b.model())


@pytest.mark.parametrize("matmul", ["tiu", "tile"])
@pytest.mark.parametrize("shapes", [((2, 48), (48, 10)), ((3, 20, 32), (32, 24)), ((2, 4, 8, 16), (2, 4, 16, 8)),
                                    ((1, 70), (70, 130)), ((5, 7, 9), (9, 3))])
def test_matmul(shapes, matmul):
    a_shape, b_shape = shapes
    b = ModelBuilder()
    x = b.input("x", list(a_shape))
    if len(b_shape) == 2:
        w = b.weight("w", list(b_shape))
        y = b.node("MatMul", [x, w], "y")
    else:
        y = b.node("MatMul", [x, b.input("z", list(b_shape))], "y")
    b.output(y)
    check(b.model(), matmul)


def _tile_pushes(model):
    """(TPUSHes on T, TPUSHes on U, TMATMULs reading with .reuse, GDMA instructions writing tile
    slots, those of them writing several slots) of the compiled TILE-path program, every MatMul on the cube
    (--tile-engine all: fit may put a product on the TIU)."""
    from tpuflow.isa import TMatmul, TPush
    from tpuflow.pipeline import compile_model
    _, program = compile_model(model, None, CompileOptions(matmul="tile", tile_engine="all"))
    pushes = [i.dst_queue for i in program.tile if isinstance(i, TPush) for _ in range(i.count)]
    reused = [i for i in program.tile if isinstance(i, TMatmul) and (i.reuse0 or i.reuse1)]
    chip = program.chip
    writes = [i.accesses(chip).lmem_writes for i in program.gdma]
    fills = [w for w in writes if any(r.lo >= chip.tile_window_offset for r in w)]
    runs = [w for w in fills if max(r.lanes for r in w) > 1]
    return pushes.count(0), pushes.count(1), reused, fills, runs


@pytest.mark.parametrize("m,k,n,resident", [(128, 256, 512, "a"), (100, 2304, 40, ""), (40, 200, 300, "a")])
def test_tile_matmul_keeps_the_runtime_operand_resident(m, k, n, resident):
    """A runtime A (K tiles reach Nz through 32 B DMA pieces) is loaded once per row of output
    tiles and read with .reuse while the constant B streams, when its K tiles fit one queue; a K
    too deep for the queue streams both. Numerics against onnxruntime either way."""
    b = ModelBuilder()
    b.output(b.node("MatMul", [b.input("x", [m, k]), b.weight("w", [k, n])], "y"))
    model = b.model()
    t_pushes, u_pushes, reused, fills, runs = _tile_pushes(model)
    check(model, "tile")
    # the constant B's tiles arrive in runs, several neighbouring slots (lanes) per DMA
    assert runs and len(fills) < t_pushes + u_pushes
    if resident == "a":
        # A tiles loaded once each (T pushes = row tiles x K tiles), B once per output tile and
        # K step: U pushes = T pushes x column tiles, at least ceil(n / 64) of them
        assert reused and u_pushes % t_pushes == 0 and u_pushes // t_pushes >= -(-n // 64)
    else:
        assert not reused and t_pushes == u_pushes


def test_tile_matmul_keeps_a_runtime_b_resident():
    """Constant A times runtime B: B's K tiles stay in U (.reuse on src1) while A streams."""
    b = ModelBuilder()
    b.output(b.node("MatMul", [b.weight("w", [200, 96]), b.input("x", [96, 48])], "y"))
    model = b.model()
    t_pushes, u_pushes, reused, _, _ = _tile_pushes(model)
    check(model, "tile")
    assert reused and all(i.reuse1 and not i.reuse0 for i in reused)
    assert t_pushes % u_pushes == 0 and t_pushes // u_pushes >= -(-200 // 64)


@pytest.mark.parametrize("matmul", ["tiu", "tile"])
def test_gemm_bias_activation(matmul):
    b = ModelBuilder()
    g = b.node("Gemm", [b.input("x", [4, 40]), b.weight("w", [24, 40]), b.weight("c", [24], 0.1)], "g", transB=1)
    b.output(b.node("Tanh", [g], "t"))
    check(b.model(), matmul)


UNARY = ["Relu", "Sigmoid", "Tanh", "Exp", "Erf", "Abs", "Neg", "Reciprocal", "Sqrt", "Log", "HardSwish"]


@pytest.mark.parametrize("op", UNARY)
def test_unary(op):
    b = ModelBuilder(opset=14)
    x = b.input("x", [2, 3, 5, 7])
    if op in ("Sqrt", "Log", "Reciprocal"):
        x = b.node("Abs", [x], "ax")
        x = b.node("Add", [x, b.const("eps", np.array(0.1, np.float32))], "px")
    b.output(b.node(op, [x], "y"))
    check(b.model())


@pytest.mark.parametrize("op,attrs", [("LeakyRelu", dict(alpha=0.1)), ("HardSigmoid", dict(alpha=0.3, beta=0.4)),
                                      ("Clip", {})])
def test_unary_with_attributes(op, attrs):
    b = ModelBuilder(opset=13)
    x = b.input("x", [4, 33])
    ins = [x, b.const("lo", np.array(-0.5, np.float32)), b.const("hi", np.array(0.7, np.float32))] if op == "Clip" else [x]
    b.output(b.node(op, ins, "y", **attrs))
    check(b.model())


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("other", [(1, 16, 5, 5), (16, 1, 1), (5,), (1,), (2, 1, 5, 1)])
def test_binary_broadcasts(op, other):
    b = ModelBuilder()
    x = b.input("x", [2, 16, 5, 5])
    if op == "Div":
        y = b.weight("w", list(other), positive=True)
    else:
        y = b.input("z", list(other))
    b.output(b.node(op, [x, y], "y"))
    check(b.model())


def test_pow_where_softmax_logsoftmax():
    b = ModelBuilder(opset=13)
    x = b.input("x", [3, 4, 17])
    p = b.node("Pow", [x, b.const("two", np.array(2.0, np.float32))], "p")
    mask = b.const("mask", (np.tril(np.ones((4, 17))) > 0))
    w = b.node("Where", [mask, p, b.const("ninf", np.array(-1e9, np.float32))], "w")
    s = b.node("Softmax", [w], "s", axis=-1)
    b.output(s)
    b.output(b.node("LogSoftmax", [x], "ls", axis=-1))
    check(b.model())


def test_layernorm_reductions():
    b = ModelBuilder(opset=17)
    x = b.input("x", [2, 6, 40])
    ln = b.node("LayerNormalization", [x, b.weight("g", [40], positive=True), b.weight("be", [40], 0.1)], "ln",
                axis=-1, epsilon=1e-5)
    b.output(ln)
    b.output(b.node("ReduceMean", [x], "rm", axes=[2], keepdims=1) if False else
             b.node("ReduceSum", [x, b.const("ax", np.array([2], np.int64))], "rs", keepdims=1))
    check(b.model())


def test_reduce_max_mean_opset13():
    b = ModelBuilder(opset=13)
    x = b.input("x", [2, 6, 5, 4])
    b.output(b.node("ReduceMax", [x], "mx", axes=[2, 3], keepdims=1))
    b.output(b.node("ReduceMean", [x], "mn", axes=[3], keepdims=0))
    check(b.model())


def test_data_movement():
    b = ModelBuilder(opset=13)
    x = b.input("x", [2, 6, 4, 5])
    t = b.node("Transpose", [x], "t", perm=[0, 2, 3, 1])
    c = b.node("Concat", [t, t], "c", axis=3)
    s1, s2 = b.node("Split", [c, b.const("sp", np.array([5, 7], np.int64))], ["s1", "s2"], axis=3), "s2"
    sl = b.node("Slice", [s2, b.const("st", np.array([1, 0], np.int64)), b.const("en", np.array([4, 7], np.int64)),
                          b.const("axs", np.array([1, 3], np.int64)), b.const("sps", np.array([2, 3], np.int64))], "sl")
    g = b.node("Gather", [sl, b.const("ix", np.array([2, 0, 1], np.int64))], "g", axis=3)
    pad = b.node("Pad", [x, b.const("pads", np.array([0, 0, 1, 2, 0, 1, 0, 1], np.int64)),
                         b.const("pv", np.array(0.5, np.float32))], "pad")
    f = b.node("Flatten", [pad], "f", axis=1)
    b.output(s1)
    b.output(g)
    b.output(f)
    check(b.model())


def test_channel_shuffle_and_concat_of_convs():
    b = ModelBuilder(opset=13)
    x = b.input("x", [1, 12, 6, 6])
    c1 = b.node("Conv", [x, b.weight("w1", [6, 12, 1, 1])], "c1")
    c2 = b.node("Conv", [x, b.weight("w2", [6, 12, 3, 3])], "c2", pads=[1, 1, 1, 1])
    cat = b.node("Concat", [c1, c2], "cat", axis=1)
    r = b.node("Reshape", [cat, b.const("s1", np.array([1, 3, 4, 6, 6], np.int64))], "r")
    t = b.node("Transpose", [r], "t", perm=[0, 2, 1, 3, 4])
    b.output(b.node("Reshape", [t, b.const("s2", np.array([1, 12, 6, 6], np.int64))], "y"))
    check(b.model())


def dense_block_model():
    """DenseNet-style: each layer reads the running Concat and is concatenated onto it (nested
    Concats, members read by other ops too), plus a Concat whose input is also a graph output
    (that one must be copied)."""
    b = ModelBuilder(opset=13)
    x = b.input("x", [1, 8, 6, 6])
    stem = b.node("Conv", [x, b.weight("w0", [8, 8, 3, 3])], "stem", pads=[1, 1, 1, 1])
    run = stem
    for i in range(3):
        r = b.node("Relu", [run], f"r{i}")
        c = b.node("Conv", [r, b.weight(f"w{i + 1}", [4, 8 + 4 * i, 3, 3])], f"c{i}", pads=[1, 1, 1, 1])
        run = b.node("Concat", [run, c], f"cat{i}", axis=1)
    side = b.node("Conv", [x, b.weight("ws", [4, 8, 1, 1])], "side")
    b.output(side)
    b.output(b.node("Concat", [run, side], "y", axis=1))
    return b.model()


@pytest.mark.parametrize("matmul", ["tiu", "tile"])
def test_concat_inputs_are_written_in_place(matmul):
    from tpuflow.pipeline import compile_model
    model = dense_block_model()
    # the DDR plan's in-place Concat (layer groups off: every activation in DDR)
    _, program = compile_model(model, None, CompileOptions(matmul=matmul, layer_group="off"))
    copies = [layer for layer in program.gdma_layers if layer.startswith("concat")]
    # only the graph output `side` is copied into the last Concat (node concat_11); every other
    # Concat input was produced in place
    assert copies == ["concat_11"]
    check(model, matmul)


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_matrix_vector_product_on_the_vector_unit(dtype):
    """M = 1 with constant weights runs as a GEMV (weights across lanes, row reductions), over
    several K steps and N tiles, with the bias and activation fused after it."""
    b = ModelBuilder()
    g = b.node("Gemm", [b.input("x", [1, 3000]), b.weight("w", [300, 3000]), b.weight("c", [300], 0.1)], "g", transB=1)
    b.output(b.node("Relu", [g], "r"))
    model = b.model()
    from tpuflow.pipeline import compile_model
    _, program = compile_model(model)
    assert any(i.op_name == "tsbc.cw_ts" for i in program.tiu) and not any(i.op_name.startswith("mm2") for i in program.tiu)
    check(model, "tiu", dtype)
