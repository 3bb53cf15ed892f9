"""No Docker engine runs here, so run what the images run: their ENTRYPOINT + CMD against a real
repository, then their HEALTHCHECK command; and keep the files consistent with the project."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parents[1]
DOCKERFILES = [ROOT / "docker" / "Dockerfile", ROOT / "docker" / "Dockerfile.gpu"]


def instruction(dockerfile: Path, name: str) -> list[str]:
    text = dockerfile.read_text().replace("\\\n", " ")
    match = re.search(rf"^{name}\s+(?:--\S+\s+)*(?:CMD\s+)?(\[.*\])\s*$", text, re.MULTILINE)
    assert match, f"{name} missing from {dockerfile}"
    return json.loads(match.group(1))


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfiles_are_consistent_with_the_project(dockerfile):
    text = dockerfile.read_text()
    for line in text.splitlines():
        if line.startswith("COPY ") and not line.startswith("COPY --from="):
            for source in line.split()[1:-1]:
                source = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", source)  # a build argument's default
                assert (ROOT / source).exists(), f"{dockerfile.name} copies missing '{source}'"
    extras = re.search(r"^ARG EXTRAS=(\S+)", text, re.MULTILINE).group(1).split(",")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras) <= set(declared), f"{dockerfile.name} installs undeclared extras {extras}"
    assert "serve" in extras
    assert re.search(r"^USER (?!root)\S+", text, re.MULTILINE), "the image must not run as root"
    assert instruction(dockerfile, "ENTRYPOINT") == ["deploy"]
    assert instruction(dockerfile, "CMD")[:2] == ["serve", "/models"]


def test_compose_runs_the_image_command():
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    service = compose["services"]["unideploy"]
    assert service["build"]["dockerfile"] == "docker/Dockerfile"
    assert service["command"] == instruction(DOCKERFILES[0], "CMD")
    assert any(v.endswith(":/models") or ":/models " in v for v in service["volumes"])


def test_image_command_serves_and_passes_its_healthcheck(repo, tmp_path):
    """ENTRYPOINT + CMD with /models -> a real repository, on 127.0.0.1 and free ports."""
    from serving import RunningServer, free_port, stop_server

    command = instruction(DOCKERFILES[0], "ENTRYPOINT") + instruction(DOCKERFILES[0], "CMD")
    http_port, grpc_port = free_port(), free_port()
    swap = {"/models": str(repo), "0.0.0.0": "127.0.0.1", "8000": str(http_port), "8001": str(grpc_port)}
    command = [swap.get(part, part) for part in command]
    command[0] = shutil.which(command[0], path=str(Path(sys.executable).parent))
    log = tmp_path / "image.log"
    with open(log, "w") as log_file:  # the child keeps its own descriptor
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
    server = RunningServer(repo, f"http://127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", process, log)
    healthcheck = [part.replace("8000", str(http_port)) for part in instruction(DOCKERFILES[0], "HEALTHCHECK")]
    healthcheck[0] = sys.executable
    try:
        server.wait_for(
            lambda: subprocess.run(healthcheck, capture_output=True).returncode == 0,
            what="the image's HEALTHCHECK to pass",
        )
    finally:
        stop_server(server)


def test_gpu_image_installs_tensorrt_and_keeps_engines_in_a_volume():
    """Engines take minutes to build: the GPU image keeps its cache where a volume outlives containers."""
    text = DOCKERFILES[1].read_text().replace("\\\n", " ")
    cache = re.search(r"UNIDEPLOY_ENGINE_CACHE=(\S+)", text).group(1)
    volumes = json.loads(re.search(r"^VOLUME (\[.*\])", text, re.MULTILINE).group(1))
    assert any(cache.startswith(v + "/") for v in volumes), (cache, volumes)
    assert f"mkdir -p {cache}" in text and "chown -R unideploy" in text  # writable by the image's user
    assert "tensorrt-cu13>=10.13,<11" in text and "onnxruntime-gpu>=1.31,<1.32" in text
    assert "pip uninstall -y onnxruntime" in text
    # one CUDA major: onnxruntime-gpu 1.31 and cuda-bindings 13 are CUDA 13 builds, and so must be the base
    assert re.search(r"^ARG BASE_IMAGE=nvidia/cuda:13\.", text, re.MULTILINE)
    assert "gpu" in re.search(r"^ARG EXTRAS=(\S+)", text, re.MULTILINE).group(1).split(",")
