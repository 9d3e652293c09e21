"""TILE engine instructions: LinxISA v0.56 CUBE blocks, plus tpuflow's TPUSH, and tile queues.

Tile registers (tpuflow's design, documented here once):

* Four queues T, U, M, N (codes 0-3) of `chip.tile.queue_slots` entries each. Slot s of queue q
  is backed by `chip.tile.slot_bytes` of LMEM at `chip.tile_slot_address(q, s)`: the slots are
  spread one per lane at the top of every lane (the tile window), so GDMA and TIU reach them as
  ordinary LMEM and the chunk bitmaps see each slot separately.
* Backing (issue 16): the window is the tile buffer. Its bytes stay LMEM addresses (one slot per
  lane), so the chunk bitmaps, the functional model and the encodings are unchanged, but GDMA
  reaches it through the buffer's own DMA port (`chip.tile.buffer_chunk_bytes`, 256 B): the port
  takes a command's slot side as one stream of chunks and converts ND / DN -> Nz / Zn in flight
  (LinxCore's design), so a fill that walks its DDR source row by row and scatters into fractal
  order costs its DDR runs and its bytes, not one LMEM piece per K0 elements. A command may fill
  several neighbouring slots (c walks the lanes): one DMA per K panel of a runtime operand.
  Chosen over striping a slot across lanes: the TIU never reads slots in place (results leave
  through a copy), striping would cut every fill into 64 per-lane segments, and the dependency
  contract (tile registers are LMEM-backed, one chunk bitmap) stays as it is. `buffer_chunk_bytes
  = 0` models a plain LMEM window (fills pay their LMEM pieces; the lowering then walks in slot
  order). Double buffering: a queue's 16 slots rotate, so the next K panel loads into the next
  slots while the TILE engine reads the current ones (TPUSH waits for its own fill only).
* A push onto queue q lands in slot (pushes_so_far(q) % queue_slots). Operand code c names
  queue c // 16 at distance c % 16 + 1 (T#1 = the newest T tile). Pushes come from ACCCVT
  (ACC -> tile) and from TPUSH.
* TPUSH (BSTART.CUBE function 31, a tpuflow extension: LinxISA v0.56 reaches tile registers
  from memory blocks we do not model) declares that GDMA has written the next slot of a queue;
  it is how tiles loaded by GDMA enter the queue order, and it is where the TILE engine waits
  for that load.
* TMOVE (BSTART.CUBE function 30, a tpuflow extension next to TPUSH): the tile buffer's own DMA
  port (issue 16; LinxCore Janus: the tile registers are a banked buffer with wide ports to the
  vector unit, the cube and the DMA engine). It carries one dma.tensor descriptor (`desc`, the
  GDMA's semantics: elements taken in src (n,c,h,w) order, placed in dst order) and moves it on
  the TILE engine instead of the GDMA queue. The compiler uses it only with one side in the tile
  window: LMEM -> slots (runtime A operands a layer group keeps in LMEM, staged constants), slots
  -> LMEM (results), and the weight image -> slots (constants, read-only: nothing writes them, so
  no DDR hazard needs a wait). The port runs its moves in order, asynchronously: the engine goes
  on with the next block, which waits only for moves whose LMEM bytes it touches (in TPUSH's
  case, the slots being pushed). TMOVE neither pushes nor releases a tile.
* TIMG2COL (BSTART.CUBE function 29, a tpuflow extension after PTO-ISA's TIMG2COL / Ascend's
  Load3D, issue 16): expands a C0-blocked halo tile held in the tile buffer into the B tiles of a
  convolution's implicit GEMM on chip, so the input crosses the DMA port once per halo tile instead
  of once per kernel tap. Like TMOVE it names LMEM addresses in the tile window (src: the halo, dst:
  the first slot it fills), runs on its own unit (the tile buffer's expansion path) and pushes
  nothing (a TPUSH makes the filled slots tiles). Semantics in TImg2Col's docstring.
* Synchronisation: a block waits until tiu_sync_id >= wait_tiu_id and tdma_sync_id >=
  wait_gdma_id (encoded as B.IOD words). TIU and GDMA wait for TILE block k with an explicit
  SYS wait (system.wait_msg / dma.sys.sys_wait tagged TILE_WAIT_TAG, operand k).

In-slot layouts (element offsets; c0 = r0 = k_fractal_bytes / element bytes, padded shapes):
A tiles are Nz: off(i,j) = (j//c0)*Mp*c0 + i*c0 + j%c0 (Mp = M rounded up to fractal_m,
K rounded up to c0). B tiles are Zn: off(i,j) = (i//r0)*Np*r0 + j*r0 + i%r0 (Np = N rounded up
to fractal_n). A bias tile is a 1 x N fp32 row. ACC holds fp32 16 x 16 fractals in Nz order.
ACCCVT writes NZ2ND as a row-major Row x Col matrix, NZ2DN column-major, NORM keeps Nz fp32
fractals (`.canon`: Nz with c0 of the destination type, so the result is an A operand again).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Iterable

from tpuflow.isa.base import Accesses, Engine, Instruction, LmemRange

if TYPE_CHECKING:
    from tpuflow.chip import ChipConfig
    from tpuflow.isa.gdma import TensorDma

QUEUES = ("T", "U", "M", "N")
NO_QUEUE = 7
DT_CODES = {"FP32": 1, "FP16": 4, "BF16": 5, "S8": 19, "S32": 17}
DT_BYTES = {"FP32": 4, "FP16": 2, "BF16": 2, "S8": 1, "S32": 4}
LAYOUT_CODES = {"NORM": 0, "NZ2ND": 27, "NZ2DN": 28}
ROUND_MODES = {"none": 0, "RNE": 1, "RTZ": 2, "RDN": 3, "RUP": 4, "RNA": 5}


def tile_ref(queue: str, distance: int) -> int:
    """Operand code of `queue#distance` (T#1 = 0, U#1 = 16, ...)."""
    if not 1 <= distance <= 16:
        raise ValueError(f"tile distance {distance} out of 1..16")
    return QUEUES.index(queue) * 16 + distance - 1


def ref_name(code: int) -> str:
    return f"{QUEUES[code // 16]}#{code % 16 + 1}"


def size_code(nbytes: int) -> int:
    """B.IOT size field: smallest s >= 1 with 16 * 2**s >= nbytes."""
    s = 1
    while 16 << s < nbytes:
        s += 1
    return s


def size_bytes(code: int) -> int:
    return 16 << code if code else 0


def size_text(code: int) -> str:
    b = size_bytes(code)
    return f"{b // 1024}KB" if b >= 1024 else f"{b}B"


class TileInstruction(Instruction):
    ENGINE: ClassVar[Engine] = Engine.TILE
    WAIT_FIELDS: ClassVar[dict] = {Engine.TIU: "wait_tiu_id", Engine.GDMA: "wait_gdma_id"}
    FN: ClassVar[dict[str, int]]

    def sources(self) -> tuple[int, ...]:
        """Operand codes read (relative to the queue state before this block)."""
        return ()

    def released(self) -> tuple[int, ...]:
        """Operand codes whose tiles are released when the block commits (sources without .reuse)."""
        return ()

    def push_queue(self) -> int | None:
        return None

    def push_count(self) -> int:
        """Slots pushed onto push_queue() (1 unless a TPUSH says more)."""
        return 1

    def accesses(self, chip: "ChipConfig") -> Accesses:
        raise TypeError("TILE operands are queue-relative: use TileQueues.accesses(instr, chip)")


@dataclass(frozen=True)
class TMatmul(TileInstruction):
    """TMATMUL[.BIAS|.ACC] and TGEMV[.BIAS|.ACC]: ACC (=|+=) A(M x K) . B(K x N) (+ bias 1 x N).
    TGEMV uses only A's first row (M = 1). Inputs are converted to fp32 (int32 for integers) and
    accumulated in increasing k. `acc_size` is the B.IOT size code of the ACC result. `acc` (tpuflow's
    additive field, issue 16; Ascend A2's L0C ping-pong) names which of the chip's tile.acc_buffers
    accumulators the block works in: 0 is v0.56's implicit ACC, so two output tiles can accumulate
    interleaved and share each A tile (read with .reuse by the first, released by the second)."""

    FN: ClassVar[dict] = {"TMATMUL": 0, "TMATMUL.BIAS": 1, "TMATMUL.ACC": 2,
                          "TGEMV": 16, "TGEMV.BIAS": 17, "TGEMV.ACC": 18}
    fn: str
    dt: str
    m: int
    n: int
    k: int
    src0: int
    src1: int
    acc_size: int
    bias_src: int = -1
    reuse0: int = 0
    reuse1: int = 0
    wait_tiu_id: int = 0
    wait_gdma_id: int = 0
    acc: int = 0

    def __post_init__(self) -> None:
        if self.fn not in self.FN or self.dt not in DT_CODES:
            raise ValueError(f"TMatmul: bad fn/dt {self.fn!r}/{self.dt!r}")
        if self.fn.endswith(".BIAS") != (self.bias_src >= 0):
            raise ValueError("TMatmul: .BIAS needs bias_src and only .BIAS has one")

    @property
    def op_name(self) -> str:
        return self.fn

    @property
    def accumulates(self) -> bool:
        return self.fn.endswith(".ACC")

    @property
    def is_gemv(self) -> bool:
        return self.fn.startswith("TGEMV")

    def sources(self):
        return (self.src0, self.src1) + ((self.bias_src,) if self.bias_src >= 0 else ())

    def released(self):
        out = [c for c, r in ((self.src0, self.reuse0), (self.src1, self.reuse1)) if not r]
        if self.bias_src >= 0:
            out.append(self.bias_src)
        return tuple(out)


@dataclass(frozen=True)
class AccCvt(TileInstruction):
    """ACCCVT <layout>: ACC (Row x Col, fp32) -> a new tile pushed on `dst_queue`, converted to
    `dst_dt` (round to nearest even unless round_mode says otherwise; "none" = nearest even).
    Releases the ACC. src_dt names the ACC's type: FP32, or S32 after an integer matmul. `relu`
    (tpuflow's additive field, issue 16; Ascend's Fixpipe pre-ReLU on the L0C drain): negative values
    become 0 before the conversion. `acc`: which accumulator it drains and releases (see TMatmul.acc)."""

    FN: ClassVar[dict] = {"ACCCVT": 8}
    layout: str
    row: int
    col: int
    dst_queue: int
    dst_size: int
    src_dt: str = "FP32"
    dst_dt: str = "FP32"
    canon: int = 0
    round_mode: str = "RNE"
    saturate: int = 0
    wait_tiu_id: int = 0
    wait_gdma_id: int = 0
    relu: int = 0
    acc: int = 0

    def __post_init__(self) -> None:
        if self.layout not in LAYOUT_CODES or self.dst_dt not in DT_CODES or self.src_dt not in DT_CODES:
            raise ValueError(f"AccCvt: bad layout/dtype {self.layout!r}/{self.dst_dt!r}")
        if not 0 <= self.dst_queue < 4:
            raise ValueError("AccCvt: dst_queue must be 0..3 (T, U, M, N)")

    @property
    def op_name(self) -> str:
        return "ACCCVT"

    def push_queue(self):
        return self.dst_queue


@dataclass(frozen=True)
class TPush(TileInstruction):
    """TPUSH (tpuflow extension, function 31): the next `count` slots of `dst_queue`, already
    written (by GDMA or a TIU copy), become the queue's newest tiles of `dst_size` each, in slot
    order (the last one is #1). `count` (B.DIM LB0, default 1) is tpuflow's additive field: one
    block for a batch of tiles filled by one DMA."""

    FN: ClassVar[dict] = {"TPUSH": 31}
    dst_queue: int
    dst_size: int
    dt: str = "FP32"
    wait_tiu_id: int = 0
    wait_gdma_id: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.dst_queue < 4 or self.dt not in DT_CODES:
            raise ValueError("TPush: dst_queue must be 0..3 and dt a LinxISA type")
        if not 1 <= self.count <= 16:
            raise ValueError("TPush: count must be 1..16 (a queue's depth)")

    def push_count(self) -> int:
        return self.count

    @property
    def op_name(self) -> str:
        return "TPUSH"

    def push_queue(self):
        return self.dst_queue


@dataclass(frozen=True)
class TMove(TileInstruction):
    """TMOVE (tpuflow extension, function 30): `desc` (a dma.tensor, cmd_id_dep 0) moved by the tile
    buffer's DMA port: its LMEM and DDR ranges are desc's. Pushes nothing (a TPUSH makes filled
    slots tiles); the block is done when the move has landed."""

    FN: ClassVar[dict] = {"TMOVE": 30}
    desc: "TensorDma"
    wait_tiu_id: int = 0
    wait_gdma_id: int = 0

    def __post_init__(self) -> None:
        from tpuflow.isa.gdma import TensorDma
        if not isinstance(self.desc, TensorDma) or self.desc.cmd_id_dep or self.desc.op != "tensor":
            raise ValueError("TMove: desc must be a plain dma.tensor with cmd_id_dep 0")

    @property
    def op_name(self) -> str:
        return "TMOVE"

    @property
    def dt(self) -> str:
        from tpuflow.isa.base import Prec
        return {Prec.FP32: "FP32", Prec.FP16: "FP16", Prec.BF16: "BF16", Prec.INT8: "S8",
                Prec.INT32: "S32"}.get(Prec(self.desc.src_data_format), "FP32")

    def accesses(self, chip: "ChipConfig") -> Accesses:
        return self.desc.accesses(chip)

    move_accesses = accesses


@dataclass(frozen=True)
class TImg2Col(TileInstruction):
    """TIMG2COL (tpuflow extension, function 29): the window matrix of a convolution over a halo tile,
    written as Zn B tiles (tpuflow.isa.tile in-slot layouts) into `tiles` neighbouring slots.

    The halo at flat LMEM address `src_addr` (one lane) holds c1 channel blocks of in_w x in_h pixels
    of c0 = k_fractal_bytes / element bytes channels, element (b, x, y, c) at offset
    ((b * in_w + x) * in_h + y) * c0 + c (C0-blocked, pixels column-major: the order a tile-buffer
    move of a pixel-major LMEM image (columns on lanes) writes in one descriptor). Padding is part of
    the halo (zeros the image already holds). The window matrix P^T has K rows in
    (channel block, kernel row, kernel column, c) order (Ascend Load3D's K = C1 * kh * kw * C0) and
    N = out_h * out_w columns (output pixels row-major):
        P^T[((b * kh + i) * kw + j) * c0 + c, r * out_w + q] = halo[b, q*sx + j*dx, r*sy + i*dy, c].
    Rows [k_start * c0, (k_start + k_count) * c0) are cut into `tiles` tiles of k_count / tiles
    blocks; tile t is written at dst_addr + t * lmem_bytes_per_lane (the next lane: the next slot of a
    queue) as a Zn B tile of N padded to fractal_n. Pushes nothing."""

    FN: ClassVar[dict] = {"TIMG2COL": 29}
    # its parameters as encoded (codegen.linx: B.DESC bytes, little-endian), in this order
    PARAMS: ClassVar[tuple[tuple[str, str], ...]] = (
        ("src_addr", "I"), ("dst_addr", "I"), ("c1", "H"), ("in_h", "H"), ("in_w", "H"), ("out_h", "H"),
        ("out_w", "H"), ("k_start", "H"), ("k_count", "H"), ("tiles", "B"), ("kh", "B"), ("kw", "B"), ("sy", "B"),
        ("sx", "B"), ("dy", "B"), ("dx", "B"))
    PARAM_BYTES: ClassVar[int] = 29
    dt: str
    src_addr: int
    dst_addr: int
    c1: int
    in_h: int
    in_w: int
    kh: int
    kw: int
    out_h: int
    out_w: int
    k_start: int
    k_count: int
    tiles: int = 1
    sy: int = 1
    sx: int = 1
    dy: int = 1
    dx: int = 1
    wait_tiu_id: int = 0
    wait_gdma_id: int = 0

    def __post_init__(self) -> None:
        if self.dt not in DT_CODES:
            raise ValueError(f"TImg2Col: bad dt {self.dt!r}")
        if min(self.c1, self.in_h, self.in_w, self.kh, self.kw, self.out_h, self.out_w, self.k_count, self.tiles,
               self.sy, self.sx, self.dy, self.dx) < 1 or self.k_start < 0:
            raise ValueError("TImg2Col: sizes, strides and dilations must be >= 1, k_start >= 0")
        if (self.out_h - 1) * self.sy + (self.kh - 1) * self.dy >= self.in_h or \
                (self.out_w - 1) * self.sx + (self.kw - 1) * self.dx >= self.in_w:
            raise ValueError("TImg2Col: the windows reach beyond the halo")
        if self.k_count % self.tiles or self.k_start + self.k_count > self.c1 * self.kh * self.kw:
            raise ValueError("TImg2Col: k_count must split into `tiles` equal tiles inside c1 * kh * kw blocks")

    @property
    def op_name(self) -> str:
        return "TIMG2COL"

    def c0(self, chip: "ChipConfig") -> int:
        return chip.tile.k_fractal_bytes // DT_BYTES[self.dt]

    def tile_bytes(self, chip: "ChipConfig") -> int:
        """Bytes of one written tile (its K blocks x N padded to fractal_n)."""
        n_pad = -(-self.out_h * self.out_w // chip.tile.fractal_n) * chip.tile.fractal_n
        return self.k_count // self.tiles * self.c0(chip) * n_pad * DT_BYTES[self.dt]

    def halo_bytes(self, chip: "ChipConfig") -> int:
        return self.c1 * self.in_h * self.in_w * self.c0(chip) * DT_BYTES[self.dt]

    def accesses(self, chip: "ChipConfig") -> Accesses:
        per_lane = chip.lmem_bytes_per_lane

        def rng(addr: int, nbytes: int) -> LmemRange:
            lane, off = divmod(addr, per_lane)
            if off + nbytes > per_lane:
                raise ValueError(f"TImg2Col: {nbytes} B at lane offset {off} cross the lane's end")
            return LmemRange(lane % chip.lanes, 1, off, off + nbytes)
        size = self.tile_bytes(chip)
        return Accesses(lmem_reads=(rng(self.src_addr, self.halo_bytes(chip)),),
                        lmem_writes=tuple(rng(self.dst_addr + t * per_lane, size) for t in range(self.tiles)))

    move_accesses = accesses


TILE_KINDS: tuple[type[TileInstruction], ...] = (TMatmul, AccCvt, TPush, TMove, TImg2Col)


def sys_tile_wait(engine: Engine, block: int) -> Instruction:
    """The SYS instruction with which the TIU or the GDMA queue waits for TILE block `block`."""
    from tpuflow.isa.gdma import SysDma
    from tpuflow.isa.tiu import SysTiu
    return (SysTiu if engine is Engine.TIU else SysDma).tile_wait(block)


@dataclass(frozen=True)
class TileSlot:
    queue: int
    slot: int
    push_index: int   # how many pushes onto this queue came before it

    def address(self, chip: "ChipConfig") -> int:
        return chip.tile_slot_address(self.queue, self.slot)

    def lmem_range(self, chip: "ChipConfig") -> LmemRange:
        addr = self.address(chip)
        lane, off = divmod(addr, chip.lmem_bytes_per_lane)
        return LmemRange(lane % chip.lanes, 1, off, off + chip.tile.slot_bytes)


class TileQueueError(ValueError):
    pass


class TileQueues:
    """Replays queue state over a TILE stream: resolves operand codes to slots and checks that
    no operand is read after release, beyond the queue depth, or before it was pushed."""

    def __init__(self, queue_slots: int):
        self.slots = queue_slots
        self.pushes = [0, 0, 0, 0]
        self.released: set[tuple[int, int]] = set()

    def resolve(self, code: int) -> TileSlot:
        q, dist = code // 16, code % 16 + 1
        index = self.pushes[q] - dist
        if index < 0:
            raise TileQueueError(f"{ref_name(code)} read before {dist} tiles were pushed on {QUEUES[q]}")
        if dist > self.slots:
            raise TileQueueError(f"{ref_name(code)} is deeper than the {self.slots}-entry queue")
        if (q, index) in self.released:
            raise TileQueueError(f"{ref_name(code)} was released by an earlier block")
        return TileSlot(q, index % self.slots, index)

    def step(self, instr: TileInstruction) -> tuple[list[TileSlot], list[TileSlot]]:
        """(slots read, slots written) by `instr`; advances the queue state."""
        reads = [self.resolve(c) for c in instr.sources()]
        for c in instr.released():
            s = self.resolve(c)
            self.released.add((s.queue, s.push_index))
        writes = []
        q = instr.push_queue()
        if q is not None:
            for _ in range(instr.push_count()):
                index = self.pushes[q]
                self.pushes[q] += 1
                self.released.discard((q, index))
                writes.append(TileSlot(q, index % self.slots, index))
        return reads, writes


def resolve_stream(instrs: Iterable[TileInstruction], chip: "ChipConfig") -> list[Accesses]:
    """LMEM accesses of every block of a TILE stream (reads of sources; TPUSH 'reads' the slot
    GDMA filled, ACCCVT writes its destination slot)."""
    queues = TileQueues(chip.tile.queue_slots)
    ranges: dict[tuple[int, int], LmemRange] = {}

    def rng(s: TileSlot) -> LmemRange:
        key = (s.queue, s.slot)
        if key not in ranges:
            ranges[key] = s.lmem_range(chip)
        return ranges[key]

    out = []
    for instr in instrs:
        if isinstance(instr, (TMove, TImg2Col)):     # addressed blocks (no queue operands)
            out.append(instr.move_accesses(chip))
            continue
        reads, writes = queues.step(instr)
        if isinstance(instr, TPush):
            reads, writes = writes, []
        out.append(Accesses(lmem_reads=tuple(rng(s) for s in reads), lmem_writes=tuple(rng(s) for s in writes)))
    return out
