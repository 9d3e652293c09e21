"""The deterministic event heap: events ordered by (time ps, priority, insertion sequence)."""

from __future__ import annotations

from heapq import heappop, heappush
from typing import Callable

# Priorities at equal time: completions publish sync ids before anyone looks at them, then
# engines dispatch, then the IFE moves instructions.
COMPLETE, DISPATCH, TRANSFER, ISSUE = 0, 1, 2, 3


class EventQueue:
    """A SimPy-style core: schedule(time, priority, callback, arg); run() pops in (time, priority, seq)
    order, so equal-time events are processed in a fixed, documented order and runs repeat exactly."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, int, Callable, object]] = []
        self._seq = 0
        self.now = 0

    @property
    def processed(self) -> int:
        """Events run so far (scheduled minus still waiting)."""
        return self._seq - len(self._heap)

    def schedule(self, time: int, priority: int, callback: Callable, arg: object = None) -> None:
        if time < self.now:
            raise AssertionError(f"event scheduled in the past: {time} < {self.now}")
        self._seq = seq = self._seq + 1
        heappush(self._heap, (time, priority, seq, callback, arg))

    def run(self) -> None:
        heap = self._heap
        while heap:
            time, _, _, callback, arg = heappop(heap)
            self.now = time
            callback(arg)
