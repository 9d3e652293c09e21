"""LowerCtx: what every group emitter needs — graph, chip, options, emitter, DDR plan, weights."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from tpuflow.chip import ChipConfig
from tpuflow.errors import LoweringError
from tpuflow.frontend.graph import Graph
from tpuflow.isa import Prec
from tpuflow.lowering.ddrplan import DdrPlan
from tpuflow.lowering.emitter import Emitter
from tpuflow.lowering.layergroup import ResidencyPlan, ResidentTensor
from tpuflow.lowering.lmem import GroupArena
from tpuflow.lowering.mathops import CONST_REGION_BYTES
from tpuflow.lowering.tensors import DRegion, LTile, make_tile, storage_prec
from tpuflow.lowering.weights import WeightImage
from tpuflow.options import CompileOptions
from tpuflow.program import LayerInfo


@dataclass
class HeldConstants:
    """A sliced run member's constants (bias, weights, epilogue constants) held in LMEM for every
    slice of the run: loaded in its first slice, read in place after; `form` is what the first
    slice fixed of their layout (a later slice that would need another layout fails)."""

    addr: int                # per-lane offset of the block
    size: int                # bytes per lane
    loaded: bool = False
    form: object = None

    def offsets(self, sizes: list[int], align: int) -> list[int]:
        """Packed offsets of buffers of `sizes` (bytes per lane) inside the block."""
        out, end = [], self.addr
        for size in sizes:
            end = -(-end // align) * align
            out.append(end)
            end += size
        if end > self.addr + self.size:
            raise LoweringError(f"internal: held constants need {end - self.addr} B, {self.size} B reserved")
        return out


@dataclass(frozen=True)
class EmitPart:
    """What of a group one emission computes (None fields: all of it along that axis): a slice of
    a sliced run, or one core's part (lowering.cores)."""

    samples: range | None = None
    rows: tuple[int, int] | None = None          # conv / pool / NCHW row-group output rows
    channels: tuple[int, int] | None = None      # conv output channels
    view_rows: tuple[int, int] | None = None     # row group / matmul view rows (matmul: batch * M)
    view_cols: tuple[int, int] | None = None     # matmul output columns

    def as_dict(self) -> dict:
        names = {"view_cols": "columns"}
        out = {}
        for key in ("samples", "rows", "channels", "view_rows", "view_cols"):
            value = getattr(self, key)
            if value is not None:
                out[names.get(key, key)] = [value.start, value.stop] if isinstance(value, range) else list(value)
        return out


WHOLE = EmitPart()


@dataclass
class LowerCtx:
    graph: Graph
    chip: ChipConfig
    options: CompileOptions
    em: Emitter
    ddr: DdrPlan
    weights: WeightImage
    layers: dict[str, LayerInfo] = field(default_factory=dict)
    tile_pushes: list[int] = field(default_factory=lambda: [0, 0, 0, 0])   # TILE queue pushes so far
    residency: ResidencyPlan = field(default_factory=ResidencyPlan)      # activations kept in LMEM
    group_index: int = 0                                                 # the group being emitted
    part: EmitPart = WHOLE                       # what of the group this emission computes
    held: dict[int, HeldConstants] = field(default_factory=dict)   # sliced runs: group -> its held constants
    held_floor: int | None = None                # sliced runs: the held constants lie above it
    work_floor: int = 0                          # several cores: weight blocks lie below it (lowering.weight_prefetch)
    # tensors int8 chains hold whole in LMEM: {tensor: (LocalTensor, the layers that write it)} (Program.held_tensors)
    held_tensors: dict[str, tuple] = field(default_factory=dict)

    def rows_to_emit(self, height: int) -> tuple[int, int]:
        """The output rows [lo, hi) of the group being emitted (all of them unless sliced)."""
        return self.part.rows if self.part.rows is not None else (0, height)

    def samples_to_emit(self, batch: int) -> range:
        """The samples of the group being emitted (all of them unless sliced or split by sample)."""
        return range(batch) if self.part.samples is None else self.part.samples

    def channels_to_emit(self, channels: int) -> tuple[int, int]:
        """The output channels [lo, hi) of a conv to emit (all unless split over cores)."""
        return self.part.channels if self.part.channels is not None else (0, channels)

    def view_cols_to_emit(self, cols: int) -> tuple[int, int]:
        """The output columns [lo, hi) of a matmul to emit (all unless split over cores)."""
        return self.part.view_cols if self.part.view_cols is not None else (0, cols)

    def view_rows_to_emit(self, rows: int) -> tuple[int, int]:
        """The rows [lo, hi) of a row group's or matmul's view to emit (all unless split over cores)."""
        return self.part.view_rows if self.part.view_rows is not None else (0, rows)

    @property
    def prec(self) -> Prec:
        """Storage precision of activations and weights."""
        return Prec.from_name(self.options.dtype)

    def tensor_prec(self, tensor: str) -> Prec:
        """Storage precision of one tensor: a quantized tensor's integer storage (INT8 for int8 and
        uint8, INT32), `prec` for every float tensor (tensors.storage_prec)."""
        return storage_prec(self.graph.tensors.get(tensor), self.prec)

    # LMEM regions: the working area (below the tile window and below every resident activation
    # live during the group) is used as a ring: a group gets the space above the previous group's
    # buffers, or the space below them, whichever is at least half the area (else the half they
    # mostly avoid), so its loads never wait for the previous group and several small groups'
    # loads run ahead of compute. A group that does not fit its window gets the whole area
    # ("full"). Measured against fixed alternating halves (fp16/fp32 sg2260, list schedule):
    # ResNet-50 1189/4975 -> 1111/4864 us, BERT layer 63.6/124.7 -> 63.4/111.4 us.
    lmem_region: str = "ring"
    previous: tuple[int, int] = (0, 0)                         # buffers of the previous group
    arenas: list[GroupArena] = field(default_factory=list)     # those handed out for the current group

    def window(self, region: str) -> tuple[int, int]:
        """The per-lane LMEM window [start, end) of `region` ("ring" or "full") for the current group."""
        lo = max(CONST_REGION_BYTES, self.work_floor)
        top = self.residency.arena_top(self.group_index, self.chip.tile_window_offset)
        if self.held_floor is not None:
            top = min(top, self.held_floor)
        return (lo, top) if region == "full" else self._ring_window(lo, top)

    def planning_arena(self, region: str) -> GroupArena:
        """An arena over `region` to plan in: nothing allocated from it is emitted or remembered."""
        start, end = self.window(region)
        return GroupArena(self.chip, used=start, limit=end)

    def adopt(self, buffers) -> None:
        """Record a frozen plan's buffers (name, offset, bytes) as this group's LMEM use (the ring)."""
        self.arenas.append(GroupArena.holding(self.chip, buffers))

    def _ring_window(self, lo: int, top: int) -> tuple[int, int]:
        bank = self.chip.bank_bytes
        half = (top - lo) // 2 // bank * bank
        prev_start, prev_end = self.previous
        after = max(lo, -(-prev_end // bank) * bank)
        if after + half <= top:
            return after, top
        if lo + half <= min(prev_start, top):        # (the previous buffers may lie above this group's top)
            return lo, min(prev_start, top)
        mid = lo + half
        return (lo, mid) if prev_start >= mid or prev_end - mid > mid - prev_start else (mid, top)

    def trial(self, region: str) -> "LowerCtx":
        """A context for one emission attempt: a fresh instruction list and private copies of
        everything an emitter changes, sharing the plans and the weight image (additions to it
        are keyed, so an abandoned attempt only leaves constants a later one reuses)."""
        em = Emitter(self.chip)
        em.layer = self.em.layer
        return replace(self, em=em, layers={k: replace(v) for k, v in self.layers.items()},
                       tile_pushes=list(self.tile_pushes), arenas=[], lmem_region=region)

    def commit(self, trial: "LowerCtx") -> None:
        """Take a successful attempt's instructions and state."""
        self.em.records.extend(trial.em.records)
        self.em.layer = trial.em.layer
        self.layers, self.tile_pushes, self.arenas = trial.layers, trial.tile_pushes, trial.arenas
        self.lmem_region = trial.lmem_region

    def advance_ring(self) -> None:
        """After a group: remember where its buffers were."""
        used = [a for a in self.arenas if a.names]
        if used:
            self.previous = (min(a.start for a in used), max(a.peak for a in used))
        self.arenas = []

    def held_constants(self) -> HeldConstants | None:
        """Where the group being emitted holds its constants across a sliced run (None: it loads
        them into its own working area)."""
        return self.held.get(self.group_index)

    def resident(self, tensor: str | None) -> ResidentTensor | None:
        """The LMEM-resident buffer of an activation, or None when it lives in DDR (a gathered
        one lives in DDR for its producer: every core loads it whole before its first reader)."""
        held = self.residency.tensors.get(tensor) if tensor else None
        if held is not None and tensor in self.residency.gathered and self.group_index < held.first:
            return None
        return held

    def ddr_addr(self, tensor: str) -> int:
        if tensor not in self.ddr.tensors:
            raise LoweringError(f"internal: tensor {tensor} has no DDR buffer")
        return self.ddr.tensors[tensor].addr

    def region(self, tensor: str, shape4, offset_elems: int = 0, strides=None) -> DRegion:
        """A view of `tensor`'s DDR buffer as a 4-D region (contiguous strides unless given)."""
        n, c, h, w = shape4
        st = strides or (c * h * w, h * w, w, 1)
        prec = self.tensor_prec(tensor)
        return DRegion(self.ddr_addr(tensor) + offset_elems * prec.bytes, tuple(shape4), tuple(st), prec)

    def const(self, tensor: str, prec: Prec | None = None) -> np.ndarray:
        info = self.graph.tensor(tensor)
        if info.const is None:
            raise LoweringError(f"internal: {tensor} is not a constant")
        return np.asarray(info.const)

    def const_addr(self, key: str, array: np.ndarray, prec: Prec | None = None) -> int:
        return self.weights.add((key,), np.asarray(array), self.prec if prec is None else prec)

    def const_region(self, key: str, array: np.ndarray, shape4, prec: Prec | None = None) -> DRegion:
        p = self.prec if prec is None else prec
        addr = self.weights.add((key,), np.asarray(array).reshape(-1), p)
        n, c, h, w = shape4
        return DRegion(addr, tuple(shape4), (c * h * w, h * w, w, 1), p)

    def load_const_channels(self, tile: LTile, key: str, rows: np.ndarray, prec: Prec) -> None:
        """Load a constant (C x W) matrix into `tile`, a compact (1, C, 1, W) tile starting on lane
        0, with one DMA run per lane: the weight image holds the rows lane-major (lane l: rows
        l, l + lanes, ..., the last group zero-padded), so the DMA writes one contiguous run per
        lane instead of C short, unaligned ones."""
        lanes = self.chip.lanes
        count, width = rows.shape
        groups = -(-count // lanes)
        padded = np.zeros((groups * lanes, width), rows.dtype)
        padded[:count] = rows
        lane_major = padded.reshape(groups, lanes, width).transpose(1, 0, 2).reshape(lanes, groups * width)
        used = min(count, lanes)
        addr = self.const_addr(f"{key}:lanes", lane_major[:used], prec)
        shape = (1, used, 1, groups * width)
        self.em.load(make_tile(self.chip, tile.addr, shape, prec, compact=True),
                     DRegion(addr, shape, (used * groups * width, groups * width, groups * width, 1), prec))

    def scratch_region(self, offset_bytes: int, shape4, prec: Prec | None = None) -> DRegion:
        p = self.prec if prec is None else prec
        n, c, h, w = shape4
        need = offset_bytes + math.prod(shape4) * p.bytes
        if need > self.ddr.scratch_bytes:
            raise LoweringError(f"internal: scratch {need} B exceeds the planned {self.ddr.scratch_bytes} B")
        return DRegion(self.ddr.scratch_base + offset_bytes, tuple(shape4), (c * h * w, h * w, w, 1), p)

    def note_layer(self, name: str, op_type: str, macs: int = 0, lmem_peak: int = 0, group: str = "") -> None:
        info = self.layers.setdefault(name, LayerInfo(name=name, op_type=op_type))
        info.macs += macs
        info.lmem_peak_bytes = max(info.lmem_peak_bytes, lmem_peak)
        info.fused_group = group or info.fused_group
