"""Functional model of the chip: executes a Program (every core) on numpy DDR, LMEM, tile registers and ACC.

`run(program, inputs)` is the entry point; `Machine` executes single instructions for tests.
"""

from tpuflow.hwmodel.functional.errors import ExecutionError, InputMismatchError
from tpuflow.hwmodel.functional.machine import Machine
from tpuflow.hwmodel.functional.run import execute_program, run

__all__ = ["ExecutionError", "InputMismatchError", "Machine", "execute_program", "run"]
