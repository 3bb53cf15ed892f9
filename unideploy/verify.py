"""Re-proving a package on this machine: integrity, then every artifact against the stored
reference outputs of the source framework."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from unideploy.errors import MissingDependencyError
from unideploy.package import Package
from unideploy.package.manifest import ValidationRecord
from unideploy.runtimes import RuntimeOptions
from unideploy.runtimes.selection import runtime_for
from unideploy.validation import DEFAULT_ATOL, DEFAULT_RTOL, failure_text, fitted, validate


@dataclass
class ArtifactCheck:
    artifact: str
    status: str  # "passed", "failed" or "skipped"
    runtime: str | None = None
    reason: str | None = None
    record: ValidationRecord | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "artifact": self.artifact,
            "status": self.status,
            "runtime": self.runtime,
            "reason": self.reason,
            **({"validation": self.record} if self.record else {}),
        }


def verify_package(package: Package, runtime: str | None = None, device: str = "cpu") -> list[ArtifactCheck]:
    """Run every artifact on the stored reference samples, with the tolerance it was exported under.

    Integrity was checked when the package was opened; an artifact no runtime here can execute
    is reported as skipped with the reason, never silently passed.
    """
    samples = package.reference_pairs()
    checks = []
    for artifact in package.manifest.artifacts:
        try:
            cls = runtime_for(artifact, runtime, device=device)
            engine = cls(
                package.path_of(artifact), package.manifest.signature_of(artifact), RuntimeOptions(device=device)
            )
        except MissingDependencyError as exc:  # no runtime here, or (on load) no GPU for a GPU artifact
            checks.append(ArtifactCheck(artifact.id, "skipped", reason=exc.message))
            continue
        stored = package.manifest.validation.get(artifact.id)
        atol, rtol = (stored["atol"], stored["rtol"]) if stored else (DEFAULT_ATOL, DEFAULT_RTOL)
        with engine:
            run, fit = fitted(engine.run, package.manifest.signature_of(artifact), samples)
            if not fit:
                checks.append(
                    ArtifactCheck(
                        artifact.id,
                        "skipped",
                        cls.name,
                        "no reference sample has the input size this artifact was made for",
                    )
                )
                continue
            record = validate(run, fit, atol, rtol, reference=package.manifest.source["framework"])
        checks.append(
            ArtifactCheck(
                artifact.id,
                "passed" if record["passed"] else "failed",
                cls.name,
                None if record["passed"] else failure_text(record),
                record,
            )
        )
    return checks
