"""The repository and routing extensions (``/v2/repository/...``, ``/v2/models/{m}/routing``):
what is on disk and in what state, loading and unloading, and replacing a model's routing. Both
frontends call this; inference is the dataplane's."""

from __future__ import annotations

from typing import Any

from unideploy.server.errors import BadRequest, NotFound
from unideploy.server.models import ModelRegistry
from unideploy.server.routing import ROUTING_FILE, parse_routing


class RepositoryAPI:
    def __init__(self, registry: ModelRegistry) -> None:
        self.registry = registry

    def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """Every version on disk with its state, and why one that is not READY is not."""
        index = []
        for name, source in self.registry.scan().items():
            model = self.registry.models.get(name)
            for version in source.versions:
                entry = {"name": name, "version": version, "state": "UNAVAILABLE", "reason": ""}
                if model and version in model.versions:
                    entry["state"] = "READY"
                elif model and version in model.failures:
                    entry["reason"] = model.failures[version][1]
                elif name in self.registry.unloaded:
                    entry["reason"] = "unloaded"
                else:
                    entry["reason"] = "not selected by the version policy"
                index.append(entry)
        return [e for e in index if e["state"] == "READY"] if ready_only else index

    async def load(self, name: str) -> None:
        await self.registry.load(name)

    async def unload(self, name: str) -> None:
        await self.registry.unload(name)

    def routing(self, name: str) -> dict[str, Any] | None:
        if name not in self.registry.models:
            raise NotFound(f"unknown model '{name}'")
        routing = self.registry.models[name].routing
        return routing.to_dict() if routing else None

    async def set_routing(self, name: str, document: Any) -> dict[str, Any]:
        """Replace a model's routing (written to its routing.yaml, so it survives restarts)."""
        import yaml

        source = self.registry.scan().get(name)
        if name not in self.registry.models or source is None:
            raise NotFound(f"unknown model '{name}'")
        routing = parse_routing(document, "routing")
        model_dir = source.directory  # REPO/<name>, or REPO itself when it is one model (--model-name)
        missing = [v for v in routing.versions if not any((model_dir / c).exists() for c in (v, f"{v}.zip"))]
        if missing:
            raise BadRequest(f"routing names version(s) {', '.join(missing)} of '{name}', which the repository lacks")
        path = model_dir / ROUTING_FILE
        tmp = path.with_name(f".{ROUTING_FILE}.partial")
        tmp.write_text(yaml.safe_dump(routing.to_dict(), sort_keys=False))
        tmp.replace(path)
        await self.registry.sync(only=name)
        return routing.to_dict()
