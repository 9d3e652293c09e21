"""Per-core binaries: write/read round trip of a multi-core folder, manifest records, disasm by core."""

import json

from multicore_programs import sliced_add_program

from tpuflow.codegen import read_program, write_program
from tpuflow.codegen.disasm import path_lines


def test_every_core_gets_its_three_streams_and_reads_back_equal(tmp_path):
    program = sliced_add_program(4)
    write_program(program, tmp_path, name="add")
    for k in range(4):
        for suffix in ("BD", "GDMA", "TILE"):
            assert (tmp_path / f"add.{suffix}.{k}").is_file()
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["cores"] == 4 and manifest["core_split"][1] == {"axis": "c", "range": [4, 8]}
    assert [c["counts"] for c in manifest["per_core"]] == program.core_counts()[1:]
    assert manifest["counts"] == program.core_counts()[0] == {"tiu": 4, "gdma": 6, "tile": 0}
    back = read_program(tmp_path)
    assert back.core_count == 4 and back.core_split == program.core_split
    for k in range(4):
        got, want = back.core(k), program.core(k)
        assert (got.tiu, got.gdma, got.issue_order, got.gdma_layers) == (want.tiu, want.gdma, want.issue_order,
                                                                          want.gdma_layers)


def test_single_core_manifest_keeps_its_keys(tmp_path):
    program = sliced_add_program(1, with_barrier=False)
    write_program(program, tmp_path, name="one")
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["cores"] == 1 and "per_core" not in manifest and not (tmp_path / "one.BD.1").exists()
    assert read_program(tmp_path).core_count == 1


def test_disasm_lists_core_by_core_with_messages(tmp_path):
    write_program(sliced_add_program(2), tmp_path, name="add")
    lines = list(path_lines(tmp_path))
    assert lines.count("# core 0") == 1 and lines.count("# core 1") == 1
    assert "B2 system.send_msg msg=0 cnt=4" in lines and "D4 dma.sys.sys_wait msg=0 cnt=4" in lines


def test_a_folder_of_raw_streams_reads_every_core(tmp_path):
    import shutil

    from tpuflow.codegen.vendor import read_stream_dir_cores
    out, raw = tmp_path / "out", tmp_path / "raw"
    write_program(sliced_add_program(3), out, name="add")
    raw.mkdir()
    for path in out.glob("add.*.[0-9]"):
        if ".TILE." not in path.name:
            shutil.copy(path, raw / path.name)
    program, per_core = read_stream_dir_cores(raw, sliced_add_program(3).chip)
    assert program.core_count == 3 and len(per_core) == 3
    assert [c.counts() for c in program.cores] == [{k: v for k, v in c.items()} for c in
                                                   sliced_add_program(3).core_counts()]
    lines = list(path_lines(raw))
    assert "# core 2" in lines and any(line.startswith("B2 system.send_msg msg=0 cnt=6") for line in lines)
