"""The runtime plug-in contract: load one artifact, describe its signature, run named numpy inputs.

Runtimes know nothing of packages, the CLI or the wire; the server and the CLI reach every engine
through this class, so adding an engine is one file plus one registry line
(``unideploy/runtimes/__init__.py``) or an entry point in the ``unideploy.runtimes`` group.
"""

from __future__ import annotations

import functools
import os
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from unideploy.registry import Availability, modules_availability
from unideploy.signature import Signature


@dataclass(frozen=True)
class RuntimeOptions:
    device: str = "auto"  # "auto", "cpu" or "gpu"
    threads: int | None = None  # intra-op threads; None lets the engine decide
    # When intra-op worker threads busy-wait for work instead of sleeping: "always" (lowest latency
    # for one caller running back to back), "run" (within a run, where the waits between parallel
    # sections are short, but not between runs: a server's network threads need the cores then),
    # "never" (runtimes taking turns on shared cores, as benchmarks and comparisons do).
    spin: str = "always"
    # One process-wide activation arena for every engine that honours it, grown only by what a
    # run asks and planned per run rather than per input shape: a server holding several models
    # whose merged batches vary in size keeps less memory this way (docs/server.md, "Memory").
    shared_arena: bool = False
    # The most bytes that arena may hold (its runs' activations and answers, not the weights): a run
    # that would need more fails (``RunOutOfMemory``) instead of the machine running out; None: no cap.
    arena_limit: int | None = None
    # Where engines built for this GPU are kept (TensorRT, and ONNX Runtime's TensorRT provider);
    # None: $UNIDEPLOY_ENGINE_CACHE, else ~/.cache/unideploy/engines.
    engine_cache: Path | None = None
    # The artifact's precision as its manifest records it (selection.open_runtime fills it in):
    # engines take options by it, and report it as what ran.
    precision: str = "fp32"
    # fp32 on a GPU in TF32 (tensor cores, a 10-bit mantissa): faster, and then named and judged as
    # tf32. Off by default, so fp32 on a GPU is fp32 (ort_providers.cuda_options).
    tf32: bool = False
    # Batch sizes calls are padded to, each run on a session of its own, by engines for which every
    # new input shape is costly (ONNX Runtime's CUDA provider: batch_buckets.py); () runs any size
    # as it comes. The server sets them; engines that do not need them ignore them.
    batch_buckets: tuple[int, ...] = ()
    # Buckets' sessions capture their calls as a CUDA graph and replay it on device buffers bound
    # once (ONNX Runtime's CUDA provider; runtimes/ort_bound.py); where capture fails, plain sessions
    # run and describe() says why. None: the bucket of one row wherever batch buckets run (a GPU;
    # onnxruntime_runtime.GRAPH_ROWS), said only there; True: every bucket, asked for, and describe()
    # says why not where there are no buckets. (One session replaying a
    # graph per bucket crashed a CNN on the H200: docs/gpu.md, "One session for every bucket's graph".)
    cuda_graphs: bool | None = False
    # Sessions per bucket replaying its graph, each on a thread of its own, so that this many calls of
    # one bucket (from the server's batch threads) run at once; each is another bucket's memory.
    graph_sessions: int = 1


SPIN_POLICIES = ("always", "run", "never")


@functools.cache
def usable_memory() -> int:
    """Bytes of memory this process may use: the machine's, or less where its control group or
    one above it (cgroup v2's ``memory.max``, v1's ``memory.limit_in_bytes``: a container's or a
    service's limit) says so. Inside a container the process's group is the mount's root."""
    with open("/proc/meminfo") as meminfo:
        total = next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemTotal:"))
    try:
        groups = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        groups = []
    for line in groups:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2
            root, name = Path("/sys/fs/cgroup"), "memory.max"
        elif "memory" in controllers.split(","):
            root, name = Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes"
        else:
            continue
        group = root / path.lstrip("/")
        for folder in (group, *group.parents):  # its own group and those above it, as far as mounted
            if not folder.is_relative_to(root):
                break
            try:
                text = (folder / name).read_text().strip()
            except OSError:
                continue
            if text.isdigit():  # "max": none
                total = min(total, int(text))
    return total


@functools.cache
def usable_cores() -> int:
    """Physical cores among the CPUs this process may run on: ONNX Runtime's own default thread
    count. Set explicitly, because left to itself ONNX Runtime also pins each worker thread to one
    core; a caller that is not the main thread (the server's worker threads) then often lands on a
    pinned worker's core and the two take turns: EfficientNet-Lite0 ran in 16.4 ms instead of 4.1
    with the caller on that core (2-core Xeon, onnxruntime 1.32)."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    cores = set()
    for cpu in allowed:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(((topology / "physical_package_id").read_text(), (topology / "core_id").read_text()))
        except OSError:  # no sysfs topology (some containers): count every CPU
            return len(allowed)
    return len(cores)


class Runtime(ABC):
    name: ClassVar[str]
    formats: ClassVar[tuple[str, ...]]  # artifact formats this runtime executes
    targets: ClassVar[tuple[str, ...]]  # deployment targets it serves: cpu, gpu, edge, ascend
    required_modules: ClassVar[tuple[str, ...]] = ()
    extra: ClassVar[str | None] = None  # the pip extra that installs required_modules

    def __init__(self, path: Path, signature: Signature, options: RuntimeOptions | None = None) -> None:
        self.path = Path(path)
        self.signature = signature
        self.options = options or RuntimeOptions()
        # artifacts tried before this one and why each could not run (selection.open_runtime)
        self.passed_over: tuple[str, ...] = ()
        self._load()

    @classmethod
    def availability(cls) -> Availability:
        """Cheap check (no heavy import) of whether this runtime can work here."""
        return modules_availability(cls.required_modules, cls.extra)

    @abstractmethod
    def _load(self) -> None:
        """Load the artifact at ``self.path``; raise PackageError if it is unusable."""

    @abstractmethod
    def _run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run already-validated inputs; return outputs by name."""

    @property
    def max_batch_size(self) -> int | None:
        """Most rows one call may carry (an engine's profile), None when unbounded: the server's
        batcher never merges past it."""
        return None

    @property
    def batch_buckets(self) -> tuple[int, ...]:
        """The batch sizes this engine pads calls to (``RuntimeOptions.batch_buckets``, where it
        uses them): a server warms each one at load. () when any size runs as it comes."""
        return ()

    @property
    def takes_device_batches(self) -> bool:
        """Whether ``run_checked`` takes a merged batch's inputs in GPU memory
        (``device_batches.DeviceArray``): a server then has the GPU copy inputs in shared memory
        into its batches there."""
        return False

    def shrink(self, inputs: Mapping[str, Any]) -> None:
        """Run ``inputs`` (a small request) and give back the memory that larger calls left the
        engine holding; a server calls it when traffic stops. Engines that keep none do nothing."""
        return None  # optional: most engines keep nothing to give back

    def describe(self) -> dict[str, Any]:
        """Engine details worth showing a user (device, providers, threads)."""
        return {"runtime": self.name}

    def run(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return self._run(self.signature.validate_inputs(inputs))

    def run_checked(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``run`` for arrays that ``signature.validate_inputs`` returned already: a server checks
        each request before merging it into a batch, and checking the batch again cost it 3-4 % of
        a trivial model's request (docs/server.md)."""
        return self._run(arrays)

    def close(self) -> None:  # noqa: B027 (an optional hook: most engines hold nothing to release)
        """Release engine resources; the default has none to release."""

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
