"""Limits on what an HTTP client may send before its request is even routed: header size and count,
and the time its request head may take.

uvicorn's httptools protocol (the fast one, which the server uses) has none of these: a
1,000,000-byte header and 2,000 headers were accepted (200), and 300 sockets that sent half a
request head stayed open for as long as their clients wished, each holding a file descriptor
(issue 43). ``limited_protocol`` is that protocol with the limits: a head over them is answered
431 and the connection closed, a head that does not arrive in time (a connection that sends
nothing included) is answered 408 and closed, and a connection beyond ``--max-connections`` is
answered 503 with Retry-After as it opens. The body has its own timeout in ``rest.read_body``;
idle keep-alive connections are closed by uvicorn after ``timeout_keep_alive``. An inference body
of a declared length is received into one buffer (``http_body``) instead of uvicorn's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, MutableMapping
from typing import Any, cast

from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from unideploy.server.http_body import DeclaredBody, attach

REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large", 503: b"Service Unavailable"}
RETRY_AFTER_S = 1  # what a connection over the cap is told to wait


class _Refused(Exception):
    """Raised in a parser callback to stop parsing a request that was answered already."""


def limited_protocol(
    max_header_bytes: int,
    max_headers: int,
    header_timeout_s: float,
    max_connections: int,
    max_body_bytes: int,
    body_offset: Callable[[MutableMapping[str, Any]], int | None],
) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol refusing heads over ``max_header_bytes`` (request line and
    headers) or ``max_headers`` headers, heads not complete ``header_timeout_s`` after the
    connection opened or the request's first byte came, and connections beyond ``max_connections``
    (503 with Retry-After as soon as they open, so they give their descriptor back at once). A body
    of a declared length up to ``max_body_bytes`` whose request ``body_offset`` places (where its
    tensors start; None: a request to leave to uvicorn) is received into one buffer (``http_body``)."""

    class LimitedHttpToolsProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._head_bytes = 0
            self._head_count = 0
            self._head_timer: asyncio.TimerHandle | None = None
            self._answered = False
            self._body_window = HIGH_WATER_LIMIT  # body bytes buffered before the app is woken
            self._declared: int | None = None  # the body's length, where declared within the limit
            self._body: DeclaredBody | None = None  # the buffer the body goes into, where it has one

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:  # this one included
                self._answer(503, f"more than {max_connections} connections at once; retry shortly")
                return
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if not self._answered:  # after a refusal, nothing more of this connection is read
                super().data_received(data)

        def on_message_begin(self) -> None:
            # a keep-alive connection's next head is timed from its first byte (until then uvicorn's
            # keep-alive timeout closes it when idle)
            super().on_message_begin()
            self._head_bytes = self._head_count = 0
            self._body_window = HIGH_WATER_LIMIT
            self._declared = self._body = None
            if self._head_timer is None:
                self._arm()

        def on_url(self, url: bytes) -> None:
            self._count(len(url), 0)
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count(len(name) + len(value), 1)
            if name.lower() == b"content-length" and value.isdigit() and len(value) < 16:
                self._body_window = max(HIGH_WATER_LIMIT, min(int(value), max_body_bytes))
                self._declared = int(value) if int(value) <= max_body_bytes else None
            super().on_header(name, value)

        def on_body(self, body: bytes) -> None:
            """uvicorn's, buffering a body whose length was declared (up to the request limit) before
            waking the app: uvicorn pauses reading every 64 KiB and wakes the app for each piece,
            so a 600 KB tensor took ten turns of the event loop and twenty epoll changes."""
            cycle = self.cycle
            if cycle.response_complete or (self.parser.should_upgrade() and self._should_upgrade()):
                return
            if self._body is not None:  # the app is woken when it is complete (on_message_complete)
                self._body.write(body)
                return
            cycle.body += body
            if len(cycle.body) >= self._body_window:
                self.flow.pause_reading()
                cycle.message_event.set()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()
            chunked = any(name == b"transfer-encoding" for name, _ in self.headers)  # framed otherwise
            scope = cast(MutableMapping[str, Any], self.scope)  # uvicorn's TypedDict, as ASGI apps see it
            if self._declared and not chunked and (offset := body_offset(scope)) is not None:
                self._body = attach(scope, self._declared, offset)

        def send_400_response(self, msg: str) -> None:
            if not self._answered:  # a malformed request, not one refused here
                super().send_400_response(msg)

        def _count(self, size: int, headers: int) -> None:
            self._head_bytes += size
            self._head_count += headers
            if self._head_count > max_headers:
                self._refuse(431, f"more than {max_headers} request headers")
            if self._head_bytes > max_header_bytes:
                self._refuse(431, f"request line and headers exceed {max_header_bytes} bytes")

        def _arm(self) -> None:
            self._head_timer = self.loop.call_later(header_timeout_s, self._head_timed_out)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if self.cycle is None or self.cycle.response_complete:  # no request of it is being answered
                self._answer(408, f"request headers did not arrive within {header_timeout_s:g} s")

        def _refuse(self, status: int, message: str) -> None:
            self._answer(status, message)
            raise _Refused(message)  # httptools stops parsing; uvicorn then calls send_400_response

        def _answer(self, status: int, message: str) -> None:
            """Answer ``status`` with a JSON error (as every other refusal) and close."""
            if self._answered or self.transport.is_closing():
                return
            self._answered = True
            self._disarm()
            body = b'{"error":"' + message.encode("ascii") + b'"}'
            retry = b"retry-after: %d\r\n" % RETRY_AFTER_S if status == 503 else b""
            self.transport.write(
                b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s"
                b"connection: close\r\n\r\n%s" % (status, REASONS[status], len(body), retry, body)
            )
            self.transport.close()

    return LimitedHttpToolsProtocol
