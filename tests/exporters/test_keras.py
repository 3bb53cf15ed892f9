"""Keras files (Keras 3 .keras, and the legacy HDF5 .h5): signature from the model, output names
from its layers, validation against Keras itself."""

from __future__ import annotations

import os

import numpy as np
import pytest
from console import assert_one_line_error, deploy

import unideploy

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
keras = pytest.importorskip("keras", reason="the tensorflow extra is not installed")

from keras_models import small_cnn  # noqa: E402  (Keras is here: the skip above passed)


@pytest.fixture(scope="module")
def keras_cnn(tmp_path_factory):
    path = tmp_path_factory.mktemp("keras") / "cnn.keras"
    small_cnn().save(path)
    return path


@pytest.fixture(scope="module")
def keras_cnn_h5(tmp_path_factory):
    """The same CNN in the legacy HDF5 format (``model.save('cnn.h5')``), as many published models ship."""
    path = tmp_path_factory.mktemp("keras") / "cnn.h5"
    small_cnn().save(path)
    return path


@pytest.mark.parametrize("model", ["keras_cnn", "keras_cnn_h5"])
def test_keras_file_exports_and_matches_keras(model, request, tmp_path):
    keras_cnn = request.getfixturevalue(model)
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


def test_hdf5_file_is_recognized_by_its_content_without_naming_the_exporter(keras_cnn_h5, tmp_path):
    result = deploy("export", keras_cnn_h5, "-o", tmp_path / "pkg")
    assert result.returncode == 0, result.stderr
    assert "(keras via Keras" in " ".join(result.stdout.split())  # the summary line, as wrapped
    (tmp_path / "notes.h5").write_text("not an HDF5 file")  # a name alone is not enough
    result = deploy("export", tmp_path / "notes.h5", "-o", tmp_path / "other")
    assert_one_line_error(result, 2, "cannot tell what kind of model")


def test_hdf5_file_of_weights_only_is_refused_with_what_to_do(tmp_path):
    weights = tmp_path / "cnn.weights.h5"
    small_cnn().save_weights(weights)
    result = deploy("export", weights, "-o", tmp_path / "pkg")
    assert_one_line_error(result, 2, r"holds no model configuration, only weights .*model\.load_weights")
    assert not (tmp_path / "pkg").exists()


def test_truncated_hdf5_file_is_refused_as_unreadable(keras_cnn_h5, tmp_path):
    truncated = tmp_path / "cnn.h5"
    truncated.write_bytes(keras_cnn_h5.read_bytes()[:4096])  # the signature, then the file cut short
    result = deploy("export", truncated, "-o", tmp_path / "pkg")
    assert_one_line_error(result, 2, "cannot be read as an HDF5 file: .*copied whole")
    assert not (tmp_path / "pkg").exists()
