"""TensorFlow SavedModel -> ONNX, through tf2onnx's Python API.

The signature (names, dtypes, shapes) is read from the SavedModel's own SignatureDef; unknown
dimensions become named dynamic ones (``batch`` on axis 0). tf2onnx can write an invalid model
and report success (Keras 3's exact GELU emits ``Erfc``, which it does not map): unideploy
registers the missing handler, and every result goes through the ONNX checker and the validation
against the SavedModel itself. The SavedModel directory is kept in the package as the source
(the edge target converts to TFLite from it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from unideploy.errors import ExportError, InputError, first_line
from unideploy.exporters import trust
from unideploy.exporters.base import ConvertedModel, Exporter, ExportOptions
from unideploy.exporters.shapes import resolve_signature
from unideploy.onnx.interface import rename_values, set_io_dims
from unideploy.quiet import quiet
from unideploy.signature import Signature, TensorSpec, undeclared_dim

DEFAULT_SIGNATURE = "serving_default"
MAX_OPSET = 18  # the highest tf2onnx 1.17 maps


def register_missing_handlers() -> None:
    """Map TF ops tf2onnx leaves out (once per process)."""
    from tf2onnx import utils
    from tf2onnx.handler import tf_op

    if getattr(register_missing_handlers, "done", False):
        return

    @tf_op("Erfc")
    class Erfc:
        @classmethod
        def version_9(cls, ctx: Any, node: Any, **kwargs: Any) -> None:
            """erfc(x) = 1 - erf(x)"""
            node.type = "Erf"
            dtype = utils.map_onnx_to_numpy_type(ctx.get_dtype(node.input[0]))
            one = ctx.make_const(utils.make_name(f"{node.name}_one"), np.array(1, dtype=dtype))
            ctx.insert_new_node_on_output(
                "Sub", node.output[0], inputs=[one.output[0], node.output[0]], name=utils.make_name(f"{node.name}_erfc")
            )

    register_missing_handlers.done = True  # type: ignore[attr-defined]


def _parse(src: Path) -> Any:
    with quiet():  # importing TensorFlow logs to stderr
        from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    try:
        proto.ParseFromString((src / "saved_model.pb").read_bytes())
    except Exception as exc:
        raise InputError(f"'{src}/saved_model.pb' is not a readable SavedModel: {first_line(exc)}") from exc
    return proto


def _signature_def(proto: Any, name: str) -> Any:
    available = sorted({k for mg in proto.meta_graphs for k in mg.signature_def if not k.startswith("__")})
    for meta_graph in proto.meta_graphs:
        if name in meta_graph.signature_def:
            return meta_graph.signature_def[name]
    raise InputError(
        f"the SavedModel has no signature '{name}'",
        f"choose one with --signature: {', '.join(available) or 'it has none'}",
    )


def _spec(key: str, info: Any) -> TensorSpec:
    from tensorflow.python.framework import dtypes

    dtype = dtypes.as_dtype(info.dtype).as_numpy_dtype
    if info.tensor_shape.unknown_rank:
        raise ExportError(f"signature tensor '{key}' has unknown rank", "give the SavedModel a signature with shapes")
    dims: list[int | str] = []
    for axis, dim in enumerate(info.tensor_shape.dim):
        if dim.size >= 0:
            dims.append(int(dim.size))
        else:
            dims.append(undeclared_dim(key, axis))
    return TensorSpec(key, np.dtype(dtype).name, tuple(dims))


def converter_failure(src: Path, exc: Exception) -> ExportError:
    """tf2onnx's own error on a TensorFlow-family source (SavedModel, frozen graph, .tflite), in one line."""
    return ExportError(
        f"tf2onnx could not convert '{src.name}': {first_line(exc)}", "re-run with --debug for the converter's output"
    )


def save_checked(model: Any, signature: Signature, src: Path, workdir: Path, unmapped: str) -> Path:
    """tf2onnx's model with the signature's dims declared, through the ONNX checker, saved as
    ``workdir/model.onnx``. tf2onnx continues past operators it cannot map and writes them as they
    are (``unmapped``: what that means for this kind of source)."""
    import onnx

    set_io_dims(model, {t.name: t.shape for t in signature.inputs + signature.outputs})
    try:
        onnx.checker.check_model(model)
    except Exception as exc:
        raise ExportError(f"tf2onnx wrote an invalid ONNX model for '{src.name}': {first_line(exc)}", unmapped) from exc
    onnx_path = workdir / "model.onnx"
    onnx.save(model, str(onnx_path))
    return onnx_path


class SavedModelExporter(Exporter):
    name = "savedmodel"
    framework = "tensorflow"
    required_modules = ("tensorflow", "tf2onnx")
    extra = "tensorflow"

    @classmethod
    def detect(cls, src: Path) -> bool:
        return src.is_dir() and (src / "saved_model.pb").is_file()

    def convert(self, src: Path, workdir: Path, options: ExportOptions) -> ConvertedModel:
        import onnx

        proto = _parse(src)
        trust.check(trust.savedmodel_findings(proto), src, options.trust_source)
        signature_name = options.signature or DEFAULT_SIGNATURE
        sigdef = _signature_def(proto, signature_name)
        inputs = tuple(_spec(k, sigdef.inputs[k]) for k in sorted(sigdef.inputs))
        outputs = tuple(_spec(k, sigdef.outputs[k]) for k in sorted(sigdef.outputs))
        signature, _ = resolve_signature(Signature(inputs, outputs), options)  # stops before tf2onnx if unsized
        opset = min(options.opset or MAX_OPSET, MAX_OPSET)

        with quiet():
            import tensorflow as tf
            import tf2onnx
            from tf2onnx import tf_loader

            register_missing_handlers()
            try:
                # tf2onnx re-traces the signature: its graph's tensor names are its own, and it
                # says which signature key each one carries.
                graph_def, input_names, output_names, tensor_names = tf_loader.from_saved_model(
                    str(src), None, None, signatures=[signature_name], return_tensors_to_rename=True
                )
                model, _ = tf2onnx.convert.from_graph_def(
                    graph_def, opset=opset, input_names=input_names, output_names=output_names
                )
            except Exception as exc:
                raise converter_failure(src, exc) from exc
            loaded = tf.saved_model.load(str(src))
        if set(tensor_names.values()) != set(signature.input_names + signature.output_names):
            raise ExportError(
                f"tf2onnx's tensors {sorted(tensor_names.values())} do not match signature "
                f"'{signature_name}' ({', '.join(signature.input_names + signature.output_names)})"
            )
        rename_values(model, tensor_names)
        onnx_path = save_checked(
            model, signature, src, workdir, "the SavedModel uses a TensorFlow operator with no ONNX mapping"
        )
        function = loaded.signatures[signature_name]

        def run_source(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            result = function(**{k: tf.constant(v) for k, v in batch.items()})
            return {k: v.numpy() for k, v in result.items()}

        return ConvertedModel(
            onnx_path=onnx_path,
            signature=signature,
            run_source=run_source,
            conversion_path=f"tf2onnx {tf2onnx.__version__} (signature '{signature_name}', opset {opset})",
            library_versions={"tensorflow": tf.__version__, "tf2onnx": tf2onnx.__version__, "onnx": onnx.__version__},
            opset=opset,
        )
