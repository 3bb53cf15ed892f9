"""The runtime plug-in contract: load one artifact, describe its signature, run named numpy inputs.

Runtimes know nothing of packages, the CLI or the wire; the server and the CLI reach every engine
through this class, so adding an engine is one file plus one registry line
(``unideploy/runtimes/__init__.py``) or an entry point in the ``unideploy.runtimes`` group.
"""

from __future__ import annotations

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
    # Where engines built for this GPU are kept (TensorRT, and ONNX Runtime's TensorRT provider);
    # None: $UNIDEPLOY_ENGINE_CACHE, else ~/.cache/unideploy/engines.
    engine_cache: Path | None = None


SPIN_POLICIES = ("always", "run", "never")


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

    def shrink(self, inputs: Mapping[str, Any]) -> None:
        """Run ``inputs`` (a small request) and give back the memory that larger calls left the
        engine holding; a server calls it when traffic stops. Engines that keep none do nothing."""
        return None  # optional: most engines keep nothing to give back

    def describe(self) -> dict[str, Any]:
        """Engine details worth showing a user (device, providers, threads)."""
        return {"runtime": self.name}

    def run(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return self._run(self.signature.validate_inputs(inputs))

    def close(self) -> None:  # noqa: B027 (an optional hook: most engines hold nothing to release)
        """Release engine resources; the default has none to release."""

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
