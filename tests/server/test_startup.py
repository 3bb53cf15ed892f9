"""`deploy serve` refuses what it cannot serve with one line, and reads its settings files."""

from __future__ import annotations

import socket
import subprocess

import pytest
import yaml
from serving import DEPLOY, free_port, start_server, stop_server

from unideploy.errors import InputError
from unideploy.server.config import ModelSettings, ServerConfig, model_settings


def serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([DEPLOY, "serve", *args], capture_output=True, text=True, timeout=120)


def one_line(result: subprocess.CompletedProcess) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_missing_repository(tmp_path):
    result = serve(str(tmp_path / "nope"))
    assert result.returncode == 2 and "is not a directory" in one_line(result)


@pytest.mark.parametrize("which", ["--http-port", "--grpc-port"])
def test_busy_port_is_named(repo, which):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        ports = {"--http-port": str(free_port()), "--grpc-port": str(free_port()), which: str(taken)}
        result = serve(str(repo), *[x for kv in ports.items() for x in kv])
    assert result.returncode == 2
    assert f"127.0.0.1:{taken}" in one_line(result) and which in one_line(result)


def test_config_file_with_unknown_setting(repo, tmp_path):
    (tmp_path / "server.yaml").write_text(yaml.safe_dump({"http_port": 9000, "colour": "blue"}))
    result = serve(str(repo), "--config", str(tmp_path / "server.yaml"))
    assert result.returncode == 2 and "unknown setting(s) colour" in one_line(result)


def test_config_file_settings_and_overrides(tmp_path, monkeypatch):
    """The command line wins over UNIDEPLOY_* variables, which win over the file, then the defaults."""
    (tmp_path / "server.yaml").write_text(yaml.safe_dump({"http_port": 9000, "grpc_port": 9001, "workers": 2}))
    monkeypatch.setenv("UNIDEPLOY_WORKERS", "3")
    monkeypatch.setenv("UNIDEPLOY_GRPC_PORT", "8500")
    monkeypatch.setenv("UNIDEPLOY_INFERENCE_TOKEN", "")  # empty means unset
    config = ServerConfig.load(tmp_path / "server.yaml", repository=tmp_path, grpc_port=7001, host=None)
    assert (config.http_port, config.grpc_port, config.workers, config.host) == (9000, 7001, 3, "127.0.0.1")
    assert config.inference_token is None and config.repository == tmp_path


def test_bad_server_settings_are_named(tmp_path, monkeypatch):
    monkeypatch.setenv("UNIDEPLOY_HTTP_PORT", "eighty")
    with pytest.raises(InputError, match="http_port: Input should be a valid integer"):
        ServerConfig.load(None, repository=tmp_path)


def test_the_model_process_takes_its_gil_switch_interval_from_the_settings(repo, tmp_path):
    """The interval the model process runs with (docs/server.md) is the one set, and its start-up
    line says so; one that is not a positive number of microseconds is refused by name."""
    server = start_server(repo, tmp_path, "--frontends", "0", env={"UNIDEPLOY_SWITCH_INTERVAL_US": "50"})
    try:
        server.wait_for(lambda: "event loop" in server.log.read_text(), what="the start-up line")
        assert "GIL switch interval 50 us" in server.log.read_text()
    finally:
        stop_server(server)
    assert ServerConfig.load(None, repository=tmp_path).switch_interval_us == 20.0
    with pytest.raises(InputError, match="switch_interval_us: Input should be greater than 0"):
        ServerConfig.load(None, repository=tmp_path, switch_interval_us=0)


def test_misspelt_model_yaml_key_is_named_with_the_valid_ones(tmp_path):
    (tmp_path / "model.yaml").write_text(yaml.safe_dump({"max_batch_sise": 4}))
    with pytest.raises(
        InputError, match=r"unknown setting\(s\) max_batch_sise \(known: version_policy, max_batch_size"
    ):
        model_settings(tmp_path)


@pytest.mark.parametrize(
    "policy, expected",
    [
        ({"latest": 2}, ["3", "4"]),
        ({"all": True}, ["1", "2", "3", "4"]),
        ({"specific": [1, 3]}, ["1", "3"]),
    ],
)
def test_version_policies(tmp_path, policy, expected):
    (tmp_path / "model.yaml").write_text(yaml.safe_dump({"version_policy": policy, "max_batch_size": 4}))
    settings = model_settings(tmp_path)
    assert settings.select(["1", "2", "3", "4"]) == expected and settings.max_batch_size == 4


def test_model_yaml_sets_spinning_threads_and_delay(tmp_path):
    (tmp_path / "model.yaml").write_text(yaml.safe_dump({"spin": "always", "threads": 1, "max_queue_delay_ms": 3}))
    settings = model_settings(tmp_path)
    assert (settings.spin, settings.threads, settings.max_queue_delay_ms) == ("always", 1, 3.0)
    # without a model.yaml: spin within runs only; merge only requests that queued while the model was busy
    assert (ModelSettings().spin, ModelSettings().threads, ModelSettings().max_queue_delay_ms) == ("run", None, 0.0)


@pytest.mark.parametrize(
    "document",
    [
        {"version_policy": {"newest": 1}},
        {"version_policy": {"latest": 0}},
        {"version_policy": "latest"},
        {"max_batch_size": "many"},
        ["not", "a", "map"],
        {"spin": "sometimes"},
        {"threads": 0},
        {"lanes": 0},
        {"max_queue_delay_ms": -1},
        {"replicas": 0},
        {"replicas": {"min": 3, "max": 2}},
        {"replicas": {"maximum": 2}},
        {"replicas": {"max": 2, "target_concurrency": 0}},
        {"batch_buckets": [0, 8]},
        {"batch_buckets": "powers of two"},
        {"tf32": "maybe"},
        {"cuda_graphs": "sometimes"},
        {"batches_in_flight": 0},
        {"device": "tpu"},
        {"pinned_memory": "maybe"},
        {"device_batches": "sometimes"},
    ],
)
def test_bad_model_yaml_is_explained(tmp_path, document):
    (tmp_path / "model.yaml").write_text(yaml.safe_dump(document))
    with pytest.raises(InputError, match="model.yaml"):
        model_settings(tmp_path)


def test_model_yaml_sets_lanes_which_do_not_merge(tmp_path):
    (tmp_path / "model.yaml").write_text(yaml.safe_dump({"lanes": 2}))
    assert (model_settings(tmp_path).lanes, ModelSettings().lanes) == (2, 1)
    (tmp_path / "model.yaml").write_text(yaml.safe_dump({"lanes": 2, "max_queue_delay_ms": 3}))
    with pytest.raises(InputError, match="lanes run queued requests side by side instead of merging"):
        model_settings(tmp_path)


def test_model_yaml_sets_gpu_batch_buckets_tf32_and_cuda_graphs(tmp_path):
    assert (ModelSettings().batch_buckets, ModelSettings().tf32, ModelSettings().cuda_graphs) == (None, False, None)
    (tmp_path / "model.yaml").write_text(
        yaml.safe_dump({"batch_buckets": [32, 8, 1, 8], "tf32": True, "cuda_graphs": True})
    )
    found = model_settings(tmp_path)
    assert (found.batch_buckets, found.tf32, found.cuda_graphs) == ((1, 8, 32), True, True)
    (tmp_path / "model.yaml").write_text(yaml.safe_dump({"cuda_graphs": False}))
    assert model_settings(tmp_path).cuda_graphs is False
    (tmp_path / "model.yaml").write_text(yaml.safe_dump({"cuda_graphs": "one-session"}))  # withdrawn: it crashed
    with pytest.raises(InputError, match="cuda_graphs: .*one-session was withdrawn.*use true .* or false"):
        model_settings(tmp_path)
    assert ModelSettings().graph_sessions == 1
    (tmp_path / "model.yaml").write_text(yaml.safe_dump({"graph_sessions": 2}))
    assert model_settings(tmp_path).graph_sessions == 2
    for without in ({"cuda_graphs": False}, {"batch_buckets": []}):  # sessions replaying a bucket's graph need both
        (tmp_path / "model.yaml").write_text(yaml.safe_dump({"graph_sessions": 2, **without}))
        with pytest.raises(InputError, match="graph_sessions are sessions per batch bucket replaying its CUDA graph"):
            model_settings(tmp_path)
    (tmp_path / "model.yaml").write_text(yaml.safe_dump({"graph_sessions": 0}))
    with pytest.raises(InputError, match="graph_sessions"):
        model_settings(tmp_path)
    (tmp_path / "model.yaml").write_text(
        yaml.safe_dump(
            {
                "batch_buckets": [],
                "batches_in_flight": 3,
                "device": "cpu",
                "pinned_memory": False,
                "device_batches": False,
            }
        )
    )
    assert (model_settings(tmp_path).batch_buckets, model_settings(tmp_path).batches_in_flight) == ((), 3)
    assert (ModelSettings().pinned_memory, model_settings(tmp_path).pinned_memory) == (None, False)  # None: on a GPU
    assert (ModelSettings().device_batches, model_settings(tmp_path).device_batches) == (True, False)
    assert (ModelSettings().batches_in_flight, model_settings(tmp_path).device) == (None, "cpu")  # None: 2 on a GPU
    (tmp_path / "model.yaml").write_text(yaml.safe_dump({"max_batch_size": 16, "batch_buckets": [8, 32]}))
    with pytest.raises(InputError, match=r"batch_buckets \[32\] exceed max_batch_size 16"):
        model_settings(tmp_path)


def test_model_yaml_sets_replicas(tmp_path):
    (tmp_path / "model.yaml").write_text(yaml.safe_dump({"replicas": 3}))
    assert (model_settings(tmp_path).min_replicas, model_settings(tmp_path).max_replicas) == (3, 3)
    (tmp_path / "model.yaml").write_text(yaml.safe_dump({"replicas": {"max": 4, "target_concurrency": 8}}))
    settings = model_settings(tmp_path)
    assert (settings.min_replicas, settings.max_replicas, settings.target_concurrency) == (1, 4, 8)


def test_defaults_without_model_yaml(tmp_path):
    assert model_settings(tmp_path) == ModelSettings()


def test_accepted_connections_get_tcp_nodelay():
    """asyncio sets TCP_NODELAY only on sockets created as IPPROTO_TCP; without it every keep-alive
    response waits out a 40 ms delayed ACK (Nagle). Check the option on a real accepted socket."""
    import asyncio

    from unideploy.server.listeners import bind

    async def scenario() -> int:
        listener = bind("127.0.0.1", 0, "--http-port")
        accepted: asyncio.Future = asyncio.get_running_loop().create_future()

        def on_connect(reader, writer):
            sock = writer.get_extra_info("socket")
            accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(on_connect, sock=listener)
        _, writer = await asyncio.open_connection(*listener.getsockname()[:2])
        nodelay = await asyncio.wait_for(accepted, timeout=30)
        writer.close()
        server.close()
        return nodelay

    assert asyncio.run(scenario()) != 0


def test_signature_settings_must_come_together(tmp_path):
    with pytest.raises(InputError, match="apply with --require-signed"):
        ServerConfig(repository=tmp_path, trusted_key=tmp_path / "release.pub")
    with pytest.raises(InputError, match="trust either a public key or a certificate chain"):
        ServerConfig(repository=tmp_path, require_signed=True).trusted_signers()
    assert ServerConfig(repository=tmp_path).trusted_signers() is None


def test_one_package_as_the_whole_repository_serves_as_kserve_mounts_it(digits, tmp_path):
    """KServe's storage initializer puts a single model's storageUri in /mnt/models: a package
    directory there serves as the model its manifest names, and nothing is written into it."""
    import hashlib
    import shutil

    import numpy as np
    from serving import start_server, stop_server

    mnt = tmp_path / "mnt" / "models"
    shutil.copytree(digits["package"], mnt)
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in mnt.rglob("*") if p.is_file()}
    server = start_server(mnt, tmp_path)
    try:
        with server.client() as http:
            assert http.get("/v2/models/digits").json()["versions"] == ["1"]
            x = np.zeros((2, 1, 8, 8), np.float32)
            body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 1, 8, 8], "data": x.ravel().tolist()}]}
            answer = http.post("/v2/models/digits/infer", json=body)
            assert answer.status_code == 200 and answer.json()["model_version"] == "1"
            routing = {"variants": [{"name": "a", "version": "1", "weight": 1}]}
            refused = http.put("/v2/models/digits/routing", json=routing)
            assert refused.status_code == 400  # one version, nothing to route: and no file written
    finally:
        stop_server(server)
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in mnt.rglob("*") if p.is_file()} == before


def test_the_runs_memory_cap_defaults_to_three_quarters_of_what_the_server_may_use(tmp_path):
    """--max-run-memory's default: three quarters of the memory this process may use, which is the
    machine's or less (a container's cgroup limit), so a run asking for more than the machine has
    is refused before the kernel's OOM killer picks the server."""
    from unideploy.runtimes.base import usable_memory
    from unideploy.server.config import ServerConfig

    with open("/proc/meminfo") as meminfo:
        total = int(next(line for line in meminfo if line.startswith("MemTotal:")).split()[1]) * 1024
    assert 0 < usable_memory() <= total
    assert ServerConfig(repository=tmp_path).run_memory() == usable_memory() * 3 // 4
    assert ServerConfig(repository=tmp_path, max_run_memory=10**8).run_memory() == 10**8


def test_the_memory_a_server_may_use_is_its_cgroups_limit_where_it_has_one():
    """A process in a memory cgroup of 3 GiB (as a container with a memory limit runs) reads 3 GiB
    as the memory it may use, whatever the machine has, so --max-run-memory's default follows a
    pod's limit. The group is made under this process's own (cgroup v1 here; v2 where mounted so)."""
    import subprocess
    import sys
    import uuid
    from pathlib import Path

    lines = Path("/proc/self/cgroup").read_text().splitlines()
    v1 = next((line.split(":", 2)[2] for line in lines if "memory" in line.split(":", 2)[1].split(",")), None)
    root, name = (
        (Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes") if v1 else (Path("/sys/fs/cgroup"), "memory.max")
    )
    own = v1 if v1 is not None else next(line.split(":", 2)[2] for line in lines if line.startswith("0::"))
    group = root / own.lstrip("/") / f"unideploy-test-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
        (group / name).write_text(str(3 << 30))
    except OSError as exc:
        pytest.skip(f"no memory cgroup can be made here ({exc.strerror}: needs root and a writable cgroup mount)")
    try:
        read = subprocess.run(
            [
                "sh",
                "-c",
                f'echo $$ > {group / "cgroup.procs"} && exec "$0" -c "$1"',
                sys.executable,
                "from unideploy.runtimes.base import usable_memory; print(usable_memory())",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        group.rmdir()
    assert int(read.stdout) == 3 << 30
