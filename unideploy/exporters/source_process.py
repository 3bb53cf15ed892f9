"""Running the source framework (``run_source``): here, or in a process of its own
(``deploy export --trust-source``).

Every step of an export that runs the source framework lives here: conversion, the reference
outputs, and the validation of a native artifact. When a user waives the scan of ``trust.py``, the
model runs code nobody checked; those steps then run in a fresh Python process
(``child_process.py``) whose working directory is a private folder inside the export's temporary
directory, removed with it. A model that crashes or exits takes only that process down, and the
package is not written; what it writes by relative path lands in that folder. It is a process
boundary, not a sandbox: the model still runs with the user's rights (docs/security.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from unideploy import child_process
from unideploy.errors import ExportError, RuntimeFailure
from unideploy.exporters.base import ConvertedModel, Exporter, ExportOptions, SourceRunner
from unideploy.exporters.shapes import resolve_signature, settle_outputs
from unideploy.onnx.interface import declare_signature, table_rows
from unideploy.package.manifest import ValidationRecord
from unideploy.runtimes import RUNTIMES, RuntimeOptions
from unideploy.samples import (
    batch_size_of,
    dynamic_dims,
    example_batches,
    streams,
    synthetic_batches,
    with_carried_state,
)
from unideploy.signature import BATCH_DIM, Signature
from unideploy.validation import require_passed, row_by_row, validate


@dataclass
class SourceRun:
    """What running the source framework gave: the conversion (without its handle on the framework),
    the settled signature, the reference pairs, and the native artifact's validation, if any."""

    converted: ConvertedModel
    signature: Signature
    references: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]
    native_validation: ValidationRecord | None
    spread: EngineSpread | None = None  # where the source's framework has a second engine


@dataclass(frozen=True)
class EngineSpread:
    """How far a second engine of the source's framework is from the reference outputs: the
    largest absolute difference in each output."""

    engine: str
    max_abs: dict[str, float]


def engine_spread(engine: str, second: SourceRunner, references: list) -> EngineSpread:
    measured = validate(second, references, float("inf"), 0.0, reference=engine)
    return EngineSpread(engine, {name: o["max_abs_error"] for name, o in measured["outputs"].items()})


def run_source(
    exporter_cls: type[Exporter],
    src: Path,
    workdir: Path,
    options: ExportOptions,
    atol: float,
    rtol: float,
    say: Callable[[str], None],
) -> SourceRun:
    """Every step that runs the source framework: conversion, the reference outputs, and the
    validation of a native artifact (the source itself, run by its framework's runtime). Here, or,
    where the scan's refusal was waived (``--trust-source``), in a process of its own."""
    if options.trust_source:
        say(f"converting {src.name} with the {exporter_cls.name} exporter and running it, in a separate process")
        return _in_process(exporter_cls.name, src, workdir, options, atol, rtol)
    return _here(exporter_cls, src, workdir, options, atol, rtol, say)


def _here(
    exporter_cls: type[Exporter],
    src: Path,
    workdir: Path,
    options: ExportOptions,
    atol: float,
    rtol: float,
    say: Callable[[str], None],
) -> SourceRun:
    say(f"converting {src.name} with the {exporter_cls.name} exporter")
    converted = exporter_cls().convert(src, workdir, _traceable(options))
    signature, sizes = resolve_signature(converted.signature, options, converted.size_hints)
    # a streaming model's state (--state, a TFLite model's variables): a pair that cannot be one is
    # refused here, before the source runs
    signature = signature.with_state((*converted.state, *options.state))

    say("running the source model on reference samples")
    if options.example_inputs is not None:
        example = options.example_inputs
        if streams(example, signature):  # a stream's rows, each with the state the source carries to it
            example = with_carried_state(converted.run_source, example, signature)
        batches = example_batches(example, signature)
    else:
        batches = synthetic_batches(signature, sizes)
        if signature.state:  # a state the model reaches, not noise: each batch's random rows as a stream
            batches = [
                with_carried_state(converted.run_source, _without_state(b, signature), signature) for b in batches
            ]
    references = _references(converted.run_source, batches, signature)
    signature = settle_outputs(signature, references)
    if converted.onnx_path is not None:
        declare_signature(converted.onnx_path, signature)
        signature = signature.with_table_rows(table_rows(converted.onnx_path))
    native_validation = None
    if exporter_cls.native_format:
        runtime_name = exporter_cls.framework
        say(f"validating the native {exporter_cls.native_format} artifact on {runtime_name}")
        with RUNTIMES.get(runtime_name)(src, signature, RuntimeOptions(device="cpu")) as runtime:
            native_validation = validate(runtime.run, references, atol, rtol, reference=exporter_cls.framework)
        require_passed(native_validation, f"the native {exporter_cls.native_format} artifact")
    spread = None
    if (second := converted.second_engine or _rows_alone(converted, signature)) is not None:
        say(f"running the source on {second[0]} too")
        spread = engine_spread(*second, references)
    return SourceRun(
        replace(converted, run_source=_ran_elsewhere, second_engine=None),
        signature,
        references,
        native_validation,
        spread,
    )


def _without_state(batch: dict[str, np.ndarray], signature: Signature) -> dict[str, np.ndarray]:
    return {name: value for name, value in batch.items() if name not in signature.state_inputs}


def _traceable(options: ExportOptions) -> ExportOptions:
    """``options`` as a converter that traces the source with the example takes them (TorchScript,
    ``torch.export``): a stream (a streaming model's rows without the state its ``--state`` names)
    given each such state input at its initial value, in the shape its ``--input-shape`` declares,
    its batch dimension at the stream's rows. The references are computed on the stream itself."""
    example, shapes = options.example_inputs, {s.name: s for s in options.input_shapes}
    missing = [p for p in options.state if example is not None and p.input not in example and p.input in shapes]
    if example is None or not missing:
        return options
    axes = {s.name: next((a for a, n in s.dim_names.items() if n == BATCH_DIM), 0) for s in shapes.values()}
    rows = batch_size_of(example, axes)
    filled = dict(example)
    for pair in missing:
        spec, axis = shapes[pair.input], axes[pair.input]
        size = [rows if a == axis else d for a, d in enumerate(spec.shape)]
        filled[pair.input] = np.full(size, pair.initial, spec.dtype)
    return replace(options, example_inputs=filled)


def _rows_alone(converted: ConvertedModel, signature: Signature) -> tuple[str, SourceRunner] | None:
    """The source's engine on each row of a batch alone, as its second engine, where the exporter
    says so (an ONNX file: ONNX Runtime) and the batch is dynamic. A batched matrix product sums in
    another order than one row's, and where a model's outputs move with that (Magika computes its
    layer norms' variance as E[x^2] - E[x]^2: its probabilities moved by 0.0045 between a batch of
    4 and its rows alone), no conversion that runs a row at a time (TFLite and MindIR at batch 1)
    can be held closer. Built on the settled signature, which says where each output's rows are
    (Silero VAD's state: axis 1)."""
    dim = signature.batch_dim
    if converted.rows_alone is None or dim is None or any(dim not in out.shape for out in signature.outputs):
        return None  # a fixed batch runs whole only; an output of no rows (a batch's statistic) is no row's
    rows = row_by_row(converted.run_source, (signature.batch_axes, signature.output_batch_axes))
    return f"{converted.rows_alone} on each row alone", rows


def _ran_elsewhere(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    raise RuntimeError("the source model ran in the export's source process; its outputs are the references")


def _references(
    run: SourceRunner, batches: list[dict[str, np.ndarray]], signature: Signature
) -> list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """The source's outputs for each batch. The batches after the example crop the sizes its
    signature leaves open (``example_batches``), to prove a second size; an ONNX file may declare a
    size open that its graph fixes (an exporter's dynamic axes on a dimension a weight pins), and
    then the example runs and its crop fails. That is said as such, with the sizes and how to pin
    them, not as the runtime's failure on shapes the user never gave."""
    references, failed = [], None
    for batch in batches:
        try:
            references.append((batch, run(batch)))
        except RuntimeFailure as exc:
            failed = failed or (batch, exc)
    if failed is None:
        return references
    batch, error = failed
    ran = references[0][0] if references else None
    differ = [
        (spec.name, axis, name)
        for spec, axis, name in dynamic_dims(signature)
        if ran is not None and ran[spec.name].shape[axis] != batch[spec.name].shape[axis]
    ]
    if ran is None or not differ:
        raise error
    sizes = "; ".join(
        f"'{tensor}' axis {axis} ('{name}') runs at {ran[tensor].shape[axis]} but not at {batch[tensor].shape[axis]}"
        for tensor, axis, name in differ
    )
    pins = " ".join(
        f"--input-shape {t}:{'x'.join(map(str, ran[t].shape))}" for t in dict.fromkeys(t for t, _, _ in differ)
    )
    raise ExportError(
        f"the model declares sizes open that it cannot vary: {sizes} ({error.message})",
        f"where those are the only sizes it takes, fix them: {pins}",
    ) from error


def _in_process(exporter: str, src: Path, workdir: Path, options: ExportOptions, atol: float, rtol: float) -> SourceRun:
    """``_here`` in a new interpreter; its errors are raised here as they were there."""
    run: SourceRun = child_process.call(
        _run_source,
        exporter,
        src.resolve(),
        workdir.resolve(),
        options,
        atol,
        rtol,
        workdir=workdir,
        what=f"the process running '{src.name}'",
        hint="the model crashed or exited while it ran; check it with its own framework first",
    )
    return run


def _run_source(exporter: str, src: Path, workdir: Path, options: ExportOptions, atol: float, rtol: float) -> SourceRun:
    from unideploy.exporters import EXPORTERS

    return _here(EXPORTERS.get(exporter), src, workdir, options, atol, rtol, _quiet)


def _quiet(message: str) -> None:
    """Progress stays with the exporting process, which said what runs here."""
