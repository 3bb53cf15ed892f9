"""``deploy serve``: the KServe Open Inference Protocol v2 over REST and gRPC."""

from __future__ import annotations

from unideploy.registry import Availability, modules_availability

# What the serve extra installs and the server imports (checked without importing them).
MODULES = ("uvicorn", "starlette", "grpc", "prometheus_client", "yaml", "orjson", "pydantic_settings")


def availability() -> Availability:
    return modules_availability(MODULES, "serve")
