"""`deploy serve REPO --ray` on a local Ray cluster the server starts: the same Open Inference
Protocol and A/B routing from two replicas, a replica killed under load, and a clean stop."""

from __future__ import annotations

import signal
import time

import numpy as np
import pytest
from serving import Load, kill_a_replica, ray_replicas, start_server, stop_server, two_versions

from unideploy.package import Package
from unideploy.server.config import ModelSettings
from unideploy.server.ray_serve import deployment_options

pytest.importorskip("ray.serve", reason="the ray extra is not installed")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_server(digits, tmp_path_factory):
    """Versions 1 and 2 of the digits model with a weighted split, two replicas of one thread each."""
    root = two_versions(
        tmp_path_factory.mktemp("ray-repo"), digits["package"], "digits", (50, 50), {"replicas": 2, "threads": 1}
    )
    server = start_server(root, root.parent, "--ray", ready_within=240)
    try:
        server.wait_for(lambda: len(ray_replicas("digits")) == 2, timeout=60, what="two replicas")
        yield server
    finally:
        if server.process.poll() is None:
            stop_server(server)


def test_replicas_and_autoscaling_follow_model_yaml():
    assert deployment_options(ModelSettings(min_replicas=2, max_replicas=2))["num_replicas"] == 2
    scaled = deployment_options(ModelSettings(min_replicas=1, max_replicas=4, target_concurrency=8, threads=2))
    assert scaled["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 8}
    assert scaled["ray_actor_options"] == {"num_cpus": 2} and "num_replicas" not in scaled


def test_open_inference_protocol_and_routing_through_ray(ray_server, digits):
    with Package.open(digits["package"]) as package:
        sample = package.reference_samples()[-1]
    ((name, x),) = sample.inputs.items()
    expected = next(iter(sample.outputs.values()))
    body = {"inputs": [{"name": name, "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]}
    with ray_server.client() as http:
        assert http.get("/v2/health/live").status_code == 200
        front = http.get("/v2").json()
        assert front["name"] == "unideploy"
        assert "statistics" not in front["extensions"]  # each replica counts its own: nothing to add them up
        assert http.get("/v2/models/digits").json()["versions"] == ["1", "2"]
        assert http.get("/v2/models/digits/ready").status_code == 200
        variants = set()
        for _ in range(20):
            answer = http.post("/v2/models/digits/infer", json=body)
            assert answer.status_code == 200, answer.text
            data = answer.json()["outputs"][0]["data"]
            np.testing.assert_allclose(np.reshape(data, expected.shape), expected, rtol=1e-4, atol=1e-5)
            variants.add(answer.headers["x-unideploy-variant"])
        assert variants == {"control", "candidate"}  # routing.yaml routes inside each replica
        pinned = http.post("/v2/models/digits/versions/2/infer", json=body)
        assert pinned.json()["model_version"] == "2"
        missing = http.post("/v2/models/nothing/infer", json=body)
        assert missing.status_code == 404


def test_a_replica_killed_under_load(ray_server, digits):
    """One of two replicas is killed (SIGKILL) while requests flow: the other keeps answering, Ray
    Serve starts a replacement, and the failed requests are at most those the dead one held."""
    load = Load(ray_server, np.load(digits["data"])["x"][:1].astype(np.float32))
    load.start()
    try:
        killed = kill_a_replica(ray_server, "digits", load, settle=50)
    finally:
        load.finish()
    print(
        f"replica killed under load: {killed['failed']} of {killed['requests']} requests failed, "
        f"a replacement was running {killed['recovery_s']} s later"
    )
    assert killed["failed"] <= 2  # the requests in flight on the killed replica, if any
    assert all(status == 200 for status, _, _ in load.results[-50:])


def test_sigterm_stops_the_cluster(ray_server):
    """Even with a second signal close behind the first (Ctrl-C pressed twice, or reaching the server
    and its supervisor alike), which once deadlocked the server inside its own signal handler."""
    ray_server.process.send_signal(signal.SIGINT)
    ray_server.process.send_signal(signal.SIGTERM)
    assert ray_server.process.wait(timeout=90) == 0
    deadline = time.monotonic() + 30
    while ray_replicas("digits") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not ray_replicas("digits")
