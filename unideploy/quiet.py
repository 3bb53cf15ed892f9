"""Silencing converters: torch, TensorFlow, tf2onnx and onnxruntime.quantization print IR dumps,
progress and warnings from Python and from native code straight to fds 1/2. unideploy reports
what matters itself; ``UNIDEPLOY_DEBUG=1`` (``deploy --debug``) lets everything through."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator

from unideploy.environment import environment


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    if os.environ.get("UNIDEPLOY_DEBUG"):
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    # TensorFlow reads its log level once, at its first log line (importing it writes some, inside
    # this block); programs the user starts afterwards get their own setting back.
    level = os.environ.get("TF_CPP_MIN_LOG_LEVEL", "3")
    with tempfile.TemporaryFile() as sink, warnings.catch_warnings(), environment(TF_CPP_MIN_LOG_LEVEL=level):
        warnings.simplefilter("ignore")
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        logging.disable(logging.ERROR)
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                yield
        finally:
            logging.disable(logging.NOTSET)
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
