"""emit_lookup run on the functional model with a random table and random codes: the instructions it
emitted, checked to give numpy's table[codes] (shared by the lookup tests)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from tpuflow.chip import load_chip
from tpuflow.hwmodel.functional import Machine
from tpuflow.isa import LocalTensor, Prec
from tpuflow.lowering.emitter import Emitter
from tpuflow.lowering.ops.quant_ops import emit_lookup
from tpuflow.lowering.tensors import LTile

CHIP = load_chip("sg2260")
LANES, LANE_BYTES = CHIP.lanes, CHIP.lmem_bytes_per_lane
TABLE_AT = 15 * CHIP.bank_bytes


def run_lookup(src: LTile, out: LTile, seed: int, stage=None, check=lambda instr: None) -> list:
    """The instructions emit_lookup gives for out = table[src] (`stage`: its staging buffers), each
    passed to `check` and executed; asserts the result is table[codes]."""
    rng = np.random.default_rng(seed)
    table = rng.integers(-128, 128, 256).astype(np.int8)
    codes = rng.integers(-128, 128, src.shape).astype(np.int8)
    m = Machine(CHIP, 1 << 16)
    for lane in range(LANES):
        m.write_local(LocalTensor(lane * LANE_BYTES + TABLE_AT, (1, 1, 1, 256), (256, 256, 256, 1), Prec.INT8),
                      table.reshape(1, 1, 1, 256))
    m.write_local(LocalTensor(src.addr, src.shape, src.strides, Prec.INT8), codes)
    ctx = SimpleNamespace(chip=CHIP, em=Emitter(CHIP))
    emit_lookup(ctx, out, src, TABLE_AT, stage)
    instrs = [r.instr for r in ctx.em.records]
    for instr in instrs:
        check(instr)
        m.execute(instr)
    got = m.read_local(LocalTensor(out.addr, out.shape, out.strides, Prec.INT8))
    np.testing.assert_array_equal(got, table[codes.view(np.uint8)])
    return instrs
