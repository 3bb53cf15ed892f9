"""MediaPipe's ``Convolution2DTransposeBias`` read as TRANSPOSE_CONV + ADD: on small transposed
convolutions written here as MediaPipe writes them (both paddings, an odd kernel, so that SAME pads
unevenly); MediaPipe's selfie segmentation as it ships is in tests/test_zoo.py."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from console import deploy

tf = pytest.importorskip("tensorflow", reason="the tensorflow extra is not installed")

from unideploy.exporters.tflite_custom import TRANSPOSE_CONV_BIAS, builtin_transposes  # noqa: E402

_PADDING = {"same": 1, "valid": 2}  # TfLitePadding's values


def _builtin_model(padding: str, path: Path) -> Path:
    """x [1, 6, 5, 4] -> Conv2DTranspose(3 filters, 3x3, stride 2, ``padding``) with a bias."""
    inputs = tf.keras.Input((6, 5, 4), batch_size=1, name="x")
    layer = tf.keras.layers.Conv2DTranspose(3, 3, strides=2, padding=padding, name="up")
    model = tf.keras.Model(inputs, layer(inputs))
    rng = np.random.default_rng(0)
    layer.set_weights([rng.standard_normal(w.shape).astype(np.float32) for w in layer.get_weights()])
    path.write_bytes(tf.lite.TFLiteConverter.from_keras_model(model).convert())
    return path


def _as_mediapipe_writes_it(builtin: Path, padding: str, path: Path, code_name: str = TRANSPOSE_CONV_BIAS) -> Path:
    """The TRANSPOSE_CONV (output shape, weights, input, bias) as MediaPipe's custom operator
    (input, weights, bias), its options the raw TfLiteTransposeConvParams; under ``code_name``."""
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model(str(builtin))
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.CUSTOM
    code.customCode, code.version = code_name.encode(), 1
    model.operatorCodes.append(code)
    (op,) = [
        op
        for op in model.subgraphs[0].operators
        if model.operatorCodes[op.opcodeIndex].builtinCode == schema.BuiltinOperator.TRANSPOSE_CONV
    ]
    _, weights, data, bias = op.inputs
    assert bias >= 0, "TensorFlow's converter folds the bias into TRANSPOSE_CONV"
    op.opcodeIndex, op.inputs = len(model.operatorCodes) - 1, [data, weights, bias]
    op.builtinOptionsType, op.builtinOptions = schema.BuiltinOptions.NONE, None
    op.customOptions = np.frombuffer(struct.pack("<iii", _PADDING[padding], 2, 2), np.uint8)
    flatbuffer_utils.write_model(model, str(path))
    return path


def _run(path: Path, x: np.ndarray) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))  # XNNPACK runs MediaPipe's operator
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])


def _custom_codes(path: Path) -> list[str]:
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model(str(path))
    return [
        model.operatorCodes[op.opcodeIndex].customCode.decode()
        for op in model.subgraphs[0].operators
        if model.operatorCodes[op.opcodeIndex].customCode
    ]


@pytest.fixture(scope="module", params=["same", "valid"])
def mediapipe_style(request, tmp_path_factory) -> tuple[Path, Path]:
    """(the model as TensorFlow's converter writes it, the same model as MediaPipe writes it)."""
    folder = tmp_path_factory.mktemp(f"transpose-{request.param}")
    builtin = _builtin_model(request.param, folder / "builtin.tflite")
    return builtin, _as_mediapipe_writes_it(builtin, request.param, folder / "mediapipe.tflite")


def test_the_builtin_copy_computes_what_the_custom_operator_does(mediapipe_style, tmp_path):
    builtin, custom = mediapipe_style
    assert _custom_codes(custom) == [TRANSPOSE_CONV_BIAS]
    x = np.random.default_rng(1).standard_normal((1, 6, 5, 4)).astype(np.float32)
    np.testing.assert_allclose(_run(custom, x), _run(builtin, x), atol=1e-5)  # what is rewritten, as written
    assert builtin_transposes(custom, tmp_path / "copy.tflite") == 1
    assert _custom_codes(tmp_path / "copy.tflite") == []
    np.testing.assert_allclose(_run(tmp_path / "copy.tflite", x), _run(custom, x), atol=1e-5)


def test_a_model_without_the_operator_is_left_alone(mediapipe_style, tmp_path):
    assert builtin_transposes(mediapipe_style[0], tmp_path / "copy.tflite") == 0
    assert not (tmp_path / "copy.tflite").exists()


def test_a_model_with_the_operator_exports_and_says_how_it_was_read(mediapipe_style, tmp_path):
    result = deploy("export", mediapipe_style[1], "-o", tmp_path / "pkg")
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "pkg" / "manifest.json").read_text())
    assert f"(1 MediaPipe {TRANSPOSE_CONV_BIAS} read as TRANSPOSE_CONV + ADD)" in manifest["source"]["conversion_path"]
    assert manifest["validation"]["onnx-fp32"]["passed"]
    made = _run(mediapipe_style[0], np.zeros((1, 6, 5, 4), np.float32))  # SAME: 12 x 10; VALID: 13 x 11
    assert manifest["signature"]["outputs"][0]["shape"] == list(made.shape)


def test_litert_s_builtin_kernels_run_the_copy_where_only_xnnpack_runs_the_source(mediapipe_style, tmp_path):
    """The second engine the export compares LiteRT's XNNPACK with is its builtin kernels, which
    know no custom operator: they run the builtin copy, and a source they cannot load has no second
    engine rather than a failed export."""
    from unideploy.exporters.tflite_file import _builtin_kernels

    builtin_transposes(mediapipe_style[1], tmp_path / "copy.tflite")
    assert _builtin_kernels(mediapipe_style[1]) is None
    assert _builtin_kernels(tmp_path / "copy.tflite") is not None


def test_a_custom_operator_no_engine_here_runs_is_refused_naming_it(mediapipe_style, tmp_path):
    """MediaPipe's face mesh with attention holds Landmarks2TransformMatrix, which only MediaPipe's
    own runtime registers: LiteRT cannot load such a model, and the refusal names the operator."""
    from console import assert_one_line_error

    unknown = _as_mediapipe_writes_it(mediapipe_style[0], "same", tmp_path / "unknown.tflite", "TransformLandmarks")
    assert_one_line_error(
        deploy("export", unknown, "-o", tmp_path / "pkg"), 2, r"its custom operator TransformLandmarks runs only where"
    )
    assert not (tmp_path / "pkg").exists()
