"""``--target edge``: add ORT-mobile and TFLite artifacts to a package, validated, atomically.

- ORT format (``.ort``, Runtime optimization style, portable to ARM) with its
  ``required_operators.config`` for a reduced-size ONNX Runtime build, from any source.
- TFLite fp32 and fp16 with TensorFlow's own converter, when the source is a SavedModel (kept in
  the package). TFLite from other sources (onnx2tf) is not part of this version: the package says
  so in its notes instead of pretending.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from unideploy.errors import ExportError, MissingDependencyError, first_line
from unideploy.package import Artifact, Package, PackageWriter
from unideploy.quiet import quiet
from unideploy.runtimes import RUNTIMES, RuntimeOptions
from unideploy.validation import (
    DEFAULT_ATOL, DEFAULT_RTOL, measured_tolerance_record, require_passed, validate,
)

Progress = Callable[[str], None]


def _to_ort(onnx_path: Path, workdir: Path) -> tuple[Path, Path]:
    source = workdir / "ort-src"
    source.mkdir()
    (source / "model.onnx").write_bytes(onnx_path.read_bytes())
    out = workdir / "ort"
    result = subprocess.run([sys.executable, "-m", "onnxruntime.tools.convert_onnx_models_to_ort", str(source),
                             "--output_dir", str(out), "--optimization_style", "Runtime"],
                            capture_output=True, text=True)
    models = list(out.glob("*.ort")) if out.exists() else []
    configs = list(out.glob("*.config")) if out.exists() else []
    if result.returncode != 0 or len(models) != 1 or len(configs) != 1:
        raise ExportError(f"conversion to ORT format failed: {first_line(Exception(result.stderr or result.stdout))}")
    return models[0], configs[0]


def _to_tflite(saved_model: Path, precision: str, workdir: Path) -> Path:
    with quiet():
        import tensorflow as tf

        converter = tf.lite.TFLiteConverter.from_saved_model(str(saved_model))
        if precision == "fp16":
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
            converter.target_spec.supported_types = [tf.float16]
        try:
            blob = converter.convert()
        except Exception as exc:
            raise ExportError(f"TFLite conversion ({precision}) failed: {first_line(exc)}") from exc
    path = workdir / f"model.{precision}.tflite"
    path.write_bytes(blob)
    return path


def build_edge(package_path: str | Path, output: str | Path, overwrite: bool = False,
               progress: Progress | None = None) -> Path:
    """Write ``output``: the package plus its edge artifacts."""
    say = progress or (lambda _msg: None)
    with Package.open(package_path) as package, tempfile.TemporaryDirectory(prefix="unideploy-edge-") as tmp:
        work = Path(tmp)
        manifest = package.manifest
        base = next(a for a in manifest.artifacts if a.format == "onnx" and a.derived_from is None)
        references = [(s.inputs, s.outputs) for s in package.reference_samples()]
        framework = manifest.source["framework"]
        added: list[tuple[Artifact, Path, dict[str, Path], dict[str, Any]]] = []

        say("converting to ONNX Runtime's mobile format (.ort)")
        ort_model, ort_config = _to_ort(package.path_of(base), work)
        with RUNTIMES.get("onnxruntime")(ort_model, manifest.signature, RuntimeOptions(device="cpu")) as runtime:
            record = validate(runtime.run, references, DEFAULT_ATOL, DEFAULT_RTOL, reference=framework)
        require_passed(record, "the ORT-format artifact")
        added.append((Artifact("ort-fp32", "artifacts/model.ort", "ort", "fp32", "", 0, ["onnxruntime"],
                               derived_from=base.id, targets=["edge"]),
                      ort_model, {"artifacts/required_operators.config": ort_config}, record))

        notes = []
        saved_model = package.root / manifest.source["path"] if manifest.source.get("path") else None
        if framework == "tensorflow" and saved_model and saved_model.is_dir():
            tflite = RUNTIMES.get("tflite")
            found = tflite.availability()
            if not found.ok:
                raise MissingDependencyError(f"the edge target needs LiteRT: {found.detail}", found.fix)
            for precision in ("fp32", "fp16"):
                say(f"converting the SavedModel to TFLite ({precision})")
                path = _to_tflite(saved_model, precision, work)
                with tflite(path, manifest.signature) as runtime:
                    if precision == "fp32":  # a conversion that should be exact is held to the default
                        record = validate(runtime.run, references, DEFAULT_ATOL, DEFAULT_RTOL, reference=framework)
                        require_passed(record, "the TFLite fp32 artifact")
                    else:
                        record = measured_tolerance_record(runtime.run, references, framework)
                added.append((Artifact(f"tflite-{precision}", f"artifacts/model.{precision}.tflite", "tflite", precision,
                                       "", 0, ["tflite"], targets=["edge"]), path, {}, record))
        else:
            notes.append(f"no TFLite artifact: TFLite conversion from {framework} sources (onnx2tf) is not part of "
                         "this version; the .ort artifact runs on ONNX Runtime Mobile")

        say("writing the package")
        destination = Path(output)
        same = destination.resolve() == Path(package_path).resolve()
        with PackageWriter(destination, overwrite=overwrite or same) as writer:
            updated = writer.add_package(package)
            ids = {a.id for a, *_ in added}
            updated.artifacts = [a for a in updated.artifacts if a.id not in ids]
            for artifact, path, companions, record in added:
                updated.artifacts.append(writer.add_artifact(path, artifact, companions))
                updated.validation[artifact.id] = record
            if notes:
                updated.description = "; ".join(notes)
            return writer.commit(updated)
