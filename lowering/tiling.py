"""Tiling helpers: splitting a dimension into steps and the software-pipelined tile loop."""

from __future__ import annotations

import math
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")


def lane_rows(count: int, lanes: int) -> int:
    """The largest divisor of `count` that is at most `lanes` (a flat tensor viewed as rows x cols)."""
    return max(d for d in range(1, min(count, lanes) + 1) if count % d == 0)


def steps(total: int, step: int) -> list[tuple[int, int]]:
    """(start, size) pieces covering [0, total) exactly once."""
    step = max(1, min(step, total))
    return [(s, min(step, total - s)) for s in range(0, total, step)]


def steps_between(lo: int, hi: int, step: int) -> list[tuple[int, int]]:
    """(start, size) pieces covering [lo, hi) exactly once."""
    return [(lo + s, n) for s, n in steps(hi - lo, step)] if hi > lo else []


def pipelined(tiles: Sequence[T], n_sets: int, load: Callable[[T, int], None],
              compute_store: Callable[[T, int], None]) -> None:
    """Emit loads `n_sets` tiles ahead of compute, so the GDMA queue holds the next tiles' loads
    before this tile's stores (which wait for compute) and loads overlap compute."""
    depth = max(1, n_sets)
    for i in range(min(depth, len(tiles))):
        load(tiles[i], i % depth)
    for i, tile in enumerate(tiles):
        compute_store(tile, i % depth)
        nxt = i + depth
        if nxt < len(tiles):
            load(tiles[nxt], nxt % depth)


def largest_fitting(candidates: Sequence[int], fits: Callable[[int], bool]) -> int | None:
    """The largest candidate for which fits() holds (candidates in any order)."""
    for c in sorted(set(candidates), reverse=True):
        if fits(c):
            return c
    return None


MAX_SPREAD_COPIES = 16     # lane_spread: bounds the lane copies (two per copy and step) a spread costs


def lane_spread(channels: int, rows: int, lanes: int) -> tuple[int, int]:
    """(copies, rows per copy) of a map of `channels` channels and `rows` rows spread over the lanes: row blocks
    of as many rows each (copy j takes rows [j * per, (j + 1) * per), the last fewer) side by side along the
    channels, the fewest copies whose channels fill whole lane groups (lanes / gcd(channels, lanes)), at most
    one per row and MAX_SPREAD_COPIES; (1, rows) when channels already fill them."""
    fit = max(1, min(lanes // math.gcd(max(1, channels), lanes), rows, MAX_SPREAD_COPIES))
    per = -(-rows // fit)
    return -(-rows // per), per
