"""``deploy bundle PKG --platform web -o SITE``: a static site (a folder or a .zip) that runs the
package's ONNX models in a browser with ONNX Runtime Web.

Layout::

    index.html, app.js   a page that runs the reference samples and shows outputs and timing
    model.js             the ES module generated from the signature (Model.load / run)
    ort/                 ONNX Runtime Web, vendored (never fetched from a CDN when the page runs)
    samples/             the reference samples as raw little-endian tensors (indexed in web.json)
    model/               a unideploy package holding the ONNX artifacts and the reference samples
    web.json             what is inside: models, runtime, headers a host must send, sizes, checksums
    README.md            how to host it and call the module

As for mobile bundles, the models stay a package so that ``deploy verify SITE`` re-checks them
with the package's own tolerances, here with outputs computed in a real browser.
"""

from __future__ import annotations

import gzip
import json
import shutil
from datetime import UTC, datetime
from importlib.resources import files
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

import unideploy
from unideploy.errors import InputError
from unideploy.package import Package
from unideploy.package.bundled import check_labels, file_entry, read_labels, write_model_package
from unideploy.package.files import all_files, publish, staging_for
from unideploy.package.manifest import Artifact, Manifest
from unideploy.package.writer import check_destination
from unideploy.signature import CHANNELS_LAST, STRING
from unideploy.web.module import model_module
from unideploy.web.runtime import ORT_WEB_VERSION, Build, build_for, runtime_dir

WEB_FORMAT = "unideploy-web"
WEB_VERSION = 1
WEB_MANIFEST = "web.json"
MODEL_DIR = "model"
AGAIN = "build it again with 'deploy bundle --platform web'"
# Threaded WebAssembly needs SharedArrayBuffer, which browsers give only to cross-origin isolated pages.
HEADERS = {"Cross-Origin-Opener-Policy": "same-origin", "Cross-Origin-Embedder-Policy": "require-corp"}
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript",
    ".mjs": "text/javascript",
    ".wasm": "application/wasm",
    ".json": "application/json",
    ".onnx": "application/octet-stream",
    ".bin": "application/octet-stream",
}
# Measured in Chromium 156 with ONNX Runtime Web 1.30 (SwiftShader's WebGPU adapter): int8 models
# (QDQ and QOperator) ran on WebGPU without an error and returned wrong outputs, so a site offers
# int8 on WebAssembly only.
WASM_ONLY = {
    "int8": "int8 runs on WebAssembly only: ONNX Runtime Web's WebGPU backend returned wrong outputs for it",
    "mixed": "its int8 kernels run on WebAssembly only: ONNX Runtime Web's WebGPU backend returned wrong outputs "
    "for int8",
}
# WebAssembly's 32-bit memory holds at most 4 GiB: weights and the working memory must both fit.
MAX_MODEL_BYTES = 2 * 1024**3
# How the page's image picker may scale pixels: (value * multiply - mean) / std.
PREPROCESSING_HINTS = {
    "unit": {"label": "0..1 (pixel / 255)", "multiply": 1 / 255, "mean": [0.0], "std": [1.0]},
    "bytes": {"label": "0..255", "multiply": 1.0, "mean": [0.0], "std": [1.0]},
    "signed": {"label": "-1..1", "multiply": 1 / 255, "mean": [0.5], "std": [0.5]},
    "imagenet": {
        "label": "ImageNet mean/std",
        "multiply": 1 / 255,
        "mean": [0.485, 0.456, 0.406],
        "std": [0.229, 0.224, 0.225],
    },
}


def build_web_bundle(
    package_path: str | Path,
    output: str | Path,
    overwrite: bool = False,
    artifacts: list[str] | None = None,
    labels: str | Path | None = None,
    backends: str = "wasm,webgpu",
) -> dict[str, Any]:
    """Write the site at ``output`` (a folder, or a .zip); return the web.json document it holds."""
    dest = Path(output)
    check_destination(dest, overwrite)
    build = build_for(backends)
    label_lines = read_labels(labels) if labels else None
    with Package.open(package_path) as package:
        manifest = package.manifest
        texts = [t.name for t in (*manifest.signature.inputs, *manifest.signature.outputs) if t.dtype == STRING]
        if texts:
            raise InputError(
                f"the model has text tensors ({', '.join(texts)}): a web site's module and samples take numbers only",
                "serve it with 'deploy serve' (BYTES), or bundle a model whose inputs and outputs are numeric",
            )
        chosen, omitted = _web_artifacts(package, artifacts)
        if label_lines is not None:
            check_labels(label_lines, manifest)
        runtime = runtime_dir()  # before staging: fetching it may take a while, or fail
        staging = staging_for(dest)
        try:
            document = _stage(package, chosen, omitted, build, label_lines, runtime, staging)
            publish(staging, dest)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return document


def _stage(
    package: Package,
    chosen: list[Artifact],
    omitted: list[dict[str, str]],
    build: Build,
    labels: list[str] | None,
    runtime: Path,
    staging: Path,
) -> dict[str, Any]:
    """Every file of the site, written into ``staging``; returns web.json's document (written last)."""
    manifest = package.manifest
    write_model_package(package, chosen, staging / MODEL_DIR)
    with Package.open(staging / MODEL_DIR) as inner:
        document = _document(inner, build, omitted, labels is not None)
        document["samples"] = _write_samples(inner, staging)
        document["classifier"] = _classifier(inner.manifest, inner.reference_samples()[0].inputs)
    (staging / "ort").mkdir()
    for name in build.files:
        shutil.copyfile(runtime / name, staging / "ort" / name)
    static = files("unideploy.web").joinpath("static")
    for name in ("index.html", "app.js"):
        (staging / name).write_text(static.joinpath(name).read_text(encoding="utf-8"), encoding="utf-8")
    kept = ("file", "precision", "external_data", "backends", "note")
    variants = {m["artifact"]: {k: m[k] for k in kept} for m in document["models"]}
    title, made_by = f"{manifest.name} {manifest.version}", f"unideploy {unideploy.__version__}"
    module = model_module(title, manifest.signature, variants, chosen[0].id, build, made_by)
    (staging / "model.js").write_text(module, encoding="utf-8")
    if labels is not None:
        (staging / "labels.txt").write_text("\n".join(labels) + "\n", encoding="utf-8")
    document["sizes"] = _sizes(staging, document, build)
    (staging / "README.md").write_text(_readme(document), encoding="utf-8")
    document["files"] = [
        file_entry(staging, rel) for rel in sorted(all_files(staging)) if not rel.startswith(f"{MODEL_DIR}/")
    ]
    (staging / WEB_MANIFEST).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return document


def _web_artifacts(package: Package, wanted: list[str] | None) -> tuple[list[Artifact], list[dict[str, str]]]:
    """The ONNX artifacts ONNX Runtime Web can load (fp32 first), and every other one with why not."""
    chosen: list[Artifact] = []
    omitted: list[dict[str, str]] = []
    for artifact in package.manifest.artifacts:
        if wanted and artifact.id not in wanted:
            continue
        reason = _why_not(package, artifact)
        if reason:
            omitted.append({"artifact": artifact.id, "reason": reason})
        else:
            chosen.append(artifact)
    for artifact_id in wanted or ():
        package.manifest.artifact(artifact_id)  # names the artifacts there are when one is missing
        if any(o["artifact"] == artifact_id for o in omitted):
            raise InputError(
                f"artifact '{artifact_id}' cannot run in a browser: "
                + next(o["reason"] for o in omitted if o["artifact"] == artifact_id),
                "choose an ONNX artifact (deploy inspect lists them)",
            )
    if not chosen:
        raise InputError(
            f"package '{package.origin}' has no artifact ONNX Runtime Web can run",
            "; ".join(f"{o['artifact']}: {o['reason']}" for o in omitted) or "export it again",
        )
    chosen.sort(key=lambda a: a.precision != "fp32")  # the module's default variant is fp32 where there is one
    return chosen, omitted


def _why_not(package: Package, artifact: Artifact) -> str | None:
    if artifact.format != "onnx":
        return f"{artifact.format}, which ONNX Runtime Web does not load (it runs .onnx)"
    size = artifact.size + sum(f["size"] for f in artifact.files or ())
    if size > MAX_MODEL_BYTES:
        return f"{size / 1024**3:.1f} GiB: WebAssembly's 4 GiB memory cannot hold it and its working memory"
    return None


def _document(package: Package, build: Build, omitted: list[dict[str, str]], has_labels: bool) -> dict[str, Any]:
    manifest = package.manifest
    models = []
    for artifact in manifest.artifacts:
        record: dict[str, Any] = dict(manifest.validation.get(artifact.id) or {})
        errors = [o["max_abs_error"] for o in record.get("outputs", {}).values()]
        models.append(
            {
                "artifact": artifact.id,
                "file": f"{MODEL_DIR}/{artifact.path}",
                "precision": artifact.precision,
                "size": artifact.size,
                "sha256": artifact.sha256,
                "external_data": [f"{MODEL_DIR}/{f['path']}" for f in artifact.files or ()],
                "backends": ["wasm"] if artifact.precision in WASM_ONLY else list(build.backends),
                "note": WASM_ONLY.get(artifact.precision) if "webgpu" in build.backends else None,
                "atol": record.get("atol"),
                "rtol": record.get("rtol"),
                "max_abs_error": max(errors) if errors else None,
            }
        )
    return {
        "format": WEB_FORMAT,
        "format_version": WEB_VERSION,
        "platform": "web",
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "unideploy_version": unideploy.__version__,
        "model": {"name": manifest.name, "version": manifest.version, "framework": manifest.source["framework"]},
        "package": MODEL_DIR,
        "runtime": {
            "name": "onnxruntime-web",
            "version": ORT_WEB_VERSION,
            "backends": list(build.backends),
            "files": [f"ort/{name}" for name in build.files],
        },
        "signature": manifest.signature.to_dict(),
        "models": models,
        "omitted": omitted,
        "labels": "labels.txt" if has_labels else None,
        "headers": HEADERS,
        "content_types": CONTENT_TYPES,
        "preprocessing_hints": PREPROCESSING_HINTS,
    }


def _write_samples(package: Package, staging: Path) -> list[dict[str, Any]]:
    """Each reference sample as one file of raw little-endian C-order tensors, inputs then the
    source framework's outputs, with where each lies."""
    (staging / "samples").mkdir()
    written = []
    for stored, sample in zip(package.manifest.samples, package.reference_samples(), strict=True):
        # named as the package names it: two samples of one batch size (a batch-1 model's example
        # rows, a crop to a second image size) each have a file of their own
        relpath = f"samples/{PurePosixPath(stored.path).stem}.bin"
        offset = 0
        index: dict[str, list[dict[str, Any]]] = {"inputs": [], "outputs": []}
        with open(staging / relpath, "wb") as fh:
            for kind, tensors in (("inputs", sample.inputs), ("outputs", sample.outputs)):
                for name, array in tensors.items():
                    raw = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
                    fh.write(raw)
                    dtype = "bool" if array.dtype == np.bool_ else array.dtype.name
                    index[kind].append(
                        {"name": name, "dtype": dtype, "shape": list(array.shape), "offset": offset, "bytes": len(raw)}
                    )
                    offset += len(raw)
        written.append({"file": relpath, "batch_size": sample.batch_size, **index})
    return written


def _classifier(manifest: Manifest, sample: dict[str, np.ndarray]) -> dict[str, Any] | None:
    """For an image classifier (one float image input, one [batch, classes] output) what the page's
    picker needs: layout, size, channels, and a pixel scaling guessed from the samples' range."""
    signature = manifest.signature
    if len(signature.inputs) != 1 or len(signature.outputs) != 1:
        return None
    image, scores = signature.inputs[0], signature.outputs[0]
    if image.dtype != "float32" or len(image.shape) != 4 or len(scores.shape) != 2:
        return None
    if not isinstance(scores.shape[1], int) or scores.shape[1] < 2:
        return None
    shape = sample[image.name].shape
    layout = image.layout or ("NCHW" if shape[1] in (1, 3) else CHANNELS_LAST if shape[3] in (1, 3) else None)
    if layout not in ("NCHW", CHANNELS_LAST):
        return None
    channels, height, width = (shape[1], shape[2], shape[3]) if layout == "NCHW" else (shape[3], shape[1], shape[2])
    if channels not in (1, 3):
        return None
    low, high = float(sample[image.name].min()), float(sample[image.name].max())
    scale = "imagenet" if low < -1.01 else "signed" if low < -0.01 else "bytes" if high > 1.01 else "unit"
    return {
        "input": image.name,
        "output": scores.name,
        "layout": layout,
        "channels": channels,
        "height": height,
        "width": width,
        "scale": scale,
        "scale_basis": f"guessed from the reference samples' range [{low:.3g}, {high:.3g}]; the page lets one change it",
    }


def _sizes(staging: Path, document: dict[str, Any], build: Build) -> dict[str, Any]:
    """Bytes a browser downloads: each model, the runtime, the page; and gzip-compressed, as a
    host that compresses would send them."""

    def measured(relpaths: list[str]) -> dict[str, int]:
        raw = sum((staging / p).stat().st_size for p in relpaths)
        packed = sum(len(gzip.compress((staging / p).read_bytes(), 6)) for p in relpaths)
        return {"bytes": raw, "gzip_bytes": packed}

    models = {m["artifact"]: measured([m["file"], *m["external_data"]]) for m in document["models"]}
    runtime = measured([f"ort/{name}" for name in build.files])
    page = measured(["index.html", "app.js", "model.js"])
    default = models[document["models"][0]["artifact"]]
    return {
        "models": models,
        "runtime": runtime,
        "page": page,
        "first_load": {k: default[k] + runtime[k] + page[k] for k in default},
    }


def _readme(document: dict[str, Any]) -> str:
    model, sizes = document["model"], document["sizes"]
    rows = "\n".join(
        f"| `{m['artifact']}` | {m['precision']} | {sizes['models'][m['artifact']]['bytes']:,} | "
        f"{'-' if m['max_abs_error'] is None else format(m['max_abs_error'], '.2e')} |"
        for m in document["models"]
    )
    left = "".join(f"\n- `{o['artifact']}`: {o['reason']}" for o in document["omitted"])
    headers = "\n".join(f"    {k}: {v}" for k, v in document["headers"].items())
    runtime = document["runtime"]
    return f"""# {model["name"]} {model["version"]} for the web

Generated by unideploy {document["unideploy_version"]} from a {model["framework"]} model. It runs on
ONNX Runtime Web {runtime["version"]} ({", ".join(runtime["backends"])}), vendored in `ort/`.

## Models

| artifact | precision | bytes | max abs error when made |
|---|---|---|---|
{rows}
{"" if not left else chr(10) + "Left out:" + left + chr(10)}
First load (default model, runtime and page): {sizes["first_load"]["bytes"]:,} bytes,
{sizes["first_load"]["gzip_bytes"]:,} gzip-compressed.

## Hosting

Serve the folder as static files. Threaded WebAssembly needs these headers on every response
(without them the model runs on one thread):

{headers}

and `.wasm` as `application/wasm`, `.mjs`/`.js` as `text/javascript`. `deploy verify` serves it
this way on 127.0.0.1 and checks every model in headless Chromium.

## Calling the model

    import {{ Model }} from './model.js';
    const model = await Model.load({{ variant: '{document["models"][0]["artifact"]}', backend: 'wasm' }});
    const outputs = await model.run({{ ... }});   // see the header of model.js

`index.html` runs the reference samples on every variant and backend and shows the results.
"""
