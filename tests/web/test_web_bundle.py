"""`deploy bundle --platform web`: a static site holding the package's ONNX variants, the vendored
ONNX Runtime Web, a module generated from the signature, the demo page and checksums."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from console import assert_one_line_error, deploy

from unideploy.errors import MissingDependencyError
from unideploy.package.files import digest_path
from unideploy.web.runtime import ORT_WEB_VERSION, runtime_dir


def test_site_holds_variants_runtime_module_page_and_checksums(digits_site):
    document = json.loads((digits_site / "web.json").read_text())
    assert [m["artifact"] for m in document["models"]] == ["onnx-fp32", "onnx-int8", "onnx-fp16"]
    int8 = next(m for m in document["models"] if m["artifact"] == "onnx-int8")
    assert int8["backends"] == ["wasm"] and "WebAssembly only" in int8["note"]
    assert document["runtime"] == {
        "name": "onnxruntime-web",
        "version": ORT_WEB_VERSION,
        "backends": ["wasm", "webgpu"],
        "files": ["ort/ort.min.mjs", "ort/ort-wasm-simd-threaded.jsep.mjs", "ort/ort-wasm-simd-threaded.jsep.wasm"],
    }
    assert document["headers"]["Cross-Origin-Embedder-Policy"] == "require-corp"
    listed = {f["path"]: f for f in document["files"]}
    for name in ("index.html", "app.js", "model.js", "README.md", *document["runtime"]["files"]):
        assert digest_path(digits_site / name) == (listed[name]["sha256"], listed[name]["size"])
    # the samples: raw tensors where web.json says, equal to the package's reference samples
    sample = document["samples"][0]
    raw = (digits_site / sample["file"]).read_bytes()
    x = next(t for t in sample["inputs"] if t["name"] == "x")
    assert x["dtype"] == "float32" and x["shape"][1:] == [1, 8, 8]
    assert len(raw) == sum(t["bytes"] for t in sample["inputs"] + sample["outputs"])
    # sizes: what a browser downloads, raw and gzip
    sizes = document["sizes"]
    assert sizes["runtime"]["bytes"] > 10_000_000 > sizes["runtime"]["gzip_bytes"]
    assert (
        sizes["first_load"]["bytes"]
        == sum(sizes[k]["bytes"] for k in ("runtime", "page")) + sizes["models"]["onnx-fp32"]["bytes"]
    )
    # the module is generated from the signature: its header names the input, its constants the variants
    module = (digits_site / "model.js").read_text()
    assert "//   x: float32 [batch, 1, 8, 8] (NCHW)" in module
    assert "import * as ort from './ort/ort.min.mjs';" in module
    assert '"onnx-int8": {"file": "model/artifacts/model.int8.onnx"' in module
    assert document["classifier"]["scale"] == "unit"  # digits are scaled to 0..1
    assert document["labels"] == "labels.txt" and "labels.txt" in listed
    assert (digits_site / "labels.txt").read_text().splitlines()[7] == "digit 7"
    assert "Cross-Origin-Opener-Policy: same-origin" in (digits_site / "README.md").read_text()


def test_wasm_only_build_is_half_the_runtime_and_a_zip_works(digits_variants, tmp_path):
    result = deploy(
        "bundle", digits_variants, "--platform", "web", "-o", tmp_path / "site.zip", "--backends", "wasm", "--json"
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    with zipfile.ZipFile(tmp_path / "site.zip") as zf:
        assert json.loads(zf.read("web.json")) == document
        assert "ort/ort.wasm.min.mjs" in zf.namelist() and "ort/ort.min.mjs" not in zf.namelist()
    assert document["runtime"]["backends"] == ["wasm"]
    assert all(m["backends"] == ["wasm"] and m["note"] is None for m in document["models"])
    default = json.loads((Path(runtime_dir()) / "package.json").read_text())
    assert default["version"] == ORT_WEB_VERSION
    jsep = (runtime_dir() / "ort-wasm-simd-threaded.jsep.wasm").stat().st_size
    assert document["sizes"]["runtime"]["bytes"] < 0.6 * jsep


def test_bundle_refuses_bad_requests_and_writes_nothing(digits_variants, tmp_path):
    wrong = tmp_path / "labels.txt"
    wrong.write_text("cat\ndog\n")
    cases = [
        (("--labels", wrong, "-o", tmp_path / "a"), r"2 labels but output 'output' has 10 classes"),
        (("--artifact", "nope", "-o", tmp_path / "b"), r"no artifact 'nope'"),
        (("--namespace", "a.b", "-o", tmp_path / "c"), r"--namespace names the Kotlin package"),
    ]
    for args, pattern in cases:
        assert_one_line_error(deploy("bundle", digits_variants, "--platform", "web", *args), 2, pattern)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["labels.txt"]
    (tmp_path / "exists").mkdir()
    (tmp_path / "exists" / "keep.txt").write_text("keep")
    assert_one_line_error(
        deploy("bundle", digits_variants, "--platform", "web", "-o", tmp_path / "exists"), 2, r"already exists"
    )
    assert (tmp_path / "exists" / "keep.txt").read_text() == "keep"


def test_an_artifact_the_browser_cannot_load_is_left_out_with_the_reason(digits, tmp_path):
    """A TFLite artifact beside the ONNX one: the site keeps the ONNX one and says why not the other."""
    pytest.importorskip("ai_edge_litert", reason="the edge extra is not installed")
    import numpy as np

    import unideploy
    from unideploy.web.bundle import build_web_bundle

    edge = tmp_path / "edge.udp"
    unideploy.export(
        digits["model"],
        edge,
        example_inputs={"x": np.load(digits["data"])["x"][:8]},
        target="edge",
        target_options={"calibration": digits["data"]},
    ).close()
    document = build_web_bundle(edge, tmp_path / "site")
    assert [m["artifact"] for m in document["models"]] == ["onnx-fp32"]
    reasons = {o["artifact"]: o["reason"] for o in document["omitted"]}
    assert "tflite, which ONNX Runtime Web does not load" in reasons["tflite-fp32"]
    assert_one_line_error(
        deploy("bundle", edge, "--platform", "web", "-o", tmp_path / "x", "--artifact", "tflite-int8"),
        2,
        r"artifact 'tflite-int8' cannot run in a browser: tflite",
    )


def test_without_npm_and_no_cached_runtime_the_refusal_names_the_install(monkeypatch, tmp_path):
    monkeypatch.setenv("UNIDEPLOY_WEB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(MissingDependencyError) as caught:
        runtime_dir()
    assert "npm is needed once to fetch onnxruntime-web" in caught.value.message
    assert "nodejs npm" in (caught.value.hint or "")


def test_a_model_with_text_tensors_is_refused_with_the_way_out(text_packages, tmp_path):
    assert_one_line_error(
        deploy("bundle", text_packages["labels"], "--platform", "web", "-o", tmp_path / "site"),
        2,
        r"the model has text tensors \(label\).*deploy serve",
    )
    assert not (tmp_path / "site").exists()
