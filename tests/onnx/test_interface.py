"""Renaming a model's tensors: everywhere a name is read, control-flow bodies and weights included."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from unideploy.onnx.interface import rename_values


def _branching_model() -> onnx.ModelProto:
    """y = x + w, then an If whose branches read the outer 'sum' and 'w' by name."""

    def branch(name: str, op: str) -> onnx.GraphProto:
        return helper.make_graph(
            [helper.make_node(op, ["sum", "w"], [f"{name}_out"])],
            name,
            [],
            [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [2])],
        )

    nodes = [
        helper.make_node("Add", ["x", "w"], ["sum"]),
        helper.make_node("ReduceSum", ["sum"], ["total"], keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["positive"]),
        helper.make_node(
            "If", ["positive"], ["y"], then_branch=branch("then", "Mul"), else_branch=branch("else", "Sub")
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "branching",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [
            numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "w"),
            numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_renaming_reaches_weights_and_what_control_flow_bodies_read():
    model = _branching_model()
    x = np.array([3.0, -1.0], np.float32)
    expected = _run(model, x)
    rename_values(model, {"w": "t0_", "sum": "t1_", "zero": "t2_"})
    onnx.checker.check_model(model, full_check=True)
    names = {i.name for i in model.graph.initializer}
    assert names == {"t0_", "t2_"}
    branches = [a.g for n in model.graph.node if n.op_type == "If" for a in n.attribute]
    assert all(list(b.node[0].input) == ["t1_", "t0_"] for b in branches)
    np.testing.assert_array_equal(_run(model, x), expected)
