"""Output directory: write/read round trip, determinism, atomic writes, manifest contents, read errors."""

from __future__ import annotations

import json
import os
import tempfile

import pytest
from codegen_programs import sample_program
from codegen_strategies import any_descriptor_instruction, any_tile_instruction
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuflow.chip import load_chip
from tpuflow.codegen import read_program, write_program
from tpuflow.codegen import writer
from tpuflow.errors import BinaryFormatError, EncodingError, InputFileError, UserError
from tpuflow.isa import ConvTiu, Engine, ids
from tpuflow.isa.ids import IdFields, window_floor
from tpuflow.program import Program

FILES = ["manifest.json", "tiny.BD.0", "tiny.GDMA.0", "tiny.TILE.0", "tiny.weights.bin"]


def assert_same_program(a: Program, b: Program) -> None:
    assert a.chip.fingerprint() == b.chip.fingerprint()
    for name in ("tiu", "gdma", "tile", "tiu_layers", "gdma_layers", "tile_layers", "memory", "layers",
                 "fused_groups", "options", "model_name", "issue_order"):
        assert getattr(a, name) == getattr(b, name), name


def test_read_of_write_gives_the_program_back(tmp_path):
    program = sample_program()
    out = write_program(program, tmp_path / "out", name="tiny")
    assert out == tmp_path / "out" and sorted(os.listdir(out)) == FILES
    assert_same_program(read_program(out), program)


def test_output_is_deterministic(tmp_path):
    a = write_program(sample_program(), tmp_path / "a", name="tiny")
    b = write_program(sample_program(), tmp_path / "b", name="tiny")
    write_program(sample_program(), a, name="tiny")   # rewriting in place changes nothing
    for name in FILES:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert sorted(os.listdir(a)) == FILES


def test_manifest_contents(tmp_path):
    program = sample_program()
    manifest = json.loads((write_program(program, tmp_path, name="tiny") / "manifest.json").read_text())
    assert manifest["format_version"] == 2 and manifest["tool"]["name"] == "tpuflow"
    assert manifest["chip"] == {"name": "sg2260", "fingerprint": program.chip.fingerprint()}
    assert manifest["counts"] == {"tiu": 5, "gdma": 5, "tile": 4}
    assert manifest["issue_order"] == "D2B2T2D1T1B1T1B1D2B1"
    assert manifest["layer_map"]["tiu"] == [["conv1", 1], ["pool1", 2], ["mm", 1], ["", 1]]
    assert manifest["memory"]["weight_base"] == 0x100000
    assert manifest["memory"]["tensors"][0] == {"name": "x", "addr": 0x1000, "shape": [1, 3, 16, 16],
                                                "dtype": "fp32", "role": "input", "nbytes": 3072}
    assert manifest["files"]["tiu"]["bytes"] == (tmp_path / "tiny.BD.0").stat().st_size
    assert manifest["model"] == "tiny" and manifest["options"]["matmul"] == "tile"
    assert manifest["fused_groups"] == [["conv1", "pool1"]]
    assert [key for key, _ in manifest["layers"]] == ["conv1", "pool1", "mm"]
    assert (tmp_path / "tiny.weights.bin").read_bytes() == program.memory.weight_image


@settings(max_examples=25, deadline=None)
@given(st.lists(any_descriptor_instruction(), max_size=12), st.lists(any_tile_instruction(), max_size=6),
       st.randoms(use_true_random=False))
def test_round_trip_of_random_programs(instrs, tile, rnd):
    tiu = [i for i in instrs if i.ENGINE is Engine.TIU]
    gdma = [i for i in instrs if i.ENGINE is Engine.GDMA]
    order = list("B" * len(tiu) + "D" * len(gdma) + "T" * len(tile))
    rnd.shuffle(order)
    layers = lambda q: [rnd.choice(["a", "b", ""]) for _ in q]  # noqa: E731
    program = Program(chip=load_chip("sg2260"), tiu=tiu, gdma=gdma, tile=tile, tiu_layers=layers(tiu),
                      gdma_layers=layers(gdma), tile_layers=layers(tile), issue_order="".join(order))
    program = legal_waits(program)
    with tempfile.TemporaryDirectory() as d:
        assert_same_program(read_program(write_program(program, d)), program)


def legal_waits(program: Program) -> Program:
    """Random field values with every wait inside the id window of tpuflow.isa.ids: an
    instruction only waits for other-engine instructions issued before it."""
    fields = IdFields.of(program.chip)

    def legal(value, before, bits):
        floor = window_floor(before, bits)
        return floor + value % (before - floor + 1)

    queues = ids._rewrite({e: program.queue(e) for e in (Engine.TIU, Engine.GDMA, Engine.TILE)},
                          program.issue_order, fields, legal)
    program.tiu, program.gdma, program.tile = queues[Engine.TIU], queues[Engine.GDMA], queues[Engine.TILE]
    return program


# ------------------------------------------------------------------------------- atomicity

def test_an_encoding_error_writes_nothing(tmp_path):
    program = sample_program()
    program.tiu[0] = ConvTiu(**{**program.tiu[0].field_values(), "res_op_x_str": 99})
    with pytest.raises(EncodingError, match="res_op_x_str"):
        write_program(program, tmp_path / "out", name="tiny")
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []


def test_a_failed_rename_leaves_no_partial_or_temporary_files(tmp_path, monkeypatch):
    out = write_program(sample_program(), tmp_path, name="tiny")
    before = {name: (out / name).read_bytes() for name in FILES}
    real_replace = os.replace
    calls = []

    def failing_replace(src, dst):
        calls.append(dst)
        if str(dst).endswith("manifest.json"):
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(writer.os, "replace", failing_replace)
    program = sample_program()
    program.model_name = "changed"
    with pytest.raises(OSError):
        write_program(program, out, name="tiny")
    assert sorted(os.listdir(out)) == FILES                      # no temporary files left behind
    assert (out / "manifest.json").read_bytes() == before["manifest.json"]
    assert str(calls[-1]).endswith("manifest.json")              # the manifest is renamed last


# --------------------------------------------------------------------------- read errors

def test_read_errors_are_user_errors_naming_the_file(tmp_path):
    with pytest.raises(InputFileError, match="no manifest"):
        read_program(tmp_path)
    out = write_program(sample_program(), tmp_path, name="tiny")
    with pytest.raises(InputFileError, match="fingerprint"):
        read_program(out, chip=load_chip("sg2262"))
    assert read_program(out, chip="sg2260").chip.name == "sg2260"
    bd = out / "tiny.BD.0"
    data = bd.read_bytes()
    bd.write_bytes(data[:-3])
    with pytest.raises(BinaryFormatError, match=r"tiny\.BD\.0: truncated SYS record at byte offset \d+"):
        read_program(out)
    bd.write_bytes(data)
    (out / "tiny.weights.bin").write_bytes(b"x")
    with pytest.raises(InputFileError, match="weights.bin: 1 bytes that do not match the manifest"):
        read_program(out)
    (out / "manifest.json").write_text("{")
    with pytest.raises(InputFileError, match="unreadable manifest"):
        read_program(out)
    assert issubclass(InputFileError, UserError)
