"""Messages between a front end and the model process: length-prefixed pickles on a Unix socket.

Both ends are processes of one server started by its model process (the socket lives in a folder
only its user can enter), so pickle is what carries requests, results and errors whole. Tensors
never travel here: they are in shared memory (``slots``), and a message names where.
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from collections.abc import Callable
from typing import Any

_LENGTH = struct.Struct("<I")


class Channel(asyncio.Protocol):
    """One connection's framing: ``send`` a message; ``on_message`` is called with each received
    one, ``on_close`` once the connection is gone (the peer exited or closed it)."""

    def __init__(self, on_message: Callable[[Any], None], on_close: Callable[[], None]) -> None:
        self.on_message = on_message
        self.on_close = on_close
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        start = 0
        while len(buffer) - start >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(buffer, start)
            end = start + _LENGTH.size + length
            if len(buffer) < end:
                break
            message = pickle.loads(memoryview(buffer)[start + _LENGTH.size : end])
            start = end
            self.on_message(message)
        del buffer[:start]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.on_close()

    def send(self, message: Any) -> None:
        if self.transport is None or self.transport.is_closing():
            raise ConnectionError("the connection to the other process is closed")
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        self.transport.write(_LENGTH.pack(len(payload)) + payload)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
