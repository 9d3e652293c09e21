"""Random small programs for the scheduler tests: TIU copies/adds, GDMA loads/stores/LMEM copies and
TILE matmul blocks over a few overlapping LMEM tiles and DDR regions, so hazards of every kind
(RAW/WAR/WAW, LMEM and DDR, same engine and cross engine) are frequent."""

from __future__ import annotations

from hypothesis import strategies as st

from tpuflow.chip import load_chip
from tpuflow.isa import AccCvt, ArTiu, Engine, TensorDma, TMatmul, TPush, global_lmem_address, size_code, tile_ref
from tpuflow.lowering.deps import assign_dependencies
from tpuflow.lowering.emitter import Record
from tpuflow.program import Program

CHIP = load_chip("sg2260")
LANE_BYTES = CHIP.lmem_bytes_per_lane
DDR_BASE = 1 << 20


def lmem_tile(lane: int, offset: int, channels: int, width: int):
    """(flat LMEM address, shape) of a 1 x channels x 1 x width fp32 tile."""
    return lane * LANE_BYTES + offset, (1, channels, 1, width)


def _sides(side: str, addr: int, shape, strides) -> dict:
    out = {f"{side}_start_addr": addr}
    for d, size, stride in zip("nchw", shape, strides):
        out[f"{side}_{d}size"], out[f"{side}_{d}stride"] = size, stride
    return out


def _lmem_side(tile):
    addr, shape = tile
    return global_lmem_address(addr, CHIP), shape, (shape[3], shape[3], shape[3], 1)


def _ddr_side(region: int, shape):
    n, c, h, w = shape
    return DDR_BASE + region * 4096, shape, (c * h * w, h * w, w, 1)


def load(tile, region: int) -> TensorDma:
    return TensorDma(**_sides("src", *_ddr_side(region, tile[1])), **_sides("dst", *_lmem_side(tile)))


def store(tile, region: int) -> TensorDma:
    return TensorDma(**_sides("src", *_lmem_side(tile)), **_sides("dst", *_ddr_side(region, tile[1])))


def lmem_copy(dst, src) -> TensorDma:
    return TensorDma(**_sides("src", *_lmem_side((src[0], dst[1]))), **_sides("dst", *_lmem_side(dst)))


def tiu_op(dst, a, b=None) -> ArTiu:
    addr, (n, c, h, w) = dst
    kw = dict(res0_addr=addr, res0_n=n, res0_c=c, res0_h=h, res0_w=w, opd0_addr=a[0],
              short_res0_str=1, short_opd0_str=1)
    if b is None:
        return ArTiu(op="copy", **kw)
    return ArTiu(op="add", opd1_addr=b[0], short_opd1_str=1, **kw)


tiles = st.builds(lambda lane, block, c, w: lmem_tile(lane, block * 4096, c, w),
                  st.integers(0, 7), st.integers(0, 5), st.integers(1, 8), st.sampled_from([16, 64, 512]))
regions = st.integers(0, 5)
operations = st.one_of(
    st.tuples(st.just("copy"), tiles, tiles),
    st.tuples(st.just("add"), tiles, tiles, tiles),
    st.tuples(st.just("load"), tiles, regions),
    st.tuples(st.just("store"), tiles, regions),
    st.tuples(st.just("move"), tiles, tiles),
    st.tuples(st.just("matmul")),
)
specs = st.lists(operations, min_size=1, max_size=24)


def records_of(spec) -> list[Record]:
    """The emission stream of a spec, each stream closed by its end instruction."""
    from tpuflow.isa import SysDma, SysTiu
    records: list[Record] = []
    pushes = [0, 0, 0]
    for op in spec:
        kind = op[0]
        if kind == "copy":
            records.append(Record(Engine.TIU, tiu_op(op[1], op[2]), "copy"))
        elif kind == "add":
            records.append(Record(Engine.TIU, tiu_op(op[1], op[2], op[3]), "add"))
        elif kind == "load":
            records.append(Record(Engine.GDMA, load(op[1], op[2]), "load"))
        elif kind == "store":
            records.append(Record(Engine.GDMA, store(op[1], op[2]), "store"))
        elif kind == "move":
            records.append(Record(Engine.GDMA, lmem_copy(op[1], op[2]), "move"))
        else:
            records.extend(_matmul_records(pushes))
    records.append(Record(Engine.TIU, SysTiu(op="end"), ""))
    records.append(Record(Engine.GDMA, SysDma(op="chain_end"), ""))
    return records


def _matmul_records(pushes: list[int]) -> list[Record]:
    """GDMA fills a T and a U slot, TILE pushes them, multiplies, converts onto M; GDMA drains M."""
    out = []
    for q in (0, 1):
        slot = CHIP.tile_slot_address(q, pushes[q] % CHIP.tile.queue_slots)
        out.append(Record(Engine.GDMA, load((slot, (1, 1, 1, 256)), 0), "mm"))
        out.append(Record(Engine.TILE, TPush(dst_queue=q, dst_size=size_code(1024)), "mm"))
        pushes[q] += 1
    out.append(Record(Engine.TILE, TMatmul(fn="TMATMUL", dt="FP32", m=16, n=16, k=16, src0=tile_ref("T", 1),
                                           src1=tile_ref("U", 1), acc_size=size_code(1024)), "mm"))
    out.append(Record(Engine.TILE, AccCvt(layout="NZ2ND", row=16, col=16, dst_queue=2, dst_size=size_code(1024)), "mm"))
    slot = CHIP.tile_slot_address(2, pushes[2] % CHIP.tile.queue_slots)
    pushes[2] += 1
    out.append(Record(Engine.GDMA, store((slot, (1, 1, 1, 256)), 5), "mm"))
    return out


def program_of(records: list[Record], chip=CHIP, dep_mode: str = "bitmap") -> Program:
    queues, layers, order = assign_dependencies(records, chip, dep_mode)
    return Program(chip=chip, tiu=queues[0], gdma=queues[1], tile=queues[2], tiu_layers=layers[0],
                   gdma_layers=layers[1], tile_layers=layers[2], issue_order=order,
                   options={"dep_mode": dep_mode, "dtype": "fp32"})


def random_program(spec) -> Program:
    return program_of(records_of(spec))
