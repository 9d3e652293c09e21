"""The Python API: compile / estimate / verify / inspect as plain functions, and the `cmd_*`
functions the CLI calls (they print and return an exit code)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tpuflow.chip import ChipConfig, builtin_chip_names, load_chip
from tpuflow.options import CompileOptions


def _print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


def _table(rows: list[tuple], header: tuple) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(header, widths)).rstrip()]
    lines += ["  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


# ------------------------------------------------------------------ disasm

def cmd_disasm(path: Path, chip: str | None) -> int:
    """Print one line per instruction of an output directory or of one stream file."""
    from tpuflow.codegen.disasm import path_lines

    lines = list(path_lines(path, chip))  # decode everything before printing anything
    sys.stdout.write("".join(line + "\n" for line in lines))
    return 0


# ------------------------------------------------------------------ chips

def cmd_chips(name: str | None, as_json: bool) -> int:
    if name is None:
        chips = [load_chip(n) for n in builtin_chip_names()]
        if as_json:
            _print_json([{"name": c.name, "description": c.core.description, "fingerprint": c.fingerprint()}
                         for c in chips])
        else:
            print(_table([(c.name, c.fingerprint(), c.core.description) for c in chips],
                         ("chip", "fingerprint", "description")))
        return 0
    chip = load_chip(name)
    if as_json:
        _print_json({"name": chip.name, "fingerprint": chip.fingerprint(), "config": chip.as_dict()})
        return 0
    print(f"{chip.name}: {chip.core.description}\nfingerprint {chip.fingerprint()}  (source: {chip.source})\n")
    print(_table(chip.describe(), ("key", "value", "unit", "meaning")))
    return 0
