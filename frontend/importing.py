"""Import driver: runs the per-op-family importers over a folded OnnxView and builds a Draft."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from onnx import helper

from tpuflow.errors import ModelError, UnsupportedOpError
from tpuflow.frontend.draft import Draft, rename_tensors
from tpuflow.frontend.graph import TensorInfo
from tpuflow.frontend.onnx_view import ONode, OnnxView
from tpuflow.frontend.ops import OpKind
from tpuflow.frontend.registry import IMPORTERS
from tpuflow.frontend import imp_conv, imp_elementwise, imp_matmul, imp_norm, imp_shape  # noqa: F401 (registers)
from tpuflow.frontend import imp_activation, imp_broadcast, imp_norm2, imp_reduce  # noqa: F401 (registers)
from tpuflow.frontend import imp_convtranspose, imp_einsum, imp_rnn, imp_spatial  # noqa: F401 (registers)
from tpuflow.frontend import imp_quant  # noqa: F401 (registers)
from tpuflow.frontend import imp_compute  # noqa: F401,E402 (registers; after imp_elementwise: replaces Where)


def np_dtype_name(elem_type: int, label: str, tensor: str) -> str:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name
    except (KeyError, TypeError, ValueError):
        raise ModelError(f"{label}: tensor '{tensor}' has ONNX element type {elem_type}, which tpuflow does "
                         "not support") from None


class ImportContext:
    """What an importer sees of the model (shapes, dtypes, constants of the folded view) and how it
    emits canonical nodes into the Draft."""

    def __init__(self, view: OnnxView, draft: Draft):
        self.view = view
        self.draft = draft
        self.opset = view.opset
        self.node: ONode | None = None
        self.aliases: list[tuple[str, str]] = []
        self.problems: dict[str, list[str]] = {}

    # ---- queries
    def shape(self, name: str) -> tuple[int, ...]:
        return self.draft.tensors[name].shape

    def rank(self, name: str) -> int:
        return len(self.shape(name))

    def dtype(self, name: str) -> str:
        return self.draft.tensors[name].dtype

    def const(self, name: str) -> np.ndarray | None:
        return self.draft.const(name) if name else None

    def has_input(self, i: int) -> bool:
        return bool(self.node.input(i))

    # ---- emission
    def emit(self, kind: OpKind, inputs, outputs, suffix: str | None = None, **attrs: Any) -> None:
        self.draft.add_node(self.node.name if suffix is None else f"{self.node.name}/{suffix}",
                            kind, inputs, outputs, attrs)

    def temp(self, suffix: str, shape: tuple[int, ...], dtype: str) -> str:
        """A new intermediate tensor named after the current node."""
        return self.draft.add_tensor(f"{self.node.name}/{suffix}", shape, dtype)

    def add_const(self, suffix: str, value: np.ndarray) -> str:
        return self.draft.add_const(f"{self.node.name}/{suffix}", value)

    def alias(self, src: str, dst: str) -> None:
        """`dst` is the same tensor as `src` (Identity, Dropout, same-type Cast ...)."""
        self.aliases.append((src, dst))

    def unsupported(self, reason: str) -> None:
        self.problems.setdefault(f"{self.node.op_type}[{reason}]", []).append(self.node.name)


def _seed_tensors(view: OnnxView, draft: Draft) -> None:
    for name, value in view.consts.items():
        draft.tensors[name] = TensorInfo(name, tuple(value.shape), value.dtype.name, value)
    used = {t for n in view.nodes for t in n.inputs} | set(view.outputs)
    for n in view.nodes:
        for t in n.outputs:
            if t in used:                 # unused optional outputs (Dropout masks ...) may lack shapes
                draft.tensors[t] = _runtime_info(view, t, n)
    for name in view.inputs:
        draft.tensors[name] = _runtime_info(view, name, None)


def _runtime_info(view: OnnxView, name: str, node: ONode | None) -> TensorInfo:
    shape = view.static_shape(name)
    if shape is None:
        where = f"output of node '{node.name}' ({node.op_type})" if node else "graph input"
        dims = view.types.get(name, (None, 0))[0]
        raise ModelError(f"{view.label}: no static shape for tensor '{name}' ({where}; inferred {dims}); "
                         "fix the input shapes with --input-shape")
    return TensorInfo(name, shape, np_dtype_name(view.elem_type(name), view.label, name))


def import_view(view: OnnxView) -> Draft:
    """Every node through its importer; aliases resolved so graph outputs keep their names."""
    draft = Draft(view.name, inputs=list(view.inputs), outputs=list(view.outputs))
    _seed_tensors(view, draft)
    ctx = ImportContext(view, draft)
    for n in view.nodes:
        ctx.node = n
        IMPORTERS[n.op_type].run(n, ctx)
    if ctx.problems:
        raise UnsupportedOpError(ctx.problems)
    resolve_aliases(draft, ctx.aliases)
    draft.prune()
    return draft


def resolve_aliases(draft: Draft, aliases: list[tuple[str, str]]) -> None:
    """Remove alias tensors. A graph output that is an alias takes over its root's name, unless the
    root is a graph input or another graph output: then a view copy keeps both names."""
    root: dict[str, str] = {}
    for src, dst in aliases:
        root[dst] = root.get(src, src)
    outputs = set(draft.outputs)
    inputs = set(draft.inputs)
    renamed: dict[str, str] = {}
    copies: list[tuple[str, str]] = []
    for out in draft.outputs:
        if out not in root:
            continue
        r = root[out]
        info = draft.tensors[r]
        if info.is_const:
            draft.tensors[out] = replace(info, name=out)
        elif r in inputs or r in outputs or r in renamed:
            copies.append((r, out))
        else:
            renamed[r] = out
    mapping = {dst: renamed.get(r, r) for dst, r in root.items() if dst not in outputs}
    mapping.update(renamed)
    rename_tensors(draft, mapping)
    for r, out in copies:
        src = renamed.get(r, r)
        draft.add_node(f"{out}/copy", OpKind.RESHAPE, (src,), (out,),
                       {"shape": draft.tensors[src].shape, "view": True})
