"""Running a TensorRT engine: one execution context, its own CUDA stream, device buffers by name.

Polygraphy's ``TrtRunner`` is meant for testing and debugging (its own words). So serving uses
TensorRT's API directly: ``set_input_shape`` / ``set_tensor_address`` per named tensor, then
``execute_async_v3`` on the stream. Memory and copies go through Polygraphy's thin CUDA wrappers
(``DeviceArray``, ``Stream``), the same ones its calibrator uses. Buffers grow to the largest
batch seen and are then reused, so a steady load allocates nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from unideploy.errors import RuntimeFailure
from unideploy.signature import contiguous


class EngineExecution:
    """Not thread-safe, like the execution context under it: the runtime serializes calls."""

    def __init__(self, engine: Any, output_names: list[str]) -> None:
        import tensorrt as trt
        from polygraphy import cuda

        self.context = engine.create_execution_context()
        if self.context is None:
            raise RuntimeFailure("TensorRT could not create an execution context (out of GPU memory?)")
        self.stream = cuda.Stream()
        self.output_dtypes = {name: np.dtype(trt.nptype(engine.get_tensor_dtype(name))) for name in output_names}
        self.buffers: dict[str, Any] = {}

    def _device(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        from polygraphy import cuda
        from polygraphy.datatype import DataType

        buffer = self.buffers.get(name)
        if buffer is None:
            buffer = self.buffers[name] = cuda.DeviceArray(shape=shape, dtype=DataType.from_dtype(dtype))
        else:
            buffer.resize(shape)  # reallocates only when it grows
        self.context.set_tensor_address(name, buffer.ptr)
        return buffer

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        for name, array in inputs.items():
            host = contiguous(array)
            if not self.context.set_input_shape(name, host.shape):
                raise RuntimeFailure(f"TensorRT refused shape {list(host.shape)} for input '{name}'")
            self._device(name, host.shape, host.dtype).copy_from(host, self.stream)
        outputs = {}
        for name, dtype in self.output_dtypes.items():
            shape = tuple(self.context.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise RuntimeFailure(
                    f"output '{name}' has a data-dependent shape {list(shape)}, which this runtime "
                    "does not support; run the onnx-fp32 artifact on ONNX Runtime"
                )
            outputs[name] = (self._device(name, shape, dtype), np.empty(shape, dtype))
        if not self.context.execute_async_v3(self.stream.ptr):
            raise RuntimeFailure("TensorRT could not enqueue the inference (see the TensorRT log above)")
        for device, host in outputs.values():
            device.copy_to(host, self.stream)
        self.stream.synchronize()
        return {name: host for name, (_, host) in outputs.items()}

    def close(self) -> None:
        for buffer in self.buffers.values():
            buffer.free()
        self.buffers.clear()
        self.stream.free()
        self.context = None
