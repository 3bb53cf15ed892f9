"""The spine in one call: export, then (optionally) optimize, as one atomic step.

With an optimization, the exported package is staged in a temporary directory and only the
optimized package reaches the destination: a refused optimization leaves nothing behind.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable

from unideploy.exporters.export import export
from unideploy.optimizers.optimize import OptimizeRequest, optimize
from unideploy.package.writer import check_destination


def export_package(src: str | Path, output: str | Path, *, optimization: OptimizeRequest | None = None,
                   overwrite: bool = False, progress: Callable[[str], None] | None = None, **export_kwargs: Any) -> Path:
    if optimization is None:
        return export(src, output, overwrite=overwrite, progress=progress, **export_kwargs)
    check_destination(Path(output), overwrite)
    with tempfile.TemporaryDirectory(prefix="unideploy-export-") as tmp:
        staged = export(src, Path(tmp) / "package", progress=progress, **export_kwargs)
        return optimize(staged, optimization, output, overwrite=overwrite, progress=progress)
