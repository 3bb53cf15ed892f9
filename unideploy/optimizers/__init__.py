"""Optimizer passes (pruning, INT8, FP16), composable in order prune -> quantize, each guarded by
a measured accuracy budget. Built-ins are listed here; others arrive through the
``unideploy.optimizers`` entry-point group."""

from unideploy.optimizers.base import OptimizerPass, PassContext, PassResult
from unideploy.registry import Registry

PASSES: Registry[OptimizerPass] = Registry(
    "optimizer pass",
    "unideploy.optimizers",
    builtin={
        "prune-magnitude": "unideploy.optimizers.prune_magnitude:MagnitudePruning",
        "prune-channels": "unideploy.optimizers.prune_channels:ChannelPruning",
        "quantize-int8": "unideploy.optimizers.quantize_int8:Int8Quantization",
        "quantize-fp16": "unideploy.optimizers.quantize_fp16:Fp16Conversion",
    },
)

__all__ = ["PASSES", "OptimizerPass", "PassContext", "PassResult"]
