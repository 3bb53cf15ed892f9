"""What an ONNX graph computes in: quantized operators at any depth, else the float type most of
its weights have, on graphs quantized and converted here by ONNX Runtime's own tools."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from unideploy.onnx.precision import graph_precision, quantized_ops


def _dense(path: Path, weight_type: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """x [batch, 16] -> MatMul by a 16x8 weight -> y, in ``weight_type`` throughout."""
    weight = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
    tensor = numpy_helper.from_array(weight, "w")
    if weight_type == TensorProto.BFLOAT16:  # numpy has no bfloat16: its top 16 bits, as the type stores
        tensor = helper.make_tensor("w", TensorProto.BFLOAT16, [16, 8], (weight.view(np.uint32) >> 16).tolist())
    elif weight_type == TensorProto.FLOAT16:
        tensor = numpy_helper.from_array(weight.astype(np.float16), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="dense")],
        "dense",
        [helper.make_tensor_value_info("x", weight_type, ["batch", 16])],
        [helper.make_tensor_value_info("y", weight_type, ["batch", 8])],
        [tensor],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return model


def test_a_float_model_is_fp32_and_onnx_runtime_s_quantization_makes_it_int8(tmp_path):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    assert graph_precision(_dense(tmp_path / "float.onnx")) == "fp32"
    quantize_dynamic(str(tmp_path / "float.onnx"), str(tmp_path / "int8.onnx"), weight_type=QuantType.QInt8)
    quantized = onnx.load(str(tmp_path / "int8.onnx"))
    assert quantized_ops(quantized.graph) == ["DynamicQuantizeLinear", "MatMulInteger"]
    assert graph_precision(quantized) == "int8"


def test_quantized_operators_inside_a_branch_make_the_model_int8(tmp_path):
    """Silero VAD keeps its layers in If branches: a quantized one there is found too."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    _dense(tmp_path / "float.onnx")
    quantize_dynamic(str(tmp_path / "float.onnx"), str(tmp_path / "int8.onnx"), weight_type=QuantType.QInt8)
    quantized = onnx.load(str(tmp_path / "int8.onnx")).graph  # reads x from the enclosing graph
    then = helper.make_graph(list(quantized.node), "then", [], list(quantized.output), list(quantized.initializer))
    passed = helper.make_graph([helper.make_node("Identity", ["x"], ["y_else"])], "else", [], [])
    passed.output.extend([helper.make_tensor_value_info("y_else", TensorProto.FLOAT, ["batch", 16])])
    graph = helper.make_graph(
        [helper.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=passed)],
        "gated",
        [helper.make_tensor_value_info("flag", TensorProto.BOOL, []), *quantized.input],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert quantized_ops(model.graph) == ["DynamicQuantizeLinear", "MatMulInteger"]
    assert graph_precision(model) == "int8"


def test_weights_in_fp16_or_bf16_make_the_model_that_precision_wherever_they_lie(tmp_path):
    """Sizes come from the dims, so weights in external data that is not loaded count the same."""
    assert graph_precision(_dense(tmp_path / "half.onnx", TensorProto.FLOAT16)) == "fp16"
    assert graph_precision(_dense(tmp_path / "brain.onnx", TensorProto.BFLOAT16)) == "bf16"
    model = _dense(tmp_path / "big.onnx", TensorProto.FLOAT16)
    onnx.save(model, str(tmp_path / "external.onnx"), save_as_external_data=True, size_threshold=0)
    unloaded = onnx.load(str(tmp_path / "external.onnx"), load_external_data=False)
    assert not unloaded.graph.initializer[0].raw_data
    assert graph_precision(unloaded) == "fp16"


def test_onnx_runtime_s_fp16_converter_keeps_a_few_fp32_weights_and_the_model_is_fp16(tmp_path):
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = _dense(tmp_path / "float.onnx")
    scale = numpy_helper.from_array(np.ones(8, np.float32), "scale")
    model.graph.initializer.append(scale)
    model.graph.node.append(helper.make_node("Mul", ["y", "scale"], ["z"], name="scaled"))
    model.graph.output[0].name = "z"
    converted = convert_float_to_float16(model, keep_io_types=True, node_block_list=["scaled"])
    kinds = sorted(t.data_type for t in converted.graph.initializer)
    assert kinds == [TensorProto.FLOAT, TensorProto.FLOAT16], kinds  # the blocked node's weight stays fp32
    assert graph_precision(converted) == "fp16"


def test_a_graph_without_float_weights_is_fp32():
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["c"])],
        "sum",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("a", "b")],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2])],
    )
    assert graph_precision(helper.make_model(graph)) == "fp32"


def test_a_weights_unused_mantissa_bits_name_the_precision_it_was_made_in():
    """fp16 values held in fp32 leave 13 low mantissa bits zero, bfloat16's 16, fp32's none; too few
    values with any bit set (zeros, powers of two) say nothing, and are read as fp32."""
    from unideploy.onnx.precision import MANTISSA_EVIDENCE, unused_mantissa_bits

    weights = np.random.default_rng(1).standard_normal(4096).astype(np.float32)
    bfloat16 = (weights.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    assert unused_mantissa_bits(weights.astype(np.float16).astype(np.float32)) == 13
    assert unused_mantissa_bits(bfloat16) == 16
    assert unused_mantissa_bits(weights) == 0
    assert unused_mantissa_bits(np.zeros(4096, np.float32)) == 0
    assert unused_mantissa_bits(np.float32([1.5] * (MANTISSA_EVIDENCE - 1) + [0.25] * 100)) == 0


def test_values_are_rounded_to_the_precision_of_those_they_replace():
    """Rounded to fp16's mantissa where the weights replaced are fp16 values: the same values numpy's
    float16 rounding (to nearest, ties to even) gives, negatives and carries into the exponent
    included; never coarser (weights of small integers, bfloat16's, hold new values to fp16's
    precision too); against fp32 weights unchanged."""
    from unideploy.onnx.precision import rounded_like

    rng = np.random.default_rng(2)
    fp16_weights = rng.standard_normal(1000).astype(np.float16).astype(np.float32)
    values = np.concatenate([rng.standard_normal(10000) * 4, [1.99951171875, -1.99951171875, 1 + 2**-11]])
    values = values.astype(np.float32)
    assert np.array_equal(rounded_like(values, fp16_weights), values.astype(np.float16).astype(np.float32))
    assert np.array_equal(rounded_like(values, rng.standard_normal(1000).astype(np.float32)), values)
    small_integers = rng.integers(-8, 8, 1000).astype(np.float32)  # a fixed filter: 20 or more bits unused
    assert np.array_equal(rounded_like(values, small_integers), values.astype(np.float16).astype(np.float32))
