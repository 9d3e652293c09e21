"""The timing model's shortcuts equal the plain rules they replace: equal-instruction detection and the
compiled-waits table (deps.py) against isa.same_as_earlier and Instruction.waits(), and the DRAM pass of the
rate model (occupancy per UMC, service per direction, page counts) against one request-by-request pass."""

import sys
from pathlib import Path

import numpy as np
from hypothesis import given, settings, strategies as st

from tpuflow.chip import load_chip
from tpuflow.hwmodel.timing.deps import _same_as_earlier, _waits_array
from tpuflow.isa import SysDma, SysTiu, TensorDma, global_lmem_address
from tpuflow.isa.base import TILE_WAIT_TAG, same_as_earlier

sys.path.insert(0, str(Path(__file__).parent))
from dram_reference import by_request  # noqa: E402

CHIP = load_chip("sg2260")
LMEM = global_lmem_address(0, CHIP)
BANK_ROW = CHIP.umc_count * CHIP.dram.page_bytes * CHIP.dram.banks_per_umc   # bytes between two rows of one bank


def _dma(kind: int, rows: int, dep: int) -> TensorDma:
    """A DDR -> LMEM load of `rows` rows of 64 fp32 (two address variants per kind), waiting for TIU `dep`."""
    return TensorDma(src_start_addr=4096 * (kind % 2), dst_start_addr=LMEM + 256 * (kind // 2), src_nsize=1,
                     src_csize=1, src_hsize=rows, src_wsize=64, src_nstride=0, src_cstride=0, src_hstride=128,
                     src_wstride=1, dst_nsize=1, dst_csize=1, dst_hsize=rows, dst_wsize=64, dst_nstride=0,
                     dst_cstride=0, dst_hstride=64, dst_wstride=1, src_data_format=4, cmd_id_dep=dep)


_GDMA = st.one_of(st.builds(_dma, st.integers(0, 3), st.integers(1, 3), st.integers(0, 3)),
                  st.builds(lambda block, dep: SysDma.tile_wait(block).with_waits((dep, 0, 0)),
                        st.integers(1, 3), st.integers(0, 2)))


@settings(max_examples=40, deadline=None)
@given(st.lists(_GDMA, max_size=20))
def test_equal_instructions_and_waits_table_match_the_isa_rules(queue):
    """Instructions equal apart from their waits are found as isa.same_as_earlier finds them (field tuples
    instead of copies), and the waits table is Instruction.waits() row by row (SYS tile waits included)."""
    assert _same_as_earlier(queue) == same_as_earlier(queue)
    table = _waits_array(queue)
    assert table.shape == (len(queue), 3)
    assert table.tolist() == [list(instr.waits()) for instr in queue]


def test_tiu_waits_rows_keep_the_sys_rule():
    """A TIU SYS wait on TILE carries its block in the TILE column; other TIU rows wait on GDMA only."""
    queue = [SysTiu(op="nop", cmd_id_dep=2), SysTiu.tile_wait(3).with_waits((0, 1, 0)),
             SysTiu(op="wait_msg", reg_idx=TILE_WAIT_TAG, imm=5)]
    assert _waits_array(queue).tolist() == [[0, 2, 0], [0, 1, 3], [0, 0, 5]]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["load", "store", "copy"]), st.integers(0, 40),
                          st.sampled_from([64, 700, 4096, 9000]), st.integers(1, 5),
                          st.sampled_from([0, BANK_ROW, BANK_ROW + 4096])),
                min_size=1, max_size=14))
def test_dram_pass_per_pattern_equals_the_request_by_request_pass(commands):
    """The rate model's DRAM pass (each distinct request pattern once, the open rows and directions carried
    from command to command as 'the latest earlier command on that bank / UMC') gives the same occupancy per
    UMC, service per direction and page hit / miss / open counts as the rules applied to every request in
    order; addresses repeat patterns, pages and banks, and rows a bank's row apart open several rows of one
    bank inside a command."""
    from tpuflow.hwmodel.timing.clocks import Clocks
    from tpuflow.hwmodel.timing.transfers import TransferModel
    from tpuflow.hwmodel.timing.wdc import DramState
    instrs = []
    for kind, where, row, rows, gap in commands:
        ddr = where * 28672
        step = gap // 4 or row * 2                  # DDR row stride in fp32 elements
        strided, flat = (rows * step, rows * step, step, 1), (rows * row, rows * row, row, 1)
        src, dst, ss, ds = {"load": (ddr, LMEM, strided, flat), "store": (LMEM, ddr, flat, strided),
                            "copy": (ddr, ddr + 9_437_184, strided, flat)}[kind]
        instrs.append(TensorDma(src_start_addr=src, dst_start_addr=dst, src_nsize=1, src_csize=1, src_hsize=rows,
                                src_wsize=row, src_nstride=ss[0], src_cstride=ss[1], src_hstride=ss[2],
                                src_wstride=1, dst_nsize=1, dst_csize=1, dst_hsize=rows, dst_wsize=row,
                                dst_nstride=ds[0], dst_cstride=ds[1], dst_hstride=ds[2], dst_wstride=1,
                                src_data_format=4))
    model = TransferModel(CHIP, Clocks.of(CHIP))
    shapes = [model._shape(i) for i in instrs]
    state = DramState(model.p)
    occ, service = model._dram(shapes, len(instrs), state)
    want_occ, want_service, (hits, misses, opens) = by_request(CHIP, instrs)
    assert np.array_equal(occ, want_occ)
    assert np.array_equal(service, want_service)
    assert np.array_equal(state.page_hits, hits) and np.array_equal(state.page_misses, misses)
    assert np.array_equal(state.page_opens, opens)
