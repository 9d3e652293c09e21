"""Encode/decode throughput of the codegen (instructions per second) per engine; prints JSON.

    .venv/bin/python benchmarks/codegen_bench.py [--count 20000] [--repeat 3] [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

from tpuflow.codegen import decode_stream, encode_stream
from tpuflow.isa import (AccCvt, ArTiu, ConvTiu, Engine, Mm2Tiu, PordTiu, SysDma, SysTiu, TensorDma, TMatmul, TPush,
                         tile_ref)

LANE = 1 << 18
LMEM_BASE = 0x1F0000000000  # memory tag 31 (hwmodel/chips/sg2260.toml gdma_lmem_base_address)


def tiu_mix(i: int):
    """A lowering-like mix: convs (short and long forms), eltwise, pooling, matmul, sync."""
    kind = i % 5
    if kind == 0:
        return ConvTiu(cmd_id_dep=i, res0_addr=(i % 64) * LANE, res0_n=1, res0_c=64, res0_h=28, res0_w=28,
                       opd0_addr=0x4000, opd0_c=64, opd0_h=30, opd0_w=30, opd1_addr=0x20000, opd1_h=3, opd1_w=3,
                       short_res0_str=i % 2)
    if kind == 1:
        return ArTiu(op="add", res0_addr=0x1000, res0_n=1, res0_c=64, res0_h=28, res0_w=28, opd0_addr=0x2000,
                     opd1_addr=0x3000, cmd_id_dep=i)
    if kind == 2:
        return PordTiu(op="maxpooling", res0_addr=0, res0_n=1, res0_c=64, res0_h=14, res0_w=14, opd0_addr=0x8000,
                       opd0_h=28, opd0_w=28, opd1_h=2, opd1_w=2, res_op_x_str=2, res_op_y_str=2)
    if kind == 3:
        return Mm2Tiu(op="nn", res0_addr=0, res0_c=64, res0_w=64, opd0_addr=0x4000, opd0_c=64, opd0_w=128,
                      opd1_addr=0x8000, opd1_c=128, opd1_w=64)
    return SysTiu(op="nop")


def gdma_mix(i: int):
    if i % 4 == 3:
        return SysDma(op="nop")
    return TensorDma(cmd_id_dep=i, src_start_addr=0x1000 + 64 * i, dst_start_addr=LMEM_BASE + (i % 64) * LANE,
                     src_nsize=1, src_csize=64, src_hsize=28, src_wsize=28, src_nstride=50176, src_cstride=784,
                     src_hstride=28, src_wstride=1, dst_nsize=1, dst_csize=64, dst_hsize=28, dst_wsize=28,
                     dst_nstride=784, dst_cstride=784, dst_hstride=28, dst_wstride=1)


def tile_mix(i: int):
    kind = i % 4
    if kind in (0, 1):
        return TPush(dst_queue=kind, dst_size=9, wait_gdma_id=i)
    if kind == 2:
        return TMatmul(fn="TMATMUL", dt="FP16", m=64, n=64, k=64, src0=tile_ref("T", 1), src1=tile_ref("U", 1),
                       acc_size=10)
    return AccCvt(layout="NZ2ND", row=64, col=64, dst_queue=2, dst_size=10, dst_dt="FP16", wait_tiu_id=i)


MIXES = {Engine.TIU: tiu_mix, Engine.GDMA: gdma_mix, Engine.TILE: tile_mix}


def best_time(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def bench(count: int, repeat: int) -> dict:
    results = {}
    for engine, mix in MIXES.items():
        instrs = [mix(i + 1) for i in range(count)]
        data = encode_stream(engine, instrs)
        assert decode_stream(engine, data) == instrs
        enc = best_time(lambda: encode_stream(engine, instrs), repeat)
        dec = best_time(lambda: decode_stream(engine, data), repeat)
        results[engine.value] = {"instructions": count, "bytes": len(data),
                                 "encode_instr_per_s": round(count / enc), "decode_instr_per_s": round(count / dec)}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20000, help="instructions per engine")
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    parser.add_argument("--out", default=None, help="also write the JSON here")
    args = parser.parse_args()
    result = {"benchmark": "codegen_throughput", "python": platform.python_version(),
              "machine": platform.machine(), "engines": bench(args.count, args.repeat)}
    text = json.dumps(result, indent=2, sort_keys=True)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
