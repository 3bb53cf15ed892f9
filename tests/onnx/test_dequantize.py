"""ONNX Runtime's dynamic INT8 turned back into float operators, for onnx2tf and the MindSpore
rebuild: on a model `quantize_dynamic` quantized here, and on ddddocr's recognizer as it ships."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from unideploy.errors import ExportError
from unideploy.onnx.dequantize import dequantized, dynamic_int8_ops
from unideploy.onnx.session import cpu_session


def _float_crnn(path: Path) -> Path:
    """Conv (with bias) -> Relu -> a bidirectional LSTM over the columns -> MatMul + bias: the
    three kinds of node quantize_dynamic rewrites, in a CRNN's order."""
    rng = np.random.default_rng(0)

    def weight(name: str, *shape: int, scale: float = 0.3) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    hidden = 8
    nodes = [
        helper.make_node("Conv", ["x", "conv_w", "conv_b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Reshape", ["r", "columns"], ["flat"], name="flat"),  # [1, 4 x 6, 10]
        helper.make_node("Transpose", ["flat"], ["seq"], name="seq", perm=[2, 0, 1]),  # [10, 1, 24]
        helper.make_node(
            "LSTM",
            ["seq", "lstm_w", "lstm_r", "lstm_b"],
            ["y"],
            name="lstm",
            hidden_size=hidden,
            direction="bidirectional",
        ),
        helper.make_node("Reshape", ["y", "steps"], ["features"], name="features"),  # [10, 16]
        helper.make_node("MatMul", ["features", "dense_w"], ["logits"], name="dense"),
        helper.make_node("Add", ["logits", "dense_b"], ["out"], name="dense_bias"),
    ]
    initializers = [
        weight("conv_w", 4, 1, 3, 3),
        weight("conv_b", 4),
        numpy_helper.from_array(np.array([1, 24, 10], np.int64), "columns"),
        weight("lstm_w", 2, 4 * hidden, 24),
        weight("lstm_r", 2, 4 * hidden, hidden),
        weight("lstm_b", 2, 8 * hidden, scale=0.1),
        numpy_helper.from_array(np.zeros((2, 1, hidden), np.float32), "h0"),  # as ddddocr's (onnx2tf needs them)
        numpy_helper.from_array(np.zeros((2, 1, hidden), np.float32), "c0"),
        numpy_helper.from_array(np.array([10, 2 * hidden], np.int64), "steps"),
        weight("dense_w", 2 * hidden, 5),
        weight("dense_b", 5),
    ]
    graph = helper.make_graph(
        nodes,
        "crnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 6, 10])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [10, 5])],
        initializers,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.fixture(scope="module")
def quantized_crnn(tmp_path_factory) -> tuple[Path, Path]:
    from onnxruntime.quantization import quantize_dynamic

    folder = tmp_path_factory.mktemp("crnn")
    source = _float_crnn(folder / "float.onnx")
    quantize_dynamic(str(source), str(folder / "int8.onnx"), op_types_to_quantize=["Conv", "LSTM", "MatMul"])
    return source, folder / "int8.onnx"


def test_every_dynamic_int8_node_becomes_its_float_operator(quantized_crnn):
    source, quantized = quantized_crnn
    model = onnx.load(str(quantized))
    assert dynamic_int8_ops(model) == ["ConvInteger", "DynamicQuantizeLSTM", "MatMulInteger"]
    restored = dequantized(model)
    onnx.checker.check_model(restored)
    assert dynamic_int8_ops(restored) == []
    ops = [n.op_type for n in restored.graph.node]
    assert {"Conv", "LSTM", "MatMul"} <= set(ops) and "DynamicQuantizeLinear" not in ops and "Cast" not in ops
    # nothing int8 is left behind in the file
    assert all(i.data_type == TensorProto.FLOAT or i.data_type == TensorProto.INT64 for i in restored.graph.initializer)

    x = {"x": np.random.default_rng(1).standard_normal((1, 1, 6, 10)).astype(np.float32)}
    (want,) = cpu_session(source).run(None, x)
    (ort_int8,) = cpu_session(quantized).run(None, x)
    (got,) = cpu_session(restored.SerializeToString()).run(None, x)
    # the weights are the int8 ones, the activations no longer rounded: closer to the float model
    # than ONNX Runtime's INT8 is, and close to both
    assert np.abs(got - want).max() < np.abs(ort_int8 - want).max()
    np.testing.assert_allclose(got, ort_int8, atol=0.1 * np.abs(want).max())
    np.testing.assert_allclose(got, want, atol=0.05 * np.abs(want).max())


def test_a_node_not_laid_out_as_quantize_dynamic_writes_it_is_named(tmp_path):
    weight = numpy_helper.from_array(np.ones((2, 1, 1, 1), np.int8), "w")
    graph = helper.make_graph(
        [helper.make_node("ConvInteger", ["x", "w"], ["y"], name="raw_conv")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 1, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ExportError, match=r"'raw_conv' \(ConvInteger\).*not quantized by a DynamicQuantizeLinear"):
        dequantized(model)


def test_ddddocr_recognizer_reads_the_same_text_dequantized(zoo_models):
    """ddddocr's CRNN ships quantized by an early ONNX Runtime (its bias divided, floored and cast
    at run time; a DynamicQuantizeLSTM; 8210 classes through MatMulInteger), on real text lines."""
    from unideploy.guard.accuracy import compare

    path = zoo_models.shipped("ddddocr/common_old.onnx")
    lines = zoo_models.nchw(zoo_models.text_lines(12, aspect=4.0), 64, 256, gray=True, mean=0.5, std=0.5)
    source, restored = cpu_session(path), cpu_session(dequantized(onnx.load(str(path))).SerializeToString())
    expected = [{"text": source.run(None, {"input1": line[None]})[0]} for line in lines]
    got = [{"text": restored.run(None, {"input1": line[None]})[0]} for line in lines]
    judged = compare(expected, got, None, "auto", 1.0)["outputs"]["text"]
    assert judged["metric"] == "text" and judged["within_budget"], judged


def _conv_on_int8_weights(quantize_input: bool) -> onnx.ModelProto:
    """A Conv whose weights are int8 with a scale per output channel, dequantized in the graph, as
    tf2onnx writes a TFLite model with int8 weights; optionally its input quantized at run time too
    (QDQ: the graph then computes in int8)."""
    rng = np.random.default_rng(0)
    q = rng.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8)
    constants = [
        numpy_helper.from_array(q, "w_q"),
        numpy_helper.from_array(rng.uniform(0.001, 0.01, 4).astype(np.float32), "w_scale"),
        numpy_helper.from_array(np.zeros(4, np.int8), "w_zero"),
        numpy_helper.from_array(np.float32(0.02), "x_scale"),
        numpy_helper.from_array(np.int8(0), "x_zero"),
    ]
    nodes = [helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero"], ["w"], name="dq_w", axis=0)]
    x = "x"
    if quantize_input:
        nodes += [
            helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["xq"], name="q_x"),
            helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zero"], ["xd"], name="dq_x"),
        ]
        x = "xd"
    nodes.append(helper.make_node("Conv", [x, "w"], ["y"], name="conv", pads=[1, 1, 1, 1]))
    graph = helper.make_graph(
        nodes,
        "int8_weights",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        constants,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_int8_weights_fold_into_the_float_weights_the_model_multiplies_by(tmp_path):
    """Constant DequantizeLinear nodes (int8 weights, float activations) become float weights: the
    same outputs, no int8 left; a graph that also quantizes an activation is left as it is."""
    weights_only = _conv_on_int8_weights(quantize_input=False)
    assert dynamic_int8_ops(weights_only) == ["DequantizeLinear"]
    folded = dequantized(weights_only)
    onnx.checker.check_model(folded)
    assert [n.op_type for n in folded.graph.node] == ["Conv"] and dynamic_int8_ops(folded) == []
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    outputs = []
    for name, model in (("int8.onnx", weights_only), ("float.onnx", folded)):
        onnx.save(model, tmp_path / name)
        outputs.append(cpu_session(str(tmp_path / name)).run(None, {"x": x})[0])
    np.testing.assert_allclose(outputs[1], outputs[0], atol=1e-6)
    assert dynamic_int8_ops(_conv_on_int8_weights(quantize_input=True)) == []  # int8 activations: not undone
