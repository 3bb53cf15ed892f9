""".tflite files: recognized by their content, named as LiteRT's signature runner names them,
converted by tf2onnx and validated against LiteRT itself; bad files refused in one line."""

from __future__ import annotations

import os

import numpy as np
import pytest
from console import assert_one_line_error, deploy

import unideploy

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
keras = pytest.importorskip("keras", reason="the tensorflow extra is not installed")
pytest.importorskip("tf2onnx", reason="the tflite extra is not installed")
litert = pytest.importorskip("ai_edge_litert.interpreter", reason="the tflite extra is not installed")


def _litert(path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    interpreter = litert.Interpreter(model_path=str(path))
    return interpreter.get_signature_runner()(**inputs)


def test_tflite_file_exports_by_its_signature_names_and_matches_litert(tflite_files, tmp_path):
    with unideploy.export(tflite_files["float"], tmp_path / "pkg.zip") as package:
        manifest = package.manifest
        assert manifest.source["exporter"] == "tflite" and manifest.source["framework"] == "tflite"
        assert manifest.source["conversion_path"].startswith("tf2onnx")
        # the signature runner's names, not the tensors' (serving_default_image:0)
        assert manifest.signature.input_names == ["image"] and manifest.signature.output_names == ["output_0"]
        assert manifest.signature.inputs[0].shape == ("batch", 16, 16, 3)  # channels last, as the model takes it
        record = manifest.validation["onnx-fp32"]
        assert record["passed"] and record["reference"] == "tflite" and record["batch_sizes"] == [1, 4]
        x = np.random.default_rng(1).random((3, 16, 16, 3), np.float32)
        got = unideploy.run(package, {"image": x})["output_0"]
    np.testing.assert_allclose(got, _litert(tflite_files["float"], {"image": x})["output_0"], atol=1e-5, rtol=1e-3)


def test_a_full_integer_model_is_an_int8_artifact_judged_against_litert(tflite_files, tmp_path):
    """tf2onnx writes the quantized graph as QuantizeLinear/DequantizeLinear, which ONNX Runtime runs
    with its own int8 kernels: the artifact is int8, takes and returns uint8 as the .tflite does, and
    is admitted by the accuracy guard (its uint8 scores read as the scores they stand for), then held
    to the error it showed, as ``deploy verify`` checks."""
    with unideploy.export(tflite_files["uint8"], tmp_path / "pkg") as package:
        manifest = package.manifest
        (artifact,) = manifest.artifacts
        assert (artifact.id, artifact.precision) == ("onnx-int8", "int8")
        assert (manifest.signature.inputs[0].dtype, manifest.signature.outputs[0].dtype) == ("uint8", "uint8")
        record = manifest.validation["onnx-int8"]
        assert "quantized tensors" in record["quantization"] and record["accuracy"]["within_budget"]
        assert record["accuracy"]["outputs"]["output_0"]["metric"] == "top1"  # scores, not labels
        # judged on random rows (no --example-input): the verdict says so wherever it is shown
        assert record["accuracy"]["rows_are"] == "synthetic reference rows (random inputs)"
        x = np.random.default_rng(2).integers(0, 256, (2, 16, 16, 3), dtype=np.uint8)
        got = unideploy.run(package, {"image": x})["output_0"]
    expected = _litert(tflite_files["uint8"], {"image": x})["output_0"]
    assert got.dtype == np.uint8 and np.abs(got.astype(int) - expected.astype(int)).max() <= 2
    result = deploy("verify", tmp_path / "pkg")
    assert result.returncode == 0, result.stdout + result.stderr


def test_float_examples_for_a_quantized_input_are_refused_with_its_scale(tflite_files, tmp_path):
    np.savez(tmp_path / "x.npz", image=np.random.default_rng(3).random((2, 16, 16, 3), np.float32))
    result = deploy("export", tflite_files["uint8"], "-o", tmp_path / "pkg", "--example-input", tmp_path / "x.npz")
    assert_one_line_error(result, 2, r"input 'image' of 'cnn_uint8.tflite' is quantized to uint8 \(scale ")
    assert "np.clip(np.round(x / " in result.stderr and not (tmp_path / "pkg").exists()


def test_an_int8_package_is_not_optimized_or_built_for_tensorrt_and_says_why(tflite_files, tmp_path):
    """Optimizers and TensorRT start from a float model: an int8 one from a quantized source is
    refused, with the reason (its TFLite artifact is the source itself: tests/edge)."""
    result = deploy("export", tflite_files["uint8"], "-o", tmp_path / "pkg")
    assert result.returncode == 0, result.stderr
    assert "within the accuracy budget on 5 synthetic reference rows (random inputs)" in " ".join(result.stdout.split())
    result = deploy("optimize", tmp_path / "pkg", "--quantize", "fp16", "--synthetic-calibration", "-o", tmp_path / "o")
    assert_one_line_error(result, 2, "'onnx-int8' computes in int8 already")
    result = deploy("export", tflite_files["uint8"], "-o", tmp_path / "gpu", "--target", "gpu")
    assert_one_line_error(result, 2, "TensorRT fp16 is built from an fp32 model")


def test_a_tflite_file_is_recognized_by_its_content(tflite_files, tmp_path):
    renamed = tmp_path / "model.bin"
    renamed.write_bytes(tflite_files["float"].read_bytes())
    result = deploy("export", renamed, "-o", tmp_path / "pkg")
    assert result.returncode == 0, result.stderr
    assert "(tflite via tf2onnx" in " ".join(result.stdout.split())
    (tmp_path / "notes.tflite").write_text("not a flatbuffer")  # a name alone is not enough
    result = deploy("export", tmp_path / "notes.tflite", "-o", tmp_path / "other")
    assert_one_line_error(result, 2, "cannot tell what kind of model")


def test_a_cut_short_tflite_file_is_refused_and_nothing_is_written(tflite_files, tmp_path):
    cut = tmp_path / "cut.tflite"
    cut.write_bytes(tflite_files["float"].read_bytes()[:400])
    result = deploy("export", cut, "-o", tmp_path / "pkg")
    assert_one_line_error(result, 2, "cannot be loaded by LiteRT")
    assert not (tmp_path / "pkg").exists()


def test_a_model_with_tensorflow_operators_that_read_files_is_refused_unrun(tmp_path):
    """Select TF operators (here ReadFile) run only through LiteRT's Flex delegate, which the
    exporter's interpreter does not have: the model is refused before anything runs (docs/security.md)."""
    import tensorflow as tf

    class Reads(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1], tf.float32)])
        def serve(self, x):
            return {"y": x + tf.cast(tf.strings.length(tf.io.read_file(str(tmp_path / "secret"))), tf.float32)}

    module = Reads()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([module.serve.get_concrete_function()], module)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS, tf.lite.OpsSet.SELECT_TF_OPS]
    (tmp_path / "reads.tflite").write_bytes(converter.convert())
    result = deploy("export", tmp_path / "reads.tflite", "-o", tmp_path / "pkg")
    assert_one_line_error(result, 2, "cannot be loaded by LiteRT: Select TensorFlow op")
    assert not (tmp_path / "pkg").exists()


def test_an_unknown_signature_is_refused_with_the_one_there_is(tflite_files, tmp_path):
    result = deploy("export", tflite_files["float"], "-o", tmp_path / "pkg", "--signature", "serve")
    assert_one_line_error(result, 2, "has no signature 'serve'")
    assert "its signature is 'serving_default'" in result.stderr
