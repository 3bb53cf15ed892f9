"""Deployment targets: which artifacts a package needs for where it will run.

Each target names the stage that produces its artifacts. Stages arrive with their own issues;
a target whose stage is missing is refused up front, before any work, with what to use instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from unideploy.errors import MissingDependencyError


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    runtimes: tuple[str, ...]
    stage_available: bool


TARGETS = {
    "cpu": Target("cpu", "ONNX artifact for ONNX Runtime on CPU servers", ("onnxruntime",), True),
    "gpu": Target(
        "gpu",
        "TensorRT engine recipes (fp16/int8/fp32), built and cached per GPU; ONNX Runtime "
        "TensorRT/CUDA providers where TensorRT is absent",
        ("tensorrt", "onnxruntime"),
        True,
    ),
    "edge": Target(
        "edge",
        "ORT-mobile and TFLite (fp32, fp16, int8) artifacts for phones and edge boxes",
        ("tflite", "onnxruntime"),
        True,
    ),
    "ascend": Target("ascend", "MindIR / MindSpore Lite artifacts for Ascend NPUs", ("mindspore-lite",), False),
}


def require_target(name: str) -> Target:
    target = TARGETS[name]
    if not target.stage_available:
        raise MissingDependencyError(
            f"target '{name}' ({target.description}) needs a stage this version of unideploy does not include yet",
            "export with --target cpu or edge; a MindIR source's package keeps its .mindir, which MindSpore runs",
        )
    return target
