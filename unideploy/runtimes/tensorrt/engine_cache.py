"""Where built engines live, and the key that decides whether one may be loaded.

A serialized engine (plan) only runs on the GPU model, TensorRT version and profile it was built
for, and a plan from elsewhere can crash the process or return garbage rather than fail. So a
plan is stored with the key it was built under, and loaded only when every field of that key
equals this machine's; otherwise it is rebuilt and the reason is said.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from unideploy.runtimes.tensorrt.profiles import InputProfile


def default_cache_dir() -> Path:
    """``$UNIDEPLOY_ENGINE_CACHE``, else ``~/.cache/unideploy/engines`` (a read-only package
    directory or zip cannot hold engines)."""
    env = os.environ.get("UNIDEPLOY_ENGINE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "unideploy" / "engines"


@dataclass(frozen=True)
class EngineKey:
    onnx_sha256: str  # the artifact the engine was built from
    precision: str  # fp32, fp16, int8
    profiles: tuple[tuple[str, tuple[tuple[int, ...], ...]], ...]
    gpu: str  # device name, e.g. "NVIDIA H100 80GB HBM3"
    compute_capability: str  # "9.0"
    tensorrt: str  # TensorRT version
    workspace_mib: int | None = None
    calibration_sha256: str | None = None  # int8 built with a calibrator: the data it saw

    @classmethod
    def make(
        cls,
        onnx_sha256: str,
        precision: str,
        profiles: list[InputProfile],
        gpu: str,
        compute_capability: str,
        tensorrt: str,
        workspace_mib: int | None = None,
        calibration_sha256: str | None = None,
    ) -> EngineKey:
        return cls(
            onnx_sha256,
            precision,
            tuple((p.name, (p.min, p.opt, p.max)) for p in profiles),
            gpu,
            compute_capability,
            tensorrt,
            workspace_mib,
            calibration_sha256,
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["profiles"] = {name: [list(s) for s in shapes] for name, shapes in self.profiles}
        return data

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:32]

    def differences(self, stored: dict[str, Any]) -> list[str]:
        """The fields in which a stored key differs from this one, as ``field: stored -> here``."""
        here = self.to_dict()
        return [f"{k}: {stored.get(k)!r} -> {here[k]!r}" for k in here if stored.get(k) != here[k]]


class EngineCache:
    """Plans under ``<dir>/<digest>.plan`` with ``<digest>.json`` holding the full key and the
    plan's checksum (a truncated or swapped plan is not loaded either)."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = Path(directory) if directory else default_cache_dir()

    def load(self, key: EngineKey) -> tuple[bytes | None, str]:
        """The plan built under exactly ``key``, or None and why there is none to use."""
        plan_path, meta = self._paths(key.digest)
        if plan_path.is_file() and meta.is_file():
            stored = _read_json(meta)
            if key.differences(stored):
                return None, f"the engine in {self.directory} does not match: " + "; ".join(key.differences(stored))
            plan = plan_path.read_bytes()
            if hashlib.sha256(plan).hexdigest() != stored.get("plan_sha256"):
                return None, f"the engine {plan_path} does not match its checksum"
            return plan, f"engine cache hit ({plan_path})"
        others = [_read_json(p) for p in sorted(self.directory.glob("*.json"))]
        others = [o for o in others if o.get("onnx_sha256") == key.onnx_sha256]
        if others:
            return None, (
                f"the engine in {self.directory} was built for another setup ("
                + "; ".join(key.differences(others[0]))
                + ")"
            )
        return None, f"no engine for this model in {self.directory}"

    def store(self, key: EngineKey, plan: bytes) -> Path:
        """Write plan then key, each through a temporary file, so a crash leaves no half entry."""
        self.directory.mkdir(parents=True, exist_ok=True)
        plan_path, meta_path = self._paths(key.digest)
        _atomic_write(plan_path, plan)
        meta = {**key.to_dict(), "plan_sha256": hashlib.sha256(plan).hexdigest()}
        _atomic_write(meta_path, (json.dumps(meta, indent=2) + "\n").encode())
        return plan_path

    def _paths(self, digest: str) -> tuple[Path, Path]:
        return self.directory / f"{digest}.plan", self.directory / f"{digest}.json"


def cached_or_built(
    key: EngineKey, shipped: EngineCache | None, cache: EngineCache, build: Callable[[str], bytes]
) -> tuple[bytes, str]:
    """The plan for ``key``: one shipped in the package, else one cached on this machine, else a
    new build (stored in ``cache``; ``build`` is told why); with a sentence saying which it was."""
    reasons = []
    for source in (shipped, cache):
        if source is None:
            continue
        plan, why = source.load(key)
        if plan is not None:
            return plan, why
        reasons.append(why)
    why = "; ".join(reasons)
    plan = build(why)
    return plan, f"built a new engine ({why}), cached at {cache.store(key, plan)}"


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
