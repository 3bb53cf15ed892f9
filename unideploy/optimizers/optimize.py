"""The optimize verb: package -> package with one more artifact, or a refusal with numbers.

The passes run in order (prune, then quantize) on the package's fp32 ONNX artifact. The result is
measured against that artifact on validation data the calibration never saw; if its accuracy drop
exceeds the budget, nothing is written and the error gives the numbers. Otherwise it goes into the
package beside the fp32 artifact with what was done, why, and what it cost and gained.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from unideploy.errors import AccuracyBudgetError, ExportError, InputError, first_line
from unideploy.guard.data import Dataset, carrying_state, load_dataset, split, synthetic_dataset, validation_rows
from unideploy.guard.guard import Guard, settings_of
from unideploy.guard.measure import (
    latency,
    size_effects,
    slower_everywhere,
    slower_int8_note,
    timed_on,
    timing_session,
)
from unideploy.guard.search import tried
from unideploy.optimizers import PASSES, OptimizerPass, PassContext, pass_options
from unideploy.optimizers.base import STAGES, Evaluation, OptimizeRequest
from unideploy.options import flag
from unideploy.package import Artifact, Package, PlannedArtifact
from unideploy.package.files import scratch_dir
from unideploy.package.manifest import AccuracyRecord, OptimizationRecord, ValidationRecord
from unideploy.package.writer import extend_package
from unideploy.runtimes.selection import cpu_reference
from unideploy.validation import measured_tolerance_record

Progress = Callable[[str], None]
LARGE_BATCH = 64


def build_passes(request: OptimizeRequest) -> list[OptimizerPass]:
    """The passes ``request`` asks for, each chosen by the pass itself, in stage order."""
    for name in request.passes:
        PASSES.get(name)  # an unknown name is refused, naming the known ones
    takes = pass_options()
    if unknown := sorted(set(request.options) - takes.keys()):
        raise InputError(
            f"unknown optimization option(s): {', '.join(unknown)}", f"the passes take: {', '.join(sorted(takes))}"
        )
    passes = [p for _, cls in PASSES if (p := cls.from_request(request)) is not None]
    for option in request.options:
        owners, default = takes[option]
        if not any(option in p.options.model_fields for p in passes):
            raise InputError(
                f"{flag(option, default)} applies to the {' and '.join(owners)} pass, which this request does not run",
                "leave it out, or ask for that pass",
            )
    chosen = {p.stage for p in passes}
    if request.prune is not None and "prune" not in chosen:
        raise InputError(f"unknown pruning method '{request.prune_method}'", "use magnitude or channels")
    if request.quantize is not None and "quantize" not in chosen:
        raise InputError(f"unknown quantization '{request.quantize}'", "use int8 or fp16")
    if not passes:
        raise InputError("nothing to optimize", "pass --quantize int8|fp16, --prune SPARSITY and/or --pass NAME")
    if request.min_cosine is not None and not -1.0 <= request.min_cosine <= 1.0:
        raise InputError(f"--min-cosine {request.min_cosine:g} is not a cosine similarity", "give a value in [-1, 1]")
    if request.max_accuracy_drop < 0:
        raise InputError("--max-accuracy-drop cannot be negative")
    return sorted(passes, key=lambda p: STAGES.index(p.stage) if p.stage in STAGES else len(STAGES))


def _artifact_id(passes: list[OptimizerPass]) -> str:
    return "onnx-" + "-".join(p.tag() for p in passes)


def _base_artifact(package: Package, artifact_id: str | None) -> Artifact:
    if artifact_id:
        artifact = package.manifest.artifact(artifact_id)
        if artifact.format != "onnx":
            raise InputError(f"artifact '{artifact_id}' is {artifact.format}; optimizers work on ONNX artifacts")
        return artifact
    base = package.manifest.base_onnx()
    if base is not None and base.precision != "fp32":
        raise InputError(
            f"the package's ONNX artifact '{base.id}' computes in {base.precision} already, as its source model does",
            "export the fp32 model it was made from, and optimize that",
        )
    if base is not None:
        return base
    raise InputError("the package has no fp32 ONNX artifact to optimize", "name one with --artifact")


def _datasets(request: OptimizeRequest, package: Package) -> tuple[Dataset, Dataset]:
    signature = package.manifest.signature
    if request.calibration:
        data = load_dataset(request.calibration, signature)
    elif request.synthetic:
        data = synthetic_dataset(signature)
    else:
        raise InputError(
            "no calibration data: without it the accuracy of an optimized model cannot be judged",
            "pass --calibration DATA (.npz of named inputs, optionally with 'labels', or a directory of "
            ".npz/.npy files), or --synthetic-calibration to accept random inputs and an unjudged accuracy",
        )
    if request.validation:
        return data, load_dataset(request.validation, signature, "--validation")
    return split(data)


def optimize(
    package_path: str | Path,
    request: OptimizeRequest,
    output: str | Path | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> Path:
    """Add an optimized artifact to a package (in place, or into ``output``)."""
    say = progress or (lambda _msg: None)
    passes = build_passes(request)
    with Package.open(package_path) as package, scratch_dir("unideploy-opt-") as tmp:
        base = _base_artifact(package, request.artifact)
        base_path = package.path_of(base)
        calibration, validation = _datasets(request, package)
        signature = package.manifest.signature
        fixed_batch = package.manifest.fixed_batch
        batch_sizes = (1, LARGE_BATCH) if fixed_batch is None else (fixed_batch,)

        say("running the fp32 artifact on the validation data")
        fp32 = timing_session(base_path)
        guard = Guard.of(
            _runner(fp32),
            **validation_rows(validation, fixed_batch, signature),
            **settings_of(request.accuracy),
            output_axes=signature.output_batch_axes,
        )
        if guard.stream is not None:
            say(f"judging over {len(guard.batches)} stream(s), each model carrying its own state")
        calibration = carrying_state(calibration, _runner(fp32), signature)
        calibration_batches = calibration.batches(fixed_batch)
        for name, (metric, why) in guard.metrics.items():  # refuses a bad --metric before any work
            say(f"judging '{name}' by {metric}: {why}")
        evaluated: dict[Path, Evaluation] = {}

        def judge(candidate: Path) -> AccuracyRecord:
            return guard.judge(candidate, lambda: _runner(_session_of(candidate)))

        def evaluate(candidate: Path) -> Evaluation:
            if candidate not in evaluated:
                evaluated[candidate] = Evaluation(
                    judge(candidate),
                    latency(
                        fp32, _session_of(candidate), calibration_batches[0], batch_sizes, axes=signature.batch_axes
                    ),
                )
            return evaluated[candidate]

        context = PassContext(signature, calibration_batches, Path(tmp), evaluate, judge, fixed_batch, say)
        steps: list[dict[str, Any]] = []
        notes: list[str] = []
        current, precision, targets = base_path, base.precision, base.targets
        for optimizer_pass in passes:
            result = optimizer_pass.apply(current, context)
            current = result.path
            # a model reduced already (an int8 base named with --artifact) and reduced again another
            # way keeps both kinds of kernel: fp16 around its int8 MatMuls is neither
            changed = result.precision is not None and result.precision != precision
            precision = "mixed" if changed and precision != "fp32" else result.precision or precision
            targets = result.targets or targets
            steps.append({"name": optimizer_pass.name, "params": result.params})
            notes += result.notes

        say("measuring the optimized model against fp32")
        final = evaluate(current)
        searched = "".join(
            f"; {summary}"
            for step in steps
            for record in (step["params"].get("search", {}), *step["params"].get("other_searches", {}).values())
            if (summary := tried(record))
        )
        guard.admit(
            final.accuracy,
            lambda numbers: AccuracyBudgetError(
                f"the optimized model exceeds the accuracy budget {numbers}{searched}; the package was not changed",
                "raise --max-accuracy-drop, give more or better calibration data, or choose a milder optimization",
            ),
        )
        artifact_id = _artifact_id(passes)
        record = _source_tolerance(package, current, signature)
        effects = {
            **size_effects(base_path, current),
            "latency_ms": {str(b): v for b, v in final.latency_ms.items()},
            "latency_on": timed_on(),
        }
        data_info = {
            "calibration": calibration.origin,
            "calibration_rows": calibration.rows,
            "validation": validation.origin,
            "validation_rows": validation.rows,
            "synthetic": calibration.origin == "synthetic",
            "labels": validation.labels is not None,
        }
        if data_info["synthetic"]:
            notes.append("accuracy was measured on synthetic inputs only: it says little about real data")
        if precision == "int8" and (slower := slower_everywhere(final.latency_ms)):
            notes.append(slower_int8_note(artifact_id, slower, effects["size_ratio"]))

        say("writing the package")
        artifact = PlannedArtifact(
            id=artifact_id,
            path=f"artifacts/model.{artifact_id.removeprefix('onnx-')}.onnx",
            format="onnx",
            precision=precision,
            runtimes=list(base.runtimes),
            opset=base.opset,
            derived_from=base.id,
            targets=targets,
        )
        made: OptimizationRecord = {
            "name": "+".join(s["name"] for s in steps),
            "artifact": artifact_id,
            "derived_from": base.id,
            "passes": steps,
            "data": data_info,
            "accuracy": final.accuracy,
            "effects": effects,
            "notes": notes,
        }
        return extend_package(
            package,
            package_path,
            output or package_path,
            [(artifact, current, {}, record)],
            overwrite,
            optimizations=[made],
        )


def _runner(session: Any) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    names = [o.name for o in session.get_outputs()]
    return lambda batch: dict(zip(names, session.run(None, batch)))


def _session_of(candidate: Path) -> Any:
    try:
        return timing_session(candidate)
    except Exception as exc:  # a converter wrote a graph ONNX Runtime refuses: a refusal, not a crash
        raise ExportError(
            f"the optimized model does not load in ONNX Runtime: {first_line(exc)}",
            "try another --int8-variant, or --quantize fp16",
        ) from exc


def _source_tolerance(package: Package, model: Path, signature: Any) -> ValidationRecord:
    """Errors of the optimized model against the source framework's reference outputs, with the
    tolerance ``deploy verify`` will hold it to from now on."""
    references = package.reference_pairs()
    with cpu_reference(model, signature) as runtime:
        return measured_tolerance_record(runtime.run, references, package.manifest.source["framework"])
