"""SG per-element gathers (SgTiu) on the functional model against numpy indexing: random tables per lane or
one table broadcast over the channels (short_opd0_str 4), U8 and U16 indices, int8 / fp16 / int32 entries,
more channels than lanes and a start lane past 0; pe_s_gather_d1coor's different-banks rule, an index past
the table (refused, or the fill value with limit and fill enabled)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from functional_helpers import CHIP, LANES, flat
from tpuflow.hwmodel.functional import ExecutionError, Machine
from tpuflow.isa.base import LocalTensor, Prec, aligned_strides
from tpuflow.isa.tiu import SG_TABLE_PER_LANE, SgTiu

BANK = CHIP.bank_bytes
TABLE_AT, INDEX_AT, RESULT_AT = 2 * BANK, 0, 5 * BANK


def aligned(addr: int, shape, prec: Prec) -> LocalTensor:
    eu = CHIP.core.eu_bytes_per_lane // prec.bytes
    return LocalTensor(addr, shape, aligned_strides(shape, eu, LANES, (addr // CHIP.lmem_bytes_per_lane) % LANES),
                       prec)


def run_gather(tables, index, prec: Prec, index_prec: Prec, start: int = 0, per_lane: bool = True,
               op: str = "pe_s_gather_d1coor", **extra):
    """Write the tables and indices, gather, and return (result, numpy's answer)."""
    n, c, _, w = index.shape
    m = Machine(CHIP, 1 << 16)
    length = tables.shape[-1]
    if per_lane:        # one table (tables[0]) at the same offset of every lane
        for lane in range(LANES):
            m.write_local(LocalTensor(flat(lane, TABLE_AT), (1, 1, 1, length), (length, length, length, 1), prec),
                          tables[:1].reshape(1, 1, 1, length))
    else:
        m.write_local(aligned(flat(start, TABLE_AT), (1, c, 1, length), prec), tables.reshape(1, c, 1, length))
    m.write_local(aligned(flat(start, INDEX_AT), index.shape, index_prec), index)
    instr = SgTiu(op=op, res0_addr=flat(start, RESULT_AT), res0_n=n, res0_c=c, res0_w=w,
                  opd0_addr=flat(start, TABLE_AT), opd0_w=length, opd1_addr=flat(start, INDEX_AT),
                  short_opd0_str=SG_TABLE_PER_LANE if per_lane else 0, opt_res0_prec=int(prec),
                  opt_opd0_prec=int(prec), opt_opd1_prec=int(index_prec), **extra)
    m.execute(instr)
    got = m.read_local(aligned(flat(start, RESULT_AT), index.shape, prec))
    unsigned = index.view(np.uint8 if index_prec == Prec.INT8 else np.uint16).astype(np.int64)
    table_of = np.broadcast_to(tables[:1], (c, length)) if per_lane else tables
    want = table_of[np.arange(c).reshape(1, c, 1, 1), np.minimum(unsigned, length - 1)]
    return got, want, unsigned


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(1, 150), w=st.integers(1, 200), start=st.integers(0, LANES - 1),
       per_lane=st.booleans(), prec=st.sampled_from([Prec.INT8, Prec.FP16, Prec.INT32]),
       wide_index=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_gather_is_numpy_indexing(n, c, w, start, per_lane, prec, wide_index, seed):
    rng = np.random.default_rng(seed)
    index_prec = Prec.INT16 if wide_index else Prec.INT8
    length = int(rng.integers(1, 300 if wide_index else 257))
    tables = rng.integers(-100, 100, (1 if per_lane else c, length)).astype(prec.storage_dtype)
    unsigned = rng.integers(0, length, (n, c, 1, w))
    index = unsigned.astype(np.uint16 if wide_index else np.uint8).view(index_prec.storage_dtype)
    got, want, _ = run_gather(tables, index, prec, index_prec, start, per_lane)
    np.testing.assert_array_equal(got, want)


def test_int8_codes_index_by_their_stored_byte():
    """An int8 code -128 is the stored byte 0x80: entry 128 of the table (the lookup tables' order)."""
    table = np.arange(256, dtype=np.int64).astype(np.uint8).view(np.int8).reshape(1, 256)
    codes = np.arange(-128, 128, dtype=np.int8).reshape(1, 1, 1, 256)
    got, _, _ = run_gather(table, codes, Prec.INT8, Prec.INT8)
    np.testing.assert_array_equal(got, codes)


def test_d1coor_needs_three_banks_and_hzd_does_not():
    index = np.zeros((1, 4, 1, 8), np.int8)
    table = np.arange(256).astype(np.uint8).view(np.int8).reshape(1, 256)
    global RESULT_AT
    saved, RESULT_AT = RESULT_AT, INDEX_AT + 4096            # the result in the index's bank
    try:
        with pytest.raises(ExecutionError, match="different LMEM banks"):
            run_gather(table, index, Prec.INT8, Prec.INT8)
        got, want, _ = run_gather(table, index, Prec.INT8, Prec.INT8, op="pe_s_gather_hzd")
        np.testing.assert_array_equal(got, want)
    finally:
        RESULT_AT = saved


def test_an_index_past_the_table_is_refused_or_filled():
    table = np.arange(10, dtype=np.int8).reshape(1, 10)
    index = np.array([[[[3, 9, 12, 200]]]], np.uint8).view(np.int8)
    with pytest.raises(ExecutionError, match="outside the table of 10 entries"):
        run_gather(table, index, Prec.INT8, Prec.INT8)
    got, _, _ = run_gather(table, index, Prec.INT8, Prec.INT8, opd2_addr=0x7F, opt_opd2_const=1, opt_opd3_const=1)
    np.testing.assert_array_equal(got.reshape(-1), [3, 9, 127, 127])


def test_the_table_layout_reads_one_row_per_lane():
    """short_opd0_str 4: every channel of a lane reads the one table at that lane's offset (its LMEM read range
    is 256 bytes on every lane the result uses); aligned: one table row per channel."""
    one = SgTiu(op="pe_s_gather_hzd", res0_addr=flat(0, RESULT_AT), res0_n=1, res0_c=130, res0_w=64,
                opd0_addr=flat(0, TABLE_AT), opd0_w=256, opd1_addr=flat(0, INDEX_AT))
    (table, _), _ = one.accesses(CHIP).lmem_reads, None
    assert (table.lane, table.lanes, table.lo, table.hi) == (0, LANES, TABLE_AT, TABLE_AT + 256)
    per_channel = SgTiu(op="pe_s_gather_hzd", res0_addr=flat(0, RESULT_AT), res0_n=1, res0_c=130, res0_w=64,
                        opd0_addr=flat(0, TABLE_AT), opd0_w=256, opd1_addr=flat(0, INDEX_AT), short_opd0_str=0)
    assert per_channel.accesses(CHIP).lmem_reads[0].hi == TABLE_AT + 3 * 256     # three channel groups
