"""Importers of ops lowered by their own TIU/GDMA kernels: comparisons, logic, Where on a live
condition, rounding, Sign, Mod, Sin/Cos, ThresholdedRelu, Resize / Upsample, Pad reflect / edge,
Gather / GatherND / GatherElements on runtime indices."""

from __future__ import annotations

import math

import numpy as np
from onnx import helper, numpy_helper

from tpuflow.errors import ModelError
from tpuflow.frontend.onnx_view import ONode, one_line
from tpuflow.frontend.ops import SPECS, OpKind
from tpuflow.frontend.registry import IMPORTERS, Importer, importer
from tpuflow.frontend.rewrite import Rewriter
from tpuflow.frontend.imp_shape import pads_per_axis

K = OpKind
SAME = {k.value: k for k, s in SPECS.items() if s.import_same and s.kernel}   # 1:1, no attributes


@importer(*SAME)
def same_name(node: ONode, ctx) -> None:
    ctx.emit(SAME[node.op_type], node.inputs, node.outputs)


@importer("Mod")
def mod(node: ONode, ctx) -> None:
    """fmod = 0 (integers: the result takes the divisor's sign) or 1 (C fmod: the dividend's)."""
    ctx.emit(K.MOD, node.inputs, node.outputs, fmod=int(node.attr("fmod", 0)))


@importer("ThresholdedRelu")
def thresholded_relu(node: ONode, ctx) -> None:
    ctx.emit(K.THRESHOLDED_RELU, node.inputs, node.outputs, alpha=float(node.attr("alpha", 1.0)))


def where(node: ONode, ctx) -> None:
    """Where(condition, x, y): the condition may be a runtime tensor (a compare-select on TIU)."""
    ctx.emit(K.WHERE, node.inputs, node.outputs)


# Where's condition no longer has to be constant: this importer replaces the constant-condition one.
IMPORTERS["Where"] = Importer(where)


# ---------------------------------------------------------------- Resize / Upsample

def _resize_matrix(node: ONode, ctx, axis: int, ramp: bool = False) -> np.ndarray:
    """The (out, in) interpolation matrix of one axis: the node itself (same op, attributes and
    opset, run by onnxruntime, the numerical reference) applied to an identity probe whose other
    resized axes are left alone. Resize is separable, so these matrices are all there is to it.
    ramp: the probe is 0, 1, ..., n_in - 1 instead, and the result (n_out,) is what each output
    takes: for nearest modes, the selected input index."""
    in_shape, out_shape = ctx.shape(node.input(0)), ctx.shape(node.outputs[0])
    rank, n_in, n_out = len(in_shape), in_shape[axis], out_shape[axis]
    basis = next(a for a in range(rank) if a != axis)
    probe_shape = [1] * rank
    probe_shape[axis] = n_in
    if ramp:
        probe = np.arange(n_in, dtype=np.float32).reshape(probe_shape)
    else:
        probe_shape[basis] = n_in
        probe = np.eye(n_in, dtype=np.float32).reshape(probe_shape)      # symmetric: axis order is moot
    attrs = dict(node.attrs)
    inputs, inits = ["p"], []

    def const(name: str, value) -> None:
        inputs.append(name)
        inits.append(numpy_helper.from_array(np.asarray(value), name))

    scales, sizes = _resize_targets(node, ctx)
    probe_scales = [1.0] * rank
    probe_scales[axis] = scales[axis]
    probe_sizes = list(probe_shape)
    probe_sizes[axis] = n_out
    if node.op_type == "Upsample":
        if ctx.opset < 9:
            attrs["scales"] = probe_scales
        else:
            const("s", np.asarray(probe_scales, np.float32))
    elif ctx.opset < 11:
        const("s", np.asarray(probe_scales, np.float32))
    else:
        attrs.pop("axes", None)
        roi = np.asarray([0.0] * rank + [1.0] * rank, np.float32)
        given_roi = ctx.const(node.input(1))
        if given_roi is not None and given_roi.size == 2 * rank:
            roi[axis], roi[rank + axis] = given_roi.reshape(-1)[axis], given_roi.reshape(-1)[rank + axis]
        const("roi", roi)
        if sizes is None:
            const("s", np.asarray(probe_scales, np.float32))
        else:
            inputs.append("")
            const("z", np.asarray(probe_sizes, np.int64))
    proto = helper.make_node(node.op_type, inputs, ["o"], **attrs)
    graph = helper.make_graph([proto], "probe", [helper.make_tensor_value_info("p", 1, probe_shape)],
                              [helper.make_tensor_value_info("o", 1, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ctx.opset)])
    try:
        out = _run_probe(model, probe)
    except Exception as exc:  # noqa: BLE001 - onnxruntime's own objection to the attributes
        raise ModelError(f"{ctx.view.label}: node '{node.name}' ({node.op_type}): onnxruntime cannot run its "
                         f"attributes: {one_line(exc, 200)}") from None
    if ramp:
        return out.reshape(n_out).astype(np.float64)
    return np.moveaxis(out, (basis, axis), (1, 0)).reshape(n_out, n_in).astype(np.float64)


def _run_probe(model, probe: np.ndarray) -> np.ndarray:
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return np.asarray(sess.run(None, {"p": probe})[0])


def _resize_targets(node: ONode, ctx) -> tuple[list[float], list[int] | None]:
    """Per-axis scales (and the sizes when the node gives sizes instead)."""
    x = node.input(0)
    rank = ctx.rank(x)
    in_shape, out_shape = ctx.shape(x), ctx.shape(node.outputs[0])
    if node.op_type == "Upsample" and ctx.opset < 9:
        return [float(s) for s in node.attr("scales")], None
    if node.op_type == "Upsample" or ctx.opset < 11:
        return [float(s) for s in ctx.const(node.input(1)).reshape(-1)], None
    axes = [int(a) % rank for a in node.attr("axes", list(range(rank)))]
    scales_in, sizes_in = ctx.const(node.input(2)), ctx.const(node.input(3))
    if sizes_in is not None and sizes_in.size:
        sizes = list(in_shape)
        for a, s in zip(axes, sizes_in.reshape(-1)):
            sizes[a] = int(s)
        return [o / i for o, i in zip(out_shape, in_shape)], sizes
    scales = [1.0] * rank
    for a, s in zip(axes, scales_in.reshape(-1)):
        scales[a] = float(s)
    return scales, None


def _resize_check(node: ONode, facts) -> str | None:
    if node.attr("mode", "nearest") == "cubic":
        return "mode=cubic"
    if node.attr("keep_aspect_ratio_policy", "stretch") != "stretch":
        return f"keep_aspect_ratio_policy={node.attr('keep_aspect_ratio_policy')}"
    if node.attr("antialias", 0):
        return "antialias=1"
    if node.attr("coordinate_transformation_mode") == "tf_crop_and_resize" and node.attr("extrapolation_value", 0.0):
        return "extrapolation_value != 0"
    return None


MAX_RESIZE_MATRIX = 1 << 22       # elements of a dense per-axis interpolation matrix (and its probe)


def _nearest_pattern(src: np.ndarray, n_in: int) -> tuple[str, int, int] | None:
    """('repeat', factor, 0) when output o selects input o // factor, ('step', step, start) when it
    selects start + o * step (an integer downsample), else None."""
    n_out = len(src)
    o = np.arange(n_out)
    if n_out % n_in == 0 and np.array_equal(src, o // (n_out // n_in)):
        return "repeat", n_out // n_in, 0
    if n_out > 1 and np.all(np.diff(src) == src[1] - src[0]) and src[1] > src[0]:
        return "step", int(src[1] - src[0]), int(src[0])
    if n_out == 1:
        return "step", 1, int(src[0])
    return None


@importer("Resize", "Upsample", const_inputs=((1, "roi or scales"), (2, "scales"), (3, "sizes")),
          check=_resize_check)
def resize(node: ONode, ctx) -> None:
    """Separable resampling. Integer nearest upsampling of the last two axes -> a Resize kernel
    (repeats); integer nearest downsampling -> a strided Slice; anything else (linear, every
    coordinate transformation and nearest mode) -> one MatMul per resized axis with its constant
    interpolation matrix."""
    x, y = node.input(0), node.outputs[0]
    in_shape, out_shape = ctx.shape(x), ctx.shape(y)
    rank = len(in_shape)
    if rank < 2:
        ctx.unsupported(f"{rank}-D input")
        return
    scales, _ = _resize_targets(node, ctx)
    crop = node.attr("coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize"
    axes = [a for a in range(rank) if crop or in_shape[a] != out_shape[a] or scales[a] != 1.0]
    nearest = node.attr("mode", "nearest") == "nearest" and not crop     # crop may extrapolate a value
    if nearest:                    # a selection per axis: one ramp probe each, no dense matrix yet
        picks = {a: np.rint(_resize_matrix(node, ctx, a, ramp=True)).astype(np.int64) for a in axes}
        picks = {a: p for a, p in picks.items() if len(p) != in_shape[a] or not np.array_equal(p, np.arange(len(p)))}
        if not picks:
            ctx.alias(x, y)
            return
        patterns = {a: _nearest_pattern(p, in_shape[a]) for a, p in picks.items()}
    else:
        patterns = {a: None for a in axes}
    if nearest and all(p is not None and p[0] == "repeat" for p in patterns.values()) and min(patterns) >= rank - 2:
        repeats = tuple(patterns[a][1] if a in patterns else 1 for a in range(rank))
        ctx.emit(K.RESIZE, (x,), (y,), repeats=repeats)
        return
    if nearest and all(p is not None and p[0] == "step" for p in patterns.values()):
        starts = [patterns[a][2] if a in patterns else 0 for a in range(rank)]
        steps = [patterns[a][1] if a in patterns else 1 for a in range(rank)]
        ends = [min(d, s + (o - 1) * k + 1) for d, s, o, k in zip(in_shape, starts, out_shape, steps)]
        ctx.emit(K.SLICE, (x,), (y,), starts=tuple(starts), ends=tuple(ends), steps=tuple(steps))
        return
    too_big = [a for a in patterns if in_shape[a] * max(in_shape[a], out_shape[a]) > MAX_RESIZE_MATRIX]
    if too_big:
        a = too_big[0]
        ctx.unsupported(f"{node.attr('mode', 'nearest')} resize of an axis of {in_shape[a]} -> {out_shape[a]}")
        return
    if nearest:
        mats = {a: np.eye(in_shape[a])[picks[a]] for a in picks}
    else:
        mats = {a: _resize_matrix(node, ctx, a) for a in axes}
        mats = {a: m for a, m in mats.items() if m.shape[0] != m.shape[1] or not np.array_equal(m, np.eye(m.shape[0]))}
        if not mats:
            ctx.alias(x, y)
            return
    current, shape = x, list(in_shape)
    order = sorted(mats, reverse=True)                  # the innermost axis first (no transposes)
    taps = {a: _two_taps(mats[a]) for a in order}
    for i, axis in enumerate(order):
        last = i == len(order) - 1
        if axis >= rank - 2 and taps[axis] is not None:     # the LMEM interpolation kernel
            shape = shape[:axis] + [len(taps[axis])] + shape[axis + 1:]
            out = y if last else ctx.temp(f"resample{i}", tuple(shape), ctx.dtype(x))
            ctx.emit(K.RESAMPLE, (current,), (out,), suffix=f"resample{i}", axis=axis, taps=taps[axis])
            current = out
            continue
        current, shape = _resample_axis(ctx, current, shape, axis, mats[axis], y if last else None, i)


def _two_taps(matrix: np.ndarray):
    """Per output row (i0, w0, i1, w1) when no row has more than two nonzero weights, else None."""
    rows = []
    for row in matrix:
        nz = np.flatnonzero(row)
        if len(nz) > 2:
            return None
        if len(nz) == 0:
            rows.append((0, 0.0, 0, 0.0))
        elif len(nz) == 1:
            rows.append((int(nz[0]), float(row[nz[0]]), int(nz[0]), 0.0))
        else:
            rows.append((int(nz[0]), float(row[nz[0]]), int(nz[1]), float(row[nz[1]])))
    return tuple(rows)


def _resample_axis(ctx, x: str, shape: list[int], axis: int, matrix: np.ndarray, out: str | None, step: int):
    """x resampled along `axis` by `matrix` (out, in): MatMul with matrix^T, moving the axis last
    and back when it is not the last one."""
    rank = len(shape)
    dtype = ctx.dtype(x)
    weights = ctx.add_const(f"resize_w{axis}", matrix.T.astype(np.dtype(dtype) if np.dtype(dtype).kind == "f" else np.float32))
    new_shape = list(shape)
    new_shape[axis] = matrix.shape[0]
    if axis == rank - 1:
        y = out or ctx.temp(f"resize{step}", tuple(new_shape), dtype)
        ctx.emit(K.MATMUL, (x, weights), (y,), suffix=f"resize{step}")
        return y, new_shape
    perm = list(range(rank))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    moved = ctx.temp(f"resize{step}_t", tuple(shape[p] for p in perm), dtype)
    ctx.emit(K.TRANSPOSE, (x,), (moved,), suffix=f"resize{step}_t", perm=tuple(perm))
    mixed_shape = [shape[p] for p in perm]
    mixed_shape[-1] = matrix.shape[0]
    mixed = ctx.temp(f"resize{step}_m", tuple(mixed_shape), dtype)
    ctx.emit(K.MATMUL, (moved, weights), (mixed,), suffix=f"resize{step}_m")
    y = out or ctx.temp(f"resize{step}", tuple(new_shape), dtype)
    ctx.emit(K.TRANSPOSE, (mixed,), (y,), suffix=f"resize{step}", perm=tuple(perm))
    return y, new_shape


# ---------------------------------------------------------------- Pad reflect / edge

_PAD_CONSTANT = IMPORTERS["Pad"]
PAD_MODES = ("reflect", "edge")


def _pad_check(node: ONode, facts) -> str | None:
    if node.attr("mode", "constant") in PAD_MODES:
        return None
    return _PAD_CONSTANT.check(node, facts) if _PAD_CONSTANT.check else None


def pad(node: ONode, ctx) -> None:
    """Constant mode as before; reflect / edge keep pads (begin of every axis, then end) and mode."""
    mode = node.attr("mode", "constant")
    if mode not in PAD_MODES:
        _PAD_CONSTANT.run(node, ctx)
        return
    x = node.input(0)
    shape = ctx.shape(x)
    rank = len(shape)
    if ctx.opset < 11:
        given, axes = list(node.attr("pads")), list(range(rank))
    else:
        given = ctx.const(node.input(1)).reshape(-1).tolist()
        a = ctx.const(node.input(3))
        axes = [int(i) % rank for i in a.reshape(-1)] if a is not None else list(range(rank))
    pads = pads_per_axis(given, axes, rank)
    if min(pads) < 0:
        ctx.unsupported("negative pads")
        return
    if mode == "reflect" and any(max(pads[a], pads[rank + a]) >= shape[a] for a in range(rank) if pads[a] or pads[rank + a]):
        ctx.unsupported("reflect pads not smaller than the axis")
        return
    ctx.emit(K.PAD, (x,), node.outputs, pads=tuple(pads), value=0.0, mode=mode)


IMPORTERS["Pad"] = Importer(pad, _PAD_CONSTANT.const_inputs, _pad_check)


# ---------------------------------------------------------------- Gather family on runtime indices

_GATHER_CONST = IMPORTERS["Gather"]


def gather(node: ONode, ctx) -> None:
    """Constant indices as before; runtime indices -> Gather with a runtime index input (the
    lowering's gdma.gather; negative indices count from the end there)."""
    if ctx.const(node.input(1)) is not None:
        _GATHER_CONST.run(node, ctx)
        return
    data = node.input(0)
    ctx.emit(K.GATHER, (data, node.input(1)), node.outputs, axis=int(node.attr("axis", 0)) % ctx.rank(data))


IMPORTERS["Gather"] = Importer(gather, (), _GATHER_CONST.check)


def _rows_view(rw: Rewriter, data: str, k: int) -> str:
    """data (d0, ..., dk-1, rest...) viewed as (d0*...*dk-1, rest...)."""
    dims = rw.shape(data)
    return rw.reshape(data, (math.prod(dims[:k]),) + tuple(dims[k:]))


def _non_negative(rw: Rewriter, idx: str, dim: int) -> str:
    """idx + dim where idx < 0 (runtime)."""
    negative = rw.op(K.LESS, (idx, rw.scalar(0.0)), rw.shape(idx))
    return rw.op(K.WHERE, (negative, rw.add(idx, float(dim)), idx), rw.shape(idx))


def _gather_rows(rw: Rewriter, ctx, table: str, linear, out: str) -> None:
    """Gather along axis 0 of `table` by `linear` (a numpy array: constant, or a tensor name)."""
    if isinstance(linear, np.ndarray):
        linear = ctx.add_const("linear_index", linear.astype(np.int64))
    shape = rw.shape(linear) + rw.shape(table)[1:]
    rw.op(K.GATHER, (table, linear), shape, out, axis=0)


@importer("GatherND")
def gather_nd(node: ONode, ctx) -> None:
    """GatherND (batch_dims 0) = Gather along axis 0 of data viewed as (d0*...*dk-1, rest) by the
    linear index sum_j idx[..., j] * stride_j."""
    if int(node.attr("batch_dims", 0)):
        ctx.unsupported("batch_dims > 0")
        return
    data, idx, y = node.input(0), node.input(1), node.outputs[0]
    dims, k = ctx.shape(data), ctx.shape(idx)[-1]
    strides = [math.prod(dims[j + 1:k]) for j in range(k)]
    rw = Rewriter(ctx, dtype="float32")
    table = _rows_view(rw, data, k) if k > 1 else data
    value = ctx.const(idx)
    if value is not None:
        comps = np.where(value < 0, value + np.asarray(dims[:k]), value)
        _gather_rows(rw, ctx, table, (comps * strides).sum(axis=-1), y)
        return
    lead = ctx.shape(idx)[:-1]
    if k == 1:                   # the (..., 1) index tensor as it is (no view of a graph input)
        picked = rw.op(K.GATHER, (data, idx), ctx.shape(idx) + tuple(dims[1:]), axis=0)
        rw.reshape(picked, ctx.shape(y), out=y)
        return
    linear = None
    for j in range(k):
        comp = rw.reshape(rw.slice(idx, len(lead), j, j + 1), lead)
        comp = _non_negative(rw, comp, dims[j])
        term = rw.mul(comp, float(strides[j])) if strides[j] != 1 else comp
        linear = term if linear is None else rw.add(linear, term)
    _gather_rows(rw, ctx, table, linear, y)


@importer("GatherElements")
def gather_elements(node: ONode, ctx) -> None:
    """out[p] = data[p with p[axis] = idx[p]]: a Gather of single elements of the flattened data by
    the linear index idx * stride_axis + base(p) (base: the other coordinates' offset, constant)."""
    data, idx, y = node.input(0), node.input(1), node.outputs[0]
    dims, ishape = ctx.shape(data), ctx.shape(idx)
    rank = len(dims)
    axis = int(node.attr("axis", 0)) % rank
    strides = [math.prod(dims[j + 1:]) for j in range(rank)]
    grid = np.indices(ishape)
    base = sum(grid[j] * strides[j] for j in range(rank) if j != axis)
    rw = Rewriter(ctx, dtype="float32")
    table = rw.reshape(data, (math.prod(dims), 1))
    value = ctx.const(idx)
    if value is not None:
        linear = np.where(value < 0, value + dims[axis], value) * strides[axis] + base
        flat = rw.op(K.GATHER, (table, ctx.add_const("linear_index", linear.astype(np.int64))), ishape + (1,), axis=0)
    else:
        linear = rw.add(rw.mul(_non_negative(rw, idx, dims[axis]), float(strides[axis])),
                        rw.const(base.astype(np.float32)))
        flat = rw.op(K.GATHER, (table, linear), ishape + (1,), axis=0)
    rw.reshape(flat, ishape, out=y)


# ---------------------------------------------------------------- ArgMax / ArgMin / Hardmax / TopK

NEG_BIG = -3.0e38           # below every finite value of the activation dtypes (-inf in fp16/bf16)


def _last_axis_view(rw: Rewriter, x: str, axis: int) -> tuple[str, list[int] | None]:
    """x with `axis` moved last (None when it already is) and the permutation used."""
    rank = len(rw.shape(x))
    if axis == rank - 1:
        return x, None
    perm = list(range(rank))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    return rw.transpose(x, perm), perm


def _iota(rw: Rewriter, n: int, scale: float = 1.0) -> str:
    """The constant [0, scale, 2*scale, ...) of length n, made once per importer call (each distinct
    constant operand of a row group takes its own LMEM row)."""
    cache = rw.__dict__.setdefault("_iotas", {})
    if (n, scale) not in cache:
        cache[(n, scale)] = rw.const(np.arange(n, dtype=np.float32) * scale)
    return cache[(n, scale)]


def _first_max_index(rw: Rewriter, x: str, last: bool = False) -> tuple[str, str]:
    """(max, index of its first (or last) occurrence) along the last axis of x, keepdims."""
    dims = rw.shape(x)
    m = rw.op(K.REDUCE_MAX, (x,), dims[:-1] + (1,), axes=(len(dims) - 1,), keepdims=True)
    hit = rw.op(K.EQUAL, (x, m), dims)
    if last:                                   # largest index among the hits
        picked = rw.op(K.WHERE, (hit, _iota(rw, dims[-1]), rw.scalar(-1.0)), dims)
        return m, rw.op(K.REDUCE_MAX, (picked,), dims[:-1] + (1,), axes=(len(dims) - 1,), keepdims=True)
    picked = rw.op(K.WHERE, (hit, _iota(rw, dims[-1], -1.0), rw.scalar(NEG_BIG)), dims)
    neg = rw.op(K.REDUCE_MAX, (picked,), dims[:-1] + (1,), axes=(len(dims) - 1,), keepdims=True)
    return m, rw.neg(neg)


def _restore(rw: Rewriter, x: str, perm: list[int] | None, shape, out: str | None) -> str:
    """Undo _last_axis_view and view as `shape` (into `out`)."""
    if perm is not None:
        moved = tuple(rw.shape(x)[p] for p in perm)
        if moved == tuple(shape):
            return rw.transpose(x, perm, out=out)
        x = rw.transpose(x, perm)
    return rw.reshape(x, tuple(shape), out=out)


@importer("ArgMax", "ArgMin")
def arg_extreme(node: ONode, ctx) -> None:
    """max (of x, or of -x for ArgMin) along the axis, the hits, and the smallest (largest with
    select_last_index) hit position by a max-reduction over -position (position)."""
    x, y = node.input(0), node.outputs[0]
    dims = ctx.shape(x)
    axis = int(node.attr("axis", 0)) % len(dims)
    rw = Rewriter(ctx, dtype="float32")
    work, perm = _last_axis_view(rw, x, axis)
    if node.op_type == "ArgMin":
        work = rw.neg(work)
    _, index = _first_max_index(rw, work, bool(node.attr("select_last_index", 0)))
    _restore(rw, index, perm, ctx.shape(y), y)


@importer("Hardmax")
def hardmax(node: ONode, ctx) -> None:
    """1 at the first maximum along the axis (opset < 13: of the input flattened to 2-D at axis)."""
    x, y = node.input(0), node.outputs[0]
    dims = ctx.shape(x)
    rw = Rewriter(ctx, dtype="float32")
    if ctx.opset < 13:
        axis = int(node.attr("axis", 1)) % len(dims)
        work, perm = rw.reshape(x, (math.prod(dims[:axis]), math.prod(dims[axis:]))), None
    else:
        work, perm = _last_axis_view(rw, x, int(node.attr("axis", -1)) % len(dims))
    _, index = _first_max_index(rw, work)
    iota = _iota(rw, rw.shape(work)[-1])
    onehot = rw.op(K.EQUAL, (iota, index), rw.shape(work))
    _restore(rw, onehot, perm, dims, y)


def _topk_k(node: ONode, ctx) -> int:
    if ctx.opset < 10:
        return int(node.attr("k"))
    return int(ctx.const(node.input(1)).reshape(-1)[0])


MAX_TOPK = 64


@importer("TopK", const_inputs=((1, "K"),))
def topk(node: ONode, ctx) -> None:
    """k rounds of (max, first position of the max, mask that position out) along the axis; the
    values and indices are the rounds' results concatenated (sorted, ties to the lower index)."""
    x = node.input(0)
    values_out, indices_out = node.outputs[0], node.outputs[1] if len(node.outputs) > 1 else ""
    dims = ctx.shape(x)
    axis = int(node.attr("axis", -1)) % len(dims)
    k = _topk_k(node, ctx)
    if k > MAX_TOPK:
        ctx.unsupported(f"k={k} > {MAX_TOPK}")
        return
    largest = bool(node.attr("largest", 1))
    rw = Rewriter(ctx, dtype="float32")
    work, perm = _last_axis_view(rw, x, axis)
    if not largest:
        work = rw.neg(work)
    shape = rw.shape(work)
    iota = _iota(rw, shape[-1])
    values, indices = [], []
    for i in range(k):
        m, index = _first_max_index(rw, work)
        values.append(m)
        indices.append(index)
        if i < k - 1:
            taken = rw.op(K.EQUAL, (iota, index), shape)
            work = rw.op(K.WHERE, (taken, rw.scalar(NEG_BIG), work), shape)
    out_shape = list(dims)
    out_shape[axis] = k
    vals = rw.concat(values, len(shape) - 1)
    if not largest:
        vals = rw.neg(vals)
    _restore(rw, vals, perm, out_shape, values_out)
    if indices_out:
        _restore(rw, rw.concat(indices, len(shape) - 1), perm, out_shape, indices_out)


# ---------------------------------------------------------------- ScatterND (constant indices)

def _scatter_check(node: ONode, facts) -> str | None:
    reduction = node.attr("reduction", "none")
    return f"reduction={reduction}" if reduction != "none" else None


@importer("ScatterND", const_inputs=((1, "indices"),), check=_scatter_check)
def scatter_nd(node: ONode, ctx) -> None:
    """Rows of data (viewed as (d0*...*dk-1, rest)) overwritten by the updates, in index order."""
    data, updates = node.input(0), node.input(2)
    idx = ctx.const(node.input(1)).astype(np.int64)
    dims = ctx.shape(data)
    k = idx.shape[-1]
    comps = np.where(idx < 0, idx + np.asarray(dims[:k]), idx).reshape(-1, k)
    strides = [math.prod(dims[j + 1:k]) for j in range(k)]
    rows = tuple(int(r) for r in (comps * strides).sum(axis=1))
    ctx.emit(K.SCATTER_ND, (data, updates), node.outputs, rows=rows)

