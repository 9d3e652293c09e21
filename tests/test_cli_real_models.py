"""A real model with trained weights, from a public package, through verify and estimate (slow; skipped
unless the package is installed: `pip install --no-deps rapidocr-onnxruntime==1.4.4`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tpuflow.options import CompileOptions
from tpuflow.pipeline import estimate, verify

PACKAGE = "rapidocr_onnxruntime"
MODEL = "models/ch_ppocr_mobile_v2.0_cls_infer.onnx"        # text-direction classifier, 0.6 MB
SHAPES = {"x": (1, 3, 48, 192)}


@pytest.fixture(scope="module")
def ocr_classifier() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{PACKAGE} is not installed (pip install --no-deps rapidocr-onnxruntime==1.4.4 to run this)")
    path = Path(next(iter(spec.submodule_search_locations))) / MODEL
    if not path.is_file():
        pytest.skip(f"{PACKAGE} is installed but ships no {MODEL}")
    return path


@pytest.mark.slow
def test_real_ocr_classifier_verifies_against_onnxruntime(ocr_classifier):
    result = verify(str(ocr_classifier), None, CompileOptions(dtype="fp32"), SHAPES, race_check=False)
    assert result["ok"], result["outputs"]
    assert result["outputs"][0]["max_rel_err"] <= result["rtol"]


@pytest.mark.slow
def test_real_ocr_classifier_estimate_respects_both_bounds(ocr_classifier):
    report = estimate(str(ocr_classifier), None, CompileOptions(dtype="fp16"), SHAPES)
    assert report["latency_us"] >= report["lower_bound_us"] >= report["model_bound_us"] > 0
    assert report["macs"] > 10e6                                 # a real network (16 MMAC), not a stub
