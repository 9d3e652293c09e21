"""benchmarks/vendor_layers.py attributes tpu-mlir's ops to ONNX layers as its docstring says, classifies GDMA
commands by run length, and benchmarks/fidelity.py's BM1684X forms keep the work of the commands they rewrite."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from tpuflow.chip import load_chip
from tpuflow.hwmodel.timing.compute import tiu_macs, tiu_work
from tpuflow.hwmodel.timing.cost import instruction_cycles
from tpuflow.hwmodel.timing.synthetic import conv, load, matmul, store
from tpuflow.isa import Prec

BENCH = Path(__file__).resolve().parents[3] / "benchmarks"
sys.path.insert(0, str(BENCH))


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


vl = _module("vendor_layers")
fid = _module("fidelity")
CHIP = load_chip("bm1684x")
FP16 = int(Prec.FP16)

MLIR = """#loc1 = loc("r2_Relu_filter_reorderd")
#loc2 = loc("645")
#loc3 = loc("r9_Relu_filter_reorderd")
      %114 = "tpu.Load"(%3) {ginfo = #tpu.lg<c_slice = [64]>} : (tensor<1x64x1x64xf16>) -> tensor<1x64x1x64xf16> loc(#loc2)
      %126 = "tpu.Conv2D"(%115, %114, %116) {kernel_shape = [1, 1]} : (tensor<1x64x56x56xf16>) -> tensor<1x64x56x56xf16> loc(#loc1)
      %127 = "tpu.Conv2D"(%126, %114, %116) {kernel_shape = [3, 3]} : (tensor<1x64x56x56xf16>) -> tensor<1x64x56x56xf16> loc(#loc3)
      %130 = "tpu.Store"(%127, %0) {ginfo = #tpu.lg<c_slice = [64]>} : (tensor<1x64x56x56xf16>) -> tensor<1x64x56x56xf16> loc(#loc2)
"""


def test_loads_take_their_reader_and_stores_their_writer(tmp_path):
    path = tmp_path / "final.mlir"
    path.write_text(MLIR)
    layer_of = {2: "n0", 9: "n7"}           # r2 is computed in layer n0, r9 in layer n7
    assert vl.mlir_line_layers(path, layer_of) == {4: "n0", 5: "n0", 6: "n7", 7: "n7"}


def test_resnet50_layers_are_its_53_convs():
    convs, layer_of = vl.conv_layers("resnet50")
    assert len(convs) == 53 and convs[0] == 0
    assert layer_of[3] == "n0" and layer_of[convs[-1] + 1] == f"n{convs[-1]}"


def test_run_classes():
    assert vl.run_class(load(CHIP, 1 << 30, 0, (1, 64, 1, 1), FP16), CHIP) == "one-element runs"
    assert vl.run_class(load(CHIP, 1 << 30, 0, (1, 64, 1, 64), FP16), CHIP) == "runs < 256 B"
    assert vl.run_class(store(CHIP, 0, 1 << 30, (1, 64, 4, 64), FP16), CHIP) == "runs >= 256 B"


def test_overlap_splits_the_wall_time():
    import numpy as np
    assert vl.union_ps(np.array([[0, 10], [5, 20], [30, 40]])) == 30


def test_fc_on_lanes_keeps_the_product_and_puts_n_on_the_lanes():
    """sMM (1 x 64) x (64 x 1024) as the vendor reader builds it (the row on the lanes) -> N on the lanes."""
    for prec in (FP16, int(Prec.FP32)):
        fc = matmul(0, 1 << 14, 1 << 15, m=1, k=64, n=1024, prec=prec)
        turned = fid._fc_on_lanes(fc)
        assert turned.mnk == (1024, 1, 64) and tiu_macs(turned) == tiu_macs(fc)
        # 16 lane blocks of 64 columns instead of ceil(1024 / ohow) column blocks on one lane
        assert 3 * instruction_cycles(turned, CHIP) < instruction_cycles(fc, CHIP)
        assert fid._fc_on_lanes(turned) is turned


def test_stem_fold_is_tpu_mlirs_3ic_cost():
    """7x7 stride-2 stem on 3 channels (229 x 229 padded input), 112 x 112 output, fp16: folded to 21 channels x (1 x 7): tpu-mlir's BM1684X
    profile charges 1 x ceil(12544 / 4) x 1 x 7 = 21952 cycles, our body the same (unfolded: x 49)."""
    stem = conv(0, 1 << 14, 1 << 15, n=1, cin=3, h=229, w=229, cout=64, k=7, stride=2, pad=0, prec=FP16)
    folded = fid._stem_3ic(stem)
    assert (folded.opd0_c, folded.opd1_h, folded.opd1_w) == (21, 1, 7)
    assert tiu_work(folded, CHIP).body == 21952 and tiu_work(stem, CHIP).body == 3136 * 49


def test_names_reused_in_another_group_do_not_mix(tmp_path):
    """tpu-mlir restarts SSA names in every tpu.Group: a %120 of the second group is read by that group's op."""
    text = MLIR + """      %200 = "tpu.Group"(%1) ({
      %114 = "tpu.Load"(%9) {ginfo = #tpu.lg<c_slice = [64]>} : (tensor<1x64x1x64xf16>) -> tensor<1x64x1x64xf16> loc(#loc2)
      %127 = "tpu.Conv2D"(%126, %114, %116) {kernel_shape = [3, 3]} : (tensor<1x64x56x56xf16>) -> tensor<1x64x56x56xf16> loc(#loc3)
"""
    path = tmp_path / "final.mlir"
    path.write_text(text)
    layers = vl.mlir_line_layers(path, {2: "n0", 9: "n7"})
    assert layers[4] == "n0" and layers[9] == "n7"
