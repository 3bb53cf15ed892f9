"""The source framework in a process of its own (``deploy export --trust-source``).

When a user waives the scan of ``trust.py``, the model runs code nobody checked. Conversion, the
reference outputs and a native artifact's validation then run in a fresh Python process
(``child_process.py``) whose working directory is a private folder inside the export's temporary
directory, removed with it. A model that crashes or exits takes only that process down, and the
package is not written; what it writes by relative path lands in that folder. It is a process
boundary, not a sandbox: the model still runs with the user's rights (docs/security.md).
"""

from __future__ import annotations

from pathlib import Path

from unideploy import child_process
from unideploy.exporters.base import ExportOptions
from unideploy.exporters.export import SourceRun


def run_in_process(
    exporter: str, src: Path, workdir: Path, options: ExportOptions, atol: float, rtol: float
) -> SourceRun:
    """``export.run_source`` in a new interpreter; its errors are raised here as they were there."""
    run: SourceRun = child_process.call(
        _run_source,
        exporter,
        src.resolve(),
        workdir.resolve(),
        options,
        atol,
        rtol,
        workdir=workdir,
        what=f"the process running '{src.name}'",
        hint="the model crashed or exited while it ran; check it with its own framework first",
    )
    return run


def _run_source(exporter: str, src: Path, workdir: Path, options: ExportOptions, atol: float, rtol: float) -> SourceRun:
    from unideploy.exporters import EXPORTERS
    from unideploy.exporters.export import run_source

    return run_source(EXPORTERS.get(exporter), src, workdir, options, atol, rtol, _quiet)


def _quiet(message: str) -> None:
    """Progress stays with the exporting process, which said what runs here."""
