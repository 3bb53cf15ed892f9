"""Comparing an artifact's outputs with the reference outputs of the source framework.

One routine serves export (proof at conversion time), ``deploy verify`` (proof later, on this
machine) and the optimizers (accuracy budgets), so every number in a manifest means the same.
A value passes when ``|actual - expected| <= atol + rtol * |expected|`` (numpy's allclose);
non-float outputs must match exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from unideploy.errors import ValidationError
from unideploy.package.manifest import Manifest, OutputErrors, Tolerance, ValidationRecord
from unideploy.samples import Axes, batch_size_of, join_rows, row_axis, take_rows
from unideploy.signature import CHANNELS_LAST, Signature

DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-3
# fp16 and TF32 keep 10 mantissa bits: such results are held to 1% of each output's largest
# reference value, and rtol 1%
TEN_BIT_RELATIVE = 1e-2

Record = ValidationRecord


def compare_output(name: str, expected: np.ndarray, actual: np.ndarray, atol: float, rtol: float) -> dict[str, Any]:
    expected, actual = np.asarray(expected), np.asarray(actual)
    if expected.shape != actual.shape:
        raise ValidationError(
            f"output '{name}' has shape {list(actual.shape)}, the reference {list(expected.shape)}"
            + (
                " (the same sizes in another order: its axes were moved)"
                if sorted(expected.shape) == sorted(actual.shape)
                else ""
            )
        )
    if not np.issubdtype(expected.dtype, np.floating) and not (np.issubdtype(expected.dtype, np.integer) and atol >= 1):
        # labels, token ids, text: equal or not. A tolerance of a whole unit or more on integers is one
        # an artifact was measured to need (a quantized model's uint8 scores) or a user asked for: numbers
        mismatched = int(np.count_nonzero(expected != actual))
        return {
            "max_abs_error": float(mismatched > 0),
            "max_rel_error": float(mismatched > 0),
            "mismatched": mismatched,
        }
    e, a = expected.astype(np.float64), actual.astype(np.float64)
    diff = np.abs(a - e)
    nan_mismatch = np.isnan(e) != np.isnan(a)
    finite = ~(np.isnan(e) | np.isnan(a))
    abs_err = float(diff[finite].max()) if finite.any() else 0.0
    significant = finite & (np.abs(e) > atol)
    rel_err = float((diff[significant] / np.abs(e[significant])).max()) if significant.any() else 0.0
    mismatched = int(np.count_nonzero((diff > atol + rtol * np.abs(e)) & finite) + np.count_nonzero(nan_mismatch))
    return {"max_abs_error": abs_err, "max_rel_error": rel_err, "mismatched": mismatched}


def validate(
    run: Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]],
    samples: Sequence[tuple[dict[str, np.ndarray], Mapping[str, np.ndarray]]],
    atol: float,
    rtol: float,
    reference: str,
    output_atol: Mapping[str, float] | None = None,
) -> Record:
    """Run every (inputs, expected outputs) pair and merge the worst errors per output.
    ``output_atol``: an output's own absolute tolerance, where it is not ``atol`` (one whose values
    the source's own engines already disagree on by more)."""
    per_output = dict(output_atol or {})
    outputs: dict[str, OutputErrors] = {}
    batch_sizes = []
    for inputs, expected in samples:
        actual = run(inputs)
        batch_sizes.append(batch_size_of(inputs))
        for name, ref in expected.items():
            if name not in actual:
                raise ValidationError(f"the artifact produced no output '{name}'", f"it produced: {', '.join(actual)}")
            result = compare_output(name, ref, actual[name], per_output.get(name, atol), rtol)
            merged = outputs.setdefault(name, {"max_abs_error": 0.0, "max_rel_error": 0.0, "mismatched": 0})
            merged["max_abs_error"] = max(merged["max_abs_error"], result["max_abs_error"])
            merged["max_rel_error"] = max(merged["max_rel_error"], result["max_rel_error"])
            merged["mismatched"] += result["mismatched"]
    passed = all(o["mismatched"] == 0 for o in outputs.values())
    record: Record = {
        "passed": passed,
        "reference": reference,
        "atol": atol,
        "rtol": rtol,
        "batch_sizes": batch_sizes,
        "outputs": outputs,
    }
    if per_output:
        record["output_atol"] = per_output
    return record


def recorded_tolerance(manifest: Manifest, artifact_id: str) -> tuple[float, float, dict[str, float]]:
    """(atol, rtol, the outputs' own atol) the artifact was validated under when made: what every
    later check holds it, and what is converted from it without loss, to (the defaults where the
    package recorded none)."""
    stored = manifest.validation.get(artifact_id)
    if not stored:
        return DEFAULT_ATOL, DEFAULT_RTOL, {}
    return stored["atol"], stored["rtol"], dict(stored.get("output_atol", {}))


def validate_like(
    manifest: Manifest,
    artifact_id: str | None,
    run: Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]],
    samples: Sequence[tuple[dict[str, np.ndarray], Mapping[str, np.ndarray]]],
    reference: str,
) -> Record:
    """``run`` validated as the artifact ``artifact_id`` was when made (the defaults where None):
    the same model in another file format (a MindIR, an ORT-format file) is held to what it converts
    from without loss, and its record keeps why an output has its own atol, as the artifact's does."""
    atol, rtol, output_atol = (
        recorded_tolerance(manifest, artifact_id) if artifact_id else (DEFAULT_ATOL, DEFAULT_RTOL, {})
    )
    record = validate(run, samples, atol, rtol, reference, output_atol)
    if output_atol and artifact_id:
        record["tolerance_basis"] = manifest.validation[artifact_id].get("tolerance_basis", "")
    return record


def tolerance_text(record: Record) -> str:
    """``atol A, rtol R``, with each output's own atol where it has one."""
    own = ", ".join(f"{name}: {value:.3g}" for name, value in record.get("output_atol", {}).items())
    return f"atol {record['atol']:g}{f' ({own})' if own else ''}, rtol {record['rtol']:g}"


def failure_text(record: Record) -> str:
    """Per-output errors of a record, for messages and tables."""
    return "; ".join(
        f"{name}: max abs {o['max_abs_error']:.3g}, max rel {o['max_rel_error']:.3g}, {o['mismatched']} values off"
        for name, o in record["outputs"].items()
        if o["mismatched"]
    )


def require_passed(record: Record, what: str) -> None:
    if not record["passed"]:
        raise ValidationError(
            f"{what} differs from {record['reference']} beyond tolerance ({tolerance_text(record)}): {failure_text(record)}",
            "raise --atol/--rtol if this error is acceptable, or report the model",
        )


# An artifact that cannot match the source to the default tolerance (int8, fp16, pruned) is held
# from then on to this multiple of the error it had when it was made.
TOLERANCE_MARGIN = 2.0


def measured_tolerance_record(
    run: Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]],
    samples: Sequence[tuple[dict[str, np.ndarray], Mapping[str, np.ndarray]]],
    reference: str,
) -> Record:
    """Validation record whose tolerance is what the artifact achieves now, times the margin, so
    that ``deploy verify`` catches any later drift. Accuracy itself is judged elsewhere (the
    optimizer's guard, or the default tolerance for conversions that should be exact)."""
    measured = validate(run, samples, float("inf"), 0.0, reference=reference)
    worst = max(o["max_abs_error"] for o in measured["outputs"].values())
    record = validate(run, samples, max(DEFAULT_ATOL, worst * TOLERANCE_MARGIN), DEFAULT_RTOL, reference=reference)
    record["tolerance_basis"] = f"{TOLERANCE_MARGIN:g}x the error measured when the artifact was made"
    return record


def times_its_errors(record: Record | None, factor: float, basis: str) -> Tolerance:
    """What an artifact converted from the one ``record`` checked is held to: the default, and for
    each output whose error there times ``factor`` is above it, that (one output's larger error
    does not loosen every other output's check)."""
    outputs = record.get("outputs", {}) if record else {}
    tolerance: Tolerance = {"atol": DEFAULT_ATOL, "rtol": DEFAULT_RTOL, "tolerance_basis": basis}
    if own := {
        n: factor * o["max_abs_error"] for n, o in outputs.items() if factor * o["max_abs_error"] > DEFAULT_ATOL
    }:
        tolerance["output_atol"] = own
    return tolerance


def share_of_each_output(references: Sequence[tuple[Any, Mapping[str, np.ndarray]]], share: float) -> dict[str, float]:
    """Each floating-point output's own atol: ``share`` of its largest reference magnitude (at least
    the default), the scale a reduced-precision engine (fp16, TF32, calibrated int8, the Ascend NPU)
    rounds on, output by output: a pose score in [0, 1] is not held to a hundredth of segmentation
    logits reaching 1,700 (BlazePose's), nor labels to anything but equality."""
    largest: dict[str, float] = {}
    for _, outputs in references:
        for name, out in outputs.items():
            if out.size and np.issubdtype(out.dtype, np.floating):
                largest[name] = max(largest.get(name, 0.0), float(np.abs(out).max()))
    return {name: max(DEFAULT_ATOL, share * value) for name, value in largest.items()}


def reduced_precision(
    references: Sequence[tuple[Any, Mapping[str, np.ndarray]]], share: float, basis: str
) -> Tolerance:
    """What an engine computing at reduced precision is held to: ``share`` of each output's largest
    reference value, and rtol ``share``."""
    return {
        "atol": DEFAULT_ATOL,
        "rtol": share,
        "output_atol": share_of_each_output(references, share),
        "tolerance_basis": basis,
    }


def at_least_ten_bits(
    references: Sequence[tuple[Any, Mapping[str, np.ndarray]]],
    atol: float,
    rtol: float,
    output_atol: Mapping[str, float],
) -> tuple[float, dict[str, float]]:
    """(rtol, each output's atol) raised to what a 10-bit mantissa keeps (fp16, bf16's range, TF32)
    where the tolerance held so far is tighter: an artifact that computes so on other kernels."""
    ten_bits = share_of_each_output(references, TEN_BIT_RELATIVE)
    return max(rtol, TEN_BIT_RELATIVE), {name: max(output_atol.get(name, atol), v) for name, v in ten_bits.items()}


Run = Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]]
Samples = Sequence[tuple[dict[str, np.ndarray], Mapping[str, np.ndarray]]]


def fitted(run: Run, signature: Signature, samples: Samples, axes: tuple[Axes, Axes]) -> tuple[Run, list]:
    """The samples an artifact of fixed input sizes can take (a TFLite model converted at one image
    size), and a runner that feeds it row by row when its batch is fixed at 1. ``axes``: where the
    rows of each input and output lie (the package signature's batch axes: recurrent state
    ``[layers, batch, hidden]`` has them on axis 1), which the artifact's fixed sizes cannot say.
    Inputs are compared in the source's layout, which runtimes accept for channels-last artifacts."""
    input_axes = axes[0]

    def source_shape(shape: tuple, layout: str | None) -> tuple:
        return (shape[0], shape[-1], *shape[1:-1]) if layout == CHANNELS_LAST else shape

    def takes(name: str, shape: tuple, given: np.ndarray) -> bool:
        axis = row_axis(input_axes, name, given)
        return all(isinstance(d, str) or d == n or i == axis for i, (d, n) in enumerate(zip(shape, np.shape(given))))

    specs = [(t.name, source_shape(t.shape, t.layout)) for t in signature.inputs]
    fit = [(inputs, outputs) for inputs, outputs in samples if all(takes(n, s, inputs[n]) for n, s in specs)]
    if not any(shape and (axis := input_axes.get(name, 0)) is not None and shape[axis] == 1 for name, shape in specs):
        return run, fit
    return row_by_row(run, axes), fit


def row_by_row(run: Run, axes: tuple[Axes, Axes]) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """``run`` fed one row at a time, its outputs joined: ``axes`` are where the rows of each input
    and output lie."""
    input_axes, output_axes = axes

    def rows(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        results = [run(take_rows(batch, i, i + 1, input_axes)) for i in range(batch_size_of(batch, input_axes))]
        return join_rows(results, output_axes)

    return rows
