"""Triton's statistics extension: what each served version's requests and runtime calls cost, in
the form perf_analyzer, Model Analyzer and tritonclient's ``get_inference_statistics`` read
(``GET /v2/models[/NAME[/versions/V]]/stats``, gRPC ``ModelStatistics``).

perf_analyzer prints a "Server:" section from it beside its own client-side figures (the request's
time in the server split into queue, compute input, compute infer, compute output and the rest,
its "overhead"); without the extension it shows the client's side only. The figures are those
/metrics already reports, named as Triton names them:

- ``success`` and ``queue``: the request-duration histograms' ``total`` and ``queue`` stages (read
  when asked, so a request costs nothing more), ``fail`` the requests that failed once their
  version was known;
- ``compute_input``, ``compute_infer``, ``compute_output``: a runtime call's parts
  (``batching.CallParts``) counted once per request it answered, as Triton counts compute per
  request: ``compute_input`` the hand-off to the batch thread and the merge (the copies into GPU
  memory included), ``compute_infer`` the runtime's run (ONNX Runtime's own copies to and from a
  GPU included), ``compute_output`` the answers' way back to the event loop, where they are split
  per request. So queue and the three compute parts add up to /metrics' ``queue`` and ``compute``
  stages, and perf_analyzer's "overhead" is decoding, encoding and the protocol's own work;
- ``inference_count`` the rows of the runtime calls that answered, ``execution_count`` the calls,
  ``batch_stats`` the calls per batch size (each call once, at the rows it merged).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from unideploy.server.batching import CallParts


@dataclass
class Duration:
    """How many times something took time, and how long in all (Triton's ``StatisticDuration``)."""

    count: int = 0
    seconds: float = 0.0

    def add(self, count: int, seconds: float) -> None:
        self.count += count
        self.seconds += seconds

    def as_triton(self) -> dict[str, int]:
        return {"count": self.count, "ns": round(self.seconds * 1e9)}


@dataclass
class Compute:
    """A runtime call's three parts as Triton names them."""

    input: Duration = field(default_factory=Duration)
    infer: Duration = field(default_factory=Duration)
    output: Duration = field(default_factory=Duration)

    def add(self, count: int, parts: CallParts) -> None:
        """``parts`` counted ``count`` times (once per request for ``inference_stats``, once per
        call for ``batch_stats``)."""
        self.input.add(count, count * (parts.to_thread + parts.input))
        self.infer.add(count, count * parts.infer)
        self.output.add(count, count * parts.from_thread)

    def as_triton(self) -> dict[str, dict[str, int]]:
        return {
            "compute_input": self.input.as_triton(),
            "compute_infer": self.infer.as_triton(),
            "compute_output": self.output.as_triton(),
        }


class VersionStatistics:
    """One version's runtime calls and failed requests since the server started (a reloaded
    version goes on counting, as its /metrics series do)."""

    def __init__(self) -> None:
        self.executions = 0
        self.inferences = 0
        self.last_inference_ms = 0
        self.per_request = Compute()
        self.per_batch_size: dict[int, Compute] = {}
        self.failed = Duration()

    def called(self, rows: int, requests: int, parts: CallParts) -> None:
        """A runtime call of ``rows`` rows answered ``requests`` requests."""
        self.executions += 1
        self.inferences += rows
        self.last_inference_ms = int(time.time() * 1000)
        self.per_request.add(requests, parts)
        found = self.per_batch_size.get(rows)
        if found is None:
            found = self.per_batch_size[rows] = Compute()
        found.add(1, parts)

    def as_triton(self, name: str, version: str, success: Duration, queue: Duration) -> dict[str, Any]:
        """Triton's ``$model_stat`` object; ``success`` and ``queue`` from the request-duration
        histograms (``ServerMetrics.stages``)."""
        none = Duration().as_triton()  # no response cache
        return {
            "name": name,
            "version": version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inferences,
            "execution_count": self.executions,
            "inference_stats": {
                "success": success.as_triton(),
                "fail": self.failed.as_triton(),
                "queue": queue.as_triton(),
                **self.per_request.as_triton(),
                "cache_hit": none,
                "cache_miss": none,
            },
            "batch_stats": [
                {"batch_size": size, **compute.as_triton()} for size, compute in sorted(self.per_batch_size.items())
            ],
        }
