"""TensorFlow 1 frozen graphs (one ``.pb`` GraphDef, its variables folded into constants) -> ONNX,
through tf2onnx.

Before SavedModels, TensorFlow models shipped frozen: TF1's image classifiers and object detectors,
models made for TensorFlow Mobile or OpenCV's DNN module. The file holds the graph and nothing
else, so the model's interface is read from it: its inputs are its Placeholders (a
``PlaceholderWithDefault``, such as a training flag, keeps its default), its outputs the tensors no
node reads. Each is named by its node (``input``, ``MobilenetV2/Predictions/Reshape_1``), with
``:N`` only where a node gives several. TensorFlow runs the graph itself as the reference.

A ``.pb`` is also a SavedModel's ``saved_model.pb``; given that file alone, the export says to
give its folder. A graph that still holds variables was not frozen, and is refused with how to
freeze it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from unideploy.errors import ExportError, InputError, first_line
from unideploy.exporters import trust
from unideploy.exporters.base import ConvertedModel, Exporter, ExportOptions
from unideploy.exporters.savedmodel import MAX_OPSET, converter_failure, register_missing_handlers, save_checked
from unideploy.exporters.shapes import resolve_signature
from unideploy.onnx.interface import rename_values
from unideploy.quiet import quiet
from unideploy.signature import Signature, TensorSpec, undeclared_dim

_GRAPH_DEF_START = 0x0A  # a GraphDef's first field, its nodes (field 1, length-delimited)
_SAVED_MODEL_START = 0x08  # a SavedModel's, its schema version (field 1, an integer)
_VARIABLES = {"VariableV2", "Variable", "VarHandleOp", "ReadVariableOp", "AssignVariableOp"}
_NOT_RESULTS = {"Const", "NoOp", "Placeholder", "PlaceholderWithDefault", "Assert", "SaveV2", "RestoreV2"}


class FrozenGraphExporter(Exporter):
    name = "frozen-graph"
    framework = "tensorflow"
    required_modules = ("tensorflow", "tf2onnx")
    extra = "tensorflow"

    @classmethod
    def detect(cls, src: Path) -> bool:
        """A ``.pb`` file that starts as a GraphDef does, or as a SavedModel's ``saved_model.pb``
        (given without its folder: the export then says to give the folder)."""
        if not src.is_file() or src.suffix != ".pb":
            return False
        with src.open("rb") as file:
            return file.read(1) in (bytes([_GRAPH_DEF_START]), bytes([_SAVED_MODEL_START]))

    def convert(self, src: Path, workdir: Path, options: ExportOptions) -> ConvertedModel:
        import onnx

        if options.signature:
            raise InputError(
                "--signature applies to SavedModel directories and .tflite files; a frozen graph has none",
                "leave --signature out: its inputs and outputs are read from the graph",
            )
        graph_def = _parse(src)
        trust.check(trust.graph_def_findings(graph_def), src, options.trust_source)
        held = sorted({n.op for n in graph_def.node if n.op in _VARIABLES})
        if held:
            raise InputError(
                f"'{src.name}' holds variables ({', '.join(held)}): it is a graph that was not frozen, and its "
                "weights are not in the file",
                "freeze it with tf.compat.v1.graph_util.convert_variables_to_constants (TF1) or "
                "convert_variables_to_constants_v2 (TF2), or export the SavedModel or checkpoint it came from",
            )
        with quiet():
            import tensorflow as tf
            import tf2onnx

            inputs, outputs = _interface(tf, graph_def, src)
            signature, _ = resolve_signature(
                Signature(
                    tuple(_spec(name, tensor) for name, tensor in inputs.items()),
                    tuple(_spec(name, tensor) for name, tensor in outputs.items()),
                ),
                options,
            )
            opset = min(options.opset or MAX_OPSET, MAX_OPSET)
            register_missing_handlers()
            try:
                model, _ = tf2onnx.convert.from_graph_def(
                    graph_def,
                    opset=opset,
                    input_names=[t.name for t in inputs.values()],
                    output_names=[t.name for t in outputs.values()],
                )
            except Exception as exc:
                raise converter_failure(src, exc) from exc
            run_source = _graph_runner(tf, graph_def, inputs, outputs)
        rename_values(model, {t.name: name for name, t in {**inputs, **outputs}.items()})
        onnx_path = save_checked(
            model, signature, src, workdir, "the graph uses a TensorFlow operator with no ONNX mapping"
        )
        return ConvertedModel(
            onnx_path=onnx_path,
            signature=signature,
            run_source=run_source,
            conversion_path=f"tf2onnx {tf2onnx.__version__} (frozen graph, opset {opset})",
            library_versions={"tensorflow": tf.__version__, "tf2onnx": tf2onnx.__version__, "onnx": onnx.__version__},
            opset=opset,
        )


def _parse(src: Path) -> Any:
    data = src.read_bytes()
    if data[:1] == bytes([_SAVED_MODEL_START]):
        raise InputError(
            f"'{src.name}' is a SavedModel's graph file, which holds no weights of its own",
            f"export the folder it is in ({src.parent}), with its variables/",
        )
    with quiet():  # importing TensorFlow logs to stderr
        from tensorflow.core.framework import graph_pb2

    graph_def = graph_pb2.GraphDef()
    try:
        graph_def.ParseFromString(data)
    except Exception as exc:
        raise InputError(
            f"'{src.name}' is not a readable TensorFlow graph: {first_line(exc)}", "check that it was copied whole"
        ) from exc
    if not graph_def.node:
        raise InputError(f"'{src.name}' holds no graph nodes", "check that it is a frozen TensorFlow graph (.pb)")
    return graph_def


def _interface(tf: Any, graph_def: Any, src: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The graph's inputs (its Placeholders) and outputs (the tensors no node reads), as TensorFlow's
    tensors by the names the package gives them. Importing a graph runs none of it."""
    graph = tf.Graph()
    with graph.as_default():
        try:
            tf.compat.v1.import_graph_def(graph_def, name="")
        except (ValueError, tf.errors.OpError) as exc:
            raise InputError(
                f"TensorFlow cannot import the graph in '{src.name}': {first_line(exc)}",
                "the graph may need operators from a TensorFlow add-on this TensorFlow lacks",
            ) from exc
    operations = graph.get_operations()
    inputs = {op.name: op.outputs[0] for op in operations if op.type == "Placeholder"}
    outputs = {}
    for op in operations:
        if op.type in _NOT_RESULTS:  # variables were refused before the graph was imported
            continue
        results = [t for t in op.outputs if not t.consumers()]
        if len(results) == len(op.outputs) and results:
            outputs.update({op.name if len(results) == 1 else t.name: t for t in results})
    if not inputs or not outputs:
        raise InputError(
            f"'{src.name}' has {'no Placeholder to feed' if not inputs else 'no result no other node reads'}: "
            "the frozen-graph exporter reads a model's inputs and outputs from its graph",
            "export a graph frozen with its inputs as Placeholders",
        )
    return inputs, outputs


def _spec(name: str, tensor: Any) -> TensorSpec:
    if tensor.shape.rank is None:
        raise ExportError(
            f"TensorFlow cannot tell the rank of '{name}' from the graph",
            "freeze the graph with the input shapes set on its Placeholders",
        )
    dims = tuple(
        int(size) if size is not None else undeclared_dim(name, axis)
        for axis, size in enumerate(tensor.shape.as_list())
    )
    return TensorSpec(name, np.dtype(tensor.dtype.as_numpy_dtype).name, dims)


def _graph_runner(tf: Any, graph_def: Any, inputs: dict[str, Any], outputs: dict[str, Any]) -> Any:
    """The frozen graph as a TensorFlow function from its inputs to its outputs."""
    wrapped = tf.compat.v1.wrap_function(lambda: tf.compat.v1.import_graph_def(graph_def, name=""), [])
    function = wrapped.prune(
        [wrapped.graph.get_tensor_by_name(t.name) for t in inputs.values()],
        [wrapped.graph.get_tensor_by_name(t.name) for t in outputs.values()],
    )

    def run(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        results = function(*[tf.constant(batch[name]) for name in inputs])
        return {name: result.numpy() for name, result in zip(outputs, results)}

    return run
