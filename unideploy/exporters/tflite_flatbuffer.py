"""A ``.tflite`` as TensorFlow's flatbuffer object API gives it to the copies made for tf2onnx
(``tflite_dense.py``, ``tflite_custom.py``): names stored as bytes, and operator codes whose builtin
operator is in one of two fields (the byte-wide one older files use, the int32 one newer ones add)."""

from __future__ import annotations

from typing import Any


def text(value: object) -> str:
    """A name or custom code the object API holds as bytes (or None), as text."""
    return value.decode() if isinstance(value, bytes) else str(value or "")


def builtin_of(code: Any) -> int:
    """The builtin operator an operator code stands for, whichever field holds it."""
    return int(max(code.builtinCode, code.deprecatedBuiltinCode))
