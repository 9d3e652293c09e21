"""A regular install works: the wheel holds every package and data file, and `tpuflow estimate` runs from it.

The wheel is built offline from a copy of the sources (`--no-build-isolation`: the test extra
brings setuptools and wheel), installed without dependencies into a fresh virtual environment
that reuses this environment's installed packages, and run from a folder outside the repo.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
SOURCES = ("pyproject.toml", "setup.py", "README.md", "tpuflow", "frontend", "lowering", "scheduler",
           "hwmodel", "codegen", "models")


def _run(cmd: list, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    pytest.importorskip("wheel", reason="the test extra (pip install -e '.[test]') brings the wheel package")
    src = tmp_path_factory.mktemp("src")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in SOURCES:
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy2)(ROOT / name, src / name, **(
            {"ignore": ignore} if (ROOT / name).is_dir() else {}))
    dist = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-q", "-w", dist], src)
    (built,) = dist.glob("tpuflow-*.whl")
    return built


def test_wheel_holds_every_package_and_data_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for pkg in ROOT.glob("*/**/__init__.py"):
        rel = pkg.relative_to(ROOT)
        if rel.parts[0] in SOURCES and ".ci" not in rel.parts:
            installed = rel if rel.parts[0] == "tpuflow" else Path("tpuflow", *rel.parts)
            assert installed.as_posix() in names, f"{rel} is missing from the wheel"
    assert "tpuflow/lowering/ops/__init__.py" in names
    for data in ("tpuflow/hwmodel/chips/sg2260.toml", "tpuflow/codegen/templates/report.html.j2",
                 "tpuflow/codegen/tables/sg2260_regs.json"):
        assert data in names


def test_installed_wheel_runs_estimate_outside_the_repo(wheel, tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path)
    python = venv / "bin" / "python"
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path).stdout.strip())
    # the dependencies (onnx, numpy, ...) come from this environment; its .pth files (our own
    # editable install among them) are not processed, so tpuflow can only come from the wheel
    reused = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]
    (site / "reused_dependencies.pth").write_text("".join(p + "\n" for p in reused))
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel], tmp_path)
    where = _run([python, "-c", "import tpuflow.lowering.ops, sys; print(tpuflow.lowering.ops.__file__)"], tmp_path)
    assert Path(where.stdout.strip()).is_relative_to(site)
    proc = _run([venv / "bin" / "tpuflow", "estimate", "mlp", "--json"], tmp_path)
    report = json.loads(proc.stdout)
    assert report["model"] == "mlp" and report["latency_us"] > 0
