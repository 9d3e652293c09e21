"""tpuflow sweep on real Dask worker processes: the default LocalCluster, and a scheduler plus
workers the test starts on 127.0.0.1 (`--scheduler ADDRESS`), give the very rows an in-process
cluster gives (so the executor never changes a result)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pandas as pd
import pytest

from tpuflow import sweep
from tpuflow.cli import main

SPEC = {"models": ["mlp", "small_cnn"], "dtypes": ["fp16"], "chip": "sg2260", "grid": {"ife.decode_cycles": [1, 4]}}
SPEC_TOML = """models = ["mlp", "small_cnn"]
dtypes = ["fp16"]
chip = "sg2260"
[grid]
"ife.decode_cycles" = [1, 4]
"""


@pytest.fixture(scope="module")
def in_process_rows():
    from dask.distributed import Client
    with Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None) as client:
        return sweep.run(SPEC, client=client)


def test_default_local_cluster_gives_the_in_process_rows(in_process_rows):
    frame = sweep.run(SPEC, workers=2)                  # LocalCluster: 2 single-threaded worker processes
    pd.testing.assert_frame_equal(frame, in_process_rows)
    assert frame.attrs == {"compiles": 2, "points": 4}


def _wait_for(path, proc, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists() or not path.read_text().strip():
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"dask {what} did not start: {proc.stderr.read()[-2000:] if proc.stderr else ''}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory):
    """`dask scheduler` and two `dask worker` processes on 127.0.0.1; stopped afterwards."""
    folder = tmp_path_factory.mktemp("dask")
    info = folder / "scheduler.json"
    procs = [subprocess.Popen([sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", "0",
                               "--no-dashboard", "--scheduler-file", str(info)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=folder)]
    try:
        _wait_for(info, procs[0], "scheduler")
        procs.append(subprocess.Popen([sys.executable, "-m", "dask", "worker", "--scheduler-file", str(info),
                                       "--nworkers", "2", "--nthreads", "1", "--no-dashboard",
                                       "--local-directory", str(folder)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=folder))
        address = json.loads(info.read_text())["address"]
        from dask.distributed import Client
        with Client(address, timeout="30s") as client:
            client.wait_for_workers(2, timeout=60)
        yield address
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_running_scheduler_gives_identical_rows(scheduler, in_process_rows, tmp_path, capsys):
    assert scheduler.startswith("tcp://127.0.0.1:")
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC_TOML)
    out = tmp_path / "out.parquet"
    assert main(["sweep", str(spec), "-o", str(out), "--scheduler", scheduler, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["compiles"] == 2
    frame = sweep.read_output(out, sweep.load_spec(spec))
    pd.testing.assert_frame_equal(frame, sweep.normalise(in_process_rows.copy(), sweep.load_spec(spec)))
