"""Which ``Slice`` nodes the edge target makes Identity before onnx2tf: those that keep every element
(onnx2tf applied the end of jax2tf's slice over a width-1 axis to the channels; the conversion
itself is in test_edge_target.py, Magika's in tests/test_zoo.py)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("ai_edge_litert", reason="the edge extra is not installed")

from unideploy.edge.tflite import _slices_for_onnx2tf


def _slice(name: str, source: str, ends: list[int], axes: list[int]) -> list[onnx.NodeProto]:
    return [
        helper.make_node(
            "Constant", [], [f"{name}_starts"], value=numpy_helper.from_array(np.zeros(len(ends), np.int64))
        ),
        helper.make_node("Constant", [], [f"{name}_ends"], value=numpy_helper.from_array(np.array(ends, np.int64))),
        helper.make_node("Constant", [], [f"{name}_axes"], value=numpy_helper.from_array(np.array(axes, np.int64))),
        helper.make_node("Slice", [source, f"{name}_starts", f"{name}_ends", f"{name}_axes"], [name], name=name),
    ]


def test_only_slices_that_keep_everything_of_a_known_shape_are_taken_out(tmp_path):
    big = 2**31 - 1
    nodes = [
        *_slice("whole", "x", [big, 5, 1], [0, 1, -1]),  # every element: the last axis has 1
        *_slice("part", "whole", [big, 4], [0, 1]),  # drops a column: kept
        helper.make_node("Reshape", ["part", "shape"], ["unknown"]),  # a shape only a run knows
        *_slice("blind", "unknown", [big], [0]),  # rank unknown: kept, as it was
        helper.make_node("Relu", ["blind"], ["y"]),
        *_slice("out", "x", [big, big, big], [0, 1, 2]),  # whole, but a graph output: kept
    ]
    graph = helper.make_graph(
        nodes,
        "slices",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 5, 1]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [None]),
        ],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("y", "out")],
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    _slices_for_onnx2tf(path)
    kept = onnx.load(str(path)).graph.node
    assert [n.name for n in kept if n.op_type == "Slice"] == ["part", "blind", "out"]
    whole = next(n for n in kept if n.name == "whole")
    assert whole.op_type == "Identity" and list(whole.input) == ["x"]  # what part reads passes x on


def test_a_slice_with_its_axes_out_of_order_gets_them_in_order_and_computes_the_same(tmp_path):
    """tf2onnx writes Basic Pitch's slice of ``[N, 172, 324, 2]`` with axes ``[0, 2, 1, 3]``;
    onnx2tf pairs starts with the tensor's axes in order, so the bounds are put in that order
    (ONNX Runtime gives the same values before and after)."""
    import onnxruntime as ort

    big = 2**31 - 1
    bounds = {"starts": [0, -3, 0, 0], "ends": [big, big, big, big], "axes": [0, 2, 1, 3], "steps": [1, 1, 1, 1]}
    graph = helper.make_graph(
        [helper.make_node("Slice", ["x", *bounds], ["y"], name="bins")],
        "unordered",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 5, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in bounds.items()],
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    x = np.arange(2 * 4 * 5 * 2, dtype=np.float32).reshape(2, 4, 5, 2)
    before = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    _slices_for_onnx2tf(path)
    model = onnx.load(str(path))
    values = {t.name: numpy_helper.to_array(t).tolist() for t in model.graph.initializer}
    node = model.graph.node[0]
    assert [values[name] for name in node.input[1:]] == [[0, 0, -3, 0], [big] * 4, [0, 1, 2, 3], [1] * 4]
    after = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert before.shape == (2, 4, 3, 2) and np.array_equal(before, after)
