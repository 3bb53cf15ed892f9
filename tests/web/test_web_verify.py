"""`deploy verify SITE`: integrity, then every reference sample run in headless Chromium's page on
each backend, judged with the package's tolerances; and the generated module's refusals, in the page."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from console import assert_one_line_error, deploy

from unideploy.web.browser import chromium, served
from unideploy.web.bundle import CONTENT_TYPES, HEADERS

pytestmark = pytest.mark.usefixtures("browser_here")


def test_every_variant_runs_in_chromium_within_its_tolerance(digits_site, tmp_path):
    shot = tmp_path / "page.png"
    result = deploy("verify", digits_site, "--json", "--screenshot", shot)
    assert result.returncode == 0, result.stderr + result.stdout
    report = json.loads(result.stdout)
    assert report["integrity"] == "passed" and report["browser"].startswith("Chromium ")
    checks = {(c["artifact"], c["backend"]): c for c in report["checks"]}
    for artifact in ("onnx-fp32", "onnx-int8", "onnx-fp16"):
        wasm = checks[(artifact, "wasm")]
        assert wasm["status"] == "passed", wasm
        assert wasm["validation"]["batch_sizes"] == [1, 8] and wasm["load_ms"] > 0 and wasm["latency_ms"] > 0
    assert checks[("onnx-fp32", "wasm")]["validation"]["outputs"]["output"]["max_abs_error"] < 1e-4
    # WebGPU: fp32 runs where the browser offers an adapter; int8 is meant for WebAssembly only
    assert checks[("onnx-int8", "webgpu")]["status"] == "skipped"
    gpu = report["backends"]["webgpu"]
    assert checks[("onnx-fp32", "webgpu")]["status"] == ("passed" if gpu["ok"] else "skipped"), gpu
    # the page a person opens ran every check and shows them: a screenshot that is not blank
    from skimage.io import imread

    pixels = imread(shot)
    assert pixels.shape[0] > 200 and pixels.shape[1] > 600
    assert len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 50  # text, table, colours


def test_a_zipped_site_verifies_on_one_backend(digits_variants, tmp_path):
    assert deploy("bundle", digits_variants, "--platform", "web", "-o", tmp_path / "s.zip").returncode == 0
    result = deploy("verify", tmp_path / "s.zip", "--backend", "wasm")
    assert result.returncode == 0, result.stderr
    assert "onnx-fp16" in result.stdout and "webgpu" not in result.stdout


def test_samples_of_one_batch_size_each_have_their_file(tmp_path):
    """A batch-1 model's reference samples (an example of three rows run a row at a time) all have
    batch size 1: each is a file of its own in the site, so the page runs the rows verify compares
    with. Named by batch size alone, the last row's file was run three times and compared with all
    three (fer's classifier "failed" in Chromium, max abs 0.785). The model is saved as onnx 1.23
    saves it, at IR 14, which ONNX Runtime Web 1.30 refused: its artifact is written at IR 8."""
    from onnx import TensorProto, helper, numpy_helper, save

    weights = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3) / 10, "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "one_row",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
        [weights],
    )
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    np.savez(tmp_path / "rows.npz", x=np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32))
    made = deploy("export", tmp_path / "m.onnx", "-o", tmp_path / "pkg", "--example-input", tmp_path / "rows.npz")
    assert made.returncode == 0, made.stderr
    assert deploy("bundle", tmp_path / "pkg", "--platform", "web", "-o", tmp_path / "site").returncode == 0
    files = [s["file"] for s in json.loads((tmp_path / "site" / "web.json").read_text())["samples"]]
    assert len(set(files)) == 3
    result = deploy("verify", tmp_path / "site", "--backend", "wasm")
    assert result.returncode == 0, result.stderr + result.stdout


def _copy(site, tmp_path):
    copy = tmp_path / "site"
    shutil.copytree(site, copy)
    return copy


def test_tampered_model_page_or_runtime_is_refused_before_the_browser(digits_site, tmp_path):
    for relpath, pattern in (
        (
            "model/artifacts/model.onnx",
            r"checksum mismatch.*model/artifacts/model.onnx|model.onnx.*(checksum|modified)",
        ),
        ("app.js", r"bundle file 'app.js' is missing or modified"),
        ("ort/ort.min.mjs", r"bundle file 'ort/ort.min.mjs' is missing or modified"),
    ):
        copy = _copy(digits_site, tmp_path / relpath.replace("/", "_"))
        target = copy / relpath
        target.write_bytes(target.read_bytes()[:-1] + b"\0")
        assert_one_line_error(deploy("verify", copy), 2, pattern)
    copy = _copy(digits_site, tmp_path / "extra")
    (copy / "evil.js").write_text("fetch('https://example.com')")
    assert_one_line_error(deploy("verify", copy), 2, r"bundle contains 'evil.js', which web.json does not list")


@pytest.mark.parametrize(
    "change, pattern",
    [
        (lambda d: {**d, "package": "../outside"}, r"path '../outside' escapes the package"),
        (lambda d: {**d, "files": [{"path": "app.js"}]}, r"web.json is malformed \(KeyError"),
        (lambda d: {**d, "format_version": 9}, r"web bundle format version 9 is not supported"),
    ],
)
def test_malformed_web_json_is_refused(digits_site, tmp_path, change, pattern):
    copy = _copy(digits_site, tmp_path)
    document = json.loads((copy / "web.json").read_text())
    (copy / "web.json").write_text(json.dumps(change(document)))
    assert_one_line_error(deploy("verify", copy), 2, pattern)


def _in_page(site: Path, *scripts: tuple[str, Any]) -> list[Any]:
    """Each (script, argument) evaluated in the site's page, served and opened in Chromium, once the
    page is ready (``?auto=0``: it runs nothing itself)."""
    with served(site, HEADERS, CONTENT_TYPES) as url, chromium() as browser:
        page = browser.new_page()
        page.goto(url + "index.html?auto=0")
        page.wait_for_function("document.body.dataset.state === 'ready'")
        return [page.evaluate(script, argument) for script, argument in scripts]


def test_generated_module_refuses_wrong_dtype_shape_and_names(digits_site):
    """The module a web developer imports, called in the page with what a developer gets wrong."""
    calls = {
        "dtype": "{x: new Int32Array(64)}",
        "shape": "{x: {data: new Float32Array(72), shape: [1, 1, 8, 9]}}",
        "rank": "{x: {data: new Float32Array(64), shape: [1, 64]}}",
        "length": "{x: new Float32Array(60)}",
        "missing": "{}",
        "unknown": "{x: new Float32Array(64), y: new Float32Array(1)}",
        "good": "{x: new Float32Array(128)}",
    }
    script = (
        "async (calls) => { const m = await import('./model.js'); const model = await m.Model.load();"
        " const said = {}; for (const [k, v] of Object.entries(calls)) {"
        " try { const out = await model.run(eval('(' + v + ')')); said[k] = out.output.shape; }"
        " catch (e) { said[k] = e.name + ': ' + e.message; } } return said; }"
    )
    wrong = (
        "async () => { const m = await import('./model.js');"
        " try { await m.Model.load({variant: 'onnx-int8', backend: 'webgpu'}); return 'loaded'; }"
        " catch (e) { return e.message; } }"
    )
    said, wrong_variant = _in_page(digits_site, (script, calls), (wrong, None))
    assert said["dtype"] == "ModelInputError: input 'x' must be a Float32Array (float32); got Int32Array"
    assert said["shape"].endswith("has shape [1, 1, 8, 9]; the model takes [batch, 1, 8, 8] (dim 3 must be 8)")
    assert "has rank 2 ([1, 64]); the model takes rank 4" in said["rank"]
    assert "holds 60 values; [batch, 1, 8, 8] needs a multiple of 64" in said["length"]
    assert said["missing"] == "ModelInputError: missing input 'x' (float32 [batch, 1, 8, 8])"
    assert said["unknown"] == "ModelInputError: unknown input 'y': this model takes x"
    assert said["good"] == [2, 10]  # a bare array: the batch inferred from its length
    assert "cannot run on webgpu here: int8 runs on WebAssembly only" in wrong_variant


def test_without_chromium_verify_says_what_to_install(digits_site, monkeypatch):
    monkeypatch.setenv("UNIDEPLOY_CHROMIUM", "/nonexistent/chromium")
    result = deploy("verify", digits_site)
    assert_one_line_error(result, 2, r"cannot open a browser: no Chromium or Chrome found.*apt-get install chromium")


def test_browser_options_name_what_they_apply_to(digits_variants, tmp_path):
    assert (
        deploy("bundle", digits_variants, "--platform", "web", "-o", tmp_path / "s", "--backends", "wasm").returncode
        == 0
    )
    assert_one_line_error(
        deploy("verify", tmp_path / "s", "--backend", "webgpu"), 2, r"the site's runtime build has no webgpu backend"
    )
    assert_one_line_error(
        deploy("verify", digits_variants, "--screenshot", tmp_path / "x.png"),
        2,
        r"check web sites, and this is not one",
    )


def test_a_package_zip_is_not_taken_for_a_site(digits_variants, tmp_path):
    archive = tmp_path / "pkg.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for file in digits_variants.rglob("*"):
            if file.is_file():
                zf.write(file, file.relative_to(digits_variants).as_posix())
    result = deploy("verify", archive)
    assert result.returncode == 0, result.stderr
    assert "web.json" not in result.stdout


def test_ids_past_the_models_table_are_refused_in_the_page(tmp_path):
    """An embedding model whose export recorded its ids' table (10 rows), bundled for the web and
    called in Chromium: ids within it answer what ONNX Runtime gives in Python, ids past it (and
    past ONNX's negative range) are refused naming the input, as ``deploy run`` refuses them."""
    from onnx_models import embedding_package

    import unideploy

    package = embedding_package(tmp_path / "src", tmp_path / "words.udp")
    bundled = deploy("bundle", package, "--platform", "web", "-o", tmp_path / "site")
    assert bundled.returncode == 0, bundled.stderr
    calls = {"good": [0, 9, -10, 3], "past": [0, 1, 10, 3], "below": [-11, 1, 2, 3]}
    script = (
        "async (calls) => { const m = await import('./model.js'); const model = await m.Model.load();"
        " const said = {}; for (const [k, v] of Object.entries(calls)) {"
        " try { const out = await model.run({ids: {data: BigInt64Array.from(v.map(BigInt)), shape: [1, 4]}});"
        " said[k] = Array.from(out.y.data); } catch (e) { said[k] = e.name + ': ' + e.message; } } return said; }"
    )
    (said,) = _in_page(tmp_path / "site", (script, calls))
    expected = unideploy.run(package, {"ids": np.array([calls["good"]], np.int64)})["y"]
    np.testing.assert_allclose(said["good"], expected.ravel(), atol=1e-6)
    assert said["past"] == (
        "ModelInputError: input 'ids' holds 10, past the 10 rows of the table the model looks it up in "
        "(it takes 0 to 9; ONNX counts -10 to -1 from the end)"
    )
    assert said["below"].startswith("ModelInputError: input 'ids' holds -11, past the 10 rows")


def test_a_streaming_model_carries_its_state_in_the_page(zoo_models, tmp_path):
    """Silero VAD exported with ``--state state=stateN``, its site's module called in Chromium
    with speech chunks alone: the probabilities ONNX Runtime gives the model run in order with the
    state fed back by hand, within 1e-5; reset() starts the stream again; a state the caller gives
    is used as given."""
    import onnxruntime as ort

    source = zoo_models.shipped(zoo_models.SILERO_VAD)
    made = deploy(
        "export", source, "-o", tmp_path / "vad.udp", "--input-shape", "input:batch=1,576",
        "--input-shape", "state:2,batch=1,128", "--constant", "sr=16000", "--state", "state=stateN",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    bundled = deploy("bundle", tmp_path / "vad.udp", "--platform", "web", "-o", tmp_path / "site")
    assert bundled.returncode == 0, bundled.stderr
    audio = zoo_models.speech(3.0)
    padded = np.concatenate([np.zeros(64, np.float32), audio])  # each chunk after the 64 samples before it
    chunks = [padded[start : start + 576] for start in range(0, len(audio) - 511, 512)][:60]
    session = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
    state, expected = np.zeros((2, 1, 128), np.float32), []
    for chunk in chunks:
        out, state = session.run(None, {"input": chunk[None], "state": state, "sr": np.array(16000, np.int64)})
        expected.append(float(out[0, 0]))
    script = (
        "async (chunks) => { const m = await import('./model.js'); const model = await m.Model.load();"
        " const run = async () => { const got = []; for (const c of chunks) {"
        " const out = await model.run({input: new Float32Array(c)}); got.push(out.output.data[0]); } return got; };"
        " const first = await run(); model.reset(); const again = await run();"
        " const given = await model.run({input: new Float32Array(chunks[0]), state: {data: new Float32Array(256),"
        " shape: [2, 1, 128]}}); return {first, again, given: given.output.data[0]}; }"
    )
    (said,) = _in_page(tmp_path / "site", (script, [chunk.tolist() for chunk in chunks]))
    assert max(expected) > 0.5  # the speech is heard
    np.testing.assert_allclose(said["first"], expected, atol=1e-5)
    np.testing.assert_allclose(said["again"], expected, atol=1e-5)
    assert said["given"] == pytest.approx(expected[0], abs=1e-5)  # from the zero state it was given
