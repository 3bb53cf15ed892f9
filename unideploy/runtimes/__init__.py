"""Runtime plug-ins. Built-ins are listed here; others arrive through the ``unideploy.runtimes``
entry-point group."""

from unideploy.registry import Registry
from unideploy.runtimes.base import Runtime, RuntimeOptions

RUNTIMES: Registry[Runtime] = Registry(
    "runtime",
    "unideploy.runtimes",
    builtin={
        "onnxruntime": "unideploy.runtimes.onnxruntime_runtime:OnnxRuntime",
        "tflite": "unideploy.runtimes.tflite_runtime:TFLiteRuntime",
        "mindspore": "unideploy.runtimes.mindspore_runtime:MindSporeRuntime",
        "tensorrt": "unideploy.runtimes.tensorrt.runtime:TensorRTRuntime",
    },
)

__all__ = ["RUNTIMES", "Runtime", "RuntimeOptions"]
