"""Hazard edges from precise byte ranges: a bucketed index of the live accesses of LMEM and DDR.

Walking the instructions in their original issue order, an instruction X gets an edge from every
earlier instruction A whose range overlaps one of X's ranges where at least one of the two writes
(RAW, WAR, WAW), except where the edge is implied by a chain of other edges. The index keeps, per
bucket (a box of rows x bytes: LMEM lane group x offset bank, or one DDR row x address block),
the live accesses. A write W supersedes the part of every earlier access A it overlaps: A -> W is
an edge (they overlap and W writes), and anything that later touches A inside W also touches W, so
it is ordered after A through W. A's entry therefore shrinks to A minus W (up to four boxes) and
disappears when W covers it; without this, the bounding boxes of interleaved strided tiles would
each keep conflicting with all the others. Reads of the same box are grouped into one entry, also
when a write's leftovers repeat a box (or buckets grow without bound on partly rewritten slots).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class _Entry:
    """A live box in one bucket (clipped to it): its last writer or the readers since."""

    row_lo: int
    row_hi: int
    lo: int
    hi: int
    writer: int                                   # node that wrote the box, -1 for a read entry
    readers: list[int] = field(default_factory=list)


def _minus(e: _Entry, r_lo: int, r_hi: int, lo: int, hi: int) -> list[_Entry]:
    """`e` without the box [r_lo, r_hi) x [lo, hi)."""
    if not (e.row_lo < r_hi and r_lo < e.row_hi and e.lo < hi and lo < e.hi):
        return [e]
    boxes = []
    if e.row_lo < r_lo:
        boxes.append((e.row_lo, r_lo, e.lo, e.hi))
    if r_hi < e.row_hi:
        boxes.append((r_hi, e.row_hi, e.lo, e.hi))
    mid_lo, mid_hi = max(e.row_lo, r_lo), min(e.row_hi, r_hi)
    if e.lo < lo:
        boxes.append((mid_lo, mid_hi, e.lo, lo))
    if hi < e.hi:
        boxes.append((mid_lo, mid_hi, hi, e.hi))
    return [_Entry(a, b, c, d, e.writer, list(e.readers)) for a, b, c, d in boxes]


def _merge_reads(entries: list[_Entry]) -> list[_Entry]:
    """One read entry per box: the pieces a write leaves behind often repeat a box already live
    (a slot rewritten with the same partial size), and their readers are all readers since that
    box was last written."""
    seen: dict[tuple, _Entry] = {}
    out = []
    for e in entries:
        if e.writer < 0:
            box = (e.row_lo, e.row_hi, e.lo, e.hi)
            kept = seen.get(box)
            if kept is not None:
                kept.readers.extend(e.readers)
                continue
            seen[box] = e
        out.append(e)
    return out


class AccessIndex:
    """Live accesses of one address space, bucketed by (row // row_block, byte // byte_block)."""

    def __init__(self, row_block: int, byte_block: int):
        self.row_block, self.byte_block = row_block, byte_block
        self.buckets: dict[tuple[int, int], list[_Entry]] = {}

    def pieces(self, boxes) -> list[tuple]:
        """(bucket key, row_lo, row_hi, lo, hi) of every bucket the boxes (row, rows, lo, hi) touch,
        each box clipped to its bucket."""
        rb, bb = self.row_block, self.byte_block
        out = []
        for row, rows, lo, hi in boxes:
            end = row + rows
            for r in range(row // rb, (end - 1) // rb + 1):
                r_lo, r_hi = max(row, r * rb), min(end, r * rb + rb)
                for b in range(lo // bb, (hi - 1) // bb + 1):
                    out.append(((r, b), r_lo, r_hi, max(lo, b * bb), min(hi, b * bb + bb)))
        return out

    def conflicts(self, pieces, is_write: bool, preds: set[int]) -> None:
        """Add to `preds` every live access that one of `pieces` conflicts with."""
        get = self.buckets.get
        for key, r_lo, r_hi, b_lo, b_hi in pieces:
            for e in get(key, ()):
                if e.row_lo < r_hi and r_lo < e.row_hi and e.lo < b_hi and b_lo < e.hi:
                    if e.writer >= 0:
                        preds.add(e.writer)
                    elif is_write:
                        preds.update(e.readers)

    def record(self, pieces, is_write: bool, node: int) -> None:
        """Make `node`'s access of `pieces` live (after conflicts() was asked for all of them)."""
        for key, r_lo, r_hi, b_lo, b_hi in pieces:
            entries = self.buckets.get(key)
            if entries is None:
                entries = self.buckets[key] = []
            if is_write:
                entries[:] = _merge_reads([piece for e in entries for piece in _minus(e, r_lo, r_hi, b_lo, b_hi)])
                entries.append(_Entry(r_lo, r_hi, b_lo, b_hi, node))
                continue
            for e in entries:
                if e.writer < 0 and e.lo == b_lo and e.hi == b_hi and e.row_lo == r_lo and e.row_hi == r_hi:
                    e.readers.append(node)
                    break
            else:
                entries.append(_Entry(r_lo, r_hi, b_lo, b_hi, -1, [node]))


class HazardFinder:
    """Precise-range predecessors of each instruction, fed in original issue order."""

    def _ddr_boxes(self, ranges) -> list[tuple[int, int, int, int]]:
        ranges = [r for r in ranges if r.hi > r.lo]
        if not self.exact_ddr and len(ranges) > 1:
            return [(0, 1, min(r.lo for r in ranges), max(r.hi for r in ranges))]
        return [(0, 1, r.lo, r.hi) for r in ranges]

    def __init__(self, lanes: int, lane_block: int, lmem_block: int, ddr_block: int = 1 << 16,
                 exact_ddr: bool = False):
        self.lmem = AccessIndex(min(lane_block, lanes), lmem_block)
        self.ddr = AccessIndex(1, ddr_block)
        # One core orders its DMAs in its queue: each instruction's DDR pieces are taken as their
        # hull (a strided DMA can have thousands of pieces). Several cores need the exact pieces:
        # cores write interleaved row bands of one tensor at the same time.
        self.exact_ddr = exact_ddr

    def add(self, node: int, acc) -> set[int]:
        """Predecessors of `node` with accesses `acc` (an isa Accesses), then record them."""
        lmem, ddr = self.lmem, self.ddr
        parts = (
            (lmem, lmem.pieces([(r.lane, r.lanes, r.lo, r.hi) for r in acc.lmem_reads if r.hi > r.lo and r.lanes > 0]),
             lmem.pieces([(r.lane, r.lanes, r.lo, r.hi) for r in acc.lmem_writes if r.hi > r.lo and r.lanes > 0])),
            (ddr, ddr.pieces(self._ddr_boxes(acc.ddr_reads)), ddr.pieces(self._ddr_boxes(acc.ddr_writes))),
        )
        preds: set[int] = set()
        for index, reads, writes in parts:
            if reads:
                index.conflicts(reads, False, preds)
            if writes:
                index.conflicts(writes, True, preds)
        for index, reads, writes in parts:
            if reads:
                index.record(reads, False, node)
            if writes:
                index.record(writes, True, node)
        preds.discard(node)
        return preds
