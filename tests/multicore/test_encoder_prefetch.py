"""Weight prefetch on encoders split over cores (lowering.weight_prefetch): the first-fit rule of the
weight area against a brute-force scan (hypothesis), FFN weights loading while the attention
computes, every core reading each weight byte once, and small encoders on 4 and 8 cores computing
what onnxruntime computes with the race detector on."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuflow.hwmodel.timing import simulate
from tpuflow.isa import Engine
from tpuflow.lowering.context import HeldConstants
from tpuflow.lowering.weight_prefetch import WeightRing
from tpuflow.models.transformer import BERT_BASE, Dims, encoder
from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model, verify

ALIGN, BANK = 64, 1024
SMALL = Dims(seq=64, hidden=256, heads=8, ffn=1024)


def _free(ring: WeightRing, lo: int, hi: int, grain: int = 1) -> bool:
    """[lo, hi) (widened to whole `grain`s) meets no pending block, by scanning every byte's grain."""
    busy = {x // grain for b in ring.pending.values() for x in range(b.addr, b.addr + b.size)}
    return not any(x // grain in busy for x in range(lo, hi))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 63), st.integers(1, 12)), max_size=6), st.integers(1, 12))
def test_the_weight_area_places_a_block_where_a_brute_force_scan_finds_room(blocks, units):
    ring = WeightRing(start=BANK, end=5 * BANK, align=ALIGN, bank=BANK)
    for i, (slot, length) in enumerate(blocks):          # pending blocks where they do not overlap
        addr, size = BANK + slot * ALIGN, length * ALIGN
        if addr + size <= ring.end and _free(ring, addr, addr + size):
            ring.pending[i] = HeldConstants(addr, size)
    size = units * ALIGN * 5 // 3                          # not a multiple of the alignment
    got = ring.where(size)
    need = ring.aligned(size)
    room = [a for a in range(ring.start, ring.end - need + 1, ALIGN) if _free(ring, a, a + need)]
    apart = [a for a in room if _free(ring, a, a + need, BANK)]
    if not room:
        assert got is None
        return
    assert got in room                                     # inside the area, on no pending block
    if apart:
        assert got == apart[0]                             # the lowest that shares no dependency chunk
    else:
        assert got == room[0]


def _encoder(layers: int) -> object:
    return encoder(f"encoder{layers}", layers, SMALL)


def test_ffn_weights_load_while_the_attention_computes(split_lowering):
    """A BERT-base-sized layer (small ones are bound by their transfers: nothing to hide behind)."""
    _, program = compile_model(encoder("bert1", 1, BERT_BASE), "sg2260", CompileOptions(dtype="fp16", cores=4))
    result = simulate(program).cores[0]
    def times(layer: str, engine: Engine) -> list[tuple[int, int]]:
        return [(result.times["start"][i], result.times["end"][i]) for i in range(len(result))
                if result.engine[i] == engine.code and result.layer[i] == layer]
    softmax_end = max(e for _, e in times("layer0/attention/softmax", Engine.TIU))
    ffn_weights = times("layer0/ffn/intermediate/matmul@core0", Engine.GDMA)
    assert min(s for s, _ in ffn_weights) < softmax_end     # prefetched during the attention
    assert len(ffn_weights) >= 2                            # in row chunks, not one transfer at the matmul


def test_every_core_reads_each_weight_byte_once(split_lowering):
    _, program = compile_model(_encoder(2), "sg2260", CompileOptions(dtype="fp16", cores=4))
    base = program.memory.weight_base
    per_core = []
    for core in program.cores:
        counts: dict[int, int] = {}
        for instr, layer in zip(core.gdma, core.gdma_layers):
            if layer == "__prologue__":
                continue
            for r in instr.accesses(program.chip).ddr_reads:
                for x in range(max(r.lo, base) // 64, -(-r.hi // 64)):
                    counts[x] = counts.get(x, 0) + 1
        assert max(counts.values()) == 1                    # no 64-byte line of the weight image read twice
        per_core.append(len(counts))
    assert len(set(per_core)) == 1                          # the same share on every core


@pytest.mark.parametrize("cores", [4, 8])
def test_small_encoders_split_over_cores_match_onnxruntime(cores, split_lowering):
    result = verify(_encoder(2), "sg2260", CompileOptions(dtype="fp16", cores=cores), race_check=True)
    assert result["ok"], result


def test_the_split_program_is_deterministic(split_lowering):
    first = compile_model(_encoder(1), "sg2260", CompileOptions(dtype="fp16", cores=8))[1]
    second = compile_model(_encoder(1), "sg2260", CompileOptions(dtype="fp16", cores=8))[1]
    assert [c.gdma for c in first.cores] == [c.gdma for c in second.cores]
    assert [c.tiu for c in first.cores] == [c.tiu for c in second.cores]


def test_each_core_moves_the_exchange_bytes_of_an_encoder_layer_exactly(split_lowering):
    """One layer on 4 cores, per core, in units of the activation X (seq x hidden, fp16): reads X
    whole (Q/K/V by its heads), the context whole (its columns of the output projection), its rows
    of the residual sum (LayerNorm), the LayerNorm output whole (its FFN hidden columns) and its
    rows of every core's FFN partial; writes its heads' context columns, its residual columns, its
    LayerNorm rows, its whole FFN partial and its output rows."""
    cores, x = 4, SMALL.seq * SMALL.hidden * 2
    _, program = compile_model(_encoder(1), "sg2260", CompileOptions(dtype="fp16", cores=cores))
    base, band = program.memory.weight_base, x // cores
    for core in program.cores:
        read = written = 0
        for instr, layer in zip(core.gdma, core.gdma_layers):
            if layer != "__prologue__":
                acc = instr.accesses(program.chip)
                read += sum(min(r.hi, base) - r.lo for r in acc.ddr_reads if r.lo < base)
                written += sum(min(r.hi, base) - r.lo for r in acc.ddr_writes if r.lo < base)
        assert read == x + x + band + x + cores * band
        assert written == band + band + band + x + band


@pytest.mark.parametrize("heads, cores, expected", [(12, 8, [6]), (12, 4, [3]), (12, 2, []), (8, 8, []),
                                                     (6, 8, [6]), (10, 8, [5]), (3, 8, [])])
def test_the_core_counts_tried_beside_all_and_half_split_the_heads_evenly(heads, cores, expected):
    from tpuflow.lowering.tensor_parallel import head_aligned_cores
    from tpuflow.pipeline import load_graph
    graph = load_graph(encoder("heads", 1, Dims(seq=16, hidden=heads * 16, heads=heads, ffn=64)))
    assert head_aligned_cores(graph, cores) == expected
    assert head_aligned_cores(load_graph("small_cnn"), cores) == []         # no attention: nothing more to try
