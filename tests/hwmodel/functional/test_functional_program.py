"""Whole programs: a hand-built DDR -> LMEM -> conv -> relu -> maxpool -> DDR layer equals numpy
under every interleaving; a TILE matmul synchronised through TPUSH waits and SYS waits; the race
detector catches removed dependencies (RAW, WAR, TILE) and passes the correct programs;
deadlocks are reported; run() checks its inputs; a program written to disk, read back and
decoded executes to numpy's answer."""

from __future__ import annotations

import numpy as np
import pytest

from functional_helpers import CHIP
from program_builders import (IC, N, H, W, conv_layer_program, conv_layer_reference, tile_inputs, tile_program,
                              with_instruction)
from tpuflow.errors import DeadlockError, OptionError, RaceError, UserError
from tpuflow.hwmodel.functional import InputMismatchError, run

INTERLEAVINGS = [("round_robin", 0), ("tiu_first", 0), ("gdma_first", 0)] + [("random", s) for s in range(4)]


def _x(seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((N, IC, H, W)).astype(np.float32)


def test_conv_layer_program_equals_numpy():
    x = _x()
    out = run(conv_layer_program(), {"x": x})
    assert set(out) == {"y"} and out["y"].dtype == np.float32
    np.testing.assert_allclose(out["y"], conv_layer_reference(x), rtol=1e-5, atol=1e-5)


def test_every_interleaving_gives_the_same_bytes():
    program, x = conv_layer_program(), _x()
    results = [run(program, {"x": x}, interleave=name, seed=seed)["y"] for name, seed in INTERLEAVINGS]
    assert all(r.tobytes() == results[0].tobytes() for r in results)


def test_unknown_interleaving_is_an_option_error():
    with pytest.raises(OptionError, match="round_robin"):
        run(conv_layer_program(), {"x": _x()}, interleave="fastest")


@pytest.mark.parametrize("name,seed", INTERLEAVINGS)
def test_race_detector_catches_a_removed_load_dependency(name, seed):
    racy = with_instruction(conv_layer_program(), "tiu", 0, cmd_id_dep=0)   # conv no longer waits for loads
    with pytest.raises(RaceError) as err:
        run(racy, {"x": _x()}, interleave=name, seed=seed)
    message = str(err.value)
    assert "B1 conv.normal (layer conv1)" in message and "dma.tensor (layer conv1)" in message
    assert "lane" in message and "offset 0x" in message


def test_removed_dependency_really_changes_the_result_without_the_detector():
    racy = with_instruction(conv_layer_program(), "tiu", 0, cmd_id_dep=0)
    early = run(racy, {"x": _x()}, race_check=False, interleave="tiu_first")["y"]
    late = run(racy, {"x": _x()}, race_check=False, interleave="gdma_first")["y"]
    assert not np.array_equal(early, late)


def test_race_detector_catches_a_store_before_the_pool():
    racy = with_instruction(conv_layer_program(), "gdma", 3, cmd_id_dep=2)   # waits for relu, not the pool
    with pytest.raises(RaceError, match=r"D4 dma.tensor \(layer pool1\).*B3 pord.maxpooling|"
                                        r"B3 pord.maxpooling \(layer pool1\).*D4 dma.tensor"):
        run(racy, {"x": _x()})


def test_race_detector_catches_a_load_overwriting_a_buffer_still_being_read():
    program = conv_layer_program()
    reload = program.gdma[0]   # load x again into the same LMEM buffer, as a double-buffered next tile would
    for dep, raises in ((0, True), (1, False)):
        gdma = program.gdma[:3] + [type(reload)(**{**reload.field_values(), "cmd_id_dep": dep})] + program.gdma[3:]
        layers = program.gdma_layers[:3] + ["conv2"] + program.gdma_layers[3:]
        changed = program.with_queues(program.tiu, gdma, [], program.tiu_layers, layers, [], "DDDBDBBD")
        if raises:
            with pytest.raises(RaceError, match=r"D4 dma.tensor \(layer conv2\) writes"):
                run(changed, {"x": _x()}, interleave="tiu_first")
        else:
            run(changed, {"x": _x()}, interleave="gdma_first")


def test_deadlock_names_every_blocked_engine():
    stuck = with_instruction(conv_layer_program(), "tiu", 0, cmd_id_dep=4)   # conv waits for the store
    with pytest.raises(DeadlockError) as err:
        run(stuck, {"x": _x()})
    message = str(err.value)
    assert "TIU blocked at B1 conv.normal (layer conv1), waiting for GDMA 4 (completed 3)" in message
    assert "GDMA blocked at D4 dma.tensor (layer pool1), waiting for TIU 3 (completed 0)" in message
    assert "TILE finished (0 instructions)" in message


def test_waiting_beyond_the_other_queue_is_a_deadlock():
    stuck = with_instruction(conv_layer_program(), "gdma", 3, cmd_id_dep=9)
    with pytest.raises(DeadlockError, match="waiting for TIU 9 \\(completed 3\\)"):
        run(stuck, {"x": _x()})


def test_tile_program_equals_numpy_under_every_interleaving():
    words, a, b = tile_inputs()
    program = tile_program()
    outs = [run(program, {"tiles": words}, interleave=name, seed=seed) for name, seed in INTERLEAVINGS]
    expect = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(outs[0]["c"], expect, rtol=1e-5, atol=1e-5)
    assert np.array_equal(outs[0]["c2"], outs[0]["c"] * 2)
    assert all(o["c"].tobytes() == outs[0]["c"].tobytes() and o["c2"].tobytes() == outs[0]["c2"].tobytes()
               for o in outs)


@pytest.mark.parametrize("engine,index,change,culprit", [
    ("tile", 0, dict(wait_gdma_id=0), "T1 TPUSH"),                     # push before the tile is loaded
    ("gdma", 2, dict(op="nop"), "D4 dma.general"),                     # store without waiting for ACCCVT
    ("tiu", 0, dict(op="nop"), "B2 arith.add"),                        # TIU reads C before ACCCVT wrote it
])
def test_race_detector_covers_the_tile_engine(engine, index, change, culprit):
    words, _, _ = tile_inputs()
    racy = with_instruction(tile_program(), engine, index, **change)
    with pytest.raises(RaceError, match=culprit):
        run(racy, {"tiles": words})


def test_run_checks_its_inputs():
    program = conv_layer_program()
    with pytest.raises(InputMismatchError, match="input 'x' is missing"):
        run(program, {})
    with pytest.raises(InputMismatchError, match="unknown input 'z'"):
        run(program, {"x": _x(), "z": _x()})
    with pytest.raises(InputMismatchError, match=r"shape \(8, 12, 12\), the program expects \(1, 8, 12, 12\)"):
        run(program, {"x": _x()[0]})
    assert issubclass(InputMismatchError, UserError)


def test_program_written_to_disk_read_back_and_decoded_executes(tmp_path):
    codegen = pytest.importorskip("tpuflow.codegen")
    program = conv_layer_program()
    codegen.write_program(program, tmp_path / "out", name="conv_layer")
    decoded = codegen.read_program(tmp_path / "out")
    assert decoded.chip.fingerprint() == CHIP.fingerprint()
    x = _x()
    out = run(decoded, {"x": x})
    np.testing.assert_allclose(out["y"], conv_layer_reference(x), rtol=1e-5, atol=1e-5)
    assert out["y"].tobytes() == run(program, {"x": x})["y"].tobytes()


def test_tile_program_round_trips_through_the_binaries(tmp_path):
    codegen = pytest.importorskip("tpuflow.codegen")
    codegen.write_program(tile_program(), tmp_path / "tile", name="mm")
    words, a, b = tile_inputs()
    out = run(codegen.read_program(tmp_path / "tile"), {"tiles": words})
    np.testing.assert_allclose(out["c"], a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-5)
