"""`deploy bundle` and `deploy verify BUNDLE.zip`: a real digits CNN and a Keras attention block,
exported with --target edge, bundled for both platforms, every model re-run on host runtimes."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from console import assert_one_line_error, deploy

import unideploy

pytest.importorskip("ai_edge_litert", reason="the edge extra is not installed")
pytest.importorskip("tree_sitter_kotlin", reason="the bundle extra is not installed")


@pytest.fixture(scope="module")
def digits_edge(digits, tmp_path_factory) -> Path:
    """The digits CNN with ORT, TFLite fp32/fp16 and int8 (calibrated on real digits)."""
    out = tmp_path_factory.mktemp("digits-edge") / "digits.zip"
    unideploy.export(
        digits["model"],
        out,
        example_inputs={"x": np.load(digits["data"])["x"][:8]},
        target="edge",
        target_options={"calibration": digits["data"]},
    ).close()
    return out


@pytest.fixture(scope="module")
def labels(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("labels") / "labels.txt"
    path.write_text("\n".join(f"digit {i}" for i in range(10)) + "\n")
    return path


def _bundle(package: Path, platform: str, out: Path, *extra: str) -> dict:
    result = deploy("bundle", package, "--platform", platform, "-o", out, "--json", *extra)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    with zipfile.ZipFile(out) as zf:
        assert json.loads(zf.read("bundle.json")) == document
    return document


def test_android_bundle_holds_models_wrappers_and_gradle_lines_and_verifies(digits_edge, labels, tmp_path):
    document = _bundle(digits_edge, "android", tmp_path / "android.zip", "--labels", labels)
    assert document["platform"] == "android" and document["labels"] == "labels.txt"
    assert [m["artifact"] for m in document["models"]] == ["ort-fp32", "tflite-fp32", "tflite-fp16", "tflite-int8"]
    assert all(m["max_abs_error"] is not None for m in document["models"])
    layouts = document["preprocessing"]["inputs"][0]["layouts"]
    assert layouts["ort-fp32"] != "NHWC" and layouts["tflite-int8"] == "NHWC"
    with zipfile.ZipFile(tmp_path / "android.zip") as zf:
        names = set(zf.namelist())
        root = "android/src/main/kotlin/ai/unideploy/models/digits/"
        assert {
            root + "DigitsTflite.kt",
            root + "DigitsOrt.kt",
            root + "DigitsOutputs.kt",
            "android/dependencies.gradle.kts",
            "README.md",
            "labels.txt",
            "model/manifest.json",
            "model/artifacts/model.int8.tflite",
            "model/artifacts/model.ort",
            "model/artifacts/required_operators.config",
        } <= names
        assert not any(n.startswith("model/source/") or n.endswith(".onnx") for n in names)  # mobile models only
        tflite = zf.read(root + "DigitsTflite.kt").decode()
        gradle = zf.read("android/dependencies.gradle.kts").decode()
        assert zf.read("labels.txt").decode().splitlines()[3] == "digit 3"
    # the wrapper calls the model by its own names and shapes: NHWC, dynamic batch as a parameter
    assert "fun run(x: FloatArray, batch: Int): DigitsOutputs" in tflite
    assert "intArrayOf(batch, 8, 8, 1)" in tflite and "channels last" in tflite
    assert "com.microsoft.onnxruntime:onnxruntime-android" in gradle and "com.google.ai.edge.litert:litert" in gradle

    result = deploy("verify", tmp_path / "android.zip", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [(m["artifact"], m["status"]) for m in report["models"]] == [
        ("ort-fp32", "passed"),
        ("tflite-fp32", "passed"),
        ("tflite-fp16", "passed"),
        ("tflite-int8", "passed"),
    ]
    assert {c["language"] for c in report["code"]} == {"kotlin"}
    assert all(c["status"] == "passed" for c in report["code"]), report["code"]


def test_ios_bundle_has_swift_wrappers_package_files_and_a_core_ml_model(digits_edge, tmp_path):
    pytest.importorskip("coremltools", reason="the bundle extra (coremltools) is not installed")
    document = _bundle(digits_edge, "ios", tmp_path / "ios.zip", "--artifact", "tflite-int8", "--artifact", "ort-fp32")
    assert [m["artifact"] for m in document["models"]] == ["ort-fp32", "tflite-int8", "coreml"]
    with zipfile.ZipFile(tmp_path / "ios.zip") as zf:
        names = set(zf.namelist())
        assert {
            "ios/Sources/Digits/DigitsTflite.swift",
            "ios/Sources/Digits/DigitsOrt.swift",
            "ios/Package.swift",
            "ios/Podfile",
            "ios/Digits.mlpackage/Manifest.json",
        } <= names
        assert "model/artifacts/model.fp32.tflite" not in names  # only what --artifact chose
        ort = zf.read("ios/Sources/Digits/DigitsOrt.swift").decode()
        podfile = zf.read("ios/Podfile").decode()
    assert "import onnxruntime_objc" in ort and "shape: [batch, 1, 8, 8]" in ort  # .ort keeps the source layout
    assert "pod 'TensorFlowLiteSwift'" in podfile and "pod 'onnxruntime-objc'" in podfile

    result = deploy("verify", tmp_path / "ios.zip", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    status = {m["artifact"]: (m["status"], m["reason"]) for m in report["models"]}
    assert status["ort-fp32"][0] == status["tflite-int8"][0] == "passed"
    assert status["coreml"] == ("skipped", "not run here: Core ML predicts only on Apple platforms")
    assert {(c["language"], c["status"]) for c in report["code"]} == {("swift", "passed"), ("text", "skipped")}


def test_savedmodel_attention_bundle_verifies(saved_models, tmp_path):
    """A TensorFlow source: TFLite straight from the SavedModel, no layout change, 3-D tensors."""
    unideploy.export(saved_models / "attention", tmp_path / "attention", target="edge").close()
    document = _bundle(tmp_path / "attention", "android", tmp_path / "attention.zip")
    assert [m["artifact"] for m in document["models"]] == ["ort-fp32", "tflite-fp32", "tflite-fp16"]
    assert deploy("verify", tmp_path / "attention.zip").returncode == 0


def _rewrite(archive: Path, out: Path, change) -> None:
    with zipfile.ZipFile(archive) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            data = change(info.filename, src.read(info.filename))
            if data is not None:
                dst.writestr(info.filename, data)


@pytest.mark.parametrize(
    "name, change, pattern",
    [
        (
            "code",
            lambda n, d: d.replace(b"fun run(", b"fun run((") if n.endswith("Tflite.kt") else d,
            r"bundle file 'android/.*DigitsTflite.kt' is missing or modified",
        ),
        (
            "model",
            lambda n, d: d[:-8] if n.endswith("model.int8.tflite") else d,
            r"package file 'artifacts/model.int8.tflite' has \d+ bytes",
        ),
        ("removed", lambda n, d: None if n == "labels.txt" else d, r"bundle file 'labels.txt' is missing or modified"),
    ],
)
def test_tampered_bundle_is_refused(digits_edge, labels, tmp_path, name, change, pattern):
    _bundle(digits_edge, "android", tmp_path / "good.zip", "--labels", labels)
    _rewrite(tmp_path / "good.zip", tmp_path / "bad.zip", change)
    assert_one_line_error(deploy("verify", tmp_path / "bad.zip"), 2, pattern)


def test_unlisted_file_in_bundle_is_refused(digits_edge, tmp_path):
    _bundle(digits_edge, "ios", tmp_path / "good.zip")
    with zipfile.ZipFile(tmp_path / "good.zip", "a") as zf:
        zf.writestr("ios/Sources/Digits/Extra.swift", "print(1)\n")
    assert_one_line_error(
        deploy("verify", tmp_path / "good.zip"), 2, r"'ios/Sources/Digits/Extra.swift', which bundle.json"
    )


def test_bundle_refuses_bad_requests_and_writes_nothing(digits, digits_edge, tmp_path):
    wrong = tmp_path / "labels.txt"
    wrong.write_text("cat\ndog\n")
    cases = [
        (
            (digits["package"], "--platform", "android", "-o", tmp_path / "a.zip"),
            r"has no mobile artifacts.*--target edge",
        ),
        (
            (digits_edge, "--platform", "android", "-o", tmp_path / "b.zip", "--labels", wrong),
            r"2 labels but output 'output' has 10 classes",
        ),
        (
            (digits_edge, "--platform", "ios", "-o", tmp_path / "c.zip", "--artifact", "onnx-fp32"),
            r"artifact 'onnx-fp32' is onnx, not a mobile format",
        ),
        ((digits_edge, "--platform", "ios", "-o", tmp_path / "d.zip", "--artifact", "nope"), r"no artifact 'nope'"),
        ((digits_edge, "--platform", "android", "-o", tmp_path / "e"), r"must end in .zip"),
    ]
    for args, pattern in cases:
        assert_one_line_error(deploy("bundle", *args), 2, pattern)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["labels.txt"]
    (tmp_path / "exists.zip").write_bytes(b"keep")
    assert_one_line_error(
        deploy("bundle", digits_edge, "--platform", "ios", "-o", tmp_path / "exists.zip"), 2, r"already exists"
    )
    assert (tmp_path / "exists.zip").read_bytes() == b"keep"


@pytest.mark.parametrize(
    "change, pattern",
    [
        (lambda d: {**d, "package": "../outside"}, r"path '../outside' escapes the package"),
        (lambda d: {**d, "files": [{"path": "README.md"}]}, r"bundle.json is malformed \(KeyError"),
        (lambda d: {**d, "format_version": 9}, r"bundle format version 9 is not supported"),
    ],
)
def test_malformed_bundle_manifest_is_refused(digits_edge, tmp_path, change, pattern):
    _bundle(digits_edge, "android", tmp_path / "good.zip")
    _rewrite(
        tmp_path / "good.zip",
        tmp_path / "bad.zip",
        lambda n, d: json.dumps(change(json.loads(d))).encode() if n == "bundle.json" else d,
    )
    assert_one_line_error(deploy("verify", tmp_path / "bad.zip"), 2, pattern)
