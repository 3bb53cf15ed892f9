"""Optimizer passes (pruning, INT8, FP16), composable in order prune -> quantize, each guarded by
a measured accuracy budget. Built-ins are listed here; others arrive through the
``unideploy.optimizers`` entry-point group."""

from typing import Any

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


def pass_options() -> dict[str, tuple[list[str], Any]]:
    """Every option a registered pass declares: the passes that take it, and its default."""
    found: dict[str, tuple[list[str], Any]] = {}
    for name, cls in PASSES:
        for option, field in cls.options.model_fields.items():
            found.setdefault(option, ([], field.default))[0].append(name)
    return found


__all__ = ["PASSES", "OptimizerPass", "PassContext", "PassResult", "pass_options"]
