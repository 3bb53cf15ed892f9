"""TensorFlow 1 frozen graphs (.pb GraphDefs): inputs and outputs read from the graph, converted by
tf2onnx and validated against TensorFlow running the graph; files that are not one refused in one
line. A real pretrained network frozen this way: tests/test_zoo.py."""

from __future__ import annotations

import os

import numpy as np
import pytest
from console import assert_one_line_error, deploy

import unideploy

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow", reason="the tensorflow extra is not installed")
pytest.importorskip("tf2onnx", reason="the tensorflow extra is not installed")


def _graph(build) -> bytes:
    """The GraphDef ``build`` makes in a TF1 graph, serialized as ``tf.io.write_graph`` writes it."""
    graph = tf.Graph()
    with graph.as_default():
        build()
    return graph.as_graph_def().SerializeToString()


def _tf1_classifier() -> None:
    """A TF1 image classifier as it was frozen: a Placeholder for images, a training flag with its
    default, weights as constants, softmax scores the result."""
    rng = np.random.default_rng(0)
    x = tf.compat.v1.placeholder(tf.float32, [None, 8, 8, 3], name="input")
    tf.compat.v1.placeholder_with_default(False, [], name="is_training")
    h = tf.nn.relu(tf.nn.conv2d(x, tf.constant(rng.standard_normal((3, 3, 3, 4)).astype(np.float32)), 1, "SAME"))
    logits = tf.matmul(tf.reduce_mean(h, axis=[1, 2]), tf.constant(rng.standard_normal((4, 5)).astype(np.float32)))
    tf.nn.softmax(logits, name="probs")


def _run_graph(data: bytes, feeds: dict[str, np.ndarray], fetch: str) -> np.ndarray:
    graph_def = tf.compat.v1.GraphDef.FromString(data)
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    with tf.compat.v1.Session(graph=graph) as session:
        return session.run(f"{fetch}:0", {f"{k}:0": v for k, v in feeds.items()})


def test_a_tf1_frozen_graph_exports_by_its_node_names_and_matches_tensorflow(tmp_path):
    data = _graph(_tf1_classifier)
    (tmp_path / "classifier.pb").write_bytes(data)
    with unideploy.export(tmp_path / "classifier.pb", tmp_path / "pkg") as package:
        manifest = package.manifest
        assert (manifest.source["exporter"], manifest.source["framework"]) == ("frozen-graph", "tensorflow")
        # the Placeholder is the input; the training flag keeps its default; softmax is the output
        assert manifest.signature.input_names == ["input"] and manifest.signature.output_names == ["probs"]
        assert manifest.signature.inputs[0].shape == ("batch", 8, 8, 3)
        record = manifest.validation["onnx-fp32"]
        assert record["passed"] and record["reference"] == "tensorflow" and record["batch_sizes"] == [1, 4]
        x = np.random.default_rng(1).random((3, 8, 8, 3), np.float32)
        got = unideploy.run(package, {"input": x})["probs"]
    np.testing.assert_allclose(got, _run_graph(data, {"input": x}, "probs"), atol=1e-6)


def test_a_signature_is_refused_as_a_frozen_graph_has_none(tmp_path):
    (tmp_path / "classifier.pb").write_bytes(_graph(_tf1_classifier))
    result = deploy("export", tmp_path / "classifier.pb", "-o", tmp_path / "pkg", "--signature", "serving_default")
    assert_one_line_error(result, 2, "--signature applies to SavedModel directories and .tflite files")


def test_a_graph_that_was_not_frozen_is_refused_with_how_to_freeze_it(tmp_path):
    def unfrozen() -> None:
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        weights = tf.compat.v1.get_variable("w", [3, 2], initializer=tf.compat.v1.zeros_initializer())
        tf.matmul(x, weights, name="y")

    (tmp_path / "unfrozen.pb").write_bytes(_graph(unfrozen))
    result = deploy("export", tmp_path / "unfrozen.pb", "-o", tmp_path / "pkg")
    assert_one_line_error(result, 2, r"'unfrozen.pb' holds variables \(.*VarHandleOp\)")
    assert "convert_variables_to_constants" in result.stderr and not (tmp_path / "pkg").exists()


def test_a_saved_models_graph_file_alone_is_refused_with_its_folder(saved_models, tmp_path):
    result = deploy("export", saved_models / "cnn" / "saved_model.pb", "-o", tmp_path / "pkg")
    assert_one_line_error(result, 2, "'saved_model.pb' is a SavedModel's graph file")
    assert f"export the folder it is in ({saved_models / 'cnn'})" in result.stderr


def test_a_graph_without_a_placeholder_is_refused_with_what_the_exporter_reads(tmp_path):
    def constant_only() -> None:
        tf.add(tf.constant([1.0]), tf.constant([2.0]), name="y")

    (tmp_path / "constants.pb").write_bytes(_graph(constant_only))
    result = deploy("export", tmp_path / "constants.pb", "-o", tmp_path / "pkg")
    assert_one_line_error(result, 2, "'constants.pb' has no Placeholder to feed")
    assert "export a graph frozen with its inputs as Placeholders" in result.stderr
    assert not (tmp_path / "pkg").exists()


def test_a_damaged_graph_and_one_that_reads_files_are_refused_unrun(tmp_path):
    data = _graph(_tf1_classifier)
    (tmp_path / "cut.pb").write_bytes(data[: len(data) // 2])
    result = deploy("export", tmp_path / "cut.pb", "-o", tmp_path / "pkg")
    assert_one_line_error(result, 2, "'cut.pb' is not a readable TensorFlow graph")

    def reads() -> None:
        x = tf.compat.v1.placeholder(tf.float32, [1], name="x")
        secret = tf.strings.length(tf.io.read_file(str(tmp_path / "secret")))
        tf.add(x, tf.cast(secret, tf.float32), name="y")

    (tmp_path / "reads.pb").write_bytes(_graph(reads))
    result = deploy("export", tmp_path / "reads.pb", "-o", tmp_path / "pkg")
    assert_one_line_error(result, 2, r"contains operations that reach outside the model when it runs: ReadFile")
    assert not (tmp_path / "pkg").exists()
