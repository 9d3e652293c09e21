"""The fast per-instruction indexes against cell-by-cell brute force: scheduler.hazards.AccessIndex
(bucketed live boxes, writes cutting what they cover) and lowering.deps.ChunkTable (the chunks an
LMEM range touches, the last reader / writer of each chunk)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tpuflow.chip import load_chip
from tpuflow.isa.base import Accesses, LmemRange
from tpuflow.lowering.deps import ChunkTable
from tpuflow.scheduler.hazards import AccessIndex

ROWS, BYTES = 12, 48
CHIP = load_chip("sg2260")


@st.composite
def boxes(draw):
    row = draw(st.integers(0, ROWS - 1))
    lo = draw(st.integers(0, BYTES - 1))
    return (row, draw(st.integers(1, ROWS - row)), lo, draw(st.integers(lo + 1, BYTES)))


accesses = st.lists(st.tuples(st.lists(boxes(), max_size=3), st.lists(boxes(), max_size=3)), min_size=1, max_size=25)


def cells(box_list):
    return {(r, b) for row, rows, lo, hi in box_list for r in range(row, row + rows) for b in range(lo, hi)}


def brute_preds(sequence) -> list[set[int]]:
    """Per access: the last writer of every cell it touches, and if it writes, the readers of each
    cell it writes since that cell's last write."""
    writer: dict = {}
    readers: dict = {}
    out = []
    for node, (reads, writes) in enumerate(sequence):
        r, w = cells(reads), cells(writes)
        preds = {writer[c] for c in r | w if c in writer}
        for c in w:
            preds.update(readers.get(c, ()))
        for c in r:
            readers.setdefault(c, []).append(node)
        for c in w:
            writer[c], readers[c] = node, []
        preds.discard(node)
        out.append(preds)
    return out


def index_preds(sequence, row_block: int, byte_block: int) -> list[set[int]]:
    index = AccessIndex(row_block, byte_block)
    out = []
    for node, (reads, writes) in enumerate(sequence):
        r, w = index.pieces(reads), index.pieces(writes)
        preds: set[int] = set()
        index.conflicts(r, False, preds)
        index.conflicts(w, True, preds)
        index.record(r, False, node)
        index.record(w, True, node)
        preds.discard(node)
        out.append(preds)
    return out


@settings(max_examples=300, deadline=None)
@given(accesses, st.sampled_from([1, 3, 4, ROWS]), st.sampled_from([1, 7, 16, BYTES]))
def test_access_index_finds_exactly_the_cell_conflicts(sequence, row_block, byte_block):
    assert index_preds(sequence, row_block, byte_block) == brute_preds(sequence)


lmem_ranges = st.lists(st.builds(lambda lane, lanes, lo, size: LmemRange(lane, min(lanes, CHIP.lanes - lane), lo,
                                                                         min(lo + size, CHIP.lmem_bytes_per_lane)),
                                 st.integers(0, CHIP.lanes - 1), st.integers(1, CHIP.lanes),
                                 st.integers(0, CHIP.lmem_bytes_per_lane - 1), st.integers(1, 1 << 16)), max_size=3)


def brute_chunks(ranges) -> list[int]:
    per_group = CHIP.lmem_bytes_per_lane // CHIP.chunk_bytes_per_lane
    return sorted({(lane // CHIP.deps.chunk_lanes) * per_group + off // CHIP.chunk_bytes_per_lane
                   for r in ranges for lane in range(r.lane, r.lane + r.lanes)
                   for off in range(r.lo, r.hi, 1024)} |
                  {(lane // CHIP.deps.chunk_lanes) * per_group + (r.hi - 1) // CHIP.chunk_bytes_per_lane
                   for r in ranges for lane in range(r.lane, r.lane + r.lanes)})


@settings(max_examples=200, deadline=None)
@given(lmem_ranges)
def test_chunk_table_chunks_match_the_bytes(ranges):
    assert ChunkTable(CHIP).chunks(ranges) == brute_chunks(ranges)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), lmem_ranges, lmem_ranges), min_size=1, max_size=12))
def test_chunk_table_conflicts_are_the_last_readers_and_writers(sequence):
    table = ChunkTable(CHIP)
    last_writer: list[dict] = [{}, {}, {}]
    last_reader: list[dict] = [{}, {}, {}]
    for cmd_id, (engine, reads, writes) in enumerate(sequence, start=1):
        r, w = set(brute_chunks(reads)), set(brute_chunks(writes))
        expect = [max([last_writer[o].get(c, 0) for c in r | w] + [last_reader[o].get(c, 0) for c in w] + [0])
                  for o in range(3)]
        getter, record = table.facts(Accesses(lmem_reads=tuple(reads), lmem_writes=tuple(writes)))
        assert table.conflicts_at(getter) == expect
        table.record_at(engine, cmd_id, record)
        for c in r:
            last_reader[engine][c] = cmd_id
        for c in w:
            last_writer[engine][c] = cmd_id
