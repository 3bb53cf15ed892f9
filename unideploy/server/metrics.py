"""Prometheus metrics of one server (its own registry, so several servers can share a process)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from unideploy.server.batching import CallParts
from unideploy.server.statistics import Duration, VersionStatistics

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

STAGES = ("decode", "queue", "compute", "encode", "total")


@dataclass(frozen=True)
class RequestSeries:
    """The labelled series one answered request updates, looked up once per label set: resolving
    labels takes a lock and a validation per call, seven times per request otherwise."""

    requests: Any  # Counter child
    stages: dict[str, Any]  # stage -> Histogram child


@dataclass(frozen=True)
class CallSeries:
    """The series one runtime call of a version updates (``DynamicBatcher``'s ``on_call``): its rows,
    each part of its time where not zero (a call on the event loop has no hand-offs), and the
    version's Triton statistics; and each call that failed (``on_failed``)."""

    rows: Any  # Histogram child
    parts: tuple[Any, ...]  # Counter children, in CallParts' order
    statistics: VersionStatistics
    failures: tuple[Any, Any]  # Counter children: answered its error, run again in halves

    def failed(self, halved: bool) -> None:
        self.failures[halved].inc()

    def observe(self, rows: int, requests: int, parts: CallParts) -> None:
        self.rows.observe(rows)
        self.statistics.called(rows, requests, parts)
        for series, seconds in zip(self.parts, parts):
            if seconds:
                series.inc(seconds)


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ("model", "version", "variant")
        self.requests = Counter(
            "unideploy_requests", "Inference requests answered", (*labels, "protocol"), registry=self.registry
        )
        self.failures = Counter(
            "unideploy_request_failures",
            "Inference requests refused or failed",
            ("model", "protocol", "reason"),
            registry=self.registry,
        )
        self.latency = Histogram(
            "unideploy_request_duration_seconds",
            "Request latency by stage",
            (*labels, "stage"),
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batch_rows = Histogram(
            "unideploy_batch_rows",
            "Rows per runtime call after dynamic batching (one observation per call; _count: the calls)",
            ("model", "version"),
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
        self.call_seconds = Counter(
            "unideploy_runtime_call_seconds",
            "Runtime calls' time by part, summed (divided by unideploy_batch_rows_count: a call's mean): "
            "to_thread (waiting for the batch thread), input (merging requests into the batch), infer (the "
            "runtime's run), from_thread (until the event loop takes the answers back)",
            ("model", "version", "part"),
            registry=self.registry,
        )
        self.call_failures = Counter(
            "unideploy_runtime_call_failures",
            "Runtime calls that failed, by what followed: failed (its requests were answered its error), "
            "halved (a merged batch: its requests ran again in halves, each ending with its own answer or error); "
            "a client sending values the model refuses shows here",
            ("model", "version", "then"),
            registry=self.registry,
        )
        self.shadow = Histogram(
            "unideploy_shadow_duration_seconds",
            "Latency of shadow-variant copies",
            ("model", "version"),
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.shadow_failures = Counter(
            "unideploy_shadow_failures", "Shadow copies that failed", ("model", "version"), registry=self.registry
        )
        self.load_failures = Counter(
            "unideploy_model_load_failures",
            "Versions that failed to load",
            ("model", "version"),
            registry=self.registry,
        )
        self.ready = Gauge(
            "unideploy_model_ready", "1 while a model version serves", ("model", "version"), registry=self.registry
        )
        self.engine = Gauge(
            "unideploy_model_engine",
            "1 for what a serving version runs on: artifact, runtime, device, providers and precision",
            ("model", "version", "artifact", "runtime", "device", "providers", "precision"),
            registry=self.registry,
        )
        self.scans = Counter(
            "unideploy_repository_scans",
            "Repository scans of the hot-reload watcher (--poll-interval), by result (ok, failed)",
            ("result",),
            registry=self.registry,
        )
        self.frontend_requests = Counter(
            "unideploy_frontend_requests",
            "Inference requests each front-end process handed to the model process (--frontends)",
            ("frontend",),
            registry=self.registry,
        )
        self.frontends = Gauge(
            "unideploy_frontends", "Front-end processes connected to the model process", registry=self.registry
        )
        self.sequences = Gauge(
            "unideploy_sequences",
            "Live sequences of streaming models, each holding its state in the server (at most --max-sequences)",
            registry=self.registry,
        )
        self._engines: dict[tuple[str, str], tuple[str, ...]] = {}
        self._series: dict[tuple[str, str, str, str], RequestSeries] = {}
        self._calls: dict[tuple[str, str], CallSeries] = {}

    def engine_serving(self, model: str, version: str, ran: dict[str, Any] | None) -> None:
        """Name what a version runs on (``selection.what_ran``), or, with None, forget it."""
        old = self._engines.pop((model, version), None)
        if old is not None:
            self.engine.remove(*old)
        if ran is not None:
            labels = (
                model,
                version,
                str(ran.get("artifact", "")),
                str(ran.get("runtime", "")),
                str(ran.get("device", "")),
                ",".join(ran.get("providers", [])),
                str(ran.get("precision", "")),
            )
            self.engine.labels(*labels).set(1)
            self._engines[(model, version)] = labels

    def series(self, model: str, version: str, variant: str, protocol: str) -> RequestSeries:
        key = (model, version, variant, protocol)
        found = self._series.get(key)
        if found is None:
            found = self._series[key] = RequestSeries(
                self.requests.labels(model, version, variant, protocol),
                {stage: self.latency.labels(model, version, variant, stage) for stage in STAGES},
            )
        return found

    def calls(self, model: str, version: str) -> CallSeries:
        """The batch-size histogram and the call-time parts of one version (every runtime call,
        shadow copies included)."""
        found = self._calls.get((model, version))
        if found is None:
            found = self._calls[(model, version)] = CallSeries(
                self.batch_rows.labels(model, version),
                tuple(self.call_seconds.labels(model, version, part) for part in CallParts._fields),
                VersionStatistics(),
                (
                    self.call_failures.labels(model, version, "failed"),
                    self.call_failures.labels(model, version, "halved"),
                ),
            )
        return found

    def statistics(self, model: str, version: str) -> VersionStatistics:
        """The Triton statistics of one version (``statistics.py``)."""
        return self.calls(model, version).statistics

    def stages(self) -> dict[tuple[str, str, str], Duration]:
        """Each (model, version, stage) of the request-duration histograms, over its variants and
        protocols: how many requests recorded it and their seconds in all (for the statistics
        extension; read from the histograms in one pass, so requests pay nothing for it)."""
        found: dict[tuple[str, str, str], Duration] = defaultdict(Duration)
        for family in self.latency.collect():
            for sample in family.samples:
                labels = sample.labels
                total = found[labels["model"], labels["version"], labels["stage"]]
                if sample.name.endswith("_count"):
                    total.count += int(sample.value)
                elif sample.name.endswith("_sum"):
                    total.seconds += sample.value
        return found
