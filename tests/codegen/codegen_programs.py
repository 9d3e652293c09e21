"""Small hand-built Programs (a few instructions per engine and a memory plan) for the codegen tests."""

from __future__ import annotations

from tpuflow.chip import load_chip
from tpuflow.isa import (TILE_WAIT_TAG, AccCvt, ArTiu, ConvTiu, PordTiu, SysDma, SysTiu, TensorDma, TMatmul, TPush,
                         tile_ref)
from tpuflow.program import DdrTensor, LayerInfo, MemoryPlan, Program


def lmem(chip, lane: int, offset: int) -> int:
    """Flat LMEM address of (lane, offset)."""
    return lane * chip.lmem_bytes_per_lane + offset


def gdma_lmem(chip, lane: int, offset: int) -> int:
    """The GDMA global address of (lane, offset)."""
    return chip.core.gdma_lmem_base_address + lmem(chip, lane, offset)


def sample_program(chip_name: str = "sg2260") -> Program:
    """load -> conv+relu -> maxpool -> store, plus a TILE matmul that GDMA and TIU wait for."""
    chip = load_chip(chip_name)
    x_bytes, y_bytes = 1 * 3 * 16 * 16 * 4, 1 * 8 * 4 * 4 * 4
    load = TensorDma(src_start_addr=0x1000, dst_start_addr=gdma_lmem(chip, 0, 0x4000),
                     src_nsize=1, src_csize=3, src_hsize=16, src_wsize=16,
                     src_nstride=768, src_cstride=256, src_hstride=16, src_wstride=1,
                     dst_nsize=1, dst_csize=3, dst_hsize=16, dst_wsize=16,
                     dst_nstride=256, dst_cstride=256, dst_hstride=16, dst_wstride=1)
    weights = TensorDma(src_start_addr=0x100000, dst_start_addr=gdma_lmem(chip, 0, 0x8000),
                        src_nsize=1, src_csize=8, src_hsize=1, src_wsize=27,
                        src_nstride=216, src_cstride=27, src_hstride=27, src_wstride=1,
                        dst_nsize=1, dst_csize=8, dst_hsize=1, dst_wsize=27,
                        dst_nstride=27, dst_cstride=27, dst_hstride=27, dst_wstride=1)
    conv = ConvTiu(cmd_id_dep=2, res0_addr=lmem(chip, 0, 0), res0_n=1, res0_c=8, res0_h=8, res0_w=8,
                   opd0_addr=lmem(chip, 0, 0x4000), opd0_c=3, opd0_h=16, opd0_w=16, opd1_addr=lmem(chip, 0, 0x8000),
                   opd1_h=3, opd1_w=3, opd0_up_pad=1, opd0_dn_pad=1, opd0_lf_pad=1, opd0_rt_pad=1,
                   res_op_x_str=2, res_op_y_str=2, opt_relu=1)
    pool = PordTiu(op="maxpooling", res0_addr=lmem(chip, 0, 0x1000), res0_n=1, res0_c=8, res0_h=4, res0_w=4,
                   opd0_addr=lmem(chip, 0, 0), opd0_h=8, opd0_w=8, opd1_h=2, opd1_w=2, res_op_x_str=2, res_op_y_str=2)
    half = ArTiu(op="cast", res0_addr=lmem(chip, 0, 0x2000), res0_n=1, res0_c=8, res0_h=4, res0_w=4,
                 opd0_addr=lmem(chip, 0, 0x1000), opt_res0_prec=1)
    store = TensorDma(cmd_id_dep=2, src_start_addr=gdma_lmem(chip, 0, 0x1000), dst_start_addr=0x2000,
                      src_nsize=1, src_csize=8, src_hsize=4, src_wsize=4,
                      src_nstride=16, src_cstride=16, src_hstride=4, src_wstride=1,
                      dst_nsize=1, dst_csize=8, dst_hsize=4, dst_wsize=4,
                      dst_nstride=128, dst_cstride=16, dst_hstride=4, dst_wstride=1)
    tile = [TPush(dst_queue=0, dst_size=9, wait_gdma_id=1), TPush(dst_queue=1, dst_size=9, wait_gdma_id=2),
            TMatmul(fn="TMATMUL", dt="FP32", m=64, n=32, k=64, src0=tile_ref("T", 1), src1=tile_ref("U", 1),
                    acc_size=9),
            AccCvt(layout="NZ2ND", row=64, col=32, dst_queue=2, dst_size=9, wait_tiu_id=1)]
    program = Program(
        chip=chip,
        tiu=[conv, pool, half, SysTiu(op="wait_msg", reg_idx=TILE_WAIT_TAG, imm=4), SysTiu(op="end")],
        gdma=[load, weights, store, SysDma(op="sys_wait", index=TILE_WAIT_TAG, constant_value=4),
              SysDma(op="chain_end")],
        tile=tile,
        tiu_layers=["conv1", "pool1", "pool1", "mm", ""],
        gdma_layers=["conv1", "conv1", "pool1", "mm", ""],
        tile_layers=["mm"] * 4,
        memory=MemoryPlan(
            tensors={"x": DdrTensor("x", 0x1000, (1, 3, 16, 16), "fp32", "input", x_bytes),
                     "y": DdrTensor("y", 0x2000, (1, 8, 4, 4), "fp32", "output", y_bytes),
                     "conv1.w": DdrTensor("conv1.w", 0x100000, (8, 3, 3, 3), "fp32", "weight", 8 * 27 * 4)},
            weight_base=0x100000, weight_image=bytes(range(256)) * 3 + bytes(96), ddr_bytes_used=0x200000),
        layers={"conv1": LayerInfo("conv1", "Conv", macs=8 * 64 * 27, ddr_bytes=x_bytes, fused_group="g0"),
                "pool1": LayerInfo("pool1", "MaxPool", ddr_bytes=y_bytes, fused_group="g0"),
                "mm": LayerInfo("mm", "MatMul", macs=64 * 32 * 64)},
        fused_groups=[("conv1", "pool1")],
        options={"dtype": "fp32", "matmul": "tile"},
        model_name="tiny",
        issue_order="DDBBTTDTBTBDDB",
    )
    return program
