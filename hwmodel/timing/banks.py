"""LMEM bank arbitration of the TIU DPC pipes, from the instruction's real operand addresses.

bank(addr) = (addr >> log2(bank_bytes)) % lmem_banks  (sg2260: (addr >> 14) % 16), on the flat LMEM
address; the lane part is a multiple of the lane size, so only the per-lane offset matters.

The rule (what the exact-timeline tests check):

* The body of an instruction is a sequence of steps (compute.py: vector = one EU vector of res0
  per lane, walked in (n, channel group, h*w) order; cube = one output tile). At each step every
  memory operand has an address: the element that step starts at (res0's element for w0; an
  operand of another shape is walked proportionally; n and channel group clamp to its extent).
  Constants (opt_*_const) do not access memory and take no part.
* Vector pipe (everything but CONV/MM2): the operands are r0 = opd0, r1 = opd1, w0 = res0.
  extra(step) = (number of memory operands) - (number of distinct banks among them), i.e. one
  bubble when two of them share a bank and two bubbles when all three do.
* Cube pipe (CONV, MM2): opa = opd0, opb = opd1, w0 = res0; extra(step) = number of pairs among
  them that share a bank (bank_cflt_num: pairwise conflicts, 0..3).
* bubbles = sum over steps of extra(step) * tiu.bank_conflict_bubble_cycles. They stretch the body.
* SG gathers (SgTiu) take none: tpu-mlir's cycle model gives sg ops bank_conflict_cycle 0 (python/debugger/
  target_1688/opdef.py), pe_s_gather_d1coor keeps its operands in different banks and _hzd handles the
  conflicts itself inside its one-element-per-cycle body.
"""

from __future__ import annotations

import numpy as np

from tpuflow.chip import ChipConfig
from tpuflow.hwmodel.timing.compute import vector_dtype, cdiv, chip_dtype
from tpuflow.isa import ConvTiu, CwBcTiu, LocalTensor, Mm2Tiu, SfuTiu, SgTiu, TiuInstruction


def _bank_range(t: LocalTensor, chip: ChipConfig) -> tuple[int, int]:
    """(first, last) bank index the tensor's per-lane bytes touch, before the modulo."""
    n, c, h, w = t.shape
    lanes = chip.lanes
    start = (t.addr // chip.lmem_bytes_per_lane) % lanes
    groups = (start + c - 1) // lanes + 1
    lo = hi = 0
    for size, stride in ((n, t.strides[0]), (groups, t.strides[1]), (h, t.strides[2]), (w, t.strides[3])):
        span = (size - 1) * stride
        if span < 0:
            lo += span
        else:
            hi += span
    base = t.addr % chip.lmem_bytes_per_lane
    bank = chip.bank_bytes
    return (base + lo * t.prec.bytes) // bank, (base + (hi + 1) * t.prec.bytes - 1) // bank


def _banks(t: LocalTensor, chip: ChipConfig, n, g, h, w) -> np.ndarray | int:
    """Bank of element (n, channel group g, h, w) of `t` (arrays broadcast); a scalar when constant."""
    first, last = _bank_range(t, chip)
    if first == last:
        return first % chip.core.lmem_banks
    ns, cs, hs, ws = t.strides
    nn, cc, hh, ww = t.shape
    groups = cdiv(t.start_lane(chip) + cc, chip.lanes)
    el = (np.minimum(n, nn - 1) * ns + np.minimum(g, groups - 1) * cs + np.minimum(h, hh - 1) * hs
          + np.minimum(w, ww - 1) * ws)
    off = t.offset(chip) + el * t.prec.bytes
    return (off // chip.bank_bytes) % chip.core.lmem_banks


def _vector_grid(instr: TiuInstruction, chip: ChipConfig):
    """(n, g, e) index arrays of the body steps: e = first element (of res0's h*w) of each EU vector."""
    n, c, h, w = instr.res0_shape
    eu = chip.eu_count(vector_dtype(instr))
    steps_hw = cdiv(h * w, eu)
    nn, gg, jj = np.meshgrid(np.arange(n), np.arange(cdiv(c, chip.lanes)), np.arange(steps_hw), indexing="ij")
    return nn.ravel(), gg.ravel(), (jj * eu).ravel(), h * w


def _walk(t: LocalTensor, n, g, e, hw_res: int, chip: ChipConfig):
    """Bank of `t` at the body steps (e indexes res0's h*w; `t`'s own h*w is walked proportionally)."""
    _, _, th, tw = t.shape
    ex = e * (th * tw) // hw_res if th * tw != hw_res else e
    return _banks(t, chip, n, g, ex // tw, ex % tw)


def _vector_operands(instr: TiuInstruction, chip: ChipConfig) -> list[LocalTensor]:
    shapes = dict(instr.read_operands(chip) + instr.write_operands(chip))
    out = []
    for prefix in ("opd0", "opd1", "res0"):
        if prefix in shapes and not instr.is_const(prefix):
            if isinstance(instr, SfuTiu) and prefix == "opd1":
                continue
            shape = shapes[prefix]
            if isinstance(instr, CwBcTiu) and prefix == "opd0":
                shape = instr.opd0_shape()
            out.append(instr.local(prefix, shape, chip))
    return out


def _extra_vector(banks: list) -> np.ndarray | int:
    if len(banks) < 2:
        return 0
    if len(banks) == 2:
        return (np.asarray(banks[0]) == banks[1]).astype(np.int64)
    a, b, c = banks
    pairs = (np.asarray(a) == b).astype(np.int64) + (np.asarray(a) == c) + (np.asarray(b) == c)
    return pairs - (pairs == 3)


def _extra_cube(banks: list) -> np.ndarray | int:
    total = 0
    for i in range(len(banks)):
        for j in range(i + 1, len(banks)):
            total = total + (np.asarray(banks[i]) == banks[j]).astype(np.int64)
    return total


def _total(extra, steps: int) -> int:
    if np.ndim(extra) == 0:
        return int(extra) * steps
    return int(np.sum(extra))


def _vector_bubbles(instr: TiuInstruction, chip: ChipConfig) -> int:
    ops = _vector_operands(instr, chip)
    if len(ops) < 2:
        return 0
    consts = [_bank_range(t, chip) for t in ops]
    n, g, e, hw = _vector_grid(instr, chip) if any(f != l for f, l in consts) else (0, 0, 0, 1)
    steps = len(n) if np.ndim(n) else _vector_steps_count(instr, chip)
    banks = [_walk(t, n, g, e, hw, chip) for t in ops]
    return _total(_extra_vector(banks), steps)


def _vector_steps_count(instr: TiuInstruction, chip: ChipConfig) -> int:
    n, c, h, w = instr.res0_shape
    return n * cdiv(c, chip.lanes) * cdiv(h * w, chip.eu_count(vector_dtype(instr)))


def _all_single_bank(tensors: list[LocalTensor], chip: ChipConfig) -> bool:
    return all(f == l for f, l in (_bank_range(t, chip) for t in tensors))


def _conv_banks(instr: ConvTiu, chip: ChipConfig) -> tuple[list, int]:
    ohow = chip.compute.cube_ohow_per_cycle[chip_dtype(instr.opt_opd0_prec)]
    blocks = cdiv(instr.res0_h * instr.res0_w, ohow)
    res = instr.local("res0", instr.res0_shape, chip)
    inp = instr.local("opd0", (instr.res0_n, instr.opd0_c, instr.opd0_h, instr.opd0_w), chip)
    wgt = instr.local("opd1", instr.weight_shape(), chip)
    steps = instr.res0_n * cdiv(instr.res0_c, chip.lanes) * blocks
    if _all_single_bank([inp, wgt, res], chip):
        return [_banks(inp, chip, 0, 0, 0, 0), _banks(wgt, chip, 0, 0, 0, 0), _banks(res, chip, 0, 0, 0, 0)], steps
    nn, gg, bb = np.meshgrid(np.arange(instr.res0_n), np.arange(cdiv(instr.res0_c, chip.lanes)),
                             np.arange(blocks), indexing="ij")
    nn, gg, pix = nn.ravel(), gg.ravel(), bb.ravel() * ohow
    oh, ow = pix // instr.res0_w, pix % instr.res0_w
    ih = np.maximum(oh * instr.res_op_y_str - instr.opd0_up_pad, 0)
    iw = np.maximum(ow * instr.res_op_x_str - instr.opd0_lf_pad, 0)
    return [_banks(inp, chip, nn, 0, ih, iw), _banks(wgt, chip, 0, gg, 0, 0), _banks(res, chip, nn, gg, oh, ow)], steps


def _mm2_banks(instr: Mm2Tiu, chip: ChipConfig) -> tuple[list, int]:
    ohow = chip.compute.cube_ohow_per_cycle[chip_dtype(instr.opt_opd0_prec)]
    m, n, _ = instr.mnk
    res = instr.local("res0", (1, instr.res0_c, 1, instr.res0_w), chip)
    left = instr.local("opd0", (1, instr.opd0_c, 1, instr.opd0_w), chip)
    right = instr.local("opd1", (1, instr.opd1_c, 1, instr.opd1_w), chip)
    steps = cdiv(m, chip.lanes) * cdiv(n, ohow)
    if _all_single_bank([left, right, res], chip):
        return [_banks(left, chip, 0, 0, 0, 0), _banks(right, chip, 0, 0, 0, 0), _banks(res, chip, 0, 0, 0, 0)], steps
    mg, nb = np.meshgrid(np.arange(cdiv(m, chip.lanes)), np.arange(cdiv(n, ohow)), indexing="ij")
    mg, col = mg.ravel(), nb.ravel() * ohow
    opa = _banks(left, chip, 0, 0, 0, mg * chip.lanes) if instr.op == "tt" else _banks(left, chip, 0, mg, 0, 0)
    opb = _banks(right, chip, 0, 0, 0, col) if instr.op == "nn" else _banks(right, chip, 0, col // chip.lanes, 0, 0)
    return [opa, opb, _banks(res, chip, 0, mg, 0, col)], steps


def _operand_banks(instr: TiuInstruction, acc, chip: ChipConfig) -> list[int] | None:
    """Banks of r0/opa (opd0), r1/opb (opd1), w0 (res0) from the instruction's access ranges when each of
    them lies in one bank (None otherwise). reads list the non-constant read operands in order."""
    reads = acc.lmem_reads
    banks, pos = [], 0
    names = [p for p, _ in instr.read_operands(chip)]
    for prefix in ("opd0", "opd1"):
        if prefix not in names or getattr(instr, f"opt_{prefix}_const", 0):
            continue
        if prefix == "opd1" and isinstance(instr, SfuTiu):
            continue
        if pos >= len(reads):
            return None
        r = reads[pos]
        pos += 1
        first, last = r.lo // chip.bank_bytes, (r.hi - 1) // chip.bank_bytes
        if first != last:
            return None
        banks.append(first % chip.core.lmem_banks)
    if not acc.lmem_writes:
        return banks
    w = acc.lmem_writes[0]
    first, last = w.lo // chip.bank_bytes, (w.hi - 1) // chip.bank_bytes
    if first != last:
        return None
    return banks + [first % chip.core.lmem_banks]


def _steps(instr: TiuInstruction, chip: ChipConfig) -> int:
    if isinstance(instr, ConvTiu):
        ohow = chip.compute.cube_ohow_per_cycle[chip_dtype(instr.opt_opd0_prec)]
        return instr.res0_n * cdiv(instr.res0_c, chip.lanes) * cdiv(instr.res0_h * instr.res0_w, ohow)
    if isinstance(instr, Mm2Tiu):
        ohow = chip.compute.cube_ohow_per_cycle[chip_dtype(instr.opt_opd0_prec)]
        m, n, _ = instr.mnk
        return cdiv(m, chip.lanes) * cdiv(n, ohow)
    return _vector_steps_count(instr, chip)


def bank_bubbles(instr: TiuInstruction, chip: ChipConfig, acc=None) -> int:
    """Bubble cycles the bank arbiter inserts into `instr`'s body (rule in the module docstring).
    `acc` (instr's accesses, if at hand) gives a fast path when every operand stays in one bank."""
    per = chip.tiu.bank_conflict_bubble_cycles
    if per == 0 or not hasattr(instr, "res0_n") and not isinstance(instr, Mm2Tiu) or isinstance(instr, SgTiu):
        return 0
    if acc is not None:
        banks = _operand_banks(instr, acc, chip)
        if banks is not None:
            pairs = sum(banks[i] == banks[j] for i in range(len(banks)) for j in range(i + 1, len(banks)))
            if not isinstance(instr, (ConvTiu, Mm2Tiu)) and pairs == 3:
                pairs = 2          # vector: operands - distinct banks
            return per * pairs * _steps(instr, chip) if pairs else 0
    if isinstance(instr, ConvTiu):
        banks, steps = _conv_banks(instr, chip)
        return per * _total(_extra_cube(banks), steps)
    if isinstance(instr, Mm2Tiu):
        banks, steps = _mm2_banks(instr, chip)
        return per * _total(_extra_cube(banks), steps)
    if hasattr(instr, "res0_n"):
        return per * _vector_bubbles(instr, chip)
    return 0
