"""TMOVE (tpuflow extension, BSTART.CUBE function 30; issue 16): the tile buffer's own DMA port.
Encoding round trip (hypothesis: descriptors with LMEM / DDR sides and waits, mixed with the other
blocks), malformed blocks rejected, the disassembly line, and the functional model executing the
descriptor exactly as the GDMA's dma.tensor would."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuflow.chip import load_chip
from tpuflow.codegen.disasm import tile_line
from tpuflow.codegen.linx import B_DESC, B_DIM, BSTART_CUBE, block_words, decode_blocks, encode_blocks, word_layout
from tpuflow.errors import BinaryFormatError
from tpuflow.hwmodel.functional import Machine
from tpuflow.isa import Prec, TensorDma, TMatmul, TMove, TPush, global_lmem_address, size_code, tile_ref

CHIP = load_chip("sg2260")
PRECS = [Prec.FP32, Prec.FP16, Prec.BF16]


def tensor_dma(src: int, dst: int, shape, src_strides, dst_strides, prec: Prec) -> TensorDma:
    f = {}
    for side, strides in (("src", src_strides), ("dst", dst_strides)):
        for axis, size, stride in zip("nchw", shape, strides):
            f[f"{side}_{axis}size"], f[f"{side}_{axis}stride"] = size, stride
    return TensorDma(src_start_addr=src, dst_start_addr=dst, src_data_format=int(prec), **f)


lmem = st.integers(0, CHIP.lanes * CHIP.lmem_bytes_per_lane // 64 - 1).map(lambda a: global_lmem_address(a * 64, CHIP))
ddr = st.integers(0, (1 << 34) - 1).map(lambda a: a * 64)
shapes = st.tuples(*[st.integers(1, 300)] * 4)
strides = st.tuples(*[st.integers(0, 60000)] * 4)


@st.composite
def moves(draw) -> TMove:
    src = draw(st.one_of(lmem, ddr))
    desc = tensor_dma(src, draw(lmem), draw(shapes), draw(strides), draw(strides), draw(st.sampled_from(PRECS)))
    return TMove(desc=desc, wait_tiu_id=draw(st.integers(0, 2 ** 20 - 1)), wait_gdma_id=draw(st.integers(0, 2 ** 20 - 1)))


@settings(max_examples=80, deadline=None)
@given(st.lists(moves(), min_size=1, max_size=4))
def test_tmove_blocks_round_trip_among_other_blocks(blocks):
    push = TPush(dst_queue=1, dst_size=size_code(8192), dt="FP16", count=2)
    mm = TMatmul(fn="TMATMUL", dt="FP16", m=16, n=16, k=16, src0=tile_ref("U", 1), src1=tile_ref("U", 2),
                 acc_size=size_code(1024))
    stream = [push] + blocks + [mm]
    assert decode_blocks(encode_blocks(stream)) == stream
    for move in blocks:
        words = block_words(move)
        assert word_layout(words[0]) is BSTART_CUBE and BSTART_CUBE.unpack_int(words[0])["fn"] == 30
        assert sum(word_layout(w) is B_DESC for w in words) * 3 >= 32      # a GDMA descriptor, 3 bytes a word


def _move() -> TMove:
    slot = global_lmem_address(CHIP.tile_slot_address(1, 0), CHIP)
    return TMove(desc=tensor_dma(global_lmem_address(0, CHIP), slot, (1, 4, 1, 64), (256, 64, 64, 1),
                                 (256, 64, 64, 1), Prec.FP16), wait_gdma_id=3)


def test_a_malformed_tmove_is_rejected():
    words = block_words(_move())
    data = lambda ws: b"".join(w.to_bytes(4, "little") for w in ws)  # noqa: E731
    with pytest.raises(BinaryFormatError, match="TMOVE"):
        decode_blocks(data(words[:1] + words[2:]))                   # no length (B.DIM LB0)
    with pytest.raises(BinaryFormatError, match="TMOVE"):
        decode_blocks(data(words[:-3] + words[-2:]))                 # one B.DESC word short
    length = B_DIM.unpack_int(words[1])["uimm"]
    end = 2 + -(-length // 3)                                        # BSTART, B.DIM, then the B.DESC words
    with pytest.raises(BinaryFormatError, match="TMOVE"):
        decode_blocks(data(words[:end] + [B_DESC.pack_int({"data": 0})] + words[end:]))   # one word too many
    if length % 3:                                                   # padding bytes in the last word must be 0
        bad = list(words)
        bad[end - 1] |= 0xFF << 24
        with pytest.raises(BinaryFormatError, match="padding"):
            decode_blocks(data(bad))
    push = block_words(TPush(dst_queue=0, dst_size=9))
    with pytest.raises(BinaryFormatError, match="B.DESC"):
        decode_blocks(data(push[:1] + [words[2]] + push[1:]))         # B.DESC words in a TPUSH
    with pytest.raises(ValueError):
        TMove(desc=dataclasses.replace(_move().desc, cmd_id_dep=1))


def test_the_disassembly_shows_the_descriptor():
    line = tile_line(4, _move(), CHIP)
    assert line.startswith("T4 TMOVE src=(1,4,1,64)@L0:0x0") and "wait=D3" in line and "fp16" in line


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 4), st.integers(1, 8), st.integers(1, 64), st.sampled_from(PRECS), st.integers(0, 2 ** 31))
def test_a_tmove_lands_exactly_as_the_gdma_would_move_it(c, h, w, prec, seed):
    """A strided LMEM -> tile slot and a DDR -> tile slot descriptor: executed as TMOVE on one machine and as
    a GDMA command on another, the LMEM and DDR bytes end up identical."""
    rng = np.random.default_rng(seed)
    slot = global_lmem_address(CHIP.tile_slot_address(2, 3), CHIP)
    src_lmem = global_lmem_address(5 * CHIP.lmem_bytes_per_lane + 128, CHIP)
    shape = (1, c, h, w)
    for src in (src_lmem, 4096):
        desc = tensor_dma(src, slot, shape, (0, h * (w + 3), w + 3, 1), (0, h * w, w, 1), prec)
        machines = [Machine(CHIP, 1 << 16), Machine(CHIP, 1 << 16)]
        lmem_bytes = rng.integers(0, 256, machines[0].lmem.data.shape, dtype=np.uint8)
        ddr_bytes = rng.integers(0, 256, 1 << 15, dtype=np.uint8)
        for m in machines:
            m.lmem.data[:] = lmem_bytes
            m.ddr.load(4096, ddr_bytes)
        machines[0].execute(TMove(desc=desc))
        machines[1].execute(desc)
        assert np.array_equal(machines[0].lmem.data, machines[1].lmem.data)
