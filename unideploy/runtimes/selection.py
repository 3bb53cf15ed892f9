"""Choosing an artifact and a runtime for a package on this machine."""

from __future__ import annotations

from unideploy.errors import MissingDependencyError
from unideploy.package import Artifact, Package
from unideploy.runtimes import RUNTIMES, Runtime, RuntimeOptions


def runtime_for(artifact: Artifact, runtime: str | None = None, target: str | None = None) -> type[Runtime]:
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
        found = cls.availability()
        if found.ok:
            return cls
        reasons.append(f"{name}: {found.detail}" + (f" (fix: {found.fix})" if found.fix else ""))
    raise MissingDependencyError(
        f"no usable runtime for artifact '{artifact.id}' ({artifact.format}): " + "; ".join(reasons or ["none listed"]),
        "run 'deploy doctor' to see what is missing",
    )


def open_runtime(package: Package, artifact_id: str | None = None, runtime: str | None = None,
                 options: RuntimeOptions | None = None, target: str | None = None) -> tuple[Artifact, Runtime]:
    """Load the requested artifact (or the first one this machine can run for ``target``)."""
    if artifact_id:
        candidates = [package.manifest.artifact(artifact_id)]
    else:
        candidates = list(package.manifest.artifacts)
    errors: list[MissingDependencyError] = []
    for artifact in candidates:
        try:
            cls = runtime_for(artifact, runtime, target)
        except MissingDependencyError as exc:
            errors.append(exc)
            continue
        return artifact, cls(package.path_of(artifact), package.manifest.signature_of(artifact), options)
    if len(errors) == 1:
        raise errors[0]
    raise MissingDependencyError(
        "no artifact in this package can run here: " + "; ".join(e.message for e in errors),
        "run 'deploy doctor' to see what is missing",
    )
