"""Kernel-row folding of convs with few input channels: the kh row-shifted copies of the input stack
kernel-row-major as channels, one LMEM copy per kernel row fills every input channel's lane, and the
program matches onnxruntime (padded first and last rows, strides)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tpuflow.isa import ConvTiu, TensorDma
from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model, verify

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e"))
from onnx_build import ModelBuilder  # noqa: E402


def _stem(k: int, stride: int, cin: int = 3):
    b = ModelBuilder(seed=31)
    x = b.input("x", (1, cin, 40, 36))
    y = b.node("Conv", [x, b.weight("w", (16, cin, k, k)), b.weight("b", (16,))], "stem", kernel_shape=[k, k],
               strides=[stride, stride], pads=[k // 2] * 4)
    b.output(b.node("Relu", [y], "r"))
    return b.model()


def _lmem_copies(program) -> int:
    base = program.chip.core.gdma_lmem_base_address
    return sum(1 for i in program.gdma if isinstance(i, TensorDma) and not i.fill_constant_en
               and i.src_start_addr >= base and i.dst_start_addr >= base)


@pytest.mark.parametrize("k,stride", [(3, 1), (7, 2), (5, 3)])
def test_a_folded_stem_copies_once_per_kernel_row_and_matches_onnxruntime(k, stride):
    model = _stem(k, stride)
    _, program = compile_model(model, None, CompileOptions(dtype="fp16", layer_group="off"))
    convs = [i for i in program.tiu if isinstance(i, ConvTiu)]
    assert convs and all(i.opd0_c == 3 * k and i.opd1_h == 1 for i in convs)      # folded: 3k channels, 1 x k
    assert _lmem_copies(program) == k * len(convs)
    result = verify(model, None, CompileOptions(dtype="fp16", layer_group="off"), race_check=True)
    assert result["ok"], result["outputs"]
