"""CPU time of a server's processes, read from outside them (no change to the server measured)."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a running process (``/proc/PID/stat``, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_seconds(pid: int, thread: int) -> float:
    """CPU seconds of one thread of a running process, read from the scheduler's nanoseconds
    (``/proc/PID/task/TID/schedstat``), where ``stat``'s clock ticks (10 ms) would blur a window's
    few hundred requests; the main thread's id is the process's."""
    return int(Path(f"/proc/{pid}/task/{thread}/schedstat").read_text().split()[0]) / 1e9


def server_cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU time of the server's model process, and of its front-end processes together."""
    import psutil

    frontends = 0.0
    for child in psutil.Process(pid).children(recursive=True):
        try:
            times = child.cpu_times()
            frontends += times.user + times.system
        except psutil.NoSuchProcess:  # a front end that exited (restarted) takes its time with it
            pass
    return cpu_seconds(pid), frontends
