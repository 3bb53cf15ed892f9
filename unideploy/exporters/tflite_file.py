"""TFLite / LiteRT models (``.tflite``) -> ONNX, through tf2onnx's TFLite reader.

Many published models ship only as a ``.tflite`` flatbuffer (MediaPipe's face, hand and pose
networks, models made for phones), with no SavedModel or Keras file behind them. tf2onnx reads
the flatbuffer itself and maps TFLite's builtin operators to ONNX; LiteRT (``ai-edge-litert``), the
interpreter the model was made for, runs the original as the reference every export is checked
against.

Names: a model converted with a SignatureDef (TensorFlow 2's converter writes ``serving_default``)
is called by its signature's names, as LiteRT's signature runner calls it; an older model without
one (MediaPipe's) by its tensors' names. The layout stays the model's own (channels last), and
sizes the flatbuffer fixes (a batch of 1 in most mobile models) stay fixed. Weights stored sparse
(``EXPERIMENTAL_SPARSITY``, MediaPipe's full-range detector) reach tf2onnx made dense by LiteRT's
own DENSIFY (``tflite_dense.py``), and MediaPipe's ``Convolution2DTransposeBias`` as the builtin
operators it stands for (``tflite_custom.py``); LiteRT runs the source as it is as the reference.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from unideploy.errors import ExportError, InputError, first_line
from unideploy.exporters.base import ConvertedModel, Exporter, ExportOptions
from unideploy.exporters.savedmodel import MAX_OPSET, converter_failure, save_checked
from unideploy.exporters.tflite_custom import TRANSPOSE_CONV_BIAS, builtin_transposes
from unideploy.exporters.tflite_dense import densified, sparse_tensors
from unideploy.exporters.tflite_state import NEXT, StateVariable, check_unrolled, unrolled
from unideploy.onnx.interface import rename_values
from unideploy.quiet import quiet
from unideploy.signature import Signature, StateSpec, TensorSpec, contiguous, undeclared_dim

_IDENTIFIER = b"TFL3"  # the FlatBuffer file identifier TFLite writes at bytes 4-8


class TFLiteExporter(Exporter):
    name = "tflite"
    framework = "tflite"
    required_modules = ("tensorflow", "tf2onnx", "ai_edge_litert")
    extra = "tflite"

    @classmethod
    def detect(cls, src: Path) -> bool:
        try:
            with src.open("rb") as file:
                return file.read(8)[4:] == _IDENTIFIER
        except OSError:  # a folder, or unreadable: not this exporter's
            return False

    def convert(self, src: Path, workdir: Path, options: ExportOptions) -> ConvertedModel:
        interpreter = _interpreter(src)  # refuses a file LiteRT cannot load, naming why, before it is read
        model_file = src  # what LiteRT runs: the source, or its state made inputs and outputs
        variables = unrolled(src, workdir / "stateless.tflite")
        if variables:
            model_file = workdir / "stateless.tflite"
            check_unrolled(src, model_file, variables, interpreter.get_input_details())
            interpreter = _interpreter(model_file)
        inputs, outputs = _io_details(interpreter, src, options.signature)
        tensors = interpreter.get_tensor_details()
        readable, expanded = model_file, 0  # what tf2onnx reads: that, or with its sparse weights made dense
        sparse = [t["name"] for t in tensors if t.get("sparsity_parameters")]
        if sparse:
            expanded = densified(model_file, workdir / "dense.tflite")
            if expanded:
                readable, sparse = workdir / "dense.tflite", sparse_tensors(workdir / "dense.tflite")
            _refuse_sparse_weights(sparse, src)
        rewritten = builtin_transposes(readable, workdir / "builtin.tflite")
        if rewritten:
            readable = workdir / "builtin.tflite"
        _refuse_unquantized_examples(inputs, options.example_inputs, src)
        quantized = _quantized_tensors(tensors)
        signature = Signature(
            tuple(_spec(name, d) for name, d in inputs.items()), tuple(_spec(name, d) for name, d in outputs.items())
        )
        opset = min(options.opset or MAX_OPSET, MAX_OPSET)
        with quiet():  # TensorFlow and tf2onnx log each operator to stderr
            import tensorflow as tf
            import tf2onnx

            try:
                model, _ = tf2onnx.convert.from_tflite(str(readable), opset=opset)
            except Exception as exc:
                raise converter_failure(src, exc) from exc
        names = {d["name"]: name for name, d in {**inputs, **outputs}.items()}
        rename_values(model, names)
        converted_names = {v.name for v in list(model.graph.input) + list(model.graph.output)}
        if converted_names != set(names.values()):
            raise ExportError(
                f"tf2onnx's model of '{src.name}' has inputs and outputs {sorted(converted_names)}, "
                f"LiteRT's {sorted(names.values())}",
                "the model may hold more than one subgraph; export the one to serve on its own",
            )
        onnx_path = save_checked(
            model,
            signature,
            src,
            workdir,
            "the model uses a TFLite operator with no ONNX mapping (a custom or Select TF operator)",
        )
        run_source = _TensorRunner(interpreter, inputs, outputs)
        builtin = _builtin_kernels(readable) if not quantized else None
        import ai_edge_litert

        return ConvertedModel(
            onnx_path=onnx_path,
            signature=signature,
            run_source=run_source,
            conversion_path=f"tf2onnx {tf2onnx.__version__} TFLite reader"
            + (f" ({expanded} sparse weight tensor(s) made dense by LiteRT's DENSIFY)" if expanded else "")
            + (f" ({rewritten} MediaPipe {TRANSPOSE_CONV_BIAS} read as TRANSPOSE_CONV + ADD)" if rewritten else "")
            + (f" ({_state_note(variables)})" if variables else ""),
            library_versions={
                "tf2onnx": tf2onnx.__version__,
                "tensorflow": tf.__version__,
                "ai-edge-litert": getattr(ai_edge_litert, "__version__", "unknown"),
            },
            opset=opset,
            precision="int8" if quantized else "fp32",
            inexact=(
                f"{quantized} quantized tensors: LiteRT's int8 kernels and ONNX Runtime's round their own way"
                if quantized
                else None
            ),
            second_engine=(
                (
                    _BUILTIN_KERNELS,
                    _TensorRunner(builtin, _same_tensors(builtin, inputs), _same_tensors(builtin, outputs)),
                )
                if builtin is not None
                else None
            ),
            output_scales={
                name: (float(d["quantization"][0]), int(d["quantization"][1]))
                for name, d in outputs.items()
                if d["quantization"][0]  # a scale of 0: not quantized
            },
            state=_state_specs(variables),
        )


def _state_specs(variables: list[StateVariable]) -> tuple[StateSpec, ...]:
    """The variables as the signature's state, where each starts from one value (a state whose
    elements start apart is left to the caller, as the provenance says)."""
    if any(np.unique(v.initial).size != 1 for v in variables):
        return ()
    return tuple(StateSpec(v.name, v.next_name, float(v.initial.flat[0])) for v in variables)


def _state_note(variables: list[StateVariable]) -> str:
    """What a caller of a model whose state became inputs and outputs must do, for the provenance."""
    starts = {float(x) for v in variables for x in np.unique(v.initial)}
    start = (
        f"all {starts.pop():g}" if len(starts) == 1 else "not one value: the source's initializer subgraph holds them"
    )
    return (
        f"{len(variables)} resource variables (streaming state) read from inputs and written to outputs "
        f"'<name>{NEXT}': feed each call's back to the next, starting from the initializer's values ({start})"
    )


# The engine a float model's conversion is also compared with: LiteRT runs a float model through
# XNNPACK by default, and its own reference kernels otherwise. Where the two disagree (sums over
# large values: MediaPipe's pose segmentation logits reach -1,700, and its two engines differ there
# by 0.2), no conversion can be held closer than that.
_BUILTIN_KERNELS = "LiteRT's builtin kernels (without XNNPACK)"


def _interpreter(src: Path, delegates: bool = True) -> Any:
    """LiteRT's interpreter of ``src``, with XNNPACK (its default) or its builtin kernels alone."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    kind = OpResolverType.AUTO if delegates else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    with quiet():  # LiteRT logs its delegate to fd 2
        try:
            interpreter = Interpreter(model_path=str(src), experimental_op_resolver_type=kind)
            interpreter.allocate_tensors()
        except (ValueError, RuntimeError) as exc:
            custom = _UNRESOLVED.search(str(exc))
            raise InputError(
                f"'{src}' cannot be loaded by LiteRT: {first_line(exc)}",
                f"its custom operator {custom[1]} runs only where its maker's runtime registers it (MediaPipe's, for "
                "its own), which LiteRT alone does not: export the model it was converted from, or a version with "
                "builtin operators only"
                if custom
                else "check that the file was copied whole; LiteRT runs TFLite's builtin operators, not Select TF "
                "(Flex) or custom ones",
            ) from exc
    return interpreter


_UNRESOLVED = re.compile(r"unresolved custom op: (\w+)")


def _builtin_kernels(path: Path) -> Any:
    """LiteRT's interpreter of ``path`` on its builtin kernels, or None where only a delegate runs
    one of its operators (a custom one XNNPACK knows): then the source has one engine here."""
    try:
        return _interpreter(path, delegates=False)
    except InputError:
        return None


def _same_tensors(interpreter: Any, details: Details) -> Details:
    """``details`` (by caller name) as another interpreter of the same graph numbers its tensors."""
    index = {d["name"]: d for d in interpreter.get_tensor_details()}
    return {name: {**d, "index": index[d["name"]]["index"]} for name, d in details.items()}


def _refuse_sparse_weights(sparse: list[str], src: Path) -> None:
    """Sparse weights that no DENSIFY operator of the main subgraph expands (read in place by their
    operators, or in another subgraph) stay in a layout tf2onnx cannot read: it stops with a
    reshape error that names neither the cause nor the model's tensors."""
    if sparse:
        raise ExportError(
            f"'{src.name}' holds {len(sparse)} sparse weight tensor(s) ({sparse[0]}, ...) that no DENSIFY "
            "operator expands, which tf2onnx cannot convert",
            "convert the model again without weight sparsity (leave out tf.lite.Optimize.EXPERIMENTAL_SPARSITY), "
            "or export its dense version",
        )


def _refuse_unquantized_examples(inputs: Details, examples: dict[str, np.ndarray] | None, src: Path) -> None:
    """A quantized input takes integers that stand for real numbers: float example inputs need its
    scale and zero point, not a cast (which the signature's dtype check would suggest)."""
    for name, details in inputs.items():
        scale, zero_point = details["quantization"]
        given = None if examples is None or name not in examples else np.asarray(examples[name])
        if not scale or given is None or not np.issubdtype(given.dtype, np.floating):
            continue
        dtype = np.dtype(details["dtype"])
        bounds = np.iinfo(dtype.name)  # a quantized tensor is an integer one
        low, high = bounds.min, bounds.max
        raise InputError(
            f"input '{name}' of '{src.name}' is quantized to {dtype.name} (scale {scale:g}, zero point {zero_point}), "
            f"and --example-input gives {given.dtype.name}",
            f"quantize it as the model's callers do: np.clip(np.round(x / {scale:g} + {zero_point}), {low}, {high})"
            f".astype('{dtype.name}')",
        )


def _quantized_tensors(tensors: list[dict[str, Any]]) -> int:
    """How many tensors the model holds in int8 (or uint8, int16) with a scale: a quantized model,
    full integer or with int8 weights only, whose integer kernels no other engine rounds alike."""
    return sum(
        1
        for t in tensors
        if np.dtype(t["dtype"]) in (np.int8, np.uint8, np.int16)
        and len(t.get("quantization_parameters", {}).get("scales", ())) > 0
    )


Details = dict[str, dict[str, Any]]


def _io_details(interpreter: Any, src: Path, wanted: str | None) -> tuple[Details, Details]:
    """The model's inputs and outputs by the names its callers use, each with LiteRT's details
    (tensor name and index, dtype, shape signature): the SignatureDef's where it has one, the
    tensors' own otherwise."""
    signatures = interpreter.get_signature_list()
    if len(signatures) > 1:
        raise InputError(
            f"'{src.name}' has {len(signatures)} signatures ({', '.join(sorted(signatures))}); the TFLite "
            "exporter converts a model with one",
            "convert the signature to serve into a .tflite of its own",
        )
    key = next(iter(signatures), None)
    if wanted is not None and wanted != key:
        raise InputError(
            f"'{src.name}' has no signature '{wanted}'",
            f"its signature is '{key}': leave --signature out" if key else "it has none: leave --signature out",
        )
    if key is None:
        return (
            {d["name"]: d for d in interpreter.get_input_details()},
            {d["name"]: d for d in interpreter.get_output_details()},
        )
    runner = interpreter.get_signature_runner(key)
    return runner.get_input_details(), runner.get_output_details()


def _spec(name: str, details: dict[str, Any]) -> TensorSpec:
    shape = details.get("shape_signature", details["shape"])
    dims = tuple(int(size) if size >= 0 else undeclared_dim(name, axis) for axis, size in enumerate(shape))
    return TensorSpec(name, np.dtype(details["dtype"]).name, dims)


class _TensorRunner:
    """Runs the source on LiteRT by tensor index, the one way that works with and without a
    SignatureDef; an input of a new size (a dynamic batch) is resized first."""

    def __init__(self, interpreter: Any, inputs: Details, outputs: Details) -> None:
        self.interpreter, self.inputs, self.outputs = interpreter, inputs, outputs

    def __call__(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        interpreter = self.interpreter
        resized = False
        for name, details in self.inputs.items():
            shape = tuple(arrays[name].shape)
            if tuple(interpreter.get_tensor(details["index"]).shape) != shape:
                interpreter.resize_tensor_input(details["index"], shape)
                resized = True
        if resized:
            interpreter.allocate_tensors()
        for name, details in self.inputs.items():
            interpreter.set_tensor(details["index"], contiguous(np.asarray(arrays[name], dtype=details["dtype"])))
        interpreter.invoke()
        return {name: np.array(interpreter.get_tensor(d["index"])) for name, d in self.outputs.items()}
