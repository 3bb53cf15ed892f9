"""Server settings, as typed settings models: each field documented once, every file checked
against them (an unknown or misspelt key is an error that names it and the valid ones).

- ``ServerConfig``: ``deploy serve``'s options. The command line wins over ``UNIDEPLOY_<FIELD>``
  environment variables (``UNIDEPLOY_HTTP_PORT=9000``, and the two tokens, which belong there
  rather than on a command line every user can read), which win over ``--config FILE`` (YAML),
  which wins over the defaults.
- ``ModelFile``: ``REPO/<model>/model.yaml``, read into the ``ModelSettings`` the server uses.
- ``routing.yaml``: ``server/routing.py``.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from unideploy.errors import InputError
from unideploy.runtimes.base import SPIN_POLICIES

if TYPE_CHECKING:
    from unideploy.package.signing import TrustedSigners

DEFAULT_MAX_REQUEST_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_REQUEST_ROWS = 4096
# a request of a few bytes a row can ask for far more: a language model's logits are 200 KB a token
DEFAULT_MAX_RESPONSE_BYTES = 256 * 1024 * 1024
DEFAULT_MAX_SEQUENCES = 1024  # live sequences of streaming models, all models together
DEFAULT_SEQUENCE_IDLE_S = 60.0  # a sequence idle this long may be reclaimed for a new one
ENV_PREFIX = "UNIDEPLOY_"
Device = Literal["auto", "cpu", "gpu"]  # where a model runs (RuntimeOptions.device)


def is_remote(repository: str | Path) -> bool:
    """A repository given as a URL (s3://, gs://, ...) rather than a local folder."""
    return isinstance(repository, str) and "://" in repository


def settings_error(where: str, exc: ValidationError, model: type[BaseModel]) -> InputError:
    """A validation failure as one line: unknown keys by name with the valid ones, then each bad value."""
    unknown = [".".join(map(str, e["loc"])) for e in exc.errors() if e["type"] == "extra_forbidden"]
    problems = [
        (f"{'.'.join(map(str, e['loc']))}: " if e["loc"] else "")
        + (str(e["ctx"]["error"]) if e["type"] == "value_error" else e["msg"])
        for e in exc.errors()
        if e["type"] != "extra_forbidden"
    ]
    parts = ([f"unknown setting(s) {', '.join(unknown)}"] if unknown else []) + problems
    return InputError(f"{where}: {'; '.join(parts)}", f"known: {', '.join(model.model_fields)}" if unknown else None)


_FILE_VALUES: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("config_file", default=None)


class _ConfigFile(PydanticBaseSettingsSource):
    """The ``--config`` file's values, below the environment's."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return (_FILE_VALUES.get() or {}).get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_FILE_VALUES.get() or {})


@contextmanager
def _file_values(values: dict[str, Any]) -> Iterator[None]:
    token = _FILE_VALUES.set(values)
    try:
        yield
    finally:
        _FILE_VALUES.reset(token)


class ServerConfig(BaseSettings):
    """``deploy serve``'s settings (``docs/server.md``)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid")

    repository: Path | str = Field(description="a local folder, or a URL (s3://bucket/prefix, gs://...)")
    model_name: str | None = Field(None, description="the repository is this one model's folder or package")
    host: str = Field("127.0.0.1", description="address both frontends listen on")
    http_port: int = Field(8000, ge=0, le=65535, description="REST port")
    grpc_port: int = Field(8001, ge=0, le=65535, description="gRPC port")
    poll_interval_s: float = Field(2.0, ge=0, description="seconds between repository scans; 0 turns watching off")
    max_request_bytes: int = Field(
        DEFAULT_MAX_REQUEST_BYTES,
        ge=1,
        description="largest request, both protocols: its body, and its inputs in shared memory",
    )
    max_request_rows: int = Field(DEFAULT_MAX_REQUEST_ROWS, ge=1, description="most rows (batch dimension) per request")
    max_response_bytes: int = Field(
        DEFAULT_MAX_RESPONSE_BYTES,
        ge=1,
        description="largest answer, its outputs' bytes: refused before the model runs where the signature says "
        "their sizes, else before it is encoded",
    )
    max_run_memory: int | None = Field(
        None,
        ge=1,
        description="most bytes the models' runs may hold at once on the CPU (their activations and answers in "
        "ONNX Runtime's shared arena, not their weights): a run needing more fails, 400 / RESOURCE_EXHAUSTED, "
        "instead of the machine running out; default: three quarters of the memory the server may use",
    )
    max_sequences: int = Field(
        DEFAULT_MAX_SEQUENCES,
        ge=1,
        description="live sequences of streaming models at once, each holding its state in the server (a new "
        "one beyond them: 429, after idle ones are reclaimed)",
    )
    sequence_idle_s: float = Field(
        DEFAULT_SEQUENCE_IDLE_S,
        gt=0,
        description="seconds a sequence may go without a call before its slot and state may be reclaimed",
    )
    sequence_header: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$",
        description="the header a load balancer in front routes by (consistent hashing), so that a sequence's "
        "calls reach the replica holding its state: each must carry its sequence_id there, or is refused (400); "
        "under --ray, Ray Serve's session header (x-session-id, or RAY_SERVE_SESSION_ID_HEADER_KEY)",
    )
    inference_token: str | None = Field(None, description="bearer token for inference and metadata")
    repository_token: str | None = Field(None, description="bearer token for the repository and routing APIs")
    tls_cert: Path | None = Field(None, description="PEM certificate: both ports over TLS (with tls_key)")
    tls_key: Path | None = Field(None, description="PEM private key for tls_cert")
    workers: int = Field(
        4,
        ge=1,
        description="threads for loading versions and scanning the repository (each version runs its calls on its own)",
    )
    body_timeout_s: float = Field(30.0, gt=0, description="a REST body not fully arrived by then is answered 408")
    max_connections: int = Field(
        512,
        ge=1,
        description="REST connections at once (more are answered 503), and as many gRPC calls (more are answered "
        "RESOURCE_EXHAUSTED); shared out among front ends",
    )
    max_header_bytes: int = Field(
        65536, ge=1024, description="largest REST request line and headers together (more are answered 431)"
    )
    max_headers: int = Field(100, ge=1, description="most REST request headers (more are answered 431)")
    header_timeout_s: float = Field(
        15.0,
        gt=0,
        description="seconds a REST request's headers may take (later: 408, and the connection closed), and a "
        "new gRPC connection its handshake (later: closed)",
    )
    grpc_idle_timeout_s: float = Field(
        300.0,
        gt=0,
        description="seconds a gRPC connection may stay open with no call (then closed with GOAWAY; clients "
        "reconnect on their next call)",
    )
    shared_memory: Literal["off", "system", "cuda"] = Field(
        "system",
        description="tensors through POSIX shared memory registered by co-located clients (Triton's system "
        "shared memory extension; registration is authorized like inference); cuda: GPU memory too (its CUDA "
        "shared memory extension, on a GPU machine); off refuses both",
    )
    frontends: int | None = Field(
        None,
        ge=0,
        le=64,
        description="processes that decode and encode requests for the one that runs the models (both ports "
        "shared); 0: this process does it all; default: from the cores (docs/server.md, Front-end processes)",
    )
    switch_interval_us: float = Field(
        20.0,
        gt=0,
        le=100_000,
        description="microseconds after which a thread waiting for Python's GIL (a batch whose run has ended) "
        "makes the thread holding it (the event loop) hand it over: sys.setswitchinterval in the model "
        "process, CPython's default 5000; a busy event loop otherwise keeps a finished batch waiting until it "
        "idles (docs/server.md, The GIL between the event loop and batch threads)",
    )
    require_signed: bool = Field(False, description="load only versions signed by trusted_key or trusted_chain")
    trusted_key: Path | None = Field(None, description="public key versions must be signed with")
    trusted_chain: tuple[Path, ...] = Field((), description="certificate chain a signing certificate must lead to")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, _ConfigFile(settings_cls)

    @classmethod
    def load(cls, config_file: Path | None = None, **options: Any) -> ServerConfig:
        """Settings from the command line's ``options`` (None: not given), the environment and
        ``config_file``; any problem is one InputError naming the setting."""
        given = {k: v for k, v in options.items() if v is not None}
        values = load_yaml(config_file) if config_file is not None else {}
        where = str(config_file) if config_file is not None else "server settings"
        try:
            with _file_values(values):
                return cls(**given)
        except ValidationError as exc:
            raise settings_error(where, exc, cls) from None

    @field_validator("inference_token", "repository_token", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        return value or None

    @field_validator("repository", mode="after")
    @classmethod
    def _local_path(cls, value: Path | str) -> Path | str:
        return value if is_remote(value) else Path(value)

    @model_validator(mode="after")
    def _consistent(self) -> ServerConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise InputError("TLS needs both --tls-cert and --tls-key")
        if (self.trusted_key or self.trusted_chain) and not self.require_signed:
            raise InputError(
                "--trusted-key and --trusted-chain apply with --require-signed", "add --require-signed, or drop them"
            )
        return self

    def frontend_count(self) -> int:
        """``frontends``, or the default for this machine's cores."""
        if self.frontends is not None:
            return self.frontends
        from unideploy.runtimes.base import usable_cores

        return default_frontends(usable_cores())

    def run_memory(self) -> int:
        """``max_run_memory``, or three quarters of the memory this process may use (its cgroup's
        limit, else the machine's): the rest is the weights', the interpreter's and the requests'."""
        if self.max_run_memory is not None:
            return self.max_run_memory
        from unideploy.runtimes.base import usable_memory

        return usable_memory() * 3 // 4

    def trusted_signers(self) -> TrustedSigners | None:
        """Who versions must be signed by, or None when signatures are not required."""
        if not self.require_signed:
            return None
        from unideploy.package.signing import TrustedSigners

        return TrustedSigners(self.trusted_key, self.trusted_chain)  # refuses neither or both


def default_frontends(cores: int) -> int:
    """One front end per four cores beyond the first four, at most eight; none below eight cores,
    where the hop to the model process costs more than a second interpreter gains (docs/server.md)."""
    return min(8, max(0, (cores - 4) // 4))


@dataclass(frozen=True)
class ModelSettings:
    """What the server does with one model, read from its ``model.yaml`` (``ModelFile``)."""

    policy: str = "latest"  # latest, all, specific
    latest: int = 1
    specific: tuple[str, ...] = ()
    max_batch_size: int = 32
    max_queue_delay_ms: float = 0.0
    artifact: str | None = None
    spin: str = "run"  # measured on 2 cores: docs/server.md, "Threads and spinning"
    threads: int | None = None
    lanes: int = 1  # sessions that run queued requests side by side (batching.DynamicBatcher)
    # GPU engines that pay for each new shape pad calls to these batch sizes (runtimes/batch_buckets.py);
    # None: 1, 8, 64, ... up to max_batch_size and that size; (): every size as it comes
    batch_buckets: tuple[int, ...] | None = None
    tf32: bool = False  # fp32 artifacts computed in TF32 on a GPU
    # batch buckets replay captured CUDA graphs (runtimes/ort_bound.py); None: wherever buckets run
    cuda_graphs: bool | None = None
    graph_sessions: int = 1  # sessions per bucket replaying its graph (runtimes/ort_bound.GraphSessions)
    device: Device = "auto"  # where the model runs: auto (the GPU where one is usable), cpu or gpu
    batches_in_flight: int | None = None  # merged batches run at once; None: 2 on a GPU, 1 on the CPU
    pinned_memory: bool | None = None  # merged batches in page-locked buffers (runtimes/pinned.py); None: on a GPU
    device_batches: bool = (
        True  # inputs in shared memory merged in GPU memory by its copies (runtimes/device_batches.py)
    )
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


class StrictModel(BaseModel):
    """A settings file's model: unknown keys and non-finite numbers are errors."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class VersionPolicy(StrictModel):
    """Exactly one of: the newest N versions, all of them, or the ones named."""

    latest: int | None = Field(None, ge=1, description="serve the newest N versions")
    all: bool | None = Field(None, description="serve every version on disk")
    specific: list[Annotated[int, Field(ge=0)]] | None = Field(None, description="serve these versions")

    @model_validator(mode="after")
    def _one(self) -> VersionPolicy:
        if sum(v is not None for v in (self.latest, self.all, self.specific)) != 1:
            raise ValueError("give one of latest, all, specific")
        return self


class Replicas(StrictModel):
    """Scale-out bounds (``deploy kserve``, ``deploy serve --ray``)."""

    min: int = Field(1, ge=1, description="replicas always running")
    max: int | None = Field(None, ge=1, description="most replicas (default: min)")
    target_concurrency: int | None = Field(None, ge=1, description="requests in flight per replica to scale on")

    @model_validator(mode="after")
    def _ordered(self) -> Replicas:
        if self.max is not None and self.max < self.min:
            raise ValueError("max must be at least min")
        return self


class ModelFile(StrictModel):
    """``REPO/<model>/model.yaml``: every key optional; edits reload the model's versions."""

    version_policy: VersionPolicy = Field(
        default_factory=lambda: VersionPolicy(latest=1),
        description="which versions serve: {latest: N}, {all: true} or {specific: [...]}",
    )
    max_batch_size: int = Field(
        32,
        ge=1,
        description="the most rows of one runtime call: requests merged up to it, a larger one run in calls of it",
    )
    max_queue_delay_ms: float = Field(
        0.0,
        ge=0,
        description="how long a request may wait for others to join it "
        "(0: only requests that queued while the model was busy merge)",
    )
    artifact: str | None = Field(
        None, description="which artifact of each package to serve (default: the first one this machine can run)"
    )
    spin: str = Field(
        "run",
        description="ONNX Runtime's worker threads busy-wait within a run only (run), "
        "between runs too (always), or never",
    )
    threads: int | None = Field(None, ge=1, description="intra-op threads per run (default: one per core)")
    lanes: int = Field(
        1,
        ge=1,
        description="when requests queue, run them side by side on this many more sessions of "
        "threads/lanes threads each, one request per run, instead of merging them "
        "(a lone request still runs with every thread); 1: off",
    )
    batch_buckets: list[Annotated[int, Field(ge=1)]] | None = Field(
        None,
        description="on a GPU (ONNX Runtime's CUDA provider): the batch sizes merged batches are padded to, "
        "each run by a session of its own, since every new input shape costs that provider a re-plan "
        "(default: 1, 8, 64, ... up to max_batch_size, and that size: 1, 8, 32 for 32; []: every size as it comes)",
    )
    tf32: bool = Field(
        False, description="on a GPU, compute fp32 artifacts in TF32 (faster, about 1e-3 relative error)"
    )
    cuda_graphs: bool | None = Field(
        None,
        description="on a GPU (ONNX Runtime's CUDA provider): batch buckets' sessions capture their calls as a "
        "CUDA graph at load and replay it, inputs and outputs in GPU buffers bound once; where a graph "
        "cannot be captured (a node left to the CPU), plain sessions run and the model's metadata says why "
        "(default: the bucket of one row only, where a call is mostly kernel launches; larger buckets run "
        "plain sessions, which the batches in flight run side by side, where a graph's runs take turns; "
        "true: every bucket; false: none)",
    )
    graph_sessions: int = Field(
        1,
        ge=1,
        le=8,
        description="with cuda_graphs, sessions per batch bucket replaying its graph, each on a thread of its "
        "own: ONNX Runtime runs one session's graph one call at a time, so with 1 the batches in flight "
        "of one bucket take turns; each more is another bucket's memory (about 50-75 MB of the host's and "
        "550 MB of the GPU's for EfficientNet-Lite0 on an H200)",
    )
    device: Device = Field(
        "auto",
        description="where the model runs: auto (a GPU where one is usable, else the CPU, named in its metadata), "
        "cpu (keeps a model off a GPU host's GPU), or gpu (refused to load where no GPU runs it)",
    )
    batches_in_flight: int | None = Field(
        None,
        ge=1,
        description="merged batches run at once, each on a thread of its own (Triton's instance count): "
        "a GPU session waits on the device and on copies, so a second batch keeps it busy "
        "(default: 2 on a GPU, 1 on the CPU, whose runs take every core)",
    )
    pinned_memory: bool | None = Field(
        None,
        description="on a GPU, write merged batches into page-locked host buffers kept for reuse, which the "
        "GPU copies from directly (needs cuda-bindings; the model's metadata says on, or off and why); "
        "default: on wherever a GPU runs the model; false: off",
    )
    device_batches: bool = Field(
        True,
        description="on a GPU, merge the inputs clients keep in shared memory in GPU memory, copied there by "
        "the GPU (from CUDA regions device to device, from system segments page-locked for it), so the "
        "server's CPU copies none (the model's metadata says on, or off and why); false: read on the host",
    )
    replicas: Annotated[int, Field(ge=1)] | Replicas = Field(
        1, description="scale-out: a fixed count, or {min, max, target_concurrency}"
    )

    @model_validator(mode="after")
    def _buckets_fit(self) -> ModelFile:
        too_large = [b for b in self.batch_buckets or () if b > self.max_batch_size]
        if too_large:
            raise ValueError(
                f"batch_buckets {too_large} exceed max_batch_size {self.max_batch_size}: no merged batch reaches them"
            )
        return self

    @model_validator(mode="after")
    def _lanes_do_not_merge(self) -> ModelFile:
        if self.lanes > 1 and self.max_queue_delay_ms > 0:
            raise ValueError(
                "lanes run queued requests side by side instead of merging them, so max_queue_delay_ms "
                "would never apply: give lanes 1 to merge, or leave max_queue_delay_ms out"
            )
        return self

    @model_validator(mode="after")
    def _graph_sessions_need_graphs(self) -> ModelFile:
        if self.graph_sessions > 1 and (self.cuda_graphs is False or self.batch_buckets == []):
            raise ValueError(
                "graph_sessions are sessions per batch bucket replaying its CUDA graph, so they need both: "
                "drop cuda_graphs: false and batch_buckets: [], or leave graph_sessions out"
            )
        return self

    @field_validator("cuda_graphs", mode="before")
    @classmethod
    def _graphs_layout(cls, value: Any) -> Any:
        if value == "one-session":  # on main for a day (2026-11-28): say what became of it
            raise ValueError(
                "one-session was withdrawn: one session replaying every bucket's graph crashed EfficientNet-Lite0 "
                "with CUDA error 715 on an H200 (docs/gpu.md); use true (a graph per bucket's session, the "
                "default on a GPU) or false"
            )
        return value

    @field_validator("spin")
    @classmethod
    def _spin_policy(cls, value: str) -> str:
        if value not in SPIN_POLICIES:
            raise ValueError(f"spin must be one of {', '.join(SPIN_POLICIES)}")
        return value

    def settings(self) -> ModelSettings:
        policy = self.version_policy
        kind = "latest" if policy.latest is not None else "all" if policy.all is not None else "specific"
        replicas = self.replicas if isinstance(self.replicas, Replicas) else Replicas(min=self.replicas)
        return ModelSettings(
            policy=kind,
            latest=policy.latest or 1,
            specific=tuple(str(v) for v in policy.specific or ()),
            max_batch_size=self.max_batch_size,
            max_queue_delay_ms=self.max_queue_delay_ms,
            artifact=self.artifact,
            spin=self.spin,
            threads=self.threads,
            lanes=self.lanes,
            batch_buckets=None if self.batch_buckets is None else tuple(sorted(set(self.batch_buckets))),
            tf32=self.tf32,
            cuda_graphs=self.cuda_graphs,
            graph_sessions=self.graph_sessions,
            device=self.device,
            batches_in_flight=self.batches_in_flight,
            pinned_memory=self.pinned_memory,
            device_batches=self.device_batches,
            min_replicas=replicas.min,
            max_replicas=replicas.max or replicas.min,
            target_concurrency=replicas.target_concurrency,
        )


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
    try:
        return ModelFile.model_validate(load_yaml(path)).settings()
    except ValidationError as exc:
        raise settings_error(str(path), exc, ModelFile) from None
