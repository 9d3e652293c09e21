"""Bit-field layouts declared as data: (name, width) lists, LSB-first, packed into little-endian bytes.

A `Layout` is a descriptor's physical fields in bit order (the first field starts at bit 0, each
next one where the previous ended) plus *logical* fields: the values callers deal in. A logical
field is one or more physical parts, least significant first (e.g. a 45-bit GDMA address is
`*_l32 | *_h13 << 32`), and is unsigned or two's complement over the parts' total width.
Physical fields may carry a constant (an opcode) that `pack` writes and `unpack` checks.

`pack` and `unpack` are derived from that table only: nothing is written per field. Because
the fields tile the descriptor LSB-first, a descriptor of consecutive little-endian 64-bit
words is one little-endian integer of `length_bits` bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping


class FieldRangeError(ValueError):
    """A logical value that does not fit its field (carries the field for the caller's message)."""

    def __init__(self, field: "LogicalField", value: int):
        self.field, self.value = field, value
        super().__init__(f"field {field.name} = {value} does not fit its {field.describe()}")


class ConstantMismatch(ValueError):
    """Decoded bits that differ from a layout constant (an opcode, a zero pad)."""

    def __init__(self, field: "BitField", value: int):
        self.field, self.value = field, value
        super().__init__(f"field {field.name} is {value:#x}, expected {field.const:#x}")


@dataclass(frozen=True)
class BitField:
    """One physical field: bits [offset, offset + width) of the descriptor."""

    name: str
    offset: int
    width: int
    const: int | None = None

    @property
    def mask(self) -> int:
        return ((1 << self.width) - 1) << self.offset

    def extract(self, raw: int) -> int:
        return (raw >> self.offset) & ((1 << self.width) - 1)


class LogicalField:
    """A value made of physical parts (least significant first), unsigned or two's complement.

    Width, range and masks are computed once: `place` and `take` run per field per instruction."""

    __slots__ = ("name", "parts", "signed", "width", "lo", "hi", "mask", "_offset", "_bits")

    def __init__(self, name: str, parts: tuple[BitField, ...], signed: bool = False):
        self.name, self.parts, self.signed = name, tuple(parts), signed
        self.width = sum(p.width for p in self.parts)
        self.lo = -(1 << (self.width - 1)) if signed else 0
        self.hi = (1 << (self.width - 1)) - 1 if signed else (1 << self.width) - 1
        self.mask = sum(p.mask for p in self.parts)
        single = len(self.parts) == 1
        self._offset = self.parts[0].offset if single else None  # fast path of one-part fields
        self._bits = (1 << self.width) - 1

    def describe(self) -> str:
        kind = "signed (two's complement)" if self.signed else "unsigned"
        return f"{self.width}-bit {kind} range [{self.lo}, {self.hi}]"

    def place(self, value: int) -> int:
        """The descriptor bits of `value` (raises FieldRangeError when it does not fit)."""
        if not self.lo <= value <= self.hi:
            raise FieldRangeError(self, value)
        if value < 0:
            value += 1 << self.width
        if self._offset is not None:
            return value << self._offset
        out, shift = 0, 0
        for p in self.parts:
            out |= ((value >> shift) & ((1 << p.width) - 1)) << p.offset
            shift += p.width
        return out

    def take(self, raw: int) -> int:
        if self._offset is not None:
            value = (raw >> self._offset) & self._bits
        else:
            value, shift = 0, 0
            for p in self.parts:
                value |= p.extract(raw) << shift
                shift += p.width
        if self.signed and value > self.hi:
            value -= 1 << self.width
        return value

    def __repr__(self) -> str:
        return f"LogicalField({self.name!r}, {self.describe()})"


class Layout:
    """A descriptor layout: physical fields LSB-first, logical fields over them, constants.

    `fields`: (name, width) or (name, width, const) in bit order. `logical`: logical name ->
    tuple of physical part names (least significant first); every other uniquely named
    non-constant physical field is also a logical field of the same name. `signed(name)` says
    which logical fields are two's complement.
    """

    def __init__(self, name: str, fields: Iterable[tuple], *, length_bits: int | None = None,
                 logical: Mapping[str, tuple[str, ...]] | None = None, signed=lambda name: False):
        self.name = name
        self.bits: tuple[BitField, ...] = tuple(self._place(fields))
        total = sum(b.width for b in self.bits)
        self.length_bits = total if length_bits is None else length_bits
        if total != self.length_bits or self.length_bits % 8:
            raise ValueError(f"layout {name}: fields cover {total} bits, expected {self.length_bits}")
        self.nbytes = self.length_bits // 8
        counts: dict[str, int] = {}
        for b in self.bits:
            counts[b.name] = counts.get(b.name, 0) + 1
        by_name = {b.name: b for b in self.bits if counts[b.name] == 1}
        logical = dict(logical or {})
        covered = {part for parts in logical.values() for part in parts}
        for b in self.bits:
            if b.const is None and counts[b.name] == 1 and b.name not in covered and b.name not in logical:
                logical[b.name] = (b.name,)
        self.fields: dict[str, LogicalField] = {
            lname: LogicalField(lname, tuple(by_name[p] for p in parts), bool(signed(lname)))
            for lname, parts in logical.items()}
        self.consts = tuple(b for b in self.bits if b.const is not None)
        self.const_bits = sum(b.const << b.offset for b in self.consts)
        self.const_mask = sum(b.mask for b in self.consts)

    @staticmethod
    def _place(fields: Iterable[tuple]) -> Iterable[BitField]:
        offset = 0
        for spec in fields:
            name, width = spec[0], int(spec[1])
            const = spec[2] if len(spec) > 2 else None
            yield BitField(name, offset, width, const)
            offset += width

    def field_at(self, bit: int) -> BitField:
        for b in self.bits:
            if b.offset <= bit < b.offset + b.width:
                return b
        raise IndexError(f"layout {self.name} has no bit {bit}")

    # ---- packing -------------------------------------------------------------------------
    def pack_int(self, values: Mapping[str, int]) -> int:
        """The descriptor as one integer; logical fields missing from `values` are 0."""
        raw = self.const_bits
        for name, value in values.items():
            if value:
                raw |= self.fields[name].place(value)
        return raw

    def pack(self, values: Mapping[str, int]) -> bytes:
        return self.pack_int(values).to_bytes(self.nbytes, "little")

    def unpack_int(self, raw: int, names: Iterable[str] | None = None) -> dict[str, int]:
        """Logical values of the descriptor integer (all of them, or `names`); checks constants."""
        if raw & self.const_mask != self.const_bits:
            for b in self.consts:
                if b.extract(raw) != b.const:
                    raise ConstantMismatch(b, b.extract(raw))
        fields = self.fields
        return {n: fields[n].take(raw) for n in (fields if names is None else names)}

    def unpack(self, data: bytes, names: Iterable[str] | None = None) -> dict[str, int]:
        if len(data) != self.nbytes:
            raise ValueError(f"layout {self.name}: {len(data)} bytes, expected {self.nbytes}")
        return self.unpack_int(int.from_bytes(data, "little"), names)

    def __repr__(self) -> str:
        return f"Layout({self.name!r}, {self.length_bits} bits, {len(self.bits)} fields)"
