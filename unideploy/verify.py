"""Re-proving a package on this machine: integrity, then every artifact against the stored
reference outputs of the source framework."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from unideploy.errors import MissingDependencyError
from unideploy.package import Package
from unideploy.package.manifest import ValidationRecord
from unideploy.runtimes import RuntimeOptions
from unideploy.runtimes.selection import open_artifact, what_ran
from unideploy.validation import (
    at_least_ten_bits,
    failure_text,
    fitted,
    recorded_tolerance,
    validate,
)


@dataclass
class ArtifactCheck:
    artifact: str
    status: str  # "passed", "failed" or "skipped"
    runtime: str | None = None
    reason: str | None = None
    record: ValidationRecord | None = None
    ran: dict[str, Any] | None = None  # selection.what_ran: providers and precision that computed it

    def to_dict(self) -> dict[str, Any]:
        return {
            "artifact": self.artifact,
            "status": self.status,
            "runtime": self.runtime,
            "reason": self.reason,
            **({"ran": self.ran} if self.ran else {}),
            **({"validation": self.record} if self.record else {}),
        }


def verify_package(
    package: Package, runtime: str | None = None, device: str = "cpu", tf32: bool = False
) -> list[ArtifactCheck]:
    """Run every artifact on the stored reference samples, with the tolerance it was exported under.

    Integrity was checked when the package was opened; an artifact no runtime here can execute
    is reported as skipped with the reason, never silently passed. An fp32 artifact computed in
    TF32 (``tf32``, on a GPU) is judged as tf32: 1% of each output's largest reference value, as fp16.
    """
    samples = package.reference_pairs()
    checks = []
    for artifact in package.manifest.artifacts:
        try:
            engine = open_artifact(package, artifact, runtime, RuntimeOptions(device=device, tf32=tf32))
        except MissingDependencyError as exc:  # no runtime here, or (on load) no GPU for a GPU artifact
            checks.append(ArtifactCheck(artifact.id, "skipped", reason=exc.message))
            continue
        ran = what_ran(artifact, engine)
        atol, rtol, output_atol = recorded_tolerance(package.manifest, artifact.id)
        if ran["precision"] == "tf32":
            rtol, output_atol = at_least_ten_bits(samples, atol, rtol, output_atol)
        with engine:
            signature = package.manifest.signature
            run, fit = fitted(
                engine.run,
                package.manifest.signature_of(artifact),
                samples,
                (signature.batch_axes, signature.output_batch_axes),
            )
            if not fit:
                checks.append(
                    ArtifactCheck(
                        artifact.id,
                        "skipped",
                        engine.name,
                        "no reference sample has the input size this artifact was made for",
                        ran=ran,
                    )
                )
                continue
            record = validate(run, fit, atol, rtol, package.manifest.source["framework"], output_atol)
        checks.append(
            ArtifactCheck(
                artifact.id,
                "passed" if record["passed"] else "failed",
                engine.name,
                None if record["passed"] else failure_text(record),
                record,
                ran,
            )
        )
    return checks
