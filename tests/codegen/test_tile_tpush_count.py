"""TPUSH with a count (tpuflow's additive field, issue 16): one block pushes a batch of slots.
Encoding round trip (B.DIM LB0 = count only when count > 1, so single pushes encode as before),
malformed blocks rejected, and the queue replay pushing `count` slots in order."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuflow.codegen.linx import B_DIM, block_words, decode_blocks, encode_blocks, word_layout
from tpuflow.errors import BinaryFormatError
from tpuflow.isa import TPush, tile_ref
from tpuflow.isa.tile import TileQueues


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 16), st.integers(0, 3), st.integers(1, 14), st.sampled_from(["FP32", "FP16", "BF16"]),
       st.integers(0, 2 ** 20 - 1), st.integers(0, 2 ** 20 - 1))
def test_tpush_with_a_count_round_trips(count, queue, size, dt, wait_tiu, wait_gdma):
    push = TPush(dst_queue=queue, dst_size=size, dt=dt, wait_tiu_id=wait_tiu, wait_gdma_id=wait_gdma, count=count)
    assert decode_blocks(encode_blocks([push])) == [push]
    dims = [w for w in block_words(push) if word_layout(w) is B_DIM]
    assert len(dims) == (count > 1)


def test_a_single_push_encodes_as_before_and_a_bad_count_is_rejected():
    assert block_words(TPush(dst_queue=1, dst_size=9)) == block_words(TPush(dst_queue=1, dst_size=9, count=1))
    assert len(block_words(TPush(dst_queue=1, dst_size=9))) == 2          # BSTART + B.IOT, no B.DIM
    with pytest.raises(ValueError):
        TPush(dst_queue=0, dst_size=9, count=17)
    words = block_words(TPush(dst_queue=0, dst_size=9, count=3))
    words[1] |= 1 << 12          # LB0 -> LB1: a TPUSH has no second dimension
    data = b"".join(w.to_bytes(4, "little") for w in words)
    with pytest.raises(BinaryFormatError):
        decode_blocks(data)


def test_the_queue_replay_pushes_count_slots_in_order():
    q = TileQueues(16)
    q.step(TPush(dst_queue=0, dst_size=9))
    _, writes = q.step(TPush(dst_queue=0, dst_size=9, count=3))
    assert [(s.queue, s.slot) for s in writes] == [(0, 1), (0, 2), (0, 3)]
    assert [q.resolve(tile_ref("T", d)).slot for d in (1, 2, 3, 4)] == [3, 2, 1, 0]
