"""TIU (compute) instructions of the SG2260 family, one frozen dataclass per descriptor kind.

Conventions shared by every kind (the contract between lowering, functional model and timing):

* LMEM addresses (`*_addr`) are flat: lane * lmem_bytes_per_lane + per-lane offset.
* An operand `X` in {res0, opd0, opd1, opd2} is an (N, C, H, W) tensor; its strides come from
  `short_X_str` (StrideMode: 0 aligned, 1 compact, 3 free = `X_n_str/X_c_str/X_h_str/X_w_str`,
  in elements, 0 broadcasts) and its precision from `opt_X_prec` (Prec code).
* `opt_X_const = 1` makes operand X a scalar whose value is the 32-bit `X_addr` field: fp32 bits
  for float precisions, a signed 32-bit integer otherwise.
* `cmd_id_dep`: this instruction starts once GDMA has completed that cmd_id (0 = no wait).
* Float arithmetic is done in fp32 and rounded to the result precision (round to nearest even).

Integer forms (issue 15). Sources: tpu-mlir's SG2260 (bm1690) debugger, python/debugger/target_1690/
opparam.py (sCONV_converter, sMM2_converter, sRQ_sDQ_converter), and its reference arithmetic,
lib/Support/MathUtils.cpp (RightShiftRound, saturate), lib/Dialect/Tpu/Interfaces/Common/
RequantIntAxis.cpp, RequantInt.cpp, RequantFp.cpp, and the two-word per-channel requant packing of
its BM1684X-family ConvLowering::LoweringINT8 (the non-BM1684X branch).

* An integer operand X is read as signed when opt_X_sign = 1, unsigned when 0 (tpu-mlir reads every
  operand as get_dtype(opt_X_prec, opt_X_sign)); ConvTiu / Mm2Tiu default the flag to signed.
* CONV / MM2 with INT8 opd0 and opd1: exact products accumulated in int32 with the INT32 bias
  (opd2, signed) and, with opt_res_add, the INT32 res0; res0 is INT32. Accumulation wraps in two's
  complement (INT32_ACCUMULATION_WRAPS, a tpuflow assumption: no public figure; 2**31 / 2**14 =
  131072 int8 products are needed to overflow). opt_relu clamps the int32 sum at zero. An INT8 res0
  needs the cube's fused requantisation (opt_rq, parameters in TGCR registers written by
  SYS_TR_ACC), which tpuflow does not model: requantise with RqDqTiu instead.
* Zero points: the input's is the conv's padding value (ConvTiu.opd3_addr) and otherwise folds into
  the int32 bias; a kernel zero point exists only inside opt_rq (sCONV's opd4 / TGCR register 5, "kzp"),
  so tpuflow's weights are symmetric (zero point 0). sym_range (symmetric saturation) is never set.
* Quantized tensors use 1-byte elements everywhere: LMEM layouts (64 int8 per EU vector, 64-channel
  cube weight blocks, ConvTiu.ALIGNED_IC_BLOCK) and DMAs (src_data_format INT8).
* RQ / DQ (tsk_typ 4): RqDqTiu below.
* SG per-element gather (tsk_typ 6, a 256-entry int8 lookup table): SgTiu below.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from tpuflow.isa import messages
from tpuflow.isa.base import (TILE_WAIT_TAG, Accesses, Engine, Instruction, LocalTensor, Prec, StrideMode,
                              lmem_ranges, operand_strides)

if TYPE_CHECKING:
    from tpuflow.chip import ChipConfig

FP32 = int(Prec.FP32)
INT8 = int(Prec.INT8)
INT32 = int(Prec.INT32)
INT32_ACCUMULATION_WRAPS = True     # tpuflow assumption (module docstring): int32 sums wrap, never saturate


def normalize_signs(instr, prefixes) -> None:
    """Set every opt_X_sign left at None to the default: 1 (signed) for an integer precision, 0 for a
    float one (the value tpu-mlir's decoder needs, tests/codegen/data)."""
    for prefix in prefixes:
        name = f"opt_{prefix}_sign"
        if getattr(instr, name) is None:
            object.__setattr__(instr, name, int(not Prec(getattr(instr, f"opt_{prefix}_prec")).is_float))


class TiuInstruction(Instruction):
    ENGINE: ClassVar[Engine] = Engine.TIU
    WAIT_FIELDS: ClassVar[dict] = {Engine.GDMA: "cmd_id_dep"}
    TSK_TYP: ClassVar[int]

    @property
    def tsk_eu_typ(self) -> int:
        return self.OPS[self.op]  # type: ignore[attr-defined]

    def local(self, prefix: str, shape, chip: "ChipConfig") -> LocalTensor:
        """The LMEM tensor of operand `prefix` with the given (N, C, H, W) shape."""
        addr = getattr(self, f"{prefix}_addr")
        prec = Prec(getattr(self, f"opt_{prefix}_prec"))
        mode = getattr(self, f"short_{prefix}_str", StrideMode.ALIGNED)
        given = tuple(getattr(self, f"{prefix}_{d}_str", 0) for d in "nchw")
        strides = operand_strides(mode, shape, given, prec, chip, addr)
        return LocalTensor(addr, tuple(shape), strides, prec)

    def is_const(self, prefix: str) -> bool:
        return bool(getattr(self, f"opt_{prefix}_const", 0))

    def _tensor_ranges(self, chip, operands) -> tuple:
        out = []
        for prefix, shape in operands:
            if not self.is_const(prefix):
                out.extend(self.local(prefix, shape, chip).ranges(chip))
        return tuple(out)

    # subclasses list (prefix, shape) of what they read and write
    def read_operands(self, chip) -> list[tuple[str, tuple]]:
        return []

    def write_operands(self, chip) -> list[tuple[str, tuple]]:
        return []

    def accesses(self, chip: "ChipConfig") -> Accesses:
        return Accesses(lmem_reads=self._tensor_ranges(chip, self.read_operands(chip)),
                        lmem_writes=self._tensor_ranges(chip, self.write_operands(chip)))

    @property
    def res0_shape(self) -> tuple[int, int, int, int]:
        return (self.res0_n, self.res0_c, self.res0_h, self.res0_w)  # type: ignore[attr-defined]

    def __post_init__(self) -> None:
        self._check_op()


@dataclass(frozen=True)
class ConvTiu(TiuInstruction):
    """conv.normal: res0[n,oc,oh,ow] = bias[oc] + sum_{ic,kh,kw} in[n,ic,oh*sy+kh*dy-up, ow*sx+kw*dx-lf]
    * w[oc,ic,kh,kw] (zero padding; sy = res_op_y_str, dy = opd1_y_ins0 + 1).

    opd0: input (res0_n, opd0_c, opd0_h, opd0_w). opd1: weights, an LMEM tensor
    (1, res0_c, 1, ceil(opd0_c / B) * B * opd1_h * opd1_w) in compact layout, B = weight_ic_block:
    per output channel the input channels in blocks of B, element order [ic // B][kh][kw][ic % B]
    (channels past opd0_c are padding, never read); B = 1 is the order [ic][kh][kw]. Output
    channel oc on lane (start + oc) % lanes. The short descriptor (sCONV) means
    B = ALIGNED_IC_BLOCK[opt_opd0_prec], the cube's input-channel-aligned layout. opd2: bias (1, res0_c, 1, 1) compact (or a scalar
    when opt_opd2_const). opt_res_add accumulates into res0 (partial sums over input channels);
    opt_relu clamps at zero after the sum. Products are accumulated in fp32.

    Integer form (module docstring, "Integer forms"): opd0 and the weights INT8, each signed or unsigned by
    opt_opd0_sign / opt_opd1_sign; the int32 bias (opt_opd2_prec INT32) and res0 INT32.
    opd3_addr is the padding value (the descriptor's constant opd3, opt_opd3_const = 1, read in opd0's
    precision: tpu-mlir sCONV_converter): 0 pads with zeros; an integer input may pad with any value
    of its range, e.g. its zero point, as tpu-mlir pads asymmetric int8 inputs. It is kept as the field's
    32 bits (a negative value given is stored two's complement, as PordTiu's pooling pads are written);
    a float input pads with zeros only (a non-zero float pad value is not modelled).
    """

    TSK_TYP: ClassVar[int] = 0
    PREFIX: ClassVar[str] = "conv"
    OPS: ClassVar[dict] = {"normal": 0}
    res0_addr: int
    res0_n: int
    res0_c: int
    res0_h: int
    res0_w: int
    opd0_addr: int
    opd0_c: int
    opd0_h: int
    opd0_w: int
    opd1_addr: int
    opd1_h: int
    opd1_w: int
    opd2_addr: int = 0
    opt_opd2_const: int = 1
    op: str = "normal"
    cmd_id_dep: int = 0
    opt_res0_prec: int = FP32
    opt_opd0_prec: int = FP32
    opt_opd1_prec: int = FP32
    opt_opd2_prec: int = FP32
    short_res0_str: int = 0
    res0_n_str: int = 0
    res0_c_str: int = 0
    res0_h_str: int = 0
    res0_w_str: int = 0
    short_opd0_str: int = 0
    opd0_n_str: int = 0
    opd0_c_str: int = 0
    opd0_h_str: int = 0
    opd0_w_str: int = 0
    opd0_up_pad: int = 0
    opd0_dn_pad: int = 0
    opd0_lf_pad: int = 0
    opd0_rt_pad: int = 0
    res_op_x_str: int = 1
    res_op_y_str: int = 1
    opd1_x_ins0: int = 0
    opd1_y_ins0: int = 0
    opt_relu: int = 0
    opt_res_add: int = 0
    weight_ic_block: int = 1
    opt_opd0_sign: int | None = None    # None: signed for an integer precision (see normalize_signs)
    opt_opd1_sign: int | None = None
    opd3_addr: int | None = None        # the padding value's 32 bits; None: 0 (zero padding)

    short_opd1_str: ClassVar[int] = StrideMode.COMPACT
    short_opd2_str: ClassVar[int] = StrideMode.COMPACT
    # input channels per weight block of the cube-aligned layout, per opd0 precision (SG2260 / bm1690:
    # tpu-mlir 1.30.2 python/debugger/target_1690/memmap.py CUBE_NUM, from the cmodel's
    # tpu_get_ic_parallel(1) = 64 one-byte channels; fp32 and int32 run one channel at a time)
    ALIGNED_IC_BLOCK: ClassVar[dict] = {int(Prec.INT8): 64, int(Prec.FP16): 32, int(Prec.BF16): 32,
                                        int(Prec.INT16): 32, FP32: 1, int(Prec.INT32): 1}

    def __post_init__(self) -> None:
        super().__post_init__()
        normalize_signs(self, ("opd0", "opd1"))
        object.__setattr__(self, "opd3_addr", (self.opd3_addr or 0) & 0xFFFFFFFF)
        if self.weight_ic_block < 1:
            raise ValueError(f"conv weight_ic_block must be >= 1, got {self.weight_ic_block}")

    @property
    def pad_value(self) -> int:
        """The padding value of an integer input (opd3_addr's 32 bits as a signed integer)."""
        return (self.opd3_addr ^ 0x80000000) - 0x80000000

    @property
    def weight_ic_padded(self) -> int:
        """Input channels per output channel in the weight layout (opd0_c rounded up to the block)."""
        return -(-self.opd0_c // self.weight_ic_block) * self.weight_ic_block

    def weight_shape(self):
        return (1, self.res0_c, 1, self.weight_ic_padded * self.opd1_h * self.opd1_w)

    def read_operands(self, chip):
        ops = [("opd0", (self.res0_n, self.opd0_c, self.opd0_h, self.opd0_w)),
               ("opd1", self.weight_shape()), ("opd2", (1, self.res0_c, 1, 1))]
        if self.opt_res_add:
            ops.append(("res0", self.res0_shape))
        return ops

    def write_operands(self, chip):
        return [("res0", self.res0_shape)]


@dataclass(frozen=True)
class Mm2Tiu(TiuInstruction):
    """mm2.nn / mm2.nt / mm2.tt: matrices are (1, rows, 1, cols) tensors in aligned layout,
    rows across lanes. nn: opd0 = L (M x K), opd1 = R (K x N). nt: opd1 holds R transposed
    (N x K). tt: opd0 holds L transposed (K x M) and opd1 holds R transposed (N x K).
    res0 = L @ R (M x N) (+ res0 when opt_res_add) (+ bias row opd2 (1,1,1,N) read by every lane,
    unless opt_opd2_const), then relu if opt_relu. fp32 accumulation. Lanes cannot read each
    other's LMEM: output row r (on lane (res0 start + r) % lanes) reads the bias row from its own
    lane at opd2's per-lane offset, so the lowering broadcasts the row to every lane it uses.

    Integer form (module docstring, "Integer forms"): L and R INT8, each signed or unsigned by opt_opd0_sign /
    opt_opd1_sign; the bias row INT32 (opt_opd2_prec) and res0 INT32.
    """

    TSK_TYP: ClassVar[int] = 2
    PREFIX: ClassVar[str] = "mm2"
    OPS: ClassVar[dict] = {"nn": 4, "nt": 5, "tt": 6}
    op: str
    res0_addr: int
    res0_c: int
    res0_w: int
    opd0_addr: int
    opd0_c: int
    opd0_w: int
    opd1_addr: int
    opd1_c: int
    opd1_w: int
    opd2_addr: int = 0
    opt_opd2_const: int = 1
    cmd_id_dep: int = 0
    opt_res0_prec: int = FP32
    opt_opd0_prec: int = FP32
    opt_opd1_prec: int = FP32
    opt_opd2_prec: int = FP32
    opt_res_add: int = 0
    opt_relu: int = 0
    opt_opd0_sign: int | None = None    # None: signed for an integer precision (see normalize_signs)
    opt_opd1_sign: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        normalize_signs(self, ("opd0", "opd1"))

    @property
    def mnk(self) -> tuple[int, int, int]:
        k = self.opd0_c if self.op == "tt" else self.opd0_w
        return self.res0_c, self.res0_w, k

    def read_operands(self, chip):
        ops = [("opd0", (1, self.opd0_c, 1, self.opd0_w)), ("opd1", (1, self.opd1_c, 1, self.opd1_w))]
        if not self.opt_opd2_const:
            ops.append(("opd2", (1, 1, 1, self.res0_w)))
        if self.opt_res_add:
            ops.append(("res0", (1, self.res0_c, 1, self.res0_w)))
        return ops

    def write_operands(self, chip):
        return [("res0", (1, self.res0_c, 1, self.res0_w))]

    def accesses(self, chip):
        acc = super().accesses(chip)
        if self.opt_opd2_const:
            return acc
        # the bias row is read by every lane: widen its range to all lanes
        bias = self.local("opd2", (1, 1, 1, self.res0_w), chip).ranges(chip)[0]
        from tpuflow.isa.base import LmemRange
        wide = LmemRange(0, chip.lanes, bias.lo, bias.hi)
        reads = tuple(r for r in acc.lmem_reads if r != bias) + (wide,)
        return Accesses(lmem_reads=reads, lmem_writes=acc.lmem_writes)


@dataclass(frozen=True)
class MmTiu(TiuInstruction):
    """mm.normal (tpu-mlir's sMM), a read-only form: tpuflow reads it from vendor streams, never emits it
    (not in TIU_KINDS, no encoding, no functional model). A matrix of block width `w` is the aligned
    (rows, ceil(cols/w), 1, w) tensor: row r is the N index, column j on channel j // w (its lane),
    at w offset j % w. opd0 = L as stored, rows opd0_n, columns K' = opd0_w * (opd0_c - 1) + opd1_w
    (opd1_w is the width of its last block); with opt_left_tran L is its transpose (M = K', K =
    opd0_n), else M = opd0_n, K = K'. opd1 = R (K x N), res0 (M x N) and the bias row opd2 (1 x N)
    all have block width res0_w, N = res0_c * res0_w: the N columns sit on the lanes, and each lane
    reads every L[m, k] (broadcast to all lanes). res0 = L @ R (+ res0 when opt_res_add) (+ opd2
    unless opt_opd2_const), then relu if opt_relu; L and R in opt_opd0_prec. tpu-mlir's decoder knows
    two forms: fp32 (opd2 an fp32 bias) and, for any other precision, integer (opd2 an int8 shift); no
    16-bit float form. Facts: tpu-mlir 1.30.2 python/debugger/target_1690/opparam.py (sMM operand
    shapes, layouts, opd2 dtype) and memmap.py (matrix layout).
    """

    TSK_TYP: ClassVar[int] = 2
    PREFIX: ClassVar[str] = "mm"
    OPS: ClassVar[dict] = {"normal": 1}
    op: str
    res0_addr: int
    res0_c: int
    res0_w: int
    opd0_addr: int
    opd0_n: int
    opd0_c: int
    opd0_w: int
    opd1_addr: int
    opd1_w: int
    opd2_addr: int = 0
    opt_opd0_const: int = 0
    opt_opd2_const: int = 1
    opt_left_tran: int = 0
    cmd_id_dep: int = 0
    opt_res0_prec: int = FP32
    opt_opd0_prec: int = FP32
    opt_res_add: int = 0
    opt_relu: int = 0

    @property
    def mnk(self) -> tuple[int, int, int]:
        stored_cols = self.opd0_w * (self.opd0_c - 1) + self.opd1_w
        m, k = (stored_cols, self.opd0_n) if self.opt_left_tran else (self.opd0_n, stored_cols)
        return m, self.res0_c * self.res0_w, k

    @property
    def opt_opd1_prec(self) -> int:
        return self.opt_opd0_prec  # R is read in L's precision

    @property
    def opt_opd2_prec(self) -> int:
        return self.opt_opd0_prec

    def read_operands(self, chip):
        m, _, k = self.mnk
        ops = [("opd1", (k, self.res0_c, 1, self.res0_w))]
        if not self.opt_opd0_const:
            ops.insert(0, ("opd0", (self.opd0_n, self.opd0_c, 1, self.opd0_w)))
        if not self.opt_opd2_const:
            ops.append(("opd2", (1, self.res0_c, 1, self.res0_w)))
        if self.opt_res_add:
            ops.append(("res0", (m, self.res0_c, 1, self.res0_w)))
        return ops

    def write_operands(self, chip):
        return [("res0", (self.mnk[0], self.res0_c, 1, self.res0_w))]


@dataclass(frozen=True)
class ArTiu(TiuInstruction):
    """arith.*: res0 = op(opd0, opd1) elementwise over res0's (N, C, H, W); opd0/opd1 share
    res0's shape with their own strides (stride 0 broadcasts within a lane).

    mul, add, sub, max, min, div: float or integer arithmetic. and/or/xor/not: bitwise on the
    stored bits. logic_shift: integer opd0 shifted left by opd1 (right if negative), logical.
    arith_shift: the same, arithmetic right shift. copy: res0 = opd0. abs: |opd0|.
    cast: opd0 converted to res0's precision; float->int rounds by opd2 (a constant):
    0 nearest-even, 1 half away from zero, 2 toward zero, 3 down (floor), 4 up (ceil).
    Precisely: float ops run in fp32 when any operand or res0 is a float; integer results of
    arithmetic wrap to res0's width, integer div truncates toward zero (x / 0 = 0); cast's
    opd2 mode also rounds float -> narrower float, and cast saturates integer results; copy
    between different precisions converts with mode 0; shifts use opd0's width.
    """

    TSK_TYP: ClassVar[int] = 3
    PREFIX: ClassVar[str] = "arith"
    OPS: ClassVar[dict] = {"mul": 0, "not": 1, "add": 2, "sub": 3, "max": 4, "min": 5,
                           "logic_shift": 6, "and": 7, "or": 8, "xor": 9, "div": 12, "cast": 14,
                           "copy": 19, "arith_shift": 21, "abs": 26}
    UNARY: ClassVar[frozenset] = frozenset({"not", "cast", "copy", "abs"})
    op: str
    res0_addr: int
    res0_n: int
    res0_c: int
    res0_h: int
    res0_w: int
    opd0_addr: int
    opd1_addr: int = 0
    opd2_addr: int = 0
    cmd_id_dep: int = 0
    opt_res0_prec: int = FP32
    opt_opd0_prec: int = FP32
    opt_opd1_prec: int = FP32
    opt_opd0_const: int = 0
    opt_opd1_const: int = 0
    opt_opd2_const: int = 1
    short_res0_str: int = 0
    res0_n_str: int = 0
    res0_c_str: int = 0
    res0_h_str: int = 0
    res0_w_str: int = 0
    short_opd0_str: int = 0
    opd0_n_str: int = 0
    opd0_c_str: int = 0
    opd0_h_str: int = 0
    opd0_w_str: int = 0
    short_opd1_str: int = 0
    opd1_n_str: int = 0
    opd1_c_str: int = 0
    opd1_h_str: int = 0
    opd1_w_str: int = 0

    def read_operands(self, chip):
        ops = [("opd0", self.res0_shape)]
        if self.op not in self.UNARY:
            ops.append(("opd1", self.res0_shape))
        return ops

    def write_operands(self, chip):
        return [("res0", self.res0_shape)]


@dataclass(frozen=True)
class PordTiu(TiuInstruction):
    """pord.depthwise / avgpooling / maxpooling / minpooling over (kh, kw) = (opd1_h, opd1_w)
    windows of opd0 (res0_n, res0_c, opd0_h, opd0_w), strides res_op_y/x_str, dilation
    opd1_y/x_ins0 + 1, pads opd0_*_pad.

    depthwise: res0[n,c,oh,ow] = bias[c] + sum in[n,c,...] * w[c,kh,kw], zero padding; opd1 is the
    weight tensor (1, C, 1, kh*kw) compact, opd2 the bias (1, C, 1, 1) compact (or scalar). Integer
    form: opd0 and opd1 INT8 (signed), opd2 and res0 INT32: the exact integer sum (the PorD unit's
    int8 depthwise, tpu-kernel's tpu_bdc_int8_depthwise2d with an INT32 output and no shift).
    avgpooling: res0 = sum of the window (padding counts as 0) times the scalar opd1
    (opt_opd1_const = 1) in opt_opd1_prec: an fp16 value in the field's low 16 bits, otherwise fp32
    bits (a bf16 scale: the fp32 bits of a bf16 value); the short sPorD implies opt_opd1_prec = opt_opd0_prec. max/minpooling: extreme of the window, padding ignored (a window
    wholly in padding gives -inf / +inf).
    opt_relu clamps at zero.
    """

    TSK_TYP: ClassVar[int] = 1
    PREFIX: ClassVar[str] = "pord"
    OPS: ClassVar[dict] = {"depthwise": 0, "avgpooling": 1, "minpooling": 3, "maxpooling": 4}
    op: str
    res0_addr: int
    res0_n: int
    res0_c: int
    res0_h: int
    res0_w: int
    opd0_addr: int
    opd0_h: int
    opd0_w: int
    opd1_h: int
    opd1_w: int
    opd1_addr: int = 0
    opt_opd1_const: int = 1
    opd2_addr: int = 0
    opt_opd2_const: int = 1
    cmd_id_dep: int = 0
    opt_res0_prec: int = FP32
    opt_opd0_prec: int = FP32
    opt_opd1_prec: int = FP32
    opt_opd2_prec: int = FP32
    short_res0_str: int = 0
    res0_n_str: int = 0
    res0_c_str: int = 0
    res0_h_str: int = 0
    res0_w_str: int = 0
    short_opd0_str: int = 0
    opd0_n_str: int = 0
    opd0_c_str: int = 0
    opd0_h_str: int = 0
    opd0_w_str: int = 0
    opd0_up_pad: int = 0
    opd0_dn_pad: int = 0
    opd0_lf_pad: int = 0
    opd0_rt_pad: int = 0
    res_op_x_str: int = 1
    res_op_y_str: int = 1
    opd1_x_ins0: int = 0
    opd1_y_ins0: int = 0
    opt_relu: int = 0

    short_opd1_str: ClassVar[int] = StrideMode.COMPACT
    short_opd2_str: ClassVar[int] = StrideMode.COMPACT

    def read_operands(self, chip):
        ops = [("opd0", (self.res0_n, self.res0_c, self.opd0_h, self.opd0_w))]
        if self.op == "depthwise":
            ops += [("opd1", (1, self.res0_c, 1, self.opd1_h * self.opd1_w)), ("opd2", (1, self.res0_c, 1, 1))]
        return ops

    def write_operands(self, chip):
        return [("res0", self.res0_shape)]


@dataclass(frozen=True)
class SfuTiu(TiuInstruction):
    """sfu.*: special functions, elementwise over res0's shape, computed in fp32.

    taylor / taylor_4x: res0 = sum_{k < opd1_n} coef[k] * opd0**k (Horner); the fp32 coefficient
    table sits at per-lane offset opd1_addr % lmem_bytes_per_lane in *every* lane (each lane
    reads its own copy). taylor_4x is the 4-elements-per-cycle variant, same result.
    normalize: opd0 = m * 2**e with 1 <= |m| < 2: res0 = m (sign kept), res1 (at res1_addr,
    res0's layout) = e as a float; 0 gives m = 0, e = 0.
    rsqrt: res0 = 1 / sqrt(opd0).
    """

    TSK_TYP: ClassVar[int] = 9
    PREFIX: ClassVar[str] = "sfu"
    OPS: ClassVar[dict] = {"taylor_4x": 12, "taylor": 13, "normalize": 15, "rsqrt": 17}
    op: str
    res0_addr: int
    res0_n: int
    res0_c: int
    res0_h: int
    res0_w: int
    opd0_addr: int
    opd1_addr: int = 0
    opd1_n: int = 0
    res1_addr: int = 0
    cmd_id_dep: int = 0
    opt_res0_prec: int = FP32
    opt_opd0_prec: int = FP32
    short_res0_str: int = 0
    res0_n_str: int = 0
    res0_c_str: int = 0
    res0_h_str: int = 0
    res0_w_str: int = 0
    short_opd0_str: int = 0
    opd0_n_str: int = 0
    opd0_c_str: int = 0
    opd0_h_str: int = 0
    opd0_w_str: int = 0

    def accesses(self, chip):
        acc = super().accesses(chip)
        reads, writes = list(acc.lmem_reads), list(acc.lmem_writes)
        if self.op in ("taylor", "taylor_4x"):
            from tpuflow.isa.base import LmemRange
            off = self.opd1_addr % chip.lmem_bytes_per_lane
            reads.append(LmemRange(0, chip.lanes, off, off + 4 * self.opd1_n))
        if self.op == "normalize":
            r1 = LocalTensor(self.res1_addr, self.res0_shape,
                             self.local("res0", self.res0_shape, chip).strides, Prec(self.opt_res0_prec))
            writes.extend(r1.ranges(chip))
        return Accesses(lmem_reads=tuple(reads), lmem_writes=tuple(writes))

    def read_operands(self, chip):
        return [("opd0", self.res0_shape)]

    def write_operands(self, chip):
        return [("res0", self.res0_shape)]


@dataclass(frozen=True)
class LinTiu(TiuInstruction):
    """lin.mac: res0 = opd0 * opd1 + opd2; lin.square_sum: (opd0 + opd1)**2;
    lin.square_diff: (opd0 - opd1)**2. Operands share res0's shape (strides may broadcast)."""

    TSK_TYP: ClassVar[int] = 10
    PREFIX: ClassVar[str] = "lin"
    OPS: ClassVar[dict] = {"mac": 1, "square_sum": 20, "square_diff": 21}
    op: str
    res0_addr: int
    res0_n: int
    res0_c: int
    res0_h: int
    res0_w: int
    opd0_addr: int
    opd1_addr: int
    opd2_addr: int = 0
    cmd_id_dep: int = 0
    opt_res0_prec: int = FP32
    opt_opd0_prec: int = FP32
    opt_opd1_prec: int = FP32
    opt_opd2_prec: int = FP32
    opt_opd0_const: int = 0
    opt_opd1_const: int = 0
    opt_opd2_const: int = 0
    short_res0_str: int = 0
    res0_n_str: int = 0
    res0_c_str: int = 0
    res0_h_str: int = 0
    res0_w_str: int = 0
    short_opd0_str: int = 0
    opd0_n_str: int = 0
    opd0_c_str: int = 0
    opd0_h_str: int = 0
    opd0_w_str: int = 0
    short_opd1_str: int = 0
    opd1_n_str: int = 0
    opd1_c_str: int = 0
    opd1_h_str: int = 0
    opd1_w_str: int = 0
    short_opd2_str: int = 0
    opd2_n_str: int = 0
    opd2_c_str: int = 0
    opd2_h_str: int = 0
    opd2_w_str: int = 0

    def read_operands(self, chip):
        ops = [("opd0", self.res0_shape), ("opd1", self.res0_shape)]
        if self.op == "mac":
            ops.append(("opd2", self.res0_shape))
        return ops

    def write_operands(self, chip):
        return [("res0", self.res0_shape)]


@dataclass(frozen=True)
class CmpTiu(TiuInstruction):
    """cmp.sel_gt / sel_eq / sel_lt: res0 = (opd0 OP opd1) ? opd2 : opd3, elementwise over
    res0's shape. opd3 has no stride fields: when it is a tensor it uses opd2's stride mode and
    strides (the lowering gives both the same layout). A constant opd1 of fp16 precision is the
    fp16 value in the field's low 16 bits (how tpu-mlir reads sCMP's opd1, in opd0's precision);
    other float constants are fp32 bits."""

    TSK_TYP: ClassVar[int] = 13
    PREFIX: ClassVar[str] = "cmp"
    OPS: ClassVar[dict] = {"sel_gt": 23, "sel_eq": 24, "sel_lt": 26}
    op: str
    res0_addr: int
    res0_n: int
    res0_c: int
    res0_h: int
    res0_w: int
    opd0_addr: int
    opd1_addr: int
    opd2_addr: int
    opd3_addr: int
    cmd_id_dep: int = 0
    opt_res0_prec: int = FP32
    opt_opd0_prec: int = FP32
    opt_opd1_prec: int = FP32
    opt_opd2_prec: int = FP32
    opt_opd0_const: int = 0
    opt_opd1_const: int = 0
    opt_opd2_const: int = 0
    opt_opd3_const: int = 0
    short_res0_str: int = 0
    res0_n_str: int = 0
    res0_c_str: int = 0
    res0_h_str: int = 0
    res0_w_str: int = 0
    short_opd0_str: int = 0
    opd0_n_str: int = 0
    opd0_c_str: int = 0
    opd0_h_str: int = 0
    opd0_w_str: int = 0
    short_opd1_str: int = 0
    opd1_n_str: int = 0
    opd1_c_str: int = 0
    opd1_h_str: int = 0
    opd1_w_str: int = 0
    short_opd2_str: int = 0
    opd2_n_str: int = 0
    opd2_c_str: int = 0
    opd2_h_str: int = 0
    opd2_w_str: int = 0

    def opd3(self, chip) -> LocalTensor:
        """opd3 laid out like opd2 (see the class docstring)."""
        like = self.local("opd2", self.res0_shape, chip)
        return LocalTensor(self.opd3_addr, self.res0_shape, like.strides, Prec(self.opt_opd2_prec))

    def read_operands(self, chip):
        return [("opd0", self.res0_shape), ("opd1", self.res0_shape), ("opd2", self.res0_shape)]

    def write_operands(self, chip):
        return [("res0", self.res0_shape)]

    def accesses(self, chip):
        acc = super().accesses(chip)
        if self.opt_opd3_const:
            return acc
        return Accesses(lmem_reads=acc.lmem_reads + self.opd3(chip).ranges(chip), lmem_writes=acc.lmem_writes)


@dataclass(frozen=True)
class CwBcTiu(TiuInstruction):
    """tsbc.*: lane moves. cw_ts / wc_ts: res0[n,w,h,c] = opd0[n,c,h,w] (res0_c = opd0_w,
    res0_w = opd0_c). l_copy: res0 = opd0 (a copy to other lanes / offsets). l_bc and s_bc:
    res0[n,c,h,w] = opd0[n,0,h,w] for every c < res0_c (opd0 holds one channel)."""

    TSK_TYP: ClassVar[int] = 5
    PREFIX: ClassVar[str] = "tsbc"
    OPS: ClassVar[dict] = {"cw_ts": 0, "wc_ts": 1, "l_copy": 2, "l_bc": 3, "s_bc": 4}
    op: str
    res0_addr: int
    res0_n: int
    res0_c: int
    res0_h: int
    res0_w: int
    opd0_addr: int
    opd0_c: int
    opd0_w: int
    cmd_id_dep: int = 0
    opt_res0_prec: int = FP32
    short_res0_str: int = 0
    res0_n_str: int = 0
    res0_c_str: int = 0
    res0_h_str: int = 0
    res0_w_str: int = 0
    short_opd0_str: int = 0
    opd0_n_str: int = 0
    opd0_c_str: int = 0
    opd0_h_str: int = 0
    opd0_w_str: int = 0

    @property
    def opt_opd0_prec(self) -> int:
        return self.opt_res0_prec

    def opd0_shape(self):
        return (self.res0_n, self.opd0_c, self.res0_h, self.opd0_w)

    def read_operands(self, chip):
        return [("opd0", self.opd0_shape())]

    def write_operands(self, chip):
        return [("res0", self.res0_shape)]


@dataclass(frozen=True)
class SysTiu(TiuInstruction):
    """system.*: nop, end (last instruction of a stream), barriers, send_msg / wait_msg.
    wait_msg with reg_idx == TILE_WAIT_TAG waits until the TILE engine completed block `imm`."""

    TSK_TYP: ClassVar[int] = 15
    PREFIX: ClassVar[str] = "system"
    OPS: ClassVar[dict] = {"intr_barrier": 0, "data_barrier": 5, "send_msg": 8, "wait_msg": 9,
                           "nop": 30, "end": 31}
    op: str
    imm: int = 0
    reg_idx: int = 0
    cmd_id_dep: int = 0

    @property
    def is_tile_wait(self) -> bool:
        return self.op == "wait_msg" and self.reg_idx == TILE_WAIT_TAG

    def waits(self) -> tuple[int, int, int]:
        return (0, self.cmd_id_dep, self.imm if self.is_tile_wait else 0)

    @classmethod
    def tile_wait(cls, block: int) -> "SysTiu":
        """system.wait_msg that waits until the TILE engine completed block `block`."""
        return cls(op="wait_msg", reg_idx=TILE_WAIT_TAG, imm=block)

    @classmethod
    def send(cls, msg_id: int, wait_cnt: int) -> "SysTiu":
        """system.send_msg: a cross-core message (tpuflow.isa.messages) consumed by `wait_cnt` waits."""
        return cls(op="send_msg", imm=messages.pack(msg_id, wait_cnt, messages.TIU_COUNT_SHIFT))

    @classmethod
    def wait(cls, msg_id: int, send_cnt: int) -> "SysTiu":
        """system.wait_msg: blocks until `send_cnt` sends of `msg_id` arrived (tpuflow.isa.messages)."""
        return cls(op="wait_msg", imm=messages.pack(msg_id, send_cnt, messages.TIU_COUNT_SHIFT))

    def message(self):
        if self.op not in ("send_msg", "wait_msg") or self.is_tile_wait:
            return None
        msg_id, count = messages.unpack(self.imm, messages.TIU_COUNT_SHIFT)
        return messages.Message("send" if self.op == "send_msg" else "wait", msg_id, count)

    def accesses(self, chip):
        return Accesses()


# ---------------------------------------------------------------- RQ / DQ (tsk_typ 4)

# Rounding modes of RQ / DQ (opd2_n_str): tpu-mlir's RoundingMode numbering (include/tpu_mlir/Support/
# MathUtils.h; its first five are ArTiu cast's). That the descriptor field uses the same numbering
# is tpuflow's assumption (tpu-mlir's debugger prints opd2_n_str as "round_mode" unconverted).
RQ_ROUND_MODES = {"half_to_even": 0, "half_away_from_zero": 1, "towards_zero": 2, "down": 3, "up": 4,
                  "half_up": 5, "half_down": 6}
RQ_SHIFT_RANGE = (-128, 127)          # the stored shift is an int8 (tpu-mlir: (-rshift) & 0xff)
RQ_ZERO_POINT_RANGE = (-(1 << 15), (1 << 15) - 1)   # an int16 (tpu-mlir: (zp & 0xffff) << 16, si16)
TIU_STRIDE_MAX = (1 << 15) - 1     # largest TIU operand stride (16-bit signed descriptor fields)
RQ_PARAM_WORDS = 2                    # 32-bit words per channel of a per-channel parameter tensor
RQ0_FUSED_MULTIPLY_ADD = False        # tpuflow assumption: rq0 rounds x * scale to fp32 before adding offset
RQ0_NAN_RESULT = 0                    # tpuflow assumption: rq0 of a NaN (float opd0) gives this integer


@dataclass(frozen=True)
class RqDqTiu(TiuInstruction):
    """quant.rq0 / rq1 / dq0 (tsk_typ 4, registers RQ&DQ and sRQ&sDQ): requantise or dequantise
    opd0 elementwise into res0, both of res0's (N, C, H, W) with their own layouts. opd0 is read as
    get_dtype(opt_opd0_prec, opt_opd0_sign); res0 is written in opt_res0_prec, signed when
    opt_opd2_sign (tpu-mlir sRQ_sDQ_converter: res0 dtype = (opt_res0_prec, opt_opd2_sign)).

    Parameters, per op (x = opd0 element, c = its channel, words as 32-bit little endian):

    * rq1 (integer requant): multiplier m (int32), shift s (int8), zero point zp (int16).
      res0 = saturate(zp + RightShiftRound(x * m, -s, mode)), exact 64-bit x * m: s < 0 shifts right
      by -s with the rounding `mode`, s > 0 shifts left (tpu-mlir stores s = -rshift: RequantIntAxis
      inference `rshift = -(char)(word1 & 0xff)`, backend `shift_value = -rshift`). saturate clamps to
      res0's range (int8 [-128, 127], uint8 [0, 255], int16, uint16, int32, uint32).
    * rq0 (float requant): scale, offset (fp32): res0 = saturate(round_mode(fp32(fp32(x) * scale) +
      offset)) (tpu-mlir RequantFpOp MultiplierShift mode: to_int((float)x * scale + offset)); the
      product and the sum are each rounded to fp32 (RQ0_FUSED_MULTIPLY_ADD, a tpuflow assumption); a
      NaN gives RQ0_NAN_RESULT (assumption).
    * dq0 (float dequant): zero point zp (int16), scale (fp32): res0 = fp32(x - zp) * scale in fp32,
      rounded to res0's float precision (nearest even), the formula of ONNX DequantizeLinear.

    RightShiftRound(v, r, mode) = v / 2**r rounded by `mode` = opd2_n_str (RQ_ROUND_MODES): half to
    even, half away from zero, towards zero, down (floor), up (ceil), half up (+inf), half down
    (-inf); tpu-mlir MathUtils.cpp RightShiftRound. rq0 rounds the real value the same way.

    Where the parameters come from (opt_opd1_const, tpu-mlir sRQ_sDQ_converter):
    * constants (opt_opd1_const = 1): opd1_addr and opd2_addr are 32-bit words: rq1 (m, s | zp << 8),
      rq0 (scale bits, offset bits), dq0 (zp, scale bits). Build them with `rq1_scalars`,
      `rq0_scalars`, `dq0_scalars`.
    * per channel (opt_opd1_const = 0): opd1 is an LMEM tensor (1, C, 1, RQ_PARAM_WORDS) of 32-bit
      words, compact, channel c on res0's lane of c (opd1's start lane = res0's): rq1 (m, s | zp << 16)
      (tpu-mlir's BM1688/BM1690 requant table, ConvLowering non-BM1684X branch and RequantIntAxis),
      rq0 (scale, offset), dq0 (zp, scale) (the debugger reads opd2 at opd1 + 4 bytes). opd2_addr is
      0. That channel groups past the first lane group sit RQ_PARAM_WORDS words apart is tpuflow's
      assumption (the debugger shows one group). Build the words with `rq1_channel_words` etc.
    Not modelled: dq1 (integer dequant), sym_range, opt_relu (never set; the decoder rejects them).
    """

    TSK_TYP: ClassVar[int] = 4
    PREFIX: ClassVar[str] = "quant"
    OPS: ClassVar[dict] = {"rq0": 0, "rq1": 1, "dq0": 3}
    op: str
    res0_addr: int
    res0_n: int
    res0_c: int
    res0_h: int
    res0_w: int
    opd0_addr: int
    opd1_addr: int = 0
    opd2_addr: int = 0
    opt_opd1_const: int = 1
    cmd_id_dep: int = 0
    opt_res0_prec: int = INT8
    opt_opd0_prec: int = INT32
    opt_opd0_sign: int = 1
    opt_opd2_sign: int = 1
    opd2_n_str: int = 0
    short_res0_str: int = 0
    res0_n_str: int = 0
    res0_c_str: int = 0
    res0_h_str: int = 0
    res0_w_str: int = 0
    short_opd0_str: int = 0
    opd0_n_str: int = 0
    opd0_c_str: int = 0
    opd0_h_str: int = 0
    opd0_w_str: int = 0

    short_opd1_str: ClassVar[int] = StrideMode.COMPACT

    @property
    def opt_opd1_prec(self) -> int:
        return INT32            # the per-channel parameter words (rq0 / dq0 reinterpret word bits as fp32)

    @property
    def round_mode(self) -> int:
        return self.opd2_n_str

    def params_shape(self) -> tuple[int, int, int, int]:
        return (1, self.res0_c, 1, RQ_PARAM_WORDS)

    def read_operands(self, chip):
        ops = [("opd0", self.res0_shape)]
        if not self.opt_opd1_const:
            ops.append(("opd1", self.params_shape()))
        return ops

    def write_operands(self, chip):
        return [("res0", self.res0_shape)]


def _check_range(name: str, value: int, lo: int, hi: int) -> int:
    if not lo <= value <= hi:
        raise ValueError(f"{name} = {value} is outside [{lo}, {hi}]")
    return value


def _f32_bits(value: float) -> int:
    return int(np.array(value, np.float32).view(np.uint32))


def _rq1_second_word(rshift: int, zero_point: int, zp_bit: int) -> int:
    shift = _check_range("shift (-rshift)", -int(rshift), *RQ_SHIFT_RANGE)
    zp = _check_range("zero point", int(zero_point), *RQ_ZERO_POINT_RANGE)
    return (shift & 0xFF) | ((zp & 0xFFFF) << zp_bit)


def rq1_multiplier_shift(scale: float) -> tuple[int, int]:
    """(multiplier, rshift) with multiplier / 2**rshift the nearest such value to `scale`, |multiplier| in
    [2**30, 2**31) (31 significant bits, as tpu-mlir's get_scale_and_shift at 32 bits); (0, 0) for 0. A
    scale needing a shift outside the stored int8 (RQ_SHIFT_RANGE, negated) is a ValueError."""
    if scale == 0:
        return 0, 0
    fraction, exponent = math.frexp(abs(scale))          # abs(scale) = fraction * 2**exponent, fraction in [0.5, 1)
    multiplier = round(fraction * (1 << 31))
    if multiplier == 1 << 31:
        multiplier, exponent = 1 << 30, exponent + 1
    rshift = 31 - exponent
    _check_range("shift (-rshift)", -rshift, *RQ_SHIFT_RANGE)
    return (multiplier if scale > 0 else -multiplier), rshift


def rq1_scalars(multiplier: int, rshift: int, zero_point: int) -> dict[str, int]:
    """RqDqTiu fields of a quant.rq1 with one multiplier, right shift (negative: left) and zero point."""
    _check_range("multiplier", int(multiplier), -(1 << 31), (1 << 31) - 1)
    return {"opd1_addr": int(multiplier) & 0xFFFFFFFF, "opd2_addr": _rq1_second_word(rshift, zero_point, 8),
            "opt_opd1_const": 1}


def rq0_scalars(scale: float, offset: float) -> dict[str, int]:
    """RqDqTiu fields of a quant.rq0 with one fp32 scale and offset."""
    return {"opd1_addr": _f32_bits(scale), "opd2_addr": _f32_bits(offset), "opt_opd1_const": 1}


def dq0_scalars(zero_point: int, scale: float) -> dict[str, int]:
    """RqDqTiu fields of a quant.dq0 with one zero point and fp32 scale."""
    zp = _check_range("zero point", int(zero_point), *RQ_ZERO_POINT_RANGE)
    return {"opd1_addr": zp & 0xFFFFFFFF, "opd2_addr": _f32_bits(scale), "opt_opd1_const": 1}


def rq1_channel_words(multipliers, rshifts, zero_points) -> np.ndarray:
    """(C, 2) int32 per-channel words of a quant.rq1 (opt_opd1_const = 0): (m, s | zp << 16)."""
    m = [_check_range("multiplier", int(v), -(1 << 31), (1 << 31) - 1) for v in multipliers]
    second = [_rq1_second_word(r, z, 16) for r, z in zip(rshifts, zero_points, strict=True)]
    return np.array([m, second], dtype=np.int64).T.astype(np.uint32).view(np.int32)


def rq0_channel_words(scales, offsets) -> np.ndarray:
    """(C, 2) int32 per-channel words of a quant.rq0: (scale bits, offset bits)."""
    pairs = np.stack([np.asarray(scales, np.float32), np.asarray(offsets, np.float32)], axis=1)
    return np.ascontiguousarray(pairs).view(np.int32)


def dq0_channel_words(zero_points, scales) -> np.ndarray:
    """(C, 2) int32 per-channel words of a quant.dq0: (zp, scale bits)."""
    zps = [_check_range("zero point", int(z), *RQ_ZERO_POINT_RANGE) for z in zero_points]
    bits = np.asarray(scales, np.float32).view(np.int32)
    return np.stack([np.array(zps, np.int32), bits], axis=1)


# ---------------------------------------------------------------- SG: per-element gather (tsk_typ 6)

SG_TABLE_PER_LANE = 4      # short_opd0_str: the table's channel stride 0, one copy per lane (tpu-mlir "A_cstride_is0")
SG_MAX_DIM = (1 << 16) - 1 # res0_n / res0_c / res0_w / opd0_w are 16-bit fields (cmodel asserts < 2**16)


@dataclass(frozen=True)
class SgTiu(TiuInstruction):
    """sg.pe_s_gather_d1coor / sg.pe_s_gather_hzd (tsk_typ 6, registers sSG / SG): a gather of one table
    entry per element, within each lane:

        res0[n, c, 0, w] = opd0[0, c, 0, opd1[n, c, 0, w]]

    opd0 is the table A (1, res0_c, 1, opd0_w), in res0's precision (opt_opd0_prec = opt_res0_prec; the
    bits are copied, no arithmetic); opd1 the index B (res0_n, res0_c, 1, res0_w), unsigned U8
    (opt_opd1_prec INT8) or U16 (INT16); res0 R (res0_n, res0_c, 1, res0_w). R and B are aligned (EU
    layout), A aligned or, with short_opd0_str = SG_TABLE_PER_LANE, of channel stride 0: every channel
    reads the one table at A's per-lane offset in its own lane, so a 256-entry lookup table broadcast
    to all lanes (one DMA) serves every channel. opd1_c / opd1_w hold B's C and W (= res0_c, res0_w).
    A, B and R start on the same lane. An index >= opd0_w is an error, unless opt_opd3_const (limit
    enable) and opt_opd2_const (fill) are both set: then res0 takes opd2_addr's value (tpuflow never
    sets them). pe_s_gather_d1coor needs A, B and R in three different LMEM banks (the cmodel's
    assert_diff_bank); pe_s_gather_hzd ("hazard") has no such rule: `banks_disjoint` tells which to use.

    Sources (tpu-mlir, public): the SG register layout and op codes of python/debugger/target_1690
    (regdef / opdef: 5 sg.pe_s_gather_d1coor, 13 sg.pe_s_gather_hzd); the TPU1686 atomic generator
    atomic_pes_sg_d1hzd_gen_cmd and its checker (third_party/ppl/runtime checker atomic_sg.c): "PE_S_gather:
    A=[1,C,1,A_w], B=[N,C,1,R_w], R=[N,C,1,R_w]; A is aligned in local memory, if A_cstride is 0 ...
    cstride=0; B is aligned in local memory, support U8 and U16; R is aligned; all start_npu is same;
    PE_S_gather_d1coor: do not support bank conflict, PE_S_gather_hzd: support bank conflict"; the
    descriptor fields it writes (opd0_h = 1, opd0_w = A_w, opd1_c = R_c, opd1_w = R_w, short_opd0_str = 4
    for cstride 0, opt_opd2_const = fill, opt_opd3_const = limit_enable, opd2_addr = the fill value) and
    ppl's pe_sg_d1_check, which picks hzd exactly when the three operands' bank ranges overlap.
    sg.pl_gather_d1coor (op 0) is not this: it gathers with ONE index vector B = [1, Wr, 1, 1] on lane 0
    shared by every lane (atomic_pl_sgd1_gen_cmd "PL_gather_d1coor: A=[N,C,1,Wa], B=[1,Wr,1,1]"), so it
    cannot look up per-element codes.
    """

    TSK_TYP: ClassVar[int] = 6
    PREFIX: ClassVar[str] = "sg"
    OPS: ClassVar[dict] = {"pe_s_gather_d1coor": 5, "pe_s_gather_hzd": 13}
    op: str
    res0_addr: int
    res0_n: int
    res0_c: int
    res0_w: int
    opd0_addr: int
    opd0_w: int
    opd1_addr: int
    res0_h: int = 1
    opd0_h: int = 1
    opd1_c: int = 0            # 0: res0_c (normalised)
    opd1_w: int = 0            # 0: res0_w (normalised)
    short_opd0_str: int = SG_TABLE_PER_LANE
    opd2_addr: int = 0
    opt_opd2_const: int = 0
    opt_opd3_const: int = 0
    cmd_id_dep: int = 0
    opt_res0_prec: int = INT8
    opt_opd0_prec: int = INT8
    opt_opd1_prec: int = INT8

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "opd1_c", self.opd1_c or self.res0_c)
        object.__setattr__(self, "opd1_w", self.opd1_w or self.res0_w)
        if (self.res0_h, self.opd0_h, self.opd1_c, self.opd1_w) != (1, 1, self.res0_c, self.res0_w):
            raise ValueError(f"sg.{self.op}: res0_h = opd0_h = 1 and the index (opd1_c, opd1_w) = (res0_c, res0_w) "
                             f"= ({self.res0_c}, {self.res0_w}), got res0_h {self.res0_h}, opd0_h {self.opd0_h}, "
                             f"({self.opd1_c}, {self.opd1_w})")
        if self.opt_opd0_prec != self.opt_res0_prec or self.opt_opd1_prec not in (INT8, int(Prec.INT16)):
            raise ValueError(f"sg.{self.op}: the table has res0's precision and the index is U8 / U16 (INT8 / INT16)")
        if self.short_opd0_str not in (StrideMode.ALIGNED, SG_TABLE_PER_LANE):
            raise ValueError(f"sg.{self.op}: short_opd0_str is 0 (aligned) or {SG_TABLE_PER_LANE} (channel stride 0)")
        for name in ("res0_n", "res0_c", "res0_w", "opd0_w"):
            _check_range(f"sg.{self.op} {name}", getattr(self, name), 1, SG_MAX_DIM)

    def local(self, prefix: str, shape, chip: "ChipConfig") -> LocalTensor:
        if prefix == "opd0" and self.short_opd0_str == SG_TABLE_PER_LANE:
            return LocalTensor(self.opd0_addr, tuple(shape), (0, 0, self.opd0_w, 1), Prec(self.opt_opd0_prec))
        return super().local(prefix, shape, chip)

    def table_shape(self) -> tuple[int, int, int, int]:
        return (1, self.res0_c, 1, self.opd0_w)

    def read_operands(self, chip):
        return [("opd0", self.table_shape()), ("opd1", self.res0_shape)]

    def write_operands(self, chip):
        return [("res0", self.res0_shape)]

    def banks_disjoint(self, chip: "ChipConfig") -> bool:
        """Whether table, index and result lie in three different sets of LMEM banks (per-lane byte
        ranges): the condition of pe_s_gather_d1coor."""
        spans = []
        for prefix, shape in self.read_operands(chip) + self.write_operands(chip):
            ranges = self.local(prefix, shape, chip).ranges(chip)
            spans.append(set().union(*(range(r.lo // chip.bank_bytes, (r.hi - 1) // chip.bank_bytes + 1)
                                       for r in ranges)))
        return all(not (spans[i] & spans[j]) for i in range(3) for j in range(i + 1, 3))


TIU_KINDS: tuple[type[TiuInstruction], ...] = (ConvTiu, Mm2Tiu, ArTiu, PordTiu, SfuTiu, LinTiu, CmpTiu,
                                               CwBcTiu, SysTiu, RqDqTiu, SgTiu)
