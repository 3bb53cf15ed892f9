"""`deploy serve s3://bucket/prefix`: the repository lives in an S3-compatible store (moto's server,
started here on 127.0.0.1); new versions are downloaded, verified and loaded under load without a
failed request, and a corrupt upload is refused while the previous version keeps serving."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest
from serving import DEPLOY, Load, free_port, start_server, stop_server

pytest.importorskip("s3fs", reason="the remote extra is not installed")
moto_server = pytest.importorskip("moto.server", reason="moto is in the dev extra")


def _store(bucket: str):
    """An S3 endpoint on 127.0.0.1 with ``bucket``: the endpoint, the environment that points the
    server at it, and a client."""
    import fsspec

    port = free_port()
    store = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    store.start()
    env = {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
    }
    fs = fsspec.filesystem("s3", key="test", secret="test", endpoint_url=env["AWS_ENDPOINT_URL"])
    fs.mkdir(bucket)
    return store, env, fs


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    store, env, fs = _store("models")
    yield env, fs
    store.stop()


def _tampered(package, dest):
    """The package with one byte of its ONNX artifact changed: its checksum no longer holds."""
    import shutil

    shutil.copytree(package, dest)
    onnx_file = dest / "artifacts" / "model.onnx"
    data = bytearray(onnx_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    onnx_file.write_bytes(bytes(data))
    return dest


def _refusals_of_3(log: str) -> list[str]:
    """What the server said each time version 3 failed to load."""
    return [
        line.split("version 3 failed to load", 1)[1] for line in log.splitlines() if "version 3 failed to load" in line
    ]


def test_versions_uploaded_to_s3_serve_without_a_failed_request(s3, digits, torch_models, tmp_path):
    import unideploy

    env, fs = s3
    fs.put(str(digits["package"]), "models/repo/digits/1", recursive=True)
    other_src, shapes = torch_models["cnn_scripted"]  # same signature, different weights
    unideploy.export(other_src, tmp_path / "other.udp", input_shapes=shapes).close()
    with np.load(digits["data"]) as d:
        x = np.ascontiguousarray(d["x"][:2])
    expected_other = unideploy.run(tmp_path / "other.udp", {"x": x})["output"].astype(np.float32).tobytes()

    server = start_server("s3://models/repo", tmp_path, env=env)
    load = Load(server, x)
    load.start()
    try:
        load.more()
        fs.put(str(tmp_path / "other.udp"), "models/repo/digits/2", recursive=True)  # object by object
        server.wait_for(lambda: load.latest()[1] == "2", what="version 2 from S3 to serve")
        fs.put(str(_tampered(digits["package"], tmp_path / "bad.udp")), "models/repo/digits/3", recursive=True)
        # a poll that sees the upload half-way refuses version 3 as incomplete and tries it again when
        # its objects change: wait for the refusal of the whole upload, which names the checksum
        server.wait_for(
            lambda: any("checksum" in r for r in _refusals_of_3(server.log.read_text())), what="the refusal"
        )
        load.more()
    finally:
        failed = load.finish()
        log = server.log.read_text()
        stop_server(server)
    assert failed == [], f"failed requests: {failed[:3]}"
    assert load.latest()[1] == "2" and load.latest()[2] == expected_other
    refusals = _refusals_of_3(log)
    assert "checksum" in refusals[-1], refusals
    assert all("checksum" in r or "is missing" in r for r in refusals), refusals
    assert "remote repository s3://models/repo: digits/2 changed" in log


def test_a_missing_bucket_is_refused_before_any_port_opens(s3, tmp_path):
    env, _ = s3
    result = subprocess.run(
        [DEPLOY, "serve", "s3://no-such-bucket/repo", "--http-port", str(free_port()), "--grpc-port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "s3://no-such-bucket/repo" in lines[0], result.stderr


def test_a_store_that_goes_away_leaves_the_loaded_versions_serving_and_counts_failed_scans(digits, tmp_path):
    """The S3 store stops answering (an outage): each scan fails, is counted as failed in /metrics
    (the log says so once a minute), and the versions already loaded keep answering."""
    store, env, fs = _store("outage")
    fs.put(str(digits["package"]), "outage/repo/digits/1", recursive=True)
    server = start_server("s3://outage/repo", tmp_path, env={**env, "AWS_MAX_ATTEMPTS": "1"})

    try:
        store.stop()
        server.wait_for(
            lambda: server.metric("unideploy_repository_scans_total", result="failed") >= 2,
            what="two failed scans",
            timeout=120,
        )
        with np.load(digits["data"]) as d:
            x = d["x"][:2]
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]}
        with server.client() as http:
            answer = http.post("/v2/models/digits/infer", json=body)
        assert answer.status_code == 200 and answer.json()["model_version"] == "1"
        assert "repository scan failed" in server.log.read_text()
    finally:
        stop_server(server)
