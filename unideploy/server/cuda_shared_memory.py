"""Triton's CUDA shared memory extension: tensors a co-located client keeps in GPU memory.

The client allocates device memory, exports it with ``cudaIpcGetMemHandle`` and registers the
64-byte handle with a device and a size (``tritonclient.utils.cuda_shared_memory`` does both;
``perf_analyzer --shared-memory cuda`` uses it). The server maps the memory into its own address
space (``cudaIpcOpenMemHandle``); an input named in such a region is merged in GPU memory, copied
from device to device, where the model's runtime reads batches there (``runtimes.device_batches``),
else copied from the device into the (page-locked) host batch; an output is copied from the host
into the region. So a request carries no tensor bytes, and its input need not cross the host at all.

As with system shared memory, registering is authorized like inference, the region's size is
checked against the allocation the handle exports (``cuMemGetAddressRange``), every read and
write against the region, and an operator turns the extension on only on purpose
(``--shared-memory cuda``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from unideploy.runtimes import cuda_api
from unideploy.runtimes.cuda_work import CUDA_WORK
from unideploy.server.errors import BadRequest

HANDLE_BYTES = 64  # CUDA_IPC_HANDLE_SIZE


@dataclass
class CudaRegion:
    """A client's device memory, mapped into this process until unregistered."""

    name: str
    device_id: int
    byte_size: int
    pointer: int  # the device address the mapping starts at

    @classmethod
    def open(cls, name: str, raw_handle: Any, device_id: Any, byte_size: int) -> CudaRegion:
        """Map the memory ``raw_handle`` exports on GPU ``device_id``: refused (400) when the
        handle is not one, the device does not exist, or ``byte_size`` runs past the allocation."""
        if not isinstance(raw_handle, bytes | bytearray) or len(raw_handle) != HANDLE_BYTES:
            size = len(raw_handle) if isinstance(raw_handle, bytes | bytearray) else "no"
            raise BadRequest(
                f"CUDA shared memory region '{name}': raw_handle has {size} bytes, not a {HANDLE_BYTES}-byte "
                "cudaIpcMemHandle_t",
                "send the handle tritonclient.utils.cuda_shared_memory.get_raw_handle gives (base64 over REST)",
            )
        if not isinstance(device_id, int) or isinstance(device_id, bool) or device_id < 0:
            raise BadRequest(f"CUDA shared memory region '{name}': device_id {device_id!r} is not a GPU's number")
        cudart = cuda_api.runtime()
        _checked(cudart.cudaSetDevice(device_id)[0], name, f"GPU {device_id} cannot be used")
        handle = cudart.cudaIpcMemHandle_t()
        handle.reserved = bytes(raw_handle)
        with CUDA_WORK.shared():
            error, pointer = cudart.cudaIpcOpenMemHandle(handle, cudart.cudaIpcMemLazyEnablePeerAccess)
        _checked(
            error,
            name,
            f"the handle cannot be opened on GPU {device_id}",
            "the handle must come from cudaIpcGetMemHandle in another process, for memory still allocated",
        )
        region = cls(name, device_id, byte_size, int(pointer))
        error, base, extent = cuda_api.driver().cuMemGetAddressRange(region.pointer)
        if not cuda_api.succeeded(error) or region.pointer + byte_size > int(base) + int(extent):
            region.close()
            found = (
                f"the allocation holds {int(base) + int(extent) - region.pointer} bytes"
                if cuda_api.succeeded(error)
                else cuda_api.describe(error)
            )
            raise BadRequest(
                f"CUDA shared memory region '{name}' ({byte_size} bytes) is larger than its memory: {found}"
            )
        return region

    def reaches_gpu(self, device: int) -> bool:
        """Whether GPU ``device`` copies from this memory directly: the GPU it is on."""
        return self.device_id == device

    def gpu_source(self, start: int, nbytes: int) -> int:
        """Where the device copies ``nbytes`` from ``start`` (checked against the region already)."""
        return self.pointer + start

    def into(self, start: int, out: memoryview) -> None:
        """``len(out)`` bytes from ``start``, copied from the device into host memory ``out``."""
        host = np.frombuffer(out, np.uint8)
        self._copy(host.ctypes.data, self.pointer + start, len(out), "cudaMemcpyDeviceToHost")

    def write(self, start: int, blob: bytes) -> None:
        source = np.frombuffer(blob, np.uint8)
        self._copy(self.pointer + start, source.ctypes.data, len(blob), "cudaMemcpyHostToDevice")

    def _copy(self, destination: int, source: int, nbytes: int, kind: str) -> None:
        cudart = cuda_api.runtime()
        cudart.cudaSetDevice(self.device_id)  # the calling thread's device: the one the mapping is in
        with CUDA_WORK.shared():
            error = cudart.cudaMemcpy(destination, source, nbytes, getattr(cudart.cudaMemcpyKind, kind))[0]
        _checked(error, self.name, "the copy failed", "check that the client has not freed the region's memory")

    def close(self) -> None:
        cudart = cuda_api.runtime()
        cudart.cudaSetDevice(self.device_id)
        with CUDA_WORK.shared():
            cudart.cudaIpcCloseMemHandle(self.pointer)

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}


def _checked(error: Any, name: str, what: str, hint: str | None = None) -> None:
    if not cuda_api.succeeded(error):
        raise BadRequest(f"CUDA shared memory region '{name}': {what} ({cuda_api.describe(error)})", hint)
