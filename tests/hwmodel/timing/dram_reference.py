"""The DRAM rules of the timing model applied to every DDR request of a queue in order: the
reference the per-pattern passes (occupancy.py, transfers.py) are checked against."""

from __future__ import annotations

import numpy as np


def by_request(chip, instrs):
    """(occupancy (n, U), service (n, 2) read/write, page hits / misses / opens per UMC) from one pass over
    every DDR request of the queue in order (wdc's per-request rules)."""
    from tpuflow.hwmodel.timing.clocks import Clocks
    from tpuflow.hwmodel.timing.gdma import DDR, CommandModel, _Side
    from tpuflow.hwmodel.timing.wdc import DramState, WdcParams, _direction_switch, _page_state, _service_order
    p = WdcParams.of(chip, Clocks.of(chip))
    reads, writes, rk, wk, *_ = zip(*[CommandModel(chip, Clocks.of(chip))._sides(i) for i in instrs])
    rs, ws = _Side(list(reads), list(rk)), _Side(list(writes), list(wk))
    r, w = rs.select(DDR), ws.select(DDR)
    cmd = np.concatenate([rs.cmd[r], ws.cmd[w]])
    write = np.concatenate([np.zeros(len(r), dtype=bool), np.ones(len(w), dtype=bool)])
    order = np.argsort(cmd * 2 + write, kind="stable")
    addr, size = np.concatenate([rs.addr[r], ws.addr[w]])[order], np.concatenate([rs.size[r], ws.size[w]])[order]
    write, cmd = write[order], cmd[order]
    umc, bank_key, row = p.decode(addr)
    served = _service_order(p, umc, cmd * 2 + write, bank_key, row)
    state = DramState(p)
    hit, closed = _page_state(bank_key[served], row[served], state)
    wr, u, c = write[served], umc[served], cmd[served]
    switch = _direction_switch(u, wr, state)
    cost = -(-size[served] // p.beat_bytes) * p.beat_ps + np.where(
        hit, switch * np.where(wr, p.turn_ps[1], p.turn_ps[0]),
        np.where(closed, p.open_ps, np.where(wr, p.close_ps[1], p.close_ps[0]) + p.open_ps))
    n, U = len(instrs), p.umcs
    occ, service = np.zeros(n * U, dtype=np.int64), np.zeros(n * 2, dtype=np.int64)
    np.add.at(occ, c * U + u, cost)
    np.add.at(service, c * 2 + wr, cost)
    counts = [np.bincount(u[m], minlength=U) for m in (hit, ~hit & ~closed, closed)]
    return occ.reshape(n, U), service.reshape(n, 2), counts
