"""Messages between a front end and the model process: length-prefixed pickles on a Unix socket.

Both ends are processes of one server started by its model process (the socket lives in a folder
only its user can enter), so pickle is what carries requests, results and errors whole. Tensors
never travel here: they are in shared memory (``slots``), and a message names where.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import struct
from collections.abc import Callable
from typing import Any, cast

_LENGTH = struct.Struct("<I")
# How long a deferred message waits for another to ride with. A front end's "done" (a response's
# encoding time, which the model process only records) then shares the next request's write: one
# write and one wake-up of the model process fewer per request, 0.173-0.185 -> 0.155-0.161 ms of its
# CPU per request (noop model over HTTP, one front end, four interleaved rounds).
DEFERRED_S = 0.005


class Channel(asyncio.Protocol):
    """One connection's framing: ``send`` a message; ``on_message`` is called with each received
    one, ``on_close`` once the connection is gone (the peer exited or closed it)."""

    def __init__(self, on_message: Callable[[Any], None], on_close: Callable[[], None]) -> None:
        self.on_message = on_message
        self.on_close = on_close
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._deferred: list[bytes] = []  # framed messages waiting for the next write
        self._timer: asyncio.TimerHandle | None = None
        self._soon: asyncio.Handle | None = None  # the write at the end of this turn of the loop
        self._fd = -1  # the socket's descriptor, written straight to while the transport holds nothing

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio's subclasses
        sock = transport.get_extra_info("socket")
        self._fd = sock.fileno() if sock is not None else -1

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
        """Send ``message`` at the end of this turn of the event loop, with any deferred ones and
        every other message sent in the same turn, in one write: a merged batch's answers to one
        front end go together, and each write wakes the other process (serving a noop model to two
        front ends at concurrency 8: 0.47 writes per request instead of 1.00, docs/server.md)."""
        self._deferred.append(self._frame(message))
        if self._soon is None:
            self._soon = asyncio.get_running_loop().call_soon(self._flush)

    def defer(self, message: Any) -> None:
        """Send ``message`` with the next one sent, or ``DEFERRED_S`` from now if none is: for
        what the other side only records, so that it costs neither process a write of its own."""
        self._deferred.append(self._frame(message))
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(DEFERRED_S, self._flush)

    def close(self) -> None:
        if self.transport is not None:
            self._flush()  # what was deferred goes first
            self.transport.close()

    def _frame(self, message: Any) -> bytes:
        if self.transport is None or self.transport.is_closing():
            raise ConnectionError("the connection to the other process is closed")
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        return _LENGTH.pack(len(payload)) + payload

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._soon is not None:
            self._soon.cancel()
            self._soon = None
        frames, self._deferred = self._deferred, []
        if self.transport is not None and not self.transport.is_closing():
            self._write(b"".join(frames))

    def _write(self, data: bytes) -> None:
        """``data`` to the other process: straight to the socket, with Python's GIL released for the
        system call, where nothing waits in the transport's buffer (uvloop's own write holds the GIL
        through it: 19-20 % of the model process's GIL time, docs/server.md); what the socket does
        not take at once goes through the transport, which sends it, in order, as the socket drains."""
        assert self.transport is not None
        sent = 0
        if self._fd >= 0 and not self.transport.get_write_buffer_size():
            try:
                sent = os.write(self._fd, data)
            except OSError:  # full (the transport waits for room), or broken (the transport finds out)
                sent = 0
        if sent < len(data):
            self.transport.write(memoryview(data)[sent:])
