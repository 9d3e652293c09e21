"""DRAM occupancy of every GDMA command per UMC (the rate model's `dram` term, transfers.py), computed once per
distinct request pattern and then carried through the DRAM page state command by command, vectorised.

A command's DDR requests are cached bursts moved by a shift (segments.relative_bursts). UMC and page of a
byte address: umc = (addr >> interleave_bits) % U, page = local // page_bytes, i.e. addr // M with
M = U x page_bytes when the page holds whole granules; bank = page % banks, row = page // banks. So moving
the requests by a multiple of M keeps every UMC, and moves every page by the same number of pages. A
pattern is (read bursts, write bursts, their shifts minus a common base B, a multiple of M); everything
inside one command that the per-request rules depend on is a function of the pattern:

  service order   wdc._service_order (per stream and UMC, AuxCam page grouping)
  per request     beats x beat_ps, plus
                  - the first request of its (UMC, bank) in the command: decided by the DRAM state
                    the earlier commands left (hit: a turnaround if its UMC last went the other way;
                    closed: open_page; miss: close + open)
                  - any later one: hit (same page as that bank's previous request in the command: a
                    turnaround if the UMC's previous request went the other way) or miss (close + open)

Commands then run in queue order over (UMC, absolute bank) and UMC: the first requests look up the row and
direction the latest earlier command left (one stable sort by bank key and a running index, not a loop),
exactly what the per-request pass over the whole program (wdc._page_state, _direction_switch) gives.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tpuflow.hwmodel.timing.wdc import DramState, WdcParams, _page_state, _service_order


class _Fresh:
    """A DramState stand-in with every bank closed (for one pattern's own rules)."""

    def __init__(self, banks: int):
        self.open_row = np.full(banks, -1, dtype=np.int64)


@dataclass
class Patterns:
    """Per distinct pattern k: own occupancy, counts and service sums; its deferred requests (the first of
    their (UMC, bank)) and its last row per (UMC, bank) and direction per UMC, as flat tables."""

    occupancy: np.ndarray          # (K, U) ps of the requests decided inside the pattern
    hits: np.ndarray               # (K, U) page hits decided inside
    misses: np.ndarray             # (K, U)
    service: np.ndarray            # (K, 2) ps decided inside, by direction (read, write)
    bytes_rw: np.ndarray           # (K, 2)
    bursts: np.ndarray             # (K,)
    first: dict                    # deferred requests: key, umc, page, write, first_of_umc, switch, cost
    last_row: dict                 # key, umc, page of the last request per (UMC, bank class)
    last_dir: dict                 # key, umc, first write flag, last write flag per UMC


def patterns(p: WdcParams, addr: np.ndarray, size: np.ndarray, write: np.ndarray, key: np.ndarray, count: int) -> Patterns:
    """The pattern tables of requests given pattern by pattern (key ascending; reads before writes)."""
    U, banks = p.umcs, p.banks
    stream = key * 2 + write
    umc, bank_key, row = p.decode(addr)
    served = _service_order(p, umc, stream, bank_key, row)
    u, wr, k = umc[served], write[served], key[served]
    page = row[served] * banks + bank_key[served] % banks
    klass = (k * U + u) * banks + page % banks
    hit, first = _page_state(klass, page, _Fresh(count * U * banks))
    switch = _switch(k * U + u, wr)
    first_umc = np.zeros(len(u), dtype=bool)
    first_umc[np.unique(k * U + u, return_index=True)[1]] = True
    beats = -(-size[served] // p.beat_bytes) * p.beat_ps
    close = np.where(wr, p.close_ps[1], p.close_ps[0])
    turn = np.where(wr, p.turn_ps[1], p.turn_ps[0])
    cost = np.where(first, 0, beats + np.where(hit, switch * turn, close + p.open_ps))   # first: per command
    cell = k * U + u
    flat = (lambda values: np.bincount(cell, weights=values, minlength=count * U).astype(np.int64).reshape(count, U))
    decided = ~first
    svc = np.bincount(k * 2 + wr, weights=cost, minlength=count * 2).astype(np.int64).reshape(count, 2)
    rw = np.bincount(k * 2 + write, weights=size, minlength=count * 2).astype(np.int64).reshape(count, 2)
    d = np.flatnonzero(first)
    deferred = {"key": k[d], "umc": u[d], "page": page[d], "write": wr[d], "first_of_umc": first_umc[d],
                "switch": switch[d], "beats": beats[d]}
    last = _last_of(klass)
    rows = {"key": k[last], "umc": u[last], "page": page[last]}
    lu = _last_of(cell)
    fu = np.flatnonzero(first_umc)
    dirs = {"key": k[lu], "umc": u[lu], "first": _by_cell(cell, fu, wr), "last": wr[lu]}
    return Patterns(flat(cost), flat(decided & hit), flat(decided & ~hit), svc, rw,
                    np.bincount(key, minlength=count), deferred, rows, dirs)


def _switch(cell: np.ndarray, write: np.ndarray) -> np.ndarray:
    """Whether each request goes the other way than the previous request of its cell (False for a cell's
    first)."""
    order = np.argsort(cell, kind="stable")
    c, w = cell[order], write[order]
    out = np.zeros(len(c), dtype=bool)
    if len(c) > 1:
        out[order[1:]] = (c[1:] == c[:-1]) & (w[1:] != w[:-1])
    return out


def _last_of(group: np.ndarray) -> np.ndarray:
    """Index of the last element of each distinct value of `group` (sorted by value)."""
    order = np.argsort(group, kind="stable")
    g = group[order]
    ends = np.append(np.flatnonzero(g[1:] != g[:-1]), len(g) - 1) if len(g) else np.zeros(0, dtype=np.int64)
    return order[ends]


def _by_cell(cell: np.ndarray, first: np.ndarray, wr: np.ndarray) -> np.ndarray:
    """The write flag of each cell's first request, in the order of _last_of(cell)'s cells."""
    order = np.argsort(cell[first], kind="stable")
    return wr[first][order]


def _expand(index: np.ndarray, table: dict, keys: np.ndarray) -> tuple[np.ndarray, dict]:
    """Rows of `table` for each command (command c gets the rows of pattern keys[c]), in command order:
    (command of each row, the rows)."""
    counts = np.bincount(table["key"], minlength=int(keys.max()) + 1 if len(keys) else 0)   # rows are by key
    starts = np.cumsum(counts) - counts
    n = counts[keys]
    cmd = np.repeat(index, n)
    pick = np.repeat(starts[keys], n) + np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
    return cmd, {name: values[pick] for name, values in table.items()}


def _queries_then_updates(q_cmd: np.ndarray, u_cmd: np.ndarray, n: int) -> np.ndarray:
    """Time order of the rows [queries, updates] (each grouped by ascending command): per command its
    queries, then its updates (the argsort of (command, kind), without sorting)."""
    nq, nu = np.bincount(q_cmd, minlength=n), np.bincount(u_cmd, minlength=n)
    start = np.cumsum(nq + nu) - (nq + nu)
    q_pos = start[q_cmd] + np.arange(len(q_cmd)) - (np.cumsum(nq) - nq)[q_cmd]
    u_pos = start[u_cmd] + nq[u_cmd] + np.arange(len(u_cmd)) - (np.cumsum(nu) - nu)[u_cmd]
    time = np.empty(len(q_cmd) + len(u_cmd), dtype=np.int64)
    time[q_pos] = np.arange(len(q_cmd))
    time[u_pos] = len(q_cmd) + np.arange(len(u_cmd))
    return time


def _previous(group: np.ndarray, update: np.ndarray, value: np.ndarray, initial: int) -> np.ndarray:
    """For every row (in time order) the value of the latest earlier update row of its group (`initial`
    if none)."""
    order = np.argsort(group.astype(np.int16) if len(group) and group.max() < (1 << 15) else group, kind="stable")
    g, up = group[order], update[order]
    pos = np.arange(len(g))
    latest = np.maximum.accumulate(np.where(up, pos, -1)) if len(g) else pos
    start = np.zeros(len(g), dtype=np.int64)
    if len(g):
        change = np.flatnonzero(g[1:] != g[:-1]) + 1
        start[change] = change
        start = np.maximum.accumulate(start)
    before = np.where(up, np.concatenate(([-1], latest[:-1])) if len(g) else latest, latest)
    valid = before >= start
    out = np.empty(len(g), dtype=np.int64)
    out[order] = np.where(valid, value[order][np.maximum(before, 0)], initial)
    return out


def command_occupancy(p: WdcParams, pats: Patterns, index: np.ndarray, keys: np.ndarray, pages: np.ndarray,
                      n: int, state: DramState) -> tuple[np.ndarray, np.ndarray]:
    """(occupancy (n, U) ps, DRAM service ps (n, 2) by direction) of the commands `index` (queue order)
    using patterns `keys`, their pages moved by `pages`; counts go into `state`."""
    U, banks = p.umcs, p.banks
    occ = np.zeros((n, U), dtype=np.int64)
    service = np.zeros((n, 2), dtype=np.int64)
    occ[index] = pats.occupancy[keys]
    service[index] = pats.service[keys]
    shift = np.zeros(n, dtype=np.int64)
    shift[index] = pages
    q_cmd, q = _expand(index, pats.first, keys)
    l_cmd, last = _expand(index, pats.last_row, keys)
    q_page, l_page = q["page"] + shift[q_cmd], last["page"] + shift[l_cmd]
    # rows: queries of a command before its updates, commands in queue order
    bank = np.concatenate([q["umc"] * banks + q_page % banks, last["umc"] * banks + l_page % banks])
    update = np.concatenate([np.zeros(len(q_cmd), dtype=bool), np.ones(len(l_cmd), dtype=bool)])
    time = _queries_then_updates(q_cmd, l_cmd, n)
    rows = np.concatenate([q_page // banks, l_page // banks])
    prev = np.empty(len(time), dtype=np.int64)
    prev[time] = _previous(bank[time], update[time], rows[time], -1)
    prev = prev[:len(q_cmd)]
    d_cmd, dirs = _expand(index, pats.last_dir, keys)
    u_dir = np.concatenate([dirs["umc"], dirs["umc"]])
    d_update = np.concatenate([np.zeros(len(d_cmd), dtype=bool), np.ones(len(d_cmd), dtype=bool)])
    d_time = _queries_then_updates(d_cmd, d_cmd, n)
    d_val = np.concatenate([dirs["first"], dirs["last"]]).astype(np.int64)
    d_prev = np.empty(len(d_time), dtype=np.int64)
    d_prev[d_time] = _previous(u_dir[d_time], d_update[d_time], d_val[d_time], -1)
    last_dir = np.full(n * U, -1, dtype=np.int64)
    last_dir[d_cmd * U + dirs["umc"]] = d_prev[:len(d_cmd)]
    wr = q["write"]
    came = last_dir[q_cmd * U + q["umc"]]
    switch = np.where(q["first_of_umc"], (came >= 0) & (came != wr), q["switch"])
    hit, closed = prev == q_page // banks, prev < 0
    close = np.where(wr, p.close_ps[1], p.close_ps[0])
    turn = np.where(wr, p.turn_ps[1], p.turn_ps[0])
    cost = q["beats"] + np.where(hit, switch * turn, np.where(closed, p.open_ps, close + p.open_ps))
    occ += np.bincount(q_cmd * U + q["umc"], weights=cost, minlength=n * U).astype(np.int64).reshape(n, U)
    service += np.bincount(q_cmd * 2 + wr, weights=cost, minlength=n * 2).astype(np.int64).reshape(n, 2)
    _count(state, pats, keys, q["umc"], hit, closed)
    return occ, service


def _count(state: DramState, pats: Patterns, keys: np.ndarray, umc: np.ndarray, hit, closed) -> None:
    U = len(state.page_hits)
    state.page_hits += pats.hits[keys].sum(axis=0) + np.bincount(umc[hit], minlength=U)
    state.page_misses += pats.misses[keys].sum(axis=0) + np.bincount(umc[~hit & ~closed], minlength=U)
    state.page_opens += np.bincount(umc[closed], minlength=U)
    state.bytes_read += int(pats.bytes_rw[keys, 0].sum())
    state.bytes_written += int(pats.bytes_rw[keys, 1].sum())
    state.bursts += int(pats.bursts[keys].sum())
