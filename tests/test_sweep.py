"""tpuflow sweep (issue 17): spec validation before any work, the traced-chip compile cache (sound:
an unread key never changes a Program; a read key does), rows equal to `tpuflow estimate --json` on
the point's chip file, error rows, resume from a partial Parquet / CSV file, progress lines.
Most runs use one in-process Dask cluster (tests/test_sweep_cluster.py runs real worker processes)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from tpuflow import sweep
from tpuflow.chip import load_chip, tomllib
from tpuflow.cli import main

TIMING_KEY = "ife.decode_cycles"        # read by the timing model only (checked below, not assumed)
SMALL = {"models": ["mlp"], "dtypes": ["fp16"], "chip": "sg2260", "grid": {TIMING_KEY: [1, 4]}}


@pytest.fixture(scope="module")
def cluster():
    """One in-process LocalCluster (2 single-threaded workers) shared by this module's sweeps."""
    from dask.distributed import LocalCluster
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as local:
        yield local


@pytest.fixture(scope="module")
def client(cluster):
    from dask.distributed import Client
    with Client(cluster) as c:
        yield c


@pytest.fixture(scope="module")
def small_frame(client):
    return sweep.run(SMALL, client=client)


def write_spec(folder: Path, text: str) -> Path:
    path = folder / "spec.toml"
    path.write_text(text)
    return path


SMALL_TOML = f"""models = ["mlp"]
dtypes = ["fp16"]
chip = "sg2260"
[grid]
"{TIMING_KEY}" = [1, 4]
"""


# ------------------------------------------------------------------ validation

@pytest.mark.parametrize("spec, named", [
    ({**SMALL, "grid": {"dram.no_such_key": [1]}}, "'dram.no_such_key'"),
    ({**SMALL, "grid": {"nosection.lanes": [1]}}, "'nosection.lanes'"),
    ({**SMALL, "grid": {"compute.tile_macs_per_cycle.fp99": [1]}}, "'compute.tile_macs_per_cycle.fp99'"),
    ({**SMALL, "grid": {"core.lanes": [64, 48]}}, "core.lanes = 48"),
    ({**SMALL, "grid": {"dram.peak_gbps": [-1.0]}}, "dram.peak_gbps"),
    ({**SMALL, "models": ["mlp", "no_such_model"]}, "model 'no_such_model'"),
    ({**SMALL, "dtypes": ["fp16", "int4"]}, "int4"),
    ({**SMALL, "cores": [99]}, "core.cores"),
    ({**SMALL, "options": {"matmul": ["tiu", "gpu"]}}, "gpu"),
    ({**SMALL, "options": {"colour": "red"}}, "'options.colour'"),
    ({**SMALL, "gird": {}}, "'gird'"),
    ({**SMALL, "chip": "no_such_chip"}, "no_such_chip"),
    ({**SMALL, "inputs": {"resnet50": {"data": [1, 3, 64, 64]}}}, "[inputs.resnet50]"),
    ({**SMALL, "inputs": {"mlp": {"nope": [1, 2]}}}, "model 'mlp' does not load: mlp: input shape given for 'nope'"),
])
def test_bad_spec_is_rejected_naming_the_key_or_model(spec, named):
    with pytest.raises(sweep.SweepSpecError) as info:
        sweep.validate(sweep.load_spec(spec))
    assert named in str(info.value) and "\n" not in str(info.value)


def test_cli_rejects_a_bad_spec_before_any_work(tmp_path, capsys):
    spec = write_spec(tmp_path, SMALL_TOML.replace(TIMING_KEY, "dram.no_such_key"))
    out = tmp_path / "out.parquet"
    assert main(["sweep", str(spec), "-o", str(out), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "dram.no_such_key" in captured.err
    document = json.loads(captured.out)
    assert document["ok"] is False and document["error"]["code"] == 2
    assert "dram.no_such_key" in document["error"]["message"]
    assert list(tmp_path.iterdir()) == [spec]          # nothing written, not even a temporary file


def test_cli_rejects_a_model_that_does_not_load(tmp_path, capsys):
    (tmp_path / "broken.onnx").write_bytes(b"not an onnx model")
    spec = write_spec(tmp_path, SMALL_TOML.replace('["mlp"]', '["mlp", "broken.onnx"]'))
    assert main(["sweep", str(spec), "-o", str(tmp_path / "out.parquet")]) == 2
    assert "model 'broken.onnx'" in capsys.readouterr().err
    assert not (tmp_path / "out.parquet").exists()


def test_output_suffix_and_workers_are_checked(tmp_path, capsys):
    spec = write_spec(tmp_path, SMALL_TOML)
    assert main(["sweep", str(spec), "-o", str(tmp_path / "out.xlsx")]) == 2
    assert main(["sweep", str(spec), "-o", str(tmp_path / "out.csv"), "--workers", "0"]) == 2
    assert not any(tmp_path.glob("out*"))


def test_points_are_every_combination():
    spec = sweep.load_spec({"models": ["mlp", "small_cnn"], "dtypes": ["fp16", "fp32"], "cores": [1],
                            "grid": {"core.lanes": [32, 64], TIMING_KEY: [1, 2, 3]}, "options": {"matmul": ["tiu", "tile"]}})
    points = spec.points()
    assert len(points) == 2 * 2 * 2 * 2 * 3 and len(set(points)) == len(points)
    assert len({sweep.point_id(spec, p) for p in points}) == len(points)


# ------------------------------------------------------------------ point chips and the compile cache

def test_point_chip_file_round_trips_through_toml():
    spec = sweep.load_spec({**SMALL, "grid": {"dram.peak_gbps": [34.132], "compute.tile_macs_per_cycle.fp16": [8192]}})
    point = spec.points()[0]
    text = sweep.point_chip_toml(spec, point)
    raw = tomllib.loads(text)
    assert raw["dram"]["peak_gbps"] == 34.132 and raw["core"]["name"] == "sg2260-sweep"
    chip = sweep.build_point_chip(*sweep.base_chip_raw(spec), point.grid)
    assert chip.dram.peak_gbps == 34.132 and chip.compute.tile_macs_per_cycle["fp16"] == 8192
    assert chip.name == "sg2260-sweep" and chip.fingerprint() != load_chip("sg2260").fingerprint()
    unswept = sweep.build_point_chip(*sweep.base_chip_raw(spec), ())       # no grid: the base chip itself
    assert unswept.fingerprint() == load_chip("sg2260").fingerprint()


def test_a_chip_file_base_keeps_its_identity(tmp_path):
    (tmp_path / "mychip.toml").write_text('base = "sg2260"\n[dram]\npeak_gbps = 50.0\n')
    spec = sweep.load_spec({**SMALL, "chip": "mychip.toml", "grid": {}})
    spec = sweep.Spec(**{**spec.__dict__, "base_dir": str(tmp_path)})
    (point,) = spec.points()
    chip = sweep.build_point_chip(*sweep.base_chip_raw(spec), point.grid)
    assert chip.fingerprint() == load_chip(tmp_path / "mychip.toml").fingerprint()
    (tmp_path / "other_name.toml").write_text(sweep.point_chip_toml(spec, point))
    assert load_chip(tmp_path / "other_name.toml").fingerprint() == chip.fingerprint()


def test_traced_chip_records_exactly_the_keys_read():
    chip, reads = sweep.traced_chip(load_chip("sg2260"))
    assert reads() == frozenset()
    assert chip.lmem_bytes == 64 * chip.core.lmem_bytes_per_lane       # a derived property reads its keys
    chip.tiu.compute_latency(1, 0)                                        # a method reads its table
    assert reads() == {"core.lanes", "core.lmem_bytes_per_lane", "tiu.compute_latency_cycles"}
    assert chip.as_dict() == load_chip("sg2260").as_dict()


@pytest.mark.parametrize("bypass", ["deepcopy", "copy", "replace", "vars"])
def test_reads_that_bypass_attributes_count_as_reading_the_whole_section(bypass):
    import copy
    import dataclasses
    chip, reads = sweep.traced_chip(load_chip("sg2260"))
    {"deepcopy": copy.deepcopy, "copy": copy.copy, "vars": vars,
     "replace": lambda s: dataclasses.replace(s, pack_cycles=3)}[bypass](chip.ife)
    ife = {f"ife.{f.name}" for f in dataclasses.fields(chip.ife)}
    assert ife - {"ife.pack_cycles"} <= reads() and not any(k.startswith("core.") for k in reads())


def _compiled(model: str, grid: dict, **options) -> sweep.Compiled:
    spec = sweep.load_spec({"models": [model], "dtypes": ["fp16"], "grid": {k: [v] for k, v in grid.items()},
                            "options": options})
    point = spec.points()[0]
    compiled = sweep.compile_job(sweep.Job(point, "", model, (), *sweep.base_chip_raw(spec)))
    assert not compiled.error, compiled.error
    return compiled


def _same_program(a, b) -> bool:
    fields = ("tiu", "gdma", "tile", "issue_order", "layer_groups", "compulsory_ddr_bytes", "options")
    return all(getattr(a, f) == getattr(b, f) for f in fields) and a.memory.tensors == b.memory.tensors


def _changed(key: str, value):
    """Another valid value of a chip key (power-of-two and bool keys stay valid)."""
    if isinstance(value, bool):
        return not value
    return value * 2 if isinstance(value, int) else value * 1.5


@pytest.mark.parametrize("model, options, every", [("mlp", {}, 2), ("small_cnn", {"matmul": "tile"}, 5)])
def test_a_key_the_compiler_did_not_read_does_not_change_the_program(model, options, every):
    """The cache's premise, checked on the real compiler: unread keys (a sample of them, the
    sweep found them by tracing) leave the Program identical; a read key (core.lanes) changes it."""
    base = _compiled(model, {}, **options)
    chip = load_chip("sg2260")
    unread = sorted(k for k in (f"{s}.{n}" for s, t in chip.as_dict().items() for n, v in t.items()
                                if not isinstance(v, dict)) if k not in base.reads and not k.startswith("core.desc"))
    assert TIMING_KEY in unread and "core.lanes" in base.reads
    checked = 0
    for key in unread[::every]:
        value = sweep.chip_value(chip, key)
        try:
            other = _compiled(model, {key: _changed(key, value)}, **options)
        except sweep.SweepSpecError:
            continue                                   # the changed value is not a valid chip
        assert _same_program(base.program, other.program), key
        checked += 1
    assert checked >= 5
    assert not _same_program(base.program, _compiled(model, {"core.lanes": 32}, **options).program)


def test_timing_only_sweep_compiles_once_per_model(small_frame):
    assert small_frame.attrs == {"compiles": 1, "points": 2}
    assert list(small_frame["status"]) == ["ok", "ok"]
    assert small_frame["latency_us"].iloc[0] != small_frame["latency_us"].iloc[1]   # the key does matter


def test_a_compile_key_in_the_grid_compiles_per_value(client):
    from tpuflow.options import CompileOptions
    from tpuflow.pipeline import estimate
    spec = sweep.load_spec({**SMALL, "grid": {"core.lanes": [32, 64], TIMING_KEY: [1, 4]}})
    frame = sweep.run(spec, client=client)
    assert frame.attrs["compiles"] == 2 and len(frame) == 4 and set(frame["status"]) == {"ok"}
    for point, latency in zip(spec.points(), frame["latency_us"]):       # each on its own compile
        chip = sweep.build_point_chip(*sweep.base_chip_raw(spec), point.grid)
        assert latency == estimate("mlp", chip, CompileOptions(dtype="fp16"))["latency_us"], point.grid


# ------------------------------------------------------------------ rows

def test_row_equals_tpuflow_estimate_on_the_point_chip_file(small_frame, tmp_path, capsys):
    spec = sweep.load_spec(SMALL)
    for point, (_, row) in zip(spec.points(), small_frame.iterrows()):
        chip_file = tmp_path / f"point{row[TIMING_KEY]}.toml"
        chip_file.write_text(sweep.point_chip_toml(spec, point))
        assert main(["estimate", "mlp", "--chip", str(chip_file), "--dtype", "fp16", "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        expected = sweep.report_row(point, report, load_chip(chip_file), row["point_id"])
        for column, value in expected.items():
            assert row[column] == value, column


def test_rows_hold_every_swept_key_and_the_estimate_columns(small_frame):
    assert list(small_frame.columns) == sweep.columns_of(sweep.load_spec(SMALL))
    for column in ("model", "dtype", "cores", TIMING_KEY, "latency_us", "latency_cycles", "lower_bound_us",
                   "achieved_tops", "util_tiu", "util_gdma", "util_tile", "dram_bytes", "dram_achieved_gbps",
                   "chip_fingerprint", "status"):
        assert column in small_frame.columns


def test_a_failing_point_is_an_error_row(client):
    """A 1-byte TIU command list deadlocks the timing model: that point is a row with its error."""
    frame = sweep.run({**SMALL, "grid": {"ife.tiu_cmd_fifo_bytes": [32768, 1]}}, client=client)
    assert list(frame["status"]) == ["ok", "error"]
    assert "wait on each other forever" in frame["error"].iloc[1]
    assert pd.isna(frame["latency_us"].iloc[1]) and frame["latency_us"].iloc[0] > 0


def test_a_failing_compile_is_an_error_row_of_its_points(client):
    frame = sweep.run({**SMALL, "options": {"matmul": "tile"}, "grid": {"tile.queue_slots": [1]}}, client=client)
    assert list(frame["status"]) == ["error"] and "queue" in frame["error"].iloc[0]


# ------------------------------------------------------------------ output, resume

@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_resume_runs_only_the_missing_points(cluster, small_frame, tmp_path, capsys, suffix):
    spec = write_spec(tmp_path, SMALL_TOML)
    out = tmp_path / f"out{suffix}"
    address = ["--scheduler", cluster.scheduler_address]
    sweep.write_output(out, small_frame.iloc[[1]])               # an interrupted run kept one point
    assert main(["sweep", str(spec), "-o", str(out), "--json", *address]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["run"], summary["skipped"], summary["compiles"]) == (1, 1, 1)
    resumed = sweep.read_output(out, sweep.load_spec(spec))
    pd.testing.assert_frame_equal(resumed, sweep.normalise(small_frame.copy(), sweep.load_spec(spec)))
    before = out.read_bytes()
    assert main(["sweep", str(spec), "-o", str(out), "--json", *address]) == 0
    assert json.loads(capsys.readouterr().out)["run"] == 0 and out.read_bytes() == before


def test_same_rows_byte_for_byte_on_a_rerun(cluster, tmp_path, capsys):
    spec = write_spec(tmp_path, SMALL_TOML)
    first, second = tmp_path / "a.parquet", tmp_path / "b.parquet"
    for out in (first, second):
        assert main(["sweep", str(spec), "-o", str(out), "--scheduler", cluster.scheduler_address]) == 0
    assert first.read_bytes() == second.read_bytes()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]        # no temporary files left


# ------------------------------------------------------------------ progress

def test_progress_is_a_line_per_ten_percent_off_a_terminal():
    stream = io.StringIO()
    progress = sweep.Progress(20, stream, terminal=False)
    for _ in range(20):
        progress.advance(1)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 10 and lines[-1].startswith("tpuflow: sweep 20/20 points (100%)")
    assert all("ETA" in line and "[" not in line for line in lines)


def test_progress_is_a_bar_on_a_terminal():
    stream, ticks = io.StringIO(), iter(range(100))
    progress = sweep.Progress(4, stream, terminal=True, clock=lambda: float(next(ticks)))
    progress.advance(1)
    assert stream.getvalue() == "\rtpuflow: sweep [#######.......................] 1/4 points (25%), elapsed 1 s, ETA 3 s"
    progress.advance(3)
    assert stream.getvalue().endswith("4/4 points (100%), elapsed 2 s, ETA 0 s\n")


# ------------------------------------------------------------------ Pareto front

@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 20).map(float), st.integers(1, 20).map(float)), min_size=1, max_size=30))
def test_pareto_front_is_exactly_the_undominated_points(points):
    front = sweep.pareto_front(points)

    def dominated(p):
        return any(q[0] <= p[0] and q[1] <= p[1] and q != p for q in points)
    assert set(front) == {p for p in points if not dominated(p)}
    assert [p[0] for p in front] == sorted(p[0] for p in front)


def test_an_interrupted_sweep_keeps_its_rows_and_resumes(cluster, small_frame, tmp_path, capsys, monkeypatch):
    spec = write_spec(tmp_path, SMALL_TOML)
    out = tmp_path / "out.parquet"
    address = ["--scheduler", cluster.scheduler_address]

    def interrupt(self, count):
        raise KeyboardInterrupt
    with monkeypatch.context() as patch:
        patch.setattr(sweep.Progress, "advance", interrupt)          # Ctrl-C as the first rows arrive
        assert main(["sweep", str(spec), "-o", str(out), *address]) == 130
    kept = sweep.read_output(out, sweep.load_spec(spec))
    assert 1 <= len(kept) < 2 and set(kept["status"]) == {"ok"}
    capsys.readouterr()
    assert main(["sweep", str(spec), "-o", str(out), "--json", *address]) == 0
    assert json.loads(capsys.readouterr().out)["run"] == 2 - len(kept)
    pd.testing.assert_frame_equal(sweep.read_output(out, sweep.load_spec(spec)),
                                  sweep.normalise(small_frame.copy(), sweep.load_spec(spec)))


_scalars = st.one_of(st.booleans(), st.integers(-2**63, 2**63 - 1), st.text(max_size=8),
                     st.floats(allow_nan=False), st.lists(st.integers(0, 9), max_size=3))
_keys = st.text(min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(_keys, _scalars, max_size=3),
       st.dictionaries(_keys, st.dictionaries(_keys, st.one_of(_scalars, st.dictionaries(_keys, _scalars, max_size=2)),
                                              max_size=4), max_size=3))
def test_to_toml_round_trips_any_chip_shaped_dict(top, tables):
    raw = {**top, **{k: v for k, v in tables.items() if k not in top}}
    assert tomllib.loads(sweep.to_toml(raw)) == raw


def test_point_ids_follow_a_model_file_s_bytes(tmp_path):
    import onnx
    from tpuflow import models
    onnx.save(models.build_model("mlp"), tmp_path / "net.onnx")
    spec = sweep.load_spec({**SMALL, "models": [str(tmp_path / "net.onnx")]})
    before = [sweep.point_id(spec, p) for p in spec.points()]
    assert before == [sweep.point_id(spec, p) for p in spec.points()]
    onnx.save(models.build_model("small_cnn"), tmp_path / "net.onnx")
    assert not set(before) & {sweep.point_id(spec, p) for p in spec.points()}


def test_int8_points_quantize_the_model_and_match_a_direct_estimate(client, tmp_path):
    """The issue's own spec sweeps dtypes ["fp16", "int8"]: an int8 point is the model quantized by
    the post-training quantizer (tpuflow.quantize), as `tpuflow estimate --dtype int8`."""
    from tpuflow.estimate import estimate_report
    from tpuflow.hwmodel.timing import simulate
    from tpuflow.options import CompileOptions
    from tpuflow.pipeline import compile_model
    spec = write_spec(tmp_path, 'models = ["mlp"]\ndtypes = ["fp16", "int8"]\nchip = "sg2260"\n')
    frame = sweep.run(spec, client)
    assert list(frame["dtype"]) == ["fp16", "int8"] and list(frame["status"]) == ["ok", "ok"]
    _, program = compile_model("mlp", "sg2260", CompileOptions(dtype="int8"))
    direct = estimate_report(program, simulate(program))["latency_us"]
    assert frame[frame["dtype"] == "int8"]["latency_us"].iloc[0] == direct


def test_calibration_options_apply_to_int8_points_only(tmp_path):
    """[options] calibration / calibration_data are the quantizer's inputs: an fp16 point does not
    take them (one fp16 point, not one per value), and a data folder is read relative to the spec."""
    (tmp_path / "cal").mkdir()
    spec = sweep.load_spec(write_spec(tmp_path, 'models = ["mlp"]\ndtypes = ["fp16", "int8"]\n'
                                      '[options]\ncalibration = [2, 4]\n'))
    assert [(p.dtype, p.options) for p in spec.points()] == [
        ("fp16", ()), ("int8", (("calibration", 2),)), ("int8", (("calibration", 4),))]
    spec = sweep.load_spec(write_spec(tmp_path, 'models = ["mlp"]\ndtypes = ["int8"]\n'
                                      '[options]\ncalibration_data = "cal"\n'))
    assert spec.points()[0].options == (("calibration_data", str((tmp_path / "cal").resolve())),)


def test_a_calibration_folder_without_samples_is_rejected_before_any_work(tmp_path, capsys):
    (tmp_path / "cal").mkdir()
    spec = write_spec(tmp_path, 'models = ["mlp"]\ndtypes = ["int8"]\n[options]\ncalibration_data = "cal"\n')
    assert main(["sweep", str(spec), "-o", str(tmp_path / "out.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no .npz files" in err and "model 'mlp'" in err
    assert not (tmp_path / "out.csv").exists()


def test_calibrated_int8_points_match_direct_estimates(client, tmp_path):
    """Each calibration value is its own quantization: the row is `estimate --dtype int8
    --calibration N`, and a data folder's row is `--calibration-data DIR`."""
    import numpy as np
    from tpuflow.estimate import estimate_report
    from tpuflow.hwmodel.timing import simulate
    from tpuflow.options import CompileOptions
    from tpuflow.pipeline import compile_model
    (tmp_path / "cal").mkdir()
    rng = np.random.default_rng(3)        # mlp's input x: 4 x 784
    for i in range(2):
        np.savez(tmp_path / "cal" / f"s{i}.npz", x=(4 * rng.standard_normal((4, 784))).astype(np.float32))
    spec = write_spec(tmp_path, 'models = ["small_cnn"]\ndtypes = ["int8"]\n'
                                '[options]\ncalibration = [1, 3]\n')
    frame = sweep.run(spec, client)
    assert list(frame["status"]) == ["ok", "ok"] and list(frame["options.calibration"]) == [1, 3]
    for n, latency in zip([1, 3], frame["latency_us"]):
        _, program = compile_model("small_cnn", "sg2260", CompileOptions(dtype="int8", calibration=n))
        assert latency == estimate_report(program, simulate(program))["latency_us"]
    data = sweep.run(write_spec(tmp_path, 'models = ["mlp"]\ndtypes = ["int8"]\n'
                                          '[options]\ncalibration_data = "cal"\n'), client)
    _, program = compile_model("mlp", "sg2260", CompileOptions(dtype="int8", calibration_data=str(tmp_path / "cal")))
    assert list(data["status"]) == ["ok"]
    assert data["latency_us"].iloc[0] == estimate_report(program, simulate(program))["latency_us"]
