"""`--target edge` from MindIR: the translated ONNX goes on to .ort and (through onnx2tf) TFLite,
the native MindIR stays, and every artifact matches MindSpore's own outputs. Runs in the MindSpore
venv (`make test`), which has the edge extra too."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest

import unideploy
from unideploy.verify import verify_package

pytestmark = pytest.mark.mindspore
pytest.importorskip("ai_edge_litert", reason="the edge extra is not installed in this venv")


def test_mindir_to_edge_gives_ort_and_nhwc_tflite_matching_mindspore(mindir_models, tmp_path):
    from console import deploy

    with unideploy.export(mindir_models["cnn"], tmp_path / "edge.zip", target="edge") as package:
        artifacts = {a.id: a for a in package.manifest.artifacts}
        assert list(artifacts) == ["onnx-fp32", "mindir", "ort-fp32", "tflite-fp32", "tflite-fp16"]
        assert artifacts["tflite-fp32"].signature.inputs[0].layout == "NHWC"
        assert all(c.status == "passed" for c in verify_package(package))
        spec = package.manifest.signature.inputs[0]
        x = np.random.default_rng(8).standard_normal((3, *spec.shape[1:])).astype(np.float32)
        expected = unideploy.run(package, {spec.name: x}, artifact="mindir")  # MindSpore itself
        for artifact, atol in (("ort-fp32", 1e-4), ("tflite-fp32", 1e-4), ("tflite-fp16", 2e-2)):
            got = unideploy.run(package, {spec.name: x}, artifact=artifact)
            for name, value in expected.items():
                np.testing.assert_allclose(got[name], value, atol=atol, rtol=1e-2)

    result = deploy("bundle", tmp_path / "edge.zip", "--platform", "android", "-o", tmp_path / "android.zip")
    assert result.returncode == 0, result.stderr
    with zipfile.ZipFile(tmp_path / "android.zip") as zf:
        document = json.loads(zf.read("bundle.json"))
    assert [m["artifact"] for m in document["models"]] == ["ort-fp32", "tflite-fp32", "tflite-fp16"]
    result = deploy("verify", tmp_path / "android.zip", "--json")
    assert result.returncode == 0, result.stderr
    assert all(m["status"] == "passed" for m in json.loads(result.stdout)["models"])
