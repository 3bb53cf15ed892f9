"""Server settings: command line, optional config file, and per-model files in the repository.

Per model, ``REPO/<model>/model.yaml`` may set::

    version_policy: {latest: 2}        # or {all: true}, or {specific: [1, 3]}; default latest 1
    max_batch_size: 32                 # dynamic batching: rows merged into one runtime call
    max_queue_delay_ms: 0              # how long a request may wait for others to join it; 0:
                                       # only requests that queued while the model was busy merge
    artifact: onnx-int8                # which artifact of each package to serve (default: the
                                       # first one this machine can run, i.e. the fp32 ONNX one)
    spin: run                          # ONNX Runtime's worker threads busy-wait within a run only
                                       # (default); always: between runs too; never
    threads: 2                         # intra-op threads per run (default: one per core)
    replicas: 2                        # scale-out (deploy kserve, deploy serve --ray): a fixed count,
                                       # or {min: 1, max: 4, target_concurrency: 8} to autoscale on
                                       # requests in flight per replica; default 1
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from unideploy.errors import InputError
from unideploy.runtimes.base import SPIN_POLICIES

if TYPE_CHECKING:
    from unideploy.package.signing import TrustedSigners

DEFAULT_MAX_REQUEST_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_REQUEST_ROWS = 4096


def is_remote(repository: str | Path) -> bool:
    """A repository given as a URL (s3://, gs://, ...) rather than a local folder."""
    return isinstance(repository, str) and "://" in repository


@dataclass
class ServerConfig:
    repository: Path | str  # a local folder, or a URL (s3://bucket/prefix, gs://...): server/remote.py
    model_name: str | None = None  # the repository is this one model's folder or package (KServe's /mnt/models)
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    poll_interval_s: float = 2.0  # 0 disables watching the repository
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_request_rows: int = DEFAULT_MAX_REQUEST_ROWS  # rows (the batch dimension) of one request, both protocols
    inference_token: str | None = None  # bearer token for inference and metadata
    repository_token: str | None = None  # bearer token for the repository and routing APIs
    tls_cert: Path | None = None
    tls_key: Path | None = None
    workers: int = 4  # threads running models
    body_timeout_s: float = 30.0  # a REST body that has not fully arrived by then is answered 408
    max_connections: int = 512  # REST connections at once (more are answered 503): stays below the usual 1,024 fds
    require_signed: bool = False  # load only versions signed by trusted_key / trusted_chain (package/signing.py)
    trusted_key: Path | None = None
    trusted_chain: tuple[Path, ...] = ()

    @classmethod
    def from_file(cls, path: Path, **overrides: Any) -> ServerConfig:
        data = load_yaml(path)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InputError(f"{path}: unknown setting(s) {', '.join(unknown)}", f"known: {', '.join(sorted(known))}")
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**data)

    def __post_init__(self) -> None:
        if not is_remote(self.repository):
            self.repository = Path(self.repository)
        if (self.tls_cert is None) != (self.tls_key is None):
            raise InputError("TLS needs both --tls-cert and --tls-key")
        self.trusted_key = Path(self.trusted_key) if self.trusted_key else None
        self.trusted_chain = tuple(Path(c) for c in self.trusted_chain or ())
        if (self.trusted_key or self.trusted_chain) and not self.require_signed:
            raise InputError(
                "--trusted-key and --trusted-chain apply with --require-signed", "add --require-signed, or drop them"
            )

    def trusted_signers(self) -> TrustedSigners | None:
        """Who versions must be signed by, or None when signatures are not required."""
        if not self.require_signed:
            return None
        from unideploy.package.signing import TrustedSigners

        return TrustedSigners(self.trusted_key, self.trusted_chain)  # refuses neither or both


@dataclass(frozen=True)
class ModelSettings:
    policy: str = "latest"  # latest, all, specific
    latest: int = 1
    specific: tuple[str, ...] = ()
    max_batch_size: int = 32
    max_queue_delay_ms: float = 0.0
    artifact: str | None = None
    spin: str = "run"  # measured on 2 cores: docs/server.md, "Threads and spinning"
    threads: int | None = None
    min_replicas: int = 1  # scale-out only (KServe, Ray Serve): one server process serves one replica
    max_replicas: int = 1
    target_concurrency: int | None = None  # requests in flight per replica the autoscaler aims for

    def select(self, versions: list[str]) -> list[str]:
        """The versions to serve, given those on disk (sorted oldest first)."""
        if self.policy == "all":
            return versions
        if self.policy == "specific":
            return [v for v in versions if v in self.specific]
        return versions[-self.latest :]


def load_yaml(path: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise InputError(f"{path} must hold a mapping of settings")
    return data


def model_settings(model_dir: Path) -> ModelSettings:
    path = model_dir / "model.yaml"
    if not path.exists():
        return ModelSettings()
    data = load_yaml(path)
    policy = data.get("version_policy", {"latest": 1})
    try:
        if not isinstance(policy, dict) or len(policy) != 1:
            raise ValueError("version_policy takes one of latest, all, specific")
        kind, value = next(iter(policy.items()))
        count = data.get("replicas", 1)
        replicas: dict[str, Any] = count if isinstance(count, dict) else {"min": count, "max": count}
        if set(replicas) - {"min", "max", "target_concurrency"}:
            raise ValueError("replicas takes a count, or min, max and target_concurrency")
        target = replicas.get("target_concurrency")
        settings = ModelSettings(
            policy=kind,
            latest=int(value) if kind == "latest" else 1,
            specific=tuple(str(v) for v in value) if kind == "specific" else (),
            max_batch_size=int(data.get("max_batch_size", 32)),
            max_queue_delay_ms=float(data.get("max_queue_delay_ms", 0.0)),
            artifact=str(data["artifact"]) if data.get("artifact") is not None else None,
            spin=str(data.get("spin", "run")),
            threads=int(data["threads"]) if data.get("threads") is not None else None,
            min_replicas=int(replicas.get("min", 1)),
            max_replicas=int(replicas.get("max", replicas.get("min", 1))),
            target_concurrency=int(target) if target is not None else None,
        )
        if kind not in ("latest", "all", "specific") or settings.latest < 1 or settings.max_batch_size < 1:
            raise ValueError(f"bad version_policy {policy!r} or max_batch_size")
        if settings.spin not in SPIN_POLICIES:
            raise ValueError(f"spin must be one of {', '.join(SPIN_POLICIES)}, not {settings.spin!r}")
        if (settings.threads is not None and settings.threads < 1) or settings.max_queue_delay_ms < 0:
            raise ValueError("threads must be at least 1 and max_queue_delay_ms at least 0")
        if not 1 <= settings.min_replicas <= settings.max_replicas or (target is not None and int(target) < 1):
            raise ValueError("replicas need 1 <= min <= max, and target_concurrency at least 1")
    except (TypeError, ValueError) as exc:
        raise InputError(f"{path}: {exc}") from exc
    return settings
