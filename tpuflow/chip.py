"""ChipConfig: every hardware parameter, frozen and validated, loaded from built-in or user TOML files."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
import types
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

from tpuflow.errors import ConfigError

DTYPES = ("int8", "fp16", "bf16", "fp32")
DTYPE_BYTES = {"int8": 1, "fp16": 2, "bf16": 2, "fp32": 4}
DEFAULT_CHIP = "sg2260"


def _positive(v: Any) -> bool:
    return v > 0


def _non_negative(v: Any) -> bool:
    return v >= 0


def _power_of_two(v: Any) -> bool:
    return isinstance(v, int) and v > 0 and v & (v - 1) == 0


def p(unit: str, doc: str, check=_positive, **extra):
    """A config parameter: its unit, a one-line meaning and a validity check (optionally a `source`
    and a `default` for keys added after user chip files were written)."""
    default = extra.pop("default", dataclasses.MISSING)
    return field(default=default, metadata={"unit": unit, "doc": doc, "check": check, **extra})


def per_dtype(unit: str, doc: str, check=_positive, **extra):
    default = extra.pop("default", None)
    if default is not None:
        return field(default_factory=lambda: types.MappingProxyType(dict(default)),
                     metadata={"unit": unit, "doc": doc, "check": check, "keys": DTYPES, **extra})
    return field(metadata={"unit": unit, "doc": doc, "check": check, "keys": DTYPES, **extra})


def _fraction(v: Any) -> bool:
    return 0 < v <= 1


@dataclass(frozen=True)
class CoreConfig:
    name: str = p("", "chip name", check=lambda v: bool(v))
    description: str = p("", "one-line description", check=lambda v: True)
    cores: int = p("cores", "cores on the chip")
    modelled_cores: int = p("cores", "cores the estimator models")
    lanes: int = p("lanes", "NPU lanes per core (NPU_NUM)", check=_power_of_two)
    lmem_bytes_per_lane: int = p("B", "local memory per lane", check=_power_of_two)
    lmem_banks: int = p("banks", "LMEM banks per lane", check=_power_of_two)
    lmem_align_bytes: int = p("B", "alignment of LMEM tensor addresses", check=_power_of_two)
    eu_bytes_per_lane: int = p("B", "vector EU width per lane", check=_power_of_two)
    ddr_bytes: int = p("B", "DDR capacity the compiler may place tensors in")
    ddr_align_bytes: int = p("B", "alignment of DDR tensor addresses", check=_power_of_two)
    gdma_lmem_base_address: int = p("address", "global address at which GDMA sees LMEM (tpuflow choice)")
    # Multi-core: LMEM (above) is private to each core; DDR (dram.chip_peak_gbps), the L2 SRAM and
    # the message queue are shared by all cores.
    l2_sram_bytes: int = p("B", "on-chip L2 SRAM shared by all cores (0: none)", check=_non_negative, default=0,
                           source="sg2260: tpu-mlir BM1690.h L2_SRAM_SIZE = 0x8000000; bm1684x: BM1684X.h 0x1FB000")
    l2_sram_gbps: float = p("GB/s", "L2 SRAM bandwidth shared by all cores (0: none)", check=_non_negative,
                            default=0.0, source="tpu-mlir 1.30.2 python/profile_helper/bm1690_defs.py 'L2 Max BW(GB/s)'")
    message_ids: int = p("ids", "cross-core message ids: entries of the chip-wide SEND/WAIT message queue",
                         check=_power_of_two, default=512,
                         source="tpu-mlir 1.30.2 python/debugger/target_2260/multi_core.py (512 x 14 bit msg queue)")
    message_latency_ns: float = p("ns", "from a SEND taking effect to a WAIT on another core seeing it",
                                  check=_non_negative, default=100.0,
                                  source="no public figure: tpuflow assumption, one fabric round trip (hardware.md)")


@dataclass(frozen=True)
class ClockConfig:
    tiu_clock_mhz: float = p("MHz", "TIU clock (tiu_clock_)")
    gdma_clock_mhz: float = p("MHz", "GDMA / LMEM clock (dma_clk_)")
    tile_clock_mhz: float = p("MHz", "tile-matmul CUBE clock")
    sys_clock_mhz: float = p("MHz", "IFE system clock (clk_i_)")
    ife_clock_mhz: float = p("MHz", "IFE clock (clk_ife_)")
    fabric_fast_clock_mhz: float = p("MHz", "WDC 1-to-2 fabric clock (clk2G_)")
    fabric_clock_mhz: float = p("MHz", "WDC fabric and CAM clock (clk800M_)")
    umc_clock_mhz: float = p("MHz", "UMC / DramUnit clock (clk400M_)")


@dataclass(frozen=True)
class ComputeConfig:
    cube_ic_per_cycle: Mapping[str, int] = per_dtype("channels/cycle", "input channels a lane's cube consumes per cycle")
    cube_ohow_per_cycle: Mapping[str, int] = per_dtype("pixels/cycle", "output pixels a lane's cube produces per cycle")
    tile_macs_per_cycle: Mapping[str, int] = per_dtype("MAC/cycle", "tile-matmul CUBE peak (16x16 output fractals)")
    cube_cycles_per_step: Mapping[str, int] = per_dtype(
        "cycles", "cycles the cube pipe spends on one (ic x ohow) step of CONV / MM2 (1 = the nominal peak)",
        default={d: 1 for d in DTYPES},
        source="1: TPUPerf CONV/MM2 formulas (hardware.md); bm1684x fp32 = 2: calibrated on ResNet-50 BM1684X fp32 "
               "silicon (sophon-demo ResNet README, 9.14 ms) against tpu-mlir's 1-cycle-per-step CONV cost "
               "(compiler_profile.txt, see benchmarks/vendor_profile.py)")


@dataclass(frozen=True)
class IfeConfig:
    cm_fifo_depth: int = p("entries", "CM_FIFO_LENGTH")
    predecode_fifo_depth: int = p("entries", "PRE_DECODE_OUTPUT_FIFO_LENGTH")
    async_input_fifo_depth: int = p("entries", "ASYNC_INPUT_FIFO_LENGTH")
    async_output_fifo_depth: int = p("entries", "ASYNC_OUTPUT_FIFO_LENGTH")
    decode_fifo_depth: int = p("entries", "decode_fifo_ depth")
    check_fifo_depth: int = p("entries", "check_fifo_ depth")
    tiu_request_fifo_depth: int = p("entries", "tiu_fifo_request_ depth")
    gdma_request_fifo_depth: int = p("entries", "gdma_fifo_request_ depth")
    tile_request_fifo_depth: int = p("entries", "tile request fifo depth (tpuflow: like the move fifo)")
    move_fifo_depth: int = p("entries", "MV_FIFO_REQ_LENGTH")
    target_pending_commands: int = p("commands", "tgt_cmd_max: commands in flight per engine target")
    tiu_cmd_fifo_bytes: int = p("B", "TIU_FIFO_LENGTH: TIU command list capacity")
    gdma_cmd_fifo_bytes: int = p("B", "GDMA_CMD_FIFO_LENGTH: GDMA command list capacity")
    tile_cmd_fifo_bytes: int = p("B", "TILE command list capacity")
    pack_cycles: int = p("cycles", "pack stage latency")
    decode_cycles: int = p("cycles", "decode stage latency")
    check_cycles: int = p("cycles", "dependency check stage latency")
    issue_cycles: int = p("cycles", "dispatch stage latency")
    txi_word_bits: int = p("bit", "instruction bits the TXI interface accepts per sys cycle")
    axi_instr_word_bits: int = p("bit", "AXI mode instruction granule (160-bit words)")
    axi_response_delay_cycles: int = p("cycles", "axi_slv_rsp_delay_")
    instr_fifo_depth: int = p("entries", "INSTR_FIFO_LENGTH")
    async_stage_cycles: int = p("cycles", "async_deal1 / async_deal2: cycles each side of the clk_i -> clk_ife crossing")
    transfer_cycles: int = p("cycles", "clk_ife cycles to hand one command to its engine (pe_ife_*_ini_ handshake)")


@dataclass(frozen=True)
class TiuConfig:
    vector_des_delay_cycles: int = p("cycles", "DPC_DES_DELAY_CYCLE")
    vector_des_buffer: int = p("entries", "DPC_DES_BUFFER_SIZE")
    vector_gen_delay_cycles: int = p("cycles", "DPC_GEN_DELAY_CYCLE")
    vector_gen_fifo_depth: int = p("entries", "address fifo depth per bus (GEN delay + 5)")
    vector_issue_delay_cycles: int = p("cycles", "DPC_ISSUE_DELAY_CYCLE")
    vector_issue_buffer: int = p("entries", "DPC_ISSUE_BUFFER_SIZE")
    vector_arb_flow_buffer: int = p("entries", "calculate_flow_buffer_ depth (16 bank flags each)")
    cube_des_delay_cycles: int = p("cycles", "cube DPC_DES delay")
    cube_gen_delay_cycles: int = p("cycles", "DPC_GEN_CUBE_DELAY_CYCLE")
    cube_issue_delay_cycles: int = p("cycles", "DPC_ISSUE_CUBE_DELAY_CYCLE")
    cube_issue_buffer: int = p("entries", "DPC_ISSUE_CUBE_BUFFER_SIZE")
    cube_arb_delay_cycles: int = p("cycles", "DPC_ARB_CUBE_DELAY_CYCLE")
    cube_arb_buffer: int = p("entries", "DPC_ARB_CUBE_BUFFER_SIZE")
    bank_conflict_bubble_cycles: int = p("cycles", "bubble per extra operand on a busy bank", check=_non_negative)
    psum_add_delay_cycles: int = p("cycles", "psum_add_delay_: extra cycles per cube output step when accumulating "
                                   "partial sums (opt_res_add)", check=_non_negative)
    startup_cycles: Mapping[str, int] = field(metadata={
        "unit": "cycles", "doc": "fixed instruction overhead by class (TPUPerf formulas)",
        "check": _non_negative,
        "keys": ("conv", "mm2_nn", "mm2_nt", "mm2_tt", "pord", "ar", "sfu", "lin", "cmp", "cwbc", "sys")})
    compute_latency_cycles: Mapping[str, int] = field(metadata={
        "unit": "cycles", "doc": "compute pipeline latency by 'tsk_typ.eu_typ' ('tsk_typ.*' = any eu_typ)",
        "check": _non_negative, "keys": None})
    mm_startup_cycles: int = p("cycles", "fixed overhead of mm.normal (MM v1, tpu-mlir's sMM; tpuflow only reads it)",
                               check=_non_negative, default=19,
                               source="hardware.md, TPUPerf MM v1: 19 + ceil(N/lanes)*ceil(W/eu)*K*M + 13")
    sg_startup_cycles: int = p("cycles", "fixed overhead of an SG gather (sg.pe_s_gather_*, SgTiu)", check=_non_negative,
                               default=11, source="tpu-mlir python/debugger/target_1688/opdef.py sg_op.initial_cycle "
                                                  "(11; its body: one element per lane and cycle)")

    def compute_latency(self, tsk_typ: int, eu_typ: int) -> int:
        table = self.compute_latency_cycles
        exact = table.get(f"{tsk_typ}.{eu_typ}")
        return exact if exact is not None else table.get(f"{tsk_typ}.*", 0)


@dataclass(frozen=True)
class GdmaConfig:
    outstanding_reads: int = p("requests", "rd_outstanding_")
    outstanding_writes: int = p("requests", "wr_outstanding_")
    bus_bytes: int = p("B/beat", "GDMA data bus width", check=_power_of_two)
    max_burst_beats: int = p("beats", "longest AXI burst", check=_power_of_two)
    lmem_access_latency_ns: float = p("ns", "LMEM access latency seen by GDMA")
    unaligned_penalty_cycles: int = p("cycles", "extra cycles for a burst not aligned to the bus", check=_non_negative)
    cmd_setup_cycles: int = p("cycles", "dispatch to first request of a command", check=_non_negative)
    segment_issue_cycles: int = p("cycles", "cycles to issue one burst request", check=_non_negative)
    s2l_gbps: float = p("GB/s", "DDR -> LMEM rate limit of one command (0: none, the memory path decides)",
                        check=_non_negative, default=0.0,
                        source="bm1684x: tpu-mlir profile helpers, DDR->LMEM 58 GB/s at 1 GHz")
    l2s_gbps: float = p("GB/s", "LMEM -> DDR rate limit of one command (0: none)", check=_non_negative, default=0.0,
                        source="bm1684x: tpu-mlir profile helpers, LMEM->DDR 44 GB/s at 1 GHz")
    s2s_gbps: float = p("GB/s", "DDR -> DDR rate limit of one command (0: none)", check=_non_negative, default=0.0,
                        source="bm1684x: tpu-mlir profile helpers, DDR->DDR 28 GB/s at 1 GHz")
    direction_efficiency: float = p(
        "", "fraction of the per-direction rate a long transfer sustains (DRAM efficiency)", check=_fraction,
        default=1.0, source="bm1684x: tpu-mlir 1.30.2 compiler_profile.txt, contiguous loads >= 64 KiB run at "
                            "54.02 B/cycle = 0.931 x 58, stores at 40.98 B/cycle = 0.931 x 44")
    min_run_bytes: int = p(
        "B", "least DDR-side bytes each contiguous run of a command is charged at its direction rate (0: its bytes)",
        check=_non_negative, default=0,
        source="bm1684x: tpu-mlir 1.30.2 compiler_profile.txt, S2L tensor loads with 96-256 B per-channel runs "
               "cost 4.74 cycles per run = 256 B at 54.02 B/cycle (benchmarks/results/vendor_profile.md)")
    element_load_run_bytes: int = p(
        "B", "DDR bytes a one-element run (e.g. one value per lane) read from DDR is charged at its direction rate "
             "(0: as min_run_bytes)", check=_non_negative, default=0,
        source="bm1684x: tpu-mlir 1.30.2 compiler_profile.txt, 372 S2L loads of one 2 or 4 B element per channel "
               "(1xCx1x1 constants) cost 18.95 cycles per channel = 1024 B at 54.02 B/cycle")
    element_store_run_bytes: int = p(
        "B", "DDR bytes a one-element run written to DDR is charged at its direction rate (0: as min_run_bytes)",
        check=_non_negative, default=0,
        source="bm1684x: tpu-mlir 1.30.2 compiler_profile.txt, L2S stores of 1xCx1x1 (ResNet-50 C = 2048 f32: "
               "25588 cycles, MobileNetV2 C = 1280 f16: 15992) cost 12.49 cycles per value = 512 B at 40.98 B/cycle")


@dataclass(frozen=True)
class WdcConfig:
    channels: int = p("channels", "DDR channels")
    umcs_per_channel: int = p("UMCs", "UMC / DramUnit instances per channel")
    interleave_bits: int = p("bit", "itlv_bit_: address interleave granule = 2**bits bytes")
    fab1t2_width_bits: int = p("bit", "AuxFab 1->2 width (clk2G_)")
    fabric_width_bits: int = p("bit", "ItlvDemux / fabric width (clk800M_)")
    private_fab_fanout: int = p("ports", "private AuxFab<1024,8> outputs")
    shared_fab1_fanout: int = p("ports", "shared_fab1 outputs")
    shared_fab1_outstanding: int = p("requests", "shared_fab1 rd/wr outstanding")
    shared_fab2_fanout: int = p("ports", "shared_fab2 outputs")
    shared_fab2_outstanding: int = p("requests", "shared_fab2 rd/wr outstanding")
    fab2t1_outstanding: int = p("requests", "Fab2t1 outstanding")
    fabric_hop_cycles: int = p("cycles", "latency of one fabric level (in its clock)")
    cam_table_entries: int = p("entries", "AuxCam read/write table size")
    x2x_slave_width_bits: int = p("bit", "X2x slave width (UMC side)")
    x2x_fifo_depth: int = p("entries", "X2x ar/r/aw/w fifo depth")
    x2x_b_fifo_depth: int = p("entries", "X2x b fifo depth")
    shared_region: bool = field(default=False, metadata={
        "unit": "", "doc": "route GDMA traffic through the shared fabric (else private)", "check": lambda v: True})


@dataclass(frozen=True)
class DramConfig:
    peak_gbps: float = p("GB/s", "DDR peak bandwidth per core (roofline and data-beat rate)")
    data_width_bytes: int = p("B", "DramUnit data width")
    page_bytes: int = p("B", "DRAM page (row) size", check=_power_of_two)
    open_page_ns: float = p("ns", "open_page_cycle_")
    read_close_page_ns: float = p("ns", "read_close_page_cycle_")
    write_close_page_ns: float = p("ns", "write_close_page_cycle_")
    min_read_to_write_ns: float = p("ns", "minimum_read_to_write_cycle_")
    min_write_to_read_ns: float = p("ns", "minimum_write_to_read_cycle_")
    min_read_ns: float = p("ns", "minimal_read_cycle_ (controller + PHY latency of a read)")
    banks_per_umc: int = p("banks", "DRAM banks a UMC keeps pages open in", check=_power_of_two)
    chip_peak_gbps: float = p("GB/s", "DDR bandwidth all cores together reach (shared UMCs); one core's port "
                              "reaches peak_gbps (0: cores x peak_gbps)", check=_non_negative, default=0.0,
                              source="sg2260: hardware.md WDC, 2 channels x 8 UMC x 256 bit x 400 MHz = 204.8 GB/s")


@dataclass(frozen=True)
class TileConfig:
    slot_bytes: int = p("B", "largest tile register; each slot is backed by this much LMEM in one lane",
                        check=_power_of_two)
    queue_slots: int = p("tiles", "entries per tile queue (T, U, M, N)")
    fractal_m: int = p("rows", "output fractal rows")
    fractal_n: int = p("cols", "output fractal columns")
    k_fractal_bytes: int = p("B", "S0: bytes of K per fractal")
    fill_latency_cycles: int = p("cycles", "pipeline fill of a TMATMUL / TGEMV", check=_non_negative)
    acccvt_bytes_per_cycle: int = p("B/cycle", "ACCCVT drain bandwidth")
    block_overhead_cycles: int = p("cycles", "decode and issue of one block", check=_non_negative)
    buffer_chunk_bytes: int = p(
        "B", "tile-buffer DMA port: GDMA moves tile-window bytes in chunks of this size and converts "
        "ND <-> Nz / Zn in flight, so a slot's element order costs nothing on its side (0: the window is "
        "plain LMEM, a strided element order costs its pieces)", check=_non_negative, default=256,
        source="LinxCore Janus design notes (issue 16): tile registers are a dedicated banked buffer, "
               "DMA transfers in 256-byte chunks with ND->Nz conversion in flight")
    move_port_bytes_per_cycle: int = p(
        "B/cycle", "tile buffer's own DMA port (TMOVE, tile clock): bytes a move puts through per cycle on its "
        "LMEM / tile side; 0: no port, tile fills and drains are GDMA commands", check=_non_negative, default=256,
        source="LinxCore Janus design notes (issue 16): wide ports from the tile buffer to the vector unit, the "
               "cube and the DMA engine, 256-byte chunks; tpuflow assumes one chunk per tile cycle")
    move_port_latency_cycles: int = p(
        "cycles", "fixed latency of one TMOVE (tile clock) without a DDR side: request, LMEM access and the "
        "chunk pipeline (a DDR side costs what a GDMA command would)", check=_non_negative, default=64,
        source="tpuflow assumption, of the order of gdma.lmem_access_latency plus a chunk pipeline fill")
    acc_buffers: int = p(
        "ACCs", "accumulators the cube works in: with 2 an ACCCVT drains one on its own path while the next "
        "TMATMUL starts a fresh one (the ISA still sees one ACC: TMATMUL without .ACC renames it); 1: ACCCVT "
        "drains the cube's only ACC and the next TMATMUL waits", default=1,
        source="Ascend A2 cube: L0C ping-pong, MMAD of the next block overlapping the L0C -> GM transfer of the "
               "last (catlass MmadAtlasA2Pingpong, ENABLE_UINT_FLAG); LinxCore Janus keeps the cube's ACC "
               "private (count not published)")
    acccvt_relu: bool = p(
        "flag", "ACCCVT can apply a Relu on the way out of the ACC (its relu field): a Relu-only epilogue costs no "
        "TIU pass", check=lambda v: isinstance(v, bool), default=True,
        source="Ascend Fixpipe pre-ReLU on the L0C drain (FixpipePreReluMode NORMAL_RELU, triton-ascend al.fixpipe); "
               "a tpuflow extension of LinxISA's ACCCVT (B.DATR bit 16)")
    img2col_bytes_per_cycle: int = p(
        "B/cycle", "TIMG2COL expansion path (tile clock): bytes of window tiles written per cycle from a halo tile "
        "in the tile buffer; 0: no expansion path (convolutions move their window tiles through the DMA port)",
        check=_non_negative, default=256,
        source="tpuflow assumption (issue 16): PTO-ISA's TIMG2COL and Ascend's Load3D (img2colv2_cbuf_to_ca, "
               "L1 -> L0A/L0B) name no throughput; one 256-byte chunk per cycle, the width of the buffer's ports "
               "(LinxCore Janus notes), on a path of its own like Ascend's MTE1 next to the MTE2 DMA")
    img2col_latency_cycles: int = p(
        "cycles", "fixed latency of one TIMG2COL (tile clock): halo read and window pipeline fill",
        check=_non_negative, default=32,
        source="tpuflow assumption: an on-chip buffer-to-buffer pass, half the DMA port's LMEM round trip "
               "(move_port_latency_cycles)")


@dataclass(frozen=True)
class DepConfig:
    chunk_count: int = p("chunks", "LMEM chunks of the dependency bitmaps", check=_power_of_two)
    chunk_lanes: int = p("lanes", "lanes per chunk (chunks tile lanes x per-lane offsets)", check=_power_of_two)
    tiu_dep_id_bits: int = p("bit", "usable bits of the TIU cmd_id_dep field")
    gdma_dep_id_bits: int = p("bit", "usable bits of the GDMA cmd_id_dep field")
    tile_dep_id_bits: int = p("bit", "bits of a TILE B.IOD wait id (tpuflow's B.IOD layout)")


SECTIONS = {
    "core": CoreConfig, "clocks": ClockConfig, "compute": ComputeConfig, "ife": IfeConfig,
    "tiu": TiuConfig, "gdma": GdmaConfig, "wdc": WdcConfig, "dram": DramConfig,
    "tile": TileConfig, "deps": DepConfig,
}


@dataclass(frozen=True)
class ChipConfig:
    core: CoreConfig
    clocks: ClockConfig
    compute: ComputeConfig
    ife: IfeConfig
    tiu: TiuConfig
    gdma: GdmaConfig
    wdc: WdcConfig
    dram: DramConfig
    tile: TileConfig
    deps: DepConfig
    source: str = field(default="", compare=False)

    # ---- derived quantities (never stored twice) ----
    @property
    def name(self) -> str:
        return self.core.name

    @property
    def lanes(self) -> int:
        return self.core.lanes

    @property
    def lmem_bytes_per_lane(self) -> int:
        return self.core.lmem_bytes_per_lane

    @property
    def lmem_bytes(self) -> int:
        return self.core.lanes * self.core.lmem_bytes_per_lane

    @property
    def bank_bytes(self) -> int:
        return self.core.lmem_bytes_per_lane // self.core.lmem_banks

    def eu_count(self, dtype: str) -> int:
        """Vector EU elements per lane per cycle for a dtype (64 B: 16 fp32, 32 fp16, 64 int8)."""
        return self.core.eu_bytes_per_lane // DTYPE_BYTES[dtype]

    @property
    def umc_count(self) -> int:
        return self.wdc.channels * self.wdc.umcs_per_channel

    TILE_QUEUES = ("T", "U", "M", "N")

    @property
    def tile_window_bytes_per_lane(self) -> int:
        """LMEM reserved at the top of every lane for the tile registers (4 queues x slots)."""
        slots = len(self.TILE_QUEUES) * self.tile.queue_slots
        return self.tile.slot_bytes * -(-slots // self.core.lanes)

    @property
    def tile_window_offset(self) -> int:
        """Per-lane offset where the tile-register window starts."""
        return self.core.lmem_bytes_per_lane - self.tile_window_bytes_per_lane

    def tile_slot_address(self, queue: int, slot: int) -> int:
        """Flat LMEM address of tile slot `slot` of queue `queue`: slots are spread over lanes."""
        index = queue * self.tile.queue_slots + slot
        lane, depth = index % self.core.lanes, index // self.core.lanes
        return lane * self.core.lmem_bytes_per_lane + self.tile_window_offset + depth * self.tile.slot_bytes

    def in_tile_buffer(self, lmem_offset: int) -> bool:
        """Whether a flat LMEM address lies in the tile window and is reached through the tile
        buffer's DMA port (tile.buffer_chunk_bytes > 0)."""
        return self.tile.buffer_chunk_bytes > 0 and lmem_offset % self.core.lmem_bytes_per_lane >= self.tile_window_offset

    @property
    def chunk_bytes_per_lane(self) -> int:
        groups = self.core.lanes // self.deps.chunk_lanes
        return self.core.lmem_bytes_per_lane * groups // self.deps.chunk_count

    def peak_macs_per_cycle(self, dtype: str, engine: str = "tiu") -> int:
        if engine == "tile":
            return self.compute.tile_macs_per_cycle[dtype]
        c = self.compute
        return self.core.lanes * c.cube_ic_per_cycle[dtype] * c.cube_ohow_per_cycle[dtype]

    def peak_macs_per_second(self, dtype: str, engine: str = "tiu") -> float:
        clock = self.clocks.tile_clock_mhz if engine == "tile" else self.clocks.tiu_clock_mhz
        return self.peak_macs_per_cycle(dtype, engine) * clock * 1e6

    @property
    def ddr_peak_bytes_per_second(self) -> float:
        """One core's DDR port."""
        return self.dram.peak_gbps * 1e9

    @property
    def ddr_chip_peak_bytes_per_second(self) -> float:
        """DDR bandwidth all cores share (dram.chip_peak_gbps, or cores x one port when it is 0)."""
        return (self.dram.chip_peak_gbps or self.dram.peak_gbps * self.core.cores) * 1e9

    def check_cores(self, cores: int) -> None:
        """A program on `cores` cores fits this chip (ConfigError naming core.cores otherwise)."""
        if not 1 <= cores <= self.core.cores:
            raise ConfigError(f"chip {self.core.name}: --cores {cores} is not within 1..{self.core.cores} "
                              f"(key 'core.cores')")

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for sec in SECTIONS:
            obj = getattr(self, sec)
            out[sec] = {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        return out

    def fingerprint(self) -> str:
        """Stable hash of the effective configuration (independent of where it was loaded from)."""
        blob = json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def describe(self) -> list[tuple[str, str, str, str]]:
        """(key, value, unit, meaning) rows for `tpuflow chips NAME`."""
        rows = []
        for sec in SECTIONS:
            obj = getattr(self, sec)
            for f in dataclasses.fields(obj):
                v = getattr(obj, f.name)
                unit, doc = f.metadata.get("unit", ""), f.metadata.get("doc", "")
                if isinstance(v, Mapping):
                    rows += [(f"{sec}.{f.name}.{k}", str(x), unit, doc) for k, x in v.items()]
                else:
                    rows.append((f"{sec}.{f.name}", hex(v) if f.name.endswith("address") else str(v), unit, doc))
        return rows


def _plain(v: Any) -> Any:
    return dict(sorted(v.items())) if isinstance(v, Mapping) else v


# ---------------------------------------------------------------- loading

def builtin_chip_names() -> list[str]:
    folder = resources.files("tpuflow.hwmodel") / "chips"
    return sorted(Path(str(e)).stem for e in folder.iterdir() if str(e).endswith(".toml"))


def read_toml(path: Path, label: str, kind: str = "chip file", error: type = ConfigError) -> dict:
    """The TOML table in `path`; one `error` naming the `kind` of file and its `label` otherwise."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise error(f"{kind} {label}: not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{kind} {label}: not valid TOML: {exc}") from None
    except OSError as exc:
        raise error(f"{kind} {label}: cannot read: {exc.strerror}") from None


def _builtin_path(name: str) -> Path:
    folder = resources.files("tpuflow.hwmodel") / "chips"
    path = Path(str(folder / f"{name}.toml"))
    if not path.exists():
        raise ConfigError(f"unknown chip '{name}' (built-in chips: {', '.join(builtin_chip_names())})")
    return path


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _resolve(raw: dict, label: str, seen: tuple[str, ...] = ()) -> dict:
    base = raw.pop("base", None)
    if base is None:
        return raw
    if not isinstance(base, str):
        raise ConfigError(f"chip file {label}: key 'base' must be the name of a built-in chip")
    if base in seen:
        raise ConfigError(f"chip file {label}: 'base' chain loops through '{base}'")
    parent = _resolve(read_toml(_builtin_path(base), base), base, seen + (base,))
    return _merge(parent, _own_identity(raw, base, label))


def _own_identity(raw: dict, base: str, label: str) -> dict:
    """A file built on `base` is not `base`: unless it says otherwise, its name is the file's stem and
    its description says what it changes, so outputs never show the base chip's name for it."""
    changed = sorted(f"{sec}.{k} = {v}" for sec, table in raw.items() if isinstance(table, dict)
                     for k, v in table.items() if (sec, k) not in (("core", "name"), ("core", "description")))
    shown = ", ".join(changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")
    core = dict(raw.get("core", {}))
    core.setdefault("name", Path(label).stem or label)
    core.setdefault("description", f"{base} with {shown or 'no changes'} (from {Path(label).name})")
    return {**raw, "core": core}


def _check_value(key: str, f: dataclasses.Field, value: Any, label: str) -> Any:
    hint = f.type if not isinstance(f.type, str) else _TYPE_NAMES[f.type]
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"chip file {label}: key '{key}' must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"chip file {label}: key '{key}' must be an integer, got {value!r}")
    elif hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"chip file {label}: key '{key}' must be a number, got {value!r}")
        value = float(value)
    elif hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"chip file {label}: key '{key}' must be a string, got {value!r}")
    else:  # Mapping[str, int]
        return _check_table(key, f, value, label)
    if not f.metadata["check"](value):
        raise ConfigError(f"chip file {label}: key '{key}' has an impossible value {value!r}")
    return value


def _check_table(key: str, f: dataclasses.Field, value: Any, label: str) -> Mapping[str, int]:
    if not isinstance(value, dict):
        raise ConfigError(f"chip file {label}: key '{key}' must be a table")
    keys = f.metadata.get("keys")
    if keys is not None:
        missing = [k for k in keys if k not in value]
        extra = [k for k in value if k not in keys]
        if extra:
            raise ConfigError(f"chip file {label}: unknown key '{key}.{extra[0]}'")
        if missing:
            raise ConfigError(f"chip file {label}: missing key '{key}.{missing[0]}'")
    for k, v in value.items():
        if isinstance(v, bool) or not isinstance(v, int) or not f.metadata["check"](v):
            raise ConfigError(f"chip file {label}: key '{key}.{k}' must be a valid integer, got {v!r}")
    return types.MappingProxyType(dict(sorted(value.items())))


_TYPE_NAMES = {"int": int, "float": float, "str": str, "bool": bool,
               "Mapping[str, int]": Mapping}


def _build_section(sec: str, cls: type, raw: Any, label: str):
    if not isinstance(raw, dict):
        raise ConfigError(f"chip file {label}: '{sec}' must be a table")
    known = {f.name: f for f in dataclasses.fields(cls)}
    for k in raw:
        if k not in known:
            raise ConfigError(f"chip file {label}: unknown key '{sec}.{k}'")
    values = {}
    for name, f in known.items():
        if name not in raw:
            if f.default is not dataclasses.MISSING:
                continue
            raise ConfigError(f"chip file {label}: missing key '{sec}.{name}'")
        values[name] = _check_value(f"{sec}.{name}", f, raw[name], label)
    return cls(**values)


def _cross_check(chip: ChipConfig, label: str) -> None:
    c = chip.core

    def need(ok: bool, key: str, why: str) -> None:
        if not ok:
            raise ConfigError(f"chip file {label}: key '{key}' is impossible: {why}")

    need(c.modelled_cores <= c.cores, "core.modelled_cores", "more than core.cores")
    need(chip.dram.chip_peak_gbps == 0 or chip.dram.chip_peak_gbps >= chip.dram.peak_gbps, "dram.chip_peak_gbps",
         "less than one core's dram.peak_gbps")
    need(c.lmem_bytes_per_lane % c.lmem_banks == 0, "core.lmem_banks", "must divide lmem_bytes_per_lane")
    need(c.eu_bytes_per_lane >= 4, "core.eu_bytes_per_lane", "must hold at least one fp32")
    need(chip.tile_window_bytes_per_lane <= c.lmem_bytes_per_lane // 2, "tile.slot_bytes",
         "the tile-register window would take more than half of each lane")
    need(chip.deps.chunk_lanes <= c.lanes, "deps.chunk_lanes", "more than core.lanes")
    groups = c.lanes // chip.deps.chunk_lanes
    need(chip.deps.chunk_count % groups == 0 and chip.deps.chunk_count // groups <= c.lmem_bytes_per_lane,
         "deps.chunk_count", "must be a multiple of the lane groups")
    need(chip.tile.k_fractal_bytes % 4 == 0, "tile.k_fractal_bytes", "must hold whole fp32 elements")
    need(c.ddr_bytes < c.gdma_lmem_base_address, "core.gdma_lmem_base_address", "overlaps DDR")
    need(chip.deps.gdma_dep_id_bits <= 17, "deps.gdma_dep_id_bits", "the GDMA field has 17 bits")
    need(chip.deps.tiu_dep_id_bits <= 24, "deps.tiu_dep_id_bits", "the TIU field has 24 bits")
    need(chip.deps.tile_dep_id_bits <= 20, "deps.tile_dep_id_bits", "a B.IOD wait id has 20 bits")


def chip_from_dict(raw: dict, label: str = "<dict>") -> ChipConfig:
    raw = _resolve(dict(raw), label)
    for k in raw:
        if k not in SECTIONS:
            raise ConfigError(f"chip file {label}: unknown key '{k}'")
    sections = {sec: _build_section(sec, cls, raw.get(sec, None) if sec in raw else _missing(sec, label), label)
                for sec, cls in SECTIONS.items()}
    chip = ChipConfig(**sections, source=label)
    _cross_check(chip, label)
    return chip


def _missing(sec: str, label: str):
    raise ConfigError(f"chip file {label}: missing table '[{sec}]'")


def load_chip(name_or_path: str | Path | None = None) -> ChipConfig:
    """A built-in chip by name, or a user TOML file (which may start from `base = "<builtin>"`)."""
    spec = str(name_or_path) if name_or_path is not None else DEFAULT_CHIP
    if spec.endswith(".toml") or "/" in spec or Path(spec).is_file():
        path = Path(spec)
        return _cached(str(path.resolve()), path.stat().st_mtime_ns if path.exists() else 0, str(path))
    return _cached_builtin(spec)


_CACHE: dict[tuple, ChipConfig] = {}


def _cached(resolved: str, mtime: int, label: str) -> ChipConfig:
    key = (resolved, mtime)
    if key not in _CACHE:
        _CACHE[key] = chip_from_dict(read_toml(Path(resolved), label), label)
    return _CACHE[key]


def _cached_builtin(name: str) -> ChipConfig:
    key = ("builtin", name)
    if key not in _CACHE:
        _CACHE[key] = chip_from_dict(read_toml(_builtin_path(name), name), name)
    return _CACHE[key]


def replace_param(chip: ChipConfig, key: str, value: Any) -> ChipConfig:
    """A copy of `chip` with one 'section.name' parameter changed (validated like a file)."""
    raw = chip.as_dict()
    sec, _, name = key.partition(".")
    if sec not in raw or name not in raw[sec]:
        raise ConfigError(f"unknown chip key '{key}'")
    raw[sec][name] = value
    return chip_from_dict(raw, f"{chip.source}+{key}")

