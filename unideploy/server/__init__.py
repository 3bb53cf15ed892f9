"""``deploy serve``: the KServe Open Inference Protocol v2 over REST and gRPC; ``deploy kserve``:
manifests for KServe."""

from __future__ import annotations

from unideploy.errors import MissingDependencyError
from unideploy.registry import Availability, modules_availability

# What each extra installs that its command imports (checked without importing them): the server's
# modules import one another freely, so a command checks its extra once, before the first import.
EXTRA_MODULES = {
    "serve": ("uvicorn", "starlette", "grpc", "prometheus_client", "yaml", "orjson", "pydantic_settings"),
    # deploy kserve reads model.yaml and routing.yaml with the server's own settings classes
    "kserve": ("kserve", "kubernetes", "yaml", "pydantic_settings"),
}


def availability(extra: str = "serve") -> Availability:
    return modules_availability(EXTRA_MODULES[extra], extra)


def require(extra: str, command: str) -> None:
    found = availability(extra)
    if not found.ok:
        raise MissingDependencyError(f"{command} needs the {extra} extra: {found.detail}", found.fix)
