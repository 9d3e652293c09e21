"""W slicing: a conv or pool whose whole rows do not fit LMEM runs in column windows. Every output
column is computed by exactly one window, each window reads exactly the input columns its outputs
need (halos and padding), whole rows are kept whenever they fit, and wide layers compute what
onnxruntime computes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuflow.lowering.ops.conv import ConvGeom, column_windows, width_steps

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e"))
from onnx_build import ModelBuilder  # noqa: E402


def _geom(w: int, k: int, s: int, d: int, pl: int, pr: int) -> ConvGeom | None:
    wo = (w + pl + pr - ((k - 1) * d + 1)) // s + 1
    return None if wo < 1 else ConvGeom(1, 1, 1, w, 1, 1, k, 1, wo, 1, s, 1, d, 0, pl, 0, pr, 1)


def _taps(geo: ConvGeom, lo: int, hi: int) -> tuple[set[int], int, int]:
    """Brute force: the input columns the windows of output columns [lo, hi) read, and the first
    and last column their taps reach (padding included)."""
    positions = [o * geo.sx + t * geo.dx - geo.pl for o in range(lo, hi) for t in range(geo.kw)]
    return {c for c in positions if 0 <= c < geo.w}, min(positions), max(positions)


def _assert_reads_its_taps(geo: ConvGeom, first: int, count: int, lo: int, hi: int) -> None:
    """A window [first, first + count) holds every column the taps read and nothing past them."""
    read, lowest, highest = _taps(geo, lo, hi)
    window = set(range(first, first + count))
    assert read <= window
    assert window <= set(range(max(lowest, 0), min(highest, geo.w - 1) + 1))


window = st.tuples(st.integers(1, 5), st.integers(1, 3), st.integers(1, 2), st.integers(0, 2), st.integers(0, 2))


@settings(max_examples=80, deadline=None)
@given(st.integers(4, 200), window, st.one_of(st.none(), window), st.integers(1, 40))
def test_windows_cover_every_column_once_and_read_exactly_their_halo(width, conv, pool, step):
    geo = _geom(width, *conv)
    if geo is None:
        return
    pgeom = None if pool is None else _geom(geo.wo, *pool)
    final_w = pgeom.wo if pgeom is not None else geo.wo
    try:
        windows = column_windows(geo, pgeom, min(step, final_w))
    except Exception as err:                     # a window of padding only is refused, never emitted
        assert "reads only padding" in str(err)
        return
    covered = [c for w in windows for c in range(w.out0, w.out0 + w.out_n)]
    assert covered == list(range(final_w))
    for w in windows:
        if pgeom is not None:
            _assert_reads_its_taps(pgeom, w.conv0, w.conv_n, w.out0, w.out0 + w.out_n)
        else:
            assert (w.conv0, w.conv_n) == (w.out0, w.out_n)
        _assert_reads_its_taps(geo, w.in0, w.in_n, w.conv0, w.conv0 + w.conv_n)
        # the window plus its pads is exactly the span the conv's taps cover
        assert w.lf + w.in_n + w.rt == (w.conv_n - 1) * geo.sx + (geo.kw - 1) * geo.dx + 1
        assert w.lf == max(0, geo.pl - w.conv0 * geo.sx)


def test_whole_rows_are_one_window_with_the_layer_pads():
    geo = _geom(50, 3, 2, 1, 1, 1)
    (only,) = column_windows(geo, None, None)
    assert (only.in0, only.in_n, only.lf, only.rt, only.out_n) == (0, 50, 1, 1, geo.wo)


def test_width_steps_halve_down_to_one_column():
    assert width_steps(10) == [5, 3, 2, 1]
    assert width_steps(1) == []


def _small_chip(folder: Path) -> str:
    path = folder / "tiny_lmem.toml"
    path.write_text('base = "sg2260"\n[core]\nlmem_bytes_per_lane = 16384\n')
    return str(path)


def _wide_models():
    """Layers whose single output row (and its input rows) do not fit a 16 KiB-per-lane LMEM."""
    b = ModelBuilder(seed=11)                               # conv + relu + fused max pool, strided
    x = b.input("x", (1, 8, 5, 3001))
    x = b.node("Conv", [x, b.weight("w", (16, 8, 3, 3)), b.weight("b", (16,))], "c", kernel_shape=[3, 3],
               strides=[1, 2], pads=[1, 1, 1, 1])
    x = b.node("MaxPool", [b.node("Relu", [x], "r")], "p", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    b.output(x)
    yield "conv_pool", b.model()
    b = ModelBuilder(seed=12)                               # depthwise, dilated, residual add epilogue
    x = b.input("x", (1, 64, 3, 4000))
    y = b.node("Conv", [x, b.weight("w", (64, 1, 3, 3))], "dw", kernel_shape=[3, 3], group=64,
               dilations=[1, 2], pads=[1, 2, 1, 2])
    b.output(b.node("Relu", [b.node("Add", [y, x], "add")], "r"))
    yield "depthwise", b.model()
    b = ModelBuilder(seed=13)                               # average pool whose window counts vary
    x = b.input("x", (2, 8, 4, 5000))
    b.output(b.node("AveragePool", [x], "ap", kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=0))
    yield "avgpool", b.model()
    b = ModelBuilder(seed=14)                               # a long 1-D signal
    x = b.input("x", (1, 32, 9000))
    x = b.node("Conv", [x, b.weight("w", (32, 32, 5)), b.weight("b", (32,))], "c1", kernel_shape=[5], pads=[2, 2])
    b.output(b.node("MaxPool", [b.node("Relu", [x], "r")], "p", kernel_shape=[3], strides=[2]))
    yield "conv1d", b.model()


@pytest.mark.parametrize("name,model", list(_wide_models()), ids=lambda v: v if isinstance(v, str) else "")
def test_wide_layers_run_in_column_windows_and_match_onnxruntime(tmp_path, name, model):
    from tpuflow.isa import ConvTiu, PordTiu
    from tpuflow.options import CompileOptions
    from tpuflow.pipeline import compile_model, verify
    chip = _small_chip(tmp_path)
    _, program = compile_model(model, chip, CompileOptions(dtype="fp16"))
    graph_width = model.graph.input[0].type.tensor_type.shape.dim[-1].dim_value
    widths = {i.opd0_w for i in program.tiu if isinstance(i, (ConvTiu, PordTiu))}
    assert widths and max(widths) < graph_width              # no instruction reads a whole row
    result = verify(model, chip, CompileOptions(dtype="fp16"), race_check=True)
    assert result["ok"], result


def test_layers_whose_rows_fit_keep_whole_rows(tmp_path):
    from tpuflow.isa import ConvTiu
    from tpuflow.options import CompileOptions
    from tpuflow.pipeline import compile_model
    b = ModelBuilder(seed=15)
    x = b.input("x", (1, 8, 16, 300))
    b.output(b.node("Conv", [x, b.weight("w", (8, 8, 3, 3))], "c", kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
    _, program = compile_model(b.model(), _small_chip(tmp_path), CompileOptions(dtype="fp16"))
    assert {i.opd0_w for i in program.tiu if isinstance(i, ConvTiu)} == {300}


def test_a_long_1d_chain_runs_as_a_sliced_layer_group(tmp_path):
    """1-D convs and pools run with the signal down H ([N, C, L, 1]), so a chain over a signal too
    long for LMEM is sliced along it like the rows of an image, and matches onnxruntime."""
    from tpuflow.options import CompileOptions
    from tpuflow.pipeline import compile_model, verify
    b = ModelBuilder(seed=16)
    x = b.input("x", (1, 16, 6000))
    for i in range(3):
        x = b.node("Conv", [x, b.weight(f"w{i}", (16, 16, 3)), b.weight(f"b{i}", (16,))], f"c{i}",
                   kernel_shape=[3], pads=[1, 1])
    b.output(b.node("MaxPool", [x], "p", kernel_shape=[2], strides=[2]))
    chip = _small_chip(tmp_path)
    _, program = compile_model(b.model(), chip, CompileOptions(dtype="fp16"))
    runs = [r for lg in program.layer_groups for r in lg["sliced_runs"]]
    assert runs and max(r["slices"] for r in runs) >= 2
    result = verify(b.model(), chip, CompileOptions(dtype="fp16"), race_check=True)
    assert result["ok"], result
