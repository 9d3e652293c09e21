"""TILE stream: LinxISA CUBE block words, the lingxi.md example encodings, round trips and errors."""

from __future__ import annotations

import dataclasses
import struct

import pytest
from codegen_strategies import TILE_STRATEGIES, any_tile_instruction
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuflow.codegen.linx import block_words, decode_blocks, encode_block, encode_blocks
from tpuflow.errors import BinaryFormatError, EncodingError
from tpuflow.isa import AccCvt, TMatmul, TPush, tile_ref


def bits(word: int, hi: int, lo: int) -> int:
    return (word >> lo) & ((1 << (hi - lo + 1)) - 1)


def matmul(**over):
    fields = dict(fn="TMATMUL", dt="FP32", m=64, n=32, k=64, src0=tile_ref("T", 2), src1=tile_ref("U", 1),
                  acc_size=9)
    return TMatmul(**(fields | over))


def acccvt(**over):
    return AccCvt(**(dict(layout="NZ2ND", row=64, col=32, dst_queue=2, dst_size=9) | over))


# ------------------------------------------------------------------------ lingxi.md examples

@pytest.mark.parametrize("instr, word", [
    (matmul(), 0x08031181),                      # TMATMUL FP32
    (matmul(fn="TMATMUL.ACC"), 0x08231181),      # TMATMUL.ACC FP32
    (acccvt(), 0x08831181),                      # ACCCVT FP32
])
def test_bstart_matches_the_lingxi_examples(instr, word):
    assert block_words(instr)[0] == word


def test_tmatmul_block_layout_per_lingxi():
    words = block_words(matmul(reuse0=1))
    assert len(words) == 5
    for lb, (word, value) in enumerate(zip(words[1:4], (64, 32, 64))):   # B.DIM x0, uimm, ->LBn
        assert bits(word, 6, 0) == 0b1000011 and bits(word, 14, 12) == lb and bits(word, 19, 15) == 0
        assert bits(word, 31, 20) | bits(word, 11, 7) << 12 == value
    iot = words[4]                                                       # B.IOT two inputs
    assert bits(iot, 6, 0) == 0b0010011 and bits(iot, 14, 12) == 0b100
    assert bits(iot, 11, 7) | bits(iot, 15, 15) << 5 == tile_ref("T", 2)
    assert bits(iot, 21, 16) == tile_ref("U", 1) and bits(iot, 24, 22) == 7 and bits(iot, 28, 25) == 9
    assert bits(iot, 29, 29) == 1 and bits(iot, 30, 30) == 1 and bits(iot, 31, 31) == 0


def test_bias_adds_a_one_input_iot_and_acccvt_a_datr():
    words = block_words(matmul(fn="TMATMUL.BIAS", bias_src=tile_ref("M", 1)))
    two, one = words[4], words[5]
    assert bits(two, 14, 12) == 0b100 and bits(two, 29, 29) == 0
    assert bits(one, 14, 12) == 0b101 and bits(one, 11, 7) | bits(one, 15, 15) << 5 == 32 and bits(one, 29, 29) == 1
    words = block_words(acccvt(dst_dt="BF16", round_mode="RTZ", saturate=1, canon=1))
    iot, datr = words[3], words[4]
    assert bits(iot, 14, 12) == 0b110 and bits(iot, 24, 22) == 2 and bits(iot, 28, 25) == 9
    assert bits(datr, 6, 0) == 0b0100011 and bits(datr, 14, 12) == 0b001 and bits(datr, 11, 7) == 27
    assert bits(datr, 24, 20) == 5 and bits(datr, 30, 28) == 2 and bits(datr, 31, 31) == 1
    assert bits(datr, 15, 15) == 1 and bits(datr, 27, 25) == 0   # canon in the spare pad bit


def test_tpush_is_function_31_with_a_no_input_iot_and_waits_are_iod_words():
    words = block_words(TPush(dst_queue=1, dst_size=9, wait_tiu_id=5, wait_gdma_id=(1 << 20) - 1))
    assert bits(words[0], 24, 20) == 31 and bits(words[1], 14, 12) == 0b110 and bits(words[1], 24, 22) == 1
    tiu, gdma = words[2], words[3]
    for word, engine, value in ((tiu, 1, 5), (gdma, 2, (1 << 20) - 1)):
        assert bits(word, 6, 0) == 0b0010011 and bits(word, 14, 12) == 0b001 and bits(word, 8, 7) == engine
        assert bits(word, 31, 15) | bits(word, 11, 9) << 17 == value
    assert len(block_words(TPush(dst_queue=1, dst_size=9))) == 2   # no waits -> no B.IOD


# ------------------------------------------------------------------------------ round trips

@pytest.mark.parametrize("cls", list(TILE_STRATEGIES), ids=lambda c: c.__name__)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_decode_of_encode_is_identity_for_every_tile_kind(cls, data):
    instr = data.draw(TILE_STRATEGIES[cls]())
    assert decode_blocks(encode_block(instr)) == [instr]


@settings(max_examples=60, deadline=None)
@given(st.lists(any_tile_instruction(), max_size=15))
def test_a_block_ends_where_the_next_bstart_starts(instrs):
    assert decode_blocks(encode_blocks(instrs)) == instrs


def test_missing_dims_default_to_one():
    words = [w for w in block_words(matmul(m=1, k=1)) if bits(w, 6, 0) != 0b1000011 or bits(w, 14, 12) == 1]
    data = b"".join(struct.pack("<I", w) for w in words)
    assert decode_blocks(data) == [matmul(m=1, k=1)]


# ---------------------------------------------------------------------------------- errors

@pytest.mark.parametrize("instr, field", [
    (matmul(m=1 << 16), "m"),
    (acccvt(col=1 << 16), "col"),
    (matmul(src1=64), "src1"),
    (matmul(acc_size=16), "acc_size"),
    (matmul(fn="TGEMV.BIAS", bias_src=64), "bias_src"),
    (matmul(wait_tiu_id=1 << 20), "wait_tiu_id"),
    (TPush(dst_queue=0, dst_size=-1), "dst_size"),
])
def test_tile_values_that_do_not_fit_name_the_field(instr, field):
    with pytest.raises(EncodingError, match=f"{type(instr).__name__}: field {field} "):
        block_words(instr)


def _blob(*words):
    return b"".join(struct.pack("<I", w) for w in words)


def test_tile_garbage_names_the_byte_offset():
    good = encode_block(matmul())
    with pytest.raises(BinaryFormatError, match=r"t\.TILE\.0: truncated word at byte offset 20"):
        decode_blocks(good + b"\x01\x02", "t.TILE.0")
    with pytest.raises(BinaryFormatError, match="byte offset 20: word 0xffffffff is not a CUBE block"):
        decode_blocks(good + _blob(0xFFFFFFFF))
    with pytest.raises(BinaryFormatError, match="byte offset 0: B.DIM before any BSTART"):
        decode_blocks(good[4:])
    with pytest.raises(BinaryFormatError, match="byte offset 0: TMATMUL block needs B.IOT"):
        decode_blocks(good[:16])
    with pytest.raises(BinaryFormatError, match="byte offset 8: B.DIM ->LB0 repeated"):
        decode_blocks(good[:8] + good[4:])
    odd_fn = block_words(matmul())[0] | 3 << 20   # function 3 is not a CUBE function tpuflow models
    with pytest.raises(BinaryFormatError, match="byte offset 0: BSTART.CUBE function 3"):
        decode_blocks(_blob(odd_fn) + good[4:])
    reg_dim = struct.unpack("<I", good[4:8])[0] | 5 << 15   # B.DIM from a register
    with pytest.raises(BinaryFormatError, match="byte offset 4: B.DIM word .* reg_src"):
        decode_blocks(good[:4] + _blob(reg_dim) + good[8:])


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_tile_garbage_gives_a_clean_error_or_blocks(data):
    try:
        instrs = decode_blocks(data)
    except BinaryFormatError as exc:
        assert "byte offset" in str(exc)
    else:
        assert decode_blocks(encode_blocks(instrs)) == instrs


def test_every_field_of_every_tile_kind_is_carried():
    """Changing any one field changes the bytes (nothing is dropped on the way)."""
    base = {TMatmul: matmul(fn="TMATMUL.BIAS", bias_src=3), AccCvt: acccvt(), TPush: TPush(dst_queue=1, dst_size=9)}
    changes = {"fn": "TMATMUL.ACC", "dt": "BF16", "layout": "NORM", "src_dt": "FP16", "dst_dt": "S8",
               "round_mode": "RNA", "bias_src": 4}
    for cls, instr in base.items():
        for f in dataclasses.fields(cls):
            value = getattr(instr, f.name)
            new = changes.get(f.name, value + 1 if isinstance(value, int) else value)
            if f.name == "fn":
                changed = dataclasses.replace(instr, fn=new, bias_src=-1)
            elif f.name == "dst_queue":
                changed = dataclasses.replace(instr, dst_queue=(value + 1) % 4)
            else:
                changed = dataclasses.replace(instr, **{f.name: new})
            assert encode_block(changed) != encode_block(instr), (cls.__name__, f.name)
