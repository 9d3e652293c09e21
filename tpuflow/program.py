"""Program: the three per-engine instruction queues, the DDR memory plan, the LMEM plan and the
instruction -> ONNX node map that every stage after lowering works on."""

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
    # Global issue order: one letter per instruction ('B' TIU, 'D' GDMA, 'T' TILE); the k-th
    # 'B' is tiu[k-1]. It is the order the IFE receives instructions in, which the chunk-bitmap
    # dependency rule depends on (see lowering.deps and the timing model's check stage).
    issue_order: str = ""

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
        """A copy with new queues (used by the scheduler after reordering)."""
        return Program(chip=self.chip, tiu=list(tiu), gdma=list(gdma), tile=list(tile),
                       tiu_layers=list(tiu_layers), gdma_layers=list(gdma_layers), tile_layers=list(tile_layers),
                       memory=self.memory, layers=self.layers, fused_groups=self.fused_groups,
                       layer_groups=self.layer_groups, compulsory_ddr_bytes=self.compulsory_ddr_bytes,
                       options=dict(self.options), model_name=self.model_name, issue_order=issue_order)
