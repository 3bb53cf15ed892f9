"""An inference request's body received straight into one buffer, laid out for its tensors.

uvicorn hands an ASGI app its request body as bytes: each piece httptools parses is appended to a
bytearray, which is copied out into bytes when the app receives it, and the app then joined the
pieces and copied them once more so that its binary tensors start on an aligned address: four
copies of a 600 KB tensor after the socket's own, 30 % of the interpreter's time for such a
request on the 2-core Intel machine (docs/server.md, Benchmark). A body that declares its length within the
limit, for a request that ``body_offset`` lays out, gets one buffer of that length when its head is
complete, aligned for where its tensors start; each piece is copied into it as it is parsed. The
app's receive then carries no bytes and ends when the body is complete; the app reads the buffer
from its scope (``received_body``).
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import numpy as np

ALIGNMENT = 64  # where a request's binary tensors start in memory: any type's size, and a cache line
EXTENSION = "unideploy.body"  # the ASGI scope's extension holding a request's DeclaredBody


def aligned_buffer(size: int, aligned_from: int) -> memoryview:
    """``size`` writable bytes whose byte ``aligned_from`` sits on an ``ALIGNMENT`` boundary (where
    binary tensors start after a JSON header; 0 or ``size``: no tensors, any address)."""
    buffer = np.empty(size + ALIGNMENT, np.uint8)
    start = -(buffer.ctypes.data + aligned_from) % ALIGNMENT if 0 < aligned_from < size else 0
    return buffer.data[start : start + size]


class DeclaredBody:
    """A body of a declared length, filled in place as its pieces are parsed. Its pages are taken
    as the bytes arrive: a client that declares a large body and sends little holds little."""

    def __init__(self, size: int, aligned_from: int) -> None:
        self.view = aligned_buffer(size, aligned_from)
        self.received = 0

    def write(self, piece: bytes) -> None:
        end = self.received + len(piece)
        self.view[self.received : end] = piece  # the parser stops a body at its declared length
        self.received = end


def attach(scope: MutableMapping[str, Any], size: int, aligned_from: int) -> DeclaredBody:
    """A ``DeclaredBody`` for the request of ``scope``, where the app will find it."""
    body = DeclaredBody(size, aligned_from)
    scope.setdefault("extensions", {})[EXTENSION] = body
    return body


def received_body(scope: MutableMapping[str, Any]) -> DeclaredBody | None:
    """The request's body as the server received it into one buffer; None where it was not (its
    length not declared, or over the limit: the app reads the body's pieces as ASGI gives them)."""
    return scope.get("extensions", {}).get(EXTENSION)
