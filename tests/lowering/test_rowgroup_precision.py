"""Precision of row groups at --dtype fp16 / bf16: LayerNormalization and Softmax compute their
statistics and internals in fp32 (only loads and stores are in the dtype), and the constants a
group reads once are held in fp32 when its results feed a QuantizeLinear (tpuflow issue 15)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tpuflow.hwmodel.functional import run
from tpuflow.hwmodel.timing import simulate
from tpuflow.isa import ArTiu, Engine, GeneralDma, Prec
from tpuflow.lowering import ewise
from tpuflow.lowering.ops import rowgroup
from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model, verify

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e"))
from onnx_build import ModelBuilder  # noqa: E402

ROWS, COLS = 64, 256
NUMPY = {"fp16": np.float16}


def _as_float(values: np.ndarray, dtype: str) -> np.ndarray:
    """A functional-model output (fp16 numpy, bf16 as uint16 bits) as float64."""
    if dtype == "bf16":
        return (np.asarray(values, np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return np.asarray(values, np.float64)


def _rounded(values: np.ndarray, dtype: str) -> np.ndarray:
    """float values rounded to nearest even in `dtype`, as float64."""
    x = np.asarray(values, np.float32)
    if dtype == "bf16":
        bits = x.view(np.uint32).astype(np.uint64)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
        return bits.astype(np.uint32).view(np.float32).astype(np.float64)
    return x.astype(NUMPY[dtype]).astype(np.float64)


def _ulp(values: np.ndarray, dtype: str) -> np.ndarray:
    """One unit in the last place of `dtype` at |values|, at least that of 1/16 (a result cancelling
    to near 0 carries the fp32 error of its terms, which are of order 1)."""
    mantissa = {"fp16": 10, "bf16": 7}[dtype]
    return 2.0 ** (np.floor(np.log2(np.maximum(np.abs(values), 1.0 / 16))) - mantissa)


def _layernorm(b: ModelBuilder, cols: int) -> str:
    return b.node("LayerNormalization", [b.input("x", (ROWS, cols)), b.weight("g", [cols], positive=True),
                                         b.weight("be", [cols], 0.3)], "ln", axis=-1, epsilon=1e-5)


def _float_norms(cols: int = COLS):
    """LayerNorm (scale / bias as fp32 weights) and Softmax over rows of `cols`, each on its own input."""
    b = ModelBuilder(seed=5, opset=17)
    b.output(_layernorm(b, cols))
    b.output(b.node("Softmax", [b.input("s", (ROWS, cols))], "sm", axis=-1))
    return b.model()


def _norm_inputs(cols: int = COLS) -> dict[str, np.ndarray]:
    """Rows with a mean far from 0 (40, deviation 8: fp16 statistics lose digits there) and logits
    spread over +-24."""
    rng = np.random.default_rng(3)
    return {"x": rng.normal(40.0, 8.0, (ROWS, cols)).astype(np.float32),
            "s": rng.normal(0.0, 8.0, (ROWS, cols)).astype(np.float32)}


def _reference(model, inputs: dict, dtype: str) -> dict[str, np.ndarray]:
    """float64 LayerNorm / Softmax of what the program reads: the inputs and the constants rounded to
    `dtype` (a float graph holds its weights in the dtype)."""
    weights = {i.name: np.frombuffer(i.raw_data, np.float32) if i.raw_data else np.asarray(i.float_data, np.float32)
               for i in model.graph.initializer}
    x, s = _rounded(inputs["x"], dtype), _rounded(inputs["s"], dtype)
    gamma, beta = _rounded(weights["g"], dtype), _rounded(weights["be"], dtype)
    centered = x - x.mean(-1, keepdims=True)
    ln = centered / np.sqrt((centered ** 2).mean(-1, keepdims=True) + 1e-5) * gamma + beta
    e = np.exp(s - s.max(-1, keepdims=True))
    return {"ln": ln, "sm": e / e.sum(-1, keepdims=True)}


def _worst_ulps(dtype: str, cols: int = COLS) -> dict[str, float]:
    """Each output's largest error against the exact value, in units of the dtype's last place."""
    model = _float_norms(cols)
    _, program = compile_model(model, "sg2260", CompileOptions(dtype=dtype))
    inputs = _norm_inputs(cols)
    ours = run(program, inputs)
    ref = _reference(model, inputs, dtype)
    return {name: float(np.max(np.abs(_as_float(ours[name], dtype) - ref[name]) / _ulp(ref[name], dtype)))
            for name in ("ln", "sm")}


# half a unit in the last place (the one rounding of the stored result) plus the fp32 arithmetic's
# error; measured 0.5002 (LayerNorm) / 0.4995 (Softmax) at fp16, 0.5004 / 0.4932 at bf16. With the
# row group's tiles in the dtype instead: 81.5 / 1.23 units at fp16, 77.1 / 1.46 at bf16.
HALF_UNIT_BOUND = 0.52


@pytest.mark.parametrize("cols", [COLS, 768])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_layernorm_and_softmax_round_only_their_result(dtype, cols):
    """Statistics, centered values and exponentials in fp32 (the mean's 1/768, which fp16 and bf16
    do not hold, applied in fp32): each output is its exact value rounded once to the dtype."""
    worst = _worst_ulps(dtype, cols)
    assert worst["ln"] <= HALF_UNIT_BOUND and worst["sm"] <= HALF_UNIT_BOUND, worst


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_the_bound_fails_when_the_statistics_are_in_the_dtype(monkeypatch, dtype):
    """The same check on row groups whose value, scratch and row tiles are in the dtype (statistics,
    centered values and exponentials rounded to it) fails for both ops: the bound can tell."""
    real, narrow = rowgroup.make_tile, Prec.FP16 if dtype == "fp16" else Prec.BF16

    def in_dtype(chip, addr, shape, prec, *a, **k):
        return real(chip, addr, shape, narrow if prec == Prec.FP32 else prec, *a, **k)

    monkeypatch.setattr(rowgroup, "make_tile", in_dtype)
    worst = _worst_ulps(dtype)
    assert worst["ln"] > 10 * HALF_UNIT_BOUND and worst["sm"] > 2 * HALF_UNIT_BOUND, worst


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_the_bound_fails_with_the_mean_scale_rounded_to_the_dtype(monkeypatch, dtype):
    """Average pooling reads its scale in its input's precision: 1/768 rounded to fp16 / bf16 puts
    the LayerNorm's mean, and so its result, several units off."""
    monkeypatch.setattr(ewise, "_holds", lambda value, prec: True)
    worst = _worst_ulps(dtype, 768)
    assert worst["ln"] > 2 * HALF_UNIT_BOUND, worst


def test_a_mean_scale_the_dtype_does_not_hold_costs_one_row_multiply():
    """Exact timeline of a 64 x 768 LayerNorm at fp16: the unscaled sum and an fp32 multiply of the 64
    row sums add one TIU instruction and exactly 12 cycles to the latency and to the TIU's busy time
    (measured on the timing model: 1/768 rounded to fp16 moved the mean by 2.4e-4 of itself, 75 units
    of the result's last place on rows of mean 40); fp32 programs keep the single pooling."""
    b = ModelBuilder(seed=5, opset=17)
    b.output(_layernorm(b, 768))
    model = b.model()
    _, program = compile_model(model, "sg2260", CompileOptions(dtype="fp16"))
    means = [i for i in program.tiu if isinstance(i, ArTiu) and i.op == "mul" and i.res0_shape == (1, ROWS, 1, 1)]
    assert len(means) == 1 and means[0].opt_res0_prec == Prec.FP32
    split = simulate(program)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ewise, "_holds", lambda value, prec: True)
        _, rounded_program = compile_model(model, "sg2260", CompileOptions(dtype="fp16"))
        rounded = simulate(rounded_program)
        _, fp32_rounded = compile_model(model, "sg2260", CompileOptions(dtype="fp32"))
    _, fp32 = compile_model(model, "sg2260", CompileOptions(dtype="fp32"))
    assert len(program.tiu) == len(rounded_program.tiu) + 1
    assert (split.total_ps, split.busy_ps["tiu"]) == (6_789_000, 2_193_000)
    assert (rounded.total_ps, rounded.busy_ps["tiu"]) == (6_777_000, 2_181_000)
    assert len(fp32.tiu) == len(fp32_rounded.tiu)


def _quantized_layernorm(uint8: bool = True):
    """x -> QuantizeLinear -> DequantizeLinear -> LayerNorm (scale = DequantizeLinear of int8
    weights, fp32 bias: values fp16 does not hold) -> QuantizeLinear -> DequantizeLinear, as
    onnxruntime's quantize_static writes a transformer's ln_1."""
    b = ModelBuilder(seed=11, opset=17)
    zero = np.uint8(128) if uint8 else np.int8(0)
    x = b.input("x", (ROWS, COLS))
    xq = b.node("QuantizeLinear", [x, b.const("xs", np.float32(0.031)), b.const("xz", zero)], "xq")
    xd = b.node("DequantizeLinear", [xq, "xs", "xz"], "xd")
    w = np.random.default_rng(2).integers(90, 127, COLS).astype(np.int8)
    gamma = b.node("DequantizeLinear", [b.const("gq", w), b.const("gs", np.float32(0.00944391)),
                                        b.const("gz", np.int8(0))], "gamma")
    beta = b.const("beta", (np.random.default_rng(4).integers(-120, 120, COLS) * 0.00033419).astype(np.float32))
    ln = b.node("LayerNormalization", [xd, gamma, beta], "ln", axis=-1, epsilon=1e-5)
    yq = b.node("QuantizeLinear", [ln, b.const("ys", np.float32(0.0356029)), b.const("yz", zero)], "yq")
    b.output(b.node("DequantizeLinear", [yq, "ys", "yz"], "y"))
    return b.model()


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_a_quantized_layernorm_matches_onnxruntime_code_for_code(dtype):
    """The reference rounds the stored float tensors (the LayerNorm's input and output) to the dtype
    and keeps the weights in fp32; with the scale and bias held in fp32 the program's codes are
    onnxruntime's (0 steps, tighter than verify's 2)."""
    (row,) = verify(_quantized_layernorm(), "sg2260", CompileOptions(dtype=dtype))["outputs"]
    assert row["ok"] and row["steps"] == 0 and "stage_check" not in row, row


def test_a_quantized_layernorm_with_its_scale_in_fp16_is_codes_off(monkeypatch):
    """The same model with the scale and bias rounded to fp16 (before issue 15) is steps off: the
    test above can fail."""
    monkeypatch.setattr(rowgroup.RowGroupEmitter, "_resident_prec", lambda self, op: self.ctx.prec)
    (row,) = verify(_quantized_layernorm(), "sg2260", CompileOptions(dtype="fp16"))["outputs"]
    assert row["steps"] >= 1, row


def _resident_loads(model, dtype: str) -> list[int]:
    """src_data_format of the layers' broadcast loads (a per-column constant into every lane; not the
    prologue's function tables)."""
    _, program = compile_model(model, "sg2260", CompileOptions(dtype=dtype))
    return sorted({i.src_data_format for i, layer in zip(program.gdma, program.layer_names(Engine.GDMA))
                   if isinstance(i, GeneralDma) and i.op == "broadcast" and layer != "__prologue__"})


def test_constants_are_fp32_only_where_the_result_feeds_a_quantizer():
    """A float graph keeps its LayerNorm weights in the dtype (fp32 broadcast rows would cost
    gpt_block --dtype fp16 2.5%); a quantized one holds them in fp32."""
    assert _resident_loads(_quantized_layernorm(), "fp16") == [int(Prec.FP32)]
    b = ModelBuilder(seed=5, opset=17)
    b.output(b.node("LayerNormalization", [b.input("x", (ROWS, COLS)), b.weight("g", [COLS], positive=True),
                                           b.weight("be", [COLS], 0.3)], "ln", axis=-1, epsilon=1e-5))
    assert _resident_loads(b.model(), "fp16") == [int(Prec.FP16)]
