"""Dependency ids that outgrow their descriptor fields: the id window, wrapping for the binaries
and unwrapping from the global issue order.

Inside tpuflow every cmd_id is the true 1-based position in its queue and every wait names a true
id. The descriptor fields are narrower (TIU cmd_id_dep holds a GDMA id in chip.deps.tiu_dep_id_bits,
GDMA cmd_id_dep a TIU id in gdma_dep_id_bits, the TILE B.IOD waits tile_dep_id_bits), so the
binaries carry ids modulo 2**bits. That is exact because of one rule the compiler keeps (and the
IFE check re-derives): an instruction never waits for an instruction of the other engine more than
2**bits - 1 places before the last one issued ahead of it; an older dependency is moved forward to
that window edge, which can only make it wait longer, never less. A reader recovers the true id
from the count of other-engine instructions issued before (Program.issue_order)."""

from __future__ import annotations

import dataclasses

from tpuflow.isa.base import Engine


def window_floor(issued_before: int, bits: int) -> int:
    """The oldest id an instruction may wait for, given `issued_before` ids of that engine."""
    return max(0, issued_before - (1 << bits) + 1)


def clamp(dep: int, issued_before: int, bits: int) -> int:
    """`dep` moved forward into the window (0 = no wait stays 0 while the window covers id 1)."""
    floor = window_floor(issued_before, bits)
    return dep if dep >= floor else floor


def wrap(dep: int, bits: int) -> int:
    return dep % (1 << bits)


def unwrap(value: int, issued_before: int, bits: int) -> int:
    """The true id in [issued_before - 2**bits + 1, issued_before] congruent to `value`."""
    return issued_before - ((issued_before - value) % (1 << bits))


@dataclasses.dataclass(frozen=True)
class IdFields:
    """Widths of the id fields (Instruction.WAIT_FIELDS) of each engine's instructions."""

    tiu_bits: int      # TIU cmd_id_dep (a GDMA id)
    gdma_bits: int     # GDMA cmd_id_dep (a TIU id)
    tile_bits: int     # TILE wait_tiu_id / wait_gdma_id

    @classmethod
    def of(cls, chip) -> "IdFields":
        d = chip.deps
        return cls(d.tiu_dep_id_bits, d.gdma_dep_id_bits, d.tile_dep_id_bits)

    def bits(self, engine: Engine) -> int:
        """Width of the id fields of `engine`'s instructions."""
        return (self.tiu_bits, self.gdma_bits, self.tile_bits)[engine.code]


def _rewrite(queues: dict, issue_order: str, fields: IdFields, convert) -> dict:
    """Apply convert(value, issued_before, bits) to every id field, walking the issue order."""
    issued = {engine: 0 for engine in Engine}
    out = {e: list(q) for e, q in queues.items()}
    for letter in issue_order:
        engine = Engine.of_letter(letter)
        index = issued[engine]
        instr = out[engine][index]
        bits = fields.bits(engine)
        changes = {name: convert(getattr(instr, name), issued[other], bits)
                   for other, name in instr.WAIT_FIELDS.items()}
        if changes:
            out[engine][index] = dataclasses.replace(instr, **changes)
        issued[engine] += 1
    return out


def wrap_queues(queues: dict, issue_order: str, fields: IdFields) -> dict:
    """Queues with every id field reduced modulo its width (for encoding)."""
    return _rewrite(queues, issue_order, fields, lambda v, before, bits: wrap(v, bits))


def unwrap_queues(queues: dict, issue_order: str, fields: IdFields) -> dict:
    """Queues with the true ids restored (after decoding)."""
    return _rewrite(queues, issue_order, fields, unwrap)
