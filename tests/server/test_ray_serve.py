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
    yield from _on_ray(root, "digits")


def _on_ray(root, model: str):
    """``deploy serve root --ray`` once ``model``'s two replicas run; stopped after (unless a test did)."""
    server = start_server(root, root.parent, "--ray", ready_within=240)
    try:
        server.wait_for(lambda: len(ray_replicas(model)) == 2, timeout=60, what="two replicas")
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


@pytest.fixture(scope="module")
def ray_streams(tmp_path_factory):
    """The running average (a streaming model) as two replicas of one thread each, on a cluster of
    its own (the digits cluster above is stopped by then: two replicas of each would need 4 CPUs)."""
    from onnx_models import running_average_model

    import unideploy

    root = tmp_path_factory.mktemp("ray-streams")
    source = running_average_model(tmp_path_factory.mktemp("ray-stream-source") / "average.onnx")
    unideploy.export(source, root / "average" / "1", state=["h=h_next:0.25"]).close()
    (root / "average" / "model.yaml").write_text("replicas: 2\nthreads: 1\n")
    yield from _on_ray(root, "average")


def test_a_streaming_model_that_autoscales_is_warned_about_at_start_up(tmp_path, caplog):
    """Read from each version's manifest (a zip's in place), before any replica opens the packages:
    a streaming model is routed by its session header, and one that autoscales is said to lose live
    sequences whenever a replica comes or goes; a fixed count says nothing."""
    from onnx_models import running_average_model

    import unideploy
    from unideploy.package.files import write_zip
    from unideploy.server.ray_serve import _model_deployment
    from unideploy.server.repository import scan

    source = running_average_model(tmp_path / "average.onnx")
    unideploy.export(source, tmp_path / "pkg", state=["h=h_next:0.25"]).close()
    (tmp_path / "repo" / "average").mkdir(parents=True)
    write_zip(tmp_path / "pkg", tmp_path / "repo" / "average" / "1.zip")
    model_yaml = tmp_path / "repo" / "average" / "model.yaml"
    model_yaml.write_text("replicas: {min: 1, max: 3}\n")
    with caplog.at_level("WARNING", logger="unideploy"):
        options = _model_deployment("average", scan(tmp_path / "repo")["average"])
    assert options["request_router_config"]["request_router_class"].endswith("ConsistentHashRouter")
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "model average keeps state between calls and autoscales (1 to 3 replicas)" in warning, warning
    assert "'replicas: N'" in warning
    caplog.clear()
    model_yaml.write_text("replicas: 2\n")
    with caplog.at_level("WARNING", logger="unideploy"):
        assert _model_deployment("average", scan(tmp_path / "repo")["average"])["num_replicas"] == 2
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_a_sequence_s_calls_reach_the_replica_that_holds_its_state(ray_streams):
    """A streaming model on two replicas: each sequence's calls, carrying its id in Ray Serve's
    session header, are routed by consistent hashing to one replica, which holds its state, so
    eight interleaved sequences each answer as the model run over its rows in order (spread as
    other requests are, about half the later calls would reach the replica that never saw the
    start). A call without the header is refused naming it."""
    assert deployment_options(ModelSettings(), streaming=True)["request_router_config"]["request_router_kwargs"] == {
        "num_fallback_replicas": 0
    }
    rng = np.random.default_rng(0)
    rows = {key: rng.standard_normal((4, 1, 4)).astype(np.float32) for key in range(1, 9)}

    def call(http, key: int, step: int):
        parameters = {"sequence_id": key, "sequence_start": step == 0, "sequence_end": step == 3}
        x = rows[key][step]
        body = {
            "parameters": parameters,
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": x.ravel().tolist()}],
        }
        return http.post("/v2/models/average/infer", json=body, headers={"x-session-id": str(key)})

    with ray_streams.client() as http:
        answers: dict[int, list] = {key: [] for key in rows}
        for step in range(4):
            for key in rows:
                answer = call(http, key, step)
                assert answer.status_code == 200, answer.text
                answers[key].append(answer.json()["outputs"][0]["data"])
        for key, got in answers.items():
            h, expected = np.full(4, 0.25, np.float32), []
            for x in rows[key][:, 0]:
                h = 0.5 * h + x
                expected.append(2 * h)
            np.testing.assert_allclose(np.array(got), np.array(expected), rtol=1e-5)
        unrouted = http.post(
            "/v2/models/average/infer",
            json={
                "parameters": {"sequence_id": 9, "sequence_start": True},
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0.0] * 4}],
            },
        )
        assert unrouted.status_code == 400 and "'x-session-id' header" in unrouted.json()["error"], unrouted.text
