"""Errors raised while the functional model executes a Program."""

from __future__ import annotations

from tpuflow.errors import TpuflowError, UserError


class ExecutionError(TpuflowError):
    """An instruction that cannot execute as written (out-of-range address, inconsistent shapes,
    a tile read after release ...): a compiler bug, reported with the instruction that did it."""


class InputMismatchError(UserError):
    """The arrays given to run() do not match the program's input tensors (name, shape, dtype)."""
