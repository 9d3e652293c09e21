"""Properties of the quantization-parameter extraction (frontend/quant.onnx_quant) and of the
QuantizeLinear / DequantizeLinear rules it feeds (hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tpuflow.frontend.quant import Quant, QuantParamError, dequantize, onnx_quant, quantize, storage_range

STORAGE = st.sampled_from(["int8", "uint8"])
SCALES = st.floats(2.0 ** -10, 8.0, allow_nan=False, width=32)


@st.composite
def parameters(draw):
    """(shape, axis attribute, scale, zero point, storage, per_channel)."""
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=4)))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    storage = draw(STORAGE)
    low, high = storage_range(storage)
    per_channel = draw(st.booleans()) and shape[axis] > 1
    count = shape[axis] if per_channel else 1
    scale = np.asarray(draw(st.lists(SCALES, min_size=count, max_size=count)), np.float32)
    zp = np.asarray(draw(st.lists(st.integers(low, high), min_size=count, max_size=count)), storage)
    if not per_channel and draw(st.booleans()):
        scale, zp = scale.reshape(()), zp.reshape(() if draw(st.booleans()) else (1,))
    return shape, axis, scale, zp, storage, per_channel


@settings(max_examples=150, deadline=None)
@given(parameters())
def test_per_tensor_and_per_channel_are_told_apart_and_kept_exactly(p):
    shape, axis, scale, zp, storage, per_channel = p
    q = onnx_quant(scale, zp, storage, shape, axis)
    assert q.per_channel == per_channel and q.storage == storage
    assert q.axis == (axis % len(shape) if per_channel else None)
    assert q.scale.shape == ((shape[axis],) if per_channel else ()) and q.zero_point.shape == q.scale.shape
    assert np.array_equal(q.scale.reshape(-1), scale.reshape(-1)) and q.scale.dtype == np.float32
    assert np.array_equal(q.zero_point.reshape(-1), zp.reshape(-1)) and q.zero_point.dtype == np.dtype(storage)
    again = onnx_quant(scale.copy(), zp.copy(), storage, shape, axis)
    assert again == q and hash(again) == hash(q)
    assert q.channels == (shape[axis] if per_channel else 1)


@settings(max_examples=100, deadline=None)
@given(parameters(), st.integers(0, 2**32 - 1))
def test_dequantize_then_quantize_gives_the_integers_back(p, seed):
    shape, axis, scale, zp, storage, _ = p
    q = onnx_quant(scale, zp, storage, shape, axis)
    low, high = storage_range(storage)
    values = np.random.default_rng(seed).integers(low, high + 1, shape).astype(storage)
    assert np.array_equal(quantize(dequantize(values, q), q), values)


@settings(max_examples=100, deadline=None)
@given(parameters(), st.integers(0, 2**32 - 1))
def test_quantize_is_within_half_a_step_inside_the_range_and_saturates_outside(p, seed):
    shape, axis, scale, zp, storage, _ = p
    q = onnx_quant(scale, zp, storage, shape, axis)
    low, high = storage_range(storage)
    s = q.broadcast(q.scale.astype(np.float64), len(shape))
    z = q.broadcast(q.zero_point.astype(np.float64), len(shape))
    real = (np.random.default_rng(seed).uniform(low - 40, high + 40, shape) - z) * s
    stored = quantize(real, q)
    inside = (real / s + z >= low) & (real / s + z <= high)
    error = np.abs(dequantize(stored, q) - real)
    bound = np.broadcast_to(s * 0.5, shape) + np.abs(real) * 1e-6 + 1e-7     # half a step, plus float32 rounding
    assert np.all(error[inside] <= bound[inside])
    assert np.all(stored[real / s + z < low] == low) and np.all(stored[real / s + z > high] == high)


@settings(max_examples=60, deadline=None)
@given(parameters(), st.integers(1, 3))
def test_a_zero_point_of_another_shape_is_refused(p, extra):
    shape, axis, scale, zp, storage, per_channel = p
    wrong = np.zeros(scale.size + extra, storage)
    with pytest.raises(QuantParamError, match="zero point shape"):
        onnx_quant(scale.reshape(-1), wrong, storage, shape, axis)


@pytest.mark.parametrize("scale,zp,storage,error", [
    (np.float32(0), np.int8(0), "int8", "finite and positive"),
    (np.float32(np.inf), np.int8(0), "int8", "finite and positive"),
    (np.int32(1), np.int8(0), "int8", "not a float type"),
    (np.float32(1), np.int32(3), "int32", "zero point 0"),
    (np.float32(1), np.int16(0), "int16", "storage 'int16'"),
    (np.float32(1), np.uint8(0), "int8", "zero point dtype uint8"),
])
def test_invalid_parameters_are_refused(scale, zp, storage, error):
    with pytest.raises(QuantParamError, match=error):
        onnx_quant(scale, zp, storage, (2, 3))


def test_quant_is_frozen_and_validated():
    q = Quant(np.float32(0.5), np.int8(1), None, "int8")
    with pytest.raises(ValueError):
        q.scale[...] = 2
    with pytest.raises(QuantParamError, match="per-channel"):
        Quant(np.asarray([0.5, 0.25], np.float32), np.asarray([0, 0], np.int8), None, "int8")
    assert q.with_axis(3) == q and q.describe() == "int8 per-tensor"
