"""ONNX Runtime: the embedded default runtime (CPU), using CUDA/TensorRT providers when present."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from unideploy.errors import MissingDependencyError, PackageError, RuntimeFailure, first_line
from unideploy.registry import Availability, modules_availability
from unideploy.runtimes.base import Runtime

GPU_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider")


def choose_providers(device: str, available: list[str]) -> list[str]:
    """Order execution providers for a device request: GPU ones first when asked or present."""
    gpu = [p for p in GPU_PROVIDERS if p in available]
    if device == "cpu":
        return ["CPUExecutionProvider"]
    if device == "gpu" and not gpu:
        raise MissingDependencyError(
            "no GPU execution provider in this onnxruntime build "
            f"(available: {', '.join(available)})",
            "pip install onnxruntime-gpu on a machine with a CUDA GPU, or use --device cpu",
        )
    return gpu + ["CPUExecutionProvider"]


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


class OnnxRuntime(Runtime):
    name = "onnxruntime"
    formats = ("onnx", "ort")
    targets = ("cpu", "gpu", "edge")

    @classmethod
    def availability(cls) -> Availability:
        found = modules_availability(("onnxruntime",), None)
        if not found.ok:
            return found
        import onnxruntime

        return Availability(True, f"{found.detail}; providers: {', '.join(onnxruntime.get_available_providers())}")

    def _load(self) -> None:
        import onnxruntime as ort

        session_options = ort.SessionOptions()
        if self.options.threads:
            session_options.intra_op_num_threads = self.options.threads
        if not self.options.spin:
            session_options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session_options.log_severity_level = 3  # errors only; our own messages say what went wrong
        providers = choose_providers(self.options.device, ort.get_available_providers())
        try:
            self.session = ort.InferenceSession(str(self.path), session_options, providers=providers)
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

    def describe(self) -> dict[str, Any]:
        return {"runtime": self.name, "providers": self.session.get_providers(),
                "threads": self.options.threads or "auto"}

    def _run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            outputs = self.session.run(self._output_names, inputs)
        except Exception as exc:
            raise RuntimeFailure(f"ONNX Runtime failed: {ort_message(exc)}") from exc
        return dict(zip(self._output_names, outputs))

    def close(self) -> None:
        self.__dict__.pop("session", None)

