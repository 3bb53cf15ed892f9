"""MediaPipe's ``Convolution2DTransposeBias`` written as TFLite's builtin operators, for tf2onnx.

MediaPipe's segmentation networks (selfie segmentation, hair segmentation) upsample with a custom
operator that is TFLite's ``TRANSPOSE_CONV`` with a bias added: the same weight layout (output
channels, height, width, input channels), and as options the C struct ``TfLiteTransposeConvParams``
(padding, stride width, stride height: three little-endian int32) written as raw bytes. LiteRT runs
it through XNNPACK, which knows it; tf2onnx does not, and tries to read the struct as a FlexBuffer.
A copy for tf2onnx holds ``TRANSPOSE_CONV`` followed by ``ADD`` of the bias in its place, which
tf2onnx maps to ONNX's ConvTranspose and Add. The package keeps the source as it is: LiteRT runs
it, and it stays the reference the ONNX artifact is checked against.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np

from unideploy.exporters.tflite_flatbuffer import builtin_of, text
from unideploy.quiet import quiet

TRANSPOSE_CONV_BIAS = "Convolution2DTransposeBias"
_PARAMS = struct.Struct("<iii")  # TfLiteTransposeConvParams: padding, stride_width, stride_height
_TFLITE_PADDING = {1: "SAME", 2: "VALID"}  # TfLitePadding's values in the C API


def builtin_transposes(src: Path, out: Path) -> int:
    """Write ``src`` to ``out`` with each ``Convolution2DTransposeBias`` of the main subgraph
    replaced by ``TRANSPOSE_CONV`` and ``ADD``; return how many (0: none, and nothing is written)."""
    with quiet():
        from tensorflow.lite.python import schema_py_generated as schema
        from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model(str(src))
    custom = {i for i, code in enumerate(model.operatorCodes) if text(code.customCode) == TRANSPOSE_CONV_BIAS}
    graph = model.subgraphs[0]
    found = [op for op in graph.operators if op.opcodeIndex in custom]
    if not found:
        return 0
    transpose_code = _code(model, schema, schema.BuiltinOperator.TRANSPOSE_CONV)
    add_code = _code(model, schema, schema.BuiltinOperator.ADD)
    for op in found:
        data, weights, bias = (int(i) for i in op.inputs)
        output = int(op.outputs[0])
        padding, stride_w, stride_h = _options(op)
        shape = _constant(model, schema, graph, "output_shape", np.asarray(graph.tensors[output].shape, np.int32))
        convolved = _tensor_like(graph, schema, graph.tensors[output], "transpose_conv")
        options = schema.TransposeConvOptionsT()
        options.padding = getattr(schema.Padding, padding)
        options.strideW, options.strideH = stride_w, stride_h
        transpose = _operator(schema, transpose_code, [shape, weights, data], [convolved])
        transpose.builtinOptionsType, transpose.builtinOptions = schema.BuiltinOptions.TransposeConvOptions, options
        add = _operator(schema, add_code, [convolved, bias], [output])
        add.builtinOptionsType, add.builtinOptions = schema.BuiltinOptions.AddOptions, schema.AddOptionsT()
        at = graph.operators.index(op)
        graph.operators[at : at + 1] = [transpose, add]
    flatbuffer_utils.write_model(model, str(out))
    return len(found)


def _options(op: Any) -> tuple[str, int, int]:
    """The padding (``SAME``/``VALID``) and strides the operator's raw options hold (LiteRT loaded
    the source through XNNPACK, which reads them so: they are well formed)."""
    padding, stride_w, stride_h = _PARAMS.unpack(bytes(op.customOptions))
    return _TFLITE_PADDING[padding], stride_w, stride_h


def _code(model: Any, schema: Any, builtin: int) -> int:
    """The index of ``builtin``'s operator code in ``model``, added where the model has none."""
    for i, code in enumerate(model.operatorCodes):
        if not code.customCode and builtin_of(code) == builtin:
            return i
    code = schema.OperatorCodeT()
    code.builtinCode, code.deprecatedBuiltinCode, code.version = builtin, min(builtin, 127), 1
    model.operatorCodes.append(code)
    return len(model.operatorCodes) - 1


def _constant(model: Any, schema: Any, graph: Any, name: str, value: np.ndarray) -> int:
    buffer = schema.BufferT()
    buffer.data = np.frombuffer(value.tobytes(), np.uint8)
    model.buffers.append(buffer)
    tensor = schema.TensorT()
    tensor.name, tensor.shape, tensor.type = (
        f"{name}_{len(graph.tensors)}".encode(),
        list(value.shape),
        schema.TensorType.INT32,
    )
    tensor.buffer = len(model.buffers) - 1
    graph.tensors.append(tensor)
    return len(graph.tensors) - 1


def _tensor_like(graph: Any, schema: Any, like: Any, suffix: str) -> int:
    tensor = schema.TensorT()
    tensor.name, tensor.shape, tensor.type, tensor.buffer = (
        f"{text(like.name)}/{suffix}".encode(),
        list(like.shape),
        like.type,
        0,
    )
    graph.tensors.append(tensor)
    return len(graph.tensors) - 1


def _operator(schema: Any, code: int, inputs: list[int], outputs: list[int]) -> Any:
    op = schema.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = code, inputs, outputs
    return op
