"""The serving images, built and run as a user behind a firewall would: buildah builds the real
docker/Dockerfile (and docker/Dockerfile.gpu up to NVIDIA's wheels) from a stand-in base image and
a folder of the host's wheels, fetching nothing; the image's own ENTRYPOINT + CMD serves a real
repository, tritonclient's REST and gRPC answers match `deploy run`, the image's HEALTHCHECK
passes, the server runs as the image's non-root user, and no build leftovers are inside.

No registry is reachable here, so the base (python:3.11-slim, nvidia/cuda) is stood in for by
Debian bookworm with Python 3.11 from debootstrap, kept in buildah's image store between runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from serving import DEPLOY, RunningServer, free_port, stop_server

ROOT = Path(__file__).parents[1]
STAND_IN = "localhost/unideploy-stand-in-python:3.11-bookworm"
DEBIAN_MIRROR = os.environ.get("UNIDEPLOY_DEBIAN_MIRROR", "http://deb.debian.org/debian")
CONTEXT_FILES = ("pyproject.toml", "README.md", "unideploy", "docker")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.image,
    pytest.mark.skipif(
        not (shutil.which("buildah") and shutil.which("debootstrap")),
        reason="buildah and debootstrap are not installed (`make test` installs them with apt-get "
        "where it can: Debian, as root)",
    ),
    pytest.mark.skipif(
        hasattr(os, "geteuid") and os.geteuid() != 0,
        reason="buildah builds with chroot isolation as root here; rootless builds need subuid "
        "mappings this user lacks",
    ),
]


def buildah(*args: str, timeout: float = 600) -> str:
    done = subprocess.run(["buildah", *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"buildah {' '.join(args[:3])} failed: {(done.stderr or done.stdout)[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def stand_in_base(tmp_path_factory) -> str:
    """Debian bookworm with Python 3.11, pip and venv, under a name of its own (about a minute, once)."""
    if buildah("images", "--quiet", "--filter", f"reference={STAND_IN}").strip():
        return STAND_IN
    work = tmp_path_factory.mktemp("stand-in")
    subprocess.run(
        [
            "debootstrap",
            "--variant=minbase",
            "--include=python3.11,python3-pip,python3-venv",
            "bookworm",
            str(work / "rootfs"),
            DEBIAN_MIRROR,
        ],
        check=True,
        capture_output=True,
        timeout=900,
    )
    subprocess.run(["tar", "-C", str(work / "rootfs"), "-cf", str(work / "rootfs.tar"), "."], check=True)
    container = buildah("from", "scratch").strip()
    try:
        buildah("add", container, str(work / "rootfs.tar"), "/")
        buildah("config", "--cmd", '["python3"]', container)
        buildah("commit", "--quiet", container, STAND_IN)
    finally:
        buildah("rm", container)
    shutil.rmtree(work, ignore_errors=True)
    return STAND_IN


@pytest.fixture(scope="module")
def context(tmp_path_factory) -> Path:
    """The build context with the project's wheels and their build requirements in ``wheels/``."""
    context = tmp_path_factory.mktemp("context")
    for name in CONTEXT_FILES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, context / name, ignore=shutil.ignore_patterns("__pycache__", "*.whl"))
        else:
            shutil.copy(source, context / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            ".[serve,gpu,sign]",
            "setuptools>=77",
            "wheel",
            "-w",
            "wheels",
        ],
        cwd=context,
        check=True,
        capture_output=True,
        timeout=600,
    )
    return context


def build(context: Path, base: str, dockerfile: str, *options: str) -> str:
    tag = f"localhost/unideploy-test-{uuid.uuid4().hex[:8]}"
    buildah(
        "bud",
        "--isolation",
        "chroot",
        "--format",
        "docker",
        "--quiet",
        "-f",
        f"docker/{dockerfile}",
        "--build-arg",
        f"BASE_IMAGE={base}",
        "--build-arg",
        "PIP_FIND_LINKS=wheels",
        *options,
        "-t",
        tag,
        str(context),
        timeout=900,
    )
    return tag


def remove(tag: str) -> None:
    subprocess.run(["buildah", "rmi", tag], capture_output=True)
    subprocess.run(["buildah", "rmi", "--prune"], capture_output=True)  # the build stages' images


@pytest.fixture(scope="module")
def cpu_image(stand_in_base, context):
    tag = build(context, stand_in_base, "Dockerfile")
    yield tag
    remove(tag)


@pytest.fixture(scope="module")
def gpu_serving_image(stand_in_base, context):
    tag = build(context, stand_in_base, "Dockerfile.gpu", "--target", "serving")
    yield tag
    remove(tag)


class Container:
    """A working container of an image, and the image's configuration (what `docker run` obeys)."""

    def __init__(self, image: str) -> None:
        self.config = json.loads(buildah("inspect", "--type", "image", image))["Docker"]["config"]
        self.name = buildah("from", "--quiet", image).strip()

    def run(self, *command: str, mounts: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
        volumes = [arg for mount in mounts for arg in ("-v", mount)]
        return subprocess.run(
            ["buildah", "run", "--isolation", "chroot", *volumes, self.name, "--", *command],
            capture_output=True,
            text=True,
            timeout=120,
        )

    def healthcheck(self, http_port: int) -> list[str]:
        test = self.config["Healthcheck"]["Test"]
        assert test[0] == "CMD", test
        return [part.replace("8000", str(http_port)) for part in test[1:]]

    def serve(self, models: Path, log: Path) -> tuple[RunningServer, float]:
        """The image's ENTRYPOINT + CMD with /models bind-mounted, on 127.0.0.1 and free ports; the
        seconds until its HEALTHCHECK passed inside the container."""
        http_port, grpc_port = free_port(), free_port()
        swap = {"0.0.0.0": "127.0.0.1", "8000": str(http_port), "8001": str(grpc_port)}
        command = [swap.get(part, part) for part in self.config["Entrypoint"] + self.config["Cmd"]]
        assert "/models" in command, command
        started = time.monotonic()
        with open(log, "w") as log_file:  # the child keeps its own descriptor
            process = subprocess.Popen(
                ["buildah", "run", "--isolation", "chroot", "-v", f"{models}:/models:ro", self.name, "--", *command],
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
        server = RunningServer(models, f"http://127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", process, log)
        server.wait_for(
            lambda: self.run(*self.healthcheck(http_port)).returncode == 0,
            timeout=120,
            what="the image's HEALTHCHECK to pass",
        )
        return server, time.monotonic() - started

    def remove(self) -> None:
        subprocess.run(["buildah", "rm", self.name], capture_output=True)


def serving_uids(http_port: str) -> set[int]:
    """The real uids of the processes in the container whose command line serves on ``http_port``
    (not `buildah run` itself, which runs on the host as root)."""
    uids = set()
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            if b"serve" in cmdline and http_port.encode() in cmdline and Path(cmdline[0].decode()).name != "buildah":
                status = (proc / "status").read_text()
                uids.add(int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1]))
        except (OSError, StopIteration):
            continue
    return uids


def readable_copy(repo: Path, tmp_path: Path) -> Path:
    """The repository as a user hands it to the image: readable by its non-root user."""
    models = tmp_path / "models"
    shutil.copytree(repo, models)
    for path in [models, *models.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return models


def deploy_run(package: Path, rows: np.ndarray, tmp_path: Path) -> np.ndarray:
    np.savez(tmp_path / "in.npz", x=rows)
    subprocess.run(
        [DEPLOY, "run", str(package), "--input", str(tmp_path / "in.npz"), "-o", str(tmp_path / "out.npz")],
        check=True,
        capture_output=True,
    )
    with np.load(tmp_path / "out.npz") as out:
        return out["output"]


def test_cpu_image_serves_what_deploy_run_answers(cpu_image, repo, digits, tmp_path):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    with np.load(digits["data"]) as data:
        rows = data["x"][:4]
    expected = deploy_run(repo / "digits" / "1", rows, tmp_path)
    container = Container(cpu_image)
    try:
        assert container.config["User"] == "unideploy"
        server, cold_start = container.serve(readable_copy(repo, tmp_path), tmp_path / "image.log")
        try:
            http_port = server.http.rsplit(":", 1)[1]
            assert serving_uids(http_port) == {1000}, "the server must run as the image's user, not root"
            rest = httpclient.InferenceServerClient(server.http.removeprefix("http://"))
            tensor = httpclient.InferInput("x", list(rows.shape), "FP32")
            tensor.set_data_from_numpy(rows)
            np.testing.assert_allclose(rest.infer("digits", [tensor]).as_numpy("output"), expected, atol=1e-5)
            grpc = grpcclient.InferenceServerClient(server.grpc)
            tensor = grpcclient.InferInput("x", list(rows.shape), "FP32")
            tensor.set_data_from_numpy(rows)
            np.testing.assert_allclose(grpc.infer("digits", [tensor]).as_numpy("output"), expected, atol=1e-5)
        finally:
            stop_server(server)
        print(f"cold start to a passing HEALTHCHECK: {cold_start:.1f} s")
    finally:
        container.remove()


def test_cpu_image_is_lean(cpu_image):
    """Only the runtime environment: no compiler, wheels, build sources, caches or pip in the venv
    (the base image's own Python keeps its pip)."""
    container = Container(cpu_image)
    try:
        leftovers = container.run(
            "sh",
            "-c",
            "command -v gcc cc; ls -d /wheels /src /root/.cache/pip "
            "/opt/unideploy/bin/pip /opt/unideploy/lib/python3*/site-packages/tests",
        )
        assert leftovers.stdout.strip() == "", leftovers.stdout
        assert container.run("deploy", "--help").returncode == 0
    finally:
        container.remove()


def test_gpu_image_serving_stage_runs_as_its_user_with_a_writable_engine_cache(gpu_serving_image, repo, tmp_path):
    """docker/Dockerfile.gpu up to NVIDIA's wheels (`--target serving`): the same command serves,
    its HEALTHCHECK passes, and its user can write TensorRT engines where the cache volume goes."""
    container = Container(gpu_serving_image)
    try:
        engines = next(e.split("=", 1)[1] for e in container.config["Env"] if e.startswith("UNIDEPLOY_ENGINE_CACHE="))
        assert container.run("sh", "-c", f"touch {engines}/probe && id -u").stdout.strip() == "1001"
        server, _ = container.serve(readable_copy(repo, tmp_path), tmp_path / "image.log")
        try:
            assert serving_uids(server.http.rsplit(":", 1)[1]) == {1001}
            with server.client() as client:
                assert client.get("/v2/models/digits/ready").status_code == 200
        finally:
            stop_server(server)
    finally:
        container.remove()
