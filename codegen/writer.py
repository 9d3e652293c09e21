"""Output directory of a compiled Program: per-engine binaries, weight image, manifest.json; and reading it back.

Files, per core k: `<name>.BD.<k>` (TIU descriptors), `<name>.GDMA.<k>` (GDMA descriptors),
`<name>.TILE.<k>` (CUBE blocks); once: `<name>.weights.bin` (the DDR weight image, loaded at
memory.weight_base, shared by all cores) and `manifest.json`. Everything is encoded in memory first, then each file
is written under a temporary name in the output directory and renamed, manifest last, so a
failure never leaves half a file. Same Program -> byte-identical files (sorted keys, no
timestamps).

manifest.json (format_version 2 = descriptors in tpu-mlir 1.30.2's bm1690 layout with memory tags and
hardware-meaning fields, see codegen.sg2260; version 1 folders are refused): tool and version, chip
name + fingerprint, options, model name, per-engine instruction counts, issue_order run-length
coded ("B3D2T1" = BBBDDT), the DDR tensor placement, the instruction -> layer map per engine as runs [layer, count], layers
(LayerInfo, in program order), fused groups, and each file's size and sha256.
The top-level counts / issue_order / files / layer_map are core 0's (exactly as for a single-core
program); `cores` is the core count, `core_split` the compiler's per-core split record
(Program.core_split), and for cores 1.. `per_core` lists {core, counts, issue_order, files, layer_map}.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path

from tpuflow import __version__
from tpuflow.chip import ChipConfig, load_chip
from tpuflow.errors import InputFileError
from tpuflow.isa import Engine
from tpuflow.isa.ids import IdFields, unwrap_queues, wrap_queues
from tpuflow.options import typed_options
from tpuflow.program import ENGINES, CoreStreams, DdrTensor, LayerInfo, MemoryPlan, Program

from tpuflow.codegen.linx import decode_blocks, encode_blocks
from tpuflow.codegen.report_data import activation_layouts
from tpuflow.codegen.sg2260 import decode_descriptors, encode_descriptors

FORMAT_VERSION = 2
MANIFEST = "manifest.json"
CORE = 0
FILE_MODE = 0o644  # mkstemp creates 0600; outputs are ordinary readable files
def stream_file_name(name: str, engine: Engine, core: int = CORE) -> str:
    return f"{name}.{Engine(engine).stream_suffix}.{core}"


def encode_stream(engine: Engine, instrs, coeff: tuple[int, int] | None = None) -> bytes:
    """The bytes of one engine's queue (`coeff`: the weight image's DDR range, DMA memory tag 1)."""
    return encode_blocks(instrs) if Engine(engine) is Engine.TILE else encode_descriptors(instrs, coeff)


def decode_stream(engine: Engine, data: bytes, source: str = "<bytes>") -> list:
    if Engine(engine) is Engine.TILE:
        return decode_blocks(data, source)
    return decode_descriptors(data, Engine(engine), source)


def run_length(items) -> list[list]:
    """[[item, count], ...] of consecutive equal items."""
    runs: list[list] = []
    for item in items:
        if runs and runs[-1][0] == item:
            runs[-1][1] += 1
        else:
            runs.append([item, 1])
    return runs


def expand_runs(runs) -> list:
    return [item for item, count in runs for _ in range(count)]


def compact_issue_order(order: str) -> str:
    return "".join(f"{letter}{count}" for letter, count in run_length(order))


def expand_issue_order(text: str) -> str:
    if not re.fullmatch(r"([BDT]\d+)*", text):
        raise InputFileError(f"{MANIFEST}: issue_order '{text[:40]}' is not run-length coded B/D/T")
    return "".join(letter * int(count) for letter, count in re.findall(r"([BDT])(\d+)", text))


def _file_entry(data: bytes, file_name: str) -> dict:
    return {"name": file_name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _tensor_entry(t: DdrTensor) -> dict:
    """A DDR tensor as the manifest lists it; its layout only when not row-major ("NC1HWC0": a tile-path
    activation kept C0-blocked, DdrTensor.layout)."""
    entry = dict(dataclasses.asdict(t), shape=list(t.shape))
    if not entry["layout"]:
        del entry["layout"]
    return entry


def manifest_dict(program: Program, files: dict[str, dict], per_core_files: list[dict] = ()) -> dict:
    """The manifest of `program`: `files` are core 0's streams and the weights, `per_core_files` the
    stream entries of cores 1.. (one dict by engine each)."""
    mem = program.memory
    return {
        "format_version": FORMAT_VERSION,
        "tool": {"name": "tpuflow", "version": __version__},
        "chip": {"name": program.chip.name, "fingerprint": program.chip.fingerprint()},
        "options": typed_options(program.options),
        "model": program.model_name,
        "core": CORE,
        "counts": program.counts(),
        "issue_order": compact_issue_order(program.issue_order),
        "files": files,
        "memory": {"weight_base": mem.weight_base, "weight_bytes": len(mem.weight_image),
                   "ddr_bytes_used": mem.ddr_bytes_used,
                   "tensors": [_tensor_entry(t) for t in mem.tensors.values()]},
        "layer_map": {e.value: run_length(program.layer_names(e)) for e in ENGINES},
        "layers": [[key, dataclasses.asdict(info)] for key, info in program.layers.items()],
        "fused_groups": [list(g) for g in program.fused_groups],
        "layer_groups": program.layer_groups,
        "compulsory_ddr_bytes": program.compulsory_ddr_bytes,
        "cores": program.core_count,
        "core_split": program.core_split,
        **({"quantization": program.quantization} if program.quantization else {}),
        **({"layouts": layouts} if (layouts := activation_layouts(program)) else {}),
        **({"per_core": [_core_entry(program.core(k), per_core_files[k - 1]) for k in range(1, program.core_count)]}
           if program.core_count > 1 else {}),
    }


def _core_entry(view: Program, files: dict) -> dict:
    return {"core": view.core_id, "counts": view.counts(), "issue_order": compact_issue_order(view.issue_order),
            "files": files, "layer_map": {e.value: run_length(view.layer_names(e)) for e in ENGINES}}


def _compact(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(", ", ": "), ensure_ascii=False)


def _block(value, indent: str) -> str:
    """Dicts one key per line two levels deep, lists one item per line three levels deep; deeper
    values compact."""
    inner = indent + "  "
    if isinstance(value, dict) and value and len(indent) < 4:
        items = [f"{inner}{_compact(k)}: {_block(v, inner)}" for k, v in sorted(value.items())]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(value, list) and value and len(indent) < 6:
        return "[\n" + ",\n".join(inner + _compact(v) for v in value) + "\n" + indent + "]"
    return _compact(value)


def manifest_text(manifest: dict) -> str:
    """manifest.json text: valid JSON, sorted keys, a line per entry so diffs stay readable."""
    return _block(manifest, "") + "\n"


def _write_atomically(outdir: Path, contents: dict[str, bytes]) -> None:
    """Write every file under a temporary name, then rename them in order (last one last)."""
    temps: list[tuple[Path, Path]] = []
    try:
        for file_name, data in contents.items():
            fd, tmp = tempfile.mkstemp(prefix=f".{file_name}.", suffix=".tmp", dir=outdir)
            temps.append((Path(tmp), outdir / file_name))
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), FILE_MODE)
                f.write(data)
        for tmp, final in temps:
            os.replace(tmp, final)
    finally:
        for tmp, _ in temps:
            if tmp.exists():
                tmp.unlink()


def _core_streams(view: Program, name: str, contents: dict) -> dict:
    """Encode one core's three streams into `contents`; their manifest file entries by engine."""
    wrapped = wrap_queues({e: view.queue(e) for e in ENGINES}, view.issue_order, IdFields.of(view.chip))
    mem = view.memory
    coeff = (mem.weight_base, mem.weight_base + len(mem.weight_image))
    files = {}
    for e in ENGINES:
        file_name = stream_file_name(name, e, view.core_id)
        contents[file_name] = encode_stream(e, wrapped[e], coeff)
        files[e.value] = _file_entry(contents[file_name], file_name)
    return files


def write_program(program: Program, outdir: str | os.PathLike, name: str = "model") -> Path:
    """Write the output directory of `program` (see the module docstring); returns the directory."""
    out = Path(outdir)
    contents: dict[str, bytes] = {}
    files = _core_streams(program.core(0) if program.core_count > 1 else program, name, contents)
    per_core = [_core_streams(program.core(k), name, contents) for k in range(1, program.core_count)]
    weights_name = f"{name}.weights.bin"
    contents[weights_name] = bytes(program.memory.weight_image)
    files["weights"] = _file_entry(contents[weights_name], weights_name)
    manifest = manifest_text(manifest_dict(program, files, per_core))
    contents[MANIFEST] = manifest.encode()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputFileError(f"{out}: cannot create the output directory ({exc.strerror})") from None
    _write_atomically(out, contents)
    return out


# ------------------------------------------------------------------------------------ reading

def read_manifest(outdir: Path) -> dict:
    path = Path(outdir) / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputFileError(f"{path}: no manifest (is {outdir} a `tpuflow compile` output directory?)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputFileError(f"{path}: unreadable manifest ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format_version") != FORMAT_VERSION:
        raise InputFileError(f"{path}: format_version {manifest.get('format_version') if isinstance(manifest, dict) else '?'}"
                             f" is not {FORMAT_VERSION}")
    return manifest


def manifest_chip(manifest: dict, chip: ChipConfig | str | os.PathLike | None, where: str) -> ChipConfig:
    """The chip to decode with: `chip` or the manifest's; its fingerprint must match."""
    info = manifest["chip"]
    resolved = chip if isinstance(chip, ChipConfig) else load_chip(chip if chip is not None else info["name"])
    if resolved.fingerprint() != info["fingerprint"]:
        raise InputFileError(f"{where}: compiled for chip {info['name']} (fingerprint {info['fingerprint']}), "
                             f"but chip {resolved.name} has fingerprint {resolved.fingerprint()}")
    return resolved


def _read_file(outdir: Path, entry: dict) -> bytes:
    path = outdir / entry["name"]
    try:
        return path.read_bytes()
    except OSError as exc:
        raise InputFileError(f"{path}: cannot read ({exc.strerror})") from None


def _check_file(outdir: Path, entry: dict, data: bytes) -> None:
    if len(data) != entry["bytes"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise InputFileError(f"{outdir / entry['name']}: {len(data)} bytes that do not match the manifest "
                             f"({entry['bytes']} bytes, sha256 {entry['sha256'][:12]}...)")


def _memory_plan(manifest: dict, weights: bytes) -> MemoryPlan:
    mem = manifest["memory"]
    tensors = {}
    for t in mem["tensors"]:
        tensor = DdrTensor(**dict(t, shape=tuple(t["shape"])))
        tensors[tensor.name] = tensor
    return MemoryPlan(tensors=tensors, weight_base=mem["weight_base"], weight_image=weights,
                      ddr_bytes_used=mem["ddr_bytes_used"])


def read_program(outdir: str | os.PathLike, chip: ChipConfig | str | os.PathLike | None = None) -> Program:
    """Load and decode an output directory back into a Program (chip from the manifest unless given)."""
    out = Path(outdir)
    manifest = read_manifest(out)
    try:
        return _program_from(out, manifest, chip)
    except (KeyError, TypeError, ValueError) as exc:
        raise InputFileError(f"{out / MANIFEST}: malformed manifest ({type(exc).__name__}: {exc})") from None


def _read_core(out: Path, entry: dict, chip: ChipConfig) -> CoreStreams:
    """One core's streams from its manifest entry ({counts, issue_order, files, layer_map})."""
    queues = {}
    for e in ENGINES:
        file_entry = entry["files"][e.value]
        data = _read_file(out, file_entry)
        queues[e] = decode_stream(e, data, str(out / file_entry["name"]))
        if len(queues[e]) != entry["counts"][e.value]:
            raise InputFileError(f"{out / file_entry['name']}: {len(queues[e])} instructions, the manifest says "
                                 f"{entry['counts'][e.value]}")
        _check_file(out, file_entry, data)
    layer_map = {e: expand_runs(entry["layer_map"][e.value]) for e in ENGINES}
    issue_order = expand_issue_order(entry["issue_order"])
    for e in ENGINES:
        if issue_order.count(e.letter) != len(queues[e]):
            raise InputFileError(f"{out / MANIFEST}: issue_order lists {issue_order.count(e.letter)} {e.value} "
                                 f"instructions, the stream holds {len(queues[e])}")
    queues = unwrap_queues(queues, issue_order, IdFields.of(chip))
    return CoreStreams(tiu=queues[Engine.TIU], gdma=queues[Engine.GDMA], tile=queues[Engine.TILE],
                       tiu_layers=layer_map[Engine.TIU], gdma_layers=layer_map[Engine.GDMA],
                       tile_layers=layer_map[Engine.TILE], issue_order=issue_order)


def _program_from(out: Path, manifest: dict, chip) -> Program:
    resolved = manifest_chip(manifest, chip, str(out / MANIFEST))
    cores = [_read_core(out, manifest, resolved)] + [_read_core(out, entry, resolved)
                                                      for entry in manifest.get("per_core", [])]
    if len(cores) != manifest.get("cores", 1):
        raise InputFileError(f"{out / MANIFEST}: cores says {manifest.get('cores')}, the manifest lists "
                             f"{len(cores)} cores' streams")
    weights = _read_file(out, manifest["files"]["weights"])
    _check_file(out, manifest["files"]["weights"], weights)
    first = cores[0]
    base = Program(
        chip=resolved, tiu=first.tiu, gdma=first.gdma, tile=first.tile,
        tiu_layers=first.tiu_layers, gdma_layers=first.gdma_layers, tile_layers=first.tile_layers,
        memory=_memory_plan(manifest, weights),
        layers={key: LayerInfo(**info) for key, info in manifest["layers"]},
        fused_groups=[tuple(g) for g in manifest["fused_groups"]],
        layer_groups=manifest.get("layer_groups", []), compulsory_ddr_bytes=manifest.get("compulsory_ddr_bytes", 0),
        options={k: str(v) for k, v in manifest["options"].items()}, model_name=manifest["model"],
        issue_order=first.issue_order, core_split=list(manifest.get("core_split", [])),
        quantization=manifest.get("quantization", {}))
    return base if len(cores) == 1 else Program.from_cores(base, cores)
