"""The server's errors, one hierarchy for both protocols: each says its HTTP status and its gRPC
code, and the frontends map any error through ``http_status`` and ``grpc_code`` alone (as
MLServer's errors carry their status code). Bearer tokens are checked here for both."""

from __future__ import annotations

import hmac
from typing import ClassVar

from unideploy.errors import InputError, RunOutOfMemory, UnideployError


class ServerError(InputError):
    """A request the server refuses; the client can fix it or try again."""

    http_status: ClassVar[int] = 400
    grpc_code: ClassVar[str] = "INVALID_ARGUMENT"  # a grpc.StatusCode name (grpc is imported by its frontend only)


class BadRequest(ServerError):
    """A malformed or unacceptable request: 400 / INVALID_ARGUMENT."""


class RequestTimeout(BadRequest):
    """A client that stopped sending its body: 408."""

    http_status = 408


class TooLarge(BadRequest):
    """A request over --max-request-bytes: 400 (as every other limit) / RESOURCE_EXHAUSTED."""

    grpc_code = "RESOURCE_EXHAUSTED"


class Unauthenticated(ServerError):
    """A missing or wrong bearer token: 401 / UNAUTHENTICATED."""

    http_status = 401
    grpc_code = "UNAUTHENTICATED"


class NotFound(ServerError):
    """An unknown model or version: 404 / NOT_FOUND."""

    http_status = 404
    grpc_code = "NOT_FOUND"


class Unavailable(ServerError):
    """A model that exists but cannot serve now: 503 / UNAVAILABLE."""

    http_status = 503
    grpc_code = "UNAVAILABLE"


def http_status(exc: UnideployError) -> int:
    """Any other input error is a 400; an error the client cannot fix is a 500."""
    if isinstance(exc, ServerError):
        return exc.http_status
    return 400 if isinstance(exc, InputError) else 500


def grpc_code(exc: UnideployError) -> str:
    if isinstance(exc, ServerError):
        return exc.grpc_code
    if isinstance(exc, RunOutOfMemory):  # a resource of the server's, as --max-request-bytes is
        return "RESOURCE_EXHAUSTED"
    return "INVALID_ARGUMENT" if isinstance(exc, InputError) else "INTERNAL"


def check_token(expected: str | None, authorization: str) -> None:
    """``authorization`` (the header or gRPC metadata) must carry ``Bearer <expected>``, when a
    token is set; compared in constant time."""
    if expected is not None and not hmac.compare_digest(authorization.encode(), f"Bearer {expected}".encode()):
        raise Unauthenticated("missing or wrong bearer token")
