"""Whole models through `tpuflow verify` (compile, write, decode, functional run with the race
detector, onnxruntime comparison). CI runs a representative set; `-m slow` runs every model on
both matmul paths in fp32, fp16 and bf16 (benchmarks/verify_all.py times the same set;
results/verify_all_full.json)."""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest

from tpuflow.options import CompileOptions
from tpuflow.pipeline import verify

TRANSFORMERS = ["bert_layer", "gpt_block", "llama_mlp"]
SMALL = ["mlp", "small_cnn", "mobilenetv2"] + TRANSFORMERS
LIGHT = ["alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet",
         "vgg19", "zfnet512"]

CI_SET = [(m, "tiu", "fp32") for m in SMALL + ["squeezenet", "resnet50"]] + \
         [(m, "tile", "fp32") for m in ["mlp", "small_cnn", "bert_layer", "gpt_block"]] + \
         [(m, "tiu", "fp16") for m in ["small_cnn", "bert_layer", "llama_mlp"]] + \
         [(m, "tile", "fp16") for m in ["mlp", "gpt_block"]] + [("bert_layer", "tiu", "bf16")]
HEAVY = ["bert_base"]  # BERT-base-sized: 340 MB of fp32 weights; TILE fp32 takes minutes
DTYPES = ("fp32", "fp16", "bf16")
FULL_SET = [(m, mm, dt) for m in SMALL + LIGHT + HEAVY for mm in ("tiu", "tile") for dt in DTYPES]


def _verify(model, matmul, dtype, race=True):
    result = verify(model, None, CompileOptions(dtype=dtype, matmul=matmul), seed=0, race_check=race)
    assert result["ok"], (model, matmul, dtype, result["outputs"])
    return result


@pytest.mark.parametrize("model,matmul,dtype", CI_SET)
def test_model_verifies(model, matmul, dtype):
    _verify(model, matmul, dtype, race=model != "resnet50")


@pytest.mark.slow
@pytest.mark.parametrize("model,matmul,dtype", [c for c in FULL_SET if c not in CI_SET])
def test_model_verifies_full(model, matmul, dtype):
    _verify(model, matmul, dtype)


def test_full_set_names_every_bundled_model():
    from tpuflow.models import names
    listed = SMALL + LIGHT + HEAVY
    assert sorted(listed) == sorted(names()) and len(set(listed)) == len(listed)


@pytest.mark.parametrize("matmul", ["tiu", "tile"])
def test_compile_output_is_byte_identical(tmp_path, matmul):
    from tpuflow.cli import main
    for d in ("a", "b"):
        assert main(["compile", "bert_layer", "--matmul", matmul, "-o", str(tmp_path / d)]) == 0
    a, b = tmp_path / "a", tmp_path / "b"
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir()) and len(names) == 5
    match, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
    assert not mismatch and not errors


@pytest.mark.slow
@pytest.mark.parametrize("cores", [2, 8])
@pytest.mark.parametrize("model", SMALL + LIGHT + HEAVY)
def test_model_verifies_on_several_cores(model, cores):
    """Issue 14: every bundled model split over 2 and 8 cores (fp16, race detector over every
    core's LMEM and the shared DDR) computes what onnxruntime computes."""
    result = verify(model, None, CompileOptions(dtype="fp16", cores=cores), seed=0, race_check=True)
    assert result["ok"], (model, cores, result["outputs"])
