"""Latency and throughput of one runtime on one batch size.

Numbers here are for comparing artifacts and runtimes on the same machine in one run; they are
never asserted in tests (machines are noisy).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from unideploy.runtimes.base import Runtime
from unideploy.samples import batch_size_of

Tick = Callable[[int, int], None]  # (done, total)


def benchmark(
    runtime: Runtime,
    inputs: Mapping[str, np.ndarray],
    iterations: int = 100,
    warmup: int = 10,
    max_seconds: float = 60.0,
    tick: Tick | None = None,
) -> dict[str, Any]:
    """Median and tail latency over ``iterations`` timed runs (stopping early at ``max_seconds``)."""
    inputs = runtime.signature.validate_inputs(inputs)
    for _ in range(warmup):
        runtime.run(inputs)
    latencies = []
    deadline = time.perf_counter() + max_seconds
    for i in range(iterations):
        start = time.perf_counter()
        runtime.run(inputs)
        latencies.append(time.perf_counter() - start)
        if tick:
            tick(i + 1, iterations)
        if time.perf_counter() > deadline:
            break
    ms = np.array(latencies) * 1000.0
    batch = batch_size_of(inputs)
    return {
        "batch_size": batch,
        "iterations": len(latencies),
        "warmup": warmup,
        "latency_ms": {
            "mean": float(ms.mean()),
            "p50": float(np.percentile(ms, 50)),
            "p90": float(np.percentile(ms, 90)),
            "p99": float(np.percentile(ms, 99)),
            "min": float(ms.min()),
        },
        "throughput_per_s": float(batch * len(latencies) / (ms.sum() / 1000.0)),
    }
