"""TMatmul.acc / AccCvt.acc (tpuflow's additive field, issue 16): two output tiles accumulate
interleaved in ACCs 0 and 1, sharing each A tile (.reuse on the first read); each ACCCVT drains and
releases only its own ACC; an ACC the chip does not have is an error; the field round-trips through
BSTART.CUBE bits 26..25 and shows in the listing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from functional_helpers import CHIP
from test_functional_tile import _acc_code, _put
from tpuflow.codegen.disasm import tile_text
from tpuflow.codegen.linx import BSTART_CUBE, block_words, decode_blocks, encode_blocks
from tpuflow.errors import BinaryFormatError
from tpuflow.hwmodel.functional import ExecutionError, Machine
from tpuflow.isa import AccCvt, Prec, TMatmul, TPush, size_code, tile_ref


@settings(max_examples=15, deadline=None)
@given(rows=st.integers(1, 32), n=st.integers(1, 32), k=st.integers(1, 24), seed=st.integers(0, 2**31))
def test_interleaved_accs_hold_two_products_sharing_the_a_tiles(rows, n, k, seed):
    """ACC0 = A1 . B1 + A2 . B3 and ACC1 = A1 . B2 + A2 . B4, the two tiles' steps interleaved."""
    rng = np.random.default_rng(seed)
    a = [rng.standard_normal((rows, k)).astype(np.float32) for _ in range(2)]
    b = [rng.standard_normal((k, n)).astype(np.float32) for _ in range(4)]
    m = Machine(CHIP, 64)
    for step in range(2):
        _put(m, "T", a[step], "nz", Prec.FP32)
        _put(m, "U", b[2 * step], "zn", Prec.FP32)
        _put(m, "U", b[2 * step + 1], "zn", Prec.FP32)
        for acc in (0, 1):
            m.execute(TMatmul(fn="TMATMUL.ACC" if step else "TMATMUL", dt="FP32", m=rows, n=n, k=k,
                              src0=tile_ref("T", 1), src1=tile_ref("U", 2 - acc), reuse0=1 - acc,
                              acc_size=_acc_code(rows, n), acc=acc))
    f = lambda v: v.astype(np.float64)  # noqa: E731
    np.testing.assert_allclose(m.tile.acc, f(a[0]) @ f(b[0]) + f(a[1]) @ f(b[2]), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(m.tile.other_accs[1], f(a[0]) @ f(b[1]) + f(a[1]) @ f(b[3]), rtol=1e-5, atol=1e-5)
    m.execute(AccCvt(layout="NZ2ND", row=rows, col=n, dst_queue=2, dst_size=size_code(rows * n * 4), acc=1))
    assert m.tile.other_accs[1] is None and m.tile.acc is not None      # only ACC 1 drained


def test_an_acc_the_chip_lacks_is_an_error():
    m = Machine(CHIP, 64)
    _put(m, "T", np.ones((16, 16), np.float32), "nz", Prec.FP32)
    with pytest.raises(ExecutionError, match="ACC 2"):
        m.execute(TMatmul(fn="TMATMUL", dt="FP32", m=16, n=16, k=16, src0=tile_ref("T", 1), src1=tile_ref("T", 1),
                          reuse0=1, acc_size=_acc_code(16, 16), acc=CHIP.tile.acc_buffers))


@pytest.mark.parametrize("acc", [0, 1, 3])
def test_acc_round_trips_and_lists(acc):
    mm = TMatmul(fn="TMATMUL.ACC", dt="FP16", m=64, n=56, k=48, src0=1, src1=2, acc_size=13, reuse0=1, acc=acc)
    cvt = AccCvt(layout="NZ2ND", row=64, col=56, dst_queue=2, dst_size=size_code(64 * 56 * 2), dst_dt="FP16", acc=acc)
    assert decode_blocks(encode_blocks([mm, cvt])) == [mm, cvt]
    assert BSTART_CUBE.unpack_int(block_words(mm)[0])["acc"] == acc
    assert ("ACC1" in tile_text(cvt)) == (acc == 1) and ("ACC3" in tile_text(mm)) == (acc == 3)
    if not acc:      # ACC 0 encodes as v0.56's implicit ACC: bits 26..25 zero
        assert block_words(mm)[0] & (3 << 25) == 0


def test_a_push_with_acc_bits_is_rejected():
    words = block_words(TPush(dst_queue=0, dst_size=9))
    words[0] |= 1 << 25
    with pytest.raises(BinaryFormatError):
        decode_blocks(b"".join(w.to_bytes(4, "little") for w in words))
