"""benchmarks/prequantized.py's gpt_block rows at --dtype fp16 pass verify end to end (issue 15: its
LayerNorms' scale and bias rounded to fp16 put ln_1 / ln_2 one code off onnxruntime and the output
3 steps off; only the stage-wise rule passed them)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "prequantized.py"


def _prequantized():
    spec = importlib.util.spec_from_file_location("prequantized_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("fmt", ["qdq", "qdq_u8"])
def test_gpt_block_at_fp16_passes_end_to_end(fmt):
    (row,) = _prequantized().run_case("gpt_block", fmt, ["fp16"], "sg2260", 2)
    assert row["ok"] and row["ok_end_to_end"], row
    assert row["max_steps"] <= 2 and row["min_cosine"] >= 0.9999, row
