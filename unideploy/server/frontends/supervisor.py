"""The model process's front ends: started, restarted when one dies, drained on shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import socket
import sys
import time

from unideploy.errors import InputError
from unideploy.package.files import scratch_dir
from unideploy.server.config import ServerConfig
from unideploy.server.dataplane import DataPlane
from unideploy.server.frontends.hub import Hub
from unideploy.server.listeners import SHUTDOWN_GRACE_S, bind

log = logging.getLogger("unideploy.server")
START_TIMEOUT_S = 60.0
STEADY_S = 10.0  # a front end that lived this long before it died is restarted at once
MAX_BACKOFF_S = 10.0  # others wait 1, 2, 4, 8, then 10 s for each quick death in a row


class Supervisor:
    """``count`` front-end processes serving ``cfg``'s ports for ``dataplane``. The model process
    keeps ``http_socket`` and a socket on the gRPC port bound (never listening): the ports stay
    taken while a front end restarts, and each front end binds its own with ``SO_REUSEPORT``."""

    def __init__(self, dataplane: DataPlane, cfg: ServerConfig, count: int, http_socket: socket.socket) -> None:
        self.count = count
        self.http_socket = http_socket
        self.grpc_socket = bind(cfg.host, cfg.grpc_port, "--grpc-port", reuse_port=True)
        ports = {"http_port": http_socket.getsockname()[1], "grpc_port": self.grpc_socket.getsockname()[1]}
        # each front end answers at most its share of the connections --max-connections allows
        share = math.ceil(cfg.max_connections / count)
        self.settings = cfg.model_copy(update={**ports, "max_connections": share}).model_dump_json().encode()
        self._folder = scratch_dir("unideploy-serve-")  # only this user can enter it: the hub's socket
        self.hub = Hub(dataplane, os.path.join(self._folder.name, "hub.sock"))
        self.processes: dict[int, asyncio.subprocess.Process] = {}  # by front-end index
        self._watchers: set[asyncio.Task] = set()
        self._quick_deaths: dict[int, int] = {}  # by front-end index: deaths in a row before STEADY_S
        self._stopping = False

    async def start(self) -> None:
        """Start every front end; return once each serves both ports."""
        await self.hub.start()
        for index in range(self.count):
            await self._spawn(index)
        deadline = time.monotonic() + START_TIMEOUT_S
        while len(self.hub.links) < self.count:
            exited = [i for i, p in self.processes.items() if p.returncode is not None]
            if exited or time.monotonic() > deadline:
                await self.stop(0)
                raise InputError(
                    f"front-end process {exited[0]} exited with code {self.processes[exited[0]].returncode}"
                    if exited
                    else f"front-end processes did not start within {START_TIMEOUT_S:g} s",
                    "its reason is in the log above; or serve with --frontends 0",
                )
            self.hub.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.hub.changed.wait(), 0.1)

    async def _spawn(self, index: int) -> None:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "unideploy.server.frontends.process",
            self.hub.path,
            str(index),
            str(os.getpid()),
            stdin=asyncio.subprocess.PIPE,
        )
        assert process.stdin is not None
        process.stdin.write(self.settings)  # on stdin: tokens never show in the process list
        process.stdin.close()
        self.processes[index] = process
        task = asyncio.get_running_loop().create_task(self._watch(index, process, time.monotonic()))
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    async def _watch(self, index: int, process: asyncio.subprocess.Process, started: float) -> None:
        """Restart front end ``index`` when it dies (not when the server stops it)."""
        code = await process.wait()
        if self._stopping:
            return
        # what it left in /dev/shm (requests it had not handed over yet) goes when its replacement's
        # SlotPool starts
        quick = 0 if time.monotonic() - started >= STEADY_S else self._quick_deaths.get(index, 0) + 1
        self._quick_deaths[index] = quick
        delay = min(MAX_BACKOFF_S, 2.0 ** (quick - 1)) if quick else 0.0
        log.warning(
            "front-end process %d (pid %d) exited with code %s; starting another%s",
            index,
            process.pid,
            code,
            f" in {delay:.0f} s" if delay else "",
        )
        await asyncio.sleep(delay)
        if not self._stopping:
            await self._spawn(index)

    async def stop(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """SIGTERM every front end: each stops accepting and answers what it has in flight, which
        the model process still serves; then the hub closes."""
        self._stopping = True
        self.http_socket.close()  # nothing of the model process's own holds the ports any longer
        self.grpc_socket.close()
        for watcher in self._watchers:
            watcher.cancel()
        running = [p for p in self.processes.values() if p.returncode is None]
        for process in running:
            process.send_signal(signal.SIGTERM)
        waiting = [asyncio.create_task(p.wait()) for p in running]
        if waiting:
            await asyncio.wait(waiting, timeout=grace_s + 5)
            for process in running:
                if process.returncode is None:
                    log.warning("front-end process (pid %d) did not stop in time; killed", process.pid)
                    process.kill()
                    await process.wait()
        await self.hub.close()
        self._folder.cleanup()
