"""Waiting for a peer server (MLServer, PyTriton) the benchmarks start as a process of its own."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx


def ready(process: subprocess.Popen, http_port: int, wait_s: float = 180) -> bool:
    """Whether the peer on ``http_port`` answered its readiness probe within ``wait_s`` (False as
    soon as its process exits)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=1).status_code == 200:
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
