"""`--target edge`: ORT-mobile artifacts from any source, TFLite from SavedModels, each validated."""

from __future__ import annotations

import numpy as np
import pytest

import unideploy
from unideploy.errors import InputError
from unideploy.verify import verify_package

tf = pytest.importorskip("tensorflow", reason="the tensorflow extra is not installed")
pytest.importorskip("ai_edge_litert", reason="the edge extra is not installed")


@pytest.mark.parametrize("name", ["cnn", "attention"])
def test_savedmodel_to_edge_gives_ort_and_tflite_that_match_tensorflow(saved_models, name, tmp_path):
    src = saved_models / name
    with unideploy.export(src, tmp_path / "edge.zip", target="edge") as package:
        artifacts = {a.id: a for a in package.manifest.artifacts}
        assert set(artifacts) == {"onnx-fp32", "ort-fp32", "tflite-fp32", "tflite-fp16"}
        assert artifacts["ort-fp32"].files[0]["path"] == "artifacts/required_operators.config"
        assert (package.root / "artifacts" / "required_operators.config").read_text().count("ai.onnx") >= 1
        assert all(a.targets == ["edge"] for a in artifacts.values() if a.id != "onnx-fp32")
        assert [c.status for c in verify_package(package)] == ["passed"] * 4
        spec = package.manifest.signature.inputs[0]
        x = np.random.default_rng(2).standard_normal((7, *spec.shape[1:])).astype(np.float32)
        expected = tf.saved_model.load(str(src)).signatures["serving_default"](**{spec.name: tf.constant(x)})
        expected = next(iter(expected.values())).numpy()
        for artifact, runtime, atol in (("ort-fp32", "onnxruntime", 1e-4), ("tflite-fp32", "tflite", 1e-4),
                                        ("tflite-fp16", "tflite", 2e-2)):
            got = unideploy.run(package, {spec.name: x}, artifact=artifact, runtime=runtime)
            np.testing.assert_allclose(next(iter(got.values())), expected, atol=atol, rtol=1e-2)


def test_torchscript_to_edge_gives_ort_and_says_why_no_tflite(torch_models, tmp_path):
    path, shapes = torch_models["cnn_scripted"]
    with unideploy.export(path, tmp_path / "edge", input_shapes=shapes, target="edge") as package:
        assert [a.id for a in package.manifest.artifacts] == ["onnx-fp32", "ort-fp32"]
        assert "onnx2tf" in package.manifest.description
        x = np.zeros((3, 1, 8, 8), np.float32)
        np.testing.assert_allclose(unideploy.run(package, {"x": x}, artifact="ort-fp32")["output"],
                                   unideploy.run(package, {"x": x}, artifact="onnx-fp32")["output"], atol=1e-5)


def test_tflite_runtime_validates_inputs_before_the_interpreter(saved_models, tmp_path):
    with unideploy.export(saved_models / "cnn", tmp_path / "edge", target="edge") as package:
        with pytest.raises(InputError, match="unknown input"):
            unideploy.run(package, {"pixels": np.zeros((1, 8, 8, 1), np.float32)}, artifact="tflite-fp32")
        with pytest.raises(InputError, match="dtype float64"):
            unideploy.run(package, {"image": np.zeros((1, 8, 8, 1))}, artifact="tflite-fp32")


def test_failed_edge_stage_leaves_nothing(torch_models, tmp_path):
    path, shapes = torch_models["histc_traced"]
    from unideploy.errors import ExportError

    with pytest.raises(ExportError, match="aten::histc"):
        unideploy.export(path, tmp_path / "edge", input_shapes=shapes, target="edge")
    assert list(tmp_path.iterdir()) == []
