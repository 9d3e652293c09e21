"""Cross-core SEND/WAIT: operand layout, descriptor round trips, and the chip-wide barrier."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuflow.codegen.sg2260 import decode_descriptors, encode_descriptors
from tpuflow.isa import TILE_WAIT_TAG, Engine, Message, SysDma, SysTiu, barrier, barrier_id

ids = st.integers(0, 511)
counts = st.integers(1, 127)


@given(ids, counts, st.booleans())
@settings(max_examples=60, deadline=None)
def test_message_round_trips_through_the_descriptors(msg_id, count, is_send):
    tiu = SysTiu.send(msg_id, count) if is_send else SysTiu.wait(msg_id, count)
    dma = SysDma.send(msg_id, count) if is_send else SysDma.wait(msg_id, count)
    kind = "send" if is_send else "wait"
    for engine, instr in ((Engine.TIU, tiu), (Engine.GDMA, dma)):
        (back,) = decode_descriptors(encode_descriptors([instr]), engine)
        assert back == instr
        assert back.message() == Message(kind, msg_id, count)
        assert not back.is_tile_wait


def test_operand_bits_follow_the_vendor_layout():
    # SYS imm: id bits 0-8, count bits 16-22; sDMA_sys constant_value: id bits 0-8, count bits 9-15
    assert SysTiu.send(5, 16).imm == 5 | 16 << 16
    assert SysDma.wait(300, 3).constant_value == 300 | 3 << 9
    assert SysTiu.tile_wait(7).message() is None and SysDma.tile_wait(7).message() is None
    assert SysTiu(op="nop").message() is None and SysDma(op="chain_end").message() is None


@pytest.mark.parametrize("bad", [(512, 1), (-1, 1), (0, 0), (0, 128)])
def test_out_of_range_ids_and_counts_are_refused(bad):
    with pytest.raises(ValueError):
        SysTiu.send(*bad)


@given(st.integers(1, 8), st.integers(0, 20))
@settings(max_examples=40, deadline=None)
def test_barrier_is_a_send_then_wait_per_engine_counting_every_engine_of_every_core(cores, index):
    msg_id = barrier_id(index)
    assert msg_id == index % 2 and barrier_id(index + 1) != msg_id
    queues = barrier(cores, msg_id)
    assert set(queues) == {Engine.TIU, Engine.GDMA}
    for instrs in queues.values():
        send, wait = (i.message() for i in instrs)
        assert send == Message("send", msg_id, 2 * cores) and wait == Message("wait", msg_id, 2 * cores)
    # chip-wide: one send per engine per core meets every wait's send count
    assert sum(1 for _ in range(cores) for q in queues.values() if q[0].message().kind == "send") == 2 * cores
    assert all(i.reg_idx != TILE_WAIT_TAG for i in queues[Engine.TIU])
