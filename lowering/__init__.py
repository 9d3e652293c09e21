"""Graph -> Program: DDR placement, LMEM allocation, tiling, fusion, per-op emitters, chunk-bitmap deps."""

from tpuflow.lowering.compiler import lower

__all__ = ["lower"]
