"""ONNX Runtime: the embedded default runtime (CPU), using CUDA/TensorRT providers when present.

It is also the second GPU path for a package's TensorRT recipe (``tensorrt`` artifacts): where
the TensorRT runtime is absent but onnxruntime-gpu is installed, the recipe's ONNX runs on ORT's
TensorRT execution provider with the recipe's precision, profiles and workspace (engines cached
beside the TensorRT runtime's), else on the CUDA provider.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from unideploy.errors import MissingDependencyError, PackageError, RuntimeFailure, first_line
from unideploy.registry import Availability
from unideploy.runtimes.base import Runtime, usable_cores
from unideploy.runtimes.tensorrt.engine_cache import default_cache_dir
from unideploy.runtimes.tensorrt.profiles import shape_text
from unideploy.runtimes.tensorrt.spec import EngineSpec, check_shapes, is_engine_spec

GPU_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider")


def choose_providers(device: str, available: list[str]) -> list[str]:
    """Order execution providers for a device request: GPU ones first when asked or present."""
    gpu = [p for p in GPU_PROVIDERS if p in available]
    if device == "cpu":
        return ["CPUExecutionProvider"]
    if device == "gpu" and not gpu:
        raise MissingDependencyError(
            f"no GPU execution provider in this onnxruntime build (available: {', '.join(available)})",
            "pip install onnxruntime-gpu on a machine with a CUDA GPU, or use --device cpu",
        )
    return [*gpu, "CPUExecutionProvider"]


def tensorrt_provider_options(spec: EngineSpec, cache_dir: Path) -> dict[str, Any]:
    """The recipe as options of ORT's TensorRT provider, whose engines are cached per GPU by ORT."""

    def shapes(which: str) -> str:
        return ",".join(f"{p.name}:{shape_text(getattr(p, which))}" for p in spec.profiles)

    options: dict[str, Any] = {
        "trt_fp16_enable": spec.precision in ("fp16", "int8"),
        "trt_int8_enable": spec.precision == "int8",
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": str(cache_dir),
        "trt_timing_cache_enable": True,
        "trt_timing_cache_path": str(cache_dir),
    }
    if spec.profiles:
        options.update(
            trt_profile_min_shapes=shapes("min"),
            trt_profile_opt_shapes=shapes("opt"),
            trt_profile_max_shapes=shapes("max"),
        )
    if spec.workspace_mib:
        options["trt_max_workspace_size"] = spec.workspace_mib << 20
    return options


def recipe_providers(spec: EngineSpec, device: str, available: list[str], cache_dir: Path) -> list[Any]:
    """Providers for a TensorRT recipe: a GPU one or none at all, since the recipe exists to run
    on a GPU; the CPU provider stays last for the few nodes GPU providers leave to it."""
    if device == "cpu":
        raise MissingDependencyError(
            "a TensorRT artifact runs on GPUs, and the CPU was asked for",
            "run the onnx-fp32 artifact on the CPU (--artifact onnx-fp32)",
        )
    if spec.int8 == "calibrated":
        raise MissingDependencyError(
            "this int8 recipe is calibrated by TensorRT itself when its engine is built, which ONNX Runtime cannot do",
            "install TensorRT, or export with --int8-variant symmetric for explicit int8",
        )
    gpu = [p for p in GPU_PROVIDERS if p in available]
    if not gpu:
        raise MissingDependencyError(
            "a TensorRT artifact needs the TensorRT runtime or onnxruntime-gpu on a CUDA GPU, "
            f"and neither is usable here (onnxruntime providers: {', '.join(available)})",
            "'deploy doctor' says what is missing; the onnx-fp32 artifact runs on the CPU",
        )
    return [(p, tensorrt_provider_options(spec, cache_dir)) if p == "TensorrtExecutionProvider" else p for p in gpu] + [
        "CPUExecutionProvider"
    ]


_ORT_NOISE = (
    re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : "),
    re.compile(r"^Load model from .*? failed:"),
    re.compile(r"^\S+\.(?:cc|h):\d+ (?:\S+ )?[\w:~<>]+\(.*?\) "),  # C++ file:line and signature
)


def ort_message(exc: BaseException) -> str:
    """ORT's error text without its status prefix, model path and C++ source location."""
    text = first_line(exc, limit=2000)
    for pattern in _ORT_NOISE:
        text = pattern.sub("", text).strip()
    return text[:400]


@functools.cache
def register_shared_arena() -> None:
    """Register, once per process, the CPU arena that sessions with ``session.use_env_allocators``
    share. It extends by what is requested, not by doubling: after merged batches of sizes 1-8 on
    EfficientNet-Lite0 the server held 299 MB instead of 333 (medians of four alternating starts)."""
    import onnxruntime as ort

    cpu = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
    ort.create_and_register_allocator(cpu, ort.OrtArenaCfg({"arena_extend_strategy": 1}))  # kSameAsRequested


class OnnxRuntime(Runtime):
    name = "onnxruntime"
    formats = ("onnx", "ort", "tensorrt")
    targets = ("cpu", "gpu", "edge")
    required_modules = ("onnxruntime",)

    @classmethod
    def availability(cls) -> Availability:
        found = super().availability()
        if not found.ok:
            return found
        import onnxruntime

        return Availability(
            True, f"providers: {', '.join(onnxruntime.get_available_providers())}", modules=found.modules
        )

    def _load(self) -> None:
        import onnxruntime as ort

        session_options = ort.SessionOptions()
        session_options.intra_op_num_threads = self.options.threads or usable_cores()
        if self.options.spin == "never":
            session_options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        elif self.options.spin == "run":
            session_options.add_session_config_entry("session.force_spinning_stop", "1")
        if self.options.shared_arena:
            register_shared_arena()
            session_options.add_session_config_entry("session.use_env_allocators", "1")
            # a memory plan per input shape keeps a block for each batch size seen
            session_options.enable_mem_pattern = False
        session_options.log_severity_level = 3  # errors only; our own messages say what went wrong
        self.spec = EngineSpec.load(self.path) if is_engine_spec(self.path) else None
        if self.spec is not None:
            cache = (self.options.engine_cache or default_cache_dir()) / "onnxruntime"
            providers = recipe_providers(self.spec, self.options.device, ort.get_available_providers(), cache)
            cache.mkdir(parents=True, exist_ok=True)
        else:
            providers = choose_providers(self.options.device, ort.get_available_providers())
        model = self.spec.onnx_path if self.spec else self.path
        try:
            self.session = ort.InferenceSession(str(model), session_options, providers=providers)
        except Exception as exc:  # ORT raises its own untyped pybind errors
            raise PackageError(
                f"ONNX Runtime cannot load '{self.path.name}': {ort_message(exc)}",
                "the artifact is invalid or needs a newer onnxruntime",
            ) from exc
        session_inputs = {i.name for i in self.session.get_inputs()}
        if session_inputs != set(self.signature.input_names):
            raise PackageError(
                f"'{self.path.name}' takes inputs {sorted(session_inputs)} but the signature lists "
                f"{sorted(self.signature.input_names)}",
                "the package is inconsistent; export it again",
            )
        self._output_names = [o.name for o in self.session.get_outputs()]

    @property
    def max_batch_size(self) -> int | None:
        return self.spec.max_batch_size if self.spec else None

    def describe(self) -> dict[str, Any]:
        recipe = {"precision": self.spec.precision, "profiles": self.spec.profile_text()} if self.spec else {}
        return {
            "runtime": self.name,
            "providers": self.session.get_providers(),
            "threads": self.options.threads or "auto",
            **recipe,
        }

    def _run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.spec is not None:
            check_shapes(self.spec.profiles, inputs)
        try:
            outputs = self.session.run(self._output_names, inputs)
        except Exception as exc:
            raise RuntimeFailure(f"ONNX Runtime failed: {ort_message(exc)}") from exc
        return dict(zip(self._output_names, outputs))

    def shrink(self, inputs: Mapping[str, Any]) -> None:
        """ONNX Runtime keeps the arena a merged batch grew (about 125 MB for the benchmark's two
        models after batch 8); a run with arena shrinkage frees what that run does not use."""
        import onnxruntime as ort

        options = ort.RunOptions()
        options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        self.session.run(self._output_names, self.signature.validate_inputs(inputs), options)

    def close(self) -> None:
        self.__dict__.pop("session", None)
