"""The server's log: one JSON object per line, and asyncio's accept errors once per interval.
Every process of a server (the model process and its front ends) logs this way, to one stderr."""

from __future__ import annotations

import json
import logging
import time

ACCEPT_ERROR_INTERVAL_S = 10.0
SCAN_ERROR_INTERVAL_S = 60.0


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line, for log shippers."""

    def __init__(self, process: str | None = None) -> None:
        super().__init__()
        self.process = process  # which front end wrote it (None: the model process)

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self.process:
            entry["process"] = self.process
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class OncePerInterval(logging.Filter):
    """Lets a record whose message starts with ``prefix`` through once per ``interval_s``, the next
    one saying how many were dropped in between. asyncio logs a failed accept (out of file
    descriptors) with its traceback on every retry: 39,866 lines in 5 s with 300 idle connections
    against a 256-descriptor limit, which buried everything else and filled disks."""

    def __init__(self, prefix: str, interval_s: float) -> None:
        super().__init__()
        self.prefix, self.interval_s = prefix, interval_s
        self.last = -float("inf")
        self.dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(self.prefix):
            return True
        now = time.monotonic()
        if now - self.last < self.interval_s:
            self.dropped += 1
            return False
        if self.dropped:
            record.msg = f"{record.msg}\n({self.dropped} more in the last {now - self.last:.0f} s, not logged)"
        self.last, self.dropped = now, 0
        return True


def configure(process: str | None = None) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonLogFormatter(process))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    logging.getLogger("asyncio").addFilter(
        OncePerInterval("socket.accept() out of system resource", ACCEPT_ERROR_INTERVAL_S)
    )
    # hot reload's scan, failing on every poll for as long as its cause lasts (out of descriptors, a
    # remote store down): its traceback once a minute, with the count of those not logged
    logging.getLogger("unideploy.server").addFilter(OncePerInterval("repository scan failed", SCAN_ERROR_INTERVAL_S))
    # uvicorn's line for every malformed or refused (431) request head: a hostile client's per request
    logging.getLogger("uvicorn.error").addFilter(
        OncePerInterval("Invalid HTTP request received.", ACCEPT_ERROR_INTERVAL_S)
    )
