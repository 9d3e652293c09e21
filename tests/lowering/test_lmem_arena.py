"""GroupArena placement (lowering.lmem): a bank per buffer when all fit so, else whole GDMA bus beats,
else the EU alignment; buffers never overlap and stay inside the arena; and the DMA of a buffer on bus
beats is no slower on the cost model than the same DMA packed at the EU alignment."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuflow.chip import load_chip
from tpuflow.errors import LoweringError
from tpuflow.hwmodel.timing.cost import instruction_ps
from tpuflow.isa import TensorDma, global_lmem_address
from tpuflow.lowering.lmem import GroupArena, align_up

CHIP = load_chip("sg2260")
EU, BUS, BANK = CHIP.core.lmem_align_bytes, max(CHIP.gdma.bus_bytes, CHIP.core.lmem_align_bytes), CHIP.bank_bytes


def _packed(start: int, sizes: list[int], align: int) -> int:
    end = start
    for s in sizes:
        end = align_up(end, align) + s
    return end


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 4096).map(lambda k: k * EU), st.lists(st.integers(1, 40_000), min_size=1, max_size=6),
       st.integers(0, 200_000))
def test_coarsest_alignment_that_fits(used, sizes, room):
    limit = used + room
    arena = GroupArena(CHIP, used=used, limit=limit)
    if _packed(used, sizes, EU) > limit:
        with pytest.raises(LoweringError):
            arena.alloc_many(sizes, "x")
        return
    offsets = arena.alloc_many(sizes, "x")
    expected = next(a for a in (BANK, BUS, EU) if _packed(used, sizes, a) <= limit)
    assert all(off % expected == 0 for off in offsets)
    spans = sorted(zip(offsets, sizes))
    assert spans[0][0] >= used and spans[-1][0] + spans[-1][1] <= limit
    assert all(a + n <= b for (a, n), (b, _) in zip(spans, spans[1:]))


def test_bus_alignment_when_banks_do_not_fit():
    """Three 20 KiB buffers after 32 B in 90 KiB: on 16 KiB banks they end at 100 KiB, on bus beats at
    60 KiB + 128 B."""
    assert BANK == 16 * 1024 and _packed(EU, [20 * 1024] * 3, BANK) == 100 * 1024
    arena = GroupArena(CHIP, used=EU, limit=90 * 1024)
    offsets = arena.alloc_many([20 * 1024] * 3, "w")
    assert offsets == [BUS, BUS + 20 * 1024, BUS + 40 * 1024]


def _weight_load(lmem_offset: int) -> TensorDma:
    """512 rows of 128 fp16 from DDR into 512 channels at `lmem_offset` (a 1x1 conv's weights)."""
    shape, src, dst = (1, 512, 1, 128), (65536, 128, 128, 1), (1024, 128, 128, 1)
    kw = {}
    for side, addr, strides in (("src", 1 << 24, src), ("dst", global_lmem_address(lmem_offset, CHIP), dst)):
        kw[f"{side}_start_addr"] = addr
        for d, size, stride in zip("nchw", shape, strides):
            kw[f"{side}_{d}size"], kw[f"{side}_{d}stride"] = size, stride
    return TensorDma(src_data_format=1, **kw)


def test_bus_aligned_loads_are_not_slower():
    """The cost model charges bursts that do not start on a bus beat (gdma.unaligned_penalty_cycles)."""
    assert instruction_ps(_weight_load(BUS * 100), CHIP) < instruction_ps(_weight_load(BUS * 100 + EU), CHIP)
