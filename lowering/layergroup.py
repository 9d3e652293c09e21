"""Layer groups: the activations resident in LMEM between fused groups (where each lives, its
layout, its views), the plan holding them, and the layer groups that result. The planner that
chooses them is lowering/residency.py."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from tpuflow.chip import ChipConfig
from tpuflow.frontend.graph import Graph
from tpuflow.errors import LoweringError
from tpuflow.isa import Prec, StrideMode
from tpuflow.lowering.groups import Group
from tpuflow.lowering.slicing import SlicedRegion
from tpuflow.lowering.tensors import LTile, make_tile

# Share of the usable LMEM (below the tile window, above the constant region) that resident
# activations may take; the rest stays the working area of the group being emitted (weight
# slices, partial sums, double buffers). A compiler policy, not a hardware number: measured on
# every bundled model (fp16, fp32) and five real models on sg2260 and bm1684x, 0.5 -> 0.7 changed
# no latency by more than +2.5% (PP-OCRv4 det fp32) and cut VGG-19 fp16 by 21%, the BERT-base
# encoder by 24%, layout_cdla fp16/fp32 by 16%/22%; 0.8 slowed VGG-19 fp32 by 6%.
RESIDENT_SHARE = 0.7
# When a group cannot be emitted in the working area the residents leave it, the program is
# planned again with the next smaller share (0: nothing resident, as --layer-group off).
RESIDENT_SHARE_FALLBACKS = (RESIDENT_SHARE, 0.5, 0.25, 0.0)

NCHW, MATRIX = "nchw", "matrix"     # the two layouts an activation can be kept in
MAX_GROUP_STRIDE = 1 << 15     # TIU n/c stride fields are 16-bit signed (sg2260_regs.json)

@dataclass(frozen=True)
class ResidentTensor:
    """An activation kept whole in LMEM from its producer to its last consumer, in the aligned
    layout of its (N, C, H, W) shape, channel 0 on lane 0."""

    name: str
    shape: tuple[int, int, int, int]
    prec: Prec
    addr: int            # per-lane offset (lane 0), i.e. the flat address of channel 0
    size: int            # bytes per lane
    first: int           # index of the producing group
    last: int            # index of the last consuming group
    inside: str | None = None   # the Concat this tensor is a channel slice of, or the Reshape input it renames
    row0: int = 0               # slice buffers: the first row of the tensor held (views take global rows)
    sample0: int = 0            # slice buffers: the sample held (views take global samples)
    layout: str = "nchw"        # NCHW, or MATRIX: (1, rows, 1, cols) with the leading dims in the rows

    def tile(self, chip: ChipConfig) -> LTile:
        return make_tile(chip, self.addr, self.shape, self.prec)

    def view(self, chip: ChipConfig, n: int, c0: int, c: int, h0: int, h: int, w: int | None = None,
             w0: int = 0) -> LTile:
        """Sample n, channels [c0, c0+c), rows [h0, h0+h) and columns [w0, w0+w) (all when w is
        None), as a tile over the resident buffer."""
        whole = self.tile(chip)
        sub = whole.sub_channels(c0, c, chip)
        st = whole.strides
        h0 = self._local_row(h0, h)
        n = self._local_sample(n)
        addr = sub.addr + (n * st[0] + h0 * st[2] + w0) * self.prec.bytes
        return _as_aligned(chip, LTile(addr, (1, c, h, self.shape[3] if w is None else w), self.prec,
                                       (0, self._group_stride(chip, sub, c), st[2], st[3]), StrideMode.FREE))

    def rows_view(self, chip: ChipConfig, r0: int, rows: int, col0: int, cols: int) -> LTile:
        """Rows [r0, r0+rows) x columns [col0, col0+cols) of the (rows on lanes, columns along
        the lane) view: a row is a channel of one sample of (N, C, H, W) (row n*C + c; columns =
        H*W; the rows stay inside one sample) or a matrix row."""
        whole = self.tile(chip)
        channels = self.shape[1]
        if self.layout == MATRIX:      # a slice buffer holds rows row0.. of the matrix
            n, r0 = 0, r0 - self.row0
        else:
            n, r0 = divmod(r0, channels)
        if r0 < 0 or r0 + rows > channels:
            raise LoweringError(f"internal: rows {r0}..{r0 + rows} of {self.name} are outside one sample / its slice buffer")
        sub = whole.sub_channels(r0, rows, chip)
        width = self.shape[3]          # NCHW: columns are rows x width (a slice buffer holds some rows)
        if self.layout != MATRIX:
            col0 = self._local_row(col0 // width, -(-(col0 % width + cols) // width)) * width + col0 % width
        addr = sub.addr + (self._local_sample(n) * whole.strides[0] + col0) * self.prec.bytes
        return _as_aligned(chip, LTile(addr, (1, rows, 1, cols), self.prec,
                                       (0, self._group_stride(chip, sub, rows), cols, 1), StrideMode.FREE))

    def _local_row(self, h0: int, h: int) -> int:
        local = h0 - self.row0
        if local < 0 or local + h > self.shape[2]:
            raise LoweringError(f"internal: rows {h0}..{h0 + h} of {self.name} are outside its slice buffer "
                                f"(rows {self.row0}..{self.row0 + self.shape[2]})")
        return local

    def _local_sample(self, n: int) -> int:
        local = n - self.sample0
        if not 0 <= local < self.shape[0]:
            raise LoweringError(f"internal: sample {n} of {self.name} is outside its slice buffer "
                                f"(samples {self.sample0}..{self.sample0 + self.shape[0]})")
        return local

    def _group_stride(self, chip: ChipConfig, sub: LTile, channels: int) -> int:
        """The channel-group stride, 0 when the view's channels sit in one group of lanes (the
        descriptors' c strides are 16-bit; a view then needs none)."""
        start = (sub.addr // chip.lmem_bytes_per_lane) % chip.lanes
        return 0 if start + channels <= chip.lanes else sub.strides[1]

    def strides_fit(self, chip: ChipConfig) -> bool:
        """Whether a view over several channel groups can name its group stride (16-bit signed)."""
        return self.shape[1] <= chip.lanes or self.tile(chip).strides[1] < MAX_GROUP_STRIDE

    def live_at(self, index: int) -> bool:
        return self.first <= index <= self.last


def _as_aligned(chip: ChipConfig, view: LTile) -> LTile:
    """The view in the aligned stride mode when its strides are the aligned layout's on every dim
    it spans (descriptors then need no stride fields and take their short forms)."""
    aligned = make_tile(chip, view.addr, view.shape, view.prec)
    n, c, h, w = view.shape
    start = (view.addr // chip.lmem_bytes_per_lane) % chip.lanes
    spans = (n > 1, start + c > chip.lanes, h > 1, w > 1)
    if all(not used or a == b for used, a, b in zip(spans, aligned.strides, view.strides)):
        return aligned
    return view


@dataclass(frozen=True)
class LayerGroup:
    """Consecutive fused groups joined by resident activations: only weights and the boundary
    tensors touch DDR."""

    index: int
    members: tuple[str, ...]          # fused-group names (their anchor nodes), in order
    nodes: tuple[str, ...]            # every ONNX node of the member groups
    resident: tuple[str, ...]         # activations kept in LMEM inside it
    lmem_peak_bytes: int              # resident bytes per lane at the busiest point
    sliced: tuple[tuple[tuple[str, ...], int, str], ...] = ()   # (members, slice count, axes) run slice by slice

    def as_dict(self) -> dict:
        """Slicing: the axes some members run slice by slice over ("n": one sample per slice,
        "h": bands of output rows, "n,h": both; the sliced runs with their slice counts and axes
        are listed), else whole tensors (1 slice); each member tiles its own work over output
        channels and rows inside the group's working area."""
        used = {a for _, _, ax in self.sliced for a in ax.split(",")}
        axes = [a for a in ("n", "h", "rows") if a in used]
        return {"index": self.index, "members": list(self.members), "nodes": list(self.nodes),
                "resident": list(self.resident), "slicing": ",".join(axes) if axes else "whole tensors",
                "slices": max([s for _, s, _ in self.sliced] + [1]),
                "sliced_runs": [{"members": list(m), "slices": s, "axes": ax} for m, s, ax in self.sliced],
                "lmem_resident_peak_bytes_per_lane": self.lmem_peak_bytes}


@dataclass
class ResidencyPlan:
    tensors: dict[str, ResidentTensor] = field(default_factory=dict)
    region_top: int = 0               # per-lane offset: resident buffers live below it
    consumers: dict[str, tuple[int, ...]] = field(default_factory=dict)   # tensor -> consuming groups
    regions: list[SlicedRegion] = field(default_factory=list)            # groups run slice by slice
    # A MatMul result split along its columns: never stored whole, the MatMul writes each column
    # range straight into the Split output that holds it: tensor -> ((output, first column, columns), ...)
    splits: dict[str, tuple[tuple[str, int, int], ...]] = field(default_factory=dict)
    # Several cores: activations other cores made that every core loads whole into LMEM before
    # its first reader (as graph inputs are preloaded); they keep their DDR buffer
    gathered: frozenset = frozenset()

    def preloads_due(self, index: int, graph_inputs) -> list[ResidentTensor]:
        """Graph inputs (and gathered activations) kept in LMEM whose first reader is at or before group `index`."""
        return sorted((t for t in self.tensors.values()
                       if (t.name in graph_inputs or t.name in self.gathered) and t.first <= index),
                      key=lambda t: (t.first, t.name))

    def region_at(self, index: int) -> SlicedRegion | None:
        return next((r for r in self.regions if r.first == index), None)

    def region_of(self, index: int) -> SlicedRegion | None:
        """The sliced region group `index` is a member of, or None."""
        return next((r for r in self.regions if index in r.members), None)

    def in_region(self, index: int) -> bool:
        """Whether group `index` is a member of a sliced region."""
        return self.region_of(index) is not None

    def enter_slice(self, region: SlicedRegion, s: int) -> None:
        """Point the slice buffers of `region` at the sample and rows of slice `s`."""
        for name, rows in region.buffers.items():
            self.tensors[name] = replace(self.tensors[name], row0=rows[s][0], sample0=region.sample_of(s))

    def arena_top(self, index: int, default_top: int) -> int:
        """Where the working area of group `index` ends: below every buffer live at that group."""
        live = [t.addr for t in self.tensors.values() if t.live_at(index)]
        return min(live + [default_top])

    def layer_groups(self, groups: list[Group]) -> list[LayerGroup]:
        """Maximal runs of fused groups connected by resident tensors."""
        parent = list(range(len(groups)))

        def find(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        for t in self.tensors.values():
            for j in self.consumers.get(t.name, ()):
                parent[find(j)] = find(t.first)
        runs: dict[int, list[int]] = {}
        for i in range(len(groups)):
            runs.setdefault(find(i), []).append(i)
        out = []
        for members in sorted(runs.values()):
            if len(members) < 2:
                continue
            inside = [t for t in self.tensors.values() if find(t.first) == find(members[0])]
            peak = max((sum(t.size for t in inside if t.live_at(i)) for i in members), default=0)
            sliced = tuple((tuple(groups[i].name for i in r.members), r.slices, r.axes) for r in self.regions
                           if r.first in members)
            out.append(LayerGroup(len(out), tuple(groups[i].name for i in members),
                                  tuple(n.name for i in members for n in groups[i].nodes),
                                  tuple(sorted(t.name for t in inside)), peak, sliced))
        return out




def default_layout(shape: tuple[int, ...]) -> str:
    """NCHW for a 4-D tensor, a matrix otherwise."""
    return NCHW if len(shape) == 4 else MATRIX


def resident_shape(shape: tuple[int, ...], layout: str | None = None) -> tuple[int, int, int, int] | None:
    """The 4-D LMEM shape of an activation in `layout`: NCHW as it is (axis 1 on lanes); a
    matrix [..., rows, cols] as (1, rows, 1, cols) with its leading dims folded into the rows
    (rows on lanes, as MatMul and row groups use it). Without a layout: NCHW for 4-D tensors,
    matrix otherwise. None when the tensor has no such layout."""
    layout = layout or default_layout(shape)
    if layout == NCHW:
        return tuple(shape) if len(shape) == 4 else None
    if len(shape) >= 2:
        rows = 1
        for d in shape[:-1]:
            rows *= d
        return (1, rows, 1, shape[-1])
    return None


def is_column_split(graph: Graph, group: Group) -> bool:
    """A Split of a matrix along its columns (the last axis) whose every output is used."""
    node = group.anchor
    if node.op_type != "Split" or len(group.nodes) != 1:
        return False
    shape = graph.tensor(node.inputs[0]).shape
    return len(shape) >= 2 and node.attr("axis") % len(shape) == len(shape) - 1 and all(node.outputs)


def split_ports(graph: Graph, group: Group) -> tuple[dict[str, str], dict[str, str]]:
    """A column Split reads its input and writes its outputs as matrices in LMEM."""
    if not is_column_split(graph, group):
        return {}, {}
    node = group.anchor
    return {node.inputs[0]: MATRIX}, dict.fromkeys(node.outputs, MATRIX)


def is_lmem_concat(graph: Graph, group: Group) -> bool:
    """A Concat of NCHW activations along channels (N = 1): its LMEM buffer holds its inputs'
    channel slices one after another, each starting where the previous one ends."""
    node = group.anchor
    if node.op_type != "Concat" or len(group.nodes) != 1:
        return False
    shape = graph.tensor(node.outputs[0]).shape
    return len(shape) == 4 and shape[0] == 1 and node.attr("axis") % 4 == 1
