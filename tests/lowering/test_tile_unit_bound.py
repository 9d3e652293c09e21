"""lowering.ops.tilemm._unit_bound_ps, the cost the "fit" routing compares: per unit the sum of its
instructions' times on the shared cost model (a TMOVE without a DDR side holds the DMA port for its bytes
at the port width, its latency pipelined), the busiest unit's sum."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tpuflow.chip import load_chip
from tpuflow.hwmodel.timing.cost import instruction_ps
from tpuflow.isa import AccCvt, ArTiu, Engine, TensorDma, TMatmul, TMove, global_lmem_address, size_code, tile_ref
from tpuflow.lowering.emitter import Record
from tpuflow.lowering.ops.tilemm import _unit_bound_ps

CHIP = load_chip("sg2260")
PERIOD = 1_000_000 // int(CHIP.clocks.tile_clock_mhz)


def _lmem_move(nbytes: int) -> TMove:
    """An LMEM -> tile-buffer move of `nbytes` (fp16, one lane)."""
    w = nbytes // 2
    src, dst = global_lmem_address(0, CHIP), global_lmem_address(CHIP.tile_slot_address(0, 0), CHIP)
    kw = {}
    for side, addr in (("src", src), ("dst", dst)):
        kw[f"{side}_start_addr"] = addr
        for d, size, stride in zip("nchw", (1, 1, 1, w), (w, w, w, 1)):
            kw[f"{side}_{d}size"], kw[f"{side}_{d}stride"] = size, stride
    return TMove(desc=TensorDma(src_data_format=1, **kw))


def _matmul(k: int) -> TMatmul:
    return TMatmul(fn="TMATMUL", dt="FP16", m=64, n=64, k=k, src0=tile_ref("T", 1), src1=tile_ref("U", 1),
                   acc_size=size_code(8192))


def _copy() -> ArTiu:
    return ArTiu(op="copy", res0_addr=0, res0_n=1, res0_c=64, res0_h=1, res0_w=256, opd0_addr=8192,
                 short_res0_str=1, short_opd0_str=1)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from(["move", "mm16", "mm64", "cvt", "tiu"]), min_size=1, max_size=12))
def test_busiest_unit_sum(kinds):
    make = {"move": lambda: Record(Engine.TILE, _lmem_move(4096), "c"),
            "mm16": lambda: Record(Engine.TILE, _matmul(16), "c"), "mm64": lambda: Record(Engine.TILE, _matmul(64), "c"),
            "cvt": lambda: Record(Engine.TILE, AccCvt(layout="NZ2ND", row=64, col=64, dst_queue=2,
                                                      dst_size=size_code(8192)), "c"),
            "tiu": lambda: Record(Engine.TIU, _copy(), "c")}
    records = [make[k]() for k in kinds]
    port = -(-4096 // CHIP.tile.move_port_bytes_per_cycle) * PERIOD
    units = {"port": 0, "cube": 0, "drain": 0, "tiu": 0}
    for k, rec in zip(kinds, records):
        unit = {"move": "port", "mm16": "cube", "mm64": "cube", "cvt": "drain", "tiu": "tiu"}[k]
        units[unit] += port if k == "move" else instruction_ps(rec.instr, CHIP)
    assert _unit_bound_ps(records, CHIP) == max(units.values())


def test_a_move_holds_the_port_for_its_bytes_only():
    """Its latency (tile.move_port_latency_cycles) overlaps the next move: two 4 KiB moves hold the port
    2 x 16 cycles, not 2 x (64 + 16)."""
    moves = [Record(Engine.TILE, _lmem_move(4096), "c")] * 2
    assert _unit_bound_ps(moves, CHIP) == 2 * 4096 // CHIP.tile.move_port_bytes_per_cycle * PERIOD
    assert _unit_bound_ps(moves, CHIP) < 2 * instruction_ps(moves[0].instr, CHIP)
