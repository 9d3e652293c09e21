"""Orders each engine's queue: program order, list scheduling, CP-SAT windows; bounds; checker."""

from __future__ import annotations

from tpuflow.errors import OptionError


def schedule(program, method: str, time_limit_s: float = 20.0):
    """The program reordered by `method` (only 'program' exists until the scheduler lands)."""
    if method == "program":
        return program
    raise OptionError(f"--schedule {method}: not available yet (use --schedule program)")
