"""Which part of each fused group every core computes when a program is split over cores (issue
14): samples or output rows of convs and pools, rows of a row group's view, output columns of a
matmul by weights at least as large as its activations (or of a matrix-vector product), else its
rows; int8 groups by samples, output rows, output channels or Gemm columns (_split_quant); other
groups (int8 chains among them) run on core 0. DDR is shared, LMEM private: a group's parts read and write
DDR. Also the spans of conv groups that run in bands over the cores instead (band_regions), and
which DDR data crosses cores (crossing_tensors, CrossCoreHazards)."""

from __future__ import annotations

import math

import numpy as np

from tpuflow.frontend.graph import Graph
from tpuflow.isa import Engine
from tpuflow.lowering.context import WHOLE, EmitPart
from tpuflow.lowering.groups import Group
from tpuflow.lowering.slicing import (SlicedRegion, candidate_runs, chunk, matmul_geometry_of, output_height, output_of,
                                      samples, slice_region, view_rows)
from tpuflow.options import CompileOptions


def core_parts(graph: Graph, group: Group, cores: int, options: CompileOptions,
               on_vector_unit: bool = False, pinned: int | None = None, chip=None) -> list[EmitPart | None]:
    """Per core, its part of `group` (None: that core has nothing of it). A group that does not
    split runs whole on core 0, a `pinned` one whole on that core (lowering.tensor_parallel);
    `on_vector_unit`: a matmul the GEMV path computes (split by output columns: each core streams
    its share of the weights); `chip` (ChipConfig) is needed to split an int8 group (_split_quant)."""
    if pinned is not None:
        return [WHOLE if k == pinned else None for k in range(cores)]
    parts = _split(graph, group, cores, options, on_vector_unit, chip)
    return parts if parts is not None else [WHOLE] + [None] * (cores - 1)


def _split(graph: Graph, group: Group, cores: int, options: CompileOptions,
           on_vector_unit: bool, chip=None) -> list[EmitPart | None] | None:
    if cores == 1:
        return None
    if group.kind == "quant":
        return _split_quant(graph, group, cores, chip) if options.matmul == "tiu" and chip is not None else None
    if group.kind in ("conv", "pool") and options.matmul == "tiu" and _is_nchw(graph, group):
        batch = graph.tensor(output_of(group)).shape[0]
        if batch >= cores:
            return [_some(EmitPart(samples=range(*chunk(batch, cores, k)))) for k in range(cores)]
        height = output_height(graph, group)
        if _by_channels(graph, group, height, cores):
            cout = graph.tensor(group.anchor.inputs[1]).shape[0]
            return [_some(EmitPart(channels=chunk(cout, cores, k))) for k in range(cores)]
        return [_some(EmitPart(rows=chunk(height, cores, k))) for k in range(cores)]
    if group.kind == "matmul" and options.matmul == "tiu" and on_vector_unit:
        cols = matmul_geometry_of(graph, group).n      # a matrix-vector product: its weights' columns
        return [_some(EmitPart(view_cols=chunk(cols, cores, k))) for k in range(cores)]
    if group.kind == "matmul" and options.matmul == "tiu" and not on_vector_unit and _weight_heavy(graph, group):
        cols = matmul_geometry_of(graph, group).n
        step = _head_width(graph, group, cols, cores)
        return [_some(EmitPart(view_cols=_granules(cols, step, cores, k))) for k in range(cores)]
    if group.kind == "row" or (group.kind == "matmul" and options.matmul == "tiu" and not on_vector_unit):
        rows = view_rows(graph, group)
        step = _batch_rows(graph, group, rows, cores)
        return [_some(EmitPart(view_rows=_granules(rows, step, cores, k))) for k in range(cores)]
    return None


# An int8 group other than a plain conv splits by rows only where one channel's band of output rows
# (8-bit) fills the GDMA's longest burst (gdma.bus_bytes x gdma.max_burst_beats, 512 B on sg2260): a
# narrower band moves as that many bytes per channel, DMAs the DDR model makes slow (ResNet-50's 7 x 7
# adds by rows over 4 cores: 14-byte pieces, 1.3 GB/s); it splits by channels instead (an elementwise
# op then moves one contiguous run). A plain conv takes the split whose DMAs the shared cost model
# times faster (_rows_move_slower).
# Output columns per granule of an int8 Gemm's column split (whole DDR cells and aligned DMAs).
GEMM_COL_GRANULE = 32


def _split_quant(graph: Graph, group: Group, cores: int, chip) -> list[EmitPart | None] | None:
    """An int8 group's parts (lowering/quant.py, ops/quant_ops.py): a conv, pool or elementwise op
    a sliced run can take (lowering.quant.sliceable_quant) by samples when there are at least as
    many as cores, else a plain conv by output channels when its weights outweigh its input
    (_by_channels: each core then reads all of the input) or its DMAs by rows take longer
    (_rows_move_slower) and by output rows otherwise, another group by
    output rows, or by channels where a core's band of rows is narrow (its channels cost no extra
    reads); a global pool by samples or channels; a Gemm by output columns when its weights outweigh its
    operand, else by rows in lane groups. Channel parts are whole groups of the chip's lanes (the
    quant emitters' per-channel constants and a held tensor's channels then share lanes; fewer
    groups than two: rows, else core 0). Chains, Concats, moves and products of two activations
    run on core 0."""
    from tpuflow.lowering.quant import QuantChain, sliceable_quant
    lanes, burst_bytes = chip.lanes, chip.gdma.bus_bytes * chip.gdma.max_burst_beats
    if isinstance(group, QuantChain):
        return None
    node = group.anchor
    if node.op_type == "MatMul":
        return _split_gemm(graph, group, cores, lanes)
    pooled = node.op_type == "GlobalAveragePool" and len(graph.tensor(node.inputs[0]).shape) == 4
    if not (sliceable_quant(graph, group) or pooled):
        return None
    out = graph.tensor(group.nodes[-1].outputs[0]).shape
    if out[0] >= cores:
        return [_some(EmitPart(samples=range(*chunk(out[0], cores, k)))) for k in range(cores)]
    plain = node.op_type == "Conv" and node.attr("group", 1) == 1
    banded = -(-out[2] // cores) * out[3] >= burst_bytes
    by_rows = [_some(EmitPart(rows=chunk(out[2], cores, k))) for k in range(cores)]
    if out[1] < 2 * lanes:
        return by_rows if banded or plain else None
    channels = [_some(EmitPart(channels=_granules(out[1], lanes, cores, k, rest=True))) for k in range(cores)]
    if plain:
        slower = _by_channels(graph, group, out[2], cores) or _rows_move_slower(graph, node, out, cores, chip)
        return channels if slower else by_rows
    if pooled or not banded:
        return channels
    return by_rows


def _rows_move_slower(graph: Graph, node, out, cores: int, chip) -> bool:
    """Whether a plain int8 conv's DMAs on one core take longer split by output rows (its band of the
    input rows of every channel, its band of output rows, all weights) than by output channels (all of
    the input, its channels' output, its share of the weights), on the shared cost model
    (hwmodel.timing.cost.gdma_cycles): narrow bands move as many short pieces."""
    _, cin, h, w = graph.tensor(node.inputs[0]).shape
    _, cout, ho, wo = out
    weights = graph.tensor(node.inputs[1]).size
    band = -(-ho // cores)
    in_rows = min(h, -(-h // cores) + node.attr("kernel_shape", [1, 1])[0] - 1)
    by_rows = _dma_cycles(chip, cin, in_rows, w, h * w) + _dma_cycles(chip, cout, band, wo, ho * wo) \
        + _dma_cycles(chip, 1, 1, weights, weights)
    share = -(-cout // cores)
    by_channels = _dma_cycles(chip, cin, h, w, h * w) + _dma_cycles(chip, share, ho, wo, ho * wo) \
        + _dma_cycles(chip, 1, 1, -(-weights // cores), weights)
    return by_rows > by_channels


def _dma_cycles(chip, channels: int, rows: int, width: int, plane: int) -> int:
    """gdma_cycles of moving `rows` rows of `width` int8 elements of each of `channels` DDR planes of
    `plane` elements into LMEM (a run longer than a descriptor's 16-bit width as rows of 4096)."""
    from tpuflow.hwmodel.timing.cost import gdma_cycles
    from tpuflow.isa import Prec, TensorDma, global_lmem_address
    if rows == 1 and width > 4096:
        rows, width = -(-width // 4096), 4096
        plane = max(plane, rows * width)
    src = dict(src_nsize=1, src_csize=channels, src_hsize=rows, src_wsize=width, src_nstride=channels * plane,
               src_cstride=plane, src_hstride=width, src_wstride=1)
    dst = dict(dst_nsize=1, dst_csize=channels, dst_hsize=rows, dst_wsize=width,
               dst_nstride=channels * rows * width, dst_cstride=rows * width, dst_hstride=width, dst_wstride=1)
    return gdma_cycles(TensorDma(src_start_addr=1 << 30, dst_start_addr=global_lmem_address(0, chip),
                                 src_data_format=int(Prec.INT8), **src, **dst), chip)


def _split_gemm(graph: Graph, group: Group, cores: int, lanes: int) -> list[EmitPart | None] | None:
    """An int8 MatMul by constant weights (quant_ops.GemmQuant) by output columns when its weights
    outweigh its operand, else by rows in whole lane groups (an operand or result held in LMEM then
    starts on lane 0 on every core; None: a product of two activations, or too few rows)."""
    node = group.anchor
    weights, x = graph.tensor(node.inputs[1]), graph.tensor(node.inputs[0])
    if not weights.is_const or len(weights.shape) != 2 or len(x.shape) == 4:
        return None
    k, n = weights.shape
    rows = math.prod(x.shape[:-1])
    if k * n >= rows * k:
        step = math.gcd(n, GEMM_COL_GRANULE)
        return [_some(EmitPart(view_cols=_granules(n, step, cores, c))) for c in range(cores)]
    if rows >= 2 * lanes:
        return [_some(EmitPart(view_rows=_granules(rows, lanes, cores, c, rest=True)))
                for c in range(cores)]
    return None


def _granules(size: int, step: int, cores: int, k: int, rest: bool = False) -> tuple[int, int]:
    """Core k's share of `size` in whole steps of `step` (`rest`: the last core also takes what
    is left past the last whole step)."""
    lo, hi = chunk(size // step, cores, k)
    return lo * step, size if rest and k == cores - 1 else hi * step


def _head_width(graph: Graph, group: Group, cols: int, cores: int) -> int:
    """The granule of a matmul's column split: a head's width when a Reshape cuts its output
    columns into at least `cores` heads (attention: a core's heads then stay whole, and the
    attention of those heads needs no other core's columns), else one column."""
    for user in graph.consumers(group.nodes[-1].outputs[0]):
        shape = graph.tensor(user.outputs[0]).shape if user.op_type == "Reshape" else ()
        if len(shape) >= 2 and cols % shape[-1] == 0 and cols // shape[-1] >= cores and shape[-1] < cols:
            return shape[-1]
    return 1


def _batch_rows(graph: Graph, group: Group, rows: int, cores: int) -> int:
    """The granule of a view-rows split: whole matrices of a batch (heads of an attention) when
    there are at least as many as cores, so a core's rows use whole heads of its operands."""
    if group.kind == "matmul":
        geo = matmul_geometry_of(graph, group)
        batch, per = geo.batch_count, geo.m
    else:
        per = group.full_shape[group.split - 1] if group.split >= 2 else rows
        batch = rows // per
    return per if batch >= cores and batch * per == rows else 1


def _weight_heavy(graph: Graph, group: Group) -> bool:
    """A matmul by constant weights at least as large as its activations: its output columns are
    split (each core loads its share of the weights once) rather than its rows (each core would
    load all of them)."""
    geo = matmul_geometry_of(graph, group)
    weights = graph.tensor(group.anchor.inputs[1])
    return weights.is_const and geo.k * geo.n >= geo.batch_count * geo.m * geo.k


def _by_channels(graph: Graph, group: Group, height: int, cores: int) -> bool:
    """A plain conv splits its output channels (each core loads its share of the weights, and
    all of the input) when its weights outweigh its input or it has fewer output rows than cores."""
    if group.kind not in ("conv", "quant") or group.anchor.op_type != "Conv" or group.anchor.attr("group", 1) != 1:
        return False
    weights = graph.tensor(group.anchor.inputs[1])
    source = graph.tensor(group.anchor.inputs[0])
    return weights.const is not None and (weights.const.size >= math.prod(source.shape) or height < cores)


def _is_nchw(graph: Graph, group: Group) -> bool:
    return len(graph.tensor(output_of(group)).shape) == 4


def _some(part: EmitPart) -> EmitPart | None:
    """None for a part with nothing to compute."""
    for span in (part.rows, part.channels, part.view_rows, part.view_cols):
        if span is not None and span[1] <= span[0]:
            return None
    if part.samples is not None and not part.samples:
        return None
    return part


# ------------------------------------------------------------------ data crossing cores
# DDR is tracked in cells of CELL_BYTES (an fp16/bf16 element; coarser data can only make two
# cores' accesses look shared, which costs a barrier or keeps a tensor in DDR, never a race).
CELL_BYTES = 2


def ddr_cells(records, chip, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """(cells read, cells written) below byte `limit` by the GDMA instructions among `records`."""
    reads, writes = [], []
    for record in records:
        if record.engine == Engine.GDMA:
            acc = record.instr.accesses(chip)
            reads.extend(acc.ddr_reads)
            writes.extend(acc.ddr_writes)
    return _cells(reads, limit), _cells(writes, limit)


def _cells(ranges, limit: int) -> np.ndarray:
    """The cells the byte ranges touch (below `limit`), with repeats."""
    if not ranges:
        return np.zeros(0, np.int64)
    lo = np.fromiter((r.lo for r in ranges), np.int64, len(ranges)) // CELL_BYTES
    hi = -(-np.minimum(np.fromiter((r.hi for r in ranges), np.int64, len(ranges)), limit) // CELL_BYTES)
    keep = hi > lo
    lo, hi = lo[keep], hi[keep]
    lengths = hi - lo
    if not len(lengths):
        return np.zeros(0, np.int64)
    firsts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    return np.repeat(lo - firsts, lengths) + np.arange(int(lengths.sum()), dtype=np.int64)


class LastWriters:
    """Per DDR cell, the core that wrote it last (-1: none yet): run group by
    group over a program with a barrier after every group, it tells which reads see another
    core's data."""

    def __init__(self, limit: int):
        self.core = np.full(-(-limit // CELL_BYTES), -1, np.int16)

    def foreign(self, core: int, reads: np.ndarray) -> np.ndarray:
        """The cells among `reads` that another core wrote last (with repeats)."""
        writer = self.core[reads]
        return reads[(writer != -1) & (writer != core)]

    def write(self, writes_by_core: list[np.ndarray]) -> None:
        """One group's writes on every core (cores of one group write disjoint cells)."""
        for core, cells in enumerate(writes_by_core):
            self.core[cells] = core


def crossing_tensors(per_group: list[list[tuple[np.ndarray, np.ndarray]]], read_tensors: list[list[str]],
                     cells_of: dict[str, tuple[int, int]], limit: int) -> tuple[set[str], set[str]]:
    """The activations some core reads after another core wrote them, from a program that keeps
    every activation in DDR: `per_group[g][k]` = (cells read, cells written) by core k in group g,
    `read_tensors[g]` the activations group g reads, `cells_of[t]` the cells [lo, hi) of t; and
    those of them every core reads more of than their size (over all its groups): each core
    then loads them whole into its LMEM once instead."""
    writers, crossing = LastWriters(limit), set()
    marked = np.zeros(len(writers.core), bool)
    cores = len(per_group[0]) if per_group else 0
    read_by: dict[str, list[int]] = {}
    for g, accesses in enumerate(per_group):
        foreign = [writers.foreign(k, reads) for k, (reads, _) in enumerate(accesses)]
        for cells in foreign:
            marked[cells] = True
        for t in read_tensors[g]:
            lo, hi = cells_of.get(t, (0, 0))
            if marked[lo:hi].any():
                crossing.add(t)
            counts = read_by.setdefault(t, [0] * cores)
            for k, (reads, _) in enumerate(accesses):
                counts[k] += int(np.count_nonzero((reads >= lo) & (reads < hi)))
        for cells in foreign:
            marked[cells] = False
        writers.write([writes for _, writes in accesses])
    gathered = {t for t in crossing if all(n > cells_of[t][1] - cells_of[t][0] for n in read_by[t])}
    return crossing, gathered


class CrossCoreHazards:
    """Since the last barrier, per DDR cell: the core that wrote it and the core that read it
    (-2: several). A group needs a barrier before it when one of its cores reads or writes a
    cell another core wrote, or writes a cell another core read, since that barrier."""

    def __init__(self, limit: int):
        cells = -(-limit // CELL_BYTES)
        self.epoch = 1
        self.written_in = np.zeros(cells, np.int32)
        self.writer = np.zeros(cells, np.int16)
        self.read_in = np.zeros(cells, np.int32)
        self.reader = np.zeros(cells, np.int16)

    def _others(self, when: np.ndarray, who: np.ndarray, core: int, cells: np.ndarray) -> bool:
        now = when[cells] == self.epoch
        return bool(np.any(who[cells][now] != core))

    def conflicts(self, core: int, reads: np.ndarray, writes: np.ndarray) -> bool:
        return (self._others(self.written_in, self.writer, core, reads)
                or self._others(self.written_in, self.writer, core, writes)
                or self._others(self.read_in, self.reader, core, writes))

    def record(self, core: int, reads: np.ndarray, writes: np.ndarray) -> None:
        self._mark(self.written_in, self.writer, core, writes)
        self._mark(self.read_in, self.reader, core, reads)

    def _mark(self, when: np.ndarray, who: np.ndarray, core: int, cells: np.ndarray) -> None:
        """`core` touched `cells` in this epoch (-2 where another core did too)."""
        shared = (when[cells] == self.epoch) & (who[cells] != core)
        who[cells] = np.where(shared, -2, core)
        when[cells] = self.epoch

    def barrier(self) -> None:
        self.epoch += 1


# ------------------------------------------------------------------ spans run in bands over cores
# Most rows a member of a band span may compute, over all cores, as a multiple of its output
# height (each core recomputes the halo rows the later members need). A compiler policy.
BAND_RECOMPUTE_LIMIT = 1.5
# Shares of a lane's LMEM the slice buffers of one band span may take together (none: no limit),
# tried in turn until the residency plan fits them (the rest of LMEM holds other resident
# activations and the members' working area). A compiler policy.
BAND_LMEM_SHARES = (None, 0.7, 0.5, 0.35)


def band_regions(graph: Graph, groups: list[Group], cores: int, lanes: int = 1, lane_budget: float | None = None,
                 elem_bytes: int = 2, lenient: bool = False) -> list[SlicedRegion]:
    """Spans of consecutive sliceable groups of one sample run as sliced regions whose slices are
    the cores (tpu-mlir's multi-core layer groups: a contiguous band of output rows per core):
    core k computes band k of the last member's output and every member the rows later members
    need (halos recomputed), so the activations made and read inside a span stay in each core's
    LMEM and only the span's inputs and output meet in DDR. Greedy in run order: a span is the
    longest from its first group whose tensors read outside come from its last member, whose
    members recompute at most BAND_RECOMPUTE_LIMIT times their rows, whose weights, loaded by
    every core, cost fewer extra bytes than the activations it keeps out of DDR (`lenient`: only
    the weights in excess of each member's input, which a split by output channels would have
    every core read instead; _extra_elements), and whose
    slice buffers take at most `lane_budget` bytes of each of `lanes` lanes (`elem_bytes` per
    activation element; None: no limit)."""
    out = []
    for run in candidate_runs(graph, groups):
        if samples(graph, groups[run[0]]) != 1:
            continue
        a = 0
        while a < len(run) - 1:
            best = None
            for b in range(a + 1, len(run)):
                region = _band_region(graph, groups, run[a:b + 1], cores)
                if region is None or (lane_budget is not None and _lane_bytes(graph, region, lanes, elem_bytes) > lane_budget):
                    break
                if _band_pays(graph, groups, region, cores, lenient):
                    best = region
            out += [best] if best is not None else []
            a = run.index(best.last) + 1 if best is not None else a + 1
    return out


def _band_region(graph: Graph, groups: list[Group], members: tuple[int, ...], cores: int) -> SlicedRegion | None:
    """The span sliced into one band per core with its inside tensors as slice buffers, or None
    when a member would recompute too many rows (a longer span only recomputes more)."""
    inside, _ = span_tensors(graph, groups, members)
    region = slice_region(graph, groups, members, cores, inside)
    for m in members:
        computed = sum(max(0, hi - lo) for lo, hi in region.rows[m])
        if computed > BAND_RECOMPUTE_LIMIT * output_height(graph, groups[m]):
            return None
    return region


def _lane_bytes(graph: Graph, region: SlicedRegion, lanes: int, elem_bytes: int) -> int:
    """Bytes per lane of all of a region's slice buffers (channels over lanes, a band of rows)."""
    total = 0
    for t in region.buffers:
        _, c, _, w = graph.tensor(t).shape
        total += -(-c // lanes) * region.capacity(t) * w * elem_bytes
    return total


def span_tensors(graph: Graph, groups: list[Group], members: tuple[int, ...]) -> tuple[set[str], set[str]]:
    """(the 4-D activations a span makes and only it reads, every other activation it makes or
    reads: its boundary)."""
    inside_groups = set(members)
    made = {t: m for m in members for t in groups[m].produced()}
    readers: dict[str, set[int]] = {}
    for i, g in enumerate(groups):
        for t in {t for n in g.nodes for t in n.inputs if t} - g.produced():
            readers.setdefault(t, set()).add(i)
    inside = {t for t, m in made.items() if readers.get(t) and readers[t] <= inside_groups
              and t not in graph.outputs and len(graph.tensor(t).shape) == 4}
    read = {t for m in members for n in groups[m].nodes for t in n.inputs
            if t and not graph.tensor(t).is_const and t not in made}
    leaving = {t for t in made if t not in inside and (readers.get(t) or t in graph.outputs)}
    return inside, leaving | read


def _band_pays(graph: Graph, groups: list[Group], region: SlicedRegion, cores: int, lenient: bool = False) -> bool:
    """Whether every tensor leaving the span is its last member's output (its bands are the
    cores' own rows: no two cores write a row), and the weights every other core loads again
    (`lenient`: only those in excess of the members' inputs, _extra_elements) are fewer elements
    than the inside activations' DDR write and read."""
    inside, boundary = span_tensors(graph, groups, region.members)
    made_before_last = {t for m in region.members[:-1] for t in groups[m].produced()}
    if boundary & made_before_last:
        return False
    kept = sum(2 * math.prod(graph.tensor(t).shape) for t in inside)
    return (cores - 1) * sum(_extra_elements(graph, groups[m], lenient) for m in region.members) < kept


def _extra_elements(graph: Graph, group: Group, lenient: bool) -> int:
    """A member's weight elements (every core of a band span loads them all); `lenient`: only
    those its input does not outweigh (split alone it costs each other core the smaller of its
    weights, split by output rows, and its input, split by output channels)."""
    weights = sum(graph.tensor(t).const.size for n in group.nodes for t in n.inputs
                  if t and graph.tensor(t).const is not None)
    source = math.prod(graph.tensor(group.anchor.inputs[0]).shape)
    return max(0, weights - source) if lenient else weights
