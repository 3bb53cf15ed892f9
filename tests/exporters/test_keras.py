"""Keras 3 .keras files: signature from the model, output names from its layers, validation
against Keras itself."""

from __future__ import annotations

import os

import numpy as np
import pytest
from console import assert_one_line_error, deploy

import unideploy

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
keras = pytest.importorskip("keras", reason="the tensorflow extra is not installed")


@pytest.fixture(scope="module")
def keras_cnn(tmp_path_factory):
    keras.utils.set_random_seed(0)
    image = keras.Input((16, 16, 3), name="image")
    x = keras.layers.Conv2D(8, 3, activation="relu")(image)
    x = keras.layers.DepthwiseConv2D(3, padding="same")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    probs = keras.layers.Dense(5, activation="softmax", name="probs")(x)
    path = tmp_path_factory.mktemp("keras") / "cnn.keras"
    keras.Model(image, probs).save(path)
    return path


def test_keras_file_exports_and_matches_keras(keras_cnn, tmp_path):
    with unideploy.export(keras_cnn, tmp_path / "pkg.zip") as package:
        manifest = package.manifest
        assert manifest.source["exporter"] == "keras" and manifest.source["framework"] == "keras"
        assert manifest.signature.inputs[0].shape == ("batch", 16, 16, 3)
        assert manifest.signature.output_names == ["probs"] and manifest.signature.outputs[0].shape == ("batch", 5)
        assert manifest.validation["onnx-fp32"]["passed"] and manifest.validation["onnx-fp32"]["reference"] == "keras"
        x = np.random.default_rng(0).random((3, 16, 16, 3), np.float32)
        got = unideploy.run(package, {"image": x})["probs"]
    expected = np.asarray(keras.saving.load_model(keras_cnn)(x, training=False))
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-3)


def test_signature_option_is_refused_for_keras_files(keras_cnn, tmp_path):
    result = deploy("export", keras_cnn, "-o", tmp_path / "pkg", "--signature", "serve")
    assert_one_line_error(result, 2, "--signature applies to SavedModel directories")


def test_corrupt_keras_file_is_refused(tmp_path):
    import zipfile

    with zipfile.ZipFile(tmp_path / "bad.keras", "w") as zf:
        zf.writestr("config.json", "{not json")
    result = deploy("export", tmp_path / "bad.keras", "-o", tmp_path / "pkg")
    assert_one_line_error(result, 2, "cannot be loaded by Keras")
    assert not (tmp_path / "pkg").exists()
