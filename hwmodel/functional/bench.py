"""Speed benchmark of the functional model (not a test): one large conv on a Machine, and a
synthetic ~50k-instruction double-buffered program run with and without the race detector.

    python -m tpuflow.hwmodel.functional.bench [--json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from tpuflow.chip import load_chip
from tpuflow.isa.base import LocalTensor, Prec, aligned_strides
from tpuflow.isa.gdma import TensorDma, global_lmem_address
from tpuflow.isa.tiu import ArTiu, ConvTiu
from tpuflow.program import DdrTensor, MemoryPlan, Program

from tpuflow.hwmodel.functional.machine import Machine
from tpuflow.hwmodel.functional.run import run


def _local(chip, addr: int, shape, prec: Prec, compact: bool = False) -> LocalTensor:
    eu = chip.core.eu_bytes_per_lane // prec.bytes
    start = (addr // chip.lmem_bytes_per_lane) % chip.lanes
    return LocalTensor(addr, shape, aligned_strides(shape, eu, chip.lanes, start, compact), prec)


def large_conv_seconds(prec: Prec = Prec.FP32, repeats: int = 3) -> dict:
    """Best time of a 1x256x56x56 -> 256, 3x3 pad 1 conv.normal (1.85 GMAC) on one Machine."""
    chip = load_chip("sg2260")
    m = Machine(chip, 64)
    n, c, h, w = 1, 256, 56, 56
    rng = np.random.default_rng(0)
    x = _local(chip, 0, (n, c, h, w), prec)
    wt = _local(chip, 64 * 1024, (1, c, 1, c * 9), prec, compact=True)
    res = _local(chip, 128 * 1024, (n, c, h, w), prec)
    m.write_local(x, rng.standard_normal(x.shape).astype(np.float32))
    m.write_local(wt, rng.standard_normal(wt.shape).astype(np.float32))
    ins = ConvTiu(res0_addr=res.addr, res0_n=n, res0_c=c, res0_h=h, res0_w=w, opd0_addr=x.addr, opd0_c=c, opd0_h=h,
                  opd0_w=w, opd1_addr=wt.addr, opd1_h=3, opd1_w=3, opd0_up_pad=1, opd0_dn_pad=1, opd0_lf_pad=1,
                  opd0_rt_pad=1, opt_res0_prec=prec, opt_opd0_prec=prec, opt_opd1_prec=prec)
    best = min(_timed(lambda: m.execute(ins, 1)) for _ in range(repeats))
    macs = n * c * h * w * c * 9
    return {"what": f"conv 1x256x56x56 3x3 -> 256 {prec.dtype_name}", "seconds": best, "gmacs_per_s": macs / best / 1e9}


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def pipeline_program(blocks: int) -> Program:
    """Per block: GDMA load (1x64x8x16), TIU add, TIU max, GDMA store; two LMEM buffers."""
    chip = load_chip("sg2260")
    shape = (1, 64, 8, 16)
    row = (64 * 128, 128, 16, 1)
    gdma, tiu = [], []
    for b in range(blocks):
        buf = _local(chip, (b % 2) * 0x4000, shape, Prec.FP32)
        out = _local(chip, 0x8000 + (b % 2) * 0x4000, shape, Prec.FP32)
        glob = buf.addr + chip.core.gdma_lmem_base_address
        load_dep = 2 * (b - 1) if b >= 2 else 0        # buffer free once block b-2's max has run
        gdma.append(_dma(0, glob, shape, row, buf.strides, cmd_id_dep=load_dep))
        tiu.append(ArTiu(op="add", res0_addr=out.addr, res0_n=1, res0_c=64, res0_h=8, res0_w=16, opd0_addr=buf.addr,
                         opd1_addr=buf.addr, cmd_id_dep=2 * b + 1))
        tiu.append(ArTiu(op="max", res0_addr=out.addr, res0_n=1, res0_c=64, res0_h=8, res0_w=16, opd0_addr=out.addr,
                         opd1_addr=0, opt_opd1_const=1))
        gdma.append(_dma(out.addr + chip.core.gdma_lmem_base_address, 0x10000, shape, out.strides, row,
                         cmd_id_dep=2 * b + 2))
    tensors = {"x": DdrTensor("x", 0, shape, "fp32", "input", 32768),
               "y": DdrTensor("y", 0x10000, shape, "fp32", "output", 32768)}
    return Program(chip=chip, tiu=tiu, gdma=gdma, memory=MemoryPlan(tensors=tensors, ddr_bytes_used=0x18000))


def _dma(src, dst, shape, src_strides, dst_strides, cmd_id_dep=0) -> TensorDma:
    return TensorDma(src_start_addr=src, dst_start_addr=dst,
                     **{f"src_{k}size": v for k, v in zip("nchw", shape)},
                     **{f"src_{k}stride": v for k, v in zip("nchw", src_strides)},
                     **{f"dst_{k}size": v for k, v in zip("nchw", shape)},
                     **{f"dst_{k}stride": v for k, v in zip("nchw", dst_strides)}, cmd_id_dep=cmd_id_dep)


def program_seconds(blocks: int = 12500) -> list[dict]:
    program = pipeline_program(blocks)
    x = np.random.default_rng(1).standard_normal((1, 64, 8, 16)).astype(np.float32)
    out = []
    for race_check in (False, True):
        seconds = _timed(lambda: run(program, {"x": x}, race_check=race_check))
        out.append({"what": f"{program.instruction_count} instructions, race_check={race_check}",
                    "seconds": seconds, "us_per_instruction": seconds / program.instruction_count * 1e6})
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--blocks", type=int, default=12500)
    args = parser.parse_args(argv)
    rows = [large_conv_seconds(Prec.FP32), large_conv_seconds(Prec.FP16), *program_seconds(args.blocks)]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            print("  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{v}" for k, v in r.items()))


if __name__ == "__main__":
    main()
