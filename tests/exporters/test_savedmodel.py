"""TensorFlow SavedModels built by the tests: a Keras CNN, an attention block with exact GELU,
a multi-input signature and a module with several signatures."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

import unideploy
from unideploy.errors import InputError

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow", reason="the tensorflow extra is not installed")
keras = pytest.importorskip("keras")


@pytest.mark.parametrize("name", ["cnn", "attention", "two_inputs"])
def test_savedmodel_exports_and_matches_tensorflow(saved_models, name, tmp_path):
    src = saved_models / name
    with unideploy.export(src, tmp_path / "pkg") as package:
        manifest = package.manifest
        assert manifest.source["framework"] == "tensorflow" and manifest.source["exporter"] == "savedmodel"
        assert manifest.validation["onnx-fp32"]["passed"] and manifest.validation["onnx-fp32"]["batch_sizes"] == [1, 4]
        assert all(spec.shape[0] == "batch" for spec in manifest.signature.inputs)
        assert (package.root / manifest.source["path"] / "saved_model.pb").is_file()  # the source is kept
        rng = np.random.default_rng(5)
        inputs = {s.name: rng.standard_normal((7, *s.shape[1:])).astype(s.dtype) for s in manifest.signature.inputs}
        got = unideploy.run(package, inputs)
    expected = tf.saved_model.load(str(src)).signatures["serving_default"](
        **{k: tf.constant(v) for k, v in inputs.items()}
    )
    for key, value in expected.items():
        np.testing.assert_allclose(got[key], value.numpy(), atol=1e-4, rtol=1e-3)


def test_exact_gelu_is_converted_not_left_as_erfc(saved_models, tmp_path):
    with unideploy.export(saved_models / "attention", tmp_path / "pkg") as package:
        ops = {n.op_type for n in onnx.load(str(package.path_of("onnx-fp32"))).graph.node}
    assert "Erf" in ops and "Erfc" not in ops


def test_signature_names_dtypes_and_shapes_come_from_the_savedmodel(saved_models, tmp_path):
    with unideploy.export(saved_models / "two_inputs", tmp_path / "pkg") as package:
        sig = package.manifest.signature
        assert [(t.name, t.dtype, t.shape) for t in sig.inputs] == [
            ("a", "float32", ("batch", 4)),
            ("b", "float32", ("batch", 3)),
        ]
        assert [t.name for t in sig.outputs] == ["output_0"]  # Keras' export names outputs by position


def test_signature_option_selects_another_signature(saved_models, tmp_path):
    with unideploy.export(saved_models / "scaler", tmp_path / "shift", signature="shift") as package:
        out = unideploy.run(package, {"x": np.ones((2, 3), np.float32)})["y"]
        np.testing.assert_allclose(out, 2.0)
        assert "signature 'shift'" in package.manifest.source["conversion_path"]


def test_missing_signature_is_named_with_the_available_ones(saved_models, tmp_path):
    with pytest.raises(InputError, match="no signature 'predict'.*serving_default, shift"):
        unideploy.export(saved_models / "scaler", tmp_path / "pkg", signature="predict")
    assert not (tmp_path / "pkg").exists()


def test_corrupt_savedmodel_is_refused(saved_models, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(saved_models / "cnn", broken)
    (broken / "saved_model.pb").write_bytes(b"\x00\x01garbage" * 10)
    with pytest.raises(InputError, match="not a readable SavedModel"):
        unideploy.export(broken, tmp_path / "pkg")


def test_cli_export_of_a_savedmodel(saved_models, tmp_path):
    import json
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    deploy = shutil.which("deploy", path=str(Path(sys.executable).parent))
    ok = subprocess.run(
        [deploy, "export", str(saved_models / "scaler"), "-o", str(tmp_path / "s.zip"), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["source"]["framework"] == "tensorflow"
    bad = subprocess.run(
        [deploy, "export", str(saved_models / "scaler"), "-o", str(tmp_path / "t"), "--signature", "nope"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and bad.stderr.startswith("error: the SavedModel has no signature 'nope'")
    assert "Traceback" not in bad.stderr


def test_constant_is_refused_for_a_savedmodel_naming_the_sources_that_take_it(saved_models, tmp_path):
    with pytest.raises(
        InputError, match=r"--constant binds non-tensor forward\(\) arguments of TorchScript and torch.export sources"
    ):
        unideploy.export(saved_models / "scaler", tmp_path / "pkg", constants={"rate": 16000})
    assert not (tmp_path / "pkg").exists()
