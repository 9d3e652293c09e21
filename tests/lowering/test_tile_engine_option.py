"""--tile-engine fit|all|cost (CompileOptions.tile_engine): which convs and MatMuls the cube takes on the tile path, as an
option (it was the module constant lowering.ops.tilemm.ENGINE_CHOICE): validated, recorded in outputs only
when not the default, and steering the lowering."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tpuflow.errors import OptionError
from tpuflow.options import CompileOptions


@pytest.fixture(autouse=True)
def choice_from_options(monkeypatch):
    from tpuflow.lowering.ops import tilemm
    monkeypatch.setattr(tilemm, "ENGINE_CHOICE", None)


def test_values_are_checked():
    with pytest.raises(OptionError, match="--tile-engine: 'most' is not one of fit, all, cost"):
        CompileOptions(matmul="tile", tile_engine="most")
    with pytest.raises(OptionError, match="--tile-engine: only with --matmul tile"):
        CompileOptions(tile_engine="all")


def test_recorded_only_when_not_the_default():
    """The default leaves outputs (options dict, fingerprint) as they were before the option existed."""
    fit = CompileOptions(matmul="tile")
    assert "tile_engine" not in fit.as_dict()
    assert CompileOptions(matmul="tile", tile_engine="all").as_dict()["tile_engine"] == "all"
    assert CompileOptions(matmul="tile", tile_engine="all").fingerprint() != fit.fingerprint()


def test_choice_steers_the_cube():
    """small_cnn fp16 on sg2260: all puts every conv the cube can take on it (TMATMULs), fit only those its
    cost comparison finds faster there, so all has more TILE instructions."""
    from tpuflow.pipeline import compile_model
    counts = {c: compile_model("small_cnn", None, CompileOptions(dtype="fp16", matmul="tile", tile_engine=c))[1].counts()
              for c in ("fit", "all")}
    assert counts["all"]["tile"] > counts["fit"]["tile"]


def test_cli_estimate_help_and_json():
    run = lambda *a: subprocess.run([sys.executable, "-m", "tpuflow", *a], capture_output=True, text=True)  # noqa: E731
    help_text = run("estimate", "--help").stdout
    assert "--tile-engine" in help_text and "all" in help_text and "cost" in help_text
    out = run("estimate", "small_cnn", "--dtype", "fp16", "--matmul", "tile", "--tile-engine", "all", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["options"]["tile_engine"] == "all"
    bad = run("estimate", "small_cnn", "--tile-engine", "all")
    assert bad.returncode == 2 and "--tile-engine: only with --matmul tile" in bad.stderr
