"""Effects of an optimization that a user pays for or gains: size, sparsity, latency.

Latency is a ratio measured in one process with the fp32 and optimized sessions interleaved, so
machine noise hits both alike.
"""

from __future__ import annotations

import gzip
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from unideploy.errors import NotFasterError
from unideploy.onnx.session import cpu_session
from unideploy.samples import Axes, resize_batch


def size_effects(fp32: Path, optimized: Path) -> dict[str, Any]:
    base, new = fp32.stat().st_size, optimized.stat().st_size
    base_gz, new_gz = (len(gzip.compress(p.read_bytes(), compresslevel=6)) for p in (fp32, optimized))
    return {
        "size_bytes": new,
        "size_ratio": round(new / base, 4),
        "gzip_bytes": new_gz,
        "gzip_ratio": round(new_gz / base_gz, 4),
        "weight_sparsity": round(weight_sparsity(optimized), 4),
    }


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


def timed_on() -> str:
    """Where ``timing_session`` runs, for the record beside what it measured: an fp16 artifact
    meant for a GPU runs slower there, and a latency shown without its device would say otherwise."""
    return f"the CPU ({len(os.sched_getaffinity(0))} cores), ONNX Runtime's CPUExecutionProvider"


def timing_session(model: Path | bytes) -> Any:
    """A CPU session fit for comparisons: its worker threads do not spin after a run. With spinning
    (ORT's default), several sessions taking turns slow each other down, unevenly (measured 2x on
    2 cores), which would make an unchanged model look faster or slower than it is."""
    return cpu_session(model, spin=False)


# the shortest round worth timing: at 200 calls, a round of a model that answers in tens of
# microseconds lasted 3-5 ms, less than a scheduler's time slice, and with another process on the
# cores a chain of MatMuls that INT8 makes 0.5-0.6x as fast measured 2x at one batch size (three runs
# of four); rounds of 20 ms share that process's slices between both sessions alike
MIN_ROUND_S = 0.02


def interleaved_latency(
    sessions: dict[str, Any],
    sample: dict[str, np.ndarray],
    batch_sizes: tuple[int, ...],
    rounds: int = 5,
    max_seconds: float = 3.0,
    axes: Axes | None = None,
) -> dict[int, dict[str, float]]:
    """Median milliseconds per call of each session at each batch size (along each input's batch
    axis, ``axes``), the sessions taking turns within every round so that machine noise hits them alike."""
    results: dict[int, dict[str, float]] = {}
    for batch in batch_sizes:
        inputs = resize_batch(sample, batch, axes)
        slowest = max(_one_call(s, inputs) for s in sessions.values())
        within_budget = max_seconds / (len(sessions) * rounds * slowest)
        calls = int(max(min(within_budget, max(200, MIN_ROUND_S / slowest)), 1))
        times: dict[str, list[float]] = {name: [] for name in sessions}
        for _ in range(rounds):
            for name, session in sessions.items():
                start = time.perf_counter()
                for _ in range(calls):
                    session.run(None, inputs)
                times[name].append((time.perf_counter() - start) / calls * 1000.0)
        results[batch] = {name: round(statistics.median(t), 4) for name, t in times.items()}
    return results


def latency(
    fp32_session: Any,
    candidate_session: Any,
    sample: dict[str, np.ndarray],
    batch_sizes: tuple[int, ...],
    rounds: int = 5,
    max_seconds: float = 3.0,
    axes: Axes | None = None,
) -> dict[int, dict[str, float]]:
    """fp32 and optimized latency at each batch size, with the speedup."""
    measured = interleaved_latency(
        {"fp32": fp32_session, "optimized": candidate_session}, sample, batch_sizes, rounds, max_seconds, axes
    )
    return {b: {**m, "speedup": round(m["fp32"] / m["optimized"], 3)} for b, m in measured.items()}


def _one_call(session: Any, inputs: dict[str, np.ndarray]) -> float:
    session.run(None, inputs)  # warm-up
    start = time.perf_counter()
    session.run(None, inputs)
    return max(time.perf_counter() - start, 1e-6)


SLOWER = 0.95  # a speedup under this at every batch size is more than the timing's noise
FASTER = 1 / SLOWER  # and one over this, on average, faster by more than it


def cpu_has_vnni() -> bool:
    """Whether the CPU has an int8 dot-product instruction (AVX512-VNNI, AVX-VNNI or AMX)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(f in flags for f in ("avx512_vnni", "avx_vnni", "amx_int8"))


def slower_everywhere(latency_ms: dict[int, dict[str, float]]) -> str:
    """'0.65x at batch 1, 0.84x at batch 64' when the optimized model is slower at every batch size
    measured, else ''."""
    if not latency_ms or any(v["speedup"] >= SLOWER for v in latency_ms.values()):
        return ""
    return ", ".join(f"{v['speedup']:.2f}x at batch {b}" for b, v in latency_ms.items())


def slower_int8_note(artifact_id: str, slower: str, size_ratio: float) -> str:
    """What a user who kept a slower INT8 (``--keep-slower``) hears about it, and why it may be."""
    return f"{artifact_id} runs slower than fp32 on this CPU ({slower}) and {_size(size_ratio)}; {_why_slower()}"


def slower_int8_refusal(slower: str, size_ratio: float) -> NotFasterError:
    """INT8 is asked for speed, and one slower than fp32 at every batch size measured is not kept
    (as NVIDIA ModelOpt keeps a quantized model only where it measures faster); a package built on
    one CPU for another that serves it keeps it with ``--keep-slower``."""
    return NotFasterError(
        f"INT8 runs slower than fp32 on this CPU ({slower}) and {_size(size_ratio)}; the package was not changed",
        f"{_why_slower()}; to build it for another CPU that will serve it, add --keep-slower",
    )


def _size(size_ratio: float) -> str:
    return f"is {'smaller' if size_ratio < 1.0 else 'no smaller'} ({size_ratio:.0%} of fp32)"


def _why_slower() -> str:
    if cpu_has_vnni():
        return "serve the fp32 artifact here: this CPU has VNNI, so the model may be too small for INT8 to pay"
    return "serve the fp32 artifact here; a CPU with an int8 dot-product instruction (VNNI) may run it faster"
