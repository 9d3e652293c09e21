"""The IFE check stage's dependency logic: chunk-bitmap re-derivation (bitmap mode), comparison with the
compiled waits, and the serialising auto mode (CSR DIS_AUTO_DEP_ID = 1).

Bitmap rule (independent of the compiler's implementation; only program.accesses is shared): an
LMEM byte (lane, offset) is in chunk (lane // deps.chunk_lanes, offset // chunk_bytes_per_lane).
Walking instructions in issue order with, per engine and chunk, the last reader id and last
writer id, a TIU/GDMA instruction X with other engine O depends on
    max(last_writer[O][c] for c in reads(X) | writes(X), last_reader[O][c] for c in writes(X))
(0 if none); TILE blocks compute wait_tiu_id / wait_gdma_id the same way against TIU / GDMA.
Every id is then moved forward into its field's id window (tpuflow.isa.ids.clamp: never more than
2**bits - 1 ids behind the last instruction of that engine issued before X). A TIU or GDMA
instruction whose chunks conflict with TILE blocks must be covered by a SYS tile wait
(TILE_WAIT_TAG) earlier in its own queue whose operand is at least the largest conflicting TILE id.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tpuflow.errors import TpuflowError
from tpuflow.isa import TILE_WAIT_TAG, Engine, SysDma, SysTiu
from tpuflow.isa.ids import IdFields, clamp
from tpuflow.program import Program

ENGINE_CODE = {Engine.TIU: 0, Engine.GDMA: 1, Engine.TILE: 2}
LETTERS = "BDT"


class DependencyCheckError(TpuflowError):
    """The compiled waits disagree with the chunk bitmaps the IFE check stage re-derives."""


@dataclass
class Waits:
    """Effective waits per instruction (0-based index per engine): what each engine waits for."""

    tiu_dep: list[int]          # TIU instruction waits until tdma_sync_id >= this
    gdma_dep: list[int]         # GDMA instruction waits until tiu_sync_id >= this
    tile_tiu: list[int]         # TILE block waits until tiu_sync_id >= this
    tile_gdma: list[int]        # ... and tdma_sync_id >= this
    tiu_tile: list[int]         # SYS tile wait operand (0 = none): tile_sync_id >= this
    gdma_tile: list[int]


def tile_wait_operand(instr) -> int:
    """Operand k of a SYS instruction that waits for TILE block k, else 0."""
    if isinstance(instr, SysTiu) and instr.op == "wait_msg" and instr.reg_idx == TILE_WAIT_TAG:
        return instr.imm
    if isinstance(instr, SysDma) and instr.op == "sys_wait" and instr.index == TILE_WAIT_TAG:
        return instr.constant_value
    return 0


class ChunkTables:
    """Last reader / last writer id per (engine, chunk); chunk index = lane group * chunks per group +
    offset chunk. The chunk sets of LMEM ranges are cached (programs reuse their buffers)."""

    def __init__(self, program: Program):
        chip = program.chip
        self.chunk_lanes = chip.deps.chunk_lanes
        self.chunk_bytes = chip.chunk_bytes_per_lane
        self.lane_bytes = chip.lmem_bytes_per_lane
        groups = chip.lanes // chip.deps.chunk_lanes
        self.per_group = chip.deps.chunk_count // groups
        self.readers = np.zeros((3, chip.deps.chunk_count), dtype=np.int64)
        self.writers = np.zeros((3, chip.deps.chunk_count), dtype=np.int64)
        self._cache: dict[tuple, np.ndarray] = {}

    def chunks(self, ranges) -> np.ndarray:
        key = tuple((r.lane, r.lanes, r.lo, r.hi) for r in ranges)
        hit = self._cache.get(key)
        if hit is None:
            parts = [np.zeros(0, dtype=np.int64)]
            for lane, lanes, lo, hi in key:
                hi = min(hi, self.lane_bytes)
                g = np.arange(lane // self.chunk_lanes, (lane + lanes - 1) // self.chunk_lanes + 1)
                c = np.arange(lo // self.chunk_bytes, (hi - 1) // self.chunk_bytes + 1)
                parts.append((g[:, None] * self.per_group + c[None, :]).ravel())
            hit = self._cache[key] = np.unique(np.concatenate(parts))
        return hit

    def conflicts(self, reads, writes) -> list[int]:
        """Per engine: the largest conflicting id (RAW/WAW on writers, WAR on readers)."""
        best = [0, 0, 0]
        r = self.chunks(reads)
        if len(r):
            best = self.writers[:, r].max(axis=1).tolist()
        w = self.chunks(writes)
        if len(w):
            best = [max(a, b, c) for a, b, c in zip(best, self.writers[:, w].max(axis=1).tolist(),
                                                   self.readers[:, w].max(axis=1).tolist())]
        return best

    def record(self, engine: int, cmd_id: int, reads, writes) -> None:
        self.readers[engine, self.chunks(reads)] = cmd_id
        self.writers[engine, self.chunks(writes)] = cmd_id


def derive_bitmap_waits(program: Program, keep: list | None = None) -> tuple[Waits, list[str]]:
    """Waits from the chunk bitmaps, and a description of every disagreement with the compiled ones.
    `keep`, if given (three lists, one per engine), receives every instruction's accesses."""
    tables = ChunkTables(program)
    waits = _compiled_waits(program)
    bits = IdFields.of(program.chip)
    problems: list[str] = []
    issued = [0, 0, 0]
    covered = [0, 0]          # largest SYS tile wait operand seen so far in the TIU / GDMA queue
    for engine, index in program.issue_sequence():
        code = ENGINE_CODE[engine]
        acc = program.accesses(engine, index)
        if keep is not None:
            keep[code].append(acc)
        reads, writes = acc.lmem_reads, acc.lmem_writes
        conflict = tables.conflicts(reads, writes) if (reads or writes) else [0, 0, 0]
        if code == 2:
            want = (clamp(int(conflict[0]), issued[0], bits.tile_bits), clamp(int(conflict[1]), issued[1], bits.tile_bits))
            _check_tile(program, index, *want, problems)
        else:
            other = 1 - code
            width = bits.tiu_bits if code == 0 else bits.gdma_bits
            covered[code] = max(covered[code], tile_wait_operand(program.queue(engine)[index]))
            _check_tiu_gdma(program, engine, index, clamp(int(conflict[other]), issued[other], width),
                            int(conflict[2]), covered[code], problems)
        tables.record(code, index + 1, reads, writes)
        issued[code] += 1
    return waits, problems


def _check_tile(program: Program, index: int, want_tiu: int, want_gdma: int, problems: list[str]) -> None:
    instr = program.tile[index]
    if instr.wait_tiu_id != want_tiu or instr.wait_gdma_id != want_gdma:
        problems.append(f"T{index + 1} waits B{instr.wait_tiu_id},D{instr.wait_gdma_id}, "
                        f"bitmaps give B{want_tiu},D{want_gdma}")


def _check_tiu_gdma(program: Program, engine: Engine, index: int, want: int, want_tile: int, covered: int,
                    problems: list[str]) -> None:
    instr = program.queue(engine)[index]
    letter, other = (("B", "D") if engine is Engine.TIU else ("D", "B"))
    if instr.cmd_id_dep != want:
        problems.append(f"{letter}{index + 1} cmd_id_dep={other}{instr.cmd_id_dep}, bitmaps give {other}{want}")
    if want_tile > covered:
        problems.append(f"{letter}{index + 1} conflicts with T{want_tile} but is not preceded by a SYS "
                        f"wait for T{want_tile}" + (f" (its queue waited for T{covered})" if covered else ""))


def _compiled_waits(program: Program) -> Waits:
    return Waits(tiu_dep=[i.cmd_id_dep for i in program.tiu], gdma_dep=[i.cmd_id_dep for i in program.gdma],
                 tile_tiu=[i.wait_tiu_id for i in program.tile], tile_gdma=[i.wait_gdma_id for i in program.tile],
                 tiu_tile=[tile_wait_operand(i) for i in program.tiu],
                 gdma_tile=[tile_wait_operand(i) for i in program.gdma])


def auto_waits(program: Program) -> Waits:
    """Auto mode: each TIU instruction waits for every GDMA instruction issued before it and vice
    versa; TILE blocks wait for every TIU and GDMA instruction issued before them (SYS tile waits
    stay as compiled)."""
    waits = _compiled_waits(program)
    seen = {Engine.TIU: 0, Engine.GDMA: 0, Engine.TILE: 0}
    for engine, index in program.issue_sequence():
        if engine is Engine.TIU:
            waits.tiu_dep[index] = seen[Engine.GDMA]
        elif engine is Engine.GDMA:
            waits.gdma_dep[index] = seen[Engine.TIU]
        else:
            waits.tile_tiu[index], waits.tile_gdma[index] = seen[Engine.TIU], seen[Engine.GDMA]
        seen[engine] += 1
    return waits


def resolve_waits(program: Program, dep_mode: str | None, check: bool = True, keep: list | None = None) -> Waits:
    """Waits the engines honour: compiled (checked against the bitmaps unless check=False) or auto.
    `keep` receives the instructions' accesses when the check computes them (issue order per engine)."""
    if dep_mode == "auto":
        return auto_waits(program)
    if dep_mode not in (None, "bitmap"):
        from tpuflow.errors import OptionError
        raise OptionError(f"option --dep-mode: '{dep_mode}' is not one of bitmap, auto")
    if not check:
        return _compiled_waits(program)
    waits, problems = derive_bitmap_waits(program, keep)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise DependencyCheckError(f"IFE check: compiled dependencies disagree with the chunk bitmaps: "
                                   f"{problems[0]}{more}")
    return waits
