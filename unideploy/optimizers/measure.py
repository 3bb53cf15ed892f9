"""Effects of an optimization that a user pays for or gains: size, sparsity, latency.

Latency is a ratio measured in one process with the fp32 and optimized sessions interleaved, so
machine noise hits both alike.
"""

from __future__ import annotations

import gzip
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from unideploy.samples import resize_batch


def size_effects(fp32: Path, optimized: Path) -> dict[str, Any]:
    base, new = fp32.stat().st_size, optimized.stat().st_size
    base_gz, new_gz = (len(gzip.compress(p.read_bytes(), compresslevel=6)) for p in (fp32, optimized))
    return {"size_bytes": new, "size_ratio": round(new / base, 4),
            "gzip_bytes": new_gz, "gzip_ratio": round(new_gz / base_gz, 4),
            "weight_sparsity": round(weight_sparsity(optimized), 4)}


def weight_sparsity(model_path: Path) -> float:
    """Share of exact zeros among the float weight matrices/kernels (rank >= 2)."""
    zeros = total = 0
    for init in onnx.load(str(model_path)).graph.initializer:
        if len(init.dims) >= 2:
            array = numpy_helper.to_array(init)
            if np.issubdtype(array.dtype, np.floating):
                zeros += int(np.count_nonzero(array == 0))
                total += array.size
    return zeros / total if total else 0.0


def latency(fp32_session: Any, candidate_session: Any, sample: dict[str, np.ndarray], batch_sizes: tuple[int, ...],
            rounds: int = 5, max_seconds: float = 3.0) -> dict[int, dict[str, float]]:
    """Median milliseconds per call at each batch size, the two sessions taking turns."""
    results: dict[int, dict[str, float]] = {}
    for batch in batch_sizes:
        inputs = resize_batch(sample, batch)
        calls = _calls_for(fp32_session, inputs, max_seconds / (2 * rounds))
        times: dict[str, list[float]] = {"fp32": [], "optimized": []}
        for _ in range(rounds):
            for key, session in (("fp32", fp32_session), ("optimized", candidate_session)):
                start = time.perf_counter()
                for _ in range(calls):
                    session.run(None, inputs)
                times[key].append((time.perf_counter() - start) / calls * 1000.0)
        fp32_ms, opt_ms = statistics.median(times["fp32"]), statistics.median(times["optimized"])
        results[batch] = {"fp32": round(fp32_ms, 4), "optimized": round(opt_ms, 4),
                          "speedup": round(fp32_ms / opt_ms, 3)}
    return results


def _calls_for(session: Any, inputs: dict[str, np.ndarray], budget_s: float) -> int:
    session.run(None, inputs)  # warm-up
    start = time.perf_counter()
    session.run(None, inputs)
    once = max(time.perf_counter() - start, 1e-6)
    return int(min(max(budget_s / once, 3), 200))
