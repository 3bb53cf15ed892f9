"""The source framework in a process of its own (``deploy export --trust-source``).

When a user waives the scan of ``trust.py``, the model runs code nobody checked. Conversion, the
reference outputs and a native artifact's validation then run in a fresh Python process (a new
interpreter: nothing of the exporting process is shared) whose working directory is a private
folder inside the export's temporary directory, removed with it. A model that crashes or exits
takes only that process down, and the package is not written; what it writes by relative path
lands in that folder. The job and its answer travel as pickles in the same private directory.
It is a process boundary, not a sandbox: the model still runs with the user's rights
(docs/security.md).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

from unideploy.errors import ExportError, first_line
from unideploy.exporters.base import ExportOptions
from unideploy.exporters.export import SourceRun

JOB, ANSWER, LOG = "job.pickle", "answer.pickle", "source.log"


def run_in_process(
    exporter: str, src: Path, workdir: Path, options: ExportOptions, atol: float, rtol: float
) -> SourceRun:
    """``export.run_source`` in a new interpreter; its errors are raised here as they were there."""
    private = Path(tempfile.mkdtemp(prefix="source-", dir=workdir))
    with open(private / JOB, "wb") as fh:
        pickle.dump((exporter, src.resolve(), workdir.resolve(), options, atol, rtol), fh)
    with open(private / LOG, "wb") as log:
        code = subprocess.run(
            [sys.executable, "-m", __name__, str(private)], cwd=private, stdout=log, stderr=subprocess.STDOUT
        ).returncode
    answer = private / ANSWER
    if not answer.exists():
        lines = (private / LOG).read_text(errors="replace").strip().splitlines()
        raise ExportError(
            f"the process running '{src.name}' ended (exit {code}) before it finished: "
            f"{lines[-1][:300] if lines else 'no output'}",
            "the model crashed or exited while it ran; check it with its own framework first",
        )
    with open(answer, "rb") as fh:
        ok, value = pickle.load(fh)
    if not ok:
        raise value
    return value


def main(private: Path) -> None:
    from unideploy.exporters import EXPORTERS
    from unideploy.exporters.export import run_source

    with open(private / JOB, "rb") as fh:
        exporter, src, workdir, options, atol, rtol = pickle.load(fh)
    try:
        data = pickle.dumps((True, run_source(EXPORTERS.get(exporter), src, workdir, options, atol, rtol, _quiet)))
    except Exception as exc:  # raised again in the exporting process, with its type and hint
        try:
            data = pickle.dumps((False, exc))
        except Exception:  # a framework exception that does not pickle: its type and first line
            data = pickle.dumps((False, ExportError(f"{type(exc).__name__}: {first_line(exc)}")))
    (private / f"{ANSWER}.partial").write_bytes(data)
    os.replace(private / f"{ANSWER}.partial", private / ANSWER)


def _quiet(message: str) -> None:
    """Progress stays with the exporting process, which said what runs here."""


if __name__ == "__main__":
    main(Path(sys.argv[1]))
