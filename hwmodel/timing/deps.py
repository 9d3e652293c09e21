"""The IFE check stage's dependency logic: chunk-bitmap re-derivation (bitmap mode), comparison with the
compiled waits, and the serialising auto mode (CSR DIS_AUTO_DEP_ID = 1).

Bitmap rule (independent of the compiler's implementation; only program.accesses is shared): an
LMEM byte (lane, offset) is in chunk (lane // deps.chunk_lanes, offset // chunk_bytes_per_lane).
Walking instructions in issue order with, per engine and chunk, the last reader id and last
writer id, an instruction X waits for another engine O at
    max(last_writer[O][c] for c in reads(X) | writes(X), last_reader[O][c] for c in writes(X))
(0 if none): TIU for GDMA, GDMA for TIU, TILE blocks for TIU and GDMA (their Instruction.WAIT_FIELDS).
Every such id is then moved forward into its field's id window (tpuflow.isa.ids.clamp: never more than
2**bits - 1 ids behind the last instruction of that engine issued before X). A TIU or GDMA
instruction whose chunks conflict with TILE blocks must be covered by a SYS tile wait
(Instruction.is_tile_wait) earlier in its own queue whose operand is at least the largest conflicting
TILE id.

derive_bitmap_waits computes the rule for a whole program at once (numpy: the accesses of every
instruction as (chunk, issue position) rows, sorted by chunk, with running maxima per engine; lane
groups that every range of the program touches together are one segment there, which changes no
maximum and leaves far fewer rows);
ChunkTables is the same rule one instruction at a time, for builders that add instructions in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from operator import attrgetter

import numpy as np

from tpuflow.errors import OptionError, TpuflowError
from tpuflow.isa import Engine, Instruction
from tpuflow.isa.base import ENGINES
from tpuflow.isa.ids import IdFields
from tpuflow.program import Program

TILE = Engine.TILE.code


class DependencyCheckError(TpuflowError):
    """The compiled waits disagree with the chunk bitmaps the IFE check stage re-derives."""


@dataclass
class Waits:
    """What every instruction waits for, as the engines honour it: ids[engine code] is an
    (instructions of that engine, 3) int64 array whose row i, column o is the id of engine o's
    instruction that instruction i waits for (Instruction.waits() layout; 0 = none)."""

    ids: list[np.ndarray]


def compiled_waits(program: Program) -> Waits:
    return Waits([_waits_array(program.queue(e)) for e in ENGINES])


def _waits_array(queue) -> np.ndarray:
    if not queue:
        return np.zeros((0, 3), dtype=np.int64)
    rows: dict = {}
    out = []
    for instr in queue:
        cls = type(instr)
        row = rows.get(cls)
        if row is None:
            row = rows[cls] = _wait_row(cls)
        out.append(row(instr))
    return np.array(out, dtype=np.int64)


# Instruction.waits() layouts of the base rule (WAIT_FIELDS by engine code) as one attrgetter each
_ROW_LAYOUTS = {
    (0,): lambda get: (lambda instr: (get(instr), 0, 0)),
    (1,): lambda get: (lambda instr: (0, get(instr), 0)),
    (0, 1): lambda get: (lambda instr: (*get(instr), 0)),
}


def _wait_row(cls):
    """Instruction.waits of a class (the same values, without the per-call loop when the class keeps the
    base rule)."""
    make = _ROW_LAYOUTS.get(tuple(engine.code for engine in cls.WAIT_FIELDS))
    if cls.waits is not Instruction.waits or make is None:
        return cls.waits
    return make(attrgetter(*cls.WAIT_FIELDS.values()))


class ChunkMap:
    """Flat chunk indices (lane group * chunks per group + offset chunk) of LMEM ranges, cached (programs
    reuse their buffers)."""

    def __init__(self, chip, group_cuts=None):
        self.chunk_lanes = chip.deps.chunk_lanes
        self.chunk_bytes = chip.chunk_bytes_per_lane
        self.lane_bytes = chip.lmem_bytes_per_lane
        self.per_group = chip.deps.chunk_count // (chip.lanes // chip.deps.chunk_lanes)
        self.count = chip.deps.chunk_count
        self._cache: dict[tuple, np.ndarray] = {}
        # lane groups merged into segments (segment_of[group]); None: every group its own
        self.segment_of = None if group_cuts is None else np.searchsorted(sorted(group_cuts),
                                                                          np.arange(chip.lanes // self.chunk_lanes),
                                                                          side="right") - 1

    @staticmethod
    def group_cuts(chip, range_sets) -> set[int]:
        """Lane-group boundaries of every range in `range_sets`: groups between two cuts are touched by the
        same ranges, so they can be one segment without changing any conflict."""
        cl = chip.deps.chunk_lanes
        cuts = {0, chip.lanes // cl}
        for ranges in range_sets:
            for r in ranges:
                cuts.add(r.lane // cl)
                cuts.add((r.lane + r.lanes - 1) // cl + 1)
        return cuts

    def chunks(self, ranges) -> np.ndarray:
        key = tuple((r.lane, r.lanes, r.lo, r.hi) for r in ranges)
        hit = self._cache.get(key)
        if hit is None:
            parts = [np.zeros(0, dtype=np.int64)]
            for lane, lanes, lo, hi in key:
                hi = min(hi, self.lane_bytes)
                first, last = lane // self.chunk_lanes, (lane + lanes - 1) // self.chunk_lanes
                if self.segment_of is not None:
                    first, last = self.segment_of[first], self.segment_of[last]
                g = np.arange(first, last + 1)
                c = np.arange(lo // self.chunk_bytes, (hi - 1) // self.chunk_bytes + 1)
                parts.append((g[:, None] * self.per_group + c[None, :]).ravel())
            hit = self._cache[key] = np.unique(np.concatenate(parts))
        return hit


class ChunkTables:
    """Last reader / last writer id per (engine, chunk), updated one instruction at a time."""

    def __init__(self, program: Program):
        self.map = ChunkMap(program.chip)
        self.readers = np.zeros((3, self.map.count), dtype=np.int64)
        self.writers = np.zeros((3, self.map.count), dtype=np.int64)

    def chunks(self, ranges) -> np.ndarray:
        return self.map.chunks(ranges)

    def conflicts(self, reads, writes) -> list[int]:
        """Per engine: the largest conflicting id (RAW/WAW on writers, WAR on readers)."""
        best = [0, 0, 0]
        r = self.chunks(reads)
        if len(r):
            best = self.writers[:, r].max(axis=1).tolist()
        w = self.chunks(writes)
        if len(w):
            best = [max(a, b, c) for a, b, c in zip(best, self.writers[:, w].max(axis=1).tolist(),
                                                   self.readers[:, w].max(axis=1).tolist())]
        return best

    def record(self, engine: int, cmd_id: int, reads, writes) -> None:
        self.readers[engine, self.chunks(reads)] = cmd_id
        self.writers[engine, self.chunks(writes)] = cmd_id


@dataclass
class IssueOrder:
    """The issue order as arrays: engine code, 0-based queue index and ids issued before, per position."""

    code: np.ndarray
    index: np.ndarray
    before: np.ndarray     # (positions, 3): instructions of each engine issued before this position

    @classmethod
    def of(cls, program: Program) -> "IssueOrder":
        letters = program.issue_order or "".join(e.letter * len(program.queue(e)) for e in ENGINES)
        code = np.frombuffer(letters.encode(), dtype=np.uint8)
        code = np.select([code == ord(e.letter) for e in ENGINES], [e.code for e in ENGINES]).astype(np.int64)
        onehot = np.zeros((len(code), 3), dtype=np.int64)
        onehot[np.arange(len(code)), code] = 1
        before = np.cumsum(onehot, axis=0) - onehot
        return cls(code, before[np.arange(len(code)), code], before)


def bitmap_conflicts(order: IssueOrder, read_sets: list, write_sets: list) -> np.ndarray:
    """(positions, 3): per instruction (issue order) and engine, the largest id of that engine that wrote
    a chunk the instruction reads or writes, or read a chunk it writes, earlier in the issue order (see the
    module docstring); the column of the instruction's own engine is not meaningful."""
    n = len(order.code)
    out = np.zeros((n, 3), dtype=np.int64)
    sets = [s for pair in zip(read_sets, write_sets) for s in pair]
    counts = np.fromiter(map(len, sets), dtype=np.int64, count=2 * n)
    total = int(counts.sum())
    if not total:
        return out
    chunk = np.concatenate(sets)
    row_of = np.repeat(np.arange(2 * n), counts)        # rows in issue order, each one's reads first
    keys = chunk.astype(np.int16) if int(chunk.max()) < (1 << 15) else chunk
    by_chunk = np.argsort(keys, kind="stable")            # per chunk, in issue order
    row_of = row_of[by_chunk]
    c, w = chunk[by_chunk], (row_of & 1).astype(bool)
    first = np.empty(total, dtype=bool)
    first[0] = True
    np.not_equal(c[1:], c[:-1], out=first[1:])
    # work with issue positions + 1 (they grow along every chunk's rows; 0 = none), in int32 when they fit
    small = (int(c[-1]) + 1) * (n + 1) < (1 << 31)
    kind = np.int32 if small else np.int64
    position = ((row_of >> 1) + 1).astype(kind)
    offset = c.astype(kind) * kind(n + 1)
    engine = order.code[row_of >> 1]
    per_pos = counts.reshape(n, 2).sum(axis=1)
    has = per_pos > 0
    starts = (np.cumsum(per_pos) - per_pos)[has]
    best = np.empty(total, dtype=kind)
    latest = np.zeros(n, dtype=np.int64)
    for o in np.unique(order.code).tolist():     # an engine without instructions conflicts with nothing
        access = np.where(engine == o, position, kind(0))
        last_access = _running_max_before(access, offset, first)
        last_write = _running_max_before(np.where(w, access, kind(0)), offset, first)
        best[by_chunk] = np.where(w, last_access, last_write)    # WAR on writes; RAW/WAW on both
        latest[has] = np.maximum.reduceat(best, starts)
        found = latest > 0
        out[found, o] = order.index[latest[found] - 1] + 1        # an engine's ids grow with position
    return out


def _running_max_before(value: np.ndarray, offset: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Per row, the largest value of the earlier rows of its run (runs start where `first`; 0 if none)."""
    running = np.maximum.accumulate(value + offset) - offset
    before = np.empty_like(running)
    before[0] = 0
    before[1:] = running[:-1]
    before[first] = 0
    return before


def same_instructions(program: Program) -> list[list[int]]:
    """Per engine, same_as_earlier of its queue (TILE operands are queue-relative: every block is its own)."""
    return [_same_as_earlier(program.tiu), _same_as_earlier(program.gdma), list(range(len(program.tile)))]


def _same_as_earlier(instrs) -> list[int]:
    """isa.same_as_earlier without a copy per instruction: two instructions (frozen dataclasses, equal when
    their class and every compared field are) are equal apart from their waits when their class and every
    compared field but the WAIT_FIELDS are."""
    first: dict = {}
    key_of: dict = {}
    out = []
    for i, instr in enumerate(instrs):
        cls = type(instr)
        get = key_of.get(cls)
        if get is None:
            get = key_of[cls] = _fields_but_waits(cls)
        out.append(first.setdefault(get(instr) if get else instr.without_waits(), i))
    return out


def _fields_but_waits(cls):
    """attrgetter of a dataclass's compared fields other than its WAIT_FIELDS, and its class (None: not a
    dataclass with a field-wise __eq__)."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.eq:
        return None
    waits = set(cls.WAIT_FIELDS.values())
    names = [f.name for f in dataclass_fields(cls) if f.compare and f.name not in waits]
    return attrgetter("__class__", *names)


def derive_bitmap_waits(program: Program, keep: list | None = None,
                        same: list | None = None) -> tuple[Waits, list[str]]:
    """Waits from the chunk bitmaps, and a description of every disagreement with the compiled ones.
    `keep`, if given (three lists, one per engine), receives every instruction's accesses; `same`
    (same_instructions) lets equal instructions share them."""
    order = IssueOrder.of(program)
    same = same or same_instructions(program)
    done: list[list] = [[], [], []]     # accesses per engine, queue order
    held = []
    queues, chip = (program.tiu, program.gdma), program.chip
    for code, index in zip(order.code.tolist(), order.index.tolist()):
        first = same[code][index]
        if first < index:
            acc = done[code][first]
        else:   # program.accesses, without its engine lookups for TIU and GDMA
            acc = queues[code][index].accesses(chip) if code != TILE else program.accesses(Engine.TILE, index)
        done[code].append(acc)
        if keep is not None:
            keep[code].append(acc)
        held.append(acc)
    distinct = {id(r): r for acc in held for r in (acc.lmem_reads, acc.lmem_writes)}   # shared range tuples
    chunk_map = ChunkMap(program.chip, ChunkMap.group_cuts(program.chip, distinct.values()))
    by_id = {key: chunk_map.chunks(ranges) for key, ranges in distinct.items()}
    reads = [by_id[id(acc.lmem_reads)] for acc in held]
    writes = [by_id[id(acc.lmem_writes)] for acc in held]
    want = bitmap_conflicts(order, reads, writes)
    waits = compiled_waits(program)
    compiled = np.zeros((len(order.code), 3), dtype=np.int64)
    for code in range(3):
        compiled[order.code == code] = waits.ids[code]
    return waits, _disagreements(program, order, want, compiled)


def _disagreements(program: Program, order: IssueOrder, want: np.ndarray, compiled: np.ndarray) -> list[str]:
    """Every compiled wait field that differs from the clamped bitmap id, and every TIU/GDMA instruction
    whose TILE conflict no earlier SYS tile wait of its queue covers, in issue order."""
    widths = IdFields.of(program.chip)
    bits = np.asarray([widths.bits(e) for e in ENGINES], dtype=np.int64)[order.code]
    floor = np.maximum(0, order.before - (np.int64(1) << bits)[:, None] + 1)
    expected = np.maximum(want, floor)
    fields = np.zeros((len(order.code), 3), dtype=bool)       # the columns WAIT_FIELDS hold
    for engine in ENGINES:
        queue = program.queue(engine)
        for other in (queue[0].WAIT_FIELDS if queue else ()):
            fields[order.code == engine.code, other.code] = True
    wrong_field = (fields & (expected != compiled)).any(axis=1)
    covered = np.zeros(len(order.code), dtype=np.int64)
    for code in (Engine.TIU.code, Engine.GDMA.code):
        sel = np.flatnonzero(order.code == code)
        covered[sel] = np.maximum.accumulate(compiled[sel, TILE]) if len(sel) else 0
    uncovered = (order.code != TILE) & (want[:, TILE] > covered)
    problems: list[str] = []
    for pos in np.flatnonzero(wrong_field | uncovered).tolist():
        engine, index = ENGINES[order.code[pos]], int(order.index[pos])
        if wrong_field[pos]:
            problems.append(_field_problem(program.queue(engine)[index], index, compiled[pos], expected[pos]))
        if uncovered[pos]:
            tile, seen = int(want[pos, TILE]), int(covered[pos])
            problems.append(f"{engine.letter}{index + 1} conflicts with T{tile} but is not preceded by a SYS "
                            f"wait for T{tile}" + (f" (its queue waited for T{seen})" if seen else ""))
    return problems


def _field_problem(instr, index: int, compiled: np.ndarray, expected: np.ndarray) -> str:
    """'B3 cmd_id_dep=D1, bitmaps give D2' (one id field) or 'T1 waits B0,D0, bitmaps give B0,D1'."""
    head = f"{instr.ENGINE.letter}{index + 1}"
    ids = [(other, name) for other, name in instr.WAIT_FIELDS.items()]
    have = ",".join(f"{other.letter}{compiled[other.code]}" for other, _ in ids)
    want = ",".join(f"{other.letter}{expected[other.code]}" for other, _ in ids)
    if len(ids) == 1:
        return f"{head} {ids[0][1]}={have}, bitmaps give {want}"
    return f"{head} waits {have}, bitmaps give {want}"


def auto_waits(program: Program) -> Waits:
    """Auto mode: every TIU/GDMA/TILE wait field waits for every instruction of its engine issued before
    (SYS tile waits stay as compiled)."""
    order = IssueOrder.of(program)
    waits = compiled_waits(program)
    for engine in ENGINES:
        queue = program.queue(engine)
        before = order.before[order.code == engine.code]
        for other in (queue[0].WAIT_FIELDS if queue else ()):
            waits.ids[engine.code][:, other.code] = before[:, other.code]
    return waits


def resolve_waits(program: Program, dep_mode: str | None, check: bool = True, keep: list | None = None,
                  same: list | None = None) -> Waits:
    """Waits the engines honour: compiled (checked against the bitmaps unless check=False) or auto.
    `keep` receives the instructions' accesses when the check computes them (issue order per engine)."""
    if dep_mode == "auto":
        return auto_waits(program)
    if dep_mode not in (None, "bitmap"):
        raise OptionError(f"option --dep-mode: '{dep_mode}' is not one of bitmap, auto")
    if not check:
        return compiled_waits(program)
    waits, problems = derive_bitmap_waits(program, keep, same)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise DependencyCheckError(f"IFE check: compiled dependencies disagree with the chunk bitmaps: "
                                   f"{problems[0]}{more}")
    return waits
