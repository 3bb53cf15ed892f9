"""Triton's statistics extension, read by the clients that read Triton's (tritonclient HTTP and gRPC),
against a server in one process and one with two front ends: what it counts for answered, merged
and failed requests, and how it refuses what it does not serve."""

from __future__ import annotations

import time

import numpy as np
import pytest

from unideploy.server.batching import CallParts
from unideploy.server.statistics import VersionStatistics

httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient is in the dev extra")
grpcclient = pytest.importorskip("tritonclient.grpc", reason="tritonclient is in the dev extra")
from tritonclient.utils import InferenceServerException  # noqa: E402


@pytest.fixture(scope="module")
def images(digits) -> np.ndarray:
    with np.load(digits["data"]) as data:
        return np.ascontiguousarray(data["x"][:3])


def stats(server) -> dict:
    client = httpclient.InferenceServerClient(server.http.removeprefix("http://"))
    (found,) = client.get_inference_statistics("digits")["model_stats"]
    return found


def grpc_stats(server) -> dict:
    """The gRPC answer, as tritonclient gives it (protobuf's JSON: uint64 as strings, zeros left out)."""
    (found,) = grpcclient.InferenceServerClient(server.grpc).get_inference_statistics("digits", as_json=True)[
        "model_stats"
    ]
    return found


def figures(found: dict, convert=int) -> list:
    """The figures both protocols must agree on (``convert``: gRPC's strings to numbers)."""
    paths = [("inference_count",), ("execution_count",), ("last_inference",)]
    paths += [
        ("inference_stats", stat, unit) for stat in ("success", "queue", "compute_infer") for unit in ("count", "ns")
    ]
    values = []
    for path in paths:
        value = found
        for key in path:
            value = value.get(key, 0)
        values.append(convert(value))
    return values


def answered(server, before: int, count: int) -> dict:
    """The statistics once ``count`` requests more than ``before`` are recorded as answered: a front
    end tells the model process a response was sent with its next message, within 5 ms."""
    found: dict = {}

    def recorded() -> bool:
        found.update(stats(server))
        return found["inference_stats"]["success"]["count"] >= before + count

    server.wait_for(recorded, timeout=30, what=f"{count} answered requests in the statistics")
    return found


def delta(after: dict, before: dict, *path: str) -> int:
    for key in path:
        after, before = after[key], before[key]
    return after - before


def test_statistics_count_requests_rows_and_calls_alike_over_both_protocols(server, images):
    before = stats(server)
    started_ms = int(time.time() * 1000)
    http = httpclient.InferenceServerClient(server.http.removeprefix("http://"), concurrency=8)
    tensor = httpclient.InferInput("x", list(images.shape), "FP32")
    tensor.set_data_from_numpy(images)
    pending = [http.async_infer("digits", [tensor]) for _ in range(8)]  # side by side: merged where they meet
    for request in pending:
        request.get_result()
    g = grpcclient.InferenceServerClient(server.grpc)
    one = grpcclient.InferInput("x", list(images.shape), "FP32")
    one.set_data_from_numpy(images)
    g.infer("digits", [one])
    after = answered(server, before["inference_stats"]["success"]["count"], 9)

    assert after["name"] == "digits" and after["version"] == "1"
    assert delta(after, before, "inference_stats", "success", "count") == 9
    assert delta(after, before, "inference_stats", "success", "ns") > 0
    assert delta(after, before, "inference_stats", "queue", "count") == 9
    assert delta(after, before, "inference_count") == 9 * len(images)  # rows, as Triton counts inferences
    executions = delta(after, before, "execution_count")
    assert 1 <= executions <= 9  # a merged call answers several requests
    for part in ("compute_input", "compute_infer", "compute_output"):  # counted once per request
        assert delta(after, before, "inference_stats", part, "count") == 9
    assert delta(after, before, "inference_stats", "compute_infer", "ns") > 0
    assert delta(after, before, "inference_stats", "fail", "count") == 0
    assert after["last_inference"] >= started_ms
    calls = {b["batch_size"]: b["compute_infer"]["count"] for b in after["batch_stats"]}
    calls_before = {b["batch_size"]: b["compute_infer"]["count"] for b in before["batch_stats"]}
    new = {size: count - calls_before.get(size, 0) for size, count in calls.items()}
    assert sum(new.values()) == executions  # each call once, at the rows it merged
    assert sum(size * count for size, count in new.items()) == 9 * len(images)
    assert figures(grpc_stats(server)) == figures(stats(server))  # one set of figures, whichever protocol asks


def test_a_request_refused_by_the_model_counts_as_failed(server):
    before = stats(server)
    client = httpclient.InferenceServerClient(server.http.removeprefix("http://"))
    wrong = httpclient.InferInput("x", [1, 1, 7, 7], "FP32")  # the digits CNN takes 8x8
    wrong.set_data_from_numpy(np.zeros((1, 1, 7, 7), np.float32))
    with pytest.raises(InferenceServerException):
        client.infer("digits", [wrong])
    after = stats(server)
    assert delta(after, before, "inference_stats", "fail", "count") == 1
    assert delta(after, before, "inference_stats", "fail", "ns") > 0
    assert delta(after, before, "execution_count") == 0


def test_every_model_or_a_named_version_and_refusals(server):
    client = httpclient.InferenceServerClient(server.http.removeprefix("http://"))
    assert "statistics" in client.get_server_metadata()["extensions"]
    every = client.get_inference_statistics()["model_stats"]
    assert [(s["name"], s["version"]) for s in every] == [("digits", "1")]
    assert client.get_inference_statistics("digits", "1")["model_stats"][0]["version"] == "1"
    with pytest.raises(InferenceServerException, match="unknown model 'nope'"):
        client.get_inference_statistics("nope")
    g = grpcclient.InferenceServerClient(server.grpc)
    with pytest.raises(InferenceServerException, match="no version '7' loaded") as caught:
        g.get_inference_statistics("digits", "7")
    assert caught.value.status() == "StatusCode.NOT_FOUND"


def test_a_merged_call_counts_once_per_batch_size_and_once_per_request_it_answered():
    """Triton counts compute per request (a call of 3 requests adds its time 3 times to
    ``inference_stats``) and per execution in ``batch_stats``; the hand-off to the batch thread
    and the merge are compute input, the way back to the event loop compute output."""
    statistics = VersionStatistics()
    statistics.called(8, 3, CallParts(to_thread=0.001, input=0.002, infer=0.010, from_thread=0.0005))
    statistics.called(1, 1, CallParts(infer=0.004))
    found = statistics.as_triton("m", "1", success=statistics.failed, queue=statistics.failed)
    assert found["inference_count"] == 9 and found["execution_count"] == 2
    assert found["inference_stats"]["compute_input"] == {"count": 4, "ns": 9_000_000}
    assert found["inference_stats"]["compute_infer"] == {"count": 4, "ns": 34_000_000}
    assert found["inference_stats"]["compute_output"] == {"count": 4, "ns": 1_500_000}
    assert [(b["batch_size"], b["compute_infer"]) for b in found["batch_stats"]] == [
        (1, {"count": 1, "ns": 4_000_000}),
        (8, {"count": 1, "ns": 10_000_000}),
    ]
