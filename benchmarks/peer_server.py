"""Waiting for a peer server (MLServer, PyTriton) the benchmarks start as a process of its own."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx


def ready(process: subprocess.Popen, http_port: int, models: list[str], wait_s: float = 180) -> bool:
    """Whether the peer on ``http_port`` said within ``wait_s`` that it and each of ``models`` are
    ready (False as soon as its process exits). Triton answers its own probe before it has loaded
    the models PyTriton binds."""
    deadline = time.monotonic() + wait_s
    paths = ["/v2/health/ready", *(f"/v2/models/{m}/ready" for m in models)]
    while time.monotonic() < deadline:
        try:
            if all(httpx.get(f"http://127.0.0.1:{http_port}{p}", timeout=1).status_code == 200 for p in paths):
                return True
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            return False
        time.sleep(0.2)
    return False


def not_ready(name: str, log: Path) -> RuntimeError:
    """The error for a peer that did not get ready, with the end of its log."""
    return RuntimeError(f"{name} did not become ready: {log.read_text()[-1500:]}")
