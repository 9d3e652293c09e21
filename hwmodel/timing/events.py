"""The deterministic event heap: events ordered by (time ps, priority, insertion sequence)."""

from __future__ import annotations

from heapq import heappop, heappush
from typing import Callable

push = heappush     # for callers that schedule on EventQueue.heap directly

# Priorities at equal time: completions publish sync ids before anyone looks at them, then
# engines dispatch, then the IFE moves instructions.
COMPLETE, DISPATCH, TRANSFER, ISSUE = 0, 1, 2, 3


class EventQueue:
    """A SimPy-style core: schedule(time, priority, callback, arg); run() pops in (time, priority, seq)
    order, so equal-time events are processed in a fixed, documented order and runs repeat exactly.
    The hottest callers push (time, priority, seq, callback, arg) onto `heap` themselves (push below),
    with a time they computed as at least `now`."""

    def __init__(self) -> None:
        self.heap: list[tuple[int, int, int, Callable, object]] = []
        self.seq = 0
        self.now = 0

    @property
    def processed(self) -> int:
        """Events run so far (scheduled minus still waiting)."""
        return self.seq - len(self.heap)

    def schedule(self, time: int, priority: int, callback: Callable, arg: object = None) -> None:
        if time < self.now:
            raise AssertionError(f"event scheduled in the past: {time} < {self.now}")
        self.seq = seq = self.seq + 1
        heappush(self.heap, (time, priority, seq, callback, arg))

    def run(self) -> None:
        heap = self.heap
        while heap:
            time, _, _, callback, arg = heappop(heap)
            self.now = time
            callback(arg)
