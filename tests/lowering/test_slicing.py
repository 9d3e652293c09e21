"""H-slicing of layer groups: on random conv/pool chains every row of every member is computed in
some slice, each slice's input window is exactly the rows its outputs need (halos), and a sliced
program computes what onnxruntime computes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpuflow.frontend import load
from tpuflow.lowering.groups import form_groups
from tpuflow.lowering.slicing import candidate_runs, chunk, input_rows, output_of, slice_region

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e"))
from onnx_build import ModelBuilder  # noqa: E402

layer = st.fixed_dictionaries({
    "op": st.sampled_from(["Conv", "Conv", "MaxPool", "AveragePool"]),
    "k": st.integers(1, 5), "s": st.integers(1, 3), "d": st.integers(1, 2), "p": st.integers(0, 2),
    "relu": st.booleans()})


def _chain_model(height: int, layers: list[dict], channels: int = 8):
    b = ModelBuilder(seed=1)
    x = b.input("x", (1, channels, height, 12))
    h = height
    for i, spec in enumerate(layers):
        k, s, d, p = spec["k"], spec["s"], spec["d"], min(spec["p"], spec["k"] - 1)
        if spec["op"] != "Conv":
            d = 1
        span = (k - 1) * d + 1
        if (h + 2 * p - span) // s + 1 < 1:
            break
        pads = [p, 0, p, 0]
        if spec["op"] == "Conv":
            w = b.weight(f"w{i}", (channels, channels, k, 1))
            x = b.node("Conv", [x, w], f"c{i}", kernel_shape=[k, 1], strides=[s, 1], dilations=[d, 1], pads=pads)
            if spec["relu"]:
                x = b.node("Relu", [x], f"r{i}")
        else:
            x = b.node(spec["op"], [x], f"p{i}", kernel_shape=[k, 1], strides=[s, 1], pads=pads)
        h = (h + 2 * p - span) // s + 1
    b.output(x)
    return b.model()


def _touched_rows(geom_kind: str, node, graph, lo: int, hi: int) -> set[int]:
    """Brute force: input rows a window op reads for output rows [lo, hi)."""
    k = node.attr("kernel_shape")[0]
    s = node.attr("strides", (1, 1))[0]
    d = node.attr("dilations", (1, 1))[0]
    pt = node.attr("pads", (0, 0, 0, 0))[0]
    h = graph.tensor(node.inputs[0]).shape[2]
    return {r for o in range(lo, hi) for t in range(k) if 0 <= (r := o * s + t * d - pt) < h}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(8, 40), st.lists(layer, min_size=2, max_size=5), st.integers(2, 6))
def test_slices_cover_every_row_and_read_exactly_their_halo(height, layers, slices):
    graph = load(_chain_model(height, layers))
    groups = form_groups(graph)
    runs = candidate_runs(graph, groups)
    if not runs:
        return
    members = runs[0]
    region = slice_region(graph, groups, members, slices, set())
    produced_by = {output_of(groups[m]): m for m in members}
    for m in members:
        height_m = graph.tensor(output_of(groups[m])).shape[2]
        covered = set()
        for s, (lo, hi) in enumerate(region.rows[m]):
            covered |= set(range(lo, hi))
            own = chunk(height_m, slices, s)
            assert lo <= own[0] and own[1] <= hi               # its own share is in the band
        assert covered == set(range(height_m))
    for m in members:
        group = groups[m]
        for s, band in enumerate(region.rows[m]):
            if band[1] <= band[0]:
                continue
            for tensor, (lo, hi) in input_rows(graph, group, band).items():
                node = next(n for n in group.nodes if tensor in n.inputs)
                if group.kind in ("conv", "pool") and node is group.anchor and group.tail_pool is None:
                    # a window is the row interval the kernel spans, clipped to the input
                    touched = _touched_rows(group.kind, node, graph, *band)
                    if not touched:
                        continue                                # rows that read only padding
                    k, s_, d = node.attr("kernel_shape")[0], node.attr("strides", (1, 1))[0], node.attr("dilations", (1, 1))[0]
                    pt, h = node.attr("pads", (0, 0, 0, 0))[0], graph.tensor(tensor).shape[2]
                    first, last = band[0] * s_ - pt, (band[1] - 1) * s_ + (k - 1) * d - pt
                    assert touched <= set(range(lo, hi)) and min(touched) <= max(0, first) + (d - 1)
                    assert (lo, hi) == (max(0, first), min(h, last + 1))
                if tensor in produced_by:                       # the producer computed it this slice
                    plo, phi = region.rows[produced_by[tensor]][s]
                    assert plo <= lo and hi <= phi


def test_a_sliced_program_matches_onnxruntime(monkeypatch, tmp_path):
    """A chain whose activations do not fit LMEM whole on a small-LMEM chip runs sliced."""
    import tpuflow.lowering.compiler as compiler
    from tpuflow.options import CompileOptions
    from tpuflow.pipeline import compile_model, verify
    chip = tmp_path / "small_lmem.toml"
    chip.write_text('base = "sg2260"\n[core]\nlmem_bytes_per_lane = 65536\n')
    b = ModelBuilder(seed=3)
    x = b.input("x", (1, 16, 192, 64))
    for i, (k, s) in enumerate([(3, 1), (3, 1), (3, 2), (1, 1)]):
        x = b.node("Conv", [x, b.weight(f"w{i}", (16, 16, k, k)), b.weight(f"b{i}", (16,))], f"c{i}",
                   kernel_shape=[k, k], strides=[s, s], pads=[k // 2] * 4)
        x = b.node("Relu", [x], f"r{i}")
    x = b.node("MaxPool", [x], "pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    b.output(x)
    model = b.model()
    monkeypatch.setattr(compiler, "_members_cost",              # keep every sliced run the planner finds
                        lambda graph, groups, chip, options, residency, members:
                        0 if residency.region_at(members[0]) else 1)
    _, program = compile_model(model, str(chip), CompileOptions())
    runs = [r for lg in program.layer_groups for r in lg["sliced_runs"]]
    assert runs and all(r["slices"] >= 2 for r in runs)
    result = verify(model, str(chip), CompileOptions(), race_check=True)
    assert result["ok"], result


def _batched_chain(batch: int):
    """Convs, a residual Add + Relu row group (its conv input has another reader, so it is not a
    conv epilogue) and a pool over `batch` samples."""
    b = ModelBuilder(seed=4)
    x = b.input("x", (batch, 16, 96, 64))

    def conv(name, x, stride=1):
        w = b.weight(f"w{name}", (16, 16, 3, 3))
        return b.node("Conv", [x, w], f"c{name}", kernel_shape=[3, 3], strides=[stride] * 2, pads=[1] * 4)

    skip = b.node("Relu", [conv(0, x)], "r0")
    x1 = conv(1, skip)
    y = b.node("Relu", [b.node("Add", [x1, skip], "add")], "r1")
    x = conv(3, b.node("Add", [y, conv(2, x1)], "merge"), stride=2)
    x = b.node("MaxPool", [x], "pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    b.output(x)
    return b.model()


@pytest.mark.parametrize("batch", [1, 3])
def test_slice_counts_and_regions_over_samples(batch):
    from tpuflow.lowering.slicing import slice_counts
    graph = load(_batched_chain(batch))
    groups = form_groups(graph)
    members = candidate_runs(graph, groups)[0]
    counts = slice_counts(graph, groups, members, (2, 3))
    assert counts == ([batch] if batch > 1 else []) + [2 * batch, 3 * batch]
    for slices in counts:
        region = slice_region(graph, groups, members, slices, set())
        assert region.samples == batch and region.bands * batch == slices
        assert [region.sample_of(s) for s in range(slices)] == [s // region.bands for s in range(slices)]
        for m in members:          # every sample gets the same row bands, covering every row
            per_sample = [region.rows[m][n * region.bands:(n + 1) * region.bands] for n in range(batch)]
            assert all(p == per_sample[0] for p in per_sample)
            height = graph.tensor(output_of(groups[m])).shape[2]
            assert set().union(*(range(*r) for r in per_sample[0])) == set(range(height))
    with pytest.raises(ValueError):
        if batch > 1:
            slice_region(graph, groups, members, batch + 1, set())
        else:
            raise ValueError("a batch of one takes any count")


@pytest.mark.parametrize("batch", [2, 3])
def test_a_program_sliced_over_samples_matches_onnxruntime(monkeypatch, tmp_path, batch):
    """A batched chain (convs, a residual row group, a pool) whose activations do not fit LMEM
    whole runs one sample (and row band) per slice, with the race detector on."""
    import tpuflow.lowering.compiler as compiler
    from tpuflow.options import CompileOptions
    from tpuflow.pipeline import compile_model, verify
    chip = tmp_path / "small_lmem.toml"
    chip.write_text('base = "sg2260"\n[core]\nlmem_bytes_per_lane = 65536\n')
    model = _batched_chain(batch)
    monkeypatch.setattr(compiler, "_members_cost",
                        lambda graph, groups, chip, options, residency, members:
                        0 if residency.region_at(members[0]) else 1)
    _, program = compile_model(model, str(chip), CompileOptions())
    runs = [r for lg in program.layer_groups for r in lg["sliced_runs"]]
    assert runs and all(r["slices"] % batch == 0 and "n" in r["axes"] for r in runs)
    assert any(m.startswith("add") for r in runs for m in r["members"])     # the row group runs sliced too
    result = verify(model, str(chip), CompileOptions(), race_check=True)
    assert result["ok"], result


@pytest.mark.parametrize("prefer", ["held", "plain"])
def test_sliced_members_hold_their_weights_across_slices(monkeypatch, tmp_path, prefer):
    """With constants held, every conv of a sliced run loads its weights once (first slice) and
    reads them in place in every later slice; the compiler keeps that variant or the one where
    every slice loads its own, whichever its timing model finds faster (forced here both ways)."""
    import tpuflow.lowering.compiler as compiler
    from tpuflow.options import CompileOptions
    from tpuflow.pipeline import compile_model
    chip = tmp_path / "small_lmem.toml"
    chip.write_text('base = "sg2260"\n[core]\nlmem_bytes_per_lane = 65536\n')
    monkeypatch.setattr(compiler, "_members_cost",
                        lambda graph, groups, chip, options, residency, members:
                        0 if any(r.first in members for r in residency.regions) else 1)
    sign = 1 if prefer == "held" else -1                 # fewer loads (held) timed faster, or slower
    monkeypatch.setattr(compiler, "_records_ps", lambda records, chip, options: sign * len(records))
    _, program = compile_model(_batched_chain(2), str(chip), CompileOptions())
    (run,) = [r for lg in program.layer_groups for r in lg["sliced_runs"]]
    assert run["slices"] >= 4
    lo = program.memory.weight_base
    hi = lo + len(program.memory.weight_image)
    for group in run["members"]:
        if group.startswith("conv"):
            const_loads = [ins for ins, name in zip(program.gdma, program.gdma_layers)
                           if name == group and lo <= getattr(ins, "src_start_addr", -1) < hi]
            assert len(const_loads) == (1 if prefer == "held" else run["slices"]), (group, len(const_loads))
