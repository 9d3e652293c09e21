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

from tpuflow.hwmodel.timing.wdc import DramState, WdcParams, _service_order


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
    first: dict                    # deferred requests (one per (UMC, bank class), by class): key, umc, page,
                                   # last_page (of the class's last request), write, first_of_umc, switch, beats
    last_dir: dict                 # key, umc, last write flag per UMC


def patterns(p: WdcParams, addr: np.ndarray, size: np.ndarray, write: np.ndarray, key: np.ndarray, count: int) -> Patterns:
    """The pattern tables of requests given pattern by pattern (key ascending; reads before writes)."""
    U, banks = p.umcs, p.banks
    stream = key * 2 + write
    umc, local_page = p.umc_page(addr)
    served = _service_order(p, umc, stream, None, None, local_page)
    u, wr, k, page = umc[served], write[served], key[served], local_page[served]
    cell = k * U + u
    klass = cell * banks + page % banks
    by_class = np.argsort(klass, kind="stable")
    starts, ends = _runs(klass[by_class])
    fk, lk = by_class[starts], by_class[ends]          # first / last request of each class, by class
    previous = np.empty(len(page), dtype=np.int64)     # the page of the class's previous request (first: -1)
    previous[by_class[1:]] = page[by_class[:-1]]
    previous[fk] = -1
    hit, first = previous == page, previous < 0
    by_cell = np.argsort(cell.astype(np.int16) if len(cell) and cell.max() < (1 << 15) else cell, kind="stable")
    c, w = cell[by_cell], wr[by_cell]
    switch = np.zeros(len(c), dtype=bool)      # the other way than the cell's previous request
    switch[by_cell[1:]] = (c[1:] == c[:-1]) & (w[1:] != w[:-1])
    cell_starts, cell_ends = _runs(c)
    first_umc = np.zeros(len(u), dtype=bool)
    first_umc[by_cell[cell_starts]] = True
    beats = (size[served] + (p.beat_bytes - 1)) // p.beat_bytes * p.beat_ps     # whole beats
    close = np.where(wr, p.close_ps[1], p.close_ps[0])
    turn = np.where(wr, p.turn_ps[1], p.turn_ps[0])
    cost = np.where(first, 0, beats + np.where(hit, switch * turn, close + p.open_ps))   # first: per command
    flat = (lambda values: np.bincount(cell, weights=values, minlength=count * U).astype(np.int64).reshape(count, U))
    tally = (lambda mask: np.bincount(cell[mask], minlength=count * U).astype(np.int64).reshape(count, U))
    decided = ~first
    svc = np.bincount(k * 2 + wr, weights=cost, minlength=count * 2).astype(np.int64).reshape(count, 2)
    rw = np.bincount(k * 2 + write, weights=size, minlength=count * 2).astype(np.int64).reshape(count, 2)
    deferred = {"key": k[fk], "umc": u[fk], "page": page[fk], "last_page": page[lk], "write": wr[fk],
                "first_of_umc": first_umc[fk], "switch": switch[fk], "beats": beats[fk]}
    lu = by_cell[cell_ends]
    dirs = {"key": k[lu], "umc": u[lu], "last": wr[lu]}
    return Patterns(flat(cost), tally(decided & hit), tally(decided & ~hit), svc, rw,
                    np.bincount(key, minlength=count), deferred, dirs)


def _runs(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first index, last index) of every run of equal values of a sorted array."""
    if not len(values):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    change = np.flatnonzero(values[1:] != values[:-1])
    return np.append(0, change + 1), np.append(change, len(values) - 1)


def _expand(index: np.ndarray, table: dict, keys: np.ndarray, columns: tuple) -> tuple[np.ndarray, np.ndarray, dict]:
    """Rows of `table` for each command (command c gets the rows of pattern keys[c]), in command order:
    (command of each row, rows per command, the rows' `columns`)."""
    counts = np.bincount(table["key"], minlength=int(keys.max()) + 1 if len(keys) else 0)   # rows are by key
    starts = np.cumsum(counts) - counts
    n = counts[keys]
    cmd = np.repeat(index, n)
    pick = np.repeat(starts[keys] - (np.cumsum(n) - n), n) + np.arange(int(n.sum()))
    return cmd, n, {name: table[name][pick] for name in columns}


def _previous(group: np.ndarray, value: np.ndarray, initial: int) -> np.ndarray:
    """For every row (rows in time order, at most one per group and time) the value of the latest earlier
    row of its group (`initial` if none)."""
    order = np.argsort(group.astype(np.int16) if len(group) and group.max() < (1 << 15) else group, kind="stable")
    g, v = group[order], value[order]
    before = np.empty(len(g), dtype=np.int64)
    if len(g):
        before[0] = initial
        before[1:] = np.where(g[1:] == g[:-1], v[:-1], initial)
    out = np.empty(len(g), dtype=np.int64)
    out[order] = before
    return out


def command_occupancy(p: WdcParams, pats: Patterns, index: np.ndarray, keys: np.ndarray, pages: np.ndarray,
                      n: int, state: DramState) -> tuple[np.ndarray, np.ndarray]:
    """(occupancy (n, U) ps, DRAM service ps (n, 2) by direction) of the commands `index` (queue order)
    using patterns `keys`, their pages moved by `pages`; counts go into `state`. A command's deferred
    requests are one per (UMC, bank) it touches: each finds the row the latest earlier command touching
    that bank left open (that command's last request there)."""
    U, banks = p.umcs, p.banks
    occ = np.zeros((n, U), dtype=np.int64)
    service = np.zeros((n, 2), dtype=np.int64)
    occ[index] = pats.occupancy[keys]
    service[index] = pats.service[keys]
    q_cmd, rows, q = _expand(index, pats.first, keys, ("umc", "page", "last_page", "write", "first_of_umc",
                                                        "switch", "beats"))
    shift = np.repeat(pages, rows)
    q_page = q["page"] + shift
    bank = q["umc"] * banks + q_page % banks
    prev = _previous(bank, (q["last_page"] + shift) // banks, -1)
    d_cmd, _, dirs = _expand(index, pats.last_dir, keys, ("umc", "last"))
    last_dir = np.full(n * U, -1, dtype=np.int64)
    last_dir[d_cmd * U + dirs["umc"]] = _previous(dirs["umc"], dirs["last"].astype(np.int64), -1)
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
