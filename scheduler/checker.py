"""Independent validity checker of a reordered program (uses only the ISA and Program, no scheduler code).

check_schedule(original, scheduled) lists every problem found (empty = valid):

1. Same instructions: per engine, the scheduled queue holds every instruction of the original
   exactly once (compared without their dependency fields; SYS waits on TILE are derived and
   not counted), the TILE queue keeps its order, and a queue that ended with `end` /
   `chain_end` still does.
2. No deadlock: the sync counters are replayed with instant execution (an engine's head runs
   once every id it waits for has completed); all three queues must drain. Every wait must also
   name an instruction issued earlier (the IFE delivers in issue order, so a wait on a later one
   can hang behind a full FIFO) and lie inside the id window (tpuflow.isa.ids).
3. Hazards: every pair of original instructions whose precise LMEM or DDR byte ranges overlap,
   one of them writing, is ordered the original way in the scheduled program: by queue order on
   one engine, else by happens-before through the waits (vector clocks from the replay: what an
   instruction waits for, and everything that one waited for, transitively; sync ids advance in
   queue order, so completing id k implies 1..k). Happens-before is transitive, so it is enough to
   check, on every elementary cell (one lane x a byte span that no range boundary cuts, so all
   its bytes see the same accesses), each access against the last write before it and each read
   against the next write after it: every other hazard on that cell follows through them. The
   cells are built with numpy sorts (no per-pair loop), so the check scales to whole programs.

Multi-core programs (tpuflow.program's core axis) are checked core by core for 1 and the issue
order; the replay runs every engine of every core with the SEND/WAIT message rule
(tpuflow.isa.messages: a wait joins the clocks of the sends of its round) and finds deadlocks
across cores; hazards are checked on each core's LMEM and on the DDR all cores share, in the
original's replay order, against vector clocks over every (core, engine).
"""

from __future__ import annotations

from collections import defaultdict, deque

import numpy as np

from tpuflow.errors import TpuflowError
from tpuflow.isa import Engine, SysDma, SysTiu
from tpuflow.isa.base import ENGINES
from tpuflow.isa.ids import IdFields, window_floor
from tpuflow.isa.messages import MessageQueue
from tpuflow.program import Program

LETTER = "".join(e.letter for e in ENGINES)    # by Engine.code


class ScheduleCheckError(TpuflowError):
    """A reordered program is not equivalent to the original or cannot run."""


def assert_valid(original: Program, scheduled: Program) -> None:
    problems = check_schedule(original, scheduled)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ScheduleCheckError(f"schedule check: {problems[0]}{more}")


def check_schedule(original: Program, scheduled: Program) -> list[str]:
    if original.core_count > 1 or scheduled.core_count > 1:
        return _check_cores(original, scheduled)
    problems: list[str] = []
    mapping = _match_instructions(original, scheduled, problems)
    if problems:
        return problems
    clocks = _replay(scheduled, problems)
    _check_issue_order(scheduled, problems)
    if problems:
        return problems
    _check_hazards(original, mapping, clocks, problems)
    return problems


# ------------------------------------------------------------------ 1. same instructions

def _is_end(instr) -> bool:
    return (isinstance(instr, SysTiu) and instr.op == "end") or (isinstance(instr, SysDma) and instr.op == "chain_end")


def _match_instructions(original: Program, scheduled: Program, problems: list[str]) -> dict:
    """(engine, original index) -> scheduled index, for every non-tile-wait instruction."""
    mapping: dict[tuple[Engine, int], int] = {}
    for engine in ENGINES:
        old, new = original.queue(engine), scheduled.queue(engine)
        waiting: dict[tuple, deque] = defaultdict(deque)
        for i, instr in enumerate(old):
            if not instr.is_tile_wait:
                waiting[instr.without_waits()].append(i)
        letter = engine.letter
        for j, instr in enumerate(new):
            if instr.is_tile_wait:
                continue
            slots = waiting.get(instr.without_waits())
            if not slots:
                problems.append(f"{letter}{j + 1} ({instr.op_name}) is not an instruction of the original "
                                f"{engine.value} queue (or appears too often)")
                continue
            mapping[(engine, slots.popleft())] = j
        missing = sorted(i for slots in waiting.values() for i in slots)
        if missing:
            problems.append(f"{len(missing)} {engine.value} instruction(s) of the original are missing, first "
                            f"original {letter}{missing[0] + 1} ({old[missing[0]].op_name})")
        if engine is Engine.TILE and not problems:
            if [mapping[(engine, i)] for i in range(len(old))] != list(range(len(new))):
                problems.append("the TILE queue is reordered (its operands are queue-relative)")
        if old and _is_end(old[-1]) and (not new or not _is_end(new[-1])):
            problems.append(f"the {engine.value} queue no longer ends with {old[-1].op_name}")
    return mapping


# ------------------------------------------------------------------ 2. replay of the sync counters

def _waits(instr) -> list[tuple[int, int]]:
    """(engine code, 1-based id) pairs the instruction waits for (0 = none)."""
    return list(enumerate(instr.waits()))


def _replay(program: Program, problems: list[str]) -> list[np.ndarray]:
    """Per engine, a (queue length, 3) array: how many instructions of each engine are known complete
    when the instruction starts (own engine: those before it in the queue)."""
    queues = [program.queue(e) for e in ENGINES]
    clocks = [np.zeros((len(q), 3), dtype=np.int64) for q in queues]
    known = [[0, 0, 0] for _ in ENGINES]       # clock of the last started instruction per engine
    done = [0, 0, 0]
    progressed = True
    while progressed:
        progressed = False
        for code, engine in enumerate(ENGINES):
            q = queues[code]
            while done[code] < len(q):
                waits = [(o, w) for o, w in _waits(q[done[code]]) if w > 0]
                if any(done[o] < w for o, w in waits):
                    break
                vc = list(known[code])
                vc[code] = done[code]
                for o, w in waits:
                    other = clocks[o][w - 1]
                    vc = [max(a, int(b)) for a, b in zip(vc, other)]
                    vc[o] = max(vc[o], w)
                clocks[code][done[code]] = vc
                known[code] = vc
                done[code] += 1
                progressed = True
    stuck = [f"{LETTER[c]}{done[c] + 1} waits for " + ", ".join(f"{LETTER[o]}{w}" for o, w in
                                                              _waits(queues[c][done[c]]) if w > done[o])
             for c in range(3) if done[c] < len(queues[c])]
    if stuck:
        problems.append("deadlock: " + "; ".join(stuck))
    return clocks


def _check_issue_order(program: Program, problems: list[str]) -> None:
    fields = IdFields.of(program.chip)
    issued = [0, 0, 0]
    queues = [program.queue(e) for e in ENGINES]
    if sorted(program.issue_order) != sorted("".join(e.letter * len(q) for e, q in zip(ENGINES, queues))):
        problems.append("issue order does not list every instruction exactly once")
        return
    for letter in program.issue_order:
        engine = Engine.of_letter(letter)
        code = engine.code
        instr = queues[code][issued[code]]
        for o, w in _waits(instr):
            if w > issued[o]:
                problems.append(f"{letter}{issued[code] + 1} waits for {LETTER[o]}{w}, issued after it")
            elif w and o != Engine.TILE.code and w < window_floor(issued[o], fields.bits(engine)):
                problems.append(f"{letter}{issued[code] + 1} waits for {LETTER[o]}{w}, outside the id window")
        issued[code] += 1


# ------------------------------------------------------------------ 3. hazards

def _range_table(program: Program) -> dict[str, np.ndarray]:
    """One row per LMEM/DDR range of every non-tile-wait instruction of `program`, in issue order."""
    cols = defaultdict(list)
    for pos, (engine, index) in enumerate(program.issue_sequence()):
        instr = program.queue(engine)[index]
        if instr.is_tile_wait:
            continue
        acc = program.accesses(engine, index)
        rows = [(0, r.lane, r.lane + r.lanes, r.lo, r.hi, 0) for r in acc.lmem_reads] + \
               [(0, r.lane, r.lane + r.lanes, r.lo, r.hi, 1) for r in acc.lmem_writes] + \
               [(1, 0, 1, r.lo, r.hi, 0) for r in acc.ddr_reads] + [(1, 0, 1, r.lo, r.hi, 1) for r in acc.ddr_writes]
        for space, l0, l1, lo, hi, write in rows:
            if hi <= lo or l1 <= l0:
                continue
            for name, v in zip(("pos", "engine", "index", "space", "l0", "l1", "lo", "hi", "write"),
                               (pos, engine.code, index, space, l0, l1, lo, hi, write)):
                cols[name].append(v)
    return {k: np.asarray(v, dtype=np.int64) for k, v in cols.items()}


def _check_hazards(original: Program, mapping: dict, clocks: list[np.ndarray], problems: list[str]) -> None:
    t = _range_table(original)
    if not t:
        return
    new_index = np.array([mapping[(ENGINES[e], i)] for e, i in zip(t["engine"].tolist(), t["index"].tolist())],
                         dtype=np.int64)
    for space in (0, 1):
        rows = np.flatnonzero(t["space"] == space)
        if len(rows):
            earlier, later = _adjacent_pairs(t, rows)
            _check_pairs(t, new_index, clocks, earlier, later, original, problems)


def _adjacent_pairs(t, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(earlier row, later row) pairs whose ordering implies every hazard among `rows`: per
    elementary cell (one lane x a byte span no range boundary cuts), each access after the last
    write before it, and each read before the next write after it."""
    lanes = t["l1"][rows] - t["l0"][rows]
    rows = np.repeat(rows, lanes)
    lane = t["l0"][rows] + _ramp(lanes)
    key = lane << 46                                    # offsets and DDR addresses are < 2**46
    lo, hi = key + t["lo"][rows], key + t["hi"][rows]
    edges = np.unique(np.concatenate([lo, hi]))
    first, last = np.searchsorted(edges, lo), np.searchsorted(edges, hi)
    cells = last - first
    rows = np.repeat(rows, cells)
    cell = np.repeat(first, cells) + _ramp(cells)
    pos, write = t["pos"][rows], t["write"][rows]
    order = np.lexsort((write, pos, cell))              # per cell by issue position, reads first
    rows, cell, pos, write = rows[order], cell[order], pos[order], write[order]
    start = np.flatnonzero(np.r_[True, cell[1:] != cell[:-1]])
    run_start = np.repeat(start, np.diff(np.r_[start, len(cell)]))
    k = np.arange(len(cell))
    prev_write = np.maximum.accumulate(np.where(write == 1, k, -1))
    prev_write = np.r_[-1, prev_write[:-1]]
    has_prev = prev_write >= run_start
    run_end = np.repeat(np.r_[start[1:], len(cell)], np.diff(np.r_[start, len(cell)]))
    next_write = np.minimum.accumulate(np.where(write == 1, k, len(k))[::-1])[::-1]
    next_write = np.r_[next_write[1:], len(k)]
    has_next = (next_write < run_end) & (write == 0)
    a = np.concatenate([prev_write[has_prev], k[has_next]])
    b = np.concatenate([k[has_prev], next_write[has_next]])
    keep = pos[a] != pos[b]
    a, b = rows[a[keep]], rows[b[keep]]
    _, unique = np.unique(t["pos"][a] * (int(t["pos"].max()) + 1) + t["pos"][b], return_index=True)
    return a[unique], b[unique]


def _ramp(counts: np.ndarray) -> np.ndarray:
    """0, 1, ..., c-1 for every c in counts, concatenated."""
    total = int(counts.sum())
    return np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)


def _check_pairs(t, new_index, clocks, earlier, later, original, problems) -> None:
    ea, eb = t["engine"][earlier], t["engine"][later]
    na, nb = new_index[earlier], new_index[later]
    same = ea == eb
    ok = np.where(same, na < nb, False)
    cross = ~same
    if cross.any():
        known = np.zeros(len(earlier), dtype=np.int64)
        for code in range(3):
            sel = cross & (eb == code)
            if sel.any():
                known[sel] = clocks[code][nb[sel], ea[sel]]
        ok = ok | (cross & (known >= na + 1))
    for k in np.flatnonzero(~ok)[:20].tolist():
        a, b = earlier[k], later[k]
        problems.append(f"hazard not ordered: original {_name(original, t, a)} "
                        f"{'writes' if t['write'][a] else 'reads'} bytes that {_name(original, t, b)} "
                        f"{'writes' if t['write'][b] else 'reads'}; scheduled as "
                        f"{LETTER[t['engine'][a]]}{new_index[a] + 1} and {LETTER[t['engine'][b]]}{new_index[b] + 1}")


def _name(program: Program, t, row) -> str:
    engine, index = ENGINES[t["engine"][row]], int(t["index"][row])
    layer = program.layer_of(engine, index)
    return f"{LETTER[t['engine'][row]]}{index + 1} ({program.queue(engine)[index].op_name}{', ' + layer if layer else ''})"


# ------------------------------------------------------------------ multi-core programs

def _check_cores(original: Program, scheduled: Program) -> list[str]:
    if original.core_count != scheduled.core_count:
        return [f"{scheduled.core_count} cores, the original has {original.core_count}"]
    problems: list[str] = []
    mappings = []
    for k in range(original.core_count):
        found: list[str] = []
        mappings.append(_match_instructions(original.core(k), scheduled.core(k), found))
        _check_issue_order(scheduled.core(k), found)
        problems += [f"core {k}: {p}" for p in found]
    if problems:
        return problems
    clocks, _ = _replay_chip(scheduled, problems)
    original_problems: list[str] = []
    _, original_order = _replay_chip(original, original_problems)
    if original_problems:
        problems += [f"original: {p}" for p in original_problems]
    if not problems:
        _check_chip_hazards(original, mappings, clocks, original_order, problems)
    return problems


def _replay_chip(program: Program, problems: list[str]) -> tuple[list[np.ndarray], dict]:
    """Per unit (core * 3 + engine code) a (queue length, 3 * cores) array of what is known complete
    when each instruction starts, and the replay position of every (unit, index)."""
    n = len(ENGINES)
    views = [program.core(k) for k in range(program.core_count)]
    queues = [view.queue(e) for view in views for e in ENGINES]
    width = len(queues)
    clocks = [np.zeros((len(q), width), dtype=np.int64) for q in queues]
    known = [[0] * width for _ in queues]
    done = [0] * width
    messages = MessageQueue(program.chip.core.message_ids)
    rounds: dict[int, list[int]] = {}
    position: dict[tuple[int, int], int] = {}
    progressed = True
    while progressed:
        progressed = False
        for unit, q in enumerate(queues):
            base = unit - unit % n
            while done[unit] < len(q):
                instr = q[done[unit]]
                waits = [(base + o, w) for o, w in _waits(instr) if w > 0]
                message = instr.message()
                if any(done[o] < w for o, w in waits) or (message is not None and not messages.ready(message)):
                    break
                vc = list(known[unit])
                vc[unit] = done[unit]
                for o, w in waits:
                    vc = [max(a, int(b)) for a, b in zip(vc, clocks[o][w - 1])]
                    vc[o] = max(vc[o], w)
                if message is not None:
                    vc = _deliver(message, unit, done[unit], vc, messages, rounds, problems)
                clocks[unit][done[unit]] = vc
                known[unit] = vc
                position[(unit, done[unit])] = len(position)
                done[unit] += 1
                progressed = True
    stuck = [f"core {u // n} {LETTER[u % n]}{done[u] + 1}" for u in range(width) if done[u] < len(queues[u])]
    if stuck:
        problems.append("deadlock across cores, stuck: " + ", ".join(stuck))
    return clocks, position


def _deliver(message, unit: int, index: int, vc: list[int], messages: MessageQueue, rounds: dict,
             problems: list[str]) -> list[int]:
    """Apply a send or wait to the message queue; a wait's clock joins its round's sends."""
    problem = messages.problem(message) or (messages.send(message) if message.kind == "send" else "")
    if problem:
        problems.append(problem)
    if message.kind == "send":
        done = list(vc)
        done[unit] = index + 1
        round_clock = rounds.get(message.msg_id)
        rounds[message.msg_id] = done if round_clock is None else [max(a, b) for a, b in zip(round_clock, done)]
        return vc
    joined = [max(a, b) for a, b in zip(vc, rounds.get(message.msg_id, vc))]
    if messages.wait(message):
        rounds.pop(message.msg_id, None)
    return joined


def _chip_range_table(original: Program, order: dict) -> dict[str, np.ndarray]:
    """_range_table over every core: `engine` is the unit, `pos` the original's replay position,
    LMEM of core k is space 2 + k, DDR (shared) space 1."""
    cols = defaultdict(list)
    n = len(ENGINES)
    for k in range(original.core_count):
        view = original.core(k)
        for engine in ENGINES:
            for index, instr in enumerate(view.queue(engine)):
                if instr.is_tile_wait:
                    continue
                unit = k * n + engine.code
                acc = view.accesses(engine, index)
                rows = [(2 + k, r.lane, r.lane + r.lanes, r.lo, r.hi, 0) for r in acc.lmem_reads] + \
                       [(2 + k, r.lane, r.lane + r.lanes, r.lo, r.hi, 1) for r in acc.lmem_writes] + \
                       [(1, 0, 1, r.lo, r.hi, 0) for r in acc.ddr_reads] + [(1, 0, 1, r.lo, r.hi, 1) for r in acc.ddr_writes]
                for space, l0, l1, lo, hi, write in rows:
                    if hi <= lo or l1 <= l0:
                        continue
                    for name, v in zip(("pos", "engine", "index", "space", "l0", "l1", "lo", "hi", "write"),
                                       (order[(unit, index)], unit, index, space, l0, l1, lo, hi, write)):
                        cols[name].append(v)
    return {k: np.asarray(v, dtype=np.int64) for k, v in cols.items()}


def _check_chip_hazards(original: Program, mappings: list[dict], clocks: list[np.ndarray], order: dict,
                        problems: list[str]) -> None:
    t = _chip_range_table(original, order)
    if not t:
        return
    n = len(ENGINES)
    new_index = np.array([mappings[u // n][(ENGINES[u % n], i)] for u, i in zip(t["engine"].tolist(), t["index"].tolist())],
                         dtype=np.int64)
    for space in sorted(set(t["space"].tolist())):
        rows = np.flatnonzero(t["space"] == space)
        earlier, later = _adjacent_pairs(t, rows)
        ua, ub = t["engine"][earlier], t["engine"][later]
        na, nb = new_index[earlier], new_index[later]
        ok = np.where(ua == ub, na < nb, False)
        cross = ua != ub
        known = np.zeros(len(earlier), dtype=np.int64)
        for unit in np.unique(ub[cross]).tolist():
            sel = cross & (ub == unit)
            known[sel] = clocks[unit][nb[sel], ua[sel]]
        ok = ok | (cross & (known >= na + 1))
        for k in np.flatnonzero(~ok)[:20].tolist():
            a, b = earlier[k], later[k]
            problems.append(f"hazard not ordered: original {_unit_name(original, t, a)} "
                            f"{'writes' if t['write'][a] else 'reads'} bytes that {_unit_name(original, t, b)} "
                            f"{'writes' if t['write'][b] else 'reads'}; no wait or message orders them in the "
                            f"scheduled program")


def _unit_name(program: Program, t, row) -> str:
    core, code = divmod(int(t["engine"][row]), len(ENGINES))
    view, engine, index = program.core(core), ENGINES[code], int(t["index"][row])
    layer = view.layer_of(engine, index)
    return f"core {core} {LETTER[code]}{index + 1} ({view.queue(engine)[index].op_name}{', ' + layer if layer else ''})"
