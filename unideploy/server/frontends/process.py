"""One front-end process: ``python -m unideploy.server.frontends.process HUB INDEX PARENT_PID``,
its ``ServerConfig`` as JSON on stdin. It serves both ports (``SO_REUSEPORT``) for the model
process's dataplane and stops on SIGTERM (after answering what it has in flight) or when the
model process is gone."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys

from unideploy.errors import UnideployError
from unideploy.server import logs
from unideploy.server.config import ServerConfig
from unideploy.server.frontends.client import RemoteDataPlane
from unideploy.server.listeners import Listeners, bind, run_event_loop
from unideploy.server.memory import keep_request_buffers, release_after_bursts, release_free_memory

log = logging.getLogger("unideploy.server")
PR_SET_PDEATHSIG = 1  # prctl(2): a signal for this process when its parent dies


def _die_with(parent: int) -> None:
    """SIGTERM this process when the model process dies (kill -9 included), so no front end
    outlives the server and keeps its ports."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the lost hub connection stops it too
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


async def run(cfg: ServerConfig, hub: str, index: int) -> None:
    dataplane = RemoteDataPlane()
    await dataplane.connect(hub, index)
    listeners = Listeners(dataplane, cfg, bind(cfg.host, cfg.http_port, "--http-port", reuse_port=True))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)  # before the first request: it is answered, not lost
    await listeners.start()
    dataplane.channel.send(("listening",))
    # the request buffers glibc keeps for reuse under load go back once traffic stops: a front end
    # stayed at 115-189 MB after a burst of 600 KB requests, against 63-72 MB before it (docs/server.md)
    release = loop.create_task(release_after_bursts(dataplane.activity, release_free_memory))
    waits = [loop.create_task(stop.wait()), loop.create_task(dataplane.lost.wait())]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for task in (*waits, release):
        task.cancel()
    if dataplane.lost.is_set() and not stop.is_set():
        log.warning("the model process is gone; this front end stops")
        await listeners.stop(0)
    else:
        await listeners.stop()
    dataplane.close()


def main() -> None:
    hub, index, parent = sys.argv[1], sys.argv[2], int(sys.argv[3])
    _die_with(parent)
    # Ctrl-C reaches every process of the terminal's group: the model process stops the front ends
    # itself (SIGTERM), after it knows not to restart them
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logs.configure(f"frontend-{index}")
    keep_request_buffers()
    cfg = ServerConfig.model_validate_json(sys.stdin.buffer.read())
    try:
        run_event_loop(run(cfg, hub, int(index)))
    except UnideployError as exc:  # e.g. its port is taken: one line in the server's log, and the supervisor says which
        log.error("front-end process %s cannot serve: %s", index, exc)
        raise SystemExit(exc.exit_code) from None


if __name__ == "__main__":
    main()
