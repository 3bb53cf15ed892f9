"""The protocol-independent core: REST and gRPC both call this, so they behave identically.

It never knows the wire format (tensors arrive as numpy) and never knows the framework (models
are runtimes behind the registry).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

import unideploy
from unideploy.errors import InputError, UnideployError
from unideploy.samples import batch_size_of
from unideploy.server.batching import Inputs
from unideploy.server.codec import NUMPY_TO_V2
from unideploy.server.config import (
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_MAX_SEQUENCES,
    DEFAULT_SEQUENCE_IDLE_S,
)
from unideploy.server.errors import BadRequest, TooLarge, Unavailable
from unideploy.server.metrics import RequestSeries, ServerMetrics
from unideploy.server.models import ModelRegistry, ServedModel, ServedVersion
from unideploy.server.repository_api import RepositoryAPI
from unideploy.server.sequences import Sequence, SequenceControl, SequenceStates
from unideploy.server.shared_memory import Placed, Placement, SharedMemoryRegions, Written
from unideploy.server.unread import Unread
from unideploy.signature import STRING, Signature

log = logging.getLogger("unideploy.server")
EXTENSIONS = ["binary_tensor_data", "model_repository", "statistics_metrics", "ab_routing"]
# Triton's statistics extension: a server answering for its own versions lists it (perf_analyzer then
# reads the statistics around each window); Ray Serve's front does not, its replicas counting apart
STATISTICS = "statistics"


def _ran_parameters(ran: Mapping[str, Any]) -> dict[str, str]:
    """What a version runs on (``selection.what_ran``), as the string parameters REST metadata and
    Triton-style configs carry: the providers it got, not those asked for, and any fallback."""
    shown = (
        "artifact",
        "runtime",
        "device",
        "providers",
        "precision",
        "spin",
        "batch_buckets",
        "cuda_graphs",
        "pinned_memory",
        "device_batches",
        "fallback",
        "cpu_nodes",
        "passed_over",
    )
    return {
        key: "; ".join(map(str, ran[key])) if isinstance(ran[key], list) else str(ran[key])
        for key in shown
        if key in ran
    }


def server_metadata(extensions: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"name": "unideploy", "version": unideploy.__version__, "extensions": EXTENSIONS + list(extensions)}


@dataclass
class InferRequest:
    """A decoded request, as either protocol (or a front-end process) hands it to the dataplane."""

    model: str
    version: str | None
    inputs: dict[str, Any]  # name -> array, or Placed (and, between processes, frontends.slots.Slotted)
    requested: list[str] | None  # the outputs asked for; None: every output
    placed: dict[str, Placement]  # outputs to write into the client's shared memory
    headers: Mapping[str, str]  # what A/B routing may read
    protocol: str
    decode_s: float = 0.0  # the seconds its protocol took to decode it
    sequence: SequenceControl | None = None  # its place in a streaming model's sequence (sequences.py)


@dataclass
class InferResult:
    model: str
    version: str
    variant: str | None
    outputs: dict[str, np.ndarray | Written]  # in the order to answer them; Written: in the client's region
    received: float  # perf_counter when decoding the request began: the server's total time counts from it
    series: RequestSeries | None  # where its stages are recorded (None in a front end: the model process does)


class DataPlaneAPI(Protocol):
    """What the protocols call: the dataplane in this process (``DataPlane``), or the model
    process's, through a front end's connection to it (``frontends.client.RemoteDataPlane``)."""

    async def live(self) -> bool: ...
    async def ready(self) -> bool: ...
    async def server_metadata(self) -> dict[str, Any]: ...
    async def model_ready(self, name: str, version: str | None) -> bool: ...
    async def model_metadata(self, name: str, version: str | None) -> dict[str, Any]: ...
    async def model_config(self, name: str, version: str | None) -> dict[str, Any]: ...
    async def model_statistics(self, name: str | None, version: str | None) -> dict[str, Any]: ...
    async def metrics_text(self) -> bytes: ...
    async def shm_status(self, region: str | None, kind: str = "system") -> list[dict[str, Any]]: ...
    async def shm_register(self, region: str, key: Any, offset: Any, byte_size: Any) -> None: ...
    async def cuda_shm_register(self, region: str, raw_handle: Any, device_id: Any, byte_size: Any) -> None: ...
    async def shm_unregister(self, region: str | None, kind: str = "system") -> None: ...
    async def repository_index(self, ready_only: bool) -> list[dict[str, Any]]: ...
    async def repository_load(self, name: str) -> None: ...
    async def repository_unload(self, name: str) -> None: ...
    async def routing(self, name: str) -> dict[str, Any] | None: ...
    async def set_routing(self, name: str, document: Any) -> dict[str, Any]: ...
    async def infer(self, request: InferRequest) -> InferResult: ...
    def encoded(self, result: InferResult, encode_s: float) -> None: ...


# What a front end may ask the model process to call, besides inference (``frontends.hub``).
REMOTE_CALLS = frozenset(
    name for name in DataPlaneAPI.__dict__ if not name.startswith("_") and name not in ("infer", "encoded", "live")
)


class DataPlane:
    def __init__(
        self,
        registry: ModelRegistry,
        metrics: ServerMetrics,
        max_request_rows: int,
        shared_memory: str = "system",
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        sequences: SequenceStates | None = None,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        self.registry = registry
        self.shared_memory = SharedMemoryRegions(shared_memory)  # the system and CUDA shared memory extensions
        self.repository = RepositoryAPI(registry)  # the repository and routing extensions
        self.metrics = metrics
        self.max_request_rows = max_request_rows
        self.max_request_bytes = max_request_bytes  # a request's tensors, in its body or in shared memory
        self.max_response_bytes = max_response_bytes  # the outputs computed for it
        # the live sequences of streaming models, with their state (Triton's implicit state)
        self.sequences = (
            sequences if sequences is not None else SequenceStates(DEFAULT_MAX_SEQUENCES, DEFAULT_SEQUENCE_IDLE_S)
        )
        metrics.sequences.set_function(lambda: len(self.sequences))
        self._shadow_tasks: set[asyncio.Task] = set()
        self.runs_finished = 0  # runtime calls, for giving memory back once traffic stops
        self.runs_running = 0

    # -- health and metadata (async: front-end processes answer them through the model process) --
    async def live(self) -> bool:
        return True

    async def ready(self) -> bool:
        return bool(self.registry.ready_models())

    async def server_metadata(self) -> dict[str, Any]:
        return server_metadata((STATISTICS, *self.shared_memory.extensions()))

    async def model_ready(self, name: str, version: str | None) -> bool:
        """Whether the model (version) serves; a name the repository does not have raises
        NotFound (404), since a load balancer reads "not ready" (503) as an unhealthy server."""
        try:
            self.registry.get(name, version)
            return True
        except Unavailable:  # known, but no version of it loaded
            return False

    async def model_metadata(self, name: str, version: str | None) -> dict[str, Any]:
        served = self.registry.get(name, version)
        sig = served.signature
        shape = lambda spec: [d if isinstance(d, int) else -1 for d in spec.shape]  # noqa: E731
        return {
            "name": name,
            "versions": sorted(self.registry.models[name].versions, key=int),
            "platform": f"unideploy_{served.runtime.name}",
            # a streaming model's state is the server's to carry (Triton lists no implicit state either)
            "inputs": [
                {"name": t.name, "datatype": NUMPY_TO_V2[t.dtype], "shape": shape(t)}
                for t in sig.inputs
                if t.name not in sig.state_inputs
            ],
            "outputs": [
                {"name": t.name, "datatype": NUMPY_TO_V2[t.dtype], "shape": shape(t)}
                for t in sig.outputs
                if t.name not in sig.state_outputs
            ],
            "parameters": {**_ran_parameters(served.ran), **_state_parameters(sig)},
        }

    async def model_statistics(self, name: str | None, version: str | None) -> dict[str, Any]:
        """Triton's statistics extension (``statistics.py``): every serving version of every model,
        of model ``name``, or its ``version``; a model or version not serving raises NotFound."""
        if name and version:
            chosen = [(name, self.registry.get(name, version))]
        elif name:
            chosen = [(name, v) for v in self._versions_of(name)]
        else:
            chosen = [(n, v) for n in sorted(self.registry.ready_models()) for v in self._versions_of(n)]
        stages = self.metrics.stages()
        return {
            "model_stats": [
                self.metrics.statistics(n, v.version).as_triton(
                    n, v.version, stages[n, v.version, "total"], stages[n, v.version, "queue"]
                )
                for n, v in chosen
            ]
        }

    def _versions_of(self, name: str) -> list[ServedVersion]:
        """The serving versions of ``name``, oldest first (NotFound where it has none)."""
        self.registry.get(name)
        versions = self.registry.models[name].versions
        return [versions[v] for v in sorted(versions, key=int)]

    async def model_config(self, name: str, version: str | None) -> dict[str, Any]:
        """Triton-style configuration (what perf_analyzer asks for first). With a dynamic batch
        dimension, dims exclude it and max_batch_size is the batcher's limit, as in Triton."""
        served = self.registry.get(name, version)
        model = self.registry.models[name]
        batched = served.signature.has_dynamic_batch
        dims = lambda spec: [d if isinstance(d, int) else -1 for d in (spec.shape[1:] if batched else spec.shape)]  # noqa: E731
        config: dict[str, Any] = {
            "name": name,
            "platform": f"unideploy_{served.runtime.name}",
            "backend": served.runtime.name,
            "max_batch_size": model.settings.max_batch_size if batched else 0,
            "input": [
                {"name": t.name, "data_type": _config_type(t.dtype), "dims": dims(t)}
                for t in served.signature.inputs
                if t.name not in served.signature.state_inputs
            ],
            "output": [
                {"name": t.name, "data_type": _config_type(t.dtype), "dims": dims(t)}
                for t in served.signature.outputs
                if t.name not in served.signature.state_outputs
            ],
        }
        shown = {**_ran_parameters(served.ran), **_state_parameters(served.signature)}
        config["parameters"] = {k: {"string_value": v} for k, v in shown.items()}
        if served.signature.state:  # Triton's sequence batcher with implicit state
            inputs = {t.name: t for t in served.signature.inputs}
            config["sequence_batching"] = {
                "max_sequence_idle_microseconds": int(self.sequences.idle_s * 1e6),
                "state": [
                    {
                        "input_name": p.input,
                        "output_name": p.output,
                        "data_type": _config_type(inputs[p.input].dtype),
                        "dims": dims(inputs[p.input]),
                    }
                    for p in served.signature.state
                ],
            }
        # Triton's instance group: how many merged batches run at once, and on what
        kind = "KIND_GPU" if served.ran.get("device") == "gpu" else "KIND_CPU"
        config["instance_group"] = [{"count": served.batcher.in_flight, "kind": kind}]
        if served.batcher.merges:  # merging needs a batch dimension
            config["dynamic_batching"] = {"max_queue_delay_microseconds": int(served.batcher.max_delay_s * 1e6)}
            if served.batcher.buckets:  # the sizes merged batches are padded to
                config["dynamic_batching"]["preferred_batch_size"] = list(served.batcher.buckets)
        return config

    async def metrics_text(self) -> bytes:
        """The Prometheus exposition of every series (one /metrics for all front ends)."""
        from prometheus_client import generate_latest

        return generate_latest(self.metrics.registry)

    # -- the shared memory (system and CUDA), repository and routing extensions -----------------
    async def shm_status(self, region: str | None, kind: str = "system") -> list[dict[str, Any]]:
        return self.shared_memory.status(region, kind)

    async def shm_register(self, region: str, key: Any, offset: Any, byte_size: Any) -> None:
        self.shared_memory.register(region, key, offset, byte_size)

    async def cuda_shm_register(self, region: str, raw_handle: Any, device_id: Any, byte_size: Any) -> None:
        self.shared_memory.register_cuda(region, raw_handle, device_id, byte_size)

    async def shm_unregister(self, region: str | None, kind: str = "system") -> None:
        self.shared_memory.unregister(region, kind)

    async def repository_index(self, ready_only: bool) -> list[dict[str, Any]]:
        return self.repository.index(ready_only)

    async def repository_load(self, name: str) -> None:
        await self.repository.load(name)

    async def repository_unload(self, name: str) -> None:
        await self.repository.unload(name)

    async def routing(self, name: str) -> dict[str, Any] | None:
        return self.repository.routing(name)

    async def set_routing(self, name: str, document: Any) -> dict[str, Any]:
        return await self.repository.set_routing(name, document)

    # -- inference ---------------------------------------------------------------------------
    async def infer(self, request: InferRequest) -> InferResult:
        """Run a decoded request. The protocol calls ``encoded`` once the response is encoded,
        which records the total."""
        try:
            return await self._infer(request)
        except InputError as exc:
            self.metrics.failures.labels(request.model, request.protocol, type(exc).__name__).inc()
            raise
        except UnideployError:
            self.metrics.failures.labels(request.model, request.protocol, "runtime").inc()
            raise

    async def _infer(self, request: InferRequest) -> InferResult:
        start = time.perf_counter()
        name, version, variant = request.model, request.version, None
        placed = sum(v.place.byte_size for v in request.inputs.values() if isinstance(v, Placed))
        if placed > self.max_request_bytes:  # refused before a byte is copied into this process
            raise TooLarge(
                f"the request's inputs in shared memory come to {placed} bytes, over the limit of "
                f"{self.max_request_bytes} bytes (the server's --max-request-bytes)",
                "send smaller batches, or start the server with a larger --max-request-bytes",
            )
        inputs: dict[str, Any] = {  # an input in shared memory stays there until its batch is merged (unread.py)
            key: self.shared_memory.input(v.place, v.datatype, v.shape, key) if isinstance(v, Placed) else v
            for key, v in request.inputs.items()
        }
        model = self.registry.models.get(name)
        if request.sequence is not None and (
            kept := self._sequence_version(name, version, request.sequence, request.headers)
        ):
            version = kept  # a sequence keeps the version it started on
            if kept not in (model.versions if model is not None else {}):
                raise BadRequest(
                    f"sequence {request.sequence.id!r} of model '{name}' ran on version {kept}, which is no "
                    "longer served",
                    "start it again with sequence_start: true",
                )
        elif not version and model is not None and model.routing is not None:
            chosen = model.routing.choose(request.headers, self.registry.rng)
            variant, version = chosen.name, chosen.version
        served = self.registry.get(name, version)
        try:
            return await self._answer(request, served, model, variant, inputs, start)
        except UnideployError:  # Triton's "fail": the requests that failed once their version was known
            self.metrics.statistics(name, served.version).failed.add(1, time.perf_counter() - start + request.decode_s)
            raise

    def _sequence_version(
        self, name: str, asked: str | None, control: SequenceControl, headers: Mapping[str, str]
    ) -> str | None:
        """The version a continuing sequence started on (None: a starting one); a call naming
        another version is refused, as its state belongs to the first, and so is a sequence of a
        model without state, or one that does not carry the header replicas are chosen by."""
        if not self.registry.get(name, asked).signature.state:
            raise BadRequest(
                f"model '{name}' keeps no state between calls, so it has no sequences",
                "leave sequence_id, sequence_start and sequence_end out",
            )
        self.sequences.check_routed(control, headers)
        kept = self.sequences.version_of(name, control)
        if kept is not None and asked and asked != kept:
            raise BadRequest(
                f"sequence {control.id!r} of model '{name}' runs on version {kept}, not {asked}",
                f"leave the version out of its calls, or start a new sequence on version {asked}",
            )
        return kept

    async def _answer(
        self,
        request: InferRequest,
        served: ServedVersion,
        model: ServedModel | None,
        variant: str | None,
        inputs: dict[str, Any],
        start: float,
    ) -> InferResult:
        """``request`` run on ``served`` of ``model`` (its inputs as ``_infer`` prepared them)."""
        name = request.model
        rows = max((np.shape(v)[0] for v in inputs.values() if np.ndim(v)), default=0)
        if rows > self.max_request_rows:  # a few bytes per row can still be millions of runtime rows
            raise BadRequest(
                f"request of {rows} rows exceeds the limit of {self.max_request_rows}",
                "send it in smaller batches, or raise --max-request-rows",
            )
        requested = request.requested
        if requested:
            unknown = [o for o in requested if o not in served.signature.output_names]
            if unknown:
                raise BadRequest(
                    f"unknown output(s) {', '.join(map(repr, unknown))}",
                    f"model '{name}' has: {', '.join(served.signature.output_names)}",
                )
        if request.sequence is None:
            if served.signature.state:
                _refuse_missing_state(name, served, inputs)
            arrays = self._checked(served, inputs)
            computed, queue_s, compute_s = await self._run(served, arrays)
            answered = computed
        else:
            async with self.sequences.call(name, request.sequence, served.version) as sequence:
                arrays = self._checked(served, _with_state(name, served, inputs, sequence))
                computed, queue_s, compute_s = await self._run(served, arrays)
                sequence.state = {p.input: np.array(computed[p.output]) for p in served.signature.state}
            kept = served.signature.state_outputs  # the state stays here
            answered = {k: v for k, v in computed.items() if k not in kept}
        outputs: dict[str, np.ndarray | Written] = {k: computed[k] for k in requested} if requested else dict(answered)
        for key, place in request.placed.items():
            outputs[key] = self.shared_memory.write(place, computed[key], key)
        series = self.metrics.series(name, served.version, variant or "", request.protocol)
        series.requests.inc()
        series.stages["decode"].observe(request.decode_s)
        series.stages["queue"].observe(queue_s)
        series.stages["compute"].observe(compute_s)
        if (
            variant is not None and model is not None and model.routing and model.routing.shadow_version
        ):  # routed (not a named version): copy it
            self._shadow(name, model.routing.shadow_version, arrays)
        return InferResult(name, served.version, variant, outputs, start - request.decode_s, series)

    def _checked(self, served: ServedVersion, inputs: dict[str, Any]) -> Inputs:
        """``inputs`` checked against the version's signature, and the answer they ask for against
        ``max_response_bytes`` where the signature says its size; those still in shared memory stay
        there, their values checked when their batch is merged and reads them."""
        unread = {k: v for k, v in inputs.items() if isinstance(v, Unread)}
        checked = served.signature.validate_inputs(
            {k: v.stand_in() if k in unread else v for k, v in inputs.items()}, unread=unread
        )
        for spec in served.signature.inputs:
            if spec.name in unread:
                unread[spec.name].check_values_with(spec)
        shapes = served.signature.output_shapes(checked)
        _refuse_large_answer(
            {
                spec.name: (shape, spec.np_dtype)
                for spec in served.signature.outputs
                if (shape := shapes.get(spec.name)) is not None and spec.dtype != STRING  # text: its length unknown
            },
            self.max_response_bytes,
            "would hold",
        )
        return {k: unread.get(k, a) for k, a in checked.items()}

    def encoded(self, result: InferResult, encode_s: float) -> None:
        """Record the encoding of a response, and the request's total time in the server."""
        assert result.series is not None
        self.record_encoded(result.series, encode_s, time.perf_counter() - result.received)

    @staticmethod
    def record_encoded(series: RequestSeries, encode_s: float, total_s: float) -> None:
        series.stages["encode"].observe(encode_s)
        series.stages["total"].observe(total_s)

    async def _run(self, served: ServedVersion, arrays: Inputs) -> tuple[dict[str, np.ndarray], float, float]:
        served.in_flight += 1
        served.ran_since_release = True
        self.runs_running += 1
        served.drained.clear()
        try:
            result = await served.batcher.submit(arrays)  # which counts its runtime calls' rows
            _refuse_large_answer(  # sizes the signature could not say: refused before they are encoded
                {k: (v.shape, v.dtype) for k, v in result.outputs.items()},
                self.max_response_bytes,
                "holds",
            )
            return result.outputs, result.queue_s, result.compute_s
        finally:
            served.in_flight -= 1
            self.runs_running -= 1
            self.runs_finished += 1
            if served.in_flight == 0:
                served.drained.set()

    def _shadow(self, name: str, version: str, arrays: Inputs) -> None:
        """Send a copy to the shadow version; its answer is measured and discarded. The arrays
        are copied now: the request's may live in a front end's memory, reused once it is answered,
        or in a client's shared memory, which it may rewrite once answered."""

        def failed(exc: Exception) -> None:  # a failing shadow must never touch the real response
            self.metrics.shadow_failures.labels(name, version).inc()
            log.warning("shadow copy to %s version %s failed: %s", name, version, exc)

        try:
            own = {key: a.read() if isinstance(a, Unread) else np.array(a) for key, a in arrays.items()}
        except InputError as exc:
            failed(exc)
            return

        async def copy() -> None:
            start = time.perf_counter()
            try:
                await self._run(self.registry.get(name, version), own)
                self.metrics.shadow.labels(name, version).observe(time.perf_counter() - start)
            except Exception as exc:
                failed(exc)

        task = asyncio.get_running_loop().create_task(copy())
        self._shadow_tasks.add(task)
        task.add_done_callback(self._shadow_tasks.discard)


def _state_parameters(signature: Signature) -> dict[str, str]:
    """A streaming model's state as metadata parameters: each input the server carries, from the
    output that feeds it and the value it starts from."""
    if not signature.state:
        return {}
    return {"state": "; ".join(f"{p.input} <- {p.output} (starts at {p.initial:g})" for p in signature.state)}


def _refuse_missing_state(name: str, served: ServedVersion, inputs: Mapping[str, Any]) -> None:
    """A streaming model's call outside a sequence must carry its state itself."""
    missing = [p.input for p in served.signature.state if p.input not in inputs]
    if missing:
        raise BadRequest(
            f"model '{name}' keeps state between calls ({', '.join(map(repr, missing))}), and this call is "
            "in no sequence and does not send it",
            "send each call of a stream with the same sequence_id (sequence_start: true on the first), and "
            "the server carries the state; or send the state inputs yourself",
        )


def _with_state(name: str, served: ServedVersion, inputs: dict[str, Any], sequence: Sequence) -> dict[str, Any]:
    """A sequence's call: its inputs and the state its sequence carries (the initial values on the
    first call). One row a call, so that what the sequences hold is bounded by their number."""
    state = served.signature.state
    if not state:  # a version without state reached by routing, where the one asked for has it
        raise BadRequest(
            f"version {served.version} of model '{name}' keeps no state between calls, so it has no sequences",
            "leave sequence_id, sequence_start and sequence_end out",
        )
    sent = [p.input for p in state if p.input in inputs]
    if sent:
        raise BadRequest(
            f"the server carries {', '.join(map(repr, sent))} of model '{name}' between a sequence's calls",
            "leave the state inputs out of a sequence's calls",
        )
    rows = batch_size_of(inputs, served.signature.batch_axes)
    if served.signature.batch_dim is not None and rows != 1:  # a fixed batch is the model's own
        raise BadRequest(
            f"a sequence's call holds one row (one stream), and this one has {rows}",
            "send each stream as a sequence of its own: the server batches calls of different sequences together",
        )
    if not sequence.state:
        return {**inputs, **{p.input: served.signature.initial_state(p, rows) for p in state}}
    return {**inputs, **sequence.state}


def _config_type(dtype: str) -> str:
    """A dtype in Triton's model configuration, where text is TYPE_STRING (BYTES on the wire)."""
    return "TYPE_STRING" if dtype == "string" else f"TYPE_{NUMPY_TO_V2[dtype]}"


def _refuse_large_answer(outputs: Mapping[str, tuple[tuple[int, ...], np.dtype]], limit: int, holds: str) -> None:
    """Refuse an answer whose ``outputs`` ((shape, dtype) by name) come to more than ``limit``
    bytes (``--max-response-bytes``), naming the largest: a request of a few bytes a row may ask
    for gigabytes (a language model's logits, 200 KB a token), which the server would compute, hold
    and encode (JSON about three times the bytes) before any client limit applied."""
    sizes = {name: math.prod(shape) * dtype.itemsize for name, (shape, dtype) in outputs.items()}
    total = sum(sizes.values())
    if total <= limit:
        return
    name = max(sizes, key=sizes.__getitem__)
    shape, dtype = outputs[name]
    raise TooLarge(
        f"the answer {holds} {total} bytes, over the limit of {limit} bytes (the server's --max-response-bytes); "
        f"its largest output, '{name}', is {list(shape)} {dtype}, {sizes[name]} bytes",
        "send fewer rows (or shorter inputs) per request, or start the server with a larger --max-response-bytes",
    )
