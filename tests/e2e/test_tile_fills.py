"""Tile fills through the tile buffer: runtime operands reach Nz / Zn in one DMA per K panel
(several slots, the DDR side read in its own row order), numerics against onnxruntime (race
detector on) over shapes and views; the transformer blocks verify on the TILE path."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx_build import ModelBuilder

from tpuflow.chip import load_chip, replace_param
from tpuflow.isa import TPush
from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model, verify


@pytest.fixture(autouse=True)
def products_on_the_cube(monkeypatch):
    """Every MatMul the cube can take runs on it (ENGINE_CHOICE "tile", not "fit"'s per-group choice, which
    puts some of these products on the TIU): these are tests of the cube's fills."""
    from tpuflow.lowering.ops import tilemm
    monkeypatch.setattr(tilemm, "ENGINE_CHOICE", "tile")


def check(model, dtype="fp32"):
    result = verify(model, None, CompileOptions(dtype=dtype, matmul="tile"), race_check=True)
    assert result["ok"], result["outputs"]


def runtime_matmul(m: int, k: int, n: int, transpose_b: bool):
    """x (m x k) . z (k x n), both runtime (a Neg in front so neither is a graph input view);
    z comes transposed ((n x k) -> Transpose) when asked, so B is read column-major."""
    b = ModelBuilder()
    x = b.node("Neg", [b.input("x", [m, k])], "nx")
    if transpose_b:
        z = b.node("Transpose", [b.node("Neg", [b.input("z", [n, k])], "nz")], "tz", perm=[1, 0])
    else:
        z = b.node("Neg", [b.input("z", [k, n])], "nz")
    b.output(b.node("MatMul", [x, z], "y"))
    return b.model()


def window_fills(model, dtype="fp32", chip=None):
    """(per GDMA command writing the tile window from DDR: how many slots it writes; TPUSHes)."""
    _, program = compile_model(model, chip, CompileOptions(dtype=dtype, matmul="tile"))
    chip = program.chip
    fills = []
    for instr in program.gdma:
        ranges = [r for r in instr.accesses(chip).lmem_writes if r.lo >= chip.tile_window_offset]
        if ranges and not instr.accesses(chip).lmem_reads:
            fills.append(max(r.lanes for r in ranges))
    return fills, sum(i.count for i in program.tile if isinstance(i, TPush))


@settings(max_examples=8, deadline=None)
@given(st.integers(1, 70), st.integers(1, 300), st.integers(1, 90), st.booleans(), st.sampled_from(["fp32", "fp16"]))
def test_runtime_operands_through_the_tile_buffer_compute_exactly(m, k, n, transpose_b, dtype):
    check(runtime_matmul(m, k, n, transpose_b), dtype)


@pytest.mark.parametrize("transpose_b", [False, True])
def test_a_k_panel_of_runtime_tiles_is_one_dma(transpose_b):
    """64 x 512 . 512 x 64 fp16: K = 512 is 8 K tiles of 64; each runtime operand's panel (or
    streaming batch) fills several neighbouring slots in one DMA, so there are fewer fills than
    pushes; with tile.buffer_chunk_bytes = 0 every tile read from DDR is its own DMA (an operand a
    layer group keeps in LMEM comes by LMEM -> window copies, not counted)."""
    model = runtime_matmul(64, 512, 64, transpose_b)
    fills, pushes = window_fills(model, "fp16")
    assert max(fills) >= 4 and len(fills) * 2 <= pushes
    check(model, "fp16")
    plain = replace_param(load_chip("sg2260"), "tile.buffer_chunk_bytes", 0)
    fills, pushes = window_fills(model, "fp16", plain)
    assert fills and max(fills) == 1


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("model", ["bert_layer", "gpt_block", "llama_mlp"])
def test_transformer_blocks_verify_on_the_tile_path(model, dtype):
    result = verify(model, None, CompileOptions(dtype=dtype, matmul="tile"), race_check=True)
    assert result["ok"], result["outputs"]


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("bias", [False, True])
def test_a_residual_add_accumulates_in_the_cube(bias, dtype):
    """MatMul (+ bias) + residual with the residual in DDR (layer groups off: with them on it stays
    in LMEM and the TIU epilogue adds it in place): the residual enters the ACC as R . I (an extra
    TMATMUL per output tile, .BIAS when there is a bias), so the TIU runs nothing and the result
    leaves the slot in the model's dtype; numerics against onnxruntime."""
    from tpuflow.isa import TMatmul
    b = ModelBuilder()
    x = b.node("Neg", [b.input("x", [40, 96])], "nx")
    r = b.node("Neg", [b.input("r", [40, 80])], "nr")
    y = b.node("MatMul", [x, b.weight("w", [96, 80])], "mm")
    if bias:
        y = b.node("Add", [y, b.weight("b", [80], 0.1)], "bias")
    b.output(b.node("Add", [r, y], "residual"))
    model = b.model()
    options = CompileOptions(dtype=dtype, matmul="tile", layer_group="off")
    graph, program = compile_model(model, None, options)
    matmuls = [i for i in program.tile if isinstance(i, TMatmul)]
    from tpuflow.isa import Engine
    tiu_layers = set(program.layer_names(Engine.TIU)[:len(program.tiu)])
    firsts = [i for i in matmuls if not i.accumulates]
    assert firsts and all(i.k == i.n and i.reuse1 for i in firsts)          # R (mt x nt) . I (nt x nt)
    assert all(i.fn.endswith(".BIAS") == bias for i in firsts)
    negs = {node.name for node in graph.nodes() if node.op_type == "Neg"}
    assert len(negs) == 2 and tiu_layers <= negs | {""}                      # only the Negs run on the TIU
    result = verify(model, None, options, race_check=True)
    assert result["ok"], result["outputs"]


@pytest.mark.parametrize("port", [True, False])
def test_a_streaming_weight_is_staged_in_lmem_and_copied_into_its_slots(port):
    """x (64 x 512) . w (512 x 512) fp16: w's 64 tiles of 8 KiB stream once each, so they are staged
    in LMEM and moved into the slots one batch of 8 at a time, never by a DDR -> slot DMA: with the
    tile buffer's DMA port in two DMAs (48 tiles across the lanes, then the last 16) and by TMOVEs
    (any lane -> window); without it by rows of 16 (each tile in its future slot's lane, one DMA per
    row or two) and TIU copies; numerics."""
    from tpuflow.isa import ArTiu, TMove
    b = ModelBuilder()
    b.output(b.node("MatMul", [b.node("Neg", [b.input("x", [64, 512])], "nx"), b.weight("w", [512, 512])], "y"))
    model = b.model()
    chip = load_chip("sg2260")
    chip = chip if port else replace_param(chip, "tile.move_port_bytes_per_cycle", 0)
    _, program = compile_model(model, chip, CompileOptions(dtype="fp16", matmul="tile"))
    window = chip.tile_window_offset

    def into_window(instr):
        return any(r.lo >= window for r in instr.accesses(chip).lmem_writes)
    copies = [i for i in program.tiu if isinstance(i, ArTiu) and i.op == "copy" and into_window(i)]
    moves = [i for i in program.tile if isinstance(i, TMove) and into_window(i)       # lane to same lane (w's tiles)
             and max(r.lanes for r in i.accesses(chip).lmem_reads) <= chip.tile.queue_slots]
    staging = [i for i in program.gdma if i.accesses(chip).lmem_writes and i.accesses(chip).ddr_reads
               and getattr(i, "dst_wsize", 0) == 8192 // 2                   # whole 8 KiB tiles, one per lane
               and all(r.lo < window for r in i.accesses(chip).lmem_writes)]
    staged_bytes = sum(i.dst_nsize * i.dst_csize * i.dst_hsize * i.dst_wsize * 2 for i in staging)
    assert not [i for i in program.gdma if into_window(i) and i.accesses(chip).ddr_reads]
    if port:
        assert not copies and len(moves) == 64 // 8 and sum(m.desc.nbytes for m in moves) == 64 * 8192
        assert all(not m.accesses(chip).ddr_reads for m in moves)
    else:
        assert not moves and len(copies) == 64 // 8 and sum(c.res0_c for c in copies) == 64
    assert staged_bytes == 64 * 8192
    if port:     # lanes wide, in few large DMAs: the stream's last STAGE_TAIL_TILES tiles are one of their own
        assert len(staging) == 2 and staging[-1].dst_csize == 16
    else:        # rows of 16 tiles in their slots' lanes, up to STAGE_ROWS per DMA
        assert len(staging) <= 64 // 16 and all(i.dst_csize % chip.tile.queue_slots == 0 for i in staging)
    result = verify(model, chip, CompileOptions(dtype="fp16", matmul="tile"), race_check=True)
    assert result["ok"], result["outputs"]


def test_batches_of_a_runtime_matmul_share_fills_and_stores():
    """x (8 x 64 x 64) . z (8 x 64 x 64) fp16, both runtime: the batches run as one TileGemm, so
    the A tiles of consecutive batches (64 x 64 blocks 4096 elements apart) fill neighbouring slots
    in one DMA, and results leave in spans; far fewer window DMAs than the 16 tiles pushed."""
    b = ModelBuilder()
    x = b.node("Neg", [b.input("x", [8, 64, 64])], "nx")
    z = b.node("Neg", [b.input("z", [8, 64, 64])], "nz")
    b.output(b.node("MatMul", [x, z], "y"))
    model = b.model()
    fills, pushes = window_fills(model, "fp16")
    assert pushes == 16 and len(fills) <= 4 and max(fills) >= 4
    check(model, "fp16")


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_layer_groups_keep_tile_matmul_operands_and_results_in_lmem(dtype):
    """x -> Neg -> MatMul(w1) -> Relu -> MatMul(w2) on the TILE path with layer groups: the Neg's
    output is read by the first product from LMEM (LMEM -> tile-buffer DMAs, no DDR load of it),
    and results reach LMEM from the slots; with layer groups off every A tile comes from DDR.
    Numerics against onnxruntime (race detector on) both ways."""
    b = ModelBuilder()
    x = b.node("Neg", [b.input("x", [64, 128])], "nx")
    y = b.node("Relu", [b.node("MatMul", [x, b.weight("w1", [128, 96])], "mm1")], "r")
    b.output(b.node("MatMul", [y, b.weight("w2", [96, 80])], "mm2"))
    model = b.model()

    def lmem_to_window(options):      # GDMA commands or TMOVEs (the tile buffer's DMA port)
        from tpuflow.isa import TMove
        _, program = compile_model(model, None, options)
        chip, window = program.chip, program.chip.tile_window_offset
        return [i for i in program.gdma + [m for m in program.tile if isinstance(m, TMove)]
                if any(r.lo >= window for r in i.accesses(chip).lmem_writes)
                and any(r.hi <= window for r in i.accesses(chip).lmem_reads)]

    for groups, expect in (("on", True), ("off", False)):
        options = CompileOptions(dtype=dtype, matmul="tile", layer_group=groups)
        assert bool(lmem_to_window(options)) == expect
        result = verify(model, None, options, race_check=True)
        assert result["ok"], result["outputs"]


def test_a_weight_read_by_every_row_of_output_tiles_is_staged_once():
    """x (192 x 512) . w (512 x 256) fp16 with the tile buffer's DMA port: each row of output tiles reads
    all of w's tiles again, so the GDMA loads them into LMEM once (w's bytes, tile-padded) and TMOVEs put
    them into their slots once per row (at least twice w's bytes through the port); numerics."""
    from tpuflow.isa import TMove
    b = ModelBuilder()
    b.output(b.node("MatMul", [b.node("Neg", [b.input("x", [192, 512])], "nx"), b.weight("w", [512, 256])], "y"))
    model = b.model()
    chip = load_chip("sg2260")
    _, program = compile_model(model, chip, CompileOptions(dtype="fp16", matmul="tile"))
    window = chip.tile_window_offset
    from_ddr_into_window = [i for i in program.gdma if i.accesses(chip).ddr_reads
                            and any(r.lo >= window for r in i.accesses(chip).lmem_writes)]
    staging = [i for i in program.gdma if i.accesses(chip).ddr_reads and getattr(i, "dst_wsize", 0) == 8192 // 2]
    moved = sum(m.desc.nbytes for m in program.tile if isinstance(m, TMove)
                and max(r.lanes for r in m.accesses(chip).lmem_reads) <= chip.tile.queue_slots)
    assert not from_ddr_into_window
    assert sum(i.dst_csize * i.dst_wsize * 2 for i in staging) == 512 * 256 * 2
    assert moved >= 2 * 512 * 256 * 2
    result = verify(model, chip, CompileOptions(dtype="fp16", matmul="tile"), race_check=True)
    assert result["ok"], result["outputs"]
