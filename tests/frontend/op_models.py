"""One-node ONNX models for the decomposition tests (outputs typed, shapes left to inference)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def node_model(op: str, inputs: dict[str, tuple[int, ...]], consts: dict[str, np.ndarray] | None = None,
               opset: int = 17, outputs: int = 1, order: list[str] | None = None,
               elem: int = TensorProto.FLOAT, out_elem: int | None = None, seed: int = 0,
               **attrs) -> onnx.ModelProto:
    """A model with one node `op`: `inputs` are runtime inputs (shapes), `consts` initializers;
    node inputs follow `order` (default: runtime inputs, then constants; '' = absent)."""
    consts = consts or {}
    names = order if order is not None else [*inputs, *consts]
    outs = [f"y{i}" for i in range(outputs)]
    node = helper.make_node(op, names, outs, name=f"the_{op.lower()}", **attrs)
    graph = helper.make_graph(
        [node], f"one_{op}", [helper.make_tensor_value_info(n, elem, list(s)) for n, s in inputs.items()],
        [helper.make_tensor_value_info(o, out_elem or elem, None) for o in outs],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    return with_output_shapes(model)


def with_output_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Output value infos with shapes: from ONNX shape inference, else from one onnxruntime run."""
    inferred = {o.name: o for o in onnx.shape_inference.infer_shapes(model, data_prop=True).graph.output}
    if all(inferred[o.name].type.tensor_type.HasField("shape") for o in model.graph.output):
        shapes = {k: [d.dim_value for d in v.type.tensor_type.shape.dim] for k, v in inferred.items()}
    else:
        import onnxruntime as ort
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        feeds = {i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape],
                                  helper.tensor_dtype_to_np_dtype(model.graph.input[k].type.tensor_type.elem_type))
                 for k, i in enumerate(sess.get_inputs())}
        shapes = {o.name: list(v.shape) for o, v in zip(model.graph.output, sess.run(None, feeds))}
    outs = [helper.make_tensor_value_info(o.name, o.type.tensor_type.elem_type, shapes[o.name])
            for o in model.graph.output]
    del model.graph.output[:]
    model.graph.output.extend(outs)
    return model


def weights(rng: np.random.Generator, *shape: int, scale: float = 0.5) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)
