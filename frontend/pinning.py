"""Pinned inputs (--input-value NAME=VALUE): a runtime input replaced by a constant before folding,
so shape arithmetic and If conditions that depend on it fold away."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tpuflow.errors import OptionError


@dataclass(frozen=True, eq=False)
class InputValue:
    """A value to pin a graph input to (a scalar or a small list; cast to the input's type)."""

    value: np.ndarray

    @classmethod
    def parse(cls, text: str) -> "InputValue":
        """'16000', '0.5', '1,2,3', 'true' -> InputValue; ValueError when it is none of these."""
        items = [t.strip() for t in text.split(",")]
        if not text.strip() or any(not t for t in items):
            raise ValueError(text)
        if all(t.lower() in ("true", "false") for t in items):
            values = np.asarray([t.lower() == "true" for t in items])
        else:
            values = np.asarray([float(t) for t in items])
        return cls(values[0] if len(items) == 1 else values)


def split_inputs(specs: Mapping | None) -> tuple[dict, dict]:
    """An input mapping of shapes and InputValues -> (shapes, values)."""
    shapes, values = {}, {}
    for name, spec in (specs or {}).items():
        (values if isinstance(spec, InputValue) else shapes)[name] = spec
    return shapes, values


def pin_inputs(proto: onnx.ModelProto, label: str, values: Mapping[str, InputValue | object]) -> onnx.ModelProto:
    """A copy of `proto` whose pinned inputs are initializers (the caller's model is left alone)."""
    if not values:
        return proto
    inits = {t.name for t in proto.graph.initializer}
    runtime = {vi.name: vi for vi in proto.graph.input if vi.name not in inits}
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    for name, spec in values.items():
        if name not in runtime:
            raise OptionError(f"{label}: input value given for '{name}', which is not a runtime graph input "
                              f"(inputs: {', '.join(runtime) or 'none'})")
        value = spec.value if isinstance(spec, InputValue) else np.asarray(spec)
        out.graph.initializer.append(numpy_helper.from_array(_typed(label, runtime[name], value), name))
    kept = [vi for vi in out.graph.input if vi.name not in values]
    del out.graph.input[:]
    out.graph.input.extend(kept)
    return out


def _typed(label: str, vi: onnx.ValueInfoProto, value: np.ndarray) -> np.ndarray:
    """`value` in the input's element type and declared shape (a scalar fills a [1] or [] input)."""
    tt = vi.type.tensor_type
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
    value = np.asarray(value)
    if dtype.kind in "iub" and value.dtype.kind == "f" and not np.all(value == np.round(value)):
        raise OptionError(f"{label}: input '{vi.name}' is {dtype.name}, the value {value.tolist()} is not integral")
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim] if tt.HasField("shape") else None
    if dims is not None and all(d is not None for d in dims):
        if int(np.prod(dims)) != value.size:
            raise OptionError(f"{label}: input '{vi.name}' has shape {dims}, the value has {value.size} "
                              "element(s)")
        value = value.reshape(dims)
    elif dims is not None and len(dims) != value.ndim:
        if value.size != 1 and len(dims) != 1:
            raise OptionError(f"{label}: input '{vi.name}' has rank {len(dims)}, the value has rank {value.ndim}")
        value = value.reshape((1,) * len(dims)) if value.size == 1 else value.reshape(-1)
    return value.astype(dtype)
