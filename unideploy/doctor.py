"""What works on this machine, and for what does not, why and the command that fixes it."""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass

from unideploy.exporters import EXPORTERS
from unideploy.runtimes import RUNTIMES
from unideploy.targets import TARGETS


@dataclass
class Finding:
    kind: str  # exporter, runtime, target
    name: str
    ok: bool
    detail: str
    fix: str | None = None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def diagnose() -> list[Finding]:
    findings = []
    for name in EXPORTERS.names():
        found = EXPORTERS.get(name).availability()
        findings.append(Finding("exporter", name, found.ok, found.detail, found.fix))
    for name in RUNTIMES.names():
        found = RUNTIMES.get(name).availability()
        findings.append(Finding("runtime", name, found.ok, found.detail, found.fix))
    for target in TARGETS.values():
        if target.stage_available:
            findings.append(Finding("target", target.name, True, target.description))
        else:
            findings.append(Finding("target", target.name, False,
                                    f"{target.description}: not included in this version of unideploy",
                                    "use --target cpu for now"))
    return findings


def machine_summary() -> str:
    return f"Python {platform.python_version()} on {platform.system()} {platform.machine()}"
