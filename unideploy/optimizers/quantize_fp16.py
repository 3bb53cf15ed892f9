"""FP16: weights and compute in half precision, inputs and outputs kept fp32 for callers.

ONNX Runtime's CPU provider runs most fp16 operators by casting back to fp32, so on CPU this
halves the file and saves no time. The artifact is therefore marked for the gpu and edge targets
(CUDA/TensorRT, mobile GPUs and NPUs compute in fp16 natively), and the pass says so.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from unideploy.errors import ExportError, first_line
from unideploy.optimizers.base import OptimizerPass, PassContext, PassResult


class Fp16Conversion(OptimizerPass):
    name = "quantize-fp16"
    stage = "quantize"

    def apply(self, model_path: Path, ctx: PassContext) -> PassResult:
        from onnxruntime.transformers.float16 import convert_float_to_float16

        ctx.say("converting weights and compute to FP16")
        try:
            model = convert_float_to_float16(onnx.load(str(model_path)), keep_io_types=True)
        except Exception as exc:
            raise ExportError(f"FP16 conversion failed: {first_line(exc)}") from exc
        out = ctx.workdir / "fp16.onnx"
        onnx.save(model, str(out))
        return PassResult(
            path=out, precision="fp16", params={"keep_io_types": True}, targets=["gpu", "edge"],
            notes=["on CPU, FP16 halves the size but does not run faster (ONNX Runtime computes it in fp32); "
                   "it is meant for GPU and mobile runtimes"],
        )
