"""The spine in one call: export, then optimize and/or add edge or GPU artifacts, as one atomic step.

Intermediate packages live in a temporary directory and only the last stage writes the
destination: a refused optimization or a failed edge conversion leaves nothing behind.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from unideploy.edge.build import build_edge
from unideploy.exporters.export import export
from unideploy.gpu.build import GpuRequest, build_gpu
from unideploy.optimizers.optimize import OptimizeRequest, optimize
from unideploy.package.writer import check_destination

Stage = Callable[[Path, Path, bool], Path]  # (package, destination, overwrite) -> written package


def export_package(
    src: str | Path,
    output: str | Path,
    *,
    optimization: OptimizeRequest | None = None,
    overwrite: bool = False,
    progress: Callable[[str], None] | None = None,
    edge_calibration: str | Path | None = None,
    gpu: GpuRequest | None = None,
    **export_kwargs: Any,
) -> Path:
    """``edge_calibration``: data for the int8 TFLite artifact of ``target="edge"``; ``gpu``: the
    TensorRT precisions, profiles and workspace of ``target="gpu"`` (default: fp16)."""
    stages: list[Stage] = []
    if optimization is not None:
        stages.append(lambda pkg, dest, force: optimize(pkg, optimization, dest, overwrite=force, progress=progress))
    if export_kwargs.get("target") == "edge":
        stages.append(
            lambda pkg, dest, force: build_edge(
                pkg, dest, overwrite=force, progress=progress, calibration=edge_calibration
            )
        )
    if export_kwargs.get("target") == "gpu":
        stages.append(lambda pkg, dest, force: build_gpu(pkg, dest, gpu, overwrite=force, progress=progress))
    if not stages:
        return export(src, output, overwrite=overwrite, progress=progress, **export_kwargs)
    check_destination(Path(output), overwrite)
    with tempfile.TemporaryDirectory(prefix="unideploy-export-") as tmp:
        current = export(src, Path(tmp) / "stage0", progress=progress, **export_kwargs)
        for i, stage in enumerate(stages, 1):
            last = i == len(stages)
            current = stage(current, Path(output) if last else Path(tmp) / f"stage{i}", overwrite if last else False)
        return current
