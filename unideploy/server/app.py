"""One process, two frontends: uvicorn (REST) and grpc.aio (gRPC) on one event loop, over one
dataplane and registry, plus the repository watcher. SIGINT/SIGTERM drain in-flight requests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from unideploy.errors import InputError
from unideploy.server.config import ServerConfig, is_remote
from unideploy.server.dataplane import DataPlane
from unideploy.server.memory import release_after_bursts
from unideploy.server.metrics import ServerMetrics
from unideploy.server.models import ModelRegistry
from unideploy.server.remote import RemoteRepository
from unideploy.server.repository import scan

if TYPE_CHECKING:
    from starlette.applications import Starlette

log = logging.getLogger("unideploy.server")
SHUTDOWN_GRACE_S = 10.0


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
        self.registry = ModelRegistry(repository, self.executor, self.metrics, config.trusted_signers(), model_name)
        self.dataplane = DataPlane(self.registry, self.metrics, config.max_request_rows, config.shared_memory)
        self._stop = asyncio.Event()

    async def run(self) -> None:
        import grpc
        import uvicorn

        from unideploy.server.grpc_service import TRANSPORT_SLACK_BYTES, add_servicer

        started = time.perf_counter()
        cfg = self.config
        # Both ports are taken before any model loads: a busy port fails fast, with its name.
        http_socket = _listen(cfg.host, cfg.http_port, "--http-port")
        transport = cfg.max_request_bytes + TRANSPORT_SLACK_BYTES
        grpc_server = grpc.aio.server(
            # answers are bounded by the served models and --max-request-rows, not by the request limit
            options=[("grpc.max_receive_message_length", transport), ("grpc.max_send_message_length", -1)]
        )
        add_servicer(grpc_server, self.dataplane, cfg.inference_token, cfg.repository_token, cfg.max_request_bytes)
        address = f"{cfg.host}:{cfg.grpc_port}"
        try:
            if cfg.tls_cert and cfg.tls_key:
                credentials = grpc.ssl_server_credentials([(cfg.tls_key.read_bytes(), cfg.tls_cert.read_bytes())])
                grpc_server.add_secure_port(address, credentials)
            else:
                grpc_server.add_insecure_port(address)
        except RuntimeError as exc:
            http_socket.close()
            raise InputError(
                f"cannot listen on {address} for gRPC (port in use or address not available)",
                "choose another --grpc-port or stop what uses it",
            ) from exc
        await self.registry.sync()
        await grpc_server.start()
        http = _uvicorn_server()(
            uvicorn.Config(
                self.rest_app(),
                host=cfg.host,
                port=cfg.http_port,
                log_level="warning",
                access_log=False,
                lifespan="off",
                ws="none",  # no WebSocket routes: uvicorn then never imports a WebSocket library
                limit_concurrency=cfg.max_connections,
                timeout_graceful_shutdown=int(SHUTDOWN_GRACE_S),
                log_config=None,  # uvicorn logs through our JSON handler
                ssl_certfile=str(cfg.tls_cert) if cfg.tls_cert else None,
                ssl_keyfile=str(cfg.tls_key) if cfg.tls_key else None,
            )
        )
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stop.set)
        http_task = loop.create_task(http.serve(sockets=[http_socket]))
        watch_task = loop.create_task(self.watch()) if cfg.poll_interval_s > 0 else None
        while not http.started and not http_task.done():
            await asyncio.sleep(0.01)
        if http_task.done():  # e.g. the port is taken
            await grpc_server.stop(0)
            http_task.result()
            raise SystemExit(1)
        release_task = loop.create_task(
            release_after_bursts(
                lambda: (self.dataplane.runs_finished, self.dataplane.runs_running), self.registry.release_memory
            )
        )
        log.info(
            "serving %s on http://%s:%d and grpc %s, ready in %.2fs (%d model(s))",
            cfg.repository,
            cfg.host,
            cfg.http_port,
            address,
            time.perf_counter() - started,
            len(self.registry.ready_models()),
        )
        await self._stop.wait()
        log.info("shutting down: draining in-flight requests")
        if watch_task:
            watch_task.cancel()
        release_task.cancel()
        http.should_exit = True
        await asyncio.gather(http_task, grpc_server.stop(SHUTDOWN_GRACE_S), return_exceptions=True)
        await self.close()

    def rest_app(self) -> Starlette:
        from unideploy.server.rest import create_app

        cfg = self.config
        return create_app(
            self.dataplane, cfg.max_request_bytes, cfg.inference_token, cfg.repository_token, cfg.body_timeout_s
        )

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
            except Exception:  # the watcher must outlive any one bad scan
                log.exception("repository scan failed; will try again")


def _uvicorn_server() -> type:
    """uvicorn's server without its own SIGINT/SIGTERM handlers: ours stop both frontends together
    (uvicorn would stop REST first and re-raise the signal only once it has drained)."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return Server


def _listen(host: str, port: int, option: str) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say they are TCP, and
    # without it keep-alive responses stall 40 ms on Nagle + delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise InputError(
            f"cannot listen on {host}:{port} for REST: {exc.strerror}", f"choose another {option} or stop what uses it"
        ) from exc
    return sock


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line, for log shippers."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
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


ACCEPT_ERROR_INTERVAL_S = 10.0


def serve(config: ServerConfig) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonLogFormatter())
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    logging.getLogger("asyncio").addFilter(
        OncePerInterval("socket.accept() out of system resource", ACCEPT_ERROR_INTERVAL_S)
    )
    asyncio.run(Server(config).run())
