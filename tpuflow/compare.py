"""Numerical comparison of the chip's outputs with onnxruntime: seeded inputs, the reference run,
error metrics and the tolerances per dtype."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Pass bounds, per storage dtype. max_rel_err = max |ours - ref| / max |ref| over an output.
# fp32: the 1e-4. fp16 / bf16 store every tensor between fused groups in 11 / 8 mantissa
# bits and the error grows with depth: measured worst cases over every bundled model on both
# matmul paths (benchmarks/verify_all.py) are 8e-3 (fp16) and 4e-2 (bf16), so the bounds are
# 2e-2 and 8e-2 (about 40 and 20 half-ulps of the storage format), and the direction of the
# output must agree too (cosine similarity, the metric tpu-mlir's npz comparison uses for
# low-precision models; measured worst 0.99998 and 0.9993).
# Every dtype also passes an output whose max_abs_err is at most REFERENCE_ATOL: onnxruntime's own
# Sigmoid and Tanh (MLAS) are accurate to about 1e-7 absolute, not relative, in their tails
# (measured: Sigmoid(-16) = 5.96e-8 against the exact 1.125e-7, 47% off), so an output that is
# tiny everywhere (a saturated sigmoid map on random inputs) is only as exact as that reference;
# 2.4e-7 is two ulps of 1.0 in fp32.
REFERENCE_ATOL = 2.4e-7
TOLERANCES = {
    "fp32": {"rtol": 1e-4, "min_cosine": 0.999999},
    "fp16": {"rtol": 2e-2, "min_cosine": 0.9999},
    "bf16": {"rtol": 8e-2, "min_cosine": 0.999},
}


@dataclass(frozen=True)
class OutputError:
    name: str
    max_abs_err: float
    max_rel_err: float
    cosine: float
    ref_max_abs: float

    def ok(self, dtype: str) -> bool:
        tol = TOLERANCES[dtype]
        if self.max_abs_err <= REFERENCE_ATOL:
            return True
        return self.max_rel_err <= tol["rtol"] and self.cosine >= tol["min_cosine"]

    def as_dict(self) -> dict:
        return {"name": self.name, "max_abs_err": self.max_abs_err, "max_rel_err": self.max_rel_err,
                "cosine": self.cosine, "ref_max_abs": self.ref_max_abs}


def random_inputs(graph, seed: int) -> dict[str, np.ndarray]:
    """Seeded arrays for every runtime input in its own dtype: floats standard-normal (the same
    values as before for fp32 inputs), integers in a range valid for their consumers (indices),
    booleans fair coins (tpuflow.frontend.inputs)."""
    from tpuflow.frontend.inputs import random_inputs as typed_random_inputs
    return typed_random_inputs(graph, seed)


def reference_outputs(graph, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """onnxruntime on the original (un-canonicalised) model."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.log_severity_level = 3
    sess = ort.InferenceSession(graph.model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    values = sess.run(names, inputs)
    return dict(zip(names, values))


def as_float32(array: np.ndarray) -> np.ndarray:
    """Chip outputs as fp32 (bf16 arrives as uint16 bit patterns)."""
    a = np.asarray(array)
    if a.dtype == np.uint16:
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def compare(name: str, ours: np.ndarray, ref: np.ndarray) -> OutputError:
    o = as_float32(ours).astype(np.float64).reshape(-1)
    r = np.asarray(ref, np.float64).reshape(-1)
    abs_err = float(np.max(np.abs(o - r))) if r.size else 0.0
    scale = float(np.max(np.abs(r))) if r.size else 0.0
    rel = abs_err / scale if scale > 0 else abs_err
    denom = np.linalg.norm(o) * np.linalg.norm(r)
    cosine = float(np.dot(o, r) / denom) if denom > 0 else (1.0 if abs_err == 0 else 0.0)
    if not np.all(np.isfinite(o)):
        rel, cosine = float("inf"), 0.0
    return OutputError(name, abs_err, rel, cosine, scale)
