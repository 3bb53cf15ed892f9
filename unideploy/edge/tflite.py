"""TFLite artifacts: from a SavedModel with TensorFlow's own converter, from ONNX through onnx2tf.

onnx2tf turns an ONNX model into a TensorFlow SavedModel with channels-last inputs (NCHW ->
NHWC), the layout TFLite kernels and mobile camera pipelines use. From there every precision is
made by TensorFlow's converter, as for SavedModel sources: fp32, fp16 weights, and int8
(int8 kernels with float input/output) calibrated on the user's data, transposed to the
model's layout. Where the layout differs from the source, the artifact's signature says so
(``layout: "NHWC"``) and the TFLite runtime accepts the source layout too.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import io
import math
import os
import re
import shutil
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from unideploy import child_process
from unideploy.edge.tflite_fp16 import with_fp32_where_needed
from unideploy.environment import environment
from unideploy.errors import ExportError, MissingDependencyError, first_line
from unideploy.exporters.tflite_flatbuffer import text
from unideploy.onnx.files import copy_model
from unideploy.onnx.interface import declare_signature
from unideploy.onnx.session import basic_optimized
from unideploy.quiet import quiet
from unideploy.signature import CHANNELS_LAST, Signature, TensorSpec, channels_last
from unideploy.targets import EDGE_INSTALL


def onnx_to_saved_model(
    onnx_path: Path,
    workdir: Path,
    fixed: Signature | None = None,
    folded: bool = False,
    simplified: bool = True,
    kept_layout: Sequence[str] = (),
    moved_back: Mapping[str, Sequence[int]] | None = None,
) -> Path:
    """Convert with onnx2tf; ``erf`` becomes pseudo-ops LiteRT's builtins run (no FlexErf).

    ``fixed``: input shapes to convert at, for models whose dynamic spatial or sequence dims onnx2tf
    cannot trace (a detector's Concat across strides fails at the sizes it guesses). ``folded``:
    declare them in the model and fold its constants with ONNX Runtime first, where onnx2tf's own
    simplifier leaves shape arithmetic it cannot convert (a transformer's attention mask and
    scale). ``simplified``: let onnx2tf run onnxsim on its input; it drops an LSTM's all-zero initial
    states, which onnx2tf's LSTM then cannot do without (ddddocr's CRNN), so after folding it may be
    left out. ``kept_layout``: inputs whose axes stay as they are (onnx2tf otherwise moves axis 1 of
    every 3-D to 5-D input last, as an image's channels). ``moved_back``: outputs whose axes an
    earlier conversion moved (``moved_axes``), each with the permutation that puts them back, which
    onnx2tf applies after the node making it (its parameter replacement file).

    onnx2tf builds with Keras 2 (tf_keras) and, when imported, sets TF_USE_LEGACY_KERAS and
    TF_CPP_MIN_LOG_LEVEL for the whole process: both hold only while it runs, so that what the
    caller starts afterwards (a Keras 3 script, a model builder) inherits neither."""
    with environment(TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL=None):
        return _onnx2tf(onnx_path, workdir, fixed, folded, simplified, kept_layout, moved_back or {})


def _onnx2tf(
    onnx_path: Path,
    workdir: Path,
    fixed: Signature | None,
    folded: bool,
    simplified: bool,
    kept_layout: Sequence[str],
    moved_back: Mapping[str, Sequence[int]],
) -> Path:
    try:
        with quiet():
            import onnx2tf
    except ImportError as exc:
        raise MissingDependencyError(f"TFLite from ONNX needs onnx2tf: {first_line(exc)}", EDGE_INSTALL) from exc
    out = workdir / "onnx2tf"
    shutil.rmtree(out, ignore_errors=True)  # a retry at fixed sizes starts clean
    private = workdir / "onnx2tf-input.onnx"  # onnx2tf rewrites its input file (onnxsim), so never the package's
    copy_model(onnx_path, private)
    if folded:
        if fixed is not None:
            declare_signature(private, Signature(fixed.inputs))
        # in a process of its own: ONNX Runtime's optimizer segfaults on some graphs with control
        # flow once their sizes are declared (Silero VAD's If branches), which took `deploy` down
        folded_model = child_process.call(
            basic_optimized,
            private,
            workdir / "onnx2tf-folded.onnx",
            workdir=workdir,
            what="ONNX Runtime's constant folding",
            hint="the .ort artifact still runs on ONNX Runtime Mobile",
        )
        folded_model.replace(private)
    _scope_safe_node_names(private)
    _slices_for_onnx2tf(private)
    replacements = _put_back(private, moved_back, workdir / "onnx2tf-replacements.json") if moved_back else None
    _test_images_offline(workdir)
    try:
        # onnx2tf simplifies its input by running the ``onnxsim`` command; when ``deploy`` runs from a
        # venv that is not activated, that command is only found beside this Python. Without it
        # onnx2tf goes on unsimplified and fails on shape arithmetic (EfficientNet's padding, MiniLM's masks).
        scripts = os.pathsep.join(p for p in (str(Path(sys.executable).parent), os.environ.get("PATH")) if p)
        with quiet(), environment(PATH=scripts), contextlib.chdir(workdir):
            onnx2tf.convert(
                input_onnx_file_path=str(private),
                output_folder_path=str(out),
                non_verbose=True,
                replace_to_pseudo_operators=["erf"],
                output_signaturedefs=True,
                not_use_onnxsim=not simplified,
                keep_shape_absolutely_input_names=list(kept_layout) or None,
                param_replacement_file=str(replacements or ""),
                overwrite_input_shape=[f"{t.name}:{','.join(map(str, t.shape))}" for t in fixed.inputs]
                if fixed
                else None,
            )
    except BaseException as exc:  # onnx2tf exits (SystemExit) on some failures
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise ExportError(
            f"onnx2tf cannot convert this model to TensorFlow: {first_line(exc)}",
            "the .ort artifact still runs on ONNX Runtime Mobile",
        ) from exc
    if not (out / "saved_model.pb").is_file():
        raise ExportError("onnx2tf wrote no SavedModel", "re-run with --debug for onnx2tf's output")
    return out


def _put_back(model_path: Path, moved: Mapping[str, Sequence[int]], out: Path) -> Path | None:
    """onnx2tf's parameter replacement file transposing each of ``moved``'s outputs after the node
    that makes it, where nothing else reads it (the transpose would reach those readers too); None
    where none can be."""
    import json

    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    read = {name for node in graph.node for name in node.input}
    operations = [
        {"op_name": node.name, "param_target": "outputs", "param_name": name, "post_process_transpose_perm": list(perm)}
        for name, perm in moved.items()
        for node in graph.node
        if name in node.output and name not in read
    ]
    if not operations:
        return None
    out.write_text(json.dumps({"format_version": 1, "operations": operations}))
    return out


def moved_axes(produced: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray]) -> dict[str, list[int]]:
    """The outputs ``produced`` with the sizes of ``expected``'s in another order (onnx2tf read
    Silero VAD's state [2, batch, 128] as [batch, 2, 128]), each with the permutation of its axes
    that gives ``expected``'s (the first that fits, where sizes repeat)."""
    moved = {}
    for name, reference in expected.items():
        if name not in produced:
            continue
        dims, wanted = list(np.shape(produced[name])), list(np.shape(reference))
        if dims == wanted or sorted(dims) != sorted(wanted):
            continue
        free = list(range(len(dims)))
        moved[name] = [free.pop(next(i for i, axis in enumerate(free) if dims[axis] == size)) for size in wanted]
    return moved


NO_DIM_REACHES = 10**9  # a slice's end for "to the end" (exporters write INT_MAX; jax2tf 1e9)


def _slices_for_onnx2tf(path: Path) -> None:
    """Write the ``Slice`` nodes onnx2tf misreads as it reads them right (with constant bounds, in
    initializers or Constant nodes):

    - one that keeps every element (start 0, step 1, end at or past the axis) becomes ``Identity``:
      onnx2tf moves such a slice's ends into its channels-last layout wrongly. Magika's jax2tf
      graph slices a convolution's ``[1, 512, 508, 1]`` output to end 1 on its last axis, which
      onnx2tf applied to the channels (512 -> 1): every probability after it was wrong. Nothing is
      computed differently, and every reader (in an If's branches too) reads the same name;
    - one whose axes are not in ascending order gets its starts, ends, axes and steps in that
      order: onnx2tf pairs the i-th start with the i-th axis of the tensor, not with ``axes[i]``.
      Basic Pitch's tf2onnx graph slices ``[N, 172, 324, 2]`` with axes ``[0, 2, 1, 3]`` and
      starts ``[0, -309, 0, 0]``, which onnx2tf applied to the 172 frames (all kept) instead of the
      324 bins: its next Mul met 324 bins for 309, and no TFLite but the source's could be made."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # shapes unknown: every slice stays, as onnx2tf would have met it
        return
    dims = {
        v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
        for v in [*inferred.graph.value_info, *inferred.graph.input]
    }
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:  # exporters that write weights as Constant nodes write bounds so too
        if node.op_type == "Constant" and (value := next((a.t for a in node.attribute if a.name == "value"), None)):
            constants[node.output[0]] = numpy_helper.to_array(value)
    outputs = {o.name for o in model.graph.output}
    changed = False
    for node in model.graph.node:
        if node.op_type != "Slice":
            continue
        if node.output[0] not in outputs and _keeps_everything(node, dims.get(node.input[0]), constants):
            node.op_type = "Identity"
            del node.input[1:]
            changed = True
        elif (ordered := _axes_order(node, dims.get(node.input[0]), constants)) is not None:
            permutation, axes = ordered
            for position, name in enumerate(node.input[1:5], 1):  # starts, ends, axes, steps
                if name:
                    values = axes if position == 3 else constants[name].reshape(-1)[permutation]
                    node.input[position] = f"{node.output[0]}/in_axis_order_{position}"
                    model.graph.initializer.append(numpy_helper.from_array(values, node.input[position]))
            changed = True
    if changed:
        onnx.save(model, str(path))


def _axes_order(
    node: Any, shape: list[int | None] | None, constants: Mapping[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray] | None:
    """For a ``Slice`` whose constant axes are not in ascending order: the permutation that sorts
    them and the sorted axes (non-negative); None where they are in order, or not constant, or
    negative on an input of unknown rank."""
    if len(node.input) < 4 or not node.input[3] or not all(name in constants for name in node.input[1:] if name):
        return None
    axes = constants[node.input[3]].astype(np.int64).reshape(-1)
    if (axes < 0).any() and not shape:
        return None
    normalized = np.where(axes < 0, axes + len(shape or ()), axes)
    order = np.argsort(normalized, kind="stable")
    if (order == np.arange(len(order))).all():
        return None
    return order, normalized[order].astype(constants[node.input[3]].dtype)


def _keeps_everything(node: Any, shape: list[int | None] | None, constants: Mapping[str, np.ndarray]) -> bool:
    """Whether a ``Slice`` (opset 10+, its bounds constant) takes all of its input (``shape``: its
    dims, None for a dynamic one, which only an end no dim reaches takes whole; empty or None: its
    rank unknown)."""
    if not shape or len(node.input) < 3 or not all(name in constants for name in node.input[1:] if name):
        return False
    starts, ends = constants[node.input[1]], constants[node.input[2]]
    axes = constants[node.input[3]] if len(node.input) > 3 and node.input[3] else np.arange(len(starts))
    steps = constants[node.input[4]] if len(node.input) > 4 and node.input[4] else np.ones_like(starts)
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        if not -len(shape) <= axis < len(shape):
            return False
        size = shape[int(axis)]
        if step != 1 or start != 0 or end < (NO_DIM_REACHES if size is None else size):
            return False
    return True


_SCOPE_UNSAFE = re.compile(r"[^A-Za-z0-9_.\\/>-]")


def _scope_safe_node_names(path: Path) -> None:
    """onnx2tf names TensorFlow scopes after ONNX nodes, and TensorFlow refuses characters that
    some exporters use (Paddle2ONNX: ``Conv@0``): rename those nodes, keeping names unique."""
    import onnx

    model = onnx.load(str(path))
    taken = {n.name for n in model.graph.node}
    changed = False
    for i, node in enumerate(model.graph.node):
        if node.name and not _SCOPE_UNSAFE.search(node.name) and not node.name.startswith(("_", "-", "/", ">")):
            continue
        base = _SCOPE_UNSAFE.sub("_", node.name).lstrip("_-/>") or f"{node.op_type}_{i}"
        name = base if base not in taken else f"{base}_{i}"
        taken.add(name)
        node.name, changed = name, True
    if changed:
        onnx.save(model, str(path))


# onnx2tf traces fixed-size 3-channel image models on sample images it downloads unless this file is
# in the working directory; no download can happen here (and none should at export time).
ONNX2TF_TEST_IMAGES = "calibration_image_sample_data_20x128x128x3_float32.npy"


def _test_images_offline(workdir: Path) -> None:
    """Write onnx2tf's tracing images (20 x 128 x 128 x 3 in [0, 1]) as smooth gradients: they only
    drive its shape tracing, and the artifacts are validated against the package's own samples."""
    y, x = np.mgrid[0:128, 0:128].astype(np.float32) / 127.0
    frames = [
        np.stack([(x * (i + 1) / 20) % 1.0, (y * (20 - i) / 20) % 1.0, (x + y) / 2.0], axis=-1) for i in range(20)
    ]
    np.save(workdir / ONNX2TF_TEST_IMAGES, np.stack(frames).astype(np.float32))


TFLITE_INT8 = {
    "int8": "full integer, calibrated",
    "int8-selective": "full integer, calibrated, with the layers quantization hurts most in float",
    "int8-dynamic": "dynamic range: int8 weights, float activations",
}
DEBUG_ROWS = 16  # calibration rows the quantization debugger measures every layer's error on


def saved_model_to_tflite(
    saved_model: Path,
    precision: str,
    workdir: Path,
    calibration: list[dict[str, np.ndarray]] | None = None,
    names: Sequence[str] = (),
) -> tuple[Path, dict[str, str]]:
    """fp32, fp16 (weights), int8 (full integer: needs ``calibration``, one dict of one-row inputs
    per calibration row, in the model's own layout) or int8-dynamic (int8 weights, activations
    quantized on the fly); with the constants an fp16 model keeps in fp32, and why
    (``tflite_fp16.py``: it measures on ``calibration`` where given).

    Full-integer conversion runs in a process of its own: TensorFlow's calibrator runs the model in
    native code that can crash (a segfault on ddddocr's LSTM), and that must cost the int8
    artifact, not the export. ``names``: the package signature's, which the model is called by
    (``signed_tflite``)."""
    if precision == "int8":
        blob: bytes = child_process.call(
            _converted,
            saved_model.resolve(),
            precision,
            calibration,
            workdir=workdir,
            what="TensorFlow's int8 calibration",
            hint="TensorFlow's calibrator cannot run this model; its other TFLite artifacts are unaffected",
        )
    else:
        blob = _converted(saved_model, precision, calibration)
    kept: dict[str, str] = {}
    if precision == "fp16":
        fp32 = functools.partial(_converted, saved_model, "fp32", None)
        blob, kept = with_fp32_where_needed(blob, fp32, _by_input_name(blob, calibration or []))
    if precision == "int8-dynamic" and not _has_int8_tensors(blob):
        raise ExportError(
            "dynamic range quantization left every weight in float (the converter skips weights of under 1,024 values)",
            "use tflite-fp32 or tflite-fp16 on this model",
        )
    path = workdir / f"model.{precision}.tflite"
    path.write_bytes(blob)
    signed_tflite(path, path, names)
    return path, kept


def _by_input_name(blob: bytes, rows: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """``rows`` with each input under the name the interpreter gives it (``_row_key``)."""
    if not rows:
        return []
    from ai_edge_litert.interpreter import Interpreter

    details = Interpreter(model_content=blob).get_input_details()
    return [{d["name"]: row[_row_key(d["name"], row)] for d in details} for row in rows]


def _converted(saved_model: Path, precision: str, calibration: list[dict[str, np.ndarray]] | None) -> bytes:
    with quiet():
        import tensorflow as tf

        if precision == "int8":
            converter = _int8_converter(tf, saved_model, calibration or [])
        else:
            converter = tf.lite.TFLiteConverter.from_saved_model(str(saved_model))
        if precision == "fp16":
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
            converter.target_spec.supported_types = [tf.float16]
        elif precision == "int8-dynamic":
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
        try:
            blob: bytes = converter.convert()
        except Exception as exc:
            raise ExportError(f"TFLite conversion ({precision}) failed: {first_line(exc)}") from exc
    return blob


def _int8_converter(tf: Any, saved_model: Path, calibration: list[dict[str, np.ndarray]]) -> Any:
    """A converter to full-integer int8 kernels (float input and output), calibrated row by row."""
    converter = tf.lite.TFLiteConverter.from_saved_model(str(saved_model))
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: iter(calibration)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    return converter


def selective_int8(
    saved_model: Path, workdir: Path, calibration: list[dict[str, np.ndarray]], names: Sequence[str] = ()
) -> tuple[list[tuple[str, float]], list[tuple[int, Path]]]:
    """Full-integer int8 with the layers quantization hurts most left in float, for a model whose
    plain int8 is over the accuracy budget: TensorFlow's quantization debugger calibrates once,
    measures every layer's error on ``DEBUG_ROWS`` rows in units of its own int8 step (RMSE /
    scale, the ranking TensorFlow's guide to the debugger uses), and re-quantizes with the worst
    1, 2, 4, ... layers denylisted, and then half of them (beyond, little int8 is left). Returns the
    ranking (tensor, error in steps) and the candidates, fewest float layers first, for the caller
    to judge. In a child process, as the calibrator can crash (``saved_model_to_tflite``, as are
    ``names``)."""
    ranked, blobs = child_process.call(
        _selective_candidates,
        saved_model.resolve(),
        calibration,
        workdir=workdir,
        what="TensorFlow's int8 calibration",
        hint="TensorFlow's calibrator cannot run this model; its other TFLite artifacts are unaffected",
    )
    candidates = []
    for count, blob in blobs:
        path = workdir / f"model.int8-float{count}.tflite"
        path.write_bytes(blob)
        signed_tflite(path, path, names)
        candidates.append((count, path))
    return ranked, candidates


def _selective_candidates(
    saved_model: Path, calibration: list[dict[str, np.ndarray]]
) -> tuple[list[tuple[str, float]], list[tuple[int, bytes]]]:
    with quiet():
        import tensorflow as tf
        from ai_edge_litert.interpreter import Interpreter

        converter = _int8_converter(tf, saved_model, calibration)
        # the layers left in float need float kernels beside the int8 ones
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8, tf.lite.OpsSet.TFLITE_BUILTINS]
        rows = calibration[:DEBUG_ROWS]
        order: list[str] = []  # the debugger feeds inputs as a list, in the model's input order

        def debug_rows() -> Iterator[list[np.ndarray]]:
            return ([row[name] for name in order] for row in rows)

        try:
            debugger = tf.lite.experimental.QuantizationDebugger(converter=converter, debug_dataset=debug_rows)
            details = Interpreter(model_content=debugger.quant_model).get_input_details()
            order[:] = [_row_key(d["name"], rows[0]) for d in details]
            debugger.run()
            dump = io.StringIO()
            debugger.layer_statistics_dump(dump)
            dump.seek(0)
            errors = [
                (row["tensor_name"], math.sqrt(float(row["mean_squared_error"])) / float(row["scale"]))
                for row in csv.DictReader(dump)
                if float(row["scale"]) > 0
            ]
            ranked = sorted(errors, key=lambda item: -item[1])
            blobs = []
            for count in _float_counts(len(ranked)):
                denied = [name for name, _ in ranked[:count]]
                debugger.options = tf.lite.experimental.QuantizationDebugOptions(denylisted_nodes=denied)
                blobs.append((count, debugger.get_nondebug_quantized_model()))
        except Exception as exc:
            raise ExportError(f"TFLite int8 with layers in float could not be made: {first_line(exc)}") from exc
    return ranked, blobs


def _float_counts(layers: int) -> list[int]:
    """1, 2, 4, ... and then half the layers (at least half stay int8): 63 layers give 1 to 16, 31."""
    half = layers // 2
    counts = [2**i for i in range(half.bit_length()) if 2**i < half]
    return [*counts, half] if half else []


def _row_key(detail_name: str, row: dict[str, np.ndarray]) -> str:
    """The data's input for an interpreter input (``serving_default_x:0`` is ``x``)."""
    name = detail_name.removeprefix("serving_default_").rsplit(":", 1)[0]
    if name in row:
        return name
    if len(row) == 1:
        return next(iter(row))
    raise ExportError(f"the TFLite model's input '{detail_name}' matches none of the data's: {', '.join(row)}")


def _has_int8_tensors(blob: bytes) -> bool:
    """Whether a converted model holds any int8 tensor (an "int8" artifact must)."""
    from ai_edge_litert.interpreter import Interpreter

    return any(t["dtype"] == np.int8 for t in Interpreter(model_content=blob).get_tensor_details())


def converted_name(name: str) -> str:
    """What onnx2tf names an ONNX input or output in the SavedModel it writes: a ':' (tf2onnx's
    ``image:0``) becomes '__'."""
    return name.replace(":", "__")


def signed_tflite(source: Path, out: Path, names: Sequence[str]) -> bool:
    """Write ``source`` to ``out`` callable by the package signature's ``names`` (its inputs, then
    its outputs, in the order of the graph it was converted from), and whether it needed a
    SignatureDef of its own. The runtime and the mobile wrappers call a model through its SignatureDef: one is added
    over the subgraph's own inputs and outputs (by their tensor names, which the package signature
    then uses) where the model has none, as MediaPipe's models ship; and names with a ':' that
    onnx2tf wrote as '__' (tf2onnx's ``image:0``) get theirs back. Operators and weights stay as
    they are."""
    with quiet():  # importing TensorFlow logs to fd 2
        from tensorflow.lite.python import schema_py_generated as schema
        from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model(str(source))
    added = not model.signatureDefs
    if added:
        graph = model.subgraphs[0]

        def mapped(index: int) -> Any:
            tensor = schema.TensorMapT()
            tensor.name, tensor.tensorIndex = graph.tensors[index].name, index
            return tensor

        signature = schema.SignatureDefT()
        signature.signatureKey, signature.subgraphIndex = "serving_default", 0
        signature.inputs = [mapped(int(i)) for i in graph.inputs]
        signature.outputs = [mapped(int(i)) for i in graph.outputs]
        model.signatureDefs = [signature]
    written = {converted_name(name): name for name in names if converted_name(name) != name}
    signed = model.signatureDefs[0]
    outputs = list(names)[len(signed.inputs) :]
    if [text(entry.name) for entry in signed.outputs] == [f"output_{i}" for i in range(len(outputs))]:
        # TensorFlow's converter names onnx2tf's outputs by position, which is the ONNX graph's order
        written.update({f"output_{i}": name for i, name in enumerate(outputs)})
    renamed = False
    for entry in (*signed.inputs, *signed.outputs):
        name = text(entry.name)
        if name in written:
            entry.name, renamed = written[name], True
    if added or renamed:
        flatbuffer_utils.write_model(model, str(out))
    elif source != out:
        shutil.copyfile(source, out)
    return added


def fixed_signature(
    signature: Signature, sample: Mapping[str, np.ndarray], batch_too: bool = False
) -> Signature | None:
    """The signature pinned at one reference sample's sizes (batch 1), when the model has dynamic
    dims other than the batch (or ``batch_too``, any dynamic dim); mobile models run at one input size."""
    from unideploy.samples import dynamic_dims

    if not dynamic_dims(signature) and not (batch_too and signature.has_dynamic_inputs):
        return None

    def at_one_row(spec: TensorSpec) -> tuple[int, ...]:
        """The sample's sizes with one row on the input's batch axis (axis 1 of recurrent state)."""
        shape, axis = list(sample[spec.name].shape), signature.batch_axes[spec.name]
        if axis is not None and shape:
            shape[axis] = 1
        return tuple(shape)

    inputs = tuple(TensorSpec(t.name, t.dtype, at_one_row(t), t.layout) for t in signature.inputs)
    return Signature(inputs, signature.outputs)


def tflite_signature(path: Path, source: Signature) -> Signature | None:
    """The artifact's own signature when its layout differs from the source's, else None: inputs
    onnx2tf moved to channels-last, and outputs it left there (4-D feature maps, heatmaps), which
    the tflite runtime moves back."""
    from ai_edge_litert.interpreter import Interpreter

    from unideploy.runtimes.tflite_runtime import signature_names

    interpreter = Interpreter(model_path=str(path))
    runner = interpreter.get_signature_runner()
    shapes = {name: tuple(int(d) for d in info["shape_signature"]) for name, info in runner.get_input_details().items()}
    inputs, changed = [], False
    for spec in source.inputs:
        dims = shapes.get(spec.name)
        fixed = tuple(-1 if isinstance(d, str) else d for d in spec.shape)
        if dims is None or dims == fixed or len(fixed) < 3:
            inputs.append(spec)
        elif dims == channels_last(fixed):
            inputs.append(TensorSpec(spec.name, spec.dtype, channels_last(spec.shape), CHANNELS_LAST))
            changed = True
        else:
            raise ExportError(
                f"the TFLite model takes '{spec.name}' as {list(dims)}, which is neither the source "
                f"shape {list(fixed)} nor its channels-last form"
            )
    _, names = signature_names(interpreter, source, path.name)
    produced = {
        names[k]: tuple(int(d) for d in info["shape_signature"]) for k, info in runner.get_output_details().items()
    }
    outputs = []
    for spec in source.outputs:
        dims, declared = produced.get(spec.name), tuple(-1 if isinstance(d, str) else d for d in spec.shape)
        if (
            dims is not None
            and len(declared) >= 3
            and not _fits(dims, declared)
            and _fits(dims, channels_last(declared))
        ):
            outputs.append(TensorSpec(spec.name, spec.dtype, channels_last(spec.shape), CHANNELS_LAST))
            changed = True
        else:
            outputs.append(spec)
    return Signature(tuple(inputs), tuple(outputs)) if changed else None


def _fits(shape: tuple[int, ...], declared: tuple[int, ...]) -> bool:
    """Whether two shapes agree where both are known (-1: dynamic)."""
    return len(shape) == len(declared) and all(a == b or -1 in (a, b) for a, b in zip(shape, declared))
