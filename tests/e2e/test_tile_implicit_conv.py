"""Convolution as implicit GEMM on the TILE path (issue 16): B tiles come from the input's phase
images in LMEM (one load, TIU C<->W transposes, LMEM -> tile-buffer DMAs), no im2col through DDR;
numerics against onnxruntime over strides, pads, dilations and groups (race detector on)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx_build import ModelBuilder

from tpuflow.chip import load_chip, replace_param
from tpuflow.isa import AccCvt, CwBcTiu, TImg2Col, TMatmul, TMove, global_lmem_address
from tpuflow.hwmodel.timing.segments import transfer_sides
from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model, verify


# these tests exercise the TILE conv itself (conftest.convs_on_the_cube)
pytestmark = pytest.mark.usefixtures("convs_on_the_cube")


def _conv_model(cin, cout, hw, k, stride, pad, dilation, groups, tail):
    b = ModelBuilder(seed=cin * 7 + k[0] * 3 + k[1])
    x = b.node("Neg", [b.input("x", [1, cin, hw[0], hw[1]])], "nx")
    y = b.node("Conv", [x, b.weight("w", [cout, cin // groups, k[0], k[1]]), b.weight("b", [cout], 0.5)], "c",
               strides=list(stride), pads=list(pad), dilations=list(dilation), group=groups)
    if tail == "relu":
        y = b.node("Relu", [y], "r")
    elif tail == "residual":        # Add(conv, skip) + Relu: the skip enters the ACC (I . R)
        out_hw = [(hw[i] + pad[i] + pad[i + 2] - (k[i] - 1) * dilation[i] - 1) // stride[i] + 1 for i in range(2)]
        skip = b.node("Neg", [b.input("skip", [1, cout, *out_hw])], "nskip")
        y = b.node("Relu", [b.node("Add", [y, skip], "add")], "r")
    elif tail == "sigmoid":
        y = b.node("Sigmoid", [y], "s")
    b.output(y)
    return b.model()


def _transfers(program):
    """(source, destination) sides of the GDMA data commands (commands without sides skipped)."""
    for instr in program.gdma:
        try:
            src, dst = transfer_sides(instr, program.chip)
        except TypeError:
            continue
        if src is not None:
            yield src, dst


def _ddr_to_ddr_copies(program) -> int:
    """GDMA data commands with both sides in DDR (the im2col and NHWC staging copies)."""
    return sum(not src.lmem and not dst.lmem for src, dst in _transfers(program))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stride=st.sampled_from([(1, 1), (2, 2), (1, 2), (3, 2)]),
       pad=st.sampled_from([(0, 0, 0, 0), (1, 1, 1, 1), (2, 0, 1, 2)]),
       dilation=st.sampled_from([(1, 1), (2, 1), (2, 2)]),
       kernel=st.sampled_from([(1, 1), (3, 3), (1, 3), (2, 3)]),
       groups=st.sampled_from([1, 2]),
       tail=st.sampled_from(["none", "relu", "sigmoid", "residual"]),
       dtype=st.sampled_from(["fp32", "fp16", "bf16"]))
def test_implicit_gemm_conv_matches_onnxruntime(stride, pad, dilation, kernel, groups, tail, dtype):
    """Any stride / pad / dilation / group count: the conv reads its B tiles from LMEM (TIU transposes
    build the phase images; no DDR -> DDR copy), and its output matches onnxruntime."""
    hw = (9, 11)
    eff = [(kernel[i] - 1) * dilation[i] + 1 for i in range(2)]
    if any(hw[i] + pad[i] + pad[i + 2] < eff[i] for i in range(2)):
        return
    cin = 32 * groups
    model = _conv_model(cin, 24 * groups, hw, kernel, stride, pad, dilation, groups, tail)
    options = CompileOptions(dtype=dtype, matmul="tile")
    _, program = compile_model(model, None, options)
    assert any(isinstance(i, TMatmul) for i in program.tile)
    assert sum(isinstance(i, CwBcTiu) and i.op == "cw_ts" for i in program.tiu) >= groups
    assert _ddr_to_ddr_copies(program) == 0
    result = verify(model, None, options, race_check=True)
    assert result["ok"], result["outputs"]


def test_window_dmas_read_lmem_and_fill_slots():
    """A 3x3 pad-1 conv on 64 channels on a chip without TIMG2COL's expansion path: every B tile arrives
    by an LMEM -> tile-buffer move (a GDMA command or a TMOVE on the tile buffer's port) whose
    source is a run of output rows (lanes) x channels (in-lane), one per tap and pixel tile."""
    model = _conv_model(64, 64, (8, 8), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, "relu")
    chip = replace_param(load_chip("sg2260"), "tile.img2col_bytes_per_cycle", 0)
    _, program = compile_model(model, chip, CompileOptions(dtype="fp16", matmul="tile"))
    assert not any(isinstance(i, TImg2Col) for i in program.tile)
    chip = program.chip
    window = []
    moves = [m.desc for m in program.tile if isinstance(m, TMove)]     # the tile buffer's DMA port
    for instr in program.gdma + moves:
        try:
            src, dst = transfer_sides(instr, chip)
        except TypeError:
            continue
        if src is not None and src.lmem and dst.lmem and chip.in_tile_buffer(dst.addr):
            window.append((src, dst))
    # 8 x 8 output = one pixel tile of 8 rows; K = 9 taps x 64 channels, one 64-channel K tile per tap,
    # taps of one kernel column (one row apart) in one DMA; the other LMEM -> tile copies move staged
    # weight tiles (one lane each)
    rows = [src for src, _ in window if src.shape[0] > 1]
    assert sum(src.shape[2] for src in rows) == 9 and len(rows) < 9
    assert all(src.shape[:2] == (8, 8) and src.shape[3] == 64 and src.shape[2] <= 3 for src in rows)
    assert all(src.strides[2] == src.strides[0] for src in rows if src.shape[2] > 1)     # taps one row apart
    assert all(src.shape[0] == 1 and src.shape[2] == 1 for src, _ in window if src.shape[0] == 1)


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_halo_tiles_cross_the_port_once_and_timg2col_makes_the_b_tiles(dtype):
    """The same conv with the expansion path (issue 16): the padded input crosses the tile buffer's DMA port
    once, as halo tiles of two 32-byte channel blocks (a 10 x 10 halo of one block is 3.2 KiB: two fit an
    8 KiB slot), one TMOVE each (8 x 8 output = one pixel tile; the halo ring keeps them for the next pass
    over the pixel tiles, one per M tile of output channels); every B tile is written by a TIMG2COL reading
    one of them, every K row of P^T (64 channels x 9 taps) once per pass; the window moves cost 9 x these bytes
    (test_window_dmas_read_lmem_and_fill_slots); the Relu is the ACCCVTs'. The result matches onnxruntime
    (race detector on)."""
    model = _conv_model(64, 64, (8, 8), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, "relu")
    options = CompileOptions(dtype=dtype, matmul="tile")
    _, program = compile_model(model, None, options)
    chip = program.chip
    e = 4 if dtype == "fp32" else 2
    k0 = chip.tile.k_fractal_bytes // e
    passes = -(-64 // max(i.m for i in program.tile if isinstance(i, TMatmul)))
    expands = [i for i in program.tile if isinstance(i, TImg2Col)]
    halos = {i.src_addr for i in expands}
    moves = [m for m in program.tile if isinstance(m, TMove)
             and any(m.desc.dst_start_addr == global_lmem_address(a, chip) for a in halos)]
    assert len(moves) == (64 // k0) // 2          # once: the halo ring still holds them on the next pass
    assert all(m.desc.nbytes == 2 * 10 * 10 * chip.tile.k_fractal_bytes for m in moves)
    assert all(i.c1 == 2 and (i.in_h, i.in_w, i.kh, i.kw, i.out_h, i.out_w) == (10, 10, 3, 3, 8, 8) for i in expands)
    assert sum(i.k_count for i in expands) * k0 == passes * 64 * 9
    assert not any(isinstance(m, TMove) and m.desc.dst_start_addr in
                   {global_lmem_address(chip.tile_slot_address(1, s), chip) for s in range(16)} for m in program.tile)
    # the Relu leaves with the ACCCVT (tile.acccvt_relu): no TIU pass over the results
    assert all(i.relu for i in program.tile if isinstance(i, AccCvt))
    assert not any(getattr(i, "op", "") == "max" for i in program.tiu)
    assert verify(model, None, options, race_check=True)["ok"]


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_a_conv_whose_channels_are_not_whole_fractals_keeps_im2col(dtype):
    """24 input channels (not a multiple of K0 in fp16): the DDR im2col path, still exact (without layer
    groups: one that keeps the input in LMEM hands such a conv to the TIU, test_a_conv_the_cube_cannot_
    read_from_lmem_runs_on_the_tiu)."""
    model = _conv_model(24, 16, (6, 6), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, "none")
    options = CompileOptions(dtype=dtype, matmul="tile", layer_group="off")
    _, program = compile_model(model, None, options)
    assert (_ddr_to_ddr_copies(program) == 0) == (dtype == "fp32")   # 24 = 3 fractals of 8 in fp32, 1.5 of 16 in fp16
    assert verify(model, None, options, race_check=True)["ok"]


def test_large_phase_images_encode(tmp_path):
    """A 1x1 conv over 1024 channels of a padded 30 x 30 image (32 rows x 1024 channels per lane): the phase images' zero fill and the
    transposes keep every TIU stride inside its 16-bit field (the binaries encode and decode)."""
    from tpuflow.codegen import read_program, write_program
    model = _conv_model(1024, 32, (30, 30), (1, 1), (1, 1), (1, 1, 1, 1), (1, 1), 1, "relu")
    graph, program = compile_model(model, None, CompileOptions(dtype="fp16", matmul="tile"))
    assert _ddr_to_ddr_copies(program) == 0
    write_program(program, tmp_path, name="big")
    assert len(read_program(tmp_path, program.chip).tiu) == len(program.tiu)


def test_staged_weights_through_a_small_ring_match_onnxruntime(monkeypatch):
    """256 -> 256 3x3 conv: 4 x 36 weight tiles = 3 staging chunks of 64 tiles; with a ring of two
    chunks they are evicted and staged again per pixel tile, and the result still matches onnxruntime."""
    from tpuflow.lowering.ops import tile_operands
    staged = []
    original = tile_operands.StagedConstOperand.__init__

    def two_chunks(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.ring_chunks = 2
        staged.append(self)
    monkeypatch.setattr(tile_operands.StagedConstOperand, "__init__", two_chunks)
    monkeypatch.setattr(tile_operands.LaneRowsOperand, "row_bytes", staticmethod(lambda *_: 1 << 30))  # no lane rows
    model = _conv_model(256, 256, (10, 10), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, "relu")
    options = CompileOptions(dtype="fp16", matmul="tile")
    assert verify(model, None, options, race_check=True)["ok"]
    assert staged and staged[0].tiles > 2 * options_lanes()


def options_lanes() -> int:
    from tpuflow.chip import load_chip
    return load_chip("sg2260").lanes


def test_weights_streamed_pass_by_pass_fill_slots_by_tiu_copies():
    """256 -> 256 3x3 conv (A streams: 36 K tiles per output tile): each pass starts on a multiple of 16
    T pushes (a TPUSH of the unused slots), K tile j is staged in the lane of T slot j % 16 and copied
    there by the TIU; no GDMA command writes a T slot; numerics against onnxruntime. (On a chip whose tile
    buffer has no DMA port of its own, the case for TIU fills, and no TIMG2COL: with it the K tiles are 48
    deep, 48 per pass, and no pass needs padding.)"""
    from tpuflow.isa import ArTiu, TPush
    model = _conv_model(256, 256, (10, 10), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, "relu")
    options = CompileOptions(dtype="fp16", matmul="tile")
    chip = replace_param(replace_param(load_chip("sg2260"), "tile.img2col_bytes_per_cycle", 0),
                         "tile.move_port_bytes_per_cycle", 0)
    _, program = compile_model(model, chip, options)
    chip = program.chip
    t_lanes = {chip.tile_slot_address(0, s) // chip.lmem_bytes_per_lane for s in range(chip.tile.queue_slots)}
    window_top = chip.tile_window_offset

    def writes_t_slot(addr: int) -> bool:
        return addr % chip.lmem_bytes_per_lane >= window_top and addr // chip.lmem_bytes_per_lane in t_lanes
    gdma_t = 0
    for instr in program.gdma:
        try:
            _, dst = transfer_sides(instr, chip)
        except TypeError:
            continue
        gdma_t += dst.lmem and writes_t_slot(dst.addr)
    copies = [i for i in program.tiu if isinstance(i, ArTiu) and i.op == "copy" and writes_t_slot(i.res0_addr)]
    pads = [i for i in program.tile if isinstance(i, TPush) and i.dst_queue == 0 and i.count == 12]
    assert gdma_t == 0 and copies and pads
    assert verify(model, chip, options, race_check=True)["ok"]


def test_row_bias_streams_when_every_output_tile_has_another_row():
    """A 1x1 conv to 512 channels with B's panel resident (output tiles walk the channel rows): the
    K = 2 bias step reads a bias tile streamed on N (no .reuse, batches of tiles per DMA) instead of
    reloading a sticky one per output tile, and the results of a column of tiles leave in one store;
    numerics against onnxruntime."""
    model = _conv_model(128, 512, (8, 8), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1, "relu")
    options = CompileOptions(dtype="fp16", matmul="tile")
    _, program = compile_model(model, None, options)
    bias_steps = [i for i in program.tile if isinstance(i, TMatmul) and i.k == 2 and i.reuse1]
    assert bias_steps and all(not i.reuse0 and i.src0 // 16 == 3 for i in bias_steps)
    # result tiles down a column of tiles leave together: fewer slot -> DDR stores than result tiles
    stores = sum(src.lmem and program.chip.in_tile_buffer(src.addr) and not dst.lmem for src, dst in _transfers(program))
    results = sum(isinstance(i, AccCvt) for i in program.tile)
    assert 0 < stores < results
    assert verify(model, None, options, race_check=True)["ok"]


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_one_k_tile_of_consecutive_pixel_tiles_moves_in_one_dma(dtype):
    """A 1x1 conv whose K is one K tile (16 channels) over 32 x 32 pixels: the B stream reads the same K
    tile of consecutive pixel tiles, so the window moves carry several pixel tiles each (one slot per
    lane), fewer moves than pixel tiles; numbers against onnxruntime."""
    model = _conv_model(16, 64, (32, 32), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1, "relu")
    options = CompileOptions(dtype=dtype, matmul="tile")
    _, program = compile_model(model, None, options)
    e = 4 if dtype == "fp32" else 2
    matmuls = [i for i in program.tile if isinstance(i, TMatmul) and i.k == 16]
    pixel_tiles = len(matmuls)
    chip, tile_bytes = program.chip, 16 * matmuls[0].n * e
    fills = [i for i in program.tile if isinstance(i, TMove)
             and chip.in_tile_buffer(transfer_sides(i.desc, chip)[1].addr)
             and not chip.in_tile_buffer(transfer_sides(i.desc, chip)[0].addr)]
    window = [i for i in fills if i.desc.nbytes % tile_bytes == 0 and i.desc.nbytes // tile_bytes > 1]
    assert window and len(fills) < pixel_tiles
    assert verify(model, None, options, race_check=True)["ok"]


def test_row_bias_pairs_of_a_conv_arrive_in_one_dma():
    """A 64 -> 192 conv (three M tiles of 64 output channels, bias in the ACC): the three 64 x 2 row-bias
    pairs (Nz, 64 x 16 padded fp16: 2 KiB each) are staged in the sticky cache by one DMA into three
    neighbouring lanes when the GEMM starts (StickyCache.preload), not one DMA each when first needed;
    numerics against onnxruntime."""
    model = _conv_model(64, 192, (8, 8), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, "relu")
    options = CompileOptions(dtype="fp16", matmul="tile")
    _, program = compile_model(model, None, options)
    pairs = [g for g in program.gdma if getattr(g, "nbytes", 0) in (2048, 3 * 2048) and getattr(g, "dst_csize", 0) in (1, 3)
             and getattr(g, "dst_wsize", 0) == 1024]
    assert [(g.nbytes, g.dst_csize) for g in pairs if g.dst_csize == 3] == [(6144, 3)]
    assert verify(model, None, options, race_check=True)["ok"]
