"""A hand-built int8 Program end to end (what the int8 lowering will emit): GDMA loads int8 input and weights,
an int32 bias and per-channel requant words; TIU runs an int8 3x3 CONV into int32 and a quant.rq1 back to
int8 with per-channel multipliers / shifts / zero points; GDMA stores int8. The functional model equals a
numpy reference of the same integer math, and the timing model charges less than the same program in fp16."""

from __future__ import annotations

import numpy as np

from functional_helpers import CHIP, flat, local
from tpuflow.hwmodel.functional import run
from tpuflow.hwmodel.timing import simulate
from tpuflow.isa.base import LocalTensor, Prec
from tpuflow.isa.gdma import TensorDma
from tpuflow.isa.tiu import RQ_ROUND_MODES, ArTiu, ConvTiu, RqDqTiu, rq1_channel_words
from tpuflow.lowering.weights import pack_conv_weights
from tpuflow.program import DdrTensor, MemoryPlan, Program

N, IC, H, W, OC = 1, 64, 16, 16, 96       # OC > lanes: two channel groups for the result and the parameters
WEIGHT_BASE = 0x10000
Y_ADDR = 0x40000
MODE = RQ_ROUND_MODES["half_away_from_zero"]


def _row_major(shape) -> tuple[int, ...]:
    n, c, h, w = shape
    return (c * h * w, h * w, w, 1)


def _ddr_to_lmem(ddr: int, t: LocalTensor, **extra) -> TensorDma:
    return _dma(ddr, t.addr + CHIP.core.gdma_lmem_base_address, t.shape, _row_major(t.shape), t.strides, t.prec, **extra)


def _dma(src: int, dst: int, shape, src_strides, dst_strides, prec: Prec, **extra) -> TensorDma:
    return TensorDma(src_start_addr=src, dst_start_addr=dst, src_data_format=int(prec),
                     **{f"src_{k}size": v for k, v in zip("nchw", shape)},
                     **{f"src_{k}stride": v for k, v in zip("nchw", src_strides)},
                     **{f"dst_{k}size": v for k, v in zip("nchw", shape)},
                     **{f"dst_{k}stride": v for k, v in zip("nchw", dst_strides)}, **extra)


def parameters(seed: int = 1):
    rng = np.random.default_rng(seed)
    weight = rng.integers(-128, 128, size=(OC, IC, 3, 3))
    bias = rng.integers(-5000, 5000, size=OC)
    multipliers = rng.integers(1 << 29, 1 << 30, size=OC)
    rshifts = rng.integers(41, 44, size=OC)         # scale about 2**-13: int32 sums of ~1e5 land in int8
    zero_points = rng.integers(-10, 10, size=OC)
    return weight, bias, multipliers, rshifts, zero_points


def build(dtype: str, seed: int = 1) -> Program:
    """The layer in int8 (conv int8 -> int32, rq1 -> int8) or fp16 (conv fp16 -> fp32, mul by a scale -> fp16)."""
    weight, bias, mults, rshifts, zps = parameters(seed)
    int8 = dtype == "int8"
    act, acc = (Prec.INT8, Prec.INT32) if int8 else (Prec.FP16, Prec.FP32)
    block = 64 if int8 else 32
    packed = pack_conv_weights(weight.astype(np.int8 if int8 else np.float16), block)
    x = local(flat(0, 0), (N, IC, H, W), act)
    wt = local(flat(0, 0x4000), (1, OC, 1, packed.shape[1]), act, "compact")
    bt = local(flat(0, 0x6000), (1, OC, 1, 1), acc, "compact")
    qt = local(flat(0, 0x7000), (1, OC, 1, 2), Prec.INT32, "compact")
    conv = local(flat(0, 0x8000), (N, OC, H, W), acc)
    out = local(flat(0, 0xC000), (N, OC, H, W), act)
    blobs = [packed.tobytes(), bias.astype(np.int32 if int8 else np.float32).tobytes()]
    if int8:
        blobs.append(rq1_channel_words(mults, rshifts, zps).tobytes())
    offsets = np.cumsum([0] + [len(b) for b in blobs])
    gdma = [_ddr_to_lmem(0, x), _ddr_to_lmem(WEIGHT_BASE, wt), _ddr_to_lmem(WEIGHT_BASE + int(offsets[1]), bt)]
    if int8:
        gdma.append(_ddr_to_lmem(WEIGHT_BASE + int(offsets[2]), qt))
    loads = len(gdma)
    gdma.append(_dma(out.addr + CHIP.core.gdma_lmem_base_address, Y_ADDR, out.shape, out.strides, _row_major(out.shape),
                     act, cmd_id_dep=2))
    conv_ins = ConvTiu(res0_addr=conv.addr, res0_n=N, res0_c=OC, res0_h=H, res0_w=W, opd0_addr=x.addr, opd0_c=IC,
                       opd0_h=H, opd0_w=W, opd1_addr=wt.addr, opd1_h=3, opd1_w=3, opd2_addr=bt.addr, opt_opd2_const=0,
                       opd0_up_pad=1, opd0_dn_pad=1, opd0_lf_pad=1, opd0_rt_pad=1, opt_opd0_prec=int(act),
                       opt_opd1_prec=int(act), opt_opd2_prec=int(acc), opt_res0_prec=int(acc), weight_ic_block=block,
                       cmd_id_dep=loads)
    shape = dict(res0_addr=out.addr, res0_n=N, res0_c=OC, res0_h=H, res0_w=W, opd0_addr=conv.addr)
    if int8:
        second = RqDqTiu(op="rq1", **shape, opt_opd1_const=0, opd1_addr=qt.addr, opd2_n_str=MODE, cmd_id_dep=loads)
    else:
        second = ArTiu(op="mul", **shape, opd1_addr=int(np.float32(2.0 ** -11).view(np.uint32)), opt_opd1_const=1,
                       opt_res0_prec=int(Prec.FP16))
    image = b"".join(blobs)
    tensors = {
        "x": DdrTensor("x", 0, (N, IC, H, W), act.dtype_name, "input", N * IC * H * W * act.bytes),
        "params": DdrTensor("params", WEIGHT_BASE, (len(image),), "int8", "weight", len(image)),
        "y": DdrTensor("y", Y_ADDR, out.shape, act.dtype_name, "output", int(np.prod(out.shape)) * act.bytes),
    }
    memory = MemoryPlan(tensors=tensors, weight_base=WEIGHT_BASE, weight_image=image,
                        ddr_bytes_used=Y_ADDR + tensors["y"].nbytes)
    return Program(chip=CHIP, tiu=[conv_ins, second], gdma=gdma, tiu_layers=["conv", "requant"],
                   gdma_layers=["conv"] * loads + ["requant"], memory=memory, model_name=f"int8_layer_{dtype}",
                   issue_order="D" * loads + "BBD")


def reference(x: np.ndarray, seed: int = 1) -> np.ndarray:
    """numpy int64: conv 3x3 pad 1 + bias, then zp + round_half_away(acc * m / 2**rshift), saturated to int8."""
    weight, bias, mults, rshifts, zps = parameters(seed)
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    acc = np.zeros((N, OC, H, W), np.int64)
    for i in range(3):
        for j in range(3):
            acc += np.einsum("nihw,oi->nohw", xp[:, :, i:i + H, j:j + W], weight[:, :, i, j])
    acc += bias.reshape(1, -1, 1, 1)
    v = acc * mults.reshape(1, -1, 1, 1)
    r = rshifts.reshape(1, -1, 1, 1)
    rounded = np.sign(v) * ((np.abs(v) + (np.int64(1) << (r - 1))) >> r)
    return np.clip(rounded + zps.reshape(1, -1, 1, 1), -128, 127).astype(np.int8)


def test_int8_program_runs_exactly_and_costs_less_than_fp16():
    x = np.random.default_rng(5).integers(-128, 128, size=(N, IC, H, W)).astype(np.int8)
    program = build("int8")
    got = run(program, {"x": x})["y"]
    want = reference(x)
    assert got.dtype == np.int8 and (got == want).all()
    assert len(np.unique(want)) > 50 and (want == 127).mean() < 0.05       # a real spread, little saturation
    int8_ps, fp16_ps = simulate(program).total_ps, simulate(build("fp16")).total_ps
    assert int8_ps < fp16_ps
    # the conv alone: 16 x ceil(96/64) x ceil(256/4) steps of 9 cycles at int8, 18 at fp16
    conv8, conv16 = (simulate(p) for p in (program, build("fp16")))
    t8 = int(conv8.times["end"][conv8.index("tiu", 1)] - conv8.times["start"][conv8.index("tiu", 1)])
    t16 = int(conv16.times["end"][conv16.index("tiu", 1)] - conv16.times["start"][conv16.index("tiu", 1)])
    assert t16 - t8 == 2 * 64 * 9 * 1000


def test_uint8_tensors_in_ddr_requantise_unsigned_to_unsigned():
    """A uint8 DDR input (dtype "uint8") loaded as 1-byte INT8 data, quant.rq1 reading it unsigned (opt_opd0_sign
    0) into uint8 (opt_opd2_sign 0) with per-channel parameters, stored to a uint8 output: y = clip(zp +
    round_half_away((x - 0) * m / 2**r), 0, 255)."""
    c, hw = 70, (3, 5)
    x_t = local(flat(3, 0), (1, c, *hw), Prec.INT8)
    q_t = local(flat(3, 0x1000), (1, c, 1, 2), Prec.INT32, "compact")
    y_t = local(flat(3, 0x2000), (1, c, *hw), Prec.INT8)
    rng = np.random.default_rng(9)
    mults, rshifts, zps = rng.integers(1 << 30, 1 << 31, size=c), rng.integers(30, 33, size=c), rng.integers(0, 40, size=c)
    words = rq1_channel_words(mults, rshifts, zps)
    gdma = [_ddr_to_lmem(0, x_t), _ddr_to_lmem(WEIGHT_BASE, q_t),
            _dma(y_t.addr + CHIP.core.gdma_lmem_base_address, Y_ADDR, y_t.shape, y_t.strides, _row_major(y_t.shape),
                 Prec.INT8, cmd_id_dep=1)]
    rq = RqDqTiu(op="rq1", res0_addr=y_t.addr, res0_n=1, res0_c=c, res0_h=hw[0], res0_w=hw[1], opd0_addr=x_t.addr,
                 opt_opd0_prec=int(Prec.INT8), opt_opd0_sign=0, opt_opd2_sign=0, opt_opd1_const=0,
                 opd1_addr=q_t.addr, opd2_n_str=MODE, cmd_id_dep=2)
    size = c * hw[0] * hw[1]
    tensors = {"x": DdrTensor("x", 0, (1, c, *hw), "uint8", "input", size),
               "q": DdrTensor("q", WEIGHT_BASE, words.shape, "int32", "weight", words.nbytes),
               "y": DdrTensor("y", Y_ADDR, (1, c, *hw), "uint8", "output", size)}
    program = Program(chip=CHIP, tiu=[rq], gdma=gdma, tiu_layers=["rq"], gdma_layers=["rq"] * 3,
                      memory=MemoryPlan(tensors=tensors, weight_base=WEIGHT_BASE, weight_image=words.tobytes(),
                                        ddr_bytes_used=Y_ADDR + size), model_name="uint8_rq", issue_order="DDBD")
    x = rng.integers(0, 256, size=(1, c, *hw)).astype(np.uint8)
    got = run(program, {"x": x})["y"]
    v = x.astype(np.int64) * mults.reshape(1, -1, 1, 1)
    r = rshifts.reshape(1, -1, 1, 1)
    want = np.clip(((v + (np.int64(1) << (r - 1))) >> r) + zps.reshape(1, -1, 1, 1), 0, 255)
    assert got.dtype == np.uint8 and (got == want).all() and (want > 127).any()
    simulate(program)          # the chunk-bitmap dependencies written above are the ones the IFE derives


def test_int8_program_survives_its_binaries(tmp_path):
    """Written as .BD / .GDMA streams and a manifest, read back: the same instructions and memory plan, and the
    read-back program computes the same int8 output."""
    from tpuflow.codegen import write_program
    from tpuflow.codegen.writer import read_program
    program = build("int8")
    back = read_program(write_program(program, tmp_path / "out", name="int8_layer"))
    assert back.tiu == program.tiu and back.gdma == program.gdma
    x = np.random.default_rng(6).integers(-128, 128, size=(N, IC, H, W)).astype(np.int8)
    assert (run(back, {"x": x})["y"] == reference(x)).all()
