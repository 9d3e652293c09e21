"""The layer-group search: which spans of a run of fused groups execute slice by slice (and with
how many slices), chosen by dynamic programming over the run's topological order so that the
estimated time saved (the one per-instruction cost model, hwmodel.timing.cost) is greatest.

Each candidate span carries the time it saves: its members' time run unsliced minus their time
run sliced, both estimated for the span as a whole. Chosen spans may not share a member."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class SpanOption:
    """Run positions [lo, hi] executed together one way (e.g. sliced: `payload`), saving `saving`
    (ps) against running them unsliced."""

    lo: int
    hi: int
    saving: int
    payload: object = None


def best_selection(length: int, options: Sequence[SpanOption]) -> tuple[int, list[SpanOption]]:
    """The non-overlapping options of a run of `length` positions with the greatest total saving.
    best[p] is the greatest saving within positions [0, p): position p - 1 unsliced (best[p - 1])
    or an option ending there after best[lo]. Ties keep the unsliced way, then the earlier option."""
    ending: dict[int, list[SpanOption]] = {}
    for option in options:
        if not 0 <= option.lo <= option.hi < length:
            raise ValueError(f"option {option.lo}..{option.hi} is outside a run of {length}")
        ending.setdefault(option.hi, []).append(option)
    best = [0] * (length + 1)
    step: list[SpanOption | None] = [None] * (length + 1)
    for p in range(1, length + 1):
        best[p] = best[p - 1]
        for option in ending.get(p - 1, ()):
            if best[option.lo] + option.saving > best[p]:
                best[p], step[p] = best[option.lo] + option.saving, option
    chosen, p = [], length
    while p > 0:
        option = step[p]
        if option is None:
            p -= 1
        else:
            chosen.append(option)
            p = option.lo
    return best[-1], chosen[::-1]


def selection_saving(chosen: Sequence[SpanOption]) -> int:
    """The total saving of `chosen`; ValueError when two of them share a position."""
    taken: set[int] = set()
    for option in chosen:
        span = set(range(option.lo, option.hi + 1))
        if span & taken:
            raise ValueError(f"options overlap at {sorted(span & taken)[0]}")
        taken |= span
    return sum(option.saving for option in chosen)
