"""Hand-built Programs for the functional-model tests: a conv -> relu -> maxpool layer loaded
from and stored to DDR, and a TILE matmul whose tiles GDMA loads and stores."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from functional_helpers import CHIP, conv_ref, flat, gaddr, local
from tpuflow.isa.base import TILE_WAIT_TAG, LocalTensor
from tpuflow.isa.gdma import GeneralDma, SysDma, TensorDma
from tpuflow.isa.tile import AccCvt, TMatmul, TPush, size_code, tile_ref
from tpuflow.isa.tiu import ArTiu, ConvTiu, PordTiu, SysTiu
from tpuflow.program import DdrTensor, MemoryPlan, Program

N, IC, H, W, OC = 1, 8, 12, 12, 70      # OC > lanes: output channels wrap into a second group
X_LANE = 5
WEIGHT_BASE = 0x2000
Y_ADDR = 0x8000


def _dma(src: int, dst: int, src_shape, src_strides, dst_shape, dst_strides, **extra) -> TensorDma:
    return TensorDma(src_start_addr=src, dst_start_addr=dst,
                     **{f"src_{k}size": v for k, v in zip("nchw", src_shape)},
                     **{f"src_{k}stride": v for k, v in zip("nchw", src_strides)},
                     **{f"dst_{k}size": v for k, v in zip("nchw", dst_shape)},
                     **{f"dst_{k}stride": v for k, v in zip("nchw", dst_strides)}, **extra)


def _row_major(shape) -> tuple[int, ...]:
    n, c, h, w = shape
    return (c * h * w, h * w, w, 1)


def _glob(t: LocalTensor) -> int:
    return t.addr + CHIP.core.gdma_lmem_base_address


def conv_layer_weights(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((OC, IC, 3, 3)).astype(np.float32),
            rng.standard_normal(OC).astype(np.float32))


def conv_layer_program(seed: int = 0) -> Program:
    """GDMA loads x, weights, bias; TIU conv 3x3 pad 1 (+bias), relu, 2x2/2 maxpool; GDMA stores."""
    weight, bias = conv_layer_weights(seed)
    x = local(flat(X_LANE, 0), (N, IC, H, W))
    wt = local(flat(0, 0x4000), (1, OC, 1, IC * 9), layout="compact")
    bt = local(flat(0, 0x6000), (1, OC, 1, 1), layout="compact")
    conv = local(flat(0, 0x8000), (N, OC, H, W))
    pool = local(flat(0, 0xC000), (N, OC, H // 2, W // 2))
    bias_addr = WEIGHT_BASE + weight.nbytes
    gdma = [
        _dma(0, _glob(x), x.shape, _row_major(x.shape), x.shape, x.strides),
        _dma(WEIGHT_BASE, _glob(wt), wt.shape, _row_major(wt.shape), wt.shape, wt.strides),
        _dma(bias_addr, _glob(bt), bt.shape, _row_major(bt.shape), bt.shape, bt.strides),
        _dma(_glob(pool), Y_ADDR, pool.shape, pool.strides, pool.shape, _row_major(pool.shape), cmd_id_dep=3),
    ]
    tiu = [
        ConvTiu(res0_addr=conv.addr, res0_n=N, res0_c=OC, res0_h=H, res0_w=W, opd0_addr=x.addr, opd0_c=IC,
                opd0_h=H, opd0_w=W, opd1_addr=wt.addr, opd1_h=3, opd1_w=3, opd2_addr=bt.addr, opt_opd2_const=0,
                opd0_up_pad=1, opd0_dn_pad=1, opd0_lf_pad=1, opd0_rt_pad=1, cmd_id_dep=3),
        ArTiu(op="max", res0_addr=conv.addr, res0_n=N, res0_c=OC, res0_h=H, res0_w=W, opd0_addr=conv.addr,
              opd1_addr=0, opt_opd1_const=1),
        PordTiu(op="maxpooling", res0_addr=pool.addr, res0_n=N, res0_c=OC, res0_h=H // 2, res0_w=W // 2,
                opd0_addr=conv.addr, opd0_h=H, opd0_w=W, opd1_h=2, opd1_w=2, res_op_y_str=2, res_op_x_str=2),
    ]
    image = weight.tobytes() + bias.tobytes()
    tensors = {
        "x": DdrTensor("x", 0, (N, IC, H, W), "fp32", "input", N * IC * H * W * 4),
        "conv.weight": DdrTensor("conv.weight", WEIGHT_BASE, weight.shape, "fp32", "weight", weight.nbytes),
        "conv.bias": DdrTensor("conv.bias", bias_addr, bias.shape, "fp32", "weight", bias.nbytes),
        "y": DdrTensor("y", Y_ADDR, pool.shape, "fp32", "output", int(np.prod(pool.shape)) * 4),
    }
    memory = MemoryPlan(tensors=tensors, weight_base=WEIGHT_BASE, weight_image=image,
                        ddr_bytes_used=Y_ADDR + tensors["y"].nbytes)
    return Program(chip=CHIP, tiu=tiu, gdma=gdma, tiu_layers=["conv1", "relu1", "pool1"],
                   gdma_layers=["conv1", "conv1", "conv1", "pool1"], memory=memory, model_name="conv_layer",
                   issue_order="DDDBBBD")


def conv_layer_reference(x: np.ndarray, seed: int = 0) -> np.ndarray:
    weight, bias = conv_layer_weights(seed)
    y = conv_ref(x.astype(np.float64), weight.astype(np.float64), pads=(1, 1), out_hw=(H, W))
    y = np.maximum(y + bias.reshape(1, -1, 1, 1), 0)
    return y.reshape(N, OC, H // 2, 2, W // 2, 2).max(axis=(3, 5))


def with_instruction(program: Program, engine: str, index: int, **changes) -> Program:
    """A copy of `program` with fields of one instruction changed."""
    queues = {e: list(program.queue(e)) for e in ("tiu", "gdma", "tile")}
    queues[engine][index] = replace(queues[engine][index], **changes)
    return program.with_queues(queues["tiu"], queues["gdma"], queues["tile"], program.tiu_layers,
                               program.gdma_layers, program.tile_layers, program.issue_order)


# ---------------------------------------------------------------- TILE

MM, KK, NN = 20, 24, 36


def _slot(queue: int, slot: int) -> tuple[int, int]:
    return divmod(CHIP.tile_slot_address(queue, slot), CHIP.lmem_bytes_per_lane)


def tile_program() -> Program:
    """GDMA copies an Nz A tile and a Zn B tile (prepared in DDR by the host) into the T and U
    slots; TILE pushes them, multiplies, drains NZ2ND onto M; GDMA (sys_wait on TILE) stores that
    tile to DDR; TIU (wait_msg on TILE) doubles it into another buffer, which GDMA stores too."""
    a_bytes = _round(MM, 16) * _round(KK, 8) * 4
    b_bytes = _round(KK, 8) * _round(NN, 16) * 4
    c_bytes = MM * NN * 4
    t_lane, t_off = _slot(0, 0)
    u_lane, u_off = _slot(1, 0)
    m_lane, m_off = _slot(2, 0)
    out = local(flat(m_lane, 0x1000), (1, 1, 1, MM * NN))
    c_tile = local(flat(m_lane, m_off), (1, 1, 1, MM * NN))
    gdma = [
        GeneralDma(src_start_addr=0, dst_start_addr=gaddr(t_lane, t_off), src_cstride=a_bytes // 4),
        GeneralDma(src_start_addr=a_bytes, dst_start_addr=gaddr(u_lane, u_off), src_cstride=b_bytes // 4),
        SysDma(op="sys_wait", index=TILE_WAIT_TAG, constant_value=4),
        GeneralDma(src_start_addr=gaddr(m_lane, m_off), dst_start_addr=0x8000, src_cstride=MM * NN),
        GeneralDma(src_start_addr=gaddr(m_lane, 0x1000), dst_start_addr=0xC000, src_cstride=MM * NN, cmd_id_dep=2),
    ]
    tile = [
        TPush(dst_queue=0, dst_size=size_code(a_bytes), wait_gdma_id=1),
        TPush(dst_queue=1, dst_size=size_code(b_bytes), wait_gdma_id=2),
        TMatmul(fn="TMATMUL", dt="FP32", m=MM, n=NN, k=KK, src0=tile_ref("T", 1), src1=tile_ref("U", 1),
                acc_size=size_code(_round(MM, 16) * _round(NN, 16) * 4)),
        AccCvt(layout="NZ2ND", row=MM, col=NN, dst_queue=2, dst_size=size_code(c_bytes)),
    ]
    tiu = [
        SysTiu(op="wait_msg", reg_idx=TILE_WAIT_TAG, imm=4),
        ArTiu(op="add", res0_addr=out.addr, res0_n=1, res0_c=1, res0_h=1, res0_w=MM * NN, opd0_addr=c_tile.addr,
              opd1_addr=c_tile.addr, short_res0_str=1, short_opd0_str=1, short_opd1_str=1),
    ]
    tensors = {
        "tiles": DdrTensor("tiles", 0, (a_bytes // 4 + b_bytes // 4,), "fp32", "input", a_bytes + b_bytes),
        "c": DdrTensor("c", 0x8000, (MM, NN), "fp32", "output", c_bytes),
        "c2": DdrTensor("c2", 0xC000, (MM, NN), "fp32", "output", c_bytes),
    }
    return Program(chip=CHIP, tiu=tiu, gdma=gdma, tile=tile, tiu_layers=["mm"] * 2, gdma_layers=["mm"] * 5,
                   tile_layers=["mm"] * 4, memory=MemoryPlan(tensors=tensors, ddr_bytes_used=0xC000 + c_bytes),
                   issue_order="DDTTTTBBDDD")


def _round(v: int, m: int) -> int:
    return -(-v // m) * m


def tile_inputs(seed: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(host-prepared tile bytes as fp32 words, A, B)."""
    from tpuflow.hwmodel.functional.layouts import nz_offsets, zn_offsets
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((MM, KK)).astype(np.float32)
    b = rng.standard_normal((KK, NN)).astype(np.float32)
    a_img = np.zeros(_round(MM, 16) * _round(KK, 8), np.float32)
    a_img[nz_offsets(MM, KK, _round(MM, 16), 8)] = a
    b_img = np.zeros(_round(KK, 8) * _round(NN, 16), np.float32)
    b_img[zn_offsets(KK, NN, _round(NN, 16), 8)] = b
    return np.concatenate([a_img, b_img]), a, b

