"""``--target gpu``'s own options (``options.PluginOptions``), apart from its stage so that the
command line lists them without importing it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from unideploy.options import PluginOptions


class GpuOptions(PluginOptions):
    trt_precision: tuple[Literal["fp32", "fp16", "int8"], ...] = Field(
        ("fp16",),
        description="TensorRT engine precision, repeatable: one artifact each. int8 uses the symmetric QDQ "
        "artifact of --int8-variant symmetric, else calibrates on --calibration",
        json_schema_extra={"metavar": "PRECISION"},
    )
    trt_profile: tuple[str, ...] = Field(
        (),
        description="shape range of a dynamic input, repeatable: ids:1x16,8x128,32x512 (default for a dynamic "
        "batch alone: 1, 8, 32 rows)",
        json_schema_extra={"metavar": "NAME:MIN,OPT,MAX"},
    )
    trt_workspace: int | None = Field(
        None, ge=1, description="TensorRT builder workspace limit", json_schema_extra={"metavar": "MIB"}
    )
