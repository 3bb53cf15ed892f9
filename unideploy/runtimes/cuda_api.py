"""NVIDIA's CUDA runtime from Python, through ``cuda-bindings`` (the ``gpu`` extra).

The server uses the CUDA runtime directly in two places, beside ONNX Runtime's own use of it:
page-locking the host buffers merged batches are written into (``runtimes.pinned``) and mapping
the device memory a co-located client registers as a CUDA shared-memory region
(``server.cuda_shared_memory``). Both need the same three things: the module loaded once and
only when asked, a CUDA error turned into words, and whether this machine can use CUDA at all.
"""

from __future__ import annotations

from functools import cache
from typing import Any

INSTALL = "pip install 'unideploy[gpu]'"


@cache
def runtime() -> Any:
    """``cuda.bindings.runtime`` (ImportError where cuda-bindings is not installed)."""
    from cuda.bindings import runtime as cudart

    return cudart


@cache
def driver() -> Any:
    """``cuda.bindings.driver``, for what the runtime API does not say (an allocation's extent)."""
    from cuda.bindings import driver as cuda_driver

    return cuda_driver


def describe(error: Any) -> str:
    """'cudaErrorInvalidValue: invalid argument' for a runtime or driver error code."""
    if isinstance(error, driver().CUresult):
        name, text = driver().cuGetErrorName(error)[1], driver().cuGetErrorString(error)[1]
    else:
        name, text = runtime().cudaGetErrorName(error)[1], runtime().cudaGetErrorString(error)[1]
    return f"{name.decode()}: {text.decode()}"


def succeeded(error: Any) -> bool:
    """Whether a runtime or driver call returned success."""
    return int(error) == 0  # cudaSuccess and CUDA_SUCCESS are both 0


def problem() -> str | None:
    """None where the CUDA runtime works here and sees a GPU, else why not (for messages)."""
    try:
        cudart = runtime()
    except ImportError:
        return f"cuda-bindings is not installed ({INSTALL})"
    error, count = cudart.cudaGetDeviceCount()
    if not succeeded(error):
        return f"the CUDA runtime cannot be used here ({describe(error)})"
    return None if count else "the CUDA runtime sees no GPU"
