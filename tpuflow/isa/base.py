"""Shared ISA vocabulary: engines, precisions, stride modes, LMEM/DDR access ranges, tensor layouts."""

from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, ClassVar

import numpy as np

if TYPE_CHECKING:
    from tpuflow.chip import ChipConfig


class Engine(str, enum.Enum):
    """The engines of a core, in code order. Every stage names an engine through this enum: `code`
    indexes per-engine arrays (and Instruction.waits()), `letter` prefixes listings and spells the
    issue order, `stream_suffix` names its binary stream (`<name>.<suffix>.<core>`)."""

    TIU = "tiu"
    GDMA = "gdma"
    TILE = "tile"

    @property
    def code(self) -> int:
        """0 TIU, 1 GDMA, 2 TILE."""
        return _ENGINE_CODE[self]

    @property
    def letter(self) -> str:
        """Prefix used in listings: B (TIU, as in .BD files), D (GDMA), T (TILE)."""
        return "BDT"[_ENGINE_CODE[self]]

    @property
    def stream_suffix(self) -> str:
        return ("BD", "GDMA", "TILE")[_ENGINE_CODE[self]]

    @classmethod
    def of_code(cls, code: int) -> "Engine":
        return ENGINES[code]

    @classmethod
    def of_letter(cls, letter: str) -> "Engine":
        return ENGINES["BDT".index(letter)]


ENGINES: tuple[Engine, ...] = tuple(Engine)
_ENGINE_CODE = {e: i for i, e in enumerate(ENGINES)}


class Prec(enum.IntEnum):
    """Descriptor precision codes (opt_*_prec, src_data_format), tpu-mlir's enumeration."""

    INT8 = 0
    FP16 = 1
    FP32 = 2
    INT16 = 3
    INT32 = 4
    BF16 = 5

    @property
    def bytes(self) -> int:
        return _PREC_BYTES[self]

    @property
    def is_float(self) -> bool:
        return self in (Prec.FP16, Prec.FP32, Prec.BF16)

    @property
    def storage_dtype(self) -> np.dtype:
        """numpy dtype of the stored bits (bf16 is kept as uint16 bit patterns)."""
        return np.dtype({0: np.int8, 1: np.float16, 2: np.float32, 3: np.int16,
                         4: np.int32, 5: np.uint16}[int(self)])

    @property
    def dtype_name(self) -> str:
        return {0: "int8", 1: "fp16", 2: "fp32", 3: "int16", 4: "int32", 5: "bf16"}[int(self)]

    @classmethod
    def from_name(cls, name: str) -> "Prec":
        table = {"int8": cls.INT8, "fp16": cls.FP16, "f16": cls.FP16, "fp32": cls.FP32, "f32": cls.FP32,
                 "int16": cls.INT16, "int32": cls.INT32, "bf16": cls.BF16}
        return table[name]


_PREC_BYTES = {Prec.INT8: 1, Prec.FP16: 2, Prec.FP32: 4, Prec.INT16: 2, Prec.INT32: 4, Prec.BF16: 2}


class StrideMode(enum.IntEnum):
    """short_*_str: how a TIU operand's strides are obtained."""

    ALIGNED = 0   # c_stride = H*W rounded up to the EU count; n_stride = c_stride * channel groups
    COMPACT = 1   # c_stride = H*W
    FREE = 3      # strides taken from the *_n_str/_c_str/_h_str/_w_str fields (0 broadcasts)


# Marks SYS wait instructions that wait on the TILE engine (tpuflow's documented mechanism):
# TIU `system.wait_msg` with reg_idx == TILE_WAIT_TAG and GDMA `dma.sys.sys_wait` with
# index == TILE_WAIT_TAG wait until tile_sync_id >= imm / constant_value.
TILE_WAIT_TAG = 0x7F


@dataclass(frozen=True)
class LmemRange:
    """Bytes [lo, hi) at the same per-lane offsets in lanes [lane, lane + lanes) (no wrap)."""

    lane: int
    lanes: int
    lo: int
    hi: int

    def overlaps(self, other: "LmemRange") -> bool:
        return (self.lane < other.lane + other.lanes and other.lane < self.lane + self.lanes
                and self.lo < other.hi and other.lo < self.hi)


@dataclass(frozen=True)
class DdrRange:
    """DDR bytes [lo, hi)."""

    lo: int
    hi: int

    def overlaps(self, other: "DdrRange") -> bool:
        return self.lo < other.hi and other.lo < self.hi


@dataclass(frozen=True)
class Accesses:
    lmem_reads: tuple[LmemRange, ...] = ()
    lmem_writes: tuple[LmemRange, ...] = ()
    ddr_reads: tuple[DdrRange, ...] = ()
    ddr_writes: tuple[DdrRange, ...] = ()


@dataclass(frozen=True)
class LocalTensor:
    """An (N, C, H, W) tensor in LMEM: flat address (lane * lmem_bytes_per_lane + offset),
    element strides (n, c-group, h, w) and precision.

    Element (n, c, h, w) lives in lane (start_lane + c) % lanes at per-lane byte offset
    offset + (n*n_str + ((start_lane + c) // lanes)*c_str + h*h_str + w*w_str) * bytes.
    """

    addr: int
    shape: tuple[int, int, int, int]
    strides: tuple[int, int, int, int]
    prec: Prec

    def start_lane(self, chip: "ChipConfig") -> int:
        return (self.addr // chip.lmem_bytes_per_lane) % chip.lanes

    def offset(self, chip: "ChipConfig") -> int:
        return self.addr % chip.lmem_bytes_per_lane

    def ranges(self, chip: "ChipConfig") -> tuple[LmemRange, ...]:
        return lmem_ranges(self.addr, self.shape, self.strides, self.prec.bytes, chip)


def aligned_strides(shape: tuple[int, int, int, int], eu: int, lanes: int, start_lane: int = 0,
                    compact: bool = False) -> tuple[int, int, int, int]:
    """Strides (elements) of the EU-aligned or compact layout of hardware.md."""
    n, c, h, w = shape
    c_str = h * w if compact else -(-(h * w) // eu) * eu
    groups = -(-(start_lane + c) // lanes)
    return (c_str * groups, c_str, w, 1)


def operand_strides(mode: int, shape, given, prec: Prec, chip: "ChipConfig", addr: int):
    """Resolve a TIU operand's strides from its stride mode."""
    if mode == StrideMode.FREE:
        return tuple(given)
    start = (addr // chip.lmem_bytes_per_lane) % chip.lanes
    eu = chip.core.eu_bytes_per_lane // prec.bytes
    return aligned_strides(tuple(shape), eu, chip.lanes, start, compact=(mode == StrideMode.COMPACT))


def lmem_ranges(addr: int, shape, strides, elem_bytes: int, chip: "ChipConfig") -> tuple[LmemRange, ...]:
    """Bounding LMEM ranges of a tensor (conservative: one byte interval for all its lanes)."""
    core = chip.core
    return _lmem_ranges(addr, tuple(shape), tuple(strides), elem_bytes, core.lanes, core.lmem_bytes_per_lane)


@functools.lru_cache(maxsize=1 << 16)
def _lmem_ranges(addr: int, shape: tuple, strides: tuple, elem_bytes: int, lanes: int,
                 lane_bytes: int) -> tuple[LmemRange, ...]:
    """lmem_ranges, cached: programs reuse their LMEM buffers, and every checker and model asks."""
    n, c, h, w = shape
    if n * c * h * w == 0:
        return ()
    start = (addr // lane_bytes) % lanes
    base = addr % lane_bytes
    groups = (start + c - 1) // lanes + 1
    lo_el = hi_el = 0
    for span in ((n - 1) * strides[0], (groups - 1) * strides[1], (h - 1) * strides[2], (w - 1) * strides[3]):
        if span < 0:
            lo_el += span
        else:
            hi_el += span
    lo, hi = base + lo_el * elem_bytes, base + (hi_el + 1) * elem_bytes
    if groups == 1:
        return (LmemRange(start, c, lo, hi),)
    return (LmemRange(0, lanes, lo, hi),)  # several channel groups (or a wrap): every lane


MAX_DDR_RANGES = 4096     # a strided DMA's DDR side is described by at most this many ranges


def ddr_range(addr: int, shape, strides, elem_bytes: int) -> tuple[DdrRange, ...]:
    """DDR byte ranges of a strided tensor: the innermost dim whose stride leaves a gap after the
    dims inside it, and every dim outside it, are enumerated (if that makes more than
    MAX_DDR_RANGES pieces, the next such dim outwards), the dims inside are bounded; touching
    pieces are merged. Two cores writing interleaved rows of one tensor touch no common range."""
    return _ddr_ranges(addr, tuple(shape), tuple(strides), elem_bytes)


@functools.lru_cache(maxsize=1 << 16)
def _ddr_ranges(addr: int, shape: tuple, strides: tuple, elem_bytes: int) -> tuple[DdrRange, ...]:
    """ddr_range, cached: an instruction's accesses are asked for by every checker and model."""
    if math.prod(shape) == 0:
        return ()
    ranges = []
    for lo, hi in _ddr_pieces(shape, strides, elem_bytes):     # DdrRange(addr + lo, addr + hi), without __init__
        r = object.__new__(DdrRange)                               # (a strided DMA has up to MAX_DDR_RANGES)
        fields_of = r.__dict__
        fields_of["lo"], fields_of["hi"] = addr + lo, addr + hi
        ranges.append(r)
    return tuple(ranges)


@functools.lru_cache(maxsize=1 << 16)
def _ddr_pieces(shape: tuple, strides: tuple, elem_bytes: int) -> tuple[tuple[int, int], ...]:
    """ddr_range's pieces as byte offsets from the tensor's address (cached: DMAs repeat shapes)."""
    dims = [(size, stride) for size, stride in zip(shape, strides) if size > 1]
    inner_lo, inner_hi, split = 0, 0, 0
    for d in range(len(dims) - 1, -1, -1):       # innermost first: the first dim that leaves gaps
        size, stride = dims[d]
        if not split and abs(stride) > inner_hi - inner_lo + 1 and math.prod(s for s, _ in dims[:d + 1]) <= MAX_DDR_RANGES:
            split = d + 1
        span = (size - 1) * stride
        inner_lo, inner_hi = inner_lo + min(span, 0), inner_hi + max(span, 0)
    lo_el = hi_el = 0
    for size, stride in dims[split:]:
        span = (size - 1) * stride
        lo_el, hi_el = lo_el + min(span, 0), hi_el + max(span, 0)
    starts = np.zeros(1, np.int64)
    for size, stride in dims[:split]:
        starts = (starts[:, None] + np.arange(size, dtype=np.int64) * stride).reshape(-1)
    starts = np.sort(starts)
    lo, hi = (starts + lo_el) * elem_bytes, (starts + hi_el + 1) * elem_bytes
    breaks = np.flatnonzero(lo[1:] > np.maximum.accumulate(hi)[:-1]) + 1     # a piece not touching the ones before
    first = np.concatenate(([0], breaks))
    last = np.concatenate((breaks, [len(lo)])) - 1
    ends = np.maximum.accumulate(hi)[last]
    return tuple(zip(lo[first].tolist(), ends.tolist()))


class Instruction:
    """Base of every instruction dataclass. Subclasses are frozen dataclasses whose fields are
    named as in the hardware descriptor; `cmd_id` is the 1-based position in its engine queue
    and is not a field.

    Waits: an engine runs its queue in order; across engines an instruction waits until another
    engine has completed the instruction with a given id. `waits()` answers those ids, one per
    engine; WAIT_FIELDS names the descriptor fields that hold them (what the dependency assignment
    writes); a SYS wait on TILE (`is_tile_wait`) carries its TILE id as an operand instead."""

    ENGINE: ClassVar[Engine]
    OPS: ClassVar[dict[str, int]] = {}
    PREFIX: ClassVar[str] = ""
    WAIT_FIELDS: ClassVar[dict[Engine, str]] = {}   # engine -> field holding the id of it waited for

    def waits(self) -> tuple[int, int, int]:
        """Per Engine.code (TIU, GDMA, TILE): the id (1-based cmd_id) of that engine's instruction this
        one starts after, 0 = no wait. The own engine's entry is 0 (its queue order covers it)."""
        ids = [0, 0, 0]
        for engine, name in self.WAIT_FIELDS.items():
            ids[_ENGINE_CODE[engine]] = getattr(self, name)
        return (ids[0], ids[1], ids[2])

    @property
    def is_tile_wait(self) -> bool:
        """Whether this is a SYS instruction that only waits for a TILE block (the dependency
        assignment derives these from the order; see tpuflow.isa.tile)."""
        return False

    def message(self):
        """The cross-core SEND/WAIT this instruction is (a tpuflow.isa.messages.Message), or None."""
        return None

    def with_waits(self, ids) -> "Instruction":
        """A copy with every WAIT_FIELDS field set to ids[engine.code] (the values are valid ids, so the
        dataclass checks are skipped: this runs once per instruction of a program)."""
        changes = {name: ids[_ENGINE_CODE[engine]] for engine, name in self.WAIT_FIELDS.items()}
        if all(getattr(self, name) == value for name, value in changes.items()):
            return self
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.__dict__.update(changes)
        return new

    def without_waits(self) -> "Instruction":
        """A copy with every WAIT_FIELDS field 0 (itself if they already are)."""
        return self.with_waits((0, 0, 0))

    @property
    def op_name(self) -> str:
        op = getattr(self, "op", None)
        return f"{self.PREFIX}.{op}" if op is not None else self.PREFIX

    def accesses(self, chip: "ChipConfig") -> Accesses:
        raise NotImplementedError

    def field_values(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]

    def _check_op(self) -> None:
        op = getattr(self, "op", None)
        if self.OPS and op not in self.OPS:
            raise ValueError(f"{type(self).__name__}: unknown op {op!r} (known: {', '.join(self.OPS)})")


def same_as_earlier(instrs) -> list[int]:
    """Per instruction, the index of the first one in `instrs` equal to it apart from its waits (its own
    index if none is): per-instruction work that does not depend on waits is done once per distinct one."""
    first: dict = {}
    return [first.setdefault(instr.without_waits(), i) for i, instr in enumerate(instrs)]
