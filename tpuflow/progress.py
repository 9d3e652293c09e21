"""Progress of long steps on stderr (one line per finished step), only when stderr is a terminal."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Iterator


def enabled() -> bool:
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


@contextmanager
def step(label: str) -> Iterator[None]:
    """Time the block; on a terminal, print `tpuflow: <label> (<seconds> s)` when it ends."""
    began = time.perf_counter()
    yield
    if enabled():
        sys.stderr.write(f"tpuflow: {label} ({time.perf_counter() - began:.1f} s)\n")
        sys.stderr.flush()
