"""Functional model on several cores: shared DDR, private LMEM, message ordering, deadlocks, races."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from multicore_programs import CHIP, sliced_add_program, sliced_add_reference, without

from tpuflow.errors import DeadlockError, RaceError
from tpuflow.hwmodel.functional import run
from tpuflow.hwmodel.functional.engines import INTERLEAVINGS
from tpuflow.isa import Engine, Message, SysDma
from tpuflow.isa.messages import MessageQueue
from tpuflow.program import Program


def _x(cores: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, 4 * cores, 1, 16)).astype(np.float32)


@pytest.mark.parametrize("cores", [2, 4, 8])
@pytest.mark.parametrize("interleave", INTERLEAVINGS)
def test_each_core_adds_its_slice_and_core0_reads_core1s_result(cores, interleave):
    x = _x(cores)
    out = run(sliced_add_program(cores), {"x": x}, interleave=interleave, seed=3)
    ref = sliced_add_reference(x)
    np.testing.assert_array_equal(out["y"], ref["y"])
    np.testing.assert_array_equal(out["z"], ref["z"])


@given(st.integers(0, 10_000), st.sampled_from([2, 3, 4]))
@settings(max_examples=15, deadline=None)
def test_any_random_interleaving_gives_the_same_numbers(seed, cores):
    x = _x(cores, seed)
    out = run(sliced_add_program(cores), {"x": x}, interleave="random", seed=seed)
    np.testing.assert_array_equal(out["z"], sliced_add_reference(x)["z"])


def test_a_removed_send_is_a_deadlock_naming_the_waiting_engines_and_cores():
    program = without(sliced_add_program(2), core=1, engine=Engine.GDMA, index=2)   # core 1's GDMA send
    with pytest.raises(DeadlockError) as info:
        run(program, {"x": _x(2)})
    text = str(info.value)
    for core in (0, 1):
        assert f"core {core} B3 system.wait_msg" in text
    assert "core 0 D4 dma.sys.sys_wait" in text and "message 0 (3 of 4 sends)" in text


def test_a_missing_barrier_is_a_ddr_race_naming_both_instructions_and_cores():
    with pytest.raises(RaceError) as info:
        run(sliced_add_program(2, with_barrier=False), {"x": _x(2)}, interleave="tiu_first")
    text = str(info.value)
    assert text.startswith("DDR race at 0x4100")
    assert "core 1 D2 dma.tensor" in text and "core 0 D3 dma.tensor" in text and "message" in text


def test_lmem_is_private_so_the_same_offsets_on_two_cores_never_race():
    # every core uses lane 0 offsets 0x0 / 0x1000 with no order between cores: no LMEM race
    run(sliced_add_program(4), {"x": _x(4)}, interleave="random", seed=1)


def test_a_barrier_also_orders_the_engines_of_one_core():
    # core 1's TIU add and core 0's later reads are ordered only by the barrier; the race detector
    # must see the message edges (no race), and a one-core program with a barrier runs too
    program = sliced_add_program(1)
    x = _x(1)
    out = run(Program.from_cores(program, program.cores[:1]), {"x": x})
    np.testing.assert_array_equal(out["y"], sliced_add_reference(x)["y"])


def test_message_queue_follows_the_round_rule():
    queue = MessageQueue(CHIP.core.message_ids)
    send, wait = Message("send", 7, 2), Message("wait", 7, 2)
    assert queue.send(send) == "" and not queue.ready(wait)
    assert queue.send(Message("send", 7, 3)) == "message 7 sent for 3 waits, but this round of the id expects 2"
    queue.sent[7] = 1
    assert queue.send(send) == "" and queue.ready(wait) and not queue.wait(wait) and queue.wait(wait)
    assert queue.sent[7] == 0 and queue.leftovers() == []
    assert SysDma.send(7, 2).message() == send


def test_a_message_id_beyond_the_chips_queue_is_an_execution_error():
    from tpuflow.chip import chip_from_dict
    from tpuflow.hwmodel.functional import ExecutionError
    program = sliced_add_program(2)
    small = chip_from_dict({"base": "sg2260", "core": {"message_ids": 1}})
    streams = program.cores
    streams[1].gdma[2] = SysDma.send(1, 4)
    with pytest.raises(ExecutionError, match="message id 1 beyond the chip's 1"):
        run(Program.from_cores(Program(chip=small, memory=program.memory), streams), {"x": _x(2)})


def _interleaved_program(peer_read: bool) -> Program:
    """Two cores store 4 rows each into interleaved DDR rows (core k: rows k, k+2, k+4, k+6) with no
    message between them; with `peer_read`, core 0 then loads row 3, which core 1 writes."""
    from multicore_programs import LOCAL_STRIDES, SLICE, _glob
    from tpuflow.isa import TensorDma
    from tpuflow.program import CoreStreams, DdrTensor, MemoryPlan
    base_addr, row = 0x1000, 16 * 4

    def dma(src, dst, src_str, dst_str, shape=SLICE):
        return TensorDma(src_start_addr=src, dst_start_addr=dst,
                         **{f"src_{k}size": v for k, v in zip("nchw", shape)},
                         **{f"src_{k}stride": v for k, v in zip("nchw", src_str)},
                         **{f"dst_{k}size": v for k, v in zip("nchw", shape)},
                         **{f"dst_{k}stride": v for k, v in zip("nchw", dst_str)})
    streams = []
    for k in range(2):
        gdma = [dma(_glob(0), base_addr + k * row, LOCAL_STRIDES, (128, 32, 16, 1))]
        if peer_read and k == 0:
            gdma.append(dma(base_addr + 3 * row, _glob(0x2000), (16, 16, 16, 1), LOCAL_STRIDES, shape=(1, 1, 1, 16)))
        streams.append(CoreStreams(gdma=gdma, gdma_layers=[f"core{k}"] * len(gdma), issue_order="D" * len(gdma)))
    memory = MemoryPlan(tensors={"out": DdrTensor("out", base_addr, (8, 16), "fp32", "output", 8 * row)},
                        ddr_bytes_used=base_addr + 8 * row)
    return Program.from_cores(Program(chip=CHIP, memory=memory), streams)


def test_ddr_races_use_each_rows_bytes_not_the_bounding_range():
    program = _interleaved_program(peer_read=False)
    assert len(program.core(1).accesses(Engine.GDMA, 0).ddr_writes) == 4
    run(program, {}, interleave="random", seed=5)              # interleaved rows: disjoint bytes, no race
    with pytest.raises(RaceError) as info:
        run(_interleaved_program(peer_read=True), {}, interleave="gdma_first")
    text = str(info.value)
    assert text.startswith("DDR race at 0x10c0: ") and "core 1 D1 dma.tensor (layer core1) writes" in text
    assert "core 0 D2 dma.tensor (layer core0) reads" in text
