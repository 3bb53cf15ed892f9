"""Starting and stopping a real ``deploy serve`` process on 127.0.0.1 (tests and the Docker test)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

DEPLOY = shutil.which("deploy", path=str(Path(sys.executable).parent)) or "deploy"
# the ``--frontends`` counts a server test runs under, and their ids: one process (the default below
# 8 cores, so the only one a 2-core CI would try) and two front-end processes, which must answer alike
FRONTEND_COUNTS = ("0", "2")
FRONTEND_IDS = ("one-process", "2-frontends")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RunningServer:
    repo: Path
    http: str
    grpc: str
    process: subprocess.Popen
    log: Path

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.http, timeout=30, **kwargs)

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples of ``name`` on /metrics whose labels include ``labels``."""
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(f"{self.http}/metrics", timeout=30).text
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name and labels.items() <= sample.labels.items()
        )

    def ready(self, verify: str | bool = True) -> bool:
        """Whether the server answers its readiness probe now (False while it cannot be reached)."""
        try:
            return httpx.get(f"{self.http}/v2/health/ready", timeout=1, verify=verify).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_for(self, predicate, timeout: float = 60.0, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            assert self.process.poll() is None, f"server exited: {self.log.read_text()[-2000:]}"
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}; server log: {self.log.read_text()[-2000:]}")


def start_server(
    repo: Path,
    tmp: Path,
    *extra: str,
    env: dict | None = None,
    tls: tuple[Path, Path] | None = None,
    ready_within: float = 60.0,
    wrapper: tuple[str, ...] = (),
) -> RunningServer:
    """Start ``deploy serve``; ``tls`` = (cert, key) serves both ports over TLS; ``wrapper`` is a
    command it runs under (``("taskset", "-c", "0-7")``)."""
    http_port, grpc_port = free_port(), free_port()
    if tls:
        extra = (*extra, "--tls-cert", str(tls[0]), "--tls-key", str(tls[1]))
    log = tmp / f"server-{http_port}.log"
    with open(log, "w") as log_file:  # the child keeps its own descriptor
        process = subprocess.Popen(
            [
                *wrapper,
                DEPLOY,
                "serve",
                str(repo),
                "--http-port",
                str(http_port),
                "--grpc-port",
                str(grpc_port),
                "--poll-interval",
                "0.2",
                *extra,
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
    scheme = "https" if tls else "http"
    server = RunningServer(repo, f"{scheme}://127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", process, log)

    try:
        verify = str(tls[0]) if tls else True
        server.wait_for(lambda: server.ready(verify), timeout=ready_within, what="the server to become ready")
    except AssertionError:
        if process.poll() is None:  # stopped, so a server (or a Ray cluster) that never got ready does not linger
            stop_server(server)
        raise
    return server


def stop_server(server: RunningServer) -> None:
    server.process.send_signal(signal.SIGTERM)
    try:
        server.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.process.kill()
        raise


def ray_replicas(model: str) -> list:
    """The processes of a model's Ray Serve replicas (``deploy serve --ray``), by their title."""
    import psutil

    title = f"ray::ServeReplica:model-{model}:model"
    return [p for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [""])[0].startswith(title)]


def two_versions(root: Path, package: Path, model: str, weights: tuple[float, float], settings: dict) -> Path:
    """``root/<model>/`` holding ``package`` as versions 1 and 2, a weighted split between them
    (variants control and candidate) and ``settings`` as its model.yaml."""
    import yaml

    for version in ("1", "2"):
        shutil.copytree(package, root / model / version)
    variants = [{"name": n, "version": v, "weight": w} for n, v, w in zip(("control", "candidate"), (1, 2), weights)]
    (root / model / "routing.yaml").write_text(yaml.safe_dump({"variants": variants}))
    (root / model / "model.yaml").write_text(yaml.safe_dump(settings))
    return root


def kill_a_replica(server: RunningServer, model: str, load: Load, settle: int) -> dict:
    """With ``load`` running, SIGKILL one of two Ray Serve replicas of ``model``: the requests
    answered from then until ``settle`` more after a replacement runs, those that failed, and
    the seconds until the replacement ran."""
    load.more(settle)
    victim, before = ray_replicas(model)[0], len(load.results)
    killed = time.monotonic()
    victim.kill()
    server.wait_for(
        lambda: len([p for p in ray_replicas(model) if p.pid != victim.pid]) == 2,
        timeout=120,
        what="a replacement replica",
    )
    recovered = time.monotonic() - killed
    load.more(settle)
    failed = load.finish()
    return {"requests": len(load.results) - before, "failed": len(failed), "recovery_s": round(recovered, 1)}


MAX_REQUESTS, MAX_SECONDS = 20_000, 90


class Load(threading.Thread):
    """Requests to a model (input ``x``) back to back over REST until stopped (bounded in count and time)."""

    def __init__(self, server, x: np.ndarray, model: str = "digits") -> None:
        super().__init__(daemon=True)
        self.server, self.x, self.model = server, x, model
        self.results: list[tuple[int, str, bytes]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        body = {
            "inputs": [{"name": "x", "datatype": "FP32", "shape": list(self.x.shape), "data": self.x.ravel().tolist()}]
        }
        deadline = time.monotonic() + MAX_SECONDS
        with self.server.client() as http:
            while not self.stop.is_set() and len(self.results) < MAX_REQUESTS and time.monotonic() < deadline:
                r = http.post(f"/v2/models/{self.model}/infer", json=body)
                version = r.json().get("model_version", "") if r.status_code == 200 else r.text
                data = np.asarray(r.json()["outputs"][0]["data"], np.float32).tobytes() if r.status_code == 200 else b""
                self.results.append((r.status_code, version, data))

    def latest(self) -> tuple[int, str, bytes]:
        return self.results[-1] if self.results else (0, "", b"")

    def more(self, count: int = 20) -> None:
        """Wait until ``count`` more requests than so far have been answered."""
        served = len(self.results)
        self.server.wait_for(lambda: len(self.results) > served + count, what="more traffic")

    def finish(self) -> list[tuple[int, str, bytes]]:
        """Stop; the requests that did not succeed."""
        self.stop.set()
        self.join(timeout=30)
        return [r for r in self.results if r[0] != 200]
