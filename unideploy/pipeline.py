"""The spine in one call: export, then optimize and/or add edge or GPU artifacts, as one atomic step.

Intermediate packages live in a temporary directory and only the last stage writes the
destination: a refused optimization or a failed edge conversion leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from unideploy.exporters.export import export
from unideploy.optimizers.base import OptimizeRequest
from unideploy.optimizers.optimize import optimize
from unideploy.package.files import scratch_dir
from unideploy.package.writer import check_destination
from unideploy.targets import check_options, require_target

Stage = Callable[[Path, Path, bool], Path]  # (package, destination, overwrite) -> written package


def export_package(
    src: str | Path,
    output: str | Path,
    *,
    optimization: OptimizeRequest | None = None,
    overwrite: bool = False,
    progress: Callable[[str], None] | None = None,
    target_options: Mapping[str, Any] | None = None,
    **export_kwargs: Any,
) -> Path:
    """``target_options``: the options of ``target``'s stage by name, checked against the target's
    own model (``trt_precision``, ``trt_profile``, ``trt_workspace`` for ``gpu``; targets.py),
    ``calibration`` (the int8 TFLite of ``edge``, TensorRT's calibrator) and ``accuracy`` (the budget
    and metric a stage's accuracy guard judges with: ``max_accuracy_drop``, ``metric``, ``min_cosine``,
    ``decision_thresholds``)."""
    stages: list[Stage] = []
    if optimization is not None:
        stages.append(lambda pkg, dest, force: optimize(pkg, optimization, dest, overwrite=force, progress=progress))
    target = export_kwargs.get("target", "cpu")
    given = dict(target_options or {})
    options = {  # checked before any work
        **check_options(target, given),
        "calibration": given.get("calibration"),
        "accuracy": given.get("accuracy"),
    }
    target_stage = require_target(target).load_stage()
    if target_stage is not None:
        stages.append(lambda pkg, dest, force: target_stage(pkg, dest, options, overwrite=force, progress=progress))
    accuracy = given.get("accuracy")  # also what a quantized source's ONNX artifact is judged with
    if not stages:
        return export(src, output, overwrite=overwrite, progress=progress, accuracy=accuracy, **export_kwargs)
    check_destination(Path(output), overwrite)
    with scratch_dir("unideploy-export-") as tmp:
        current = export(src, Path(tmp) / "stage0", progress=progress, accuracy=accuracy, **export_kwargs)
        for i, stage in enumerate(stages, 1):
            last = i == len(stages)
            current = stage(current, Path(output) if last else Path(tmp) / f"stage{i}", overwrite if last else False)
        return current
