"""codegen.bmodel: .bmodel containers read for their command buffers; `tpuflow disasm / estimate X.bmodel`.

The bm1690 bmodels are written here from the schema facts codegen/bmodel.py lists (our own writer,
on the flatbuffers package's Builder); the one real .bmodel at hand (a BM1684X model shipped in the
tpu-mlir 1.30.2 wheel) is read when present.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

from tpuflow.chip import load_chip
from tpuflow.codegen.bmodel import HEADER, MAGIC, read_bmodel, read_bmodel_program
from tpuflow.errors import BinaryFormatError, InputFileError
from tpuflow.isa import Engine

flatbuffers = pytest.importorskip("flatbuffers")

REPO = Path(__file__).resolve().parents[2]
CORPUS = next((p for p in (REPO.parent / "shared" / "peers" / "tpu-mlir", Path("/work/shared/peers/tpu-mlir"))
               if p.is_dir()), None)
WHEEL_BMODEL = Path("/tmp/tpumlir_whl/x2/tpu_mlir/python/tools/soc_infer/demo/Yuv2rgb_0_int8/compilation.bmodel")


def _table(b, slots: dict[int, tuple[str, object]]) -> int:
    """One table: slot -> ('u32' | 'i32' | 'ref' | 'bin', value); structs are written inline last."""
    b.StartObject(max(slots) + 1)
    for slot, (kind, value) in sorted(slots.items()):
        if kind == "u32":
            b.PrependUint32Slot(slot, value, 0)
        elif kind == "i32":
            b.PrependInt32Slot(slot, value, 0)
        elif kind == "ref":
            b.PrependUOffsetTRelativeSlot(slot, value, 0)
        else:
            b.Prep(8, 16)
            b.PrependUint64(value[1])
            b.PrependUint64(value[0])
            b.PrependStructSlot(slot, b.Offset(), 0)
    return b.EndObject()


def _vector(b, offsets: list[int]) -> int:
    b.StartVector(4, len(offsets), 4)
    for off in reversed(offsets):
        b.PrependUOffsetTRelative(off)
    return b.EndVector()


def write_bmodel(path: Path, cores: list[tuple[bytes, bytes, int, int]], chip: str = "BM1690",
                 net: str = "net", counts_in_subnet: bool = False) -> Path:
    """A .bmodel with one net, stage and subnet whose cores hold (tiu, gdma, bdc_num, gdma_num), the
    buffers laid out one after the other in the binary section (after a few bytes standing for weights)."""
    binary = bytearray(b"\x5a" * 96)
    b = flatbuffers.Builder(1024)
    groups = []
    for tiu, gdma, bdc_num, gdma_num in cores:
        bdc_at = len(binary)
        binary += tiu
        gdma_at = len(binary)
        binary += gdma
        groups.append(_table(b, {0: ("u32", bdc_num), 1: ("u32", gdma_num), 2: ("bin", (bdc_at, len(tiu))),
                                 3: ("bin", (gdma_at, len(gdma)))}))
    if counts_in_subnet:   # single-core layout: the subnet's own cmd_group
        sub = _table(b, {1: ("ref", _vector(b, groups)), 10: ("i32", 0)})
    else:
        core_cmds = [_table(b, {0: ("ref", _vector(b, [g]))}) for g in groups]
        sub = _table(b, {10: ("i32", 0), 14: ("ref", _vector(b, core_cmds))})
    param = _table(b, {12: ("ref", _vector(b, [sub])), 16: ("u32", len(cores))})
    name = b.CreateString(net)
    net_t = _table(b, {0: ("ref", name), 3: ("ref", _vector(b, [param]))})
    chip_s = b.CreateString(chip)
    model = _table(b, {3: ("ref", chip_s), 4: ("ref", _vector(b, [net_t]))})
    b.Finish(model)
    flat = bytes(b.Output())
    path.write_bytes(HEADER.pack(MAGIC, HEADER.size, len(flat), len(binary), *[0] * 11) + flat + bytes(binary))
    return path


@lru_cache(maxsize=None)
def _small_cnn() -> tuple[bytes, bytes, int, int]:
    import tempfile
    from tpuflow.codegen.writer import write_program
    from tpuflow.pipeline import compile_model
    _, program = compile_model("small_cnn")
    with tempfile.TemporaryDirectory() as d:
        out = write_program(program, d, name="net")
        return ((out / "net.BD.0").read_bytes(), (out / "net.GDMA.0").read_bytes(), len(program.tiu),
                len(program.gdma))


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpuflow.cli", *args], capture_output=True, text=True, cwd=REPO)


def test_a_written_bmodel_gives_back_each_cores_buffers(tmp_path):
    tiu, gdma, n_tiu, n_gdma = _small_cnn()
    path = write_bmodel(tmp_path / "m.bmodel", [(tiu, gdma, n_tiu, n_gdma), (tiu[:0], gdma[:0], 0, 0)])
    bmodel = read_bmodel(path)
    assert (bmodel.chip, bmodel.core_num, len(bmodel.buffers)) == ("BM1690", 2, 2)
    first, second = bmodel.buffers
    assert (first.tiu, first.gdma, first.bdc_num, first.gdma_num, first.core) == (tiu, gdma, n_tiu, n_gdma, 0)
    assert (second.tiu, second.core) == (b"", 1)
    # the single-core layout (the subnet's own cmd_group) reads the same
    single = read_bmodel(write_bmodel(tmp_path / "s.bmodel", [(tiu, gdma, n_tiu, n_gdma)], counts_in_subnet=True))
    assert (single.buffers[0].tiu, single.buffers[0].gdma) == (tiu, gdma)


def test_estimate_and_disasm_of_a_bmodel_equal_those_of_its_raw_streams(tmp_path):
    tiu, gdma, n_tiu, n_gdma = _small_cnn()
    path = write_bmodel(tmp_path / "m.bmodel", [(tiu, gdma, n_tiu, n_gdma)])
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "net.BD.0").write_bytes(tiu)
    (raw / "net.GDMA.0").write_bytes(gdma)
    from_bmodel, from_raw = _cli("estimate", str(path), "--json"), _cli("estimate", str(raw), "--json")
    assert from_bmodel.returncode == 0, from_bmodel.stderr
    a, b = json.loads(from_bmodel.stdout), json.loads(from_raw.stdout)
    assert a["latency_us"] == b["latency_us"] > 0 and a["engines"] == b["engines"]
    listing = _cli("disasm", str(path))
    assert listing.returncode == 0, listing.stderr
    instr_lines = [line for line in listing.stdout.splitlines() if not line.startswith("#")]
    raw_lines = [line for line in _cli("disasm", str(raw)).stdout.splitlines() if not line.startswith("#")]
    assert instr_lines == raw_lines and len(instr_lines) == n_tiu + n_gdma


def test_two_cores_are_listed_but_not_estimated(tmp_path):
    tiu, gdma, n_tiu, n_gdma = _small_cnn()
    path = write_bmodel(tmp_path / "m.bmodel", [(tiu, gdma, n_tiu, n_gdma)] * 2)
    listing = _cli("disasm", str(path))
    assert listing.returncode == 0 and listing.stdout.count(" core 1 group 0 TIU:") == 1
    done = _cli("estimate", str(path))
    assert done.returncode == 2 and "2 command groups" in done.stderr and "Traceback" not in done.stderr


def test_broken_bmodels_are_clean_errors(tmp_path):
    tiu, gdma, n_tiu, n_gdma = _small_cnn()
    good = write_bmodel(tmp_path / "m.bmodel", [(tiu, gdma, n_tiu, n_gdma)]).read_bytes()
    bad_magic = tmp_path / "magic.bmodel"
    bad_magic.write_bytes(b"\0\0\0\0" + good[4:])
    with pytest.raises(BinaryFormatError, match="byte offset 0: magic"):
        read_bmodel(bad_magic)
    cut = tmp_path / "cut.bmodel"
    cut.write_bytes(good[:-len(gdma)])           # the binary section is shorter than the header says
    with pytest.raises(BinaryFormatError, match="do not fit"):
        read_bmodel(cut)
    wrong_count = write_bmodel(tmp_path / "count.bmodel", [(tiu, gdma, n_tiu + 1, n_gdma)])
    with pytest.raises(BinaryFormatError, match=f"{n_tiu} TIU commands decoded, the bmodel says {n_tiu + 1}"):
        read_bmodel_program(wrong_count, load_chip("sg2260"))
    other_chip = write_bmodel(tmp_path / "x.bmodel", [(tiu, gdma, n_tiu, n_gdma)], chip="BM1684X")
    with pytest.raises(InputFileError, match="chip BM1684X: only BM1690"):
        read_bmodel_program(other_chip, load_chip("sg2260"))
    done = _cli("disasm", str(bad_magic))
    assert done.returncode == 2 and "magic" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.skipif(not WHEEL_BMODEL.is_file(), reason="tpu-mlir 1.30.2 wheel's demo bmodel not unpacked")
def test_the_real_bm1684x_bmodel_of_the_tpu_mlir_wheel():
    """Its container as tpu-mlir's generated reader gives it: chip BM1684X, one cmd_group of 85 TIU / 16 GDMA
    commands at binary offsets 3185136 (5504 B) and 3190640 (1536 B); its commands are BM1684X's, not read."""
    bmodel = read_bmodel(WHEEL_BMODEL)
    (buf,) = bmodel.buffers
    assert (bmodel.chip, buf.net, buf.bdc_num, buf.gdma_num) == ("BM1684X", "Yuv2rgb_0", 85, 16)
    data = WHEEL_BMODEL.read_bytes()
    _, header, flat, _ = struct.unpack_from("<IIIQ", data)
    assert buf.tiu == data[header + flat + 3185136:header + flat + 3185136 + 5504] and len(buf.gdma) == 1536
    with pytest.raises(InputFileError, match="only BM1690"):
        read_bmodel_program(WHEEL_BMODEL, load_chip("bm1684x"))
    listing = _cli("disasm", str(WHEEL_BMODEL))
    assert listing.returncode == 0 and "85 TIU commands (5504 bytes), 16 GDMA commands (1536 bytes)" in listing.stdout


@pytest.mark.skipif(CORPUS is None, reason="tpu-mlir peer corpus (../shared/peers/tpu-mlir) not present")
def test_the_corpus_resnet50_streams_in_a_bmodel_simulate_as_the_raw_folder(tmp_path):
    """resnet50 bm1690_f16's extracted buffers with info.txt's counts (219 TIU, 185 GDMA) put back in a bmodel."""
    src = CORPUS / "resnet50" / "bm1690_f16"
    tiu, gdma = (src / "resnet50.BD.0").read_bytes(), (src / "resnet50.GDMA.0").read_bytes()
    path = write_bmodel(tmp_path / "resnet50.bmodel", [(tiu, gdma, 219, 185)], net="resnet50")
    program, streams = read_bmodel_program(path, load_chip("sg2260"))
    assert (len(program.tiu), len(program.gdma)) == (219, 185) and program.model_name == "resnet50"
    assert streams[Engine.TIU].register_counts()["sMM"] == 32
