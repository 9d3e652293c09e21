"""codegen.vendor: tpu-mlir's sMM (mm.normal) read as the hardware means it (N columns on the lanes),
costed as tpu-mlir's profile costs it, and in the precision its fields give (the corpus tests skip
without ../shared/peers/tpu-mlir)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuflow.chip import load_chip
from tpuflow.codegen.sg2260 import register_layout
from tpuflow.codegen.vendor import decode_vendor_stream
from tpuflow.hwmodel.timing.compute import tiu_macs, tiu_work
from tpuflow.isa import ArTiu, Engine, MmTiu, Prec

REPO = Path(__file__).resolve().parents[2]
CORPUS = next((p for p in (REPO.parent / "shared" / "peers" / "tpu-mlir", Path("/work/shared/peers/tpu-mlir"))
               if p.is_dir()), None)
BM1690 = sorted(CORPUS.glob("*/bm1690_*")) if CORPUS else []
needs_corpus = pytest.mark.skipif(not BM1690, reason="tpu-mlir peer corpus (../shared/peers/tpu-mlir) not present")


def _smm_count(folder: Path) -> int:
    """sMM records of the folder's TIU stream, as its info.txt records tpu-mlir's own decode ('sMM': N)."""
    found = re.search(r"'sMM': (\d+)", (folder / "info.txt").read_text(encoding="utf-8"))
    return int(found.group(1)) if found else 0


WITH_SMM = [f for f in BM1690 if _smm_count(f)]
CHIP = load_chip("sg2260")
FP32, FP16 = int(Prec.FP32), int(Prec.FP16)
# the resnet50 bm1690_f16 FC's 2nd sMM record (B101) as tpu-mlir 1.30.2 wrote it: L 1 x 64 (2 blocks of 32),
# R 64 x 1024 and the result in blocks of 128 columns on 8 lanes, accumulating (opt_res_add)
RESNET_FC = {"cmd_short": 1, "tsk_typ": 2, "tsk_eu_typ": 1, "opt_res_add": 1, "opt_opd2_const": 1,
             "opt_res0_prec": 2, "opt_opd0_prec": 2, "res0_c": 8, "res0_w": 128, "opd0_n": 1, "opd0_c": 2,
             "opd0_w": 32, "opd1_w": 32, "res0_addr": 163840, "opd0_addr": 196608, "opd1_addr": 229376}


def _lanes(ranges) -> tuple[int, int]:
    """First lane and one past the last lane of LMEM ranges."""
    return min(r.lane for r in ranges), max(r.lane + r.lanes for r in ranges)


def _read(values: dict) -> MmTiu:
    data = register_layout("sMM").pack(values)
    (instr,) = decode_vendor_stream(data, Engine.TIU, "<sMM>").instructions
    return instr


def test_the_fc_record_reads_as_mm_normal_with_n_on_the_lanes():
    fc = _read(RESNET_FC)
    assert isinstance(fc, MmTiu) and fc.op == "normal" and fc.mnk == (1, 1024, 64)
    assert _lanes(fc.accesses(CHIP).lmem_writes) == (0, 8)   # 1024 columns = 8 lanes x 128, not one lane
    # tpu-mlir's compiler_profile.txt charges 520 cycles (512 + one accumulate pass); the misread MM2 cost 8236
    assert tiu_work(fc, CHIP).body == 520


@pytest.mark.parametrize("res_add,bias,body", [(0, 0, 512), (1, 0, 520), (1, 1, 528)])
def test_accumulate_and_bias_passes_are_tpu_mlirs(res_add, bias, body):
    """resnet50 bm1690_f16 compiler_profile.txt: MatMul_306's first sMM 512, the accumulating ones 520,
    the last (accumulate + bias row) 528 cycles."""
    fc = _read({**RESNET_FC, "opt_res_add": res_add, "opt_opd2_const": 1 - bias})
    assert tiu_work(fc, CHIP).body == body
    reads = {prefix for prefix, _ in fc.read_operands(CHIP)}
    assert reads == {"opd0", "opd1"} | ({"res0"} if res_add else set()) | ({"opd2"} if bias else set())


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 70), blocks=st.integers(1, 6), block_w=st.integers(1, 40), last_w=st.integers(1, 40),
       res_c=st.integers(1, 130), res_w=st.integers(1, 70), left_tran=st.booleans(), res_add=st.booleans(),
       prec=st.sampled_from([FP32, FP16]))
def test_mm_normal_work_and_layout(rows, blocks, block_w, last_w, res_c, res_w, left_tran, res_add, prec):
    last_w = min(last_w, block_w)
    mm = MmTiu(op="normal", res0_addr=0, res0_c=res_c, res0_w=res_w, opd0_addr=0, opd0_n=rows, opd0_c=blocks,
               opd0_w=block_w, opd1_addr=0, opd1_w=last_w, opt_left_tran=int(left_tran), opt_res_add=int(res_add),
               opt_opd0_prec=prec, opt_res0_prec=prec)
    stored_cols = block_w * (blocks - 1) + last_w
    m, k = (stored_cols, rows) if left_tran else (rows, stored_cols)
    assert mm.mnk == (m, res_c * res_w, k) and tiu_macs(mm) == m * res_c * res_w * k
    eu, lanes = CHIP.eu_count("fp32" if prec == FP32 else "fp16"), CHIP.lanes
    assert tiu_work(mm, CHIP).body == m * -(-res_c // lanes) * -(-res_w // eu) * (k + int(res_add))
    shapes = dict(mm.read_operands(CHIP) + mm.write_operands(CHIP))
    assert shapes["opd1"] == (k, res_c, 1, res_w) and shapes["res0"] == (m, res_c, 1, res_w)
    assert shapes["opd0"] == (rows, blocks, 1, block_w)
    # the result's columns occupy min(res_c, lanes) lanes from lane 0
    assert _lanes(mm.accesses(CHIP).lmem_writes) == (0, min(res_c, lanes))


def _profile_cycles(folder: Path) -> dict[int, int]:
    """{TIU command id: tpu-mlir's cycles} of the MM commands of compiler_profile.txt."""
    text = (folder / "compiler_profile.txt").read_text()
    return {int(b): int(t) for b, t in re.findall(r"\|MM\|s:\d+\|b:(\d+)\|[^ ]*?\|t:(\d+)", text)}


@needs_corpus
@pytest.mark.parametrize("folder", WITH_SMM, ids=lambda p: f"{p.parts[-2]}/{p.parts[-1]}")
def test_every_corpus_smm_costs_what_tpu_mlirs_profile_charges(folder: Path):
    bd = next(folder.glob("*.BD.0"))
    stream = decode_vendor_stream(bd.read_bytes(), Engine.TIU, str(bd))
    profile = _profile_cycles(folder)
    mms = [(i + 1, instr) for i, (instr, reg) in enumerate(zip(stream.instructions, stream.registers)) if reg == "sMM"]
    assert len(mms) == _smm_count(folder) and all(isinstance(instr, MmTiu) for _, instr in mms)
    for cmd_id, instr in mms:
        assert tiu_work(instr, CHIP).body == profile[cmd_id], f"B{cmd_id}"


@needs_corpus
@pytest.mark.parametrize("folder", [f for f in WITH_SMM if f.name == "bm1690_f16"], ids=lambda p: p.parts[-2])
def test_f16_fc_runs_in_fp32_on_operands_cast_from_16_bits(folder: Path):
    """The precision fields say FP32 and mean it: each F16 sMM reads operands that a sAR cast wrote in fp32
    from the 2-byte weights and input, earlier in the same stream."""
    bd = next(folder.glob("*.BD.0"))
    instrs = decode_vendor_stream(bd.read_bytes(), Engine.TIU, str(bd)).instructions
    mms = [i for i, x in enumerate(instrs) if isinstance(x, MmTiu)]
    assert len(mms) == _smm_count(folder)
    for at in mms:
        mm = instrs[at]
        assert (mm.opt_opd0_prec, mm.opt_res0_prec) == (FP32, FP32)
        for prefix in ("opd0", "opd1"):
            writer = next(x for x in reversed(instrs[:at]) if getattr(x, "res0_addr", None) == getattr(mm, f"{prefix}_addr"))
            assert isinstance(writer, ArTiu) and writer.op == "cast"
            assert (writer.opt_opd0_prec, writer.opt_res0_prec) == (FP16, FP32)
