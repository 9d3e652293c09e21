"""IFE: pre-decode, async FIFOs, decode, check and issue of the instruction stream; hand-over to engines.

Stages run in order, one instruction each, with blocking after service: a stage holds its
instruction until the FIFO after it has room (FIFO of depth d: instruction i may enter once
instruction i - d has left it). Times in ps, S = clk_i period, F = clk_ife period:

  TXI       txi_acq[i] = max(txi_acq[i-1] + ceil(bits_i / txi_word_bits) * S, pack_pop[i - cm_fifo])
  pack      pack_pop = max(txi_acq, pack_push[i-1]); pack_push = max(pack_pop + pack*S, a1_pop[i - predecode])
  async 1   a1_pop = max(pack_push, a1_push[i-1]);  a1_push = max(a1_pop + async*S, a2_pop[i - async_in])
  async 2   a2_pop = max(edge_F(a1_push), a2_push[i-1]); a2_push = max(a2_pop + async*F, dec_pop[i - async_out])
  decode    dec_pop = max(a2_push, dec_push[i-1]);  dec_push = max(dec_pop + decode*F, chk_pop[i - decode_fifo])
  check     chk_pop = max(dec_push, chk_push[i-1]); chk_push = max(chk_pop + check*F, iss_pop[i - check_fifo])
  issue     iss_pop = max(chk_push, iss_push[i-1]); ready = iss_pop + issue*F; iss_push >= ready once the
            target engine's request FIFO (depth tiu/gdma/tile_request_fifo_depth) has room
  transfer  the head of an engine's request FIFO moves into the engine's command list when the list
            has room for its descriptor bytes (tiu/gdma/tile_cmd_fifo_bytes) and fewer than
            target_pending_commands hand-overs are in flight; a hand-over takes transfer_cycles*F.
            The engine frees the bytes when it takes the command (TIU DES, GDMA dispatch, TILE start).

Timestamps per instruction: txi_acq, pack (= pack_push), decode (= dec_push), check (= chk_push),
issue (= iss_push). The IFE is one in-order pipeline: a full engine blocks everything behind it.
The instructions arrive over TXI (the AXI input path and the move FIFO are not modelled).
"""

from __future__ import annotations

from collections import deque

from tpuflow.chip import ChipConfig
from tpuflow.hwmodel.timing.clocks import Clocks
from tpuflow.hwmodel.timing.events import ISSUE, TRANSFER, push

class FrontEnd:
    """The recurrences of the stages before issue (everything that does not depend on engines)."""

    NAMES = ("txi", "pack_pop", "pack_push", "a1_pop", "a1_push", "a2_pop", "a2_push", "dec_pop",
             "dec_push", "chk_pop", "chk_push", "iss_pop", "iss_push")

    def __init__(self, chip: ChipConfig, clocks: Clocks, bits: list[int]):
        f = chip.ife
        self.S, self.F = clocks.sys.period, clocks.ife.period
        self.ife_clock, self.sys_clock = clocks.ife, clocks.sys
        self.words = [-(-b // f.txi_word_bits) for b in bits]
        self.depth = (f.cm_fifo_depth, f.predecode_fifo_depth, f.async_input_fifo_depth,
                      f.async_output_fifo_depth, f.decode_fifo_depth, f.check_fifo_depth)
        self.cyc = (f.pack_cycles * self.S, f.async_stage_cycles * self.S, f.async_stage_cycles * self.F,
                    f.decode_cycles * self.F, f.check_cycles * self.F, f.issue_cycles * self.F)
        n = len(bits)
        self.t = {k: [0] * n for k in self.NAMES}
        self._lists = tuple(self.t[k] for k in self.NAMES)
        self._txi_ps = [w * self.S for w in self.words]
        self._constants = (*self.depth, *self.cyc, self.sys_clock.period, self.ife_clock.period)

    def advance(self, i: int) -> int:
        """Compute instruction i's stage times (needs iss_push[i-1]); returns when issue is ready."""
        txi_l, pp_l, pu_l, a1p_l, a1u_l, a2p_l, a2u_l, dp_l, du_l, cp_l, cu_l, ip_l, iu_l = self._lists
        d_cm, d_pre, d_ain, d_aout, d_dec, d_chk, c_pack, c_a1, c_a2, c_dec, c_chk, c_iss, sys_p, ife_p = self._constants
        if i:
            p = i - 1
            prev_txi, prev_pack, prev_a1, prev_a2 = txi_l[p], pu_l[p], a1u_l[p], a2u_l[p]
            prev_dec, prev_chk, prev_iss = du_l[p], cu_l[p], iu_l[p]
        else:
            prev_txi = prev_pack = prev_a1 = prev_a2 = prev_dec = prev_chk = prev_iss = 0
        # a stage holds its instruction until the one `depth` places ahead has left the next FIFO
        # (conditional expressions instead of max(): this runs once per instruction)
        txi, hold = prev_txi + self._txi_ps[i], (pp_l[i - d_cm] if i >= d_cm else 0)
        txi = txi if txi > hold else hold
        pack_pop = txi if txi > prev_pack else prev_pack
        pack_push, hold = pack_pop + c_pack, (a1p_l[i - d_pre] if i >= d_pre else 0)
        pack_push = pack_push if pack_push > hold else hold
        a1_pop = pack_push if pack_push > prev_a1 else prev_a1
        hold = a2p_l[i - d_ain] if i >= d_ain else 0
        a1_push, hold = a1_pop + c_a1, -(-hold // sys_p) * sys_p
        a1_push = a1_push if a1_push > hold else hold
        a2_pop = -(-a1_push // ife_p) * ife_p
        a2_pop = a2_pop if a2_pop > prev_a2 else prev_a2
        a2_push, hold = a2_pop + c_a2, (dp_l[i - d_aout] if i >= d_aout else 0)
        a2_push = a2_push if a2_push > hold else hold
        dec_pop = a2_push if a2_push > prev_dec else prev_dec
        dec_push, hold = dec_pop + c_dec, (cp_l[i - d_dec] if i >= d_dec else 0)
        dec_push = dec_push if dec_push > hold else hold
        chk_pop = dec_push if dec_push > prev_chk else prev_chk
        chk_push, hold = chk_pop + c_chk, (ip_l[i - d_chk] if i >= d_chk else 0)
        chk_push = chk_push if chk_push > hold else hold
        iss_pop = chk_push if chk_push > prev_iss else prev_iss
        txi_l[i], pp_l[i], pu_l[i], a1p_l[i], a1u_l[i], a2p_l[i], a2u_l[i] = (txi, pack_pop, pack_push, a1_pop,
                                                                                 a1_push, a2_pop, a2_push)
        dp_l[i], du_l[i], cp_l[i], cu_l[i], ip_l[i] = dec_pop, dec_push, chk_pop, chk_push, iss_pop
        return iss_pop + c_iss


class Ife:
    """Issue stage, per-engine request FIFOs and hand-over to the engines' command lists (events).
    Per issue position it keeps when issue was ready, when the hand-over started and when it arrived
    (the simulator turns them into stage times and fifo_full stalls after the run)."""

    def __init__(self, sim, chip: ChipConfig, clocks: Clocks, order: list[tuple[int, int]], bits: list[int]):
        f = chip.ife
        self.sim, self.q, self.order = sim, sim.queue, order
        self.engines = sim.engines
        self.front = FrontEnd(chip, clocks, bits)
        self.bytes = [b // 8 for b in bits]
        self.depth = (f.tiu_request_fifo_depth, f.gdma_request_fifo_depth, f.tile_request_fifo_depth)
        self.capacity = (f.tiu_cmd_fifo_bytes, f.gdma_cmd_fifo_bytes, f.tile_cmd_fifo_bytes)
        self.handover = f.transfer_cycles * clocks.ife.period
        self.pending_max = f.target_pending_commands
        self.requests = [deque(), deque(), deque()]      # (position in issue order, pushed at)
        self.in_flight = [deque(), deque(), deque()]     # arrival times of hand-overs not yet done
        self.used = [0, 0, 0]
        self.transfer_scheduled = [False, False, False]
        self.blocked = False
        self.pos = 0
        self.codes = [code for code, _ in order]
        self.indices = [index for _, index in order]
        self.count = n = len(order)
        self.ready = [0] * n
        self.issued = self.front.t["iss_push"]
        self.moved = [0] * n          # hand-over start
        self.arrived = [0] * n        # in the engine's command list

    def start(self) -> None:
        if self.order:
            self.ready[0] = self.front.advance(0)
            self.q.schedule(self.ready[0], ISSUE, self._issue)

    def _issue(self, _) -> None:
        pos = self.pos
        code = self.codes[pos]
        requests = self.requests[code]
        if len(requests) >= self.depth[code]:
            self.blocked = True
            return
        now = self.q.now
        self.issued[pos] = now
        requests.append((pos, now))
        if not self.transfer_scheduled[code]:
            self._try_transfer(code)
        self.pos = pos = pos + 1
        if pos < self.count:
            self.ready[pos] = ready = self.front.advance(pos)     # >= now: issue follows the stages
            q = self.q
            q.seq = seq = q.seq + 1
            push(q.heap, (ready, ISSUE, seq, self._issue, None))

    def _try_transfer(self, code: int) -> None:
        requests = self.requests[code]
        if self.transfer_scheduled[code] or not requests:
            return
        pos, pushed = requests[0]
        if self.used[code] + self.bytes[pos] > self.capacity[code]:
            return   # retried when the engine takes a command (cmd_taken)
        flight = self.in_flight[code]
        q = self.q
        t = q.now
        if pushed > t:
            t = pushed
        if len(flight) >= self.pending_max and flight[0] > t:
            t = flight[0]
        self.transfer_scheduled[code] = True
        q.seq = seq = q.seq + 1
        push(q.heap, (t, TRANSFER, seq, self._transfer, code))

    def _transfer(self, code: int) -> None:
        self.transfer_scheduled[code] = False
        pos, pushed = self.requests[code].popleft()
        now = self.q.now
        self.used[code] += self.bytes[pos]
        flight = self.in_flight[code]
        if len(flight) >= self.pending_max:
            flight.popleft()
        arrival = now + self.handover
        flight.append(arrival)
        self.moved[pos], self.arrived[pos] = now, arrival
        self.engines[code].arrive(self.indices[pos], arrival)
        if self.blocked and self.codes[self.pos] == code:
            self.blocked = False
            self.q.schedule(now, ISSUE, self._issue)
        if self.requests[code]:
            self._try_transfer(code)

    def cmd_taken(self, code: int, pos: int) -> None:
        """The engine took a command out of its list: its bytes are free."""
        self.used[code] -= self.bytes[pos]
        if not self.transfer_scheduled[code] and self.requests[code]:
            self._try_transfer(code)
