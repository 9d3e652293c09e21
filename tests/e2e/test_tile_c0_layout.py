"""Tile-path activations kept C0-blocked (NC1HWC0) in DDR between cube convs (issue 16 deliverable 1): the
producing conv's ACCCVT writes NZ2DN tiles stored as whole C0-block runs, the reading conv builds its phase
images by one DMA per phase (no TIU transposes) or takes its residual's Zn tiles straight from DDR, a TIU
conv that meets such a tensor converts it (LayoutConversion layers); numerics against onnxruntime with the
race detector over strides, pads, dilations, groups, batch and float dtypes; the layout in the manifest and
the estimate. The layout is forced (tilemm.C0_LAYOUTS = "always") and layer groups are off, so the tensors
live in DDR: on sg2260 the cost model keeps them NCHW (test_cost_model_keeps_nchw_on_sg2260)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx_build import ModelBuilder

from tpuflow.isa import AccCvt, CwBcTiu
from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model, verify_program

pytestmark = pytest.mark.usefixtures("convs_on_the_cube")


@pytest.fixture
def c0_always(monkeypatch):
    from tpuflow.lowering.ops import tilemm
    monkeypatch.setattr(tilemm, "C0_LAYOUTS", "always")


def _chain(n, cin, cmid, hw, kernel, stride, pad, dilation, groups, residual, seed=0):
    """x -> Neg -> c1 (1x1 + bias + Relu: r1) -> c2 (kernel, stride, pad, dilation, groups, + bias [+ r1]
    + Relu: r2) -> c3 (1x1: y, the graph output). r1 and r2 are what a cube conv writes and reads."""
    b = ModelBuilder(seed=seed)
    x = b.node("Neg", [b.input("x", [n, cin, hw[0], hw[1]])], "nx")
    r1 = b.node("Relu", [b.node("Conv", [x, b.weight("w1", [cmid, cin, 1, 1]), b.weight("b1", [cmid], 0.5)], "c1")],
                "r1")
    y = b.node("Conv", [r1, b.weight("w2", [cmid, cmid // groups, *kernel]), b.weight("b2", [cmid], 0.5)], "c2",
               strides=list(stride), pads=list(pad), dilations=list(dilation), group=groups)
    if residual:
        y = b.node("Add", [y, r1], "add")
    r2 = b.node("Relu", [y], "r2")
    b.output(b.node("Conv", [r2, b.weight("w3", [16, cmid, 1, 1]), b.weight("b3", [16], 0.5)], "c3"))
    return b.model()


def _compile(model, dtype):
    return compile_model(model, None, CompileOptions(dtype=dtype, matmul="tile", tile_engine="all", layer_group="off"))


def _conv(graph, output: str) -> str:
    """The name of the node writing `output` (the layer its instructions are tagged with)."""
    return next(n.name for n in graph.nodes() if output in n.outputs)


def _transposes(program, layer: str) -> int:
    """TIU C<->W transposes (phase images from an NCHW input) of `layer`."""
    return sum(isinstance(i, CwBcTiu) and i.op == "cw_ts" and program.tiu_layers[k] == layer
               for k, i in enumerate(program.tiu))


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(n=st.sampled_from([1, 2]),
       geometry=st.sampled_from([((3, 3), (1, 1), (1, 1, 1, 1), (1, 1)), ((3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
                                 ((3, 3), (1, 1), (2, 2, 2, 2), (2, 2)), ((1, 1), (2, 2), (0, 0, 0, 0), (1, 1)),
                                 ((2, 3), (1, 2), (1, 0, 0, 1), (1, 1))]),
       groups=st.sampled_from([1, 2]), residual=st.booleans(), dtype=st.sampled_from(["fp32", "fp16", "bf16"]))
def test_c0_chain_matches_onnxruntime(c0_always, n, geometry, groups, residual, dtype):
    """r1 and r2 live NC1HWC0 in DDR wherever a cube conv writes them finished and only cube convs read
    them; their readers build no phase image by TIU transposes; the graph output stays NCHW; the result
    matches onnxruntime (race detector on)."""
    kernel, stride, pad, dilation = geometry
    same = stride == (1, 1) and all(pad[i] + pad[i + 2] == (kernel[i] - 1) * dilation[i] for i in range(2))
    residual = residual and same
    model = _chain(n, 32, 32 * groups, (7, 9), kernel, stride, pad, dilation, groups, residual)
    graph, program = _compile(model, dtype)
    tensors = program.memory.tensors
    assert tensors["r1"].layout == "NC1HWC0"
    assert tensors["r2"].layout == "NC1HWC0"
    assert tensors[graph.outputs[0]].layout == ""
    assert _transposes(program, _conv(graph, "c3")) == 0
    assert _transposes(program, _conv(graph, "c2")) == 0
    assert any(i.layout == "NZ2DN" for i in program.tile if isinstance(i, AccCvt))
    result = verify_program(graph, program, race_check=True)
    assert result["ok"], result["outputs"]


def test_c0_image_load_is_one_dma_of_whole_block_runs(c0_always):
    """The 3x3 pad-1 reader of an NC1HWC0 r1 (64 channels, 4 fp16 blocks, 7 x 9): its phase image arrives by
    one DMA from r1 whose DDR side is runs of C0 contiguous elements (32 bytes: one pixel's block), 64
    channels in 4 blocks x 9 columns x 7 rows of them, written into the image's lanes (no TIU transpose); the
    writer's stores have DDR runs of whole pixel tiles x C0."""
    model = _chain(1, 32, 64, (7, 9), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, False)
    graph, program = _compile(model, "fp16")
    chip, r1 = program.chip, program.memory.tensors["r1"]
    c1, c2 = _conv(graph, "c1"), _conv(graph, "c2")
    c0 = chip.tile.k_fractal_bytes // 2
    inside = lambda addr: r1.addr <= addr < r1.addr + r1.nbytes        # noqa: E731
    loads = [d for k, d in enumerate(program.gdma) if program.gdma_layers[k] == c2
             and getattr(d, "src_start_addr", None) is not None and inside(d.src_start_addr)]
    assert len(loads) == 1
    d = loads[0]
    assert (d.src_nsize, d.src_csize, d.src_hsize, d.src_wsize) == (64 // c0, 9, 7, c0)
    assert d.src_wstride == 1 and d.src_csize * d.src_hsize * d.src_nsize * c0 * 2 == r1.nbytes
    assert _transposes(program, c2) == 0
    stores = [d for k, d in enumerate(program.gdma) if program.gdma_layers[k] == c1
              and getattr(d, "dst_start_addr", None) is not None and inside(d.dst_start_addr)]
    assert stores and all(d.dst_wsize == c0 and d.dst_wstride == 1 and d.dst_hstride == c0 for d in stores)
    assert sum(d.dst_nsize * d.dst_csize * d.dst_hsize * d.dst_wsize for d in stores) * 2 == r1.nbytes


def test_tiu_conv_meeting_c0_tensors_converts_them(c0_always, monkeypatch):
    """A conv the layout plan expected on the cube that runs on the TIU (its TILE plan fits nowhere in the
    program):
    its NC1HWC0 input is converted to NCHW before it and its NC1HWC0 result after it, both as
    LayoutConversion layers; the chain still matches onnxruntime."""
    from tpuflow.lowering.ops import tilemm
    plan = tilemm.TileConvEmitter.plan
    # it fits alone (the layout plan's standalone probe, all row-major) but not in the program
    monkeypatch.setattr(tilemm.TileConvEmitter, "plan", lambda self, region: None if self.node.outputs[0] == "c2"
                        and self.ctx.ddr.layouts else plan(self, region))
    model = _chain(2, 32, 48, (6, 5), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, True)
    graph, program = _compile(model, "fp32")
    c2 = _conv(graph, "c2")
    conversions = sorted(k for k, v in program.layers.items() if v.op_type == "LayoutConversion")
    assert conversions == [f"{c2}:r1>NCHW", f"{c2}:r2>NC1HWC0"]
    assert not any(program.tile_layers[k] == c2 for k in range(len(program.tile)))
    assert verify_program(graph, program, race_check=True)["ok"]


def test_layouts_in_manifest_and_estimate(c0_always, tmp_path):
    """manifest.json lists r1's layout (and no layout key on row-major tensors) and the layouts summary; the
    estimate's --json and text say how many activations are C0-blocked."""
    from tpuflow.codegen import write_program
    from tpuflow.estimate import estimate_report, render_text
    from tpuflow.hwmodel.timing import simulate
    model = _chain(1, 32, 32, (5, 5), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, False)
    graph, program = _compile(model, "fp16")
    manifest = json.loads((write_program(program, tmp_path / "out", name=graph.name) / "manifest.json").read_text())
    entries = {t["name"]: t for t in manifest["memory"]["tensors"]}
    assert entries["r1"]["layout"] == "NC1HWC0" and "layout" not in entries[graph.outputs[0]]
    assert manifest["layouts"]["c0_blocked"] == ["r1", "r2"]
    report = estimate_report(program, simulate(program))
    assert report["layouts"]["c0_blocked"] == ["r1", "r2"]
    assert "layouts        2 activations NC1HWC0 in DDR" in render_text(report)


def test_cost_model_keeps_nchw_on_sg2260():
    """Left to the cost model (the default), the same chain keeps NCHW on sg2260: the NC1HWC0 image of a
    reader is one 32-byte GDMA piece per pixel and block, where the NCHW image is one load of whole rows
    and TIU transposes (cheap on its TIU): measured with layer groups off, squeezenet --tile-engine all
    434 us NCHW against 606 us C0-blocked."""
    model = _chain(1, 32, 64, (14, 14), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, False)
    graph, program = _compile(model, "fp16")
    assert not any(t.layout for t in program.memory.tensors.values())
    assert _transposes(program, _conv(graph, "c2")) > 0
