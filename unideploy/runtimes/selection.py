"""Choosing an artifact and a runtime for a package on this machine.

Artifacts are tried in manifest order, and ``--target gpu`` puts its TensorRT artifacts first: a
GPU machine runs them, and anywhere else they are passed over, with the reason kept for the
message should nothing at all be runnable.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from unideploy.errors import MissingDependencyError
from unideploy.package import Artifact, Package
from unideploy.runtimes import RUNTIMES, Runtime, RuntimeOptions
from unideploy.signature import Signature


def runtime_for(
    artifact: Artifact, runtime: str | None = None, target: str | None = None, device: str = "auto"
) -> type[Runtime]:
    """The first available runtime that can run ``artifact`` (or the named one) for ``target``."""
    names = [runtime] if runtime else artifact.runtimes
    reasons = []
    for name in names:
        cls = RUNTIMES.get(name)
        if artifact.format not in cls.formats:
            reasons.append(f"{name} does not run {artifact.format} artifacts")
            continue
        if target and target not in cls.targets:
            reasons.append(f"{name} does not serve the {target} target")
            continue
        if device == "cpu" and cls.targets == ("gpu",):
            reasons.append(f"{name} runs on GPUs only, and the CPU was asked for")
            continue
        found = cls.availability()
        if found.ok:
            return cls
        reasons.append(f"{name}: {found.detail}" + (f" (fix: {found.fix})" if found.fix else ""))
    raise MissingDependencyError(
        f"no usable runtime for artifact '{artifact.id}' ({artifact.format}): " + "; ".join(reasons or ["none listed"]),
        "run 'deploy doctor' to see what is missing",
    )


def cpu_reference(model: Path, signature: Signature) -> Runtime:
    """An ONNX model on ONNX Runtime's CPU provider, whatever this machine has: the one place every
    stage's own reference runs (what converted and optimized artifacts are judged against, what
    carries a stream's state to its calibration rows), so the same model gives the same numbers in
    export, optimize, the edge and GPU targets alike."""
    return RUNTIMES.get("onnxruntime")(model, signature, RuntimeOptions(device="cpu"))


def open_artifact(
    package: Package, artifact: Artifact, runtime: str | None, options: RuntimeOptions, target: str | None = None
) -> Runtime:
    """``artifact`` loaded on the first runtime that can run it here, told the artifact's precision."""
    cls = runtime_for(artifact, runtime, target, options.device)
    options = replace(options, precision=artifact.precision)
    return cls(package.path_of(artifact), package.manifest.signature_of(artifact), options)


def what_ran(artifact: Artifact, engine: Runtime) -> dict[str, Any]:
    """What computed a result, for every place that shows one (run, bench, verify, the server): the
    artifact, the engine's own account of where and in what precision it ran (its providers, not
    those asked for), and the artifacts passed over on the way and why."""
    found: dict[str, Any] = {"artifact": artifact.id, "precision": artifact.precision, **engine.describe()}
    if engine.options.tf32 and found["precision"] == "fp32":  # asked for, and not where it exists
        unused = f"TF32 was asked for, and this ran in exact fp32 on the {found.get('device', 'cpu').upper()}: TF32 is "
        unused += "a precision of NVIDIA GPUs, used for fp32 artifacts on ONNX Runtime's CUDA provider"
        found["fallback"] = "; ".join(filter(None, (found.get("fallback"), unused)))
    if engine.passed_over:
        found["passed_over"] = list(engine.passed_over)
    return found


def open_runtime(
    package: Package,
    artifact_id: str | None = None,
    runtime: str | None = None,
    options: RuntimeOptions | None = None,
    target: str | None = None,
) -> tuple[Artifact, Runtime]:
    """Load the requested artifact (or the first one this machine can run for ``target``)."""
    options = options or RuntimeOptions()
    if target == "gpu" and options.device == "auto":
        options = replace(options, device="gpu")  # a GPU target never quietly runs on the CPU
    candidates = [package.manifest.artifact(artifact_id)] if artifact_id else list(package.manifest.artifacts)
    errors: list[MissingDependencyError] = []
    for artifact in candidates:
        try:
            engine = open_artifact(package, artifact, runtime, options, target)
        except MissingDependencyError as exc:  # also raised on load: a GPU artifact without a GPU
            errors.append(exc)
            continue
        engine.passed_over = tuple(f"{a.id}: {e.message}" for a, e in zip(candidates, errors, strict=False))
        return artifact, engine
    if len(errors) == 1:
        raise errors[0]
    raise MissingDependencyError(
        "no artifact in this package can run here: " + "; ".join(dict.fromkeys(e.message for e in errors)),
        "run 'deploy doctor' to see what is missing",
    )
