"""``deploy serve``: the registry, the dataplane and the repository watcher in one process, and
both protocols in it (``listeners``) or in front-end processes (``frontends``).
SIGINT/SIGTERM drain in-flight requests."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from unideploy.server import logs
from unideploy.server.config import ServerConfig, is_remote
from unideploy.server.dataplane import DataPlane
from unideploy.server.listeners import Listeners, bind, event_loop_name, run_event_loop
from unideploy.server.memory import release_after_bursts
from unideploy.server.metrics import ServerMetrics
from unideploy.server.models import ModelRegistry
from unideploy.server.remote import RemoteRepository
from unideploy.server.repository import scan
from unideploy.server.sequences import SequenceStates

if TYPE_CHECKING:
    from starlette.applications import Starlette

log = logging.getLogger("unideploy.server")


class Server:
    def __init__(self, config: ServerConfig) -> None:
        self.remote = None
        model_name = config.model_name
        if is_remote(config.repository):  # mirrored into a local folder the registry watches (server/remote.py)
            self.remote = RemoteRepository.mirrored(str(config.repository), model_name)
            repository, model_name = self.remote.mirror, None  # one model is mirrored as REPO/<name>/
        else:
            repository = Path(config.repository)
        scan(repository, model_name)  # a missing repository is a user error, before any port opens
        self.config = config
        self.metrics = ServerMetrics()
        self.executor = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="unideploy-model")
        self.registry = ModelRegistry(
            repository, self.executor, self.metrics, config.trusted_signers(), model_name, config.run_memory()
        )
        self.dataplane = DataPlane(
            self.registry,
            self.metrics,
            config.max_request_rows,
            config.shared_memory,
            config.max_request_bytes,
            SequenceStates(config.max_sequences, config.sequence_idle_s, header=config.sequence_header),
            config.max_response_bytes,
        )
        self._stop = asyncio.Event()

    async def run(self) -> None:
        started = time.perf_counter()
        cfg = self.config
        frontends = cfg.frontend_count()
        # Both ports are taken before any model loads: a busy port fails fast, with its name.
        http_socket = bind(cfg.host, cfg.http_port, "--http-port", reuse_port=bool(frontends))
        if frontends:
            from unideploy.server.frontends.supervisor import Supervisor

            serving: Listeners | Supervisor = Supervisor(self.dataplane, cfg, frontends, http_socket)
        else:
            serving = Listeners(self.dataplane, cfg, http_socket)
        await self.registry.sync()
        loop = asyncio.get_running_loop()
        # before any request is taken: the first front end answers while the others still start
        # (``serving.start`` returns once all do), and a SIGTERM then killed the model process with
        # those requests in flight; now it drains them once the start is done
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stop.set)
        await serving.start()
        self.hand_over_gil_quickly()  # once the front ends (processes of their own) have started
        watch_task = loop.create_task(self.watch()) if cfg.poll_interval_s > 0 else None
        release_task = loop.create_task(
            release_after_bursts(
                lambda: (self.dataplane.runs_finished, self.dataplane.runs_running), self.registry.release_memory
            )
        )
        log.info(
            "serving %s on http://%s:%d and grpc %s:%d, ready in %.2fs (%d model(s), %s event loop, "
            "GIL switch interval %g us%s)",
            cfg.repository,
            cfg.host,
            http_socket.getsockname()[1],
            cfg.host,
            cfg.grpc_port,
            time.perf_counter() - started,
            len(self.registry.ready_models()),
            event_loop_name(),
            cfg.switch_interval_us,
            f", {frontends} front-end processes" if frontends else "",
        )
        await self._stop.wait()
        log.info("shutting down: draining in-flight requests")
        if watch_task:
            watch_task.cancel()
        release_task.cancel()
        await serving.stop()
        await self.close()

    def hand_over_gil_quickly(self) -> None:
        """This process's GIL switch interval (``switch_interval_us``): a batch thread whose run has
        ended takes the GIL back from a busy event loop within it, not when the loop next idles
        (docs/server.md, The GIL between the event loop and batch threads)."""
        sys.setswitchinterval(self.config.switch_interval_us / 1e6)

    def rest_app(self) -> Starlette:
        from unideploy.server.rest import create_app

        return create_app(self.dataplane, self.config)

    async def close(self) -> None:
        """Unload every model and remove the remote mirror (in-flight requests have drained)."""
        await self.registry.close()
        self.dataplane.shared_memory.close()  # unmaps every registered region
        self.executor.shutdown(wait=True)
        if self.remote is not None:
            self.remote.close()

    async def watch(self) -> None:
        """Hot reload: scan the repository (syncing a remote one first) every poll interval."""
        while True:
            await asyncio.sleep(self.config.poll_interval_s)
            try:
                if self.remote is not None:  # downloads run beside the event loop, which keeps serving
                    await asyncio.get_running_loop().run_in_executor(None, self.remote.sync)
                await self.registry.sync()
                self.metrics.scans.labels("ok").inc()
            except Exception:  # the watcher must outlive any one bad scan
                log.exception("repository scan failed; will try again")
                self.metrics.scans.labels("failed").inc()


def serve(config: ServerConfig) -> None:
    logs.configure()
    run_event_loop(Server(config).run())
