"""--cores through the CLI and the pipeline: bounds and errors, and a whole verify of a two-core
program (the compiled model on core 0, a barrier with core 1) once lowering returns two cores."""

from dataclasses import replace

import pytest

from tpuflow import pipeline
from tpuflow.cli import main
from tpuflow.isa import Engine, SysDma, SysTiu, barrier
from tpuflow.options import CompileOptions
from tpuflow.program import CoreStreams, Program


@pytest.mark.parametrize("cores, message", [
    ("2", "option --cores 2: the compiler does not split over cores yet (the program has 1)"),
    ("9", "chip sg2260: --cores 9 is not within 1..8 (key 'core.cores')"),
    ("0", "option --cores: must be a positive integer, got 0"),
    ("two", "argument --cores: invalid int value: 'two'")])
def test_bad_or_unsplit_core_counts_are_one_line_errors(cores, message, tmp_path, capsys, monkeypatch):
    import tpuflow.lowering as lowering
    real = lowering.lower
    monkeypatch.setattr(lowering, "lower", lambda graph, chip, options: real(graph, chip, replace(options, cores=1)))
    assert main(["compile", "mlp", "--cores", cores, "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and not (tmp_path / "out").exists()


def test_one_core_options_are_recorded_as_before():
    assert "cores" not in CompileOptions().as_dict() and CompileOptions(cores=3).as_dict()["cores"] == 3
    assert CompileOptions().fingerprint() == CompileOptions(cores=1).fingerprint()


def _with_barrier(streams: CoreStreams, cores: int) -> CoreStreams:
    """`streams` with a barrier inserted before its closing end / chain_end."""
    sync = barrier(cores, 0)
    tiu, gdma = list(streams.tiu), list(streams.gdma)
    tiu[-1:-1], gdma[-1:-1] = sync[Engine.TIU], sync[Engine.GDMA]
    order = streams.issue_order
    b, d = order.rindex("B"), order.rindex("D")
    order = order[:min(b, d)] + "BBDD" + order[min(b, d):]
    return CoreStreams(tiu, gdma, list(streams.tile), streams.tiu_layers[:-1] + ["sync"] * 2 + streams.tiu_layers[-1:],
                       streams.gdma_layers[:-1] + ["sync"] * 2 + streams.gdma_layers[-1:], list(streams.tile_layers), order)


def test_verify_runs_every_core_of_a_two_core_program(monkeypatch):
    import tpuflow.lowering as lowering
    real = lowering.lower

    def two_cores(graph, chip, options):
        program = real(graph, chip, replace(options, cores=1))
        idle = CoreStreams(tiu=[SysTiu(op="end")], gdma=[SysDma(op="chain_end")], tiu_layers=[""], gdma_layers=[""],
                           issue_order="BD")
        return Program.from_cores(program, [_with_barrier(program.cores[0], 2), _with_barrier(idle, 2)],
                                  core_split=[{"work": "all"}, {"work": "none"}])

    monkeypatch.setattr(lowering, "lower", two_cores)
    result = pipeline.verify("mlp", "sg2260", CompileOptions(cores=2))
    assert result["ok"] and result["cores"] == 2
    assert result["core_instructions"][1] == {"tiu": 3, "gdma": 3, "tile": 0}
