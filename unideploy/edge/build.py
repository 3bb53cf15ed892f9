"""``--target edge``: add ORT-mobile and TFLite artifacts to a package, validated, atomically.

- ORT format (``.ort``, Runtime optimization style, portable to ARM) with its
  ``required_operators.config`` for a reduced-size ONNX Runtime build, from the ONNX artifact.
- TFLite fp32, fp16 and (with calibration data) int8: from the SavedModel itself for TensorFlow
  sources, through onnx2tf for every other source (``edge/tflite.py``).
- MindIR sources keep their native artifact, which MindSpore Lite runs on edge devices.

A model TFLite cannot take (an operator onnx2tf or the TFLite converter refuses) still gets its
other artifacts; the manifest's ``omitted`` list says why it has no TFLite artifact, and the CLI
prints it.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from unideploy.edge.tflite import (
    TFLITE_INT8,
    converted_name,
    fixed_signature,
    moved_axes,
    onnx_to_saved_model,
    saved_model_to_tflite,
    selective_int8,
    signed_tflite,
    tflite_signature,
)
from unideploy.errors import (
    AccuracyBudgetError,
    ExportError,
    InputError,
    MissingDependencyError,
    RuntimeFailure,
    UnideployError,
    ValidationError,
    first_line,
)
from unideploy.exporters.tflite_state import unrolled
from unideploy.guard.accuracy import describe
from unideploy.guard.data import Dataset, carrying_state, load_dataset, split, validation_rows
from unideploy.guard.guard import Guard, reference_rows, settings_of
from unideploy.guard.search import search_record, trial
from unideploy.onnx.dequantize import float_onnx, rounds_activations
from unideploy.onnx.files import copy_model
from unideploy.onnx.interface import output_names
from unideploy.package import Artifact, Package, PlannedArtifact
from unideploy.package.files import scratch_dir
from unideploy.package.manifest import AccuracyRecord, OmittedRecord, Precision, SearchTrial
from unideploy.package.writer import AddedArtifact, extend_package
from unideploy.runtimes import RUNTIMES, Runtime
from unideploy.runtimes.selection import cpu_reference
from unideploy.samples import batch_size_of, take_rows, widest
from unideploy.signature import CHANNELS_LAST, Signature, to_channels_last
from unideploy.validation import (
    DEFAULT_ATOL,
    DEFAULT_RTOL,
    fitted,
    measured_tolerance_record,
    require_passed,
    validate,
    validate_like,
)

Progress = Callable[[str], None]
# Sources whose models take channels-last inputs: their ONNX keeps that layout, and so does onnx2tf
CHANNELS_LAST_FRAMEWORKS = ("tflite", "tensorflow", "keras")


def _to_ort(onnx_path: Path, workdir: Path) -> tuple[Path, Path]:
    source = workdir / "ort-src"
    source.mkdir()
    copy_model(onnx_path, source / "model.onnx")
    out = workdir / "ort"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "onnxruntime.tools.convert_onnx_models_to_ort",
            str(source),
            "--output_dir",
            str(out),
            "--optimization_style",
            "Runtime",
        ],
        capture_output=True,
        text=True,
    )
    models = list(out.glob("*.ort")) if out.exists() else []
    configs = list(out.glob("*.config")) if out.exists() else []
    if result.returncode != 0 or len(models) != 1 or len(configs) != 1:
        raise ExportError(f"conversion to ORT format failed: {first_line(Exception(result.stderr or result.stdout))}")
    return models[0], configs[0]


def _calibration_set(data: Dataset, package: Package, base: Artifact | None) -> Dataset:
    """The half of the user's data that calibrates (``split``: the guard judges on the other); a
    streaming model's stream with the state the fp32 model carries to each row."""
    if data.stream_starts is None:
        return data
    with _fp32(package, base) as fp32:
        return carrying_state(data, fp32.run, package.manifest.signature)


def _calibration_rows(data: Dataset, source: Signature, model: Signature) -> list[dict[str, np.ndarray]]:
    """The calibration rows one at a time as TensorFlow's calibrator takes them (by the SavedModel's
    names), cut along each input's batch axis (axis 1 of recurrent state: cut along axis 0, its
    layers were resized and the conversion failed), in the TFLite model's own layout."""
    layouts = {t.name: t.layout for t in model.inputs}
    axes = source.batch_axes
    return [
        {converted_name(k): to_channels_last(v) if layouts.get(k) == CHANNELS_LAST else v for k, v in row.items()}
        for batch in data.batches()
        for row in (take_rows(batch, i, i + 1, axes) for i in range(batch_size_of(batch, axes)))
    ]


def _fp32(package: Package, base: Artifact | None) -> Runtime:
    """The package's fp32 ONNX artifact on ONNX Runtime's CPU provider: what edge artifacts are
    judged against, and what carries a stream's state to its calibration rows."""
    if base is None:
        raise InputError(
            "the package has no ONNX artifact to run the calibration data on",
            "export the model with its ONNX artifact (the edge target converts from it)",
        )
    return cpu_reference(package.path_of(base), package.manifest.signature)


def _guard(
    package: Package,
    base: Artifact | None,
    validation: Dataset | None,
    references: list,
    accuracy: Mapping[str, Any] | None,
) -> Guard:
    """What the accuracy guard judges edge artifacts on: the half of the user's data that int8 was not
    calibrated on (with its labels) against the fp32 ONNX artifact's outputs (a streaming model's
    streams each model runs with its own state), or else the package's reference samples against the
    source's; with the budget and metric the user asked for."""
    manifest = package.manifest
    settings = {**settings_of(accuracy), "output_axes": manifest.signature.output_batch_axes}
    if validation is None or base is None:
        return Guard(
            [inputs for inputs, _ in references],
            [dict(outputs) for _, outputs in references],
            rows_are=reference_rows(manifest.samples_origin()),
            **settings,
        )
    with _fp32(package, base) as fp32:
        return Guard.of(fp32.run, **validation_rows(validation, manifest.fixed_batch, manifest.signature), **settings)


def _fewest_float_layers(
    saved_model: Path,
    work: Path,
    data: list[dict[str, np.ndarray]],
    judge: Callable[[Path], AccuracyRecord],
    say: Progress,
    names: Sequence[str],
) -> tuple[Path, dict[str, Any]]:
    """Full-integer int8 with the fewest of its most error-prone layers in float that holds the
    budget (``tflite.selective_int8`` makes the candidates, in the order to try them), and the record
    of the search."""
    say("full-integer int8 is over the accuracy budget: ranking its layers by quantization error")
    ranked, candidates = selective_int8(saved_model, work, data, names)
    if not candidates:
        raise AccuracyBudgetError(f"{len(ranked)} quantized layer(s): too few to keep some in float")
    trials: list[SearchTrial] = []
    closest: tuple[int, AccuracyRecord] | None = None  # the candidate with the smallest drop
    for count, path in candidates:
        say(f"TFLite int8 with the {count} most error-prone layer(s) in float")
        accuracy = judge(path)
        trials.append(trial(count, accuracy))
        if accuracy["within_budget"]:
            return path, {
                "float_layers": [{"tensor": name, "error_steps": round(steps, 3)} for name, steps in ranked[:count]],
                "search": search_record(len(ranked), "in float", trials, within_budget=True),
            }
        if closest is None or accuracy["drop_points"] < closest[1]["drop_points"]:
            closest = (count, accuracy)
    assert closest is not None  # candidates is not empty
    raise AccuracyBudgetError(
        f"over the accuracy budget with 1 to {len(ranked) // 2} of {len(ranked)} layers in float (the most "
        f"error-prone first; more would leave little int8); closest, {closest[0]} in float: {describe(closest[1])}",
        "give more representative --calibration data",
    )


def _keras_saved_model(source: Path, work: Path, say: Progress) -> Path | None:
    """The serving SavedModel of the package's Keras source, which TensorFlow's converter takes in
    the model's own channels-last layout (onnx2tf would read the ONNX graph's NHWC input as NCHW and
    move what it takes for channels last); None where Keras' safe mode cannot load it (Lambda
    layers), and onnx2tf converts the ONNX model instead."""
    from unideploy.exporters.keras import serving_saved_model

    try:
        return serving_saved_model(source, work / "keras")[1]
    except InputError as exc:
        say(f"converting from ONNX instead: {exc.message}")
        return None


def _shapes(signature: Signature) -> str:
    return ", ".join(f"{t.name} {t.shape_text()}" for t in signature.inputs)


def _onnx2tf(
    onnx_path: Path,
    work: Path,
    signature: Signature,
    sample: Mapping[str, np.ndarray],
    say: Progress,
    folded_only: bool = False,
    channels_last: bool = False,
    one_row: bool = False,
    moved_back: Mapping[str, list[int]] | None = None,
) -> tuple[Path, Signature | None, bool]:
    """A SavedModel from onnx2tf, the input sizes it was made at (None: the package's), and
    whether constants were folded first.

    Shape arithmetic onnx2tf cannot trace gets two more tries: at batch 1, where its simplifier
    folds what depends on the batch (torch.export's ``as_strided`` becomes a Range over it), then
    with ONNX Runtime's constant folding first (MiniLM's attention mask and scale), then folded and
    with onnx2tf's simplifier off (it drops the all-zero initial states of ddddocr's LSTM).
    ``folded_only``: the folded tries alone, for a model whose unfolded conversion ran wrong.
    ``one_row``: the batch pinned at 1 from the first try, for a model whose SavedModel at a dynamic
    batch TensorFlow's converter could not lower.
    ``channels_last``: the ONNX came from a channels-last framework (TFLite, TensorFlow), whose
    inputs are in the layout TFLite takes already. ``moved_back``: outputs an earlier conversion
    gave with their axes moved, and the permutation that puts each back."""
    fixed = fixed_signature(signature, sample)  # dynamic non-batch dims: converted at the sample's sizes
    pinned = fixed_signature(signature, sample, batch_too=True)
    # onnx2tf moves the channels of 3-D to 5-D inputs last, reading axis 1 as channels: not where
    # the rows lie on another axis (recurrent state [layers, batch, hidden]), which then ran wrong
    kept = [
        t.name for t in signature.inputs if len(t.shape) >= 3 and (channels_last or signature.batch_axes[t.name] != 0)
    ]
    first = pinned if one_row and pinned is not None else fixed
    attempts = (
        []
        if folded_only
        else [(first, False, True)] + ([(pinned, False, True)] if first is None and pinned is not None else [])
    )
    attempts += [(pinned or fixed, True, True), (pinned or fixed, True, False)]
    failures: list[ExportError] = []
    for shapes, folded, simplified in attempts:
        how = (
            (" with constants folded" if folded else "")
            + ("" if simplified else " and no onnxsim")
            + (f" at {_shapes(shapes)}" if shapes else "")
        )
        say(
            f"onnx2tf failed ({failures[-1].message}): converting again{how}"
            if failures
            else f"converting ONNX to TensorFlow with onnx2tf{how}"
        )
        try:
            return onnx_to_saved_model(onnx_path, work, shapes, folded, simplified, kept, moved_back), shapes, folded
        except ExportError as failed:
            failures.append(failed)
    raise failures[0]  # what onnx2tf found in the model as it is


def _moved(runtime: Any, fitting: list, rows_on: tuple[Mapping, Mapping]) -> dict[str, list[int]]:
    """The outputs the artifact gives with the source's sizes in another order, read on one row
    (rows joined along the source's batch axis would no longer be a permutation of its shape); none
    where the artifact takes no single row (a batch fixed above one: validation judges it whole)."""
    if not fitting:
        return {}
    inputs, outputs = fitting[0]
    try:
        produced = runtime.run(take_rows(inputs, 0, 1, rows_on[0]))
    except UnideployError:
        return {}
    return moved_axes(produced, take_rows(outputs, 0, 1, rows_on[1]))


def _source_tflite(
    source: Path, base: Artifact | None, signature: Signature, work: Path, references: list, say: Progress
) -> AddedArtifact:
    """A ``.tflite`` source as its own TFLite artifact, at the precision it computes in (a quantized
    model is int8, and could not be converted again from its int8 ONNX): the same operators and
    weights, with a SignatureDef where it has none (``tflite.signed_tflite``), held to the default
    tolerance against the outputs LiteRT gave for the source at export."""
    precision: Precision = base.precision if base is not None else "fp32"
    say(f"keeping the source model as the TFLite {precision} artifact")
    path = work / f"model.{precision}.tflite"
    stateful = bool(unrolled(source, work / "stateless.tflite"))
    if stateful:  # its state as the inputs and outputs the package signature lists, as at export
        source = work / "stateless.tflite"
    added = signed_tflite(source, path, [])
    with RUNTIMES.get("tflite")(path, signature) as runtime:
        record = validate(runtime.run, references, DEFAULT_ATOL, DEFAULT_RTOL, reference="tflite")
    require_passed(record, f"the source model as the TFLite {precision} artifact")
    record["source_model"] = (
        "the source .tflite"
        + ("; its resource variables read from inputs and written to outputs" if stateful else "")
        + ("; a 'serving_default' SignatureDef added over its tensors" if added else "")
    )
    return (
        PlannedArtifact(
            f"tflite-{precision}", f"artifacts/{path.name}", "tflite", precision, ["tflite"], targets=["edge"]
        ),
        path,
        {},
        record,
    )


def _tflite_artifacts(
    package: Package,
    base: Artifact | None,
    work: Path,
    calibration: str | Path | None,
    references: list,
    say: Progress,
    accuracy: Mapping[str, Any] | None = None,
) -> tuple[list[AddedArtifact], list[OmittedRecord]]:
    """TFLite fp32 (held to the tolerance the ONNX artifact was: the default, or wider for an output
    the source's own engines disagree on), fp16 and int8 (each through the accuracy guard,
    with the budget and metric in ``accuracy``, left out with its numbers when over budget)."""
    manifest = package.manifest
    framework = manifest.source["framework"]
    tflite = RUNTIMES.get("tflite")
    found = tflite.availability()
    if not found.ok:
        raise MissingDependencyError(f"the edge target needs LiteRT: {found.detail}", found.fix)
    kept = manifest.source.get("path")
    source_dir = package.root / kept if kept else None
    undone: list[str] = []  # INT8 operators made float for onnx2tf (onnx/dequantize.py)
    fixed = None  # the input sizes onnx2tf converts at, where the model has dynamic non-batch dims
    refold: Callable[[], tuple[Path, Signature | None, bool]] | None = None  # onnx2tf again, constants folded
    put_back: Callable[[], tuple[Path, Signature | None, bool]] | None = None  # onnx2tf again, outputs' axes back
    repin: Callable[[], tuple[Path, Signature | None, bool]] | None = None  # onnx2tf again, at one row
    moved: dict[str, list[int]] = {}  # outputs onnx2tf gave with their axes moved, and how to put them back
    # onnx2tf's outputs in the ONNX graph's order, which TensorFlow's converter numbers them by and a
    # .tflite source's signature need not share (Basic Pitch's: contour, note, onset; its graph: onset,
    # note, contour): they were called by each other's names
    graph_outputs: list[str] = []
    added: list[AddedArtifact] = []
    made: set[str] = set()  # precisions added: the dynamic-range int8 runs only where full integer did not
    if framework == "tflite" and source_dir and source_dir.is_file():
        # the source is a TFLite model already: its artifact of its own precision is the model itself
        added.append(_source_tflite(source_dir, base, manifest.signature, work, references, say))
        made.add(added[0][0].precision)
        if "fp32" not in made:  # a quantized model: nothing to convert from, and the package says so
            precision = added[0][0].precision
            return added, [
                {
                    "artifact": f"tflite-{p}",
                    "stage": "edge",
                    "reason": f"the source .tflite computes in {precision}: there is no {p} model to convert from",
                    "fix": "export the fp32 model it was made from"
                    + ("" if p == "fp32" else ", whose tflite-fp16 the edge target makes"),
                }
                for p in ("fp32", "fp16")
            ]
    if framework == "tensorflow" and source_dir and source_dir.is_dir():
        saved_model, route = source_dir, "TensorFlow's converter"
    elif (
        framework == "keras"
        and source_dir
        and source_dir.is_file()
        and (kept_keras := _keras_saved_model(source_dir, work, say))
    ):
        saved_model, route = kept_keras, "Keras' SavedModel + TensorFlow's converter"
    elif base is not None:
        onnx_path, undone = float_onnx(package.path_of(base), work, say)
        graph_outputs = output_names(onnx_path)
        if base.precision != "fp32" and not undone:
            # only dynamic INT8 and int8 weights alone are made float (and then judged by the guard):
            # int8 activations (QDQ, QLinear) are not, and onnx2tf's TFLite of it ran far from it (0.59 off a small CNN)
            raise ExportError(
                f"TFLite artifacts are converted from an fp32 model, and the package's ONNX artifact '{base.id}' "
                f"computes in {base.precision}, as its source model does",
                "export the fp32 model it was made from"
                + (f" (the package keeps the source model, {kept})" if kept else ""),
            )

        def convert(folded_only: bool = False, one_row: bool = False) -> tuple[Path, Signature | None, bool]:
            return _onnx2tf(
                onnx_path,
                work,
                manifest.signature,
                widest([inputs for inputs, _ in references], manifest.signature),  # the user's sizes
                say,
                folded_only,
                channels_last=framework in CHANNELS_LAST_FRAMEWORKS,
                one_row=one_row,
                moved_back=moved,
            )

        try:
            saved_model, fixed, folded = convert()
        except ExportError as exc:
            if not added:
                raise
            say(f"no other TFLite precision: {exc.message}")  # the source's own artifact stands
            fix = exc.hint or "the source model runs as tflite-fp32"
            return added, [
                {"artifact": f"tflite-{p}", "stage": "edge", "reason": exc.message, "fix": fix}
                for p in ("fp16", "int8")[: 2 if calibration else 1]
            ]
        refold = None if folded else lambda: convert(folded_only=True)
        if fixed is None:  # at a dynamic batch, TensorFlow's converter cannot lower an LSTM's TensorList
            # ops (Silero VAD with its samples fixed); at one row it unrolls them
            repin = functools.partial(convert, folded_only=folded, one_row=True)
        put_back = functools.partial(convert, folded_only=folded)  # the way the first conversion went
        route = "onnx2tf + TensorFlow's converter"
    else:
        raise ExportError("the package has no ONNX artifact to convert from")
    omitted: list[OmittedRecord] = []
    guard: Guard | None = None  # loaded when the first non-exact artifact needs it
    signature = None  # the model's own signature (layout), known once fp32 is converted
    # int8: full integer from the calibration data; where that does not convert, run (LiteRT's
    # integer Div refuses a divisor quantized to zero, as in attention's LayerNorm and pooling) or
    # hold the budget, dynamic range (int8 weights, float activations), as ONNX Runtime's INT8 does
    variants: list[tuple[Precision, str]] = [("fp32", "fp32"), ("fp16", "fp16")]
    if calibration:
        variants += [("int8", "int8"), ("int8", "int8-dynamic")]
    failed: dict[Precision, list[tuple[str, UnideployError]]] = {}
    names = manifest.signature.input_names + (
        graph_outputs or manifest.signature.output_names
    )  # what they're called by
    rows_on = (manifest.signature.batch_axes, manifest.signature.output_batch_axes)  # a fixed size cannot say

    @functools.cache
    def halves() -> tuple[Dataset, Dataset]:  # the user's data, loaded and split once for every stage
        assert calibration is not None  # asked for only where there is calibration data
        return split(load_dataset(calibration, manifest.signature))

    @functools.cache
    def calibration_set() -> Dataset:  # for every precision that calibrates
        return _calibration_set(halves()[0], package, base)

    def accuracy_of(path: Path, run: Callable, fitting: list) -> tuple[Guard, AccuracyRecord]:
        nonlocal guard
        guard = guard or _guard(package, base, halves()[1] if calibration else None, fitting, accuracy)
        return guard, guard.judge(path, lambda: run)

    def judge(path: Path) -> AccuracyRecord:
        spec = tflite_signature(path, fixed or manifest.signature) or fixed or manifest.signature
        with tflite(path, spec) as runtime:
            return accuracy_of(path, *fitted(runtime.run, spec, references, rows_on))[1]

    while variants:
        precision, mode = variants.pop(0)
        if precision in made:
            continue
        say(f"converting to TFLite ({mode}, {route})")
        try:
            data = None
            searched: dict[str, Any] = {}  # int8-selective: the layers left in float, and the search
            in_fp32: dict[str, str] = {}  # fp16: constants it keeps in fp32, and why
            if mode in ("int8", "int8-selective", "fp16") and calibration is not None:
                # int8 is planned only with calibration; fp16 measures where fp16 weights would not do
                data = _calibration_rows(calibration_set(), manifest.signature, signature or manifest.signature)
            if mode == "int8-selective":  # planned only after full integer, calibrated, was over budget
                path, searched = _fewest_float_layers(saved_model, work, data or [], judge, say, names)
            else:
                try:
                    path, in_fp32 = saved_model_to_tflite(saved_model, mode, work, data, names)
                except ExportError as unconverted:
                    if precision != "fp32" or repin is None:
                        raise
                    say(f"{unconverted.message}: converting again at one row")
                    put_back = repin if put_back is not None else None  # and again at one row, if axes moved
                    (saved_model, fixed, _), repin = repin(), None
                    variants.insert(0, (precision, mode))
                    continue
            signature = tflite_signature(path, fixed or manifest.signature) or fixed
            with tflite(path, signature or manifest.signature) as runtime:
                # an artifact made at one input size is proven on the samples of that size
                run, fitting = fitted(runtime.run, signature or manifest.signature, references, rows_on)
                if precision == "fp32" and put_back is not None and (axes_moved := _moved(runtime, fitting, rows_on)):
                    say(f"onnx2tf moved the axes of {', '.join(axes_moved)}: converting again with them put back")
                    moved.update(axes_moved)
                    (saved_model, fixed, _), put_back = put_back(), None
                    variants.insert(0, (precision, mode))
                    continue
                if precision == "fp32" and not rounds_activations(undone):  # should be exact: as the ONNX is
                    record = validate_like(manifest, base.id if base else None, run, fitting, framework)
                    if not record["passed"] and refold is not None:
                        # TFLite's converter can mis-compile what onnx2tf left as shape arithmetic
                        # (YOLOv8's anchors from Shape ops: every box wrong, the SavedModel right)
                        say("TFLite fp32 differs from ONNX: converting again with constants folded")
                        (saved_model, fixed, _), refold = refold(), None
                        variants.insert(0, (precision, mode))
                        continue
                    require_passed(record, "the TFLite fp32 artifact")
                    if undone:  # int8 weights alone, folded: exact
                        record["dequantized"] = undone
                else:
                    say(f"judging TFLite {mode} against the ONNX model")
                    judged, accuracy = accuracy_of(path, run, fitting)
                    dequantized = (  # fp32 is judged only where the graph was dequantized
                        f"TFLite fp32 of the graph with its INT8 made float ({', '.join(undone)}): "
                        if precision == "fp32"
                        else ""
                    )
                    if not accuracy["within_budget"]:
                        raise AccuracyBudgetError(
                            f"{dequantized}over the accuracy budget {judged.numbers(accuracy)}",
                            {
                                "int8": "give more representative --calibration data",
                                "fp16": "use tflite-fp32 on this model",
                                "fp32": "its activations need their INT8 rounding: convert the float model",
                            }[precision],
                        )
                    record = measured_tolerance_record(run, fitting, framework)
                    if undone:
                        record["dequantized"] = undone
                    record["accuracy"] = accuracy
                    if in_fp32:  # named where the artifact is shown (cli/render.py)
                        record["fp32_constants"] = in_fp32
                    if precision == "int8":
                        record["quantization"] = TFLITE_INT8[mode]
                        if searched:
                            record["float_layers"], record["search"] = searched["float_layers"], searched["search"]
        except (AccuracyBudgetError, ExportError, RuntimeFailure) as exc:
            if precision == "fp32":
                raise
            # a reduced-precision variant that does not convert, run or hold the budget is left out
            failed.setdefault(precision, []).append((mode, exc))
            if mode == "int8" and isinstance(exc, AccuracyBudgetError):  # before dynamic range: still int8 kernels
                variants.insert(0, ("int8", "int8-selective"))
            say(f"TFLite {mode} left out: {exc.message}")
            continue
        added.append(
            (
                PlannedArtifact(
                    f"tflite-{precision}",
                    f"artifacts/model.{precision}.tflite",
                    "tflite",
                    precision,
                    ["tflite"],
                    derived_from=base.id if base else None,
                    signature=signature,
                    targets=["edge"],
                ),
                path,
                {},
                record,
            )
        )
        made.add(precision)
    for precision, errors in failed.items():
        if precision not in made:
            reasons = [f"{TFLITE_INT8[mode]}: {e.message}" if len(errors) > 1 else e.message for mode, e in errors]
            omitted.append(
                {
                    "artifact": f"tflite-{precision}",
                    "stage": "edge",
                    "reason": "; ".join(reasons),
                    "fix": errors[0][1].hint or "use tflite-fp32 on this model",
                }
            )
    return added, omitted


def build_edge(
    package_path: str | Path,
    output: str | Path,
    overwrite: bool = False,
    progress: Progress | None = None,
    calibration: str | Path | None = None,
    accuracy: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``output``: the package plus its edge artifacts (int8 TFLite when ``calibration`` is given)."""
    say = progress or (lambda _msg: None)
    with Package.open(package_path) as package, scratch_dir("unideploy-edge-") as tmp:
        work = Path(tmp)
        manifest = package.manifest
        base = manifest.base_onnx()
        references = package.reference_pairs()
        framework = manifest.source["framework"]
        added: list[AddedArtifact] = []
        omitted: list[OmittedRecord] = []

        if base is not None:
            say("converting to ONNX Runtime's mobile format (.ort)")
            ort_model, ort_config = _to_ort(package.path_of(base), work)
            with cpu_reference(ort_model, manifest.signature) as runtime:
                record = validate_like(manifest, base.id, runtime.run, references, framework)
            require_passed(record, "the ORT-format artifact")
            added.append(
                (
                    PlannedArtifact(
                        f"ort-{base.precision}",
                        "artifacts/model.ort",
                        "ort",
                        base.precision,
                        ["onnxruntime"],
                        derived_from=base.id,
                        targets=["edge"],
                    ),
                    ort_model,
                    {"artifacts/required_operators.config": ort_config},
                    record,
                )
            )
        try:
            tflite_added, tflite_omitted = _tflite_artifacts(
                package, base, work, calibration, references, say, accuracy
            )
            added += tflite_added
            omitted += tflite_omitted
        except (ExportError, ValidationError, AccuracyBudgetError) as exc:  # usable without TFLite; it says why
            omitted.append(
                {
                    "artifact": "tflite-*",
                    "stage": "edge",
                    "reason": exc.message,
                    "fix": exc.hint or "the .ort artifact runs on ONNX Runtime Mobile meanwhile",
                }
            )
            say(f"no TFLite artifact: {exc.message}")

        say("writing the package")
        return extend_package(package, package_path, output, added, overwrite, omitted=omitted)


def target_stage(
    package: Path,
    output: Path,
    options: Mapping[str, Any],
    *,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> Path:
    """``--target edge`` (targets.py): the edge artifacts; int8 TFLite with ``options["calibration"]``."""
    return build_edge(
        package,
        output,
        overwrite=overwrite,
        progress=progress,
        calibration=options.get("calibration"),
        accuracy=options.get("accuracy"),
    )
