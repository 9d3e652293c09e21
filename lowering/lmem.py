"""LMEM allocation for one fused group: resident buffers, double-buffered per-tile sets, bank-aware
placement, and the peak use reported per layer."""

from __future__ import annotations

from dataclasses import dataclass, field

from tpuflow.chip import ChipConfig
from tpuflow.errors import LoweringError


def align_up(value: int, align: int) -> int:
    return -(-value // align) * align


@dataclass
class GroupArena:
    """Per-lane offsets for a group's buffers. All LMEM tiles of tpuflow start on lane 0 (a
    tile's channels spread from lane 0), so one per-lane offset identifies a buffer.

    Buffers are placed bank-aligned (each starts a new 16 KiB bank, so an instruction's inputs
    and output fall on different banks) when that fits, else on GDMA bus beats, else at the EU
    alignment (_alignment)."""

    chip: ChipConfig
    used: int = 0          # next free per-lane offset (the arena's start)
    limit: int = 0         # end of the arena (exclusive)
    peak: int = 0
    names: list[tuple[str, int, int]] = field(default_factory=list)

    @property
    def capacity(self) -> int:
        return self.limit

    def fits(self, sizes: list[int]) -> bool:
        return self._packed_end(self.used, sizes, self.chip.core.lmem_align_bytes) <= self.capacity

    def _packed_end(self, start: int, sizes: list[int], align: int) -> int:
        end = start
        for s in sizes:
            end = align_up(end, align) + s
        return end

    @classmethod
    def holding(cls, chip: ChipConfig, buffers) -> "GroupArena":
        """An arena whose allocations are `buffers` ((name, offset, bytes) in allocation order)."""
        names = list(buffers)
        used = max((off + size for _, off, size in names), default=0)
        return cls(chip, used=used, limit=used, peak=used, names=names)

    def alloc_many(self, sizes: list[int], label: str, names: list[str] | None = None) -> list[int]:
        """Offsets for `sizes` (bytes per lane), bank-aligned if everything then still fits;
        each buffer is recorded under its entry of `names` (else under `label`)."""
        align = self._alignment(sizes)
        if self._packed_end(self.used, sizes, align) > self.capacity:
            need = self._packed_end(self.used, sizes, self.chip.core.lmem_align_bytes)
            raise LoweringError(f"{label}: needs {need} B of LMEM per lane, {self.capacity} B available")
        out = []
        for i, s in enumerate(sizes):
            off = align_up(self.used, align)
            out.append(off)
            self.names.append((names[i] if names else label, off, s))
            self.used = off + s
        self.peak = max(self.peak, self.used)
        return out

    def _alignment(self, sizes: list[int]) -> int:
        """The coarsest alignment at which `sizes` still fit: a bank each, else the GDMA bus width (a
        DMA's per-lane rows then start on whole beats: a burst that does not pays
        gdma.unaligned_penalty_cycles, which made a 512 x 128 fp16 weight load 3x slower), else the
        EU alignment."""
        chip = self.chip
        for align in (chip.bank_bytes, max(chip.gdma.bus_bytes, chip.core.lmem_align_bytes)):
            if self._packed_end(self.used, sizes, align) <= self.capacity:
                return align
        return chip.core.lmem_align_bytes

    @property
    def start(self) -> int:
        return self.names[0][1] if self.names else self.used

    def alloc(self, size: int, label: str) -> int:
        return self.alloc_many([size], label)[0]

    def alloc_plan(self, resident: list[int], per_set: list[int], label: str,
                   max_copies: int = 2, names: tuple[list[str], list[str]] | None = None
                   ) -> tuple[list[int], list[list[int]]]:
        """One allocation of the group's resident buffers plus `max_copies` (or fewer, if they
        do not fit) sets of per-tile buffers: (resident offsets, offsets of each set). `names`
        ((resident names), (per-set names)) names the buffers; set k's are suffixed "@k"."""
        for copies in range(max_copies, 0, -1):
            if self.fits(resident + per_set * copies):
                labels = None if names is None else (
                    list(names[0]) + [f"{n}@{k}" for k in range(copies) for n in names[1]])
                flat = self.alloc_many(resident + per_set * copies, label, labels)
                res, rest = flat[:len(resident)], flat[len(resident):]
                n = len(per_set)
                return res, [rest[i * n:(i + 1) * n] for i in range(copies)]
        need = self._packed_end(self.used, resident + per_set, self.chip.core.lmem_align_bytes)
        raise LoweringError(f"{label}: needs {need} B of LMEM per lane, {self.capacity} B available")
