"""Small ONNX models with If / Loop / Scan for the control-flow tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T, helper, numpy_helper


def vi(name: str, shape, elem: int = T.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def model(nodes, inputs, outputs, inits=(), opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "control", inputs, outputs,
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def sample_rate_if(else_op: str = "Shrink", nested: bool = False) -> onnx.ModelProto:
    """y = If(sr == 16000) then x * 2 (+ a nested If on sr > 8000) else <else_op> of x (Shrink: an op
    tpuflow does not support; Gather: a runtime-index Gather); x is [2, 3]."""
    then_nodes = [helper.make_node("Mul", ["x", "two"], ["t_out"], name="double")]
    if nested:
        inner_then = helper.make_graph([helper.make_node("Sigmoid", ["t_out"], ["it"], name="sig")], "it", [],
                                       [vi("it", [2, 3])])
        inner_else = helper.make_graph([helper.make_node("Tanh", ["t_out"], ["ie"], name="tanh")], "ie", [],
                                       [vi("ie", [2, 3])])
        then_nodes += [helper.make_node("Greater", ["sr", "k8"], ["c2"], name="gt"),
                       helper.make_node("If", ["c2"], ["t_nested"], name="inner_if", then_branch=inner_then,
                                        else_branch=inner_else)]
    then_out = "t_nested" if nested else "t_out"
    then_g = helper.make_graph(then_nodes, "then", [], [vi(then_out, [2, 3])],
                               [numpy_helper.from_array(np.array(2.0, np.float32), "two")])
    if else_op == "Gather":
        else_nodes = [helper.make_node("Relu", ["x"], ["e0"], name="relu"),
                      helper.make_node("Gather", ["e0", "idx"], ["e_out"], axis=1, name="gather_rt")]
    else:
        else_nodes = [helper.make_node(else_op, ["x"], ["e_out"], name="else_op")]
    else_g = helper.make_graph(else_nodes, "else", [], [vi("e_out", [2, 3])])
    nodes = [helper.make_node("Equal", ["sr", "k16"], ["c"], name="is_16k"),
             helper.make_node("If", ["c"], ["y"], name="rate_if", then_branch=then_g, else_branch=else_g)]
    inputs = [vi("x", [2, 3]), vi("sr", [], T.INT64)] + ([vi("idx", [3], T.INT64)] if else_op == "Gather" else [])
    return model(nodes, inputs, [vi("y", [2, 3])], [("k16", np.array(16000)), ("k8", np.array(8000))])


def counting_loop(trip: int = 4, runtime_cond: bool = False, body_cond: str = "identity") -> onnx.ModelProto:
    """acc_{k+1} = acc_k + x * i_k (i the iteration number); scan output acc_{k+1} * 0.5."""
    body_nodes = [helper.make_node("Cast", ["i"], ["i_f"], to=T.FLOAT, name="i_float"),
                  helper.make_node("Mul", ["x", "i_f"], ["xi"], name="x_times_i"),
                  helper.make_node("Add", ["acc", "xi"], ["acc_out"], name="accumulate"),
                  helper.make_node("Mul", ["acc_out", "half"], ["scan"], name="halve")]
    if body_cond == "identity":
        body_nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep_going"))
    else:                                   # computed from data: cannot be unrolled
        body_nodes += [helper.make_node("ReduceSum", ["acc_out"], ["s"], keepdims=0, name="total"),
                       helper.make_node("Less", ["s", "half"], ["cond_out"], name="still_small")]
    body = helper.make_graph(body_nodes, "body", [vi("i", [], T.INT64), vi("cond_in", [], T.BOOL), vi("acc", [2, 3])],
                             [vi("cond_out", [], T.BOOL), vi("acc_out", [2, 3]), vi("scan", [2, 3])])
    cond = "c" if runtime_cond else ""
    nodes = [helper.make_node("Loop", ["M", cond, "x0"], ["fin", "scans"], body=body, name="the_loop")]
    inputs = [vi("x", [2, 3]), vi("x0", [2, 3])] + ([vi("c", [], T.BOOL)] if runtime_cond else [])
    return model(nodes, inputs, [vi("fin", [2, 3]), vi("scans", [trip, 2, 3])],
                 [("M", np.array(trip)), ("half", np.array(0.5, np.float32))])


def scan_model() -> onnx.ModelProto:
    body = helper.make_graph([helper.make_node("Add", ["s", "xi"], ["s_out"], name="add"),
                              helper.make_node("Erf", ["s_out"], ["o"], name="erf_in_scan"),
                              helper.make_node("NonZero", ["o"], ["nz"], name="nonzero_in_scan")],
                             "scan_body", [vi("s", [3]), vi("xi", [3])], [vi("s_out", [3]), vi("o", [3])])
    nodes = [helper.make_node("Scan", ["s0", "x"], ["sf", "ys"], body=body, num_scan_inputs=1, name="the_scan"),
             helper.make_node("Unique", ["sf"], ["u"], name="top_unique")]
    return model(nodes, [vi("s0", [3]), vi("x", [4, 3])], [vi("ys", [4, 3]), vi("u", None)])
