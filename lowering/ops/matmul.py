"""MatMul groups on the TIU (mm2.nn): batched and broadcast matmuls tiled over M (rows across
lanes), N and K, with resident weights when they fit, plus the fused epilogue (bias, activation)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tpuflow.errors import LoweringError
from tpuflow.isa import Mm2Tiu, Prec
from tpuflow.lowering.context import LowerCtx
from tpuflow.lowering.emitplan import FrozenPlan
from tpuflow.lowering.groups import Group
from tpuflow.lowering.layergroup import MATRIX, NCHW
from tpuflow.lowering.ops.epilogue import Epilogue
from tpuflow.lowering.tensors import DRegion, LTile, make_tile, tile_bytes_per_lane
from tpuflow.lowering.tiling import pipelined, steps, steps_between


@dataclass(frozen=True)
class OperandView:
    """A matmul operand as a strided view of a DDR tensor: element (batch b, row r, col c) at
    offset(b) + r * row_stride + c (columns are contiguous). `transposed` marks B given as B^T
    (rows = N, cols = K): a Transpose folded into the matmul."""

    batch_strides: tuple[int, ...]
    row_stride: int
    transposed: bool = False


@dataclass(frozen=True)
class MatmulGeom:
    batch: tuple[int, ...]        # output batch shape
    m: int
    k: int
    n: int
    a: OperandView
    b: OperandView
    y: OperandView        # where results go: contiguous, or through a folded output Transpose

    @property
    def batch_count(self) -> int:
        return math.prod(self.batch)

    def offsets(self, index: int) -> tuple[int, int, int]:
        """(A offset, B offset, Y offset) in elements of batch `index`."""
        a = b = y = 0
        rest = index
        for size, sa, sb, sy in reversed(list(zip(self.batch, self.a.batch_strides, self.b.batch_strides,
                                                  self.y.batch_strides))):
            rest, i = divmod(rest, size)
            a += i * sa
            b += i * sb
            y += i * sy
        return a, b, y


def _view(shape: list[int], perm, rank: int, role: str) -> tuple[list[int], list[int], OperandView]:
    """Logical [batch..., rows, cols] shape and view of an operand stored as `shape`, read
    through `perm` (a folded Transpose) when given."""
    if len(shape) == 1:
        shape = [1] + shape if role == "a" else shape + [1]
    st = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        st[i] = st[i + 1] * shape[i + 1]
    perm = list(perm) if perm is not None else list(range(len(shape)))
    lshape, lst = [shape[p] for p in perm], [st[p] for p in perm]
    transposed = lst[-1] != 1
    rows_stride = lst[-1] if transposed else lst[-2]
    pad = rank - (len(lshape) - 2)
    dims, strides = [1] * pad + lshape[:-2], [0] * pad + lst[:-2]
    batch = tuple(s if d > 1 else 0 for d, s in zip(dims, strides))
    return lshape[-2:], dims, OperandView(batch, rows_stride, transposed)


def matmul_geometry(ctx: LowerCtx, node) -> MatmulGeom:
    g = ctx.graph
    a_shape, b_shape = list(g.tensor(node.inputs[0]).shape), list(g.tensor(node.inputs[1]).shape)
    a_perm, b_perm = node.attr("a_perm"), node.attr("b_perm")
    rank = max(len(a_shape) if len(a_shape) > 1 else 2, len(b_shape) if len(b_shape) > 1 else 2) - 2
    (m, k), ab, a_view = _view(a_shape, a_perm, rank, "a")
    (k2, n), bb, b_view = _view(b_shape, b_perm, rank, "b")
    if k != k2:
        raise LoweringError(f"node {node.name}: MatMul inner dimensions {k} and {k2} differ")
    if a_view.transposed:
        raise LoweringError(f"node {node.name}: a transposed left operand is not supported")
    batch = tuple(max(x, y) for x, y in zip(ab, bb))
    return MatmulGeom(batch, m, k, n, a_view, b_view, _output_view(g.tensor(node.outputs[0]).shape, node.attr("y_perm"),
                                                                  batch, m, n))


def _output_view(stored_shape, perm, batch, m: int, n: int) -> OperandView:
    """The result [batch..., M, N] as stored: contiguous, or permuted by `perm` (the stored tensor
    is transpose(result, perm), whose last dim stays last)."""
    if perm is None:
        strides, acc = [], m * n
        for d in reversed(batch):
            strides.append(acc)
            acc *= d
        return OperandView(tuple(reversed(strides)), n)
    st = [1] * len(stored_shape)
    for i in range(len(stored_shape) - 2, -1, -1):
        st[i] = st[i + 1] * stored_shape[i + 1]
    inverse = [list(perm).index(i) for i in range(len(perm))]
    logical = [st[j] for j in inverse]
    return OperandView(tuple(logical[:-2]), logical[-2])


class MatmulGroup:
    """What every MatMul group emitter starts from: the node, its geometry, its epilogue."""

    def __init__(self, ctx: LowerCtx, group: Group):
        self.ctx, self.group, self.chip = ctx, group, ctx.chip
        self.node = group.anchor
        self.geom = matmul_geometry(ctx, self.node)
        out = self.node.outputs[0]
        self.epi = Epilogue(ctx, out, group.epilogue, ctx.graph.tensor(out).shape, group.split)
        self.result = self.epi.output


# A tiling other than the first that fits (whole K, B resident, the most rows, then columns) is
# taken only when it moves this many times fewer DDR bytes (a compiler policy: a BERT-base layer at
# seq 2048 streams its 4.7 MB FFN weights once per 64-row tile under the first fit).
TRAFFIC_GAIN = 1.5
# Row tiles at least of a matmul with held weights (several cores) whose result goes to DDR: its
# stores then overlap the compute of the next tiles (a compiler policy; bert_base fp16 sg2260, 6 /
# 4 cores, lower_split + list schedule: one tile 2709.7 / 3017.3 us, three 2568.8 / 2985.2).
HELD_ROW_TILES = 3
HEADS_PERM = (0, 2, 1, 3)      # [1, S, H, D] <-> [1, H, S, D]: attention heads folded into a MatMul's batch
KEYS_PERM = (0, 2, 3, 1)       # [1, S, H, D] -> [1, H, D, S]: keys transposed for Q K^T


def _batch_and_rows(graph, node) -> tuple[int, int]:
    """(batch count, M) of the product (not of its stored, possibly transposed, output)."""
    from types import SimpleNamespace
    geom = matmul_geometry(SimpleNamespace(graph=graph), node)
    return geom.batch_count, geom.m


def _operand_layout(graph, tensor: str, perm, rows_axis_last: bool) -> str | None:
    """How a runtime MatMul operand can be read from LMEM: a contiguous matrix (rows on lanes),
    or an NCHW [1, S, H, D] tensor read head by head through a folded transpose, its tile rows on
    the lanes (axis 1) and its columns along them (axis 3)."""
    info = graph.tensor(tensor)
    if info.is_const or len(info.shape) < 2:
        return None
    if perm is None:
        return MATRIX
    perm = tuple(perm)
    if len(info.shape) == 4 and info.shape[0] == 1:
        return NCHW if perm == (KEYS_PERM if rows_axis_last else HEADS_PERM) else None
    return None


@dataclass(frozen=True)
class MatmulPlan(FrozenPlan):
    """An MM2 MatMul's tiling: rows (mt), columns (nt) and inner elements (kt) per step, whether
    B stays resident, the resident buffers' offsets (B when resident, epilogue residents) and
    each buffer set's offsets (the first `load_count` loaded per step: A, streamed B; then the
    result, epilogue operands and scratch, the stored copy)."""

    mt: int
    nt: int
    kt: int
    r_res: bool
    residents: tuple[int, ...]
    sets: tuple[tuple[int, ...], ...]
    load_count: int


class MatmulEmitter(MatmulGroup):
    @staticmethod
    def resident_ports(graph, group: Group, chip) -> tuple[dict[str, str], dict[str, str]]:
        """Which operands can be read from LMEM and in which layout (MM2 reads a contiguous
        matrix with rows on lanes in place; head-major views of [1, S, H, D] tensors are copied
        lane by lane into a working tile), and whether the result can be written there (a
        matrix, or [1, S, H, D] through the heads transpose); every M tile starts on lane 0."""
        from tpuflow.lowering.ops.epilogue import full_epilogue_operands
        node = group.anchor
        batch, m = _batch_and_rows(graph, node)
        if batch > 1 and m % chip.lanes:
            return {}, {}
        a, b = node.inputs[0], node.inputs[1]
        readable = {}
        a_layout = _operand_layout(graph, a, node.attr("a_perm"), False)
        if a_layout is not None:
            readable[a] = a_layout
        b_perm = node.attr("b_perm")
        if b_perm is not None and _operand_layout(graph, b, b_perm, tuple(b_perm) == KEYS_PERM) == NCHW:
            readable[b] = NCHW
        y_perm = node.attr("y_perm")
        out = group.nodes[-1].outputs[0]
        writable = {}
        if y_perm is None:
            writable[out] = MATRIX
            readable.update(dict.fromkeys(full_epilogue_operands(graph, group), MATRIX))
        elif tuple(y_perm) == HEADS_PERM and len(graph.tensor(out).shape) == 4:
            writable[out] = NCHW
        return readable, writable

    def __init__(self, ctx: LowerCtx, group: Group):
        super().__init__(ctx, group)
        self.a_res = ctx.resident(self.node.inputs[0])           # layer groups: operands kept in LMEM
        self.b_res = ctx.resident(self.node.inputs[1])
        self.y_res = ctx.resident(self.result)
        self.a_copied = self.a_res is not None and self.a_res.layout == NCHW   # read through a working tile
        self.a_addr = None if self.a_res else self._operand_addr(self.node.inputs[0])
        self.b_addr = None if self.b_res else self._operand_addr(self.node.inputs[1])
        self.col_range = ctx.view_cols_to_emit(self.geom.n)     # cores: the output columns this core computes
        self.held = ctx.held_constants()     # several cores: B's columns prefetched (lowering.weight_prefetch)
        self.r_cols = self.col_range[1] - self.col_range[0] if self.held is not None else self.geom.n

    def _operand_addr(self, tensor: str) -> int:
        info = self.ctx.graph.tensor(tensor)
        if info.const is not None:
            return self.ctx.const_addr(f"mm:{tensor}", np.asarray(info.const))
        return self.ctx.ddr_addr(tensor)

    # ------------------------------------------------------------ sizing
    def _res_prec(self, k_split: bool) -> Prec:
        return Prec.FP32 if (k_split or not self.epi.empty) and self.ctx.prec != Prec.FP32 else self.ctx.prec

    def _sizes(self, mt: int, nt: int, kt: int, r_resident: bool) -> tuple[list[int], list[int], list[int]]:
        chip, prec, geo = self.chip, self.ctx.prec, self.geom
        split = kt < geo.k
        res = [self.held_bytes()] if r_resident and self.held is None else []
        load = [0 if self.a_res and not self.a_copied else tile_bytes_per_lane(chip, (1, mt, 1, kt), prec)]
        if not r_resident:
            load.append(tile_bytes_per_lane(chip, self._r_shape(kt, nt), prec))
        out_shape = (1, mt, 1, nt)
        outs = [tile_bytes_per_lane(chip, out_shape, self._res_prec(split))] + self.epi.set_sizes(out_shape)
        if self._res_prec(split) != prec:
            outs.append(tile_bytes_per_lane(chip, out_shape, prec))
        return res + self.epi.resident_sizes(self._epi_rows(), geo.n), load, outs

    def _epi_rows(self) -> int:
        return self.geom.batch_count * self.geom.m

    def _choose(self, arena):
        geo, lanes, eu = self.geom, self.chip.lanes, self.chip.eu_count(self.ctx.options.dtype)
        m_opts = sorted({min(geo.m, lanes * i) for i in range(1, -(-geo.m // lanes) + 1)}, reverse=True)
        if self.held is not None and self.y_res is None:      # stores overlap the next row tiles' compute
            m_opts = [m for m in m_opts if m <= max(lanes, -(-geo.m // HELD_ROW_TILES))] or m_opts
        width = self.col_range[1] - self.col_range[0]
        n_opts = sorted({width} | {min(width, eu * 2 ** i) for i in range(12)}, reverse=True)
        k_opts = sorted({geo.k} | {min(geo.k, lanes * 2 ** i) for i in range(10)}, reverse=True)
        if self.a_res is not None and not self.a_copied:
            k_opts = [geo.k]           # MM2 reads A with its aligned row stride: whole rows only
        parts = self.ctx.residency.splits.get(self.result)
        if parts:                      # tiles inside one Split part: B tiles per part, not one whole-N B
            widest = max(width for _, _, width in parts)
            n_opts = sorted({min(n, widest) for n in n_opts}, reverse=True)
        for copies in (2, 1):
            fitting = []               # per (kt, B resident, mt): the widest column tile that fits
            for kt in k_opts:
                for r_res in self._b_options(kt, parts, width):
                    for mt in m_opts:
                        nt = next((nt for nt in ([self.r_cols] if r_res else n_opts)
                                   if self._fits(arena, (mt, nt, kt, r_res), copies)), None)
                        if nt is not None:
                            fitting.append((mt, nt, kt, r_res))
            if fitting:
                return self._least_traffic(fitting)
        return None

    def _b_options(self, kt: int, parts, width: int) -> tuple[bool, ...]:
        """Whether B can stay resident (whole K and N; a held block always) and whether it can stream."""
        if self.held is not None:
            return (True,) if kt == self.geom.k else ()
        return (True, False) if kt == self.geom.k and not parts and width == self.geom.n else (False,)

    def held_bytes(self) -> int:
        """Per-lane bytes of B resident: its columns this emission computes when held, else all."""
        return tile_bytes_per_lane(self.chip, self._r_shape(self.geom.k, self.r_cols), self.ctx.prec)

    def fetch_held(self, k0: int, kt: int) -> None:
        """Load rows [k0, k0 + kt) of B's columns this emission computes into its held block
        (lowering.weight_prefetch; k0 a multiple of the lane count, B not transposed)."""
        lo, hi = self.col_range
        self.ctx.em.layer = self.node.name
        row_bytes = make_tile(self.chip, self.held.addr, (1, self.chip.lanes, 1, hi - lo), self.ctx.prec).strides[1]
        addr = self.held.addr + k0 // self.chip.lanes * row_bytes * self.ctx.prec.bytes
        tile = make_tile(self.chip, addr, (1, kt, 1, hi - lo), self.ctx.prec)
        self._fetch_b(tile, 0, self.geom.offsets(0)[1], k0, kt, lo, hi - lo)

    def _fits(self, arena, choice: tuple[int, int, int, bool], copies: int) -> bool:
        res, load, outs = self._sizes(*choice)
        return arena.fits(res + (load + outs) * copies)

    def _least_traffic(self, fitting: list[tuple[int, int, int, bool]]) -> tuple[int, int, int, bool]:
        """The first fitting tiling (whole K, B resident, the most rows and columns), unless
        another moves TRAFFIC_GAIN times fewer DDR bytes: A is loaded once per column tile, B once
        per row tile unless it stays resident."""
        geo = self.geom
        rows, cols = geo.m, self.col_range[1] - self.col_range[0]
        a_bytes = 0 if self.a_res is not None and not self.a_copied else rows * geo.k
        b_bytes = 0 if self.b_res is not None else geo.k * cols

        def traffic(choice) -> int:
            mt, nt, kt, r_res = choice
            return a_bytes * -(-cols // nt) + b_bytes * (1 if r_res else -(-rows // mt))

        best = min(fitting, key=traffic)               # the first of the least on ties
        return best if traffic(best) * TRAFFIC_GAIN < traffic(fitting[0]) else fitting[0]

    def misfit(self) -> str:
        geo = self.geom
        return f"no tiling of MatMul {geo.m}x{geo.k}x{geo.n} fits LMEM"

    def plan(self, region: str) -> MatmulPlan | None:
        """The tiling (mt, nt, kt, B resident) and buffers in `region`, or None when none fits."""
        arena = self.ctx.planning_arena(region)
        choice = self._choose(arena)
        if choice is None:
            return None
        res, load, outs = self._sizes(*choice)
        r_res, split = choice[3], choice[2] < self.geom.k
        res_names = (["b_resident"] if r_res and self.held is None else []) + self.epi.resident_names()
        load_names = ["a"] + ([] if r_res else ["b"])
        out_names = ["result"] + self.epi.set_names() + (["stored"] if self._res_prec(split) != self.ctx.prec else [])
        res_offs, sets = arena.alloc_plan(res, load + outs, self.node.name, names=(res_names, load_names + out_names))
        return MatmulPlan(region, self.ctx.window(region), tuple(arena.names), *choice, tuple(res_offs),
                          tuple(tuple(x) for x in sets), len(load))

    # ------------------------------------------------------------ emission
    def emit(self, plan: MatmulPlan) -> None:
        geo, chip, ctx = self.geom, self.chip, self.ctx
        ctx.em.layer = self.node.name
        self.mt, self.nt, self.kt, self.r_res = plan.mt, plan.nt, plan.kt, plan.r_res
        res_offs, sets = list(plan.residents), plan.sets
        self.load_sets = [s[:plan.load_count] for s in sets]
        self.out_sets = [s[plan.load_count:] for s in sets]
        r_res_count = 1 if self.r_res and self.held is None else 0
        self.epi.load_residents(res_offs[r_res_count:], self._epi_rows(), geo.n)
        r_addr = self.held.addr if self.held is not None else res_offs[0] if self.r_res else None
        self.r_tile = make_tile(chip, r_addr, self._r_shape(geo.k, self.r_cols), ctx.prec) if self.r_res else None
        loaded_b = None
        k_steps = steps(geo.k, self.kt)
        lo, hi = ctx.view_rows_to_emit(geo.batch_count * geo.m)      # rows b * M + m
        for b in range(lo // geo.m, -(-hi // geo.m)):
            a_off, b_off, y_off = geo.offsets(b)
            if self.r_res and b_off != loaded_b:
                ctx.em.layer = self.node.name
                if self.held is None:
                    self._fetch_b(self.r_tile, b, b_off, 0, geo.k, 0, geo.n)
                loaded_b = b_off
            rows = steps_between(max(lo - b * geo.m, 0), min(hi - b * geo.m, geo.m), self.mt)
            out_tiles = [(m0, m, n0, n) for m0, m in rows for n0, n in self._column_tiles()]
            work = [(ti, t, ks) for ti, t in enumerate(out_tiles) for ks in range(len(k_steps))]
            offs = (a_off, b_off, y_off, b, k_steps)
            pipelined(work, len(self.load_sets), lambda w, s: self._load(w, s, offs),
                      lambda w, s: self._compute(w, s, offs))
        macs = geo.batch_count * geo.m * geo.n * geo.k
        ctx.note_layer(self.node.name, "MatMul", macs=macs, lmem_peak=plan.peak, group=self.group.name)
        for n in self.group.epilogue:
            ctx.note_layer(n.name, n.op_type, lmem_peak=plan.peak, group=self.group.name)

    def _column_tiles(self) -> list[tuple[int, int]]:
        """Output column tiles of at most nt columns; inside one part when the result is split
        in LMEM (layer groups: each part is its own buffer)."""
        parts = self.ctx.residency.splits.get(self.result)
        if not parts:
            return steps_between(*self.col_range, self.nt)
        return [(c0 + n0, n) for _, c0, width in parts for n0, n in steps(width, self.nt)]

    def _result_view(self, row0: int, m0: int, mt: int, b: int, n0: int, nt: int):
        """Where the result tile goes in LMEM: the resident result, or the Split output holding
        its columns."""
        for name, c0, width in self.ctx.residency.splits.get(self.result, ()):
            if c0 <= n0 < c0 + width:
                return self.ctx.resident(name).rows_view(self.chip, row0, mt, n0 - c0, nt)
        if self.y_res.layout == NCHW:
            return self.y_res.view(self.chip, 0, m0, mt, b, 1, nt, n0)
        return self.y_res.rows_view(self.chip, row0, mt, n0, nt)

    def _a_region(self, a_off, m0, mt, k0, kt) -> DRegion:
        rs, prec = self.geom.a.row_stride, self.ctx.prec
        return DRegion(self.a_addr + (a_off + m0 * rs + k0) * prec.bytes, (1, mt, 1, kt), (mt * rs, rs, kt, 1), prec)

    def _b_region(self, b_off, k0, kt, n0, nt) -> DRegion:
        """B rows k0.. / cols n0.. — or, for a folded transpose, B^T rows n0.. / cols k0.."""
        rs, prec = self.geom.b.row_stride, self.ctx.prec
        if self.geom.b.transposed:
            return DRegion(self.b_addr + (b_off + n0 * rs + k0) * prec.bytes, (1, nt, 1, kt), (nt * rs, rs, kt, 1), prec)
        return DRegion(self.b_addr + (b_off + k0 * rs + n0) * prec.bytes, (1, kt, 1, nt), (kt * rs, rs, nt, 1), prec)

    def _fetch_b(self, dst: LTile, b: int, b_off: int, k0: int, kt: int, n0: int, nt: int) -> None:
        """B's tile for batch b from DDR, or copied lane by lane from its LMEM-resident [1, S, H, D]
        buffer (tile rows = S on lanes, head b, columns along D)."""
        if self.b_res is None:
            self.ctx.em.load(dst, self._b_region(b_off, k0, kt, n0, nt))
            return
        rows0, rows, cols0, cols = (n0, nt, k0, kt) if self.geom.b.transposed else (k0, kt, n0, nt)
        self.ctx.em.ar("copy", dst, self.b_res.view(self.chip, 0, rows0, rows, b, 1, cols, cols0))

    def _r_shape(self, kt: int, nt: int) -> tuple[int, int, int, int]:
        return (1, nt, 1, kt) if self.geom.b.transposed else (1, kt, 1, nt)

    def _y_region(self, addr: int, y_off, m0, mt, n0, nt) -> DRegion:
        rs, prec = self.geom.y.row_stride, self.ctx.prec
        return DRegion(addr + (y_off + m0 * rs + n0) * prec.bytes, (1, mt, 1, nt), (mt * rs, rs, nt, 1), prec)

    def _load(self, work, s: int, offs) -> None:
        ti, (m0, mt, n0, nt), ks = work
        a_off, b_off, y_off, b, k_steps = offs
        k0, kt = k_steps[ks]
        em, chip, prec = self.ctx.em, self.chip, self.ctx.prec
        em.layer = self.node.name
        if self.a_res is None:
            em.load(make_tile(chip, self.load_sets[s][0], (1, mt, 1, kt), prec), self._a_region(a_off, m0, mt, k0, kt))
        elif self.a_copied:
            em.ar("copy", make_tile(chip, self.load_sets[s][0], (1, mt, 1, kt), prec),
                  self.a_res.view(chip, 0, m0, mt, b, 1, kt, k0))
        if not self.r_res:
            self._fetch_b(make_tile(chip, self.load_sets[s][1], self._r_shape(kt, nt), prec), b, b_off, k0, kt, n0, nt)
        if ks == len(k_steps) - 1 and self.epi.full:
            out_offs = self.out_sets[ti % len(self.out_sets)]
            self.epi.load_tile(out_offs[1:], (1, mt, 1, nt), lambda addr: self._y_region(addr, y_off, m0, mt, n0, nt))

    def _compute(self, work, s: int, offs) -> None:
        ti, (m0, mt, n0, nt), ks = work
        a_off, b_off, y_off, b, k_steps = offs
        k0, kt = k_steps[ks]
        geo, chip, prec, em = self.geom, self.chip, self.ctx.prec, self.ctx.em
        split = len(k_steps) > 1
        out_offs = self.out_sets[ti % len(self.out_sets)]
        res = make_tile(chip, out_offs[0], (1, mt, 1, nt), self._res_prec(split))
        if self.a_res is not None and not self.a_copied:
            left = self.a_res.rows_view(chip, a_off // geo.k + m0, mt, 0, kt)
        else:
            left = make_tile(chip, self.load_sets[s][0], (1, mt, 1, kt), prec)
        if self.r_res:
            right = self.r_tile
        else:
            right = make_tile(chip, self.load_sets[s][1], self._r_shape(kt, nt), prec)
        em.layer = self.node.name
        em.tiu(Mm2Tiu(op="nt" if geo.b.transposed else "nn", res0_addr=res.addr, res0_c=mt, res0_w=nt,
                      opd0_addr=left.addr, opd0_c=mt, opd0_w=kt, opd1_addr=right.addr, opd1_c=right.c,
                      opd1_w=right.w, opt_res0_prec=int(res.prec),
                      opt_opd0_prec=int(prec), opt_opd1_prec=int(prec), opt_res_add=0 if ks == 0 else 1))
        if ks == len(k_steps) - 1:
            value = res
            row0 = b * geo.m + m0
            if not self.epi.empty:
                window = lambda r: r.rows_view(chip, row0, mt, n0, nt)       # noqa: E731
                value = self.epi.apply(res, out_offs[1:], row0, n0, window)
            em.layer = self.group.nodes[-1].name
            if self.y_res is not None:                # layer groups: the result stays in LMEM
                em.ar("copy", self._result_view(row0, m0, mt, b, n0, nt), value)
                return
            if value.prec != prec:
                stage = make_tile(chip, out_offs[-1], value.shape, prec)
                em.ar("copy", stage, value)
                value = stage
            em.store(value, self._y_region(self.ctx.ddr_addr(self.result), y_off, m0, mt, n0, nt))
