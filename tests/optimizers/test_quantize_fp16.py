"""What FP16 keeps in fp32 in front of a log: the sum that computes it, back to the model's input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from unideploy.onnx.session import cpu_session
from unideploy.optimizers.quantize_fp16 import _convert, out_of_range_nodes


def _log_spectrum(rectified: bool) -> onnx.ModelProto:
    """x -> (Relu ->) Reshape (to a shape concatenated from integers) -> MatMul (a transform whose first column cancels x0 against x1) ->
    square -> + 1e-10 -> Log, and beside it x -> MatMul -> Sigmoid, a layer fp16 converts."""
    basis = np.zeros((4, 2), np.float32)
    basis[0, 0], basis[1, 0], basis[2, 1], basis[3, 1] = 1.0, -1.0, 1.0, 1.0
    weights = [
        numpy_helper.from_array(basis, "basis"),
        numpy_helper.from_array(np.array([-1], np.int64), "rows"),
        numpy_helper.from_array(np.array([4], np.int64), "columns"),
        numpy_helper.from_array(np.array(1e-10, np.float32), "eps"),
        numpy_helper.from_array(np.full((4, 3), 0.5, np.float32), "w"),
    ]
    nodes = [
        helper.make_node("Relu", ["x"], ["rectified"], name="rect"),
        helper.make_node("Concat", ["rows", "columns"], ["frame_shape"], name="frame_shape", axis=0),
        helper.make_node("Reshape", ["rectified" if rectified else "x", "frame_shape"], ["frame"], name="frame"),
        helper.make_node("MatMul", ["frame", "basis"], ["spectrum"], name="transform"),
        helper.make_node("Mul", ["spectrum", "spectrum"], ["power"], name="square"),
        helper.make_node("Add", ["power", "eps"], ["floored"], name="floor"),
        helper.make_node("Log", ["floored"], ["log_power"], name="log"),
        helper.make_node("MatMul", ["x", "w"], ["h"], name="head"),
        helper.make_node("Sigmoid", ["h"], ["score"], name="sigmoid"),
    ]
    graph = helper.make_graph(
        nodes,
        "spectrum",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [
            helper.make_tensor_value_info("log_power", TensorProto.FLOAT, ["batch", 2]),
            helper.make_tensor_value_info("score", TensorProto.FLOAT, ["batch", 3]),
        ],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _kept(model: onnx.ModelProto, x: np.ndarray, tmp_path: Path) -> dict[str, str]:
    onnx.save(model, tmp_path / "model.onnx")
    return out_of_range_nodes(model, tmp_path / "model.onnx", {"x": x}, tmp_path)


# fp16 stores both 1 + 2^-15 and 1 as 1: their difference, 2^-15, is below its normal range
SAMPLES = np.array([[1 + 2**-15, 1.0, 0.5, 0.25], [2.0, 2.0, 1.0, 1.0]], np.float32)


def test_the_walk_keeps_the_sum_under_a_log_and_its_linear_terms_and_stops_at_a_rectifier(tmp_path):
    """The log, the square and the floor (below fp16's range), the transform (a sum) and the
    reshape feeding it (linear), but not the Relu before them, the integers of the reshape's shape,
    nor the other head."""
    kept = _kept(_log_spectrum(rectified=True), SAMPLES, tmp_path)
    assert set(kept) == {"log", "floor", "square", "transform", "frame"}, kept
    assert "through a sum" in kept["transform"] and "below fp16's normal range" in kept["log"]


def test_a_front_end_kept_in_fp32_reads_the_input_as_given_and_unread_casts_go(tmp_path):
    """The difference 2^-15 comes out of the transform only if it reads the input unrounded: the
    converter's cast of the input to fp16 and back was in its way (log(1e-10), -23.0, for -20.7).
    The casts nothing reads go, with their declared types; the other head is fp16."""
    model = _log_spectrum(rectified=False)
    kept = _kept(model, SAMPLES, tmp_path)
    converted = onnx.load(str(_convert(model, sorted(kept), tmp_path / "fp16.onnx")))
    read = {t for n in converted.graph.node for t in n.input} | {o.name for o in converted.graph.output}
    assert all(set(n.output) & read for n in converted.graph.node if n.op_type == "Cast")
    assert {i.name for i in converted.graph.value_info} <= {t for n in converted.graph.node for t in n.output}
    assert [t.name for t in converted.graph.initializer if t.data_type == TensorProto.FLOAT16] == ["w"]
    fp32 = cpu_session(model.SerializeToString()).run(None, {"x": SAMPLES})
    fp16 = cpu_session(converted.SerializeToString()).run(None, {"x": SAMPLES})
    np.testing.assert_allclose(fp16[0], fp32[0], rtol=1e-3)
    np.testing.assert_allclose(fp16[1], fp32[1], rtol=1e-2)
