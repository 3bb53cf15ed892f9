"""Ray Serve: ``deploy serve REPO --ray`` runs each model of the repository as a Ray Serve
application, so a model scales past one process and one machine.

A replica is this server's own core for one model (``Server`` with ``--model-name``, as under
KServe): its versions and hot reload, ``model.yaml``'s dynamic batching (per replica) and
``routing.yaml``'s A/B routing, behind the same Open Inference Protocol REST routes. Ray Serve's
proxy sends ``/v2/models/<name>/...`` to that model's application and everything else to a small
front deployment that answers the server-wide routes (health, server metadata). ``model.yaml``'s
``replicas`` become the deployment's replica count or Ray Serve's autoscaling on requests in
flight; a replica reserves ``threads`` CPUs (default 1). A streaming model's replica is chosen by
consistent hashing over Ray Serve's session header, which its clients send with each call of a
sequence, so every call reaches the replica holding the sequence's state. gRPC is not proxied:
Ray Serve's gRPC proxy needs servicers compiled into the cluster's config, so use ``deploy serve``
or KServe for it.

The model folders must be readable wherever replicas run (one machine, or a shared volume).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from unideploy.errors import InputError, MissingDependencyError, UnideployError
from unideploy.server.config import ModelSettings, ServerConfig, is_remote
from unideploy.server.repository import ModelSource, scan

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

    from unideploy.server.app import Server

log = logging.getLogger("unideploy.server")
FRONT_APP = "unideploy"
MODEL_DEPLOYMENT = "model"
DEFAULT_TARGET_ONGOING = 2  # Ray Serve's own default when autoscaling
# a streaming model's sequences: the same session header, the same replica (Ray Serve 2.60's router)
SEQUENCE_ROUTER = "ray.serve.experimental.consistent_hash_router.ConsistentHashRouter"
SESSION_HEADER_VARIABLE = "RAY_SERVE_SESSION_ID_HEADER_KEY"  # where Ray Serve's proxy reads its name
DEFAULT_SESSION_HEADER = "x-session-id"
RAY_INSTALL = "pip install 'unideploy[ray]'"
SHUTDOWN_TIMEOUT_S = 30.0  # Serve drains each replica for up to 20 s (graceful_shutdown_timeout_s)


def app_name(model: str) -> str:
    return f"model-{model}"


def deployment_options(settings: ModelSettings, streaming: bool = False) -> dict[str, Any]:
    """Ray Serve deployment options from a model's ``model.yaml``; a streaming model's requests are
    routed by consistent hashing over Ray Serve's session header, strictly (no other replica when
    the one chosen is busy: only it holds the sequence's state)."""
    options: dict[str, Any] = {"name": MODEL_DEPLOYMENT, "ray_actor_options": {"num_cpus": settings.threads or 1}}
    if streaming:
        options["request_router_config"] = {
            "request_router_class": SEQUENCE_ROUTER,
            "request_router_kwargs": {"num_fallback_replicas": 0},
        }
    if settings.target_concurrency is None and settings.min_replicas == settings.max_replicas:
        options["num_replicas"] = settings.min_replicas
    else:
        options["autoscaling_config"] = {
            "min_replicas": settings.min_replicas,
            "max_replicas": settings.max_replicas,
            "target_ongoing_requests": settings.target_concurrency or DEFAULT_TARGET_ONGOING,
        }
    return options


class ModelReplica:
    """One replica of one model: the server's registry, dataplane and REST routes, in a Ray actor."""

    async def __init__(self, config: ServerConfig) -> None:  # type: ignore[misc]  # Ray actors allow it
        import asyncio

        from unideploy.server.app import Server

        self.server: Server = Server(config)
        self.server.hand_over_gil_quickly()  # the actor's loop and batch threads, as in deploy serve
        await self.server.registry.sync()
        watching = config.poll_interval_s > 0
        self.watcher = asyncio.get_running_loop().create_task(self.server.watch()) if watching else None

    def __serve_build_asgi_app__(self) -> ASGIApp:
        return _whole_path(self.server.rest_app())

    async def ready(self) -> bool:
        return await self.server.dataplane.ready()

    async def __del__(self) -> None:  # Ray Serve awaits it when the replica stops
        if self.watcher is not None:
            self.watcher.cancel()
        await self.server.close()


def _whole_path(app: ASGIApp) -> ASGIApp:
    """Ray's proxy sets the application's route prefix as the ASGI root path, which Starlette strips
    before matching; the server's routes are whole paths (``/v2/models/{name}/infer``)."""

    async def whole_path(scope: Scope, receive: Receive, send: Send) -> None:
        await app({**scope, "root_path": ""}, receive, send)

    return whole_path


class Front:
    """The server-wide routes: live, ready (every model's replicas answer ready), server metadata."""

    def __init__(self, models: list[str]) -> None:
        self.models = models

    def __serve_build_asgi_app__(self) -> ASGIApp:
        from ray import serve
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse, Response
        from starlette.routing import Route

        from unideploy.server.dataplane import server_metadata

        handles = {m: serve.get_deployment_handle(MODEL_DEPLOYMENT, app_name=app_name(m)) for m in self.models}

        async def live(request: Request) -> Response:
            return Response(status_code=200)

        async def ready(request: Request) -> Response:
            try:
                answers = [await handle.ready.remote() for handle in handles.values()]
            except Exception:  # a replica being replaced: not ready now
                answers = [False]
            return Response(status_code=200 if answers and all(answers) else 503)

        async def metadata(request: Request) -> Response:
            return JSONResponse(server_metadata())

        return Starlette(
            routes=[Route("/v2/health/live", live), Route("/v2/health/ready", ready), Route("/v2", metadata)]
        )


def serve_on_ray(config: ServerConfig, address: str | None = None) -> None:
    """Run every model of ``config.repository`` on Ray Serve until SIGINT/SIGTERM; ``address``: a
    running cluster (``ray://`` or ``auto``), else ``$RAY_ADDRESS``, else a local one started here."""
    if is_remote(config.repository):
        raise InputError(
            "deploy serve --ray takes a local repository folder",
            "mount the bucket where the replicas run, or serve it without --ray",
        )
    if config.sequence_header is not None:
        raise InputError(
            "--sequence-header does not apply with --ray: Ray Serve's proxy routes a sequence's calls by its "
            f"own session header ({SESSION_HEADER_VARIABLE}, default {DEFAULT_SESSION_HEADER})",
            f"leave --sequence-header out, and set {SESSION_HEADER_VARIABLE} where the cluster runs to rename it",
        )
    models = scan(Path(config.repository), config.model_name)
    if not models:
        raise InputError(
            f"model repository '{config.repository}' holds no models",
            "create REPO/<model>/<version>/ holding packages from 'deploy export'",
        )
    try:
        import ray
        from ray import serve
    except ImportError as exc:
        raise MissingDependencyError(f"deploy serve --ray needs {exc.name}", RAY_INSTALL) from exc
    ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    try:
        serve.start(http_options={"host": config.host, "port": config.http_port})
        replica = serve.ingress()(ModelReplica)
        header = os.environ.get(SESSION_HEADER_VARIABLE, DEFAULT_SESSION_HEADER)
        for name, source in models.items():
            one_model = config.model_copy(
                update={"repository": source.directory, "model_name": name, "sequence_header": header}
            )
            deployment = serve.deployment(**_model_deployment(name, source))(replica)
            serve.run(deployment.bind(one_model), name=app_name(name), route_prefix=f"/v2/models/{name}")
        front = serve.deployment(name="front", ray_actor_options={"num_cpus": 0})(serve.ingress()(Front))
        serve.run(front.bind(list(models)), name=FRONT_APP, route_prefix="/")
        log.info(
            "serving %s on Ray Serve at http://%s:%d (%d model(s))",
            config.repository,
            config.host,
            config.http_port,
            len(models),
        )
        _wait_for_signal()
        log.info("shutting down: draining in-flight requests")
    finally:
        # Bounded: Ctrl-C also reaches the local cluster's own processes, and Serve's drain can
        # then wait on a controller that is gone; ray.shutdown() stops what is left.
        drain = threading.Thread(target=serve.shutdown, daemon=True)
        drain.start()
        drain.join(SHUTDOWN_TIMEOUT_S)
        ray.shutdown()


def _model_deployment(name: str, source: ModelSource) -> dict[str, Any]:
    """The deployment options of one model, saying at start-up what autoscaling a streaming model
    costs: when Ray Serve adds or removes a replica, part of the hash ring moves to another, and the
    sequences whose ids hash there lose their state (their next call is told to start again)."""
    streaming = _streams(source)
    options = deployment_options(source.settings, streaming)
    if streaming and "autoscaling_config" in options:
        scaling = options["autoscaling_config"]
        log.warning(
            "model %s keeps state between calls and autoscales (%d to %d replicas): each time a replica is "
            "added or removed, some live sequences lose their state and are told to start again; give "
            "model.yaml a fixed 'replicas: N' to keep every sequence",
            name,
            scaling["min_replicas"],
            scaling["max_replicas"],
        )
    return options


def _streams(source: ModelSource) -> bool:
    """Whether any version of the model keeps state between calls (its sequences then need every
    call on one replica)."""
    from unideploy.package.package import read_manifest

    for version in source.versions.values():
        try:
            if read_manifest(version.path).signature.state:
                return True
        except UnideployError:  # a version that does not open is refused by the replicas, saying why
            continue
    return False


def _wait_for_signal() -> None:
    """Until SIGINT or SIGTERM, then ignore both: the shutdown that follows is bounded. The handler
    only records the signal; one that sets a threading.Event takes that Event's lock, and a second
    signal arriving while it is held (Ctrl-C pressed twice, or reaching this process and its
    supervisor alike) deadlocked the process inside its own handler."""
    received: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda number, _frame: received.append(number))
    while not received:
        time.sleep(0.2)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
