"""Sparse TFLite weights made dense for tf2onnx: on a layer TensorFlow's converter stored sparse
here (``EXPERIMENTAL_SPARSITY``); MediaPipe's sparse detector as it ships is in tests/test_zoo.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from console import deploy

tf = pytest.importorskip("tensorflow", reason="the tensorflow extra is not installed")

from unideploy.exporters.tflite_dense import densified, sparse_tensors  # noqa: E402


@pytest.fixture(scope="module")
def sparse_model(tmp_path_factory) -> Path:
    """x [1, 32] -> Dense(64), four in five weights zero, converted with weight sparsity."""
    inputs = tf.keras.Input((32,), batch_size=1, name="x")
    layer = tf.keras.layers.Dense(64, name="dense", kernel_initializer="zeros")
    model = tf.keras.Model(inputs, layer(inputs))
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((32, 64)).astype(np.float32)
    weights[rng.random(weights.shape) < 0.8] = 0
    layer.set_weights([weights, np.linspace(-1, 1, 64, dtype=np.float32)])
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.EXPERIMENTAL_SPARSITY]
    path = tmp_path_factory.mktemp("sparse") / "dense_sparse.tflite"
    path.write_bytes(converter.convert())
    return path


def _run(path: Path, x: np.ndarray) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])


def test_the_dense_copy_has_no_sparse_tensor_and_computes_the_same(sparse_model, tmp_path):
    assert len(sparse_tensors(sparse_model)) == 1
    assert densified(sparse_model, tmp_path / "dense.tflite") == 1
    assert sparse_tensors(tmp_path / "dense.tflite") == []
    x = np.random.default_rng(1).standard_normal((1, 32)).astype(np.float32)
    np.testing.assert_array_equal(_run(tmp_path / "dense.tflite", x), _run(sparse_model, x))


def test_a_model_without_sparse_weights_is_left_alone(tflite_files, tmp_path):
    assert densified(tflite_files["float"], tmp_path / "dense.tflite") == 0
    assert not (tmp_path / "dense.tflite").exists()


def test_a_sparse_model_exports_and_its_provenance_says_what_was_made_dense(sparse_model, tmp_path):
    import json

    result = deploy("export", sparse_model, "-o", tmp_path / "pkg")
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "pkg" / "manifest.json").read_text())
    assert manifest["source"]["conversion_path"].endswith("(1 sparse weight tensor(s) made dense by LiteRT's DENSIFY)")
    assert manifest["validation"]["onnx-fp32"]["passed"]


def test_sparse_weights_no_densify_expands_are_refused_before_tf2onnx_reads_them(sparse_model, tmp_path):
    """The same weights read in place by the layer (its DENSIFY taken out, as a converter that lets
    a kernel read sparse weights writes it): tf2onnx would read the compressed buffer as dense and
    stop on a reshape that names nothing; the export says what the model holds and what to do."""
    from console import assert_one_line_error
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model(str(sparse_model))
    graph = model.subgraphs[0]
    (expand,) = [
        op
        for op in graph.operators
        if model.operatorCodes[op.opcodeIndex].builtinCode == schema.BuiltinOperator.DENSIFY
    ]
    for op in graph.operators:
        op.inputs = [expand.inputs[0] if i == expand.outputs[0] else i for i in op.inputs]
    graph.operators.remove(expand)
    flatbuffer_utils.write_model(model, str(tmp_path / "in_place.tflite"))
    result = deploy("export", tmp_path / "in_place.tflite", "-o", tmp_path / "pkg")
    assert_one_line_error(result, 1, r"holds 1 sparse weight tensor\(s\) .* that no DENSIFY operator expands")
    assert "EXPERIMENTAL_SPARSITY" in result.stderr and not (tmp_path / "pkg").exists()
