"""Building an engine from a recipe, through Polygraphy's TensorRT loaders.

Polygraphy (NVIDIA's own toolkit) holds the parts that differ between TensorRT releases: ONNX
parsing, the builder configuration, optimization profiles, the int8 calibrator's device buffers
and the timing cache. What stays here is what unideploy decides: which flags and profiles a
recipe means (``builder_settings``, pure and tested without a GPU) and which rows calibrate.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from unideploy.errors import ExportError, first_line
from unideploy.runtimes.tensorrt.spec import EngineSpec


def builder_settings(spec: EngineSpec) -> dict[str, Any]:
    """``CreateConfig`` arguments for a recipe, except those that need TensorRT itself (workspace
    pool, calibrator). fp16 stays on for int8 so that layers without int8 kernels are not fp32."""
    from polygraphy.backend.trt import Profile

    profile = Profile()
    for p in spec.profiles:
        profile.add(p.name, min=p.min, opt=p.opt, max=p.max)
    return {"fp16": spec.precision in ("fp16", "int8"), "int8": spec.precision == "int8", "profiles": [profile]}


def calibration_batches(spec: EngineSpec) -> list[dict[str, np.ndarray]]:
    """The recipe's calibration rows in batches of the profile's opt batch size: the calibrator
    runs on the last profile, and every batch must fit it."""
    from unideploy.samples import load_npz_inputs, row_batches

    if spec.calibration_path is None:
        return []
    inputs = load_npz_inputs(str(spec.calibration_path), "TensorRT calibration data")
    rows = min(p.opt[0] for p in spec.profiles) if spec.profiles else None
    return row_batches(inputs, spec.calibration_path.name, fixed=rows)


def quiet_polygraphy() -> None:
    """Polygraphy logs every build step at INFO; keep warnings and errors unless --debug."""
    from polygraphy.logger import G_LOGGER

    G_LOGGER.module_severity = G_LOGGER.VERBOSE if os.environ.get("UNIDEPLOY_DEBUG") else G_LOGGER.WARNING


def build_engine(spec: EngineSpec, timing_cache: Path) -> bytes:
    """A serialized engine for this GPU. The timing cache (per GPU model and TensorRT version)
    makes rebuilds of the same layers take seconds instead of minutes."""
    import tensorrt as trt
    from polygraphy.backend.trt import Calibrator, CreateConfig, EngineBytesFromNetwork, NetworkFromOnnxPath
    from polygraphy.exception import PolygraphyException

    quiet_polygraphy()
    settings = builder_settings(spec)
    if spec.workspace_mib:
        settings["memory_pool_limits"] = {trt.MemoryPoolType.WORKSPACE: spec.workspace_mib << 20}
    if spec.int8 == "calibrated":
        settings["calibrator"] = Calibrator(calibration_batches(spec), BaseClass=trt.IInt8EntropyCalibrator2)
    timing_cache.parent.mkdir(parents=True, exist_ok=True)
    config = CreateConfig(load_timing_cache=str(timing_cache) if timing_cache.is_file() else None, **settings)
    network = NetworkFromOnnxPath(str(spec.onnx_path))
    try:
        return bytes(EngineBytesFromNetwork(network, config, save_timing_cache=str(timing_cache))())
    except PolygraphyException as exc:
        raise ExportError(
            f"TensorRT could not build an engine from '{spec.onnx}': {first_line(exc, 600)}",
            "an operator TensorRT does not support, or too small a --trt-workspace; "
            "the onnx-fp32 artifact still runs on ONNX Runtime",
        ) from exc
