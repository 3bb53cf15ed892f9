"""Importing an existing .onnx file: check it, infer shapes, read its signature.

The "source framework" of an ONNX file is ONNX Runtime on the file as given, so later artifacts
(optimized, converted for edge) are validated against what the user brought.
"""

from __future__ import annotations

from pathlib import Path

from unideploy.errors import ExportError, InputError, PackageError, first_line
from unideploy.exporters.base import ConvertedModel, Exporter, ExportOptions
from unideploy.runtimes.onnxruntime_runtime import OnnxRuntime
from unideploy.signature import Signature, signature_from_onnx

# protobuf cannot serialise a single message over 2 GiB.
MAX_INLINE_BYTES = 2**31 - 1


class OnnxFileExporter(Exporter):
    name = "onnx"
    framework = "onnx"
    required_modules = ("onnx", "onnxruntime")
    keeps_source = False  # the artifact is the source, re-saved with inferred shapes

    @classmethod
    def detect(cls, src: Path) -> bool:
        return src.is_file() and src.suffix.lower() == ".onnx"

    def convert(self, src: Path, workdir: Path, options: ExportOptions) -> ConvertedModel:
        import onnx

        try:
            model = onnx.load(str(src))
        except Exception as exc:
            raise InputError(f"'{src}' is not a readable ONNX model: {first_line(exc)}",
                             "check that the file is a complete .onnx export") from exc
        if not model.graph.node:
            raise InputError(f"'{src}' is not a readable ONNX model: its graph is empty")
        try:
            onnx.checker.check_model(model)
            model = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        except Exception as exc:
            raise ExportError(f"'{src.name}' fails the ONNX checker: {first_line(exc)}",
                              "fix the model in the framework that produced it and export it again") from exc
        if model.ByteSize() > MAX_INLINE_BYTES:
            raise ExportError(f"'{src.name}' is over 2 GiB, which packages do not support yet")
        signature = signature_from_onnx(model)
        _check_options(signature, options)
        onnx_path = workdir / "model.onnx"
        onnx.save(model, str(onnx_path))

        try:
            source = OnnxRuntime(src, signature)  # the model as the user gave it
        except PackageError as exc:
            raise ExportError(f"ONNX Runtime cannot run '{src.name}': {exc.message}",
                              "the model uses an operator or opset this onnxruntime does not implement") from exc
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        return ConvertedModel(
            onnx_path=onnx_path,
            signature=signature,
            run_source=source.run,
            conversion_path="import (onnx checker + shape inference)",
            library_versions={"onnx": onnx.__version__},
            opset=opset,
        )


def _check_options(signature: Signature, options: ExportOptions) -> None:
    """--input-shape on an ONNX model may only name its inputs; it gives example sizes."""
    known = set(signature.input_names)
    for shape in options.input_shapes:
        if shape.name not in known:
            raise InputError(f"--input-shape names '{shape.name}', which the model does not take",
                             f"its inputs are: {', '.join(signature.input_names)}")
    if options.static_shapes:
        raise InputError("--static-shapes applies to TorchScript sources; an ONNX model keeps its own shapes")

