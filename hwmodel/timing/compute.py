"""Compute cost of TIU and TILE instructions: the TPUPerf-derived cycle formulas of hardware.md.

TIU (cycles of the TIU clock; `eu` = vector EU elements per lane of the dtype, `ic`/`ohow` =
chip.compute.cube_ic_per_cycle / cube_ohow_per_cycle of the dtype, `L` = lanes):

  CONV  steps = N * ceil(Cout/L) * ceil(Ho*Wo/ohow);  body = steps * (kh*kw*ceil(Cin/ic)*s + psum)
        psum = tiu.psum_add_delay_cycles when opt_res_add, else 0
  MM2   steps = ceil(M/L) * ceil(N/ohow);            body = steps * (ceil(K/ic)*s + bias + psum)
        s = chip.compute.cube_cycles_per_step of the dtype (1 = nominal peak; BM1684X fp32 runs at 2)
        bias = 1 when the bias row is a tensor (hardware.md's MM2.nn term); nn/nt/tt differ in startup
  MM (mm.normal, read from tpu-mlir streams only)   steps = M * ceil(res0_c/L) * ceil(res0_w/eu);
        body = steps * (K + acc + bias), startup tiu.mm_startup_cycles (hardware.md, TPUPerf MM v1);
        acc / bias = 1 with opt_res_add / a bias tensor (tpu-mlir 1.30.2 compiler_profile: 512 / 520 / 528)
  AR, LIN, CMP, SFU, CW/BC, RQ/DQ   body = N * ceil(C/L) * ceil(H*W/eu) * passes  (of res0's shape)
        passes: SFU taylor = opd1_n terms, taylor_4x = ceil(opd1_n/4), otherwise 1
  PorD  body = N * ceil(C/L) * ceil(Ho*Wo/eu) * kh*kw
  SG    body = N * ceil(C/L) * H * ceil(W/eu) * eu: one element per lane and cycle, W rounded up to the EU
        width of the table's precision; startup tiu.sg_startup_cycles (tpu-mlir python/debugger/target_1688/
        opdef.py sg_op: ops = n * align(c, NPU_NUM) * h * align(w, EU_NUM), alg_cycle = ops / NPU_NUM,
        initial_cycle 11; bank_conflict_cycle 0, so pe_s_gather_d1coor and _hzd cost the same)
  SYS   body = 0

cycles = startup (tiu.startup_cycles of the class) + body + bank-conflict bubbles (see banks.py).
The cube pipe (CONV, MM2) consumes `ic` input channels for `ohow` output pixels on each lane every
`s` cycles, so its MACs/cycle never exceed chip.peak_macs_per_cycle (the roofline bound holds).
fp32 "cube" work runs at ic = 1, ohow = 16 (the vector EU), as the chip files state. The integer form
(int8 / uint8 operands, int32 result) runs at the int8 rates (`ic` of the opd0 precision, 1 byte).
RQ/DQ (RqDqTiu) is a vector-pipe class like AR: `eu` of its widest operand (an int32 input: 16 per
lane), compute latency tiu.compute_latency_cycles "4.*" (hardware.md: RQDQ 8); hardware.md gives no
start-up figure for RQ/DQ, so it pays AR's (RQDQ_STARTUP_KEY, a tpuflow assumption).

TILE (cycles of the tile clock): TMATMUL/TGEMV do ceil(M/fm)*ceil(N/fn)*ceil(K/K0) fractal steps
of fm*fn*K0 MACs at tile.tile_macs_per_cycle (K0 = k_fractal_bytes / element bytes; TGEMV M = 1):
cycles = block_overhead + fill_latency + ceil(steps*fm*fn*K0 / macs_per_cycle). ACCCVT drains
Row*Col*4 bytes at acccvt_bytes_per_cycle: block_overhead + ceil(Row*Col*4 / bpc). TPUSH: overhead.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpuflow.chip import ChipConfig
from tpuflow.isa import (AccCvt, ArTiu, CmpTiu, ConvTiu, CwBcTiu, Instruction, LinTiu, Mm2Tiu, MmTiu, PordTiu,
                         Prec, RqDqTiu, SfuTiu, SgTiu, SysTiu, TiuInstruction, TImg2Col, TMatmul, TMove, TPush)
from tpuflow.isa.tile import DT_BYTES

CUBE, VECTOR = "cube", "vector"
_DTYPE_OF_BYTES = {1: "int8", 2: "fp16", 4: "fp32"}


def chip_dtype(prec: int) -> str:
    """Chip-table dtype of a descriptor precision code (int16 counts as a 16-bit type, int32 as 32-bit)."""
    p = Prec(prec)
    if p is Prec.BF16:
        return "bf16"
    return _DTYPE_OF_BYTES[p.bytes]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class TiuWork:
    """What the DPC needs to time one TIU instruction (bubbles are added by banks.py)."""

    pipe: str            # CUBE or VECTOR
    startup: int         # fixed cycles in COMPUTE before the body
    steps: int           # body steps (cube: output tiles; vector: EU vectors)
    cycles_per_step: int
    latency: int         # compute pipeline latency (drain) from tiu.compute_latency_cycles

    @property
    def body(self) -> int:
        return self.steps * self.cycles_per_step


def vector_dtype(instr: TiuInstruction) -> str:
    sizes = [Prec(getattr(instr, f)).bytes for f in ("opt_res0_prec", "opt_opd0_prec") if hasattr(instr, f)]
    widest = max(sizes)
    if widest == 2 and getattr(instr, "opt_res0_prec", None) == Prec.BF16:
        return "bf16"
    return _DTYPE_OF_BYTES[widest]


def _conv(instr: ConvTiu, chip: ChipConfig) -> tuple[int, int]:
    dt = chip_dtype(instr.opt_opd0_prec)
    ic, ohow = chip.compute.cube_ic_per_cycle[dt], chip.compute.cube_ohow_per_cycle[dt]
    steps = instr.res0_n * cdiv(instr.res0_c, chip.lanes) * cdiv(instr.res0_h * instr.res0_w, ohow)
    psum = chip.tiu.psum_add_delay_cycles if instr.opt_res_add else 0
    return steps, instr.opd1_h * instr.opd1_w * cdiv(instr.opd0_c, ic) * chip.compute.cube_cycles_per_step[dt] + psum


def _mm2(instr: Mm2Tiu, chip: ChipConfig) -> tuple[int, int]:
    dt = chip_dtype(instr.opt_opd0_prec)
    ic, ohow = chip.compute.cube_ic_per_cycle[dt], chip.compute.cube_ohow_per_cycle[dt]
    m, n, k = instr.mnk
    bias = 0 if instr.opt_opd2_const else 1
    psum = chip.tiu.psum_add_delay_cycles if instr.opt_res_add else 0
    return cdiv(m, chip.lanes) * cdiv(n, ohow), cdiv(k, ic) * chip.compute.cube_cycles_per_step[dt] + bias + psum


def _mm_normal(instr: MmTiu, chip: ChipConfig) -> tuple[int, int]:
    """mm.normal: each lane's EU takes eu of its res0_w columns per cycle, one k (an L element broadcast
    to every lane) at a time, for each row of L."""
    m, _, k = instr.mnk
    eu = chip.eu_count(vector_dtype(instr))
    extra = (1 if instr.opt_res_add else 0) + (0 if instr.opt_opd2_const else 1)
    return m * cdiv(instr.res0_c, chip.lanes) * cdiv(instr.res0_w, eu), k + extra


def _passes(instr: TiuInstruction) -> int:
    if isinstance(instr, SfuTiu):
        if instr.op == "taylor":
            return max(1, instr.opd1_n)
        if instr.op == "taylor_4x":
            return max(1, cdiv(instr.opd1_n, 4))
    return 1


def _vector_steps(instr: TiuInstruction, chip: ChipConfig, dtype: str | None = None) -> int:
    n, c, h, w = instr.res0_shape
    eu = chip.eu_count(dtype or vector_dtype(instr))
    return n * cdiv(c, chip.lanes) * cdiv(h * w, eu)


def _pord_dtype(instr: PordTiu) -> str:
    """The EU type of a PorD instruction: an integer input's own (int8 depthwise into int32 sums: tpu-mlir's
    cycle model of the PorD unit, pord_op.alg_cycle, divides by EU_NUM of operand 0's dtype), else the
    widest of input and result, as every vector instruction (float estimates unchanged)."""
    prec = Prec(instr.opt_opd0_prec)
    return "int8" if not prec.is_float and prec.bytes == 1 else vector_dtype(instr)


RQDQ_STARTUP_KEY = "ar"      # RQ/DQ pays AR's start-up (module docstring: no public RQ/DQ figure)
_STARTUP_KEY = {ArTiu: "ar", SfuTiu: "sfu", LinTiu: "lin", CmpTiu: "cmp", CwBcTiu: "cwbc", PordTiu: "pord",
                ConvTiu: "conv", SysTiu: "sys", RqDqTiu: RQDQ_STARTUP_KEY}


def tiu_work(instr: TiuInstruction, chip: ChipConfig) -> TiuWork:
    t = chip.tiu
    latency = t.compute_latency(instr.TSK_TYP, instr.tsk_eu_typ)
    if isinstance(instr, ConvTiu):
        steps, per = _conv(instr, chip)
        return TiuWork(CUBE, t.startup_cycles["conv"], steps, per, latency)
    if isinstance(instr, Mm2Tiu):
        steps, per = _mm2(instr, chip)
        return TiuWork(CUBE, t.startup_cycles[f"mm2_{instr.op}"], steps, per, latency)
    if isinstance(instr, MmTiu):
        return TiuWork(CUBE, t.mm_startup_cycles, *_mm_normal(instr, chip), latency)
    if isinstance(instr, SgTiu):
        eu = chip.eu_count(chip_dtype(instr.opt_opd0_prec))
        return TiuWork(VECTOR, t.sg_startup_cycles, _vector_steps(instr, chip, chip_dtype(instr.opt_opd0_prec)), eu,
                       latency)
    startup = t.startup_cycles[_STARTUP_KEY[type(instr)]]
    if isinstance(instr, SysTiu):
        return TiuWork(VECTOR, startup, 0, 1, latency)
    if isinstance(instr, PordTiu):
        steps = _vector_steps(instr, chip, _pord_dtype(instr))
        return TiuWork(VECTOR, startup, steps, instr.opd1_h * instr.opd1_w, latency)
    return TiuWork(VECTOR, startup, _vector_steps(instr, chip), _passes(instr), latency)


def tiu_macs(instr: Instruction) -> int:
    """Multiply-accumulates of a cube instruction (CONV, MM2), 0 for the others."""
    if isinstance(instr, ConvTiu):
        return (instr.res0_n * instr.res0_c * instr.res0_h * instr.res0_w
                * instr.opd0_c * instr.opd1_h * instr.opd1_w)
    if isinstance(instr, (Mm2Tiu, MmTiu)):
        m, n, k = instr.mnk
        return m * n * k
    return 0


def tile_macs(instr: Instruction) -> int:
    if isinstance(instr, TMatmul):
        return (1 if instr.is_gemv else instr.m) * instr.n * instr.k
    return 0


def tile_cycles(instr: Instruction, chip: ChipConfig) -> int:
    """Cycles (tile clock) of one TILE block."""
    tc = chip.tile
    if isinstance(instr, TMatmul):
        k0 = max(1, tc.k_fractal_bytes // DT_BYTES[instr.dt])
        m = 1 if instr.is_gemv else instr.m
        steps = cdiv(m, tc.fractal_m) * cdiv(instr.n, tc.fractal_n) * cdiv(instr.k, k0)
        macs_per_cycle = chip.compute.tile_macs_per_cycle[chip_dtype(_TILE_PREC[instr.dt])]
        return tc.block_overhead_cycles + tc.fill_latency_cycles + cdiv(steps * tc.fractal_m * tc.fractal_n * k0,
                                                                          macs_per_cycle)
    if isinstance(instr, AccCvt):
        return tc.block_overhead_cycles + cdiv(instr.row * instr.col * 4, tc.acccvt_bytes_per_cycle)
    if isinstance(instr, (TPush, TMove, TImg2Col)):      # TMOVE / TIMG2COL: the hand-over to the port / expansion path
        return tc.block_overhead_cycles
    raise TypeError(f"not a TILE block: {type(instr).__name__}")


_TILE_PREC = {"FP32": Prec.FP32, "FP16": Prec.FP16, "BF16": Prec.BF16, "S8": Prec.INT8, "S32": Prec.INT32}
