"""Which NVIDIA GPUs this machine has, read through NVML (the driver's management library).

The GPU model and compute capability are part of every TensorRT engine's cache key, and
``deploy doctor`` needs to tell "no driver" from "driver but no GPU". NVML answers both without
creating a CUDA context, so asking costs milliseconds and no GPU memory.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str  # e.g. "NVIDIA H100 80GB HBM3"
    compute_capability: str  # e.g. "9.0"
    memory_mib: int
    driver: str


def find_gpus() -> tuple[list[Gpu], str]:
    """The GPUs NVML reports, and a sentence saying what was found or why none was."""
    if importlib.util.find_spec("pynvml") is None:
        return [], "nvidia-ml-py is not installed, so GPUs cannot be listed (pip install 'unideploy[gpu]')"
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return [], f"no NVIDIA driver here (NVML: {exc})"
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1 << 20)
            gpus.append(Gpu(index, _text(pynvml.nvmlDeviceGetName(handle)), f"{major}.{minor}", int(memory), driver))
    except pynvml.NVMLError as exc:
        return [], f"the NVIDIA driver did not list its GPUs (NVML: {exc})"
    finally:
        pynvml.nvmlShutdown()
    if not gpus:
        return [], f"NVIDIA driver {driver} is installed but sees no GPU"
    return gpus, ", ".join(f"{g.name} (compute {g.compute_capability}, {g.memory_mib} MiB)" for g in gpus)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value  # older NVML bindings return bytes
