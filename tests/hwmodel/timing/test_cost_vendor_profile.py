"""benchmarks/vendor_profile.py reads tpu-mlir's compiler_profile.txt cells and final.mlir ops as its
HOWTO describes them, and prices their equivalents with the cost model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tpuflow.chip import load_chip
from tpuflow.hwmodel.timing.cost import instruction_cycles

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "vendor_profile.py"
spec = importlib.util.spec_from_file_location("vendor_profile", SCRIPT)
vp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vp)

PROFILE = """s: start time, b: bd_id, g: gdma_id, e: end time, t: cmd cost time, dr: direction, sz: memsize, bw: bandwidth
ENGINE_BD                          ENGINE_GDMA
                                   Load_41|GDMA_TENSOR|s:0|b:0|g:1|e:11145|t:11146|dr:0|sz:602112|bw:50.31
Conv2D_3|CONV|s:13055|b:1|g:3|e:128302|t:115248      Load_44|GDMA_TENSOR|s:13055|b:0|g:4|e:17907|t:4853|dr:0|sz:1024|bw:0.20
API_END total_cycle:128302|b:1|g:4
"""

MLIR = ['#loc7 = loc("r2_Relu_filter_reorderd")',
        'x',
        '%118 = "tpu.Conv2D"(%114, %115, %116) {ginfo = #tpu.lg<n_slice = [1], c_slice = [64], h_slice = [56, 56], '
        'w_slice = [112]>, kernel_shape = [7, 7], strides = [2, 2]} : (tensor<1x3x224x224xf32>, tensor<1x64x3x49xf32>, '
        'tensor<1x64x1x1xf32>) -> tensor<1x64x112x112xf32> loc(#loc7)']


def test_cells_are_read_with_their_fields(tmp_path):
    path = tmp_path / "compiler_profile.txt"
    path.write_text(PROFILE)
    cells = vp.parse_profile(path)
    assert [(c["op"], c["line"], c["kind"], c["t"]) for c in cells] == [
        ("Load", 41, "GDMA_TENSOR", 11146), ("Conv2D", 3, "CONV", 115248), ("Load", 44, "GDMA_TENSOR", 4853)]
    assert (cells[0]["dr"], cells[0]["sz"]) == (0, 602112) and "dr" not in cells[1]


def test_conv_equivalent_takes_the_op_slice_kernel_and_input_channels():
    info = vp.op_info(MLIR[2])
    assert info["out"] == (1, 64, 112, 112) and info["kernel"] == [7, 7]
    assert vp.slice_shape(info, 0) == (1, 64, 56, 112) == vp.slice_shape(info, 1)
    conv = vp.tiu_instr("CONV", info, 0, vp.PREC["f32"])
    assert (conv.opd0_c, conv.opd1_h, conv.opd1_w, conv.res0_c, conv.res0_h, conv.res0_w) == (3, 7, 7, 64, 56, 112)
    sg2260 = load_chip("sg2260")
    # TPUPerf formula: 23 start-up + ceil(64/64) x ceil(56*112/16) x 3 x 49 (fp32: one channel, 16 pixels a step)
    assert instruction_cycles(conv, sg2260) == 23 + 392 * 147
    assert vp.layer_names(MLIR) == {3: "r2"}


@pytest.mark.parametrize("direction,nbytes", [(0, 602112), (1, 4096), (2, 65536), (0, 512)])
def test_gdma_equivalent_moves_the_bytes_in_the_direction(direction, nbytes):
    chip = load_chip("bm1684x")
    instr = vp.gdma_instr(chip, direction, nbytes, vp.PREC["f32"])
    assert instr.nbytes == nbytes
    assert vp.bucket(nbytes) in {name for _, name in vp.SIZE_BUCKETS}
    assert instruction_cycles(instr, chip) * 1000 <= vp.simulated_cycles(chip, instr) * 1000


def test_load_cells_are_priced_as_their_real_transfer():
    """A 1x64x1x1 f32 bias tpu.Load (one value per lane) is priced as that transfer: 64 one-element runs x 1024 B
    at 54.0 B/cycle + 8 setup = 1221 cycles; tpu-mlir charges 1213. A byte count that disagrees with the slice
    falls back to the contiguous stand-in."""
    chip = load_chip("bm1684x")
    line = ('%116 = "tpu.Load"(%2) {ginfo = #tpu.lg<c_slice = [64], h_slice = [1], w_slice = [1]>} : '
            '(tensor<1x64x1x1xf32>) -> tensor<1x64x1x1xf32> loc(#loc112)')
    cell = {"op": "Load", "line": 1, "kind": "GDMA_TENSOR", "t": 1213, "id": 3, "dr": 0, "sz": 256}
    instr = vp.shaped_gdma_instr(chip, cell, vp.op_info(line), 0)
    assert (instr.dst_csize, instr.dst_wsize, instr.src_cstride) == (64, 1, 1)
    assert instruction_cycles(instr, chip) == 1221
    assert vp.shaped_gdma_instr(chip, {**cell, "sz": 512}, vp.op_info(line), 0) is None
