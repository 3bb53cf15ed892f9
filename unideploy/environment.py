"""Environment variables set for one step only.

Converters configure themselves through the process environment (onnx2tf sets TF_USE_LEGACY_KERAS
and TF_CPP_MIN_LOG_LEVEL when imported; we put a venv's scripts on PATH for its onnxsim). A user's
program that exports a model and then starts its own TensorFlow or Keras code must not inherit
those, so every such change is scoped: what a step set or changed is put back when it ends."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def environment(**values: str | None) -> Iterator[None]:
    """Set each variable given a string, leave one given None as it is; on exit put every named
    variable back as it was before (or remove it), whatever the step itself wrote to it."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update({name: value for name, value in values.items() if value is not None})
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
