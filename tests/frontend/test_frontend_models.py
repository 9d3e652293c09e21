"""Whole-model numerics: onnxruntime on the original model versus onnxruntime on the exported
canonical graph (folding, BN folding and canonicalisation keep the numbers)."""

from __future__ import annotations

import pytest

from frontend_util import assert_canonical_matches, bundled, kinds
from tpuflow.frontend.ops import ALL

BUILT = ["mlp", "small_cnn", "mobilenetv2", "bert_layer", "gpt_block", "llama_mlp"]
LIGHT_FAST = ["squeezenet", "shufflenet", "inception_v1", "resnet50", "densenet121", "inception_v2"]
LIGHT_SLOW = ["alexnet", "vgg19", "zfnet512"]


def check(name):
    g = assert_canonical_matches(bundled(name), rtol=1e-4, atol=1e-4)
    assert set(kinds(g)) <= ALL
    return g


@pytest.mark.parametrize("name", BUILT)
def test_bundled_model_numerics(name):
    check(name)


@pytest.mark.parametrize("name", LIGHT_FAST)
def test_light_model_numerics(name):
    ops = kinds(check(name))
    if name == "resnet50":       # every BN folds into its Conv; Add = 16 residual sums + the fc bias
        assert ops.count("Conv") == 53 and "Mul" not in ops and ops.count("Add") == 16 + 1


@pytest.mark.slow
@pytest.mark.parametrize("name", LIGHT_SLOW)
def test_large_light_model_numerics(name):
    check(name)


def test_gpt_block_mask_and_shape_chains_fold():
    g = check("gpt_block")
    where = next(n for n in g.nodes() if n.op_type == "Where")
    assert g.tensor(where.inputs[0]).const.shape == (1, 1, 64, 64)
    assert "Slice" not in kinds(g)                                  # the mask slice was constant
