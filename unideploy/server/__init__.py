"""``deploy serve``: the KServe Open Inference Protocol v2 over REST and gRPC; ``deploy kserve``:
manifests for KServe."""

from __future__ import annotations

from unideploy.errors import MissingDependencyError
from unideploy.registry import Availability, modules_availability

# What each extra installs that its command imports (checked without importing them): the server's
# modules import one another freely, so a command checks its extra once, before the first import.
SERVE = ("uvicorn", "httptools", "starlette", "grpc", "prometheus_client", "yaml", "orjson", "pydantic_settings")
EXTRA_MODULES = {
    "serve": SERVE,
    "ray": (*SERVE, "ray"),  # deploy serve --ray: the server's core in each Ray Serve replica
    # deploy kserve reads model.yaml and routing.yaml with the server's own settings classes
    "kserve": ("kserve", "kubernetes", "yaml", "pydantic_settings"),
}


def availability(extra: str = "serve") -> Availability:
    return modules_availability(EXTRA_MODULES[extra], extra)


def require(extra: str, command: str) -> None:
    """Stop before the first import when the extra is missing, naming every module it lacks."""
    found = availability(extra)
    if not found.ok:
        raise MissingDependencyError(f"{command} needs the {extra} extra: {found.detail}", found.fix)
