"""The TensorRT runtime: an engine for this GPU, from the package's recipe, run on a CUDA stream.

Loading finds a plan whose key (GPU model, compute capability, TensorRT version, precision,
profiles, workspace, ONNX and calibration checksums) equals this machine's: first among those
shipped in the package, then in the engine cache; otherwise it builds one, caches it, and says
why it had to. Running (``execution.py``): device buffers grown on demand, inputs and outputs
bound by name, ``execute_async_v3`` on the context's own stream. One execution context serves one
call at a time, so calls are serialized; the server's dynamic batcher is what turns concurrent
requests into full batches.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import numpy as np

from unideploy.errors import MissingDependencyError, PackageError, RuntimeFailure, first_line
from unideploy.registry import Availability, modules_availability
from unideploy.runtimes.base import Runtime
from unideploy.runtimes.cuda_devices import Gpu, find_gpus
from unideploy.runtimes.cuda_work import CUDA_WORK
from unideploy.runtimes.tensorrt.engine_cache import EngineCache, EngineKey, cached_or_built
from unideploy.runtimes.tensorrt.execution import EngineExecution
from unideploy.runtimes.tensorrt.spec import EngineSpec, check_shapes

log = logging.getLogger("unideploy.tensorrt")

INSTALL_HINT = (
    "pip install 'unideploy[gpu]' 'tensorrt-cu13>=10.13,<11' --extra-index-url https://pypi.nvidia.com "
    "(TensorRT wheels come from NVIDIA's index; 10.x for ONNX Runtime's provider, CUDA 13 as onnxruntime-gpu 1.31)"
)


def cuda_device(gpus: list[Gpu]) -> Gpu:
    """The GPU CUDA calls device 0: the first of CUDA_VISIBLE_DEVICES when it names one by index."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    by_index = {g.index: g for g in gpus}
    return by_index.get(int(first), gpus[0]) if first.isdigit() else gpus[0]


class TensorRTRuntime(Runtime):
    name = "tensorrt"
    formats = ("tensorrt",)
    targets = ("gpu",)

    @classmethod
    def availability(cls) -> Availability:
        return cls._probe()[0]

    @staticmethod
    def _probe() -> tuple[Availability, list[Gpu]]:
        """Whether TensorRT can run here, and the GPUs NVML lists (asked once per load)."""
        found = modules_availability(("tensorrt", "polygraphy", "pynvml"), None)
        if not found.ok:
            return Availability(False, found.detail, INSTALL_HINT), []
        gpus, detail = find_gpus()
        if not gpus:
            return Availability(False, detail, "run on a machine with an NVIDIA GPU and its driver"), []
        return Availability(True, detail, modules=found.modules), gpus

    def _load(self) -> None:
        if self.options.device == "cpu":
            raise MissingDependencyError(
                "TensorRT runs on NVIDIA GPUs only, and the CPU was asked for",
                "use --device auto or gpu, or run another artifact on the CPU",
            )
        found, gpus = self._probe()
        if not found.ok:
            raise MissingDependencyError(f"TensorRT cannot run here: {found.detail}", found.fix)
        import tensorrt as trt
        from polygraphy.backend.trt import EngineFromBytes

        from unideploy.runtimes.tensorrt.build import build_engine, quiet_polygraphy

        quiet_polygraphy()
        self.spec = EngineSpec.load(self.path)
        self.gpu = cuda_device(gpus)
        self.key = key = EngineKey.make(
            self.spec.onnx_sha256,
            self.spec.precision,
            list(self.spec.profiles),
            self.gpu.name,
            self.gpu.compute_capability,
            trt.__version__,
            self.spec.workspace_mib,
            self.spec.calibration_sha256,
        )
        cache = EngineCache(self.options.engine_cache)
        shipped = EngineCache(self.spec.engines_dir) if self.spec.engines_dir.is_dir() else None
        timing_cache = cache.directory / f"timing-{key.gpu.replace(' ', '_')}-trt{key.tensorrt}.cache"

        def build(why: str) -> bytes:
            log.warning(
                "building a TensorRT %s engine for %s on %s (%s); this happens once per GPU model",
                self.spec.precision,
                self.path.name,
                self.gpu.name,
                why,
            )
            return build_engine(self.spec, timing_cache)

        plan, self.engine_source = cached_or_built(key, shipped, cache, build)
        try:
            engine = EngineFromBytes(plan)()
        except Exception as exc:  # Polygraphy/TensorRT raise their own types
            raise PackageError(
                f"TensorRT could not load the engine for '{self.path.name}': {first_line(exc)}",
                f"delete it from {cache.directory} to rebuild it",
            ) from exc
        names = {
            engine.get_tensor_name(i): engine.get_tensor_mode(engine.get_tensor_name(i))
            for i in range(engine.num_io_tensors)
        }
        inputs = {n for n, mode in names.items() if mode == trt.TensorIOMode.INPUT}
        if inputs != set(self.signature.input_names) or not set(self.signature.output_names) <= set(names):
            raise PackageError(
                f"the TensorRT engine's tensors {sorted(names)} do not match the signature "
                f"({self.signature.input_names} -> {self.signature.output_names})",
                "the package is inconsistent; export it again",
            )
        self._engine = engine
        self._execution = EngineExecution(engine, self.signature.output_names)
        self._lock = threading.Lock()

    @property
    def max_batch_size(self) -> int | None:
        return self.spec.max_batch_size

    def describe(self) -> dict[str, Any]:
        return {
            "runtime": self.name,
            "device": self.gpu.name,
            "compute_capability": self.gpu.compute_capability,
            "tensorrt": self.key.tensorrt,
            "precision": self.spec.precision,
            **({"int8": self.spec.int8} if self.spec.int8 else {}),
            "profiles": self.spec.profile_text(),
            "engine": self.engine_source,
        }

    def _run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        check_shapes(self.spec.profiles, inputs)
        with CUDA_WORK.shared(), self._lock:  # held off by a CUDA graph's capture (cuda_work.py)
            try:
                return self._execution.run(inputs)
            except RuntimeFailure:
                raise
            except Exception as exc:  # CUDA errors surface as Polygraphy exceptions
                raise RuntimeFailure(f"TensorRT failed: {first_line(exc)}") from exc

    def close(self) -> None:
        with CUDA_WORK.shared():  # the engine's GPU memory freed
            execution = self.__dict__.pop("_execution", None)
            if execution is not None:
                execution.close()
            self.__dict__.pop("_engine", None)
