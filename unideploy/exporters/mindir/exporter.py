"""MindSpore MindIR -> ONNX with unideploy's own translator, validated against MindSpore itself.

MindSpore cannot export a loaded .mindir to ONNX (only a Python Cell, at opset 11 with static
shapes), so the file is read with MindSpore's protobuf schema and translated operator by operator
(``ops.py``). The reference outputs come from ``nn.GraphCell(mindspore.load(...))`` through the
MindSpore runtime plug-in. The .mindir stays in the package as a native artifact; with
``--keep-native-only`` it is the only artifact, for models using operators outside the table.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import replace
from pathlib import Path
from typing import Any

from unideploy.errors import ExportError, first_line
from unideploy.exporters import trust
from unideploy.exporters.base import ConvertedModel, Exporter, ExportOptions
from unideploy.exporters.mindir.ops import OPSET
from unideploy.exporters.mindir.reader import UNKNOWN_RANK, MindIRGraph, TensorInfo, read_mindir
from unideploy.exporters.mindir.translate import translate
from unideploy.runtimes.mindspore_runtime import MindSporeRuntime
from unideploy.signature import Dim, Signature, TensorSpec, default_output_names, undeclared_dim


def _spec(name: str, info: TensorInfo, named: dict[int, str]) -> TensorSpec:
    if info.dtype not in ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"):
        raise ExportError(f"MindIR tensor '{name}' has an unsupported dtype ({info.dtype})")
    dims: list[Dim] = [
        size if size >= 0 else named.get(axis) or undeclared_dim(name, axis) for axis, size in enumerate(info.shape)
    ]
    return TensorSpec(name, info.dtype, tuple(dims))


def signature_of(graph: MindIRGraph, options: ExportOptions) -> Signature:
    named = {s.name: s.dim_names for s in options.input_shapes}
    inputs = tuple(_spec(i.name, i, named.get(i.name, {})) for i in graph.inputs)
    outs = graph.output_infos
    return Signature(inputs, tuple(_spec(n, info, {}) for n, info in zip(default_output_names(len(outs)), outs)))


def _declared_ranks(signature: Signature, graph: MindIRGraph, model: Any) -> Signature:
    """Outputs whose rank MindSpore lost take the rank their translation computes, every dim dynamic
    (the first one the batch); the reference runs then settle the dims."""
    declared = {o.name: len(o.type.tensor_type.shape.dim) for o in model.graph.output}
    outputs = tuple(
        replace(
            spec,
            shape=tuple(undeclared_dim(spec.name, axis) for axis in range(declared[spec.name])),
        )
        if info.shape == UNKNOWN_RANK
        else spec
        for info, spec in zip(graph.output_infos, signature.outputs)
    )
    return replace(signature, outputs=outputs)


class MindIRExporter(Exporter):
    name = "mindir"
    framework = "mindspore"
    required_modules = ("mindspore",)
    extra = "mindspore"
    native_format = "mindir"

    @classmethod
    def detect(cls, src: Path) -> bool:
        return src.is_file() and src.suffix.lower() == ".mindir"

    def convert(self, src: Path, workdir: Path, options: ExportOptions) -> ConvertedModel:
        import onnx

        graph = read_mindir(src)
        trust.check(trust.mindir_findings(graph.primitives), src, options.trust_source)  # before MindSpore runs it
        signature = signature_of(graph, options)
        onnx_path = None
        if not options.native_only:
            model = translate(graph, signature)
            signature = _declared_ranks(signature, graph, model)
            try:
                onnx.checker.check_model(model, full_check=True)
            except Exception as exc:
                raise ExportError(
                    f"the translated ONNX model is invalid: {first_line(exc)}",
                    "report the model; --keep-native-only packages the MindIR artifact alone",
                ) from exc
            onnx_path = workdir / "model.onnx"
            onnx.save(model, str(onnx_path))

        runtime = MindSporeRuntime(src, signature)
        versions = {"mindspore": importlib.metadata.version("mindspore"), "onnx": onnx.__version__}
        return ConvertedModel(
            onnx_path=onnx_path,
            signature=signature,
            run_source=runtime.run,
            conversion_path="native MindIR only (--keep-native-only)"
            if options.native_only
            else f"unideploy MindIR translator (opset {OPSET}, {graph.producer})",
            library_versions=versions,
            opset=OPSET,
        )
