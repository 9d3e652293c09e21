"""Program: per core, the three per-engine instruction queues; the shared DDR memory plan, the LMEM
plan and the instruction -> ONNX node map that every stage after lowering works on.

Core axis (the multi-core contract)
-----------------------------------
A Program runs on `core_count` cores of one chip (1 unless `--cores N`). Each core has its own
three in-order queues (a `CoreStreams`: tiu, gdma, tile, their layer names and issue order).
Core 0's streams are the Program's own fields (`tiu`, `gdma`, `tile`, `*_layers`, `issue_order`),
so every single-core path reads a Program exactly as before; cores 1.. are `extra_cores`.

- DDR is shared by all cores: one MemoryPlan, one weight image, one address space. Any two
  accesses to the same DDR bytes from different cores, at least one a write, must be ordered by
  messages (below); nothing else orders them.
- LMEM is private per core: every LMEM address in core k's instructions names core k's LMEM.
- Messages are the only cross-core ordering. Within a core the waits (Instruction.waits(),
  cmd_id_dep, TILE waits) order the engines as before; across cores an engine orders itself only
  through SEND/WAIT messages (TIU system.send_msg / wait_msg, GDMA dma.sys.sys_send / sys_wait,
  see tpuflow.isa.messages): a message id is a chip-wide counter; a send adds one, a wait blocks
  until the count reaches its expected number of sends, then consumes them.
- `core(k)` is a single-core view of core k (shares memory, layers and options), which every
  single-core stage (encoder, timing of one core, checker) can take as is.
- The Program-level queue accessors (queue, layer_names, instructions, accesses, issue_sequence,
  counts, instruction_count) answer for core 0 only, as they always did; a multi-core-aware
  stage iterates `cores` / `core(k)` (`total_instruction_count` counts every core).
- `core_split` is the compiler's record of how the work was split over cores (one dict per core,
  filled by lowering; [] for a single core); the manifest copies it verbatim.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterator

from tpuflow.chip import ChipConfig
from tpuflow.isa import Accesses, Engine, Instruction, resolve_stream

ENGINES = tuple(Engine)     # in Engine.code order
LETTER_ENGINE = {e.letter: e for e in ENGINES}


@dataclass(frozen=True)
class DdrTensor:
    """A tensor placed in DDR: contiguous row-major bytes at `addr`."""

    name: str
    addr: int
    shape: tuple[int, ...]
    dtype: str          # "fp32", "fp16", "bf16", "int32", ...
    role: str           # "input", "output", "weight", "activation", "scratch"
    nbytes: int
    # "" (row-major as above) or "NC1HWC0" (tpuflow's additive field, issue 16: a tile-path activation kept
    # C0-blocked between TILE convs: element (n, c, h, w) at ((n * C1 + c // C0) * H * W + h * W + w) * C0
    # + c % C0, C0 = tile.k_fractal_bytes / element bytes, C1 = ceil(C / C0), the last block zero padded)
    layout: str = ""


@dataclass
class MemoryPlan:
    """DDR placement of every tensor, and the weight image that is loaded at `weight_base`."""

    tensors: dict[str, DdrTensor] = field(default_factory=dict)
    weight_base: int = 0
    weight_image: bytes = b""
    ddr_bytes_used: int = 0

    def by_role(self, role: str) -> list[DdrTensor]:
        return [t for t in self.tensors.values() if t.role == role]


@dataclass
class LayerInfo:
    """What reports need about one ONNX node (or fused group) of the program."""

    name: str
    op_type: str
    macs: int = 0
    ddr_bytes: int = 0
    lmem_peak_bytes: int = 0
    fused_group: str = ""


@dataclass
class CoreStreams:
    """One core's instruction streams: the three queues, their layer names and their issue order
    (same meaning as the Program fields of the same names)."""

    tiu: list[Instruction] = field(default_factory=list)
    gdma: list[Instruction] = field(default_factory=list)
    tile: list[Instruction] = field(default_factory=list)
    tiu_layers: list[str] = field(default_factory=list)
    gdma_layers: list[str] = field(default_factory=list)
    tile_layers: list[str] = field(default_factory=list)
    issue_order: str = ""

    def queue(self, engine: Engine) -> list[Instruction]:
        return (self.tiu, self.gdma, self.tile)[Engine(engine).code]

    @property
    def instruction_count(self) -> int:
        return len(self.tiu) + len(self.gdma) + len(self.tile)

    def counts(self) -> dict[str, int]:
        return {e.value: len(self.queue(e)) for e in ENGINES}


@dataclass
class Program:
    chip: ChipConfig
    tiu: list[Instruction] = field(default_factory=list)
    gdma: list[Instruction] = field(default_factory=list)
    tile: list[Instruction] = field(default_factory=list)
    tiu_layers: list[str] = field(default_factory=list)
    gdma_layers: list[str] = field(default_factory=list)
    tile_layers: list[str] = field(default_factory=list)
    memory: MemoryPlan = field(default_factory=MemoryPlan)
    layers: dict[str, LayerInfo] = field(default_factory=dict)
    fused_groups: list[tuple[str, ...]] = field(default_factory=list)
    # Layer groups: runs of fused groups joined by LMEM-resident activations (dicts as
    # lowering.layergroup.LayerGroup.as_dict gives them), and the compulsory DDR bytes (weights,
    # graph inputs and outputs at the compute dtype) the DDR traffic is measured against.
    layer_groups: list[dict] = field(default_factory=list)
    compulsory_ddr_bytes: int = 0
    options: dict[str, str] = field(default_factory=dict)
    model_name: str = ""
    # --dtype int8 on a float model: how tpuflow quantized it (tpuflow.quantize.Quantization.record:
    # the calibration, the ops that stayed float and why); empty otherwise.
    quantization: dict = field(default_factory=dict)
    # Tensors int8 chains hold whole in LMEM (single core): {tensor: (isa LocalTensor, the layers that
    # write it)}; verify snapshots them (tpuflow.stagewise). Kept in memory only, not in the binaries.
    held_tensors: dict = field(default_factory=dict)
    # Global issue order: one letter per instruction ('B' TIU, 'D' GDMA, 'T' TILE); the k-th
    # 'B' is tiu[k-1]. It is the order the IFE receives instructions in, which the chunk-bitmap
    # dependency rule depends on (see lowering.deps and the timing model's check stage).
    issue_order: str = ""
    # Core axis (see the module docstring): the streams of cores 1.. (core 0's are the fields above),
    # the compiler's per-core split record, and which core a single-core view `core(k)` shows.
    extra_cores: list[CoreStreams] = field(default_factory=list)
    core_split: list[dict] = field(default_factory=list)
    core_id: int = 0

    @property
    def core_count(self) -> int:
        return 1 + len(self.extra_cores)

    @property
    def cores(self) -> list[CoreStreams]:
        """Every core's streams, core 0 first (core 0's shares its lists with this Program)."""
        own = CoreStreams(self.tiu, self.gdma, self.tile, self.tiu_layers, self.gdma_layers,
                          self.tile_layers, self.issue_order)
        return [own, *self.extra_cores]

    def core(self, k: int) -> "Program":
        """A single-core Program of core k's streams, sharing memory, layers and options; itself
        for core 0 of a single-core program."""
        if k == 0 and not self.extra_cores:
            return self
        if not 0 <= k < self.core_count:
            raise IndexError(f"core {k} of a {self.core_count}-core program")
        s = self.cores[k]
        view = self.with_queues(s.tiu, s.gdma, s.tile, s.tiu_layers, s.gdma_layers, s.tile_layers, s.issue_order)
        view.extra_cores, view.core_id = [], k
        return view

    @classmethod
    def from_cores(cls, base: "Program", streams: list[CoreStreams], core_split: list[dict] | None = None) -> "Program":
        """A Program with `streams` as its cores (streams[0] is core 0), everything else from `base`."""
        if not streams:
            raise ValueError("a program has at least one core")
        first = streams[0]
        prog = base.with_queues(first.tiu, first.gdma, first.tile, first.tiu_layers, first.gdma_layers,
                                first.tile_layers, first.issue_order)
        prog.extra_cores = [CoreStreams(list(s.tiu), list(s.gdma), list(s.tile), list(s.tiu_layers),
                                        list(s.gdma_layers), list(s.tile_layers), s.issue_order) for s in streams[1:]]
        prog.core_split = list(base.core_split if core_split is None else core_split)
        return prog

    def with_cores(self, streams: list[CoreStreams]) -> "Program":
        """A copy with every core's streams replaced (used by the per-core scheduler)."""
        return Program.from_cores(self, streams)

    @property
    def total_instruction_count(self) -> int:
        return sum(s.instruction_count for s in self.cores)

    def core_counts(self) -> list[dict[str, int]]:
        """Per core, the instruction count of each engine (the manifest's per-core counts)."""
        return [s.counts() for s in self.cores]

    def queue(self, engine: Engine) -> list[Instruction]:
        return (self.tiu, self.gdma, self.tile)[Engine(engine).code]

    def layer_names(self, engine: Engine) -> list[str]:
        return (self.tiu_layers, self.gdma_layers, self.tile_layers)[Engine(engine).code]

    def layer_of(self, engine: Engine, index: int) -> str:
        """ONNX node (layer) of the instruction at 0-based `index` of `engine`'s queue."""
        names = self.layer_names(engine)
        return names[index] if index < len(names) else ""

    def instructions(self) -> Iterator[tuple[Engine, int, Instruction]]:
        """Every instruction as (engine, cmd_id, instruction), engine by engine."""
        for engine in ENGINES:
            for i, instr in enumerate(self.queue(engine)):
                yield engine, i + 1, instr

    @property
    def instruction_count(self) -> int:
        return len(self.tiu) + len(self.gdma) + len(self.tile)

    def counts(self) -> dict[str, int]:
        return {e.value: len(self.queue(e)) for e in ENGINES}

    @cached_property
    def _tile_accesses(self) -> list[Accesses]:
        return resolve_stream(self.tile, self.chip)

    def adopt_tile_accesses(self, source: "Program") -> None:
        """Take `source`'s resolved TILE accesses (when already computed) for a TILE queue that is the
        same blocks in the same order with other wait fields (resolve_stream reads no wait field)."""
        known = source.__dict__.get("_tile_accesses")
        if known is not None and len(self.tile) == len(source.tile):
            self.__dict__["_tile_accesses"] = known

    def accesses(self, engine: Engine, index: int) -> Accesses:
        """LMEM/DDR ranges of the instruction at 0-based `index` (TILE operands resolved through
        the queue state of the whole TILE stream)."""
        if Engine(engine) is Engine.TILE:
            return self._tile_accesses[index]
        return self.queue(engine)[index].accesses(self.chip)

    def issue_sequence(self) -> Iterator[tuple[Engine, int]]:
        """(engine, 0-based index) of every instruction in global issue order."""
        order = self.issue_order or "".join(e.letter * len(self.queue(e)) for e in ENGINES)
        next_index = {letter: 0 for letter in LETTER_ENGINE}
        for letter in order:
            yield LETTER_ENGINE[letter], next_index[letter]
            next_index[letter] += 1

    def with_queues(self, tiu, gdma, tile, tiu_layers, gdma_layers, tile_layers, issue_order: str) -> "Program":
        """A copy with new core-0 queues (used by the scheduler after reordering); the other cores,
        the core split and core_id are kept."""
        return Program(chip=self.chip, tiu=list(tiu), gdma=list(gdma), tile=list(tile),
                       tiu_layers=list(tiu_layers), gdma_layers=list(gdma_layers), tile_layers=list(tile_layers),
                       memory=self.memory, layers=self.layers, fused_groups=self.fused_groups,
                       layer_groups=self.layer_groups, compulsory_ddr_bytes=self.compulsory_ddr_bytes,
                       options=dict(self.options), model_name=self.model_name, issue_order=issue_order,
                       quantization=self.quantization, held_tensors=self.held_tensors,
                       extra_cores=list(self.extra_cores), core_split=list(self.core_split), core_id=self.core_id)
