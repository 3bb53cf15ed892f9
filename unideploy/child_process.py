"""One call in a fresh Python process: native code that crashes takes only that process down.

Used where code we cannot vet runs: a source model's own code under ``--trust-source``
(``exporters/source_process.py``), and TensorFlow's int8 calibrator, which segfaults on some
recurrent models (ddddocr's LSTM). The child is a new interpreter (nothing of the calling process
is shared); its working directory is a private folder inside ``workdir``, removed with it, so
what it writes by relative path lands there. The call and its answer travel as pickles in that
folder; one of our own errors raised there is raised here with its type and hint, and any other
exception (a framework's own: ONNX Runtime's folding raises on Silero VAD's If branches about one
run in four, and segfaults on the rest) becomes an ExportError naming ``what`` failed, like a crash
does. It is a process boundary, not a sandbox: the child runs with the user's rights
(docs/security.md).
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from unideploy.errors import ExportError, UnideployError, first_line

JOB, ANSWER, LOG = "job.pickle", "answer.pickle", "child.log"


def call(func: Callable[..., Any], *args: Any, workdir: Path, what: str, hint: str) -> Any:
    """``func(*args)`` in a child process (``func`` importable by name, ``args`` picklable). When
    the child ends without answering, an ExportError says ``what`` ended, how, and its last line;
    when it raised anything but an UnideployError, an ExportError says ``what`` failed and why."""
    private = Path(tempfile.mkdtemp(prefix="child-", dir=workdir))
    (private / JOB).write_bytes(pickle.dumps((func, args)))
    with open(private / LOG, "wb") as log:
        code = subprocess.run(
            [sys.executable, "-m", __name__, str(private)], cwd=private, stdout=log, stderr=subprocess.STDOUT
        ).returncode
    answer = private / ANSWER
    if not answer.exists():
        lines = (private / LOG).read_text(errors="replace").strip().splitlines()
        how = (
            f"killed by {signal.Signals(-code).name}"
            if code < 0 and -code in signal.valid_signals()
            else f"exit {code}"
        )
        raise ExportError(f"{what} ended ({how}) before it finished: {lines[-1][:300] if lines else 'no output'}", hint)
    ok, value = pickle.loads(answer.read_bytes())
    if ok:
        return value
    if isinstance(value, UnideployError):
        raise value
    raise ExportError(f"{what} failed: {value}", hint)


def main(private: Path) -> None:
    func, args = pickle.loads((private / JOB).read_bytes())
    try:
        data = pickle.dumps((True, func(*args)))
    except Exception as exc:  # ours raised again in the calling process as it is; any other, described
        try:
            data = pickle.dumps((False, exc if isinstance(exc, UnideployError) else _described(exc)))
        except Exception:  # one of ours that does not pickle
            data = pickle.dumps((False, _described(exc)))
    (private / f"{ANSWER}.partial").write_bytes(data)
    os.replace(private / f"{ANSWER}.partial", private / ANSWER)


def _described(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {first_line(exc)}"


if __name__ == "__main__":
    main(Path(sys.argv[1]))
