"""Size in bits of each instruction's encoded descriptor: TXI transfer cycles and command-FIFO bytes.

Lengths are the long-form layouts of the SG2260 register table (codegen/tables/sg2260_regs.json,
tpu-mlir 1.30.2's bm1690 lengths): TIU 1024 bit (SYS 128 bit), GDMA 768 bit (sDMA_sys 128 bit). The
model assumes the long form (the codegen may pick a shorter one; this overestimates FIFO use by
at most 4x for TIU). TILE blocks are LinxISA 32-bit words (lingxi.md): BSTART.CUBE, one B.DIM per
dimension, the B.IOT operand words, B.DATR for ACCCVT and one B.IOD when the block waits; a TMOVE
carries a GDMA descriptor, 24 bits per word.
"""

from __future__ import annotations

from tpuflow.isa import (AccCvt, DmaInstruction, Instruction, SysDma, SysTiu, TImg2Col, TiuInstruction, TMatmul,
                         TMove)

TIU_LONG_BITS = 1024
TIU_SYS_BITS = 128
GDMA_BITS = 768
GDMA_SYS_BITS = 128
TILE_WORD_BITS = 32


def tile_block_words(instr: Instruction) -> int:
    waits = 1 if any(instr.waits()) else 0
    if isinstance(instr, TMatmul):
        return 1 + 3 + 1 + (1 if instr.bias_src >= 0 else 0) + waits
    if isinstance(instr, AccCvt):
        return 1 + 2 + 1 + 1 + waits
    if isinstance(instr, TMove):     # BSTART, B.DIM (length), the long GDMA descriptor in B.DESC words
        return 1 + 1 + -(-GDMA_BITS // 24) + waits
    if isinstance(instr, TImg2Col):  # BSTART, B.DIM (length), its parameter bytes in B.DESC words
        return 1 + 1 + -(-TImg2Col.PARAM_BYTES // 3) + waits
    return 1 + 1 + waits  # TPUSH: BSTART + a no-input B.IOT


def descriptor_bits(instr: Instruction) -> int:
    if isinstance(instr, SysTiu):
        return TIU_SYS_BITS
    if isinstance(instr, TiuInstruction):
        return TIU_LONG_BITS
    if isinstance(instr, SysDma):
        return GDMA_SYS_BITS
    if isinstance(instr, DmaInstruction):
        return GDMA_BITS
    return TILE_WORD_BITS * tile_block_words(instr)
