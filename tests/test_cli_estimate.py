"""What `tpuflow estimate` tells a new user: one model bound shared with inspect, labelled stalls, their own chip."""

from __future__ import annotations

import json

import pytest

from tpuflow import cli
from tpuflow.chip import load_chip


def run_json(capsys, *argv: str) -> dict:
    assert cli.main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def user_chip(tmp_path_factory):
    path = tmp_path_factory.mktemp("chips") / "fastdram.toml"
    path.write_text('base = "sg2260"\n[dram]\npeak_gbps = 136.5\n')
    return path


def test_estimate_model_bound_is_inspects_lower_bound_for_every_matmul_path(capsys):
    inspected = run_json(capsys, "inspect", "mlp", "--dtype", "fp16")
    seen = set()
    for matmul in ("tiu", "tile"):
        for schedule in ("program", "list"):
            report = run_json(capsys, "estimate", "mlp", "--dtype", "fp16", "--matmul", matmul, "--schedule", schedule)
            assert report["model_bound_us"] == pytest.approx(inspected["lower_bound_us"], rel=1e-12)
            assert report["model_bound_us"] == pytest.approx(inspected["model_bound_us"], rel=1e-12)
            assert report["model_bounds"]["compulsory_ddr_us"] == pytest.approx(inspected["memory_bound_us"], rel=1e-12)
            assert report["latency_us"] >= report["model_bound_us"]
            seen.add(report["model_bound_us"])
    assert len(seen) == 1


@pytest.mark.parametrize("cores", [2, 8])
def test_model_bound_on_several_cores_has_their_engines_and_the_ddr_they_share(capsys, cores):
    chip = load_chip("sg2260")
    one = run_json(capsys, "estimate", "mlp", "--dtype", "fp16")["model_bounds"]
    report = run_json(capsys, "estimate", "mlp", "--dtype", "fp16", "--cores", str(cores))
    shared = min(cores * chip.dram.peak_gbps, chip.ddr_chip_peak_bytes_per_second / 1e9)
    assert report["model_bounds"]["compute_us"] == pytest.approx(one["compute_us"] / cores, rel=1e-12)
    assert report["model_bounds"]["compulsory_ddr_us"] == pytest.approx(
        one["compulsory_ddr_us"] * chip.dram.peak_gbps / shared, rel=1e-12)
    assert report["latency_us"] >= report["model_bound_us"]


def test_estimate_text_names_its_two_bounds_and_says_stalls_are_summed(capsys):
    assert cli.main(["estimate", "mlp"]) == 0
    out = capsys.readouterr().out
    lines = {line.split("  ")[0].strip(): line for line in out.splitlines() if line[:1].isalpha()}
    assert "lower bound" not in lines                      # every bound says whose bound it is
    assert "inspect" in lines["model bound"] and "every --matmul" in lines["model bound"]
    assert "this program" in lines["program bound"]
    assert "summed over instructions" in lines["stalls"] and "exceed the latency" in lines["stalls"]


def test_options_keep_their_types_in_json(capsys):
    report = run_json(capsys, "estimate", "mlp", "--time-limit", "7.5")
    assert report["options"]["time_limit_s"] == 7.5 and isinstance(report["options"]["time_limit_s"], float)
    assert report["options"]["dtype"] == "fp32"


def test_a_user_chip_file_has_its_own_name_description_and_fingerprint(capsys, user_chip):
    chip, base = load_chip(user_chip), load_chip("sg2260")
    assert chip.name == "fastdram" and chip.fingerprint() != base.fingerprint()
    assert chip.core.description != base.core.description and "dram.peak_gbps = 136.5" in chip.core.description
    report = run_json(capsys, "estimate", "mlp", "--chip", str(user_chip))
    assert (report["chip"], report["chip_fingerprint"], report["chip_description"]) == \
        ("fastdram", chip.fingerprint(), chip.core.description)
    assert cli.main(["estimate", "mlp", "--chip", str(user_chip)]) == 0
    text = capsys.readouterr().out
    assert f"mlp on fastdram (fingerprint {chip.fingerprint()};" in text and chip.core.description in text
    assert "sg2260:" not in text and base.core.description not in text


def test_a_user_chip_file_that_names_itself_keeps_its_name(tmp_path):
    path = tmp_path / "x.toml"
    path.write_text('base = "sg2260"\n[core]\nname = "lab-board"\ndescription = "our bring-up board"\n')
    chip = load_chip(path)
    assert (chip.name, chip.core.description) == ("lab-board", "our bring-up board")
    assert load_chip("sg2262").name == "sg2262"               # built-ins built on a base keep theirs


def test_compile_verify_and_inspect_text_show_the_user_chip_and_its_fingerprint(capsys, user_chip, tmp_path):
    fingerprint = load_chip(user_chip).fingerprint()
    assert cli.main(["compile", "mlp", "--chip", str(user_chip), "-o", str(tmp_path / "out")]) == 0
    assert f"compiled mlp for fastdram (fingerprint {fingerprint};" in capsys.readouterr().out
    assert cli.main(["verify", "mlp", "--chip", str(user_chip), "--no-race-check"]) == 0
    assert f"verify mlp on fastdram (fingerprint {fingerprint};" in capsys.readouterr().out
    assert cli.main(["inspect", "mlp", "--chip", str(user_chip)]) == 0
    assert f"chip fastdram (fingerprint {fingerprint})" in capsys.readouterr().out
