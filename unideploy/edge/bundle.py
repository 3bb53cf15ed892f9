"""``deploy bundle``: a package's mobile artifacts as an Android or iOS runtime bundle (a zip).

Layout of ``BUNDLE.zip``::

    bundle.json        what is inside: platform, models, signature, preprocessing, labels, checksums
    README.md          how to add it to an app
    model/             a unideploy package holding only the mobile artifacts and the reference samples
    android/ | ios/    generated wrapper source and the dependency lines (Gradle; SwiftPM + CocoaPods)
    labels.txt         when given

The models stay a package so that ``deploy verify BUNDLE.zip`` proves them with the same code as
any package (checksums, then every model against the source framework's reference outputs); the
bundle adds checksums for everything outside it and parses the generated source.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import unideploy
from unideploy.edge.codegen.check import PARSERS, syntax_errors
from unideploy.edge.codegen.wrapped import Wrapped, wrapped
from unideploy.edge.coreml import COREML, COREML_PRECISION, torchscript_to_mlpackage
from unideploy.edge.platforms import PLATFORMS, CodeFile, namespace_for
from unideploy.errors import ExportError, InputError, PackageError
from unideploy.package import Package
from unideploy.package.bundled import (
    check_labels,
    check_listed_files,
    file_entry,
    read_labels,
    write_model_package,
)
from unideploy.package.files import (
    all_files,
    digest_path,
    extract_zip,
    read_format_document,
    resolve_inside,
    scratch_dir,
    write_zip,
)
from unideploy.package.writer import check_destination
from unideploy.verify import ArtifactCheck, verify_package

BUNDLE_FORMAT = "unideploy-bundle"
BUNDLE_VERSION = 1
BUNDLE_MANIFEST = "bundle.json"
MODEL_DIR = "model"
MOBILE_FORMATS = {"tflite": "tflite", "ort": "onnxruntime"}  # artifact format -> runtime of its wrapper
AGAIN = "build it again with 'deploy bundle'"
COREML_UNCHECKED = "not run here: Core ML predicts only on Apple platforms"


def build_bundle(
    package_path: str | Path,
    platform: str,
    output: str | Path,
    overwrite: bool = False,
    artifacts: list[str] | None = None,
    labels: str | Path | None = None,
    namespace: str | None = None,
) -> dict[str, Any]:
    """Write ``output`` (a .zip): the chosen (default: all) mobile artifacts, wrappers and a README.
    Returns the bundle.json document it holds."""
    if platform not in PLATFORMS:
        raise InputError(f"unknown platform '{platform}'", f"use one of: {', '.join(PLATFORMS)}")
    dest = Path(output)
    if dest.suffix.lower() != ".zip":
        raise InputError(f"bundle path '{dest}' must end in .zip")
    check_destination(dest, overwrite)
    label_lines = read_labels(labels) if labels else None
    with Package.open(package_path) as package, scratch_dir("unideploy-bundle-") as tmp:
        manifest = package.manifest
        chosen = _mobile_artifacts(package, artifacts)
        if label_lines is not None:
            check_labels(label_lines, manifest)
        staging = Path(tmp) / "bundle"
        staging.mkdir()
        write_model_package(package, chosen, staging / MODEL_DIR)
        models = _wrapped_models(package, chosen)
        import onnxruntime

        code = PLATFORMS[platform].generate(models, namespace or namespace_for(manifest.name), onnxruntime.__version__)
        for file in code:
            target = staging / file.path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(file.text, encoding="utf-8")
        if label_lines is not None:
            (staging / "labels.txt").write_text("\n".join(label_lines) + "\n", encoding="utf-8")
        document = _bundle_document(package, platform, chosen, code, label_lines is not None)
        if platform == "ios":
            _add_coreml(package, staging, models[0].type_name, document)
        (staging / "README.md").write_text(_readme(document, code), encoding="utf-8")
        document["files"] = [
            file_entry(staging, rel) for rel in sorted(all_files(staging)) if not rel.startswith(f"{MODEL_DIR}/")
        ]
        (staging / BUNDLE_MANIFEST).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        dest.parent.mkdir(parents=True, exist_ok=True)
        write_zip(staging, dest)
    return document


def _mobile_artifacts(package: Package, wanted: list[str] | None) -> list[Any]:
    manifest = package.manifest
    mobile = [a for a in manifest.artifacts if a.format in MOBILE_FORMATS]
    if not mobile:
        raise InputError(
            f"package '{package.origin}' has no mobile artifacts (TFLite or .ort)",
            "export it with '--target edge' first",
        )
    if not wanted:
        return mobile
    for artifact_id in wanted:
        artifact = manifest.artifact(artifact_id)  # names the artifacts there are when it is missing
        if artifact.format not in MOBILE_FORMATS:
            raise InputError(
                f"artifact '{artifact_id}' is {artifact.format}, not a mobile format",
                f"mobile artifacts here: {', '.join(a.id for a in mobile)}",
            )
    return [a for a in mobile if a.id in wanted]


def _wrapped_models(package: Package, chosen: list[Any]) -> list[Wrapped]:
    """One wrapper per runtime; it runs every artifact of that runtime (they share names and shapes)."""
    models: dict[str, Wrapped] = {}
    for artifact in chosen:
        runtime = MOBILE_FORMATS[artifact.format]
        if runtime in models:
            continue
        signature = package.manifest.signature_of(artifact)
        file_name = Path(artifact.path).name
        if runtime == "tflite":
            from ai_edge_litert.interpreter import Interpreter

            from unideploy.runtimes.tflite_runtime import signature_names

            key, names = signature_names(Interpreter(model_path=str(package.path_of(artifact))), signature, file_name)
            models[runtime] = wrapped(package.manifest.name, runtime, file_name, signature, names, key)
        else:
            models[runtime] = wrapped(package.manifest.name, runtime, file_name, signature)
    return list(models.values())


def _add_coreml(package: Package, staging: Path, name: str, document: dict[str, Any]) -> None:
    """A Core ML model beside the others when the source is TorchScript and coremltools is here."""
    source = package.manifest.source
    kept = source.get("path")
    if source["framework"] != "torchscript" or not kept:
        return
    found = COREML.availability()
    if not found.ok:
        document["notes"].append(f"no Core ML model: {found.detail} ({found.fix})")
        return
    relpath = f"ios/{name}.mlpackage"
    try:
        torchscript_to_mlpackage(resolve_inside(package.root, kept), package.manifest.signature, staging / relpath)
    except ExportError as exc:
        document["notes"].append(f"no Core ML model: {exc.message}")
        return
    sha256, size = digest_path(staging / relpath)
    document["models"].append(
        {
            "artifact": "coreml",
            "file": relpath,
            "format": "mlpackage",
            "precision": COREML_PRECISION,
            "runtime": "coreml",
            "size": size,
            "sha256": sha256,
            "max_abs_error": None,
            "inputs": [t.to_dict() for t in package.manifest.signature.inputs],
        }
    )


def _bundle_document(
    package: Package, platform: str, chosen: list[Any], code: list[CodeFile], has_labels: bool
) -> dict[str, Any]:
    manifest = package.manifest
    models = []
    for artifact in chosen:
        record = manifest.validation.get(artifact.id)
        outputs = record.get("outputs", {}) if record else {}
        errors = [o["max_abs_error"] for o in outputs.values()]
        models.append(
            {
                "artifact": artifact.id,
                "file": f"{MODEL_DIR}/{artifact.path}",
                "format": artifact.format,
                "precision": artifact.precision,
                "runtime": MOBILE_FORMATS[artifact.format],
                "size": artifact.size,
                "sha256": artifact.sha256,
                "max_abs_error": max(errors) if errors else None,
                "inputs": [t.to_dict() for t in manifest.signature_of(artifact).inputs],
            }
        )
    return {
        "format": BUNDLE_FORMAT,
        "format_version": BUNDLE_VERSION,
        "platform": platform,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "unideploy_version": unideploy.__version__,
        "model": {"name": manifest.name, "version": manifest.version, "framework": manifest.source["framework"]},
        "package": MODEL_DIR,
        "signature": manifest.signature.to_dict(),
        "preprocessing": {
            "order": "row-major arrays in each model's input layout (models[].inputs)",
            "inputs": [
                {
                    "name": t.name,
                    "dtype": t.dtype,
                    "layouts": {
                        m["artifact"]: next(
                            i.get("layout") or "as exported" for i in m["inputs"] if i["name"] == t.name
                        )
                        for m in models
                    },
                }
                for t in manifest.signature.inputs
            ],
        },
        "labels": "labels.txt" if has_labels else None,
        "models": models,
        "code": [{"path": f.path, "language": f.language} for f in code],
        "notes": [],
    }


def _readme(document: dict[str, Any], code: list[CodeFile]) -> str:
    platform = PLATFORMS[document["platform"]]
    model = document["model"]
    rows = "\n".join(
        f"| `{m['file']}` | {m['runtime']} | {m['precision']} | {m['size']:,} | "
        f"{COREML_UNCHECKED if m['max_abs_error'] is None else format(m['max_abs_error'], '.2e')} |"
        for m in document["models"]
    )
    notes = "".join(f"\n- {n}" for n in document["notes"])
    inputs = "\n".join(f"- `{t['name']}`: {t['dtype']} {t['shape']}" for t in document["signature"]["inputs"])
    outputs = "\n".join(f"- `{t['name']}`: {t['dtype']} {t['shape']}" for t in document["signature"]["outputs"])
    sources = "\n".join(f"- `{f.path}`" for f in code)
    if state := document["signature"].get("state"):
        outputs += (
            "\n\nA streaming model: each wrapper's `step()` takes the inputs but "
            + ", ".join(f"`{p['input']}`" for p in state)
            + " and carries them from call to call (from "
            + ", ".join(f"{p['initial']:g}" for p in state)
            + ", one row, each call's "
            + ", ".join(f"`{p['output']}`" for p in state)
            + " fed to the next); `reset()` starts a new stream, and `run()` takes every input."
        )
    if document["platform"] == "android":
        steps = (
            "1. Copy the model files you want into `app/src/main/assets/`.\n"
            "2. Copy the Kotlin sources under `android/src/main/kotlin/` into your module.\n"
            "3. Add the lines of `android/dependencies.gradle.kts` to the module's `build.gradle.kts` "
            "(the `noCompress` line keeps the models memory-mappable)."
        )
    else:
        steps = (
            "1. Add the model files you want to your app target (Copy Bundle Resources) and pass "
            "`Bundle.main.path(forResource:ofType:)` to the wrapper.\n"
            "2. Either add the Podfile's pods (TensorFlowLiteSwift ships only through CocoaPods) and copy "
            "`ios/Sources/`, or add `ios/` as a local Swift package for the ONNX Runtime wrapper."
        )
    return f"""# {model["name"]} {model["version"]} for {document["platform"]}

Generated by unideploy {document["unideploy_version"]} from a {model["framework"]} model. Wrappers run on
{platform.runtimes}.

## Models

Each was checked against the source framework's outputs when it was made (max abs error below);
`deploy verify` on this zip re-checks them on a host.

| file | runtime | precision | bytes | max abs error |
|---|---|---|---|---|
{rows}

## Signature

Inputs (row-major; see `bundle.json` `preprocessing` for each model's layout):
{inputs}

Outputs:
{outputs}

## Add it to an app

{steps}

Sources:
{sources}
{"" if not notes else chr(10) + "## Notes" + chr(10) + notes + chr(10)}"""


# -- reading and verifying ---------------------------------------------------------------------


@dataclass
class CodeCheck:
    path: str
    language: str
    status: str  # "passed", "failed" or "skipped"
    detail: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "language": self.language, "status": self.status, "detail": self.detail}


@dataclass
class BundleReport:
    platform: str
    models: list[ArtifactCheck] = field(default_factory=list)
    code: list[CodeCheck] = field(default_factory=list)

    @property
    def failed(self) -> list[str]:
        return [c.artifact for c in self.models if c.status == "failed"] + [
            c.path for c in self.code if c.status == "failed"
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "platform": self.platform,
            "integrity": "passed",
            "models": [c.to_dict() for c in self.models],
            "code": [c.to_dict() for c in self.code],
        }


def is_bundle(path: str | Path) -> bool:
    import zipfile

    path = Path(path)
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as zf:
        return BUNDLE_MANIFEST in zf.namelist()


def verify_bundle(path: str | Path, runtime: str | None = None) -> BundleReport:
    """Checksums of every file, every model against the reference outputs, every source file parsed."""
    with scratch_dir("unideploy-bundle-") as tmp:
        root = Path(tmp)
        extract_zip(Path(path), root, "build the bundle again with 'deploy bundle'")
        document = _read_document(root)
        try:
            package_root = resolve_inside(root, document["package"])
            check_listed_files(root, document["files"], document["package"], BUNDLE_MANIFEST, AGAIN)
            report = BundleReport(document["platform"])
            with Package.open(package_root) as package:
                report.models = verify_package(package, runtime, "cpu")
            report.models += [
                ArtifactCheck(m["artifact"], "skipped", m["runtime"], COREML_UNCHECKED)
                for m in document["models"]
                if m["runtime"] == "coreml"
            ]
            report.code = [_check_code(root, item) for item in document["code"]]
        except (KeyError, TypeError, AttributeError) as exc:
            raise PackageError(
                f"{BUNDLE_MANIFEST} is malformed ({type(exc).__name__}: {exc})",
                "build the bundle again with 'deploy bundle'",
            ) from exc
        return report


def _read_document(root: Path) -> dict[str, Any]:
    document = read_format_document(
        root / BUNDLE_MANIFEST, BUNDLE_FORMAT, BUNDLE_VERSION, "bundle", "build the bundle again"
    )
    missing = [k for k in ("platform", "package", "files", "code", "models") if k not in document]
    if missing:
        raise PackageError(f"{BUNDLE_MANIFEST} lacks {', '.join(missing)}", "build the bundle again")
    return document


def _check_code(root: Path, item: dict[str, Any]) -> CodeCheck:
    language = item["language"]
    if language == "text":
        return CodeCheck(item["path"], language, "skipped", "not source code")
    found = PARSERS[language].availability()
    if not found.ok:
        return CodeCheck(item["path"], language, "skipped", f"no {language} parser: {found.detail} ({found.fix})")
    errors = syntax_errors(resolve_inside(root, item["path"]).read_text(encoding="utf-8"), language)
    if errors:
        return CodeCheck(item["path"], language, "failed", "syntax errors at " + ", ".join(errors[:5]))
    return CodeCheck(item["path"], language, "passed", "parsed by tree-sitter")
