"""Both protocols listening for one dataplane: uvicorn (REST) and grpc.aio (gRPC) on one event
loop. The server runs them in its own process, or in each front-end process (``frontends``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Coroutine, Iterator
from typing import Any

from unideploy.errors import InputError
from unideploy.server.config import ServerConfig
from unideploy.server.dataplane import DataPlaneAPI

SHUTDOWN_GRACE_S = 10.0
SPARE_DESCRIPTORS = 128  # besides connections: models' files, gRPC's, logs, the hub's socket
log = logging.getLogger("unideploy.server")


def raise_descriptor_limit(max_connections: int) -> None:
    """Raise this process's soft limit on open files to its hard limit (as nginx's
    ``worker_rlimit_nofile`` does), so ``max_connections`` is reached before the descriptors run
    out: at the usual soft limit of 1,024, 1,100 idle sockets made every other request time out.
    Where even the hard limit is too low, say so once at start."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    if soft != resource.RLIM_INFINITY and soft < max_connections + SPARE_DESCRIPTORS:
        log.warning(
            "this process may open %d files, fewer than max_connections (%d) needs with %d to spare: raise the "
            "hard limit (ulimit -Hn, LimitNOFILE=) or lower --max-connections",
            soft,
            max_connections,
            SPARE_DESCRIPTORS,
        )


def run_event_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run a server process's ``main`` on uvloop where it is installed (the serve extra, but for
    Windows), else on asyncio's own loop. Each request passes through the loop several times
    (socket reads, the batcher, the answer): on uvloop a 600 KB request through shared memory cost
    the server 0.213-0.220 ms of CPU against 0.224-0.231 ms (four interleaved rounds of two servers,
    benchmarks/server_overhead.py's model, 2-core Zen 5; docs/server.md)."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)


def event_loop_name() -> str:
    """Which loop ``run_event_loop`` got (the start-up line names it: what is reported is what ran)."""
    return "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"


class Listeners:
    """REST on ``http_socket`` and gRPC on the config's port. The gRPC port is taken in
    ``__init__`` (a busy port fails before any model loads, with its name); ``start`` serves."""

    def __init__(self, dataplane: DataPlaneAPI, cfg: ServerConfig, http_socket: socket.socket) -> None:
        import grpc

        from unideploy.server.grpc_service import TRANSPORT_SLACK_BYTES, add_servicer

        self.dataplane, self.cfg, self.http_socket = dataplane, cfg, http_socket
        raise_descriptor_limit(cfg.max_connections)
        transport = cfg.max_request_bytes + TRANSPORT_SLACK_BYTES
        self.grpc = grpc.aio.server(
            # as many calls at once as REST connections, each holding a request of up to
            # --max-request-bytes (a stream's: up to its window, grpc_service.STREAM_WINDOW); more are
            # answered RESOURCE_EXHAUSTED at once instead of each being read into memory
            maximum_concurrent_rpcs=cfg.max_connections,
            options=[
                ("grpc.max_receive_message_length", transport),
                # answers are bounded by --max-response-bytes, not by the request limit
                ("grpc.max_send_message_length", -1),
                # a connection that sends nothing, or stops making calls, does not hold a descriptor for good
                ("grpc.server_handshake_timeout_ms", int(cfg.header_timeout_s * 1000)),
                ("grpc.max_connection_idle_ms", int(cfg.grpc_idle_timeout_s * 1000)),
            ],
        )
        add_servicer(self.grpc, dataplane, cfg.inference_token, cfg.repository_token, cfg.max_request_bytes)
        self.grpc_address = f"{cfg.host}:{cfg.grpc_port}"
        try:
            if cfg.tls_cert and cfg.tls_key:
                credentials = grpc.ssl_server_credentials([(cfg.tls_key.read_bytes(), cfg.tls_cert.read_bytes())])
                self.grpc.add_secure_port(self.grpc_address, credentials)
            else:
                self.grpc.add_insecure_port(self.grpc_address)
        except RuntimeError as exc:
            http_socket.close()
            raise InputError(
                f"cannot listen on {self.grpc_address} for gRPC (port in use or address not available)",
                "choose another --grpc-port or stop what uses it",
            ) from exc
        self._http: object | None = None
        self._app: Any = None
        self._http_task: asyncio.Task | None = None

    async def start(self) -> None:
        import uvicorn

        from unideploy.server.http_limits import limited_protocol
        from unideploy.server.rest import create_app, inference_body_offset

        cfg = self.cfg
        await self.grpc.start()
        self._app = app = create_app(self.dataplane, cfg)
        http = _uvicorn_server()(
            uvicorn.Config(
                app,
                host=cfg.host,
                port=cfg.http_port,
                log_level="warning",
                access_log=False,
                lifespan="off",
                ws="none",  # no WebSocket routes: uvicorn then never imports a WebSocket library
                # connections beyond a front end's share (frontends.supervisor) are refused as they open
                # (http_limits); uvicorn's own check, which counts running requests too, stays one above it
                limit_concurrency=cfg.max_connections + 1,
                http=limited_protocol(
                    cfg.max_header_bytes,
                    cfg.max_headers,
                    cfg.header_timeout_s,
                    cfg.max_connections,
                    cfg.max_request_bytes,
                    inference_body_offset,
                ),
                timeout_graceful_shutdown=int(SHUTDOWN_GRACE_S),
                log_config=None,  # uvicorn logs through our JSON handler
                ssl_certfile=str(cfg.tls_cert) if cfg.tls_cert else None,
                ssl_keyfile=str(cfg.tls_key) if cfg.tls_key else None,
            )
        )
        self._http = http
        self._http_task = task = asyncio.get_running_loop().create_task(http.serve(sockets=[self.http_socket]))
        while not http.started and not task.done():
            await asyncio.sleep(0.01)
        if task.done():  # e.g. the TLS files cannot be read
            await self.grpc.stop(0)
            task.result()
            raise SystemExit(1)

    async def stop(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Stop accepting, and answer what is in flight (for up to ``grace_s``)."""
        if self._http is not None:
            self._http.should_exit = True  # type: ignore[attr-defined]
        await asyncio.gather(
            *(t for t in (self._http_task,) if t is not None), self.grpc.stop(grace_s), return_exceptions=True
        )
        if self._app is not None:
            self._app.state.json_decoder.close()


def _uvicorn_server() -> type:
    """uvicorn's server without its own SIGINT/SIGTERM handlers: ours stop both protocols together
    (uvicorn would stop REST first and re-raise the signal only once it has drained)."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return Server


def bind(host: str, port: int, option: str, *, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to ``host:port`` (uvicorn makes it listen). ``reuse_port``: shared with
    the server's other processes (``SO_REUSEPORT``: the kernel spreads connections over those
    that listen); the model process binds one and never listens, to hold the port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say they are TCP, and
    # without it keep-alive responses stall 40 ms on Nagle + delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise InputError(
            f"cannot listen on {host}:{port} for {'REST' if option == '--http-port' else 'gRPC'}: {exc.strerror}",
            f"choose another {option} or stop what uses it",
        ) from exc
    return sock
