"""The model registry: which versions are loaded, and their lifecycle.

A version is loaded and warmed (one inference on its reference samples) in a worker thread before
it becomes visible; only then is the version it replaces removed, and that one is closed after
its in-flight requests finish. A version that fails to load is recorded (logs, metrics, index)
and the previous one keeps serving; it is retried when its files change.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from unideploy.errors import UnideployError, first_line
from unideploy.package import Artifact, Package
from unideploy.package.signing import TrustedSigners, verify_signature
from unideploy.runtimes import RuntimeOptions, cuda_api
from unideploy.runtimes.base import Runtime, usable_cores
from unideploy.runtimes.batch_buckets import bucket_seconds, default_buckets
from unideploy.runtimes.device_batches import DeviceBatches
from unideploy.runtimes.pinned import PinnedBuffers
from unideploy.runtimes.selection import open_runtime, what_ran
from unideploy.samples import Axes, resize_batch
from unideploy.server.batching import DynamicBatcher, Tensors, inline_bytes, output_batch_axes
from unideploy.server.config import ModelSettings
from unideploy.server.errors import NotFound, Unavailable
from unideploy.server.memory import release_free_memory
from unideploy.server.metrics import ServerMetrics
from unideploy.server.repository import ModelSource, VersionSource, scan
from unideploy.server.routing import Routing, load_routing
from unideploy.signature import Signature

log = logging.getLogger("unideploy.server")


@dataclass(eq=False)
class ServedVersion:
    model: str
    version: str
    source: VersionSource
    package: Package
    runtime: Runtime
    lanes: list[Runtime]  # more sessions of the same artifact, for requests that queue (model.yaml's lanes)
    batcher: DynamicBatcher  # every call to runtime and lanes goes through it
    settings: ModelSettings  # the model.yaml it was loaded under
    sample: dict[str, Any] = field(default_factory=dict)  # its warm-up request, run again to shrink it
    ran: dict[str, Any] = field(default_factory=dict)  # selection.what_ran: artifact, providers, precision
    in_flight: int = 0
    ran_since_release: bool = False  # only a version that ran since the last release has grown
    drained: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def signature(self) -> Signature:
        return self.runtime.signature

    @property
    def runtimes(self) -> tuple[Runtime, ...]:
        """Every runtime this version opened."""
        return (self.runtime, *self.lanes)

    def close(self) -> None:
        self.batcher.close()
        for runtime in self.runtimes:
            runtime.close()
        self.package.close()


def pinned_buffers(asked: bool | None, ran: dict[str, Any], served_as: str) -> type[PinnedBuffers] | None:
    """Page-locked batch buffers where a GPU runs the version, unless ``pinned_memory: false``
    (``asked``); ``ran`` records whether they are on, or off and why (a CPU model only when they
    were asked for by name, which also logs why not)."""
    on_gpu = ran.get("device") == "gpu"
    if asked is False or not (on_gpu or asked):
        return None
    why_not = cuda_api.problem() if on_gpu else "the model runs on the CPU"
    ran["pinned_memory"] = f"off: {why_not}" if why_not else "on"
    if why_not and asked:
        log.warning("%s: pinned_memory is off: %s", served_as, why_not)
    return None if why_not else PinnedBuffers


def device_batches(asked: bool, runtime: Runtime, ran: dict[str, Any], served_as: str) -> DeviceBatches | None:
    """Inputs in shared memory merged in GPU memory by the GPU's copies where a GPU runs the version
    and its runtime reads batches there, unless ``device_batches: false`` (``asked``); ``ran`` says
    on, or off and why, and is told if a CUDA call turns them off while serving (with a warning)."""
    if not asked or ran.get("device") != "gpu":
        return None
    if not runtime.takes_device_batches:
        ran["device_batches"] = f"off: {runtime.name} on this artifact reads batches from host memory only"
        return None
    if why_not := cuda_api.problem():
        ran["device_batches"] = f"off: {why_not}"
        return None
    ran["device_batches"] = "on"

    def turned_off(why: str) -> None:
        ran["device_batches"] = f"off: {why}"
        log.warning("%s: inputs in shared memory are merged on the host from now on: %s", served_as, why)

    return DeviceBatches(on_failure=turned_off)


@dataclass
class ServedModel:
    name: str
    settings: ModelSettings = field(default_factory=ModelSettings)
    versions: dict[str, ServedVersion] = field(default_factory=dict)
    # version -> ((fingerprint, transient files, settings) it failed on, reason)
    failures: dict[str, tuple[tuple, str]] = field(default_factory=dict)
    routing: Routing | None = None
    routing_error: str | None = None


def mergeable(
    runtime: Runtime, sample: Tensors, answered: Tensors, served_as: str
) -> tuple[Axes | None, dict[str, int] | None]:
    """Where a version's requests are merged: each input's batch axis (by the batch dimension's
    name: recurrent state ``[2, batch, H]`` merges along axis 1) and each output's, measured on the
    warm-up sample and what it ``answered`` (``output_batch_axes``). (None, None) where requests
    cannot be merged: no dynamic batch, an input without the batch dimension, or an output that does
    not grow by rows."""
    signature = runtime.signature
    axes = signature.batch_axes
    if signature.batch_dim is None or any(axes[t.name] is None and t.shape for t in signature.inputs):
        return None, None
    try:
        return axes, output_batch_axes(runtime.run, sample, answered, axes)
    except Exception as exc:  # a model that cannot run one row more cannot take merged batches either
        log.warning(
            "%s: requests are not merged: its warm-up sample failed at one row more (%s)", served_as, first_line(exc)
        )
        return None, None


class ModelRegistry:
    def __init__(
        self,
        repository: Path,
        executor: Executor,
        metrics: ServerMetrics,
        trusted: TrustedSigners | None = None,
        model_name: str | None = None,
        run_memory: int | None = None,
    ) -> None:
        self.repository = repository
        self.run_memory = run_memory  # the most the CPU runs of every model may hold at once (None: no cap)
        self.model_name = model_name  # REPO is this one model (server/repository.py)
        self.trusted = trusted  # when set, only versions signed by these are loaded
        self.executor = executor
        self.metrics = metrics
        self.models: dict[str, ServedModel] = {}
        self.unloaded: set[str] = set()  # models unloaded through the API: the watcher leaves them
        self.rng = random.Random()
        self._lock = asyncio.Lock()

    # -- lookups -----------------------------------------------------------------------------
    def get(self, name: str, version: str | None = None) -> ServedVersion:
        model = self.models.get(name)
        if model is None or not model.versions:
            if model is not None and model.failures:
                raise Unavailable(
                    f"model '{name}' has no version that loaded: "
                    + "; ".join(f"version {v}: {r}" for v, (_, r) in model.failures.items())
                )
            raise NotFound(f"unknown model '{name}'", f"models: {', '.join(sorted(self.ready_models())) or 'none'}")
        if version:
            if version not in model.versions:
                raise NotFound(
                    f"model '{name}' has no version '{version}' loaded", f"loaded versions: {', '.join(model.versions)}"
                )
            return model.versions[version]
        return model.versions[max(model.versions, key=int)]

    def scan(self) -> dict[str, ModelSource]:
        """What the repository on disk asks to be served now."""
        return scan(self.repository, self.model_name)

    def ready_models(self) -> list[str]:
        return [n for n, m in self.models.items() if m.versions]

    # -- lifecycle ---------------------------------------------------------------------------
    async def sync(self, only: str | None = None) -> None:
        """Make the loaded versions match the repository (and routing files)."""
        async with self._lock:
            sources = await asyncio.get_running_loop().run_in_executor(self.executor, self.scan)
            for name, source in sources.items():
                if (only and name != only) or name in self.unloaded:
                    continue
                await self._sync_model(source)
            for name in list(self.models):
                if name not in sources and (only is None or name == only):
                    await self._unload_model(name)

    async def _sync_model(self, source: ModelSource) -> None:
        model = self.models.setdefault(source.name, ServedModel(source.name))
        model.settings = source.settings
        try:
            model.routing, model.routing_error = load_routing(source.directory), None
        except UnideployError as exc:  # keep the last good routing
            if model.routing_error != str(exc):
                log.error("model %s: routing not changed: %s", source.name, exc)
            model.routing_error = str(exc)
        # Versions that failed on their current files do not count for the policy (unless their
        # previous files still serve), so a broken new version leaves the previous one serving.
        # Selection is redone after each round of loads.
        routed = set(model.routing.versions) & set(source.versions) if model.routing else set()
        while True:
            usable = [v for v in source.versions if v in model.versions or not self._failed(model, source.versions[v])]
            wanted = set(source.settings.select(usable)) | {v for v in routed if v in usable}
            pending = [
                v
                for v in sorted(wanted, key=int)
                if not self._failed(model, source.versions[v])
                and (
                    v not in model.versions
                    or model.versions[v].source.fingerprint != source.versions[v].fingerprint
                    or model.versions[v].settings != model.settings
                )
            ]
            if not pending:
                break
            for version in pending:
                await self._load(model, source.versions[version])
        for version in [v for v in model.versions if v not in wanted]:
            await self._retire(model, model.versions.pop(version))
        for version in [v for v in model.failures if v not in source.versions]:
            del model.failures[version]

    @staticmethod
    def _failed(model: ServedModel, src: VersionSource) -> bool:
        """Failed already on these very files under these very settings (retried when either changes,
        or when transient files that were there have gone)."""
        failed = model.failures.get(src.version)
        return failed is not None and failed[0] == (src.fingerprint, src.transient, model.settings)

    async def _load(self, model: ServedModel, src: VersionSource) -> None:
        start = time.perf_counter()
        try:
            served = await asyncio.get_running_loop().run_in_executor(self.executor, self._open, src, model.settings)
        except Exception as exc:  # any failure to load must leave the old version serving
            reason = str(exc) if isinstance(exc, UnideployError) else f"{type(exc).__name__}: {exc}"
            model.failures[src.version] = ((src.fingerprint, src.transient, model.settings), reason)
            self.metrics.load_failures.labels(model.name, src.version).inc()
            serving = sorted(model.versions, key=int)
            log.error(
                "model %s version %s failed to load (%s): %s",
                model.name,
                src.version,
                f"version(s) {', '.join(serving)} keep serving" if serving else "no version of it serves",
                reason,
            )
            await self._release_heaps()  # a failed load may have built an engine before failing
            return
        old = model.versions.get(src.version)
        model.versions[src.version] = served  # visible only now, warmed
        model.failures.pop(src.version, None)
        self.metrics.ready.labels(model.name, src.version).set(1)
        self.metrics.engine_serving(model.name, src.version, served.ran)
        log.info(
            "model %s version %s ready in %.2fs (%s): %s",
            model.name,
            src.version,
            time.perf_counter() - start,
            "replaced" if old else "new",
            ", ".join(f"{k} {served.ran[k]}" for k in ("artifact", "device", "precision") if k in served.ran),
        )
        if old is not None:
            await self._retire(model, old)
        await self._release_heaps()

    async def _release_heaps(self) -> None:
        """After a load (kept or failed) or an unload: the heaps give back what it freed."""
        await asyncio.get_running_loop().run_in_executor(self.executor, release_free_memory)

    def _open(self, src: VersionSource, settings: ModelSettings) -> ServedVersion:
        package = Package.open(src.path)
        opened: list[Runtime] = []  # closed again if anything fails (a TensorRT engine holds GPU memory)

        def warmed(options: RuntimeOptions) -> tuple[Artifact, Runtime, float, Tensors, dict[int, float]]:
            """A session of the served artifact, run once on the sample: the first inference pays for
            allocations (and, for an engine with batch buckets, once at each bucket's size: a
            bucket's first call plans its kernels, about a second on a GPU; each bucket is then
            timed, for the batcher's ``cut_at_bucket``). Also returns the artifact it runs, how long
            the sample's run took, what it answered and each bucket's call time."""
            artifact, engine = open_runtime(package, settings.artifact, options=options)
            opened.append(engine)
            started = time.perf_counter()
            answered = engine.run(sample)
            took = time.perf_counter() - started
            timed = bucket_seconds(  # along each input's batch axis (state [layers, batch, hidden]: 1)
                engine.run, lambda size: resize_batch(sample, size, engine.signature.batch_axes), engine.batch_buckets
            )
            return artifact, engine, took, answered, timed

        try:
            if self.trusted is not None:  # before any of its files is run
                verify_signature(package, self.trusted)
            sample = package.reference_samples()[0].inputs
            # No target: a GPU machine serves a package's TensorRT artifact, any other its ONNX one.
            buckets = (
                default_buckets(settings.max_batch_size) if settings.batch_buckets is None else settings.batch_buckets
            )
            options = RuntimeOptions(
                device=settings.device,
                spin=settings.spin,
                threads=settings.threads,
                shared_arena=True,
                arena_limit=self.run_memory,
                tf32=settings.tf32,
                batch_buckets=buckets,
                cuda_graphs=settings.cuda_graphs,
                graph_sessions=settings.graph_sessions,
            )
            artifact, runtime, warm_up_s, answered, buckets_s = warmed(options)
            # lanes share the threads one run would have (none for lanes: 1)
            share = replace(options, threads=max(1, (settings.threads or usable_cores()) // settings.lanes))
            lanes = [warmed(share)[1] for _ in range(settings.lanes if settings.lanes > 1 else 0)]
        except BaseException:
            for opened_runtime in opened:
                opened_runtime.close()
            package.close()
            raise
        ran = what_ran(artifact, runtime)  # the main session's account, not a lane's (fewer threads)
        # never merged past what the engine was built for (a TensorRT profile's max batch)
        rows = min(settings.max_batch_size, runtime.max_batch_size or settings.max_batch_size)
        served_as = f"model {src.model} version {src.version}"
        axes, output_axes = mergeable(runtime, sample, answered, served_as) if rows > 1 else (None, None)
        merges = rows if output_axes is not None and settings.lanes <= 1 else 0
        inline = inline_bytes(runtime.run, sample, warm_up_s, merges, axes)
        batcher = DynamicBatcher(
            runtime.run_checked,
            rows if output_axes is not None else 1,
            settings.max_queue_delay_ms / 1000.0,
            inline_bytes=inline,
            lanes=[lane.run_checked for lane in lanes],
            buckets=runtime.batch_buckets,
            bucket_seconds=buckets_s,
            in_flight=settings.batches_in_flight or (2 if ran.get("device") == "gpu" else 1),
            axes=axes,
            output_axes=output_axes,
            buffers=pinned_buffers(settings.pinned_memory, ran, served_as),
            readers=min(4, usable_cores() // 2),  # a merged batch's shared-memory inputs, side by side
            device_batches=device_batches(settings.device_batches, runtime, ran, served_as),
            served_as=served_as,
            on_call=self.metrics.calls(src.model, src.version).observe,
            on_failed=self.metrics.calls(src.model, src.version).failed,
        )
        for line in ran.get("passed_over", ()):
            log.warning("model %s version %s: passed over %s", src.model, src.version, line)
        if "fallback" in ran:
            log.warning("model %s version %s runs on the CPU: %s", src.model, src.version, ran["fallback"])
        if "cpu_nodes" in ran:
            log.warning("model %s version %s runs part of it on the CPU: %s", src.model, src.version, ran["cpu_nodes"])
        return ServedVersion(src.model, src.version, src, package, runtime, lanes, batcher, settings, sample, ran)

    async def _retire(self, model: ServedModel, served: ServedVersion) -> None:
        """Stop routing to a version, let its in-flight requests finish, then close it."""
        if model.versions.get(served.version) is served:
            del model.versions[served.version]
        if not any(v is served for v in model.versions.values()):
            self.metrics.ready.labels(model.name, served.version).set(0)
            self.metrics.engine_serving(model.name, served.version, None)
        if served.in_flight:
            await served.drained.wait()
        served.close()
        log.info("model %s version %s unloaded", model.name, served.version)

    async def _unload_model(self, name: str) -> None:
        model = self.models.pop(name, None)
        if model:
            for served in list(model.versions.values()):
                await self._retire(model, served)
            await self._release_heaps()

    async def load(self, name: str) -> None:
        self.unloaded.discard(name)
        await self.sync(only=name)
        if name not in self.models:
            raise NotFound(f"model '{name}' is not in the repository")
        if not self.models[name].versions:
            raise Unavailable(
                f"model '{name}' could not be loaded: " + "; ".join(r for _, r in self.models[name].failures.values())
            )

    async def unload(self, name: str) -> None:
        if name not in self.models:
            raise NotFound(f"model '{name}' is not loaded")
        self.unloaded.add(name)
        async with self._lock:
            await self._unload_model(name)

    def release_memory(self) -> None:
        """Give back what traffic left resident: the growth of each engine that ran since the last
        release (a run of its warm-up request that shrinks it; idle versions are not run), then
        the heaps' free pages. Called when traffic stops (``memory.release_after_bursts``), on a
        worker thread."""
        for model in list(self.models.values()):
            for served in list(model.versions.values()):
                if not served.ran_since_release:
                    continue
                served.ran_since_release = False
                try:
                    for runtime in served.runtimes:
                        runtime.shrink(served.sample)
                except Exception as exc:  # giving memory back must never take a model down
                    log.warning("model %s version %s could not shrink: %s", served.model, served.version, exc)
        release_free_memory()

    async def close(self) -> None:
        for name in list(self.models):
            await self._unload_model(name)
