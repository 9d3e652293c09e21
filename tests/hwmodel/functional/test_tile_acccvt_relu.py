"""ACCCVT's relu field (tpuflow extension, issue 16; Ascend's Fixpipe pre-ReLU): the converted tile
is max(ACC, 0) rounded to the destination type, for every layout and type; the field round-trips
through the B.DATR word and shows in the listing; a Relu-only conv epilogue uses it (no TIU pass)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from functional_helpers import CHIP
from tpuflow.codegen.disasm import tile_text
from tpuflow.codegen.linx import decode_blocks, encode_blocks
from tpuflow.hwmodel.functional import Machine
from tpuflow.hwmodel.functional.floats import to_f32
from tpuflow.hwmodel.functional.tile import DT_PREC
from tpuflow.isa import AccCvt, size_code


@settings(max_examples=12, deadline=None)
@given(rows=st.integers(1, 40), cols=st.integers(1, 40), dt=st.sampled_from(["FP32", "FP16", "BF16"]),
       seed=st.integers(0, 2**31))
def test_relu_zeroes_the_negative_values_before_the_conversion(rows, cols, dt, seed):
    acc = np.random.default_rng(seed).normal(0, 4, (rows, cols)).astype(np.float32)
    out = {}
    for relu in (0, 1):
        m = Machine(CHIP, 64)
        m.tile.acc = acc.copy()
        ins = AccCvt(layout="NZ2ND", row=rows, col=cols, dst_queue=2, dst_size=size_code(rows * cols * 4), dst_dt=dt,
                     relu=relu)
        m.execute(ins)
        lane, off = divmod(CHIP.tile_slot_address(2, 0), CHIP.lmem_bytes_per_lane)
        prec = DT_PREC[dt]
        raw = m.lmem.data[lane, off:off + rows * cols * prec.bytes].view(prec.storage_dtype)
        out[relu] = to_f32(raw, prec).reshape(rows, cols)
    assert np.array_equal(out[1], np.maximum(out[0], 0))
    assert (out[1][acc < 0] == 0).all() and np.array_equal(out[1][acc > 0], out[0][acc > 0])


@pytest.mark.parametrize("relu", [0, 1])
def test_relu_round_trips_and_lists(relu):
    ins = AccCvt(layout="NZ2ND", row=64, col=56, dst_queue=2, dst_size=size_code(64 * 56 * 2), dst_dt="FP16", relu=relu)
    assert decode_blocks(encode_blocks([ins])) == [ins]
    assert tile_text(ins).endswith(" relu") == bool(relu)
