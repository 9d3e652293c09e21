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


def _box_minus(box: tuple, r_lo: int, r_hi: int, lo: int, hi: int) -> list[tuple]:
    """The box (row_lo, row_hi, lo, hi, ...) without [r_lo, r_hi) x [lo, hi), which overlaps it: up
    to four boxes."""
    e_rlo, e_rhi, e_lo, e_hi = box[:4]
    boxes = []
    if e_rlo < r_lo:
        boxes.append((e_rlo, r_lo, e_lo, e_hi))
    if r_hi < e_rhi:
        boxes.append((r_hi, e_rhi, e_lo, e_hi))
    mid_lo, mid_hi = max(e_rlo, r_lo), min(e_rhi, r_hi)
    if e_lo < lo:
        boxes.append((mid_lo, mid_hi, e_lo, lo))
    if hi < e_hi:
        boxes.append((mid_lo, mid_hi, hi, e_hi))
    return boxes


class _Bucket:
    """The live accesses of one bucket: the writer entries (row_lo, row_hi, lo, hi, node), pairwise
    disjoint (a write cuts every live box it overlaps before it goes live), and, per box, the
    readers since that box was last written (one entry per box; the pieces a write leaves behind
    often repeat a box already live, e.g. a slot rewritten with the same partial size, and then
    their readers join)."""

    __slots__ = ("writes", "reads")

    def __init__(self):
        self.writes: list[tuple[int, int, int, int, int]] = []
        self.reads: dict[tuple[int, int, int, int], list[int]] = {}


class AccessIndex:
    """Live accesses of one address space, bucketed by (row // row_block, byte // byte_block).
    A read only conflicts with writer entries, so it never scans the read boxes."""

    def __init__(self, row_block: int, byte_block: int):
        self.row_block, self.byte_block = row_block, byte_block
        self.buckets: dict[tuple[int, int], _Bucket] = {}
        self._pieces: dict[tuple, list[tuple]] = {}

    def pieces(self, boxes) -> list[tuple]:
        """(bucket key, row_lo, row_hi, lo, hi) of every bucket the boxes (row, rows, lo, hi) touch,
        each box clipped to its bucket (cached: programs repeat their boxes)."""
        key = tuple(boxes)
        hit = self._pieces.get(key)
        if hit is None:
            hit = self._pieces[key] = self._pieces_of(boxes)
        return hit

    def _pieces_of(self, boxes) -> list[tuple]:
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
            bucket = get(key)
            if bucket is None:
                continue
            for e_rlo, e_rhi, e_lo, e_hi, writer in bucket.writes:
                if e_rlo < r_hi and r_lo < e_rhi and e_lo < b_hi and b_lo < e_hi:
                    preds.add(writer)
            if is_write:
                for (e_rlo, e_rhi, e_lo, e_hi), readers in bucket.reads.items():
                    if e_rlo < r_hi and r_lo < e_rhi and e_lo < b_hi and b_lo < e_hi:
                        preds.update(readers)

    def record(self, pieces, is_write: bool, node: int) -> None:
        """Make `node`'s access of `pieces` live (after conflicts() was asked for all of them)."""
        buckets = self.buckets
        for key, r_lo, r_hi, b_lo, b_hi in pieces:
            bucket = buckets.get(key)
            if bucket is None:
                bucket = buckets[key] = _Bucket()
            if not is_write:
                box = (r_lo, r_hi, b_lo, b_hi)
                readers = bucket.reads.get(box)
                if readers is None:
                    bucket.reads[box] = [node]
                else:
                    readers.append(node)
                continue
            bucket.writes = _cut_writes(bucket.writes, r_lo, r_hi, b_lo, b_hi)
            bucket.writes.append((r_lo, r_hi, b_lo, b_hi, node))
            _cut_reads(bucket.reads, r_lo, r_hi, b_lo, b_hi)


def _cut_writes(writes: list[tuple], r_lo: int, r_hi: int, lo: int, hi: int) -> list[tuple]:
    """The writer entries without the written box [r_lo, r_hi) x [lo, hi)."""
    out = []
    for entry in writes:
        e_rlo, e_rhi, e_lo, e_hi, writer = entry
        if e_rlo < r_hi and r_lo < e_rhi and e_lo < hi and lo < e_hi:
            for b_rlo, b_rhi, b_lo, b_hi in _box_minus(entry, r_lo, r_hi, lo, hi):
                out.append((b_rlo, b_rhi, b_lo, b_hi, writer))
        else:
            out.append(entry)
    return out


def _cut_reads(reads: dict, r_lo: int, r_hi: int, lo: int, hi: int) -> None:
    """Every read box without the written box [r_lo, r_hi) x [lo, hi); a left-over piece that
    repeats a live read box joins its readers."""
    cut = [box for box in reads
           if box[0] < r_hi and r_lo < box[1] and box[2] < hi and lo < box[3]]
    for box in cut:
        readers = reads.pop(box)
        for piece in _box_minus(box, r_lo, r_hi, lo, hi):
            kept = reads.get(piece)
            if kept is None:
                reads[piece] = list(readers)
            else:
                kept.extend(readers)


class HazardFinder:
    """Precise-range predecessors of each instruction, fed in original issue order; with `chunk`
    (lanes, bytes per lane) the LMEM ranges are first widened to whole chunks of that size."""

    def _ddr_boxes(self, ranges) -> list[tuple[int, int, int, int]]:
        ranges = [r for r in ranges if r.hi > r.lo]
        if not self.exact_ddr and len(ranges) > 1:
            return [(0, 1, min(r.lo for r in ranges), max(r.hi for r in ranges))]
        return [(0, 1, r.lo, r.hi) for r in ranges]

    def __init__(self, lanes: int, lane_block: int, lmem_block: int, ddr_block: int = 1 << 16,
                 exact_ddr: bool = False, chunk: tuple[int, int] | None = None):
        self.lmem = AccessIndex(min(lane_block, lanes), lmem_block)
        self.chunk = chunk
        self.ddr = AccessIndex(1, ddr_block)
        # One core orders its DMAs in its queue: each instruction's DDR pieces are taken as their
        # hull (a strided DMA can have thousands of pieces). Several cores need the exact pieces:
        # cores write interleaved row bands of one tensor at the same time.
        self.exact_ddr = exact_ddr
        self._parts_cache: dict[tuple, tuple] = {}

    def add(self, node: int, acc) -> set[int]:
        """Predecessors of `node` with accesses `acc` (an isa Accesses), then record them."""
        parts = self._parts(acc)
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

    def _parts(self, acc) -> tuple:
        """((index, read pieces, write pieces) of LMEM, then of DDR) of `acc` (cached by its ranges:
        programs repeat their accesses)."""
        key = (acc.lmem_reads, acc.lmem_writes, acc.ddr_reads, acc.ddr_writes)
        hit = self._parts_cache.get(key)
        if hit is None:
            lmem, ddr = self.lmem, self.ddr
            hit = self._parts_cache[key] = (
                (lmem, lmem.pieces(_lmem_boxes(acc.lmem_reads, self.chunk)),
                 lmem.pieces(_lmem_boxes(acc.lmem_writes, self.chunk))),
                (ddr, ddr.pieces(self._ddr_boxes(acc.ddr_reads)), ddr.pieces(self._ddr_boxes(acc.ddr_writes))),
            )
        return hit


def _lmem_boxes(ranges, chunk: tuple[int, int] | None = None) -> list[tuple[int, int, int, int]]:
    """(lane, lanes, lo, hi) boxes of LMEM ranges, widened to whole (lanes x bytes) chunks if `chunk`."""
    boxes = [(r.lane, r.lanes, r.lo, r.hi) for r in ranges if r.hi > r.lo and r.lanes > 0]
    if chunk is None:
        return boxes
    lanes, size = chunk
    out = []
    for lane, n, lo, hi in boxes:
        first = lane // lanes * lanes
        box = (first, -(-(lane + n) // lanes) * lanes - first, lo // size * size, -(-hi // size) * size)
        if box not in out:
            out.append(box)
    return out
