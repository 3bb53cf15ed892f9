"""Importing an existing .onnx file: check it, infer shapes, read its signature.

The "source framework" of an ONNX file is ONNX Runtime on the file as given, so later artifacts
(optimized, converted for edge) are validated against what the user brought. Models that keep
their weights in external data files (how large models ship) are accepted when every file lies
inside the model's folder; the package keeps them as one ``model.onnx.data`` beside the graph.
A file already quantized or in 16-bit floats keeps that precision (``onnx/precision.py``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from unideploy.errors import ExportError, InputError, PackageError, first_line
from unideploy.exporters.base import Constant, ConvertedModel, Exporter, ExportOptions
from unideploy.exporters.shapes import readable_dims, resolve_signature
from unideploy.onnx.files import EXTERNAL_DATA_NAME, MAX_INLINE_BYTES, oldest_ir_version, save_model
from unideploy.onnx.graph import constants_to_initializers
from unideploy.onnx.interface import declare_signature, opset_of, set_io_dims
from unideploy.onnx.precision import graph_precision
from unideploy.quiet import quiet
from unideploy.runtimes.base import RuntimeOptions
from unideploy.runtimes.onnxruntime_runtime import OnnxRuntime
from unideploy.signature import STRING, Signature, signature_from_onnx


class OnnxFileExporter(Exporter):
    name = "onnx"
    framework = "onnx"
    required_modules = ("onnx", "onnxruntime")
    keeps_source = False  # the artifact is the source, re-saved with inferred shapes
    binds_constants = True  # --constant NAME=VALUE: an input made an initializer of that value

    @classmethod
    def detect(cls, src: Path) -> bool:
        return src.is_file() and src.suffix.lower() == ".onnx"

    def convert(self, src: Path, workdir: Path, options: ExportOptions) -> ConvertedModel:
        import onnx

        try:
            model = onnx.load(str(src), load_external_data=False)
        except Exception as exc:
            raise InputError(
                f"'{src}' is not a readable ONNX model: {first_line(exc)}",
                "check that the file is a complete .onnx export",
            ) from exc
        if not model.graph.node:
            raise InputError(f"'{src}' is not a readable ONNX model: its graph is empty")
        external = check_external_data(model, src)
        try:
            if external:
                onnx.load_external_data_for_model(model, str(src.parent))
            onnx.checker.check_model(model if model.ByteSize() <= MAX_INLINE_BYTES else str(src))
        except Exception as exc:
            raise ExportError(
                f"'{src.name}' fails the ONNX checker: {first_line(exc)}",
                "fix the model in the framework that produced it and export it again",
            ) from exc
        constants_to_initializers(model)
        given = signature_from_onnx(model)
        bound = _bind_constants(model, given, options.constants)
        declared = readable_dims(signature_from_onnx(model))
        signature, sizes = resolve_signature(declared, options, _metadata_sizes(model, declared))
        onnx_path = workdir / "model.onnx"
        # Before inferring: shape inference multiplies a declared -1 through the graph as a size.
        set_io_dims(model, {t.name: t.shape for t in signature.inputs + signature.outputs})
        if bound:
            model = _settings_folded(model, src)
        try:
            if model.ByteSize() <= MAX_INLINE_BYTES:
                model = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        except Exception as exc:
            raise ExportError(
                f"'{src.name}' fails ONNX shape inference: {first_line(exc)}",
                "fix the model in the framework that produced it and export it again",
            ) from exc
        model.ir_version = oldest_ir_version(model)  # readable by runtimes older than the onnx that saved it
        save_model(model, onnx_path, external=bool(external))
        declare_signature(onnx_path, signature)
        try:
            # the model as the user gave it, on the CPU provider: ONNX's reference implementation
            # here, the same on every machine (a GPU's kernels differ in the last bits)
            fed = Signature(signature.inputs + tuple(t for t in given.inputs if t.name in bound), signature.outputs)
            source = OnnxRuntime(src, fed, RuntimeOptions(device="cpu"))
        except PackageError as exc:
            raise ExportError(
                f"ONNX Runtime cannot run '{src.name}': {exc.message}",
                "the model uses an operator or opset this onnxruntime does not implement",
            ) from exc
        opset = opset_of(model)
        return ConvertedModel(
            onnx_path=onnx_path,
            signature=signature,
            run_source=(lambda inputs: source.run({**inputs, **bound})) if bound else source.run,
            conversion_path="import (onnx checker + shape inference)",
            library_versions={"onnx": onnx.__version__},
            opset=opset,
            size_hints=sizes,
            companions={f"artifacts/{EXTERNAL_DATA_NAME}": workdir / EXTERNAL_DATA_NAME} if external else {},
            precision=graph_precision(model),
            rows_alone="ONNX Runtime",
        )


def _settings_folded(model: Any, src: Path) -> Any:
    """The graph with what a bound setting decides computed once (onnxscript's optimizer: constant
    folding, an ``If`` whose condition became constant replaced by the branch it takes): Silero
    VAD keeps its convolutions and LSTM in ``If`` branches on its sample rate, which the quantizer,
    the pruners and the converters do not enter. The package's artifact is this graph, checked
    against the model as brought like any other export."""
    from onnxscript import optimizer

    try:
        with quiet():  # its shape inference and ONNX Runtime's evaluator warn per folded value
            return optimizer.optimize(model)
    except Exception as exc:
        raise ExportError(
            f"folding what --constant decides in '{src.name}' failed: {first_line(exc)}",
            "report the model; meanwhile export it without --constant, feeding the setting as an input",
        ) from exc


def _bind_constants(model: Any, signature: Signature, constants: Mapping[str, Constant]) -> dict[str, np.ndarray]:
    """Make each input named by ``--constant`` an initializer holding its value (a sample rate, a
    threshold: a setting, not data); return the values, which the source model is fed."""
    from onnx import numpy_helper

    specs = {t.name: t for t in signature.inputs}
    unknown = [name for name in constants if name not in specs]
    if unknown:
        raise InputError(
            f"--constant {', '.join(unknown)}: the model has no such input",
            f"its inputs: {', '.join(specs)}",
        )
    bound: dict[str, np.ndarray] = {}
    for name, value in constants.items():
        spec = specs[name]
        text = spec.dtype == STRING
        if not all(isinstance(d, int) for d in spec.shape):
            raise InputError(
                f"--constant {name}: input '{name}' is {spec.dtype} {spec.shape_text()}, which one value cannot fill",
                "bind only settings: a scalar or fixed-shape input",
            )
        if text != isinstance(value, str):
            raise InputError(
                f"--constant {name}={value!r} is no {spec.dtype} value", "a number for a numeric input, text for text"
            )
        try:
            dtype = np.asarray(value).dtype if text else spec.np_dtype  # text: as wide as the value
            bound[name] = np.full(tuple(int(d) for d in spec.shape), value, dtype=dtype)
        except (TypeError, ValueError, OverflowError) as exc:
            raise InputError(f"--constant {name}={value!r} is no {spec.dtype} value: {exc}") from exc
    for name, array in bound.items():
        model.graph.initializer.append(numpy_helper.from_array(array, name))
    kept = [v for v in model.graph.input if v.name not in bound]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    return bound


def _tensors(graph: Any) -> Iterator[Any]:
    """Every tensor a graph holds: initializers and node attributes, subgraphs included."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _tensors(attr.g)
            for sub in attr.graphs:
                yield from _tensors(sub)


def check_external_data(model: Any, src: Path) -> list[Path]:
    """The external data files ``model`` reads, refusing any that escape the model's folder or
    that are missing or too short for what the model reads from them."""
    import onnx
    from onnx.external_data_helper import ExternalDataInfo

    folder = src.parent.resolve()
    files: dict[Path, int] = {}
    for tensor in _tensors(model.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = ExternalDataInfo(tensor)
        location = Path(info.location)
        target = (folder / location).resolve()
        if location.is_absolute() or ".." in location.parts or not target.is_relative_to(folder):
            raise InputError(
                f"'{src.name}' reads tensor '{tensor.name}' from '{info.location}', outside the model's folder",
                "external data files must lie beside the .onnx file; move them "
                "there and re-save the model (onnx.save(..., location='NAME.data'))",
            )
        if not target.is_file():
            raise InputError(
                f"'{src.name}' reads tensor '{tensor.name}' from '{info.location}', which does not exist",
                f"put the external data files beside {src.name}",
            )
        end = (info.offset or 0) + (info.length or 0)
        files[target] = max(files.get(target, 0), end)
    for path, end in files.items():
        if path.stat().st_size < end:
            raise InputError(
                f"external data file '{path.name}' of '{src.name}' is {path.stat().st_size} bytes, "
                f"but the model reads up to byte {end}",
                "the file is truncated: copy it again",
            )
    return list(files)


def _metadata_sizes(model: Any, signature: Signature) -> dict[str, int]:
    """Image sizes that exporters write into the model's metadata (Ultralytics: ``imgsz``), for the
    height and width of its one channels-first image input."""
    props = {p.key: p.value for p in model.metadata_props}
    images = [t for t in signature.inputs if t.layout == "NCHW"]
    if "imgsz" not in props or len(images) != 1:
        return {}
    try:
        size = ast.literal_eval(props["imgsz"])
    except (ValueError, SyntaxError):
        return {}
    hw = [size, size] if isinstance(size, int) else list(size) if isinstance(size, (list, tuple)) else []
    dims = images[0].shape[2:]
    if len(hw) != 2 or not all(isinstance(v, int) and v > 0 for v in hw):
        return {}
    return {d: v for d, v in zip(dims, hw) if isinstance(d, str)}
