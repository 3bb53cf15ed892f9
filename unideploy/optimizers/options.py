"""The built-in passes' own options (``options.PluginOptions``), apart from the passes so that the
command line lists them without importing a pass (and onnx)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from unideploy.options import PluginOptions


class Int8Options(PluginOptions):
    int8_variant: Literal["auto", "static", "dynamic", "symmetric"] = Field(
        "auto",
        description="static (QDQ, uint8 activations), dynamic (MatMul weights), symmetric (QDQ for TensorRT); "
        "auto picks between static and dynamic",
    )
    calibration_method: Literal["minmax", "entropy", "percentile"] = Field(
        "minmax", description="how the ranges of static INT8's activations are taken from the calibration data"
    )
    quantize_sensitive_ops: bool = Field(
        False, description="also quantize LayerNorm/Softmax/GELU/... (kept in float by default)"
    )
    keep_slower: bool = Field(
        False,
        description="keep an INT8 model that runs slower than fp32 on this CPU (refused by default), "
        "for another CPU that will serve it",
    )


class Fp16Options(PluginOptions):
    transformer_fusions: bool = Field(
        True,
        description="do not fuse a transformer's attention, LayerNorms and GELUs before FP16 "
        "(ONNX Runtime's fused operators, what makes FP16 pay on a GPU)",
    )


class PruningOptions(PluginOptions):
    refit: bool = Field(True, description="do not re-fit pruned layers on calibration data")


class MagnitudeOptions(PruningOptions):
    prune_scope: Literal["row", "tensor", "global"] = Field(
        "row",
        description="magnitude pruning: the same share pruned in every output row, in every layer, "
        "or one threshold over all layers",
    )
