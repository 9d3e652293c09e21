"""codegen.vendor: tpu-mlir's bm1690 streams (the peer corpus, when present) and raw stream folders.

The corpus (../shared/peers/tpu-mlir/<model>/bm1690_<dtype>/) is not part of the repository; the
tests that read it skip with a reason when it is absent.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuflow.codegen.vendor import decode_vendor_stream, issue_order, read_stream_dir
from tpuflow.codegen.writer import decode_stream, write_program
from tpuflow.chip import load_chip
from tpuflow.errors import BinaryFormatError, InputFileError
from tpuflow.isa import Engine, SysDma, SysTiu, TensorDma

REPO = Path(__file__).resolve().parents[2]
CORPUS = next((p for p in (REPO.parent / "shared" / "peers" / "tpu-mlir", Path("/work/shared/peers/tpu-mlir"))
               if p.is_dir()), None)
PAIRS = sorted(CORPUS.glob("*/bm1690_*/*.BD.0")) if CORPUS else []
needs_corpus = pytest.mark.skipif(not PAIRS, reason="tpu-mlir peer corpus (../shared/peers/tpu-mlir) not present")
# record kinds tpu-mlir 1.30.2 emits for the corpus models (HOWTO.md of the corpus)
CORPUS_KINDS = {"sAR", "sCONV", "sMM", "sMM2", "sPorD", "sCW&sBC", "sSFU", "sCMP", "SYS_TR_ACC", "SYS",
                "DMA_tensor（0x000）", "DMA_matrix", "sDMA_sys"}


def _counts(info: Path) -> tuple[int, int]:
    text = info.read_text(encoding="utf-8")
    return (int(re.search(r"bdc_num:\s*(\d+)", text).group(1)), int(re.search(r"gdma_num:\s*(\d+)", text).group(1)))


@lru_cache(maxsize=None)
def _small_cnn_streams() -> tuple[object, bytes, bytes]:
    from tpuflow.pipeline import compile_model
    import tempfile
    _, program = compile_model("small_cnn")
    with tempfile.TemporaryDirectory() as d:
        out = write_program(program, d, name="net")
        return program, (out / "net.BD.0").read_bytes(), (out / "net.GDMA.0").read_bytes()


@needs_corpus
@pytest.mark.parametrize("bd", PAIRS, ids=lambda p: f"{p.parts[-3]}/{p.parts[-2]}")
def test_every_record_of_every_corpus_stream_is_read(bd: Path):
    tiu = decode_vendor_stream(bd.read_bytes(), Engine.TIU, str(bd))
    gdma_path = bd.with_name(bd.name.replace(".BD.0", ".GDMA.0"))
    gdma = decode_vendor_stream(gdma_path.read_bytes(), Engine.GDMA, str(gdma_path))
    assert (len(tiu.instructions), len(gdma.instructions)) == _counts(bd.parent / "info.txt")
    for stream in (tiu, gdma):
        assert stream.consumed_bytes + stream.padding_bytes == len((bd if stream is tiu else gdma_path).read_bytes())
        assert stream.padding_bytes < 128 and set(stream.registers) <= CORPUS_KINDS
    assert isinstance(tiu.instructions[-1], SysTiu) and tiu.instructions[-1].op == "end"
    assert isinstance(gdma.instructions[-1], SysDma) and gdma.instructions[-1].op == "chain_end"


@needs_corpus
def test_the_corpus_covers_every_kind_the_howto_lists():
    seen = set()
    for bd in PAIRS:
        seen |= set(decode_vendor_stream(bd.read_bytes(), Engine.TIU).registers)
        gd = bd.with_name(bd.name.replace(".BD.0", ".GDMA.0"))
        seen |= set(decode_vendor_stream(gd.read_bytes(), Engine.GDMA).registers)
    assert seen == CORPUS_KINDS


@needs_corpus
def test_vendor_resnet50_reads_its_dependency_ids_and_simulates(tmp_path):
    from tpuflow.hwmodel.timing import simulate
    src = CORPUS / "resnet50" / "bm1690_f16"
    for f in ("resnet50.BD.0", "resnet50.GDMA.0"):
        shutil.copy(src / f, tmp_path / f)
    program, streams = read_stream_dir(tmp_path, load_chip("sg2260"))
    assert streams[Engine.TIU].register_counts()["sMM"] == 32
    # every TIU waits for a GDMA command that exists, and the order issues it first
    assert all(0 <= i.cmd_id_dep <= len(program.gdma) for i in program.tiu)
    order = program.issue_order
    for k, instr in enumerate(program.tiu):
        position = [j for j, c in enumerate(order) if c == "B"][k]
        assert order[:position].count("D") >= instr.cmd_id_dep
    sim = simulate(program, check=False)
    assert sim.total_ps > 0


def test_our_streams_read_by_the_vendor_reader_give_our_instructions():
    """Our streams are written as tpu-mlir writes its own, so the vendor reader reads them exactly."""
    program, bd, gdma = _small_cnn_streams()
    assert decode_vendor_stream(bd, Engine.TIU).instructions == decode_stream(Engine.TIU, bd)
    assert decode_vendor_stream(gdma, Engine.GDMA).instructions == decode_stream(Engine.GDMA, gdma)


def test_issue_order_follows_the_dependencies():
    def dma(dep):
        return TensorDma(src_start_addr=0, dst_start_addr=0x1F0000000000, src_nsize=1, src_csize=1, src_hsize=1,
                         src_wsize=1, src_nstride=0, src_cstride=0, src_hstride=0, src_wstride=1, dst_nsize=1,
                         dst_csize=1, dst_hsize=1, dst_wsize=1, dst_nstride=0, dst_cstride=0, dst_hstride=0,
                         dst_wstride=1, cmd_id_dep=dep)
    tiu = [SysTiu(op="nop", cmd_id_dep=2), SysTiu(op="nop", cmd_id_dep=2), SysTiu(op="end", cmd_id_dep=3)]
    gdma = [dma(0), dma(0), dma(2), SysDma(op="chain_end", cmd_id_dep=3)]
    assert issue_order(tiu, gdma) == "DDBBDBD"


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpuflow.cli", *args], capture_output=True, text=True, cwd=REPO)


def test_disasm_and_estimate_take_a_folder_of_raw_streams(tmp_path):
    program, bd, gdma = _small_cnn_streams()
    (tmp_path / "net.BD.0").write_bytes(bd)
    (tmp_path / "net.GDMA.0").write_bytes(gdma)
    listing = _run_cli("disasm", str(tmp_path))
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    assert sum(1 for line in lines if re.match(r"B\d+ ", line)) == len(program.tiu)
    assert sum(1 for line in lines if re.match(r"D\d+ ", line)) == len(program.gdma)
    est = _run_cli("estimate", str(tmp_path), "--json")
    assert est.returncode == 0, est.stderr
    report = json.loads(est.stdout)
    assert report["latency_us"] > 0 and report["engines"]["tiu"]["instructions"] == len(program.tiu)


def test_a_broken_raw_stream_is_a_clean_error(tmp_path):
    _, bd, gdma = _small_cnn_streams()
    (tmp_path / "net.BD.0").write_bytes(bd[:-40])  # cut inside the last record
    (tmp_path / "net.GDMA.0").write_bytes(gdma)
    with pytest.raises(BinaryFormatError, match="byte offset"):
        read_stream_dir(tmp_path, load_chip("sg2260"))
    done = _run_cli("disasm", str(tmp_path))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (tmp_path / "other.BD.0").write_bytes(bd)
    with pytest.raises(InputFileError, match="one program"):
        read_stream_dir(tmp_path, load_chip("sg2260"))


@needs_corpus
@pytest.mark.parametrize("bd", PAIRS, ids=lambda p: f"{p.parts[-3]}/{p.parts[-2]}")
def test_vendor_dma_bytes_per_direction_equal_tpu_mlirs_gdma_summary(bd: Path):
    """The DMAs read from tpu-mlir's stream move exactly the bytes its compiler_profile.txt counts
    per direction (S = DDR or L2, L = local memory)."""
    gdma_path = bd.with_name(bd.name.replace(".BD.0", ".GDMA.0"))
    stream = decode_vendor_stream(gdma_path.read_bytes(), Engine.GDMA, str(gdma_path))
    base = load_chip("sg2260").core.gdma_lmem_base_address
    moved = {"S2L": 0, "L2S": 0, "S2S": 0, "L2L": 0}
    for instr in stream.instructions:
        if not isinstance(instr, SysDma):
            side = ("L" if instr.src_start_addr >= base else "S") + "2" + ("L" if instr.dst_start_addr >= base else "S")
            moved[side] += instr.nbytes
    summary = (bd.parent / "compiler_profile.txt").read_text(encoding="utf-8").split("GDMA SUMMARY")[1]
    assert moved == {k: int(v) for k, v in re.findall(r"(S2L|L2S|S2S|L2L):(\d+)", summary)}


def test_estimate_of_a_compile_folder_equals_the_estimate_of_the_model(tmp_path):
    from tpuflow.pipeline import estimate
    program, _, _ = _small_cnn_streams()
    write_program(program, tmp_path, name="net")
    assert estimate(str(tmp_path))["latency_cycles"] == estimate("small_cnn")["latency_cycles"]


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=1, max_size=400), st.sampled_from([Engine.TIU, Engine.GDMA]))
def test_vendor_reader_on_garbage_gives_a_clean_error_or_instructions(data, engine):
    try:
        stream = decode_vendor_stream(data, engine, "x")
    except BinaryFormatError as exc:
        assert "byte offset" in str(exc) or "truncated" in str(exc)
    else:
        assert stream.consumed_bytes + stream.padding_bytes == len(data)
        assert len(stream.instructions) == len(stream.registers) > 0
