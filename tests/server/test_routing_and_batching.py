"""A/B routing (split, sticky keys, shadow, explicit versions, the routing API) and dynamic
batching, against a real server."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
import yaml
from serving import FRONTEND_COUNTS, FRONTEND_IDS

from unideploy.server.batching import CallParts

REQUESTS = 2000


@pytest.fixture(scope="module", params=FRONTEND_COUNTS, ids=FRONTEND_IDS)
def ab_server(digits, tmp_path_factory, request):
    """Routing and merging run in the model process; with front-end processes (--frontends) the
    headers routing reads, and the requests to merge, reach it from two other processes."""
    from serving import start_server, stop_server

    tmp = tmp_path_factory.mktemp("ab")
    repo = tmp / "repo"
    for version in ("1", "2", "3"):
        shutil.copytree(digits["package"], repo / "digits" / version)
    (repo / "digits" / "routing.yaml").write_text(
        yaml.safe_dump(
            {
                "variants": [
                    {"name": "control", "version": 1, "weight": 90},
                    {"name": "candidate", "version": 2, "weight": 10},
                ],
                "sticky_header": "x-user-id",
                "shadow": {"version": 3},
            }
        )
    )
    (repo / "digits" / "model.yaml").write_text(yaml.safe_dump({"max_batch_size": 64, "max_queue_delay_ms": 5}))
    running = start_server(repo, tmp, "--frontends", request.param)
    yield running
    stop_server(running)


def _body(rows: int = 1) -> dict:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 1, 8, 8], "data": [0.5] * (rows * 64)}]}


def test_weighted_split_is_close_to_the_weights(ab_server):
    counts = {"control": 0, "candidate": 0}
    with ab_server.client() as http:
        for _ in range(REQUESTS):
            r = http.post("/v2/models/digits/infer", json=_body())
            variant = r.headers["x-unideploy-variant"]
            assert r.json()["parameters"]["variant"] == variant
            assert r.headers["x-unideploy-model-version"] == {"control": "1", "candidate": "2"}[variant]
            counts[variant] += 1
    share = counts["candidate"] / REQUESTS
    assert abs(share - 0.10) < 0.03, counts


def test_sticky_keys_never_switch(ab_server):
    with ab_server.client() as http:
        for user in range(40):
            seen = {
                http.post("/v2/models/digits/infer", json=_body(), headers={"x-user-id": f"user-{user}"}).headers[
                    "x-unideploy-variant"
                ]
                for _ in range(5)
            }
            assert len(seen) == 1, (user, seen)


def test_shadow_receives_copies_and_explicit_versions_bypass_routing(ab_server):
    with ab_server.client() as http:
        for _ in range(20):
            http.post("/v2/models/digits/infer", json=_body())
        r = http.post("/v2/models/digits/versions/3/infer", json=_body())
        assert r.json()["model_version"] == "3" and "x-unideploy-variant" not in r.headers
        metrics = http.get("/metrics").text
    shadowed = re.search(r'unideploy_shadow_duration_seconds_count\{model="digits",version="3"\} (\d+)', metrics)
    assert shadowed and int(shadowed.group(1)) >= 20


def test_routing_api_changes_the_split(ab_server):
    with ab_server.client() as http:
        new = {"variants": [{"name": "candidate", "version": "2", "weight": 1}]}
        assert http.put("/v2/models/digits/routing", json=new).status_code == 200
        assert http.get("/v2/models/digits/routing").json()["variants"][0]["name"] == "candidate"
        assert {
            http.post("/v2/models/digits/infer", json=_body()).headers["x-unideploy-variant"] for _ in range(30)
        } == {"candidate"}
    saved = yaml.safe_load((ab_server.repo / "digits" / "routing.yaml").read_text())
    assert saved["variants"][0]["version"] == "2"


def test_concurrent_requests_are_batched_and_split_back(ab_server):
    """Sixteen clients each send a request before any is answered: some arrive while the model is
    busy, or together, and are merged (a lone request to an idle model this fast runs at once)."""
    import http.client
    import json
    from urllib.parse import urlsplit

    rng = np.random.default_rng(0)
    rows = [rng.random((1, 1, 8, 8), np.float32) for _ in range(32)]
    address = urlsplit(ab_server.http)
    connections = [http.client.HTTPConnection(address.hostname, address.port, timeout=60) for _ in range(16)]
    outputs = []
    for start in (0, 16):
        for connection, x in zip(connections, rows[start : start + 16], strict=True):
            body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1, 8, 8], "data": x.ravel().tolist()}]}
            connection.request("POST", "/v2/models/digits/versions/3/infer", json.dumps(body))
        for connection in connections:
            outputs.append(np.asarray(json.loads(connection.getresponse().read())["outputs"][0]["data"]))
    for connection in connections:
        connection.close()
    import unideploy

    with unideploy.open_package(ab_server.repo / "digits" / "3") as pkg:
        expected = unideploy.run(pkg, {"x": np.concatenate(rows)})["output"]
    np.testing.assert_allclose(np.stack(outputs), expected, rtol=1e-5, atol=1e-6)
    with ab_server.client() as http:
        metrics = http.get("/metrics").text
    buckets = dict(
        re.findall(r'unideploy_batch_rows_bucket\{le="([\d.+Inf]+)",model="digits",version="3"\} ([\d.]+)', metrics)
    )
    assert float(buckets["1.0"]) < float(buckets["+Inf"]), "no runtime call ever merged two requests"
    parts = re.findall(
        r'unideploy_runtime_call_seconds_total\{model="digits",part="(\w+)",version="3"\} ([\d.e+-]+)', metrics
    )
    assert [name for name, _ in parts] == list(CallParts._fields)
    assert float(dict(parts)["infer"]) > 0
