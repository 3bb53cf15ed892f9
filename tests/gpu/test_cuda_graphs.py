"""Batch buckets replaying CUDA graphs (``cuda_graphs``, runtimes/ort_bound.py) on ONNX Runtime's
CUDA provider: the trained digits CNN answers real digits as the CPU does, at sizes that fill a
bucket, pad one and span two. Skipped where the CUDA provider does not load (CI has no GPU); the
binding itself is tested on the CPU (tests/runtimes/test_ort_bound.py)."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from console import deploy

from unideploy.doctor import provider_problem
from unideploy.package import Package
from unideploy.runtimes import RuntimeOptions
from unideploy.runtimes.ort_providers import CUDA
from unideploy.runtimes.selection import open_runtime

WHY = provider_problem(CUDA)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(WHY is not None, reason=f"needs ONNX Runtime's CUDA provider: {WHY}")]


CAPTURED = "captured, one per bucket"
# the server's default (cuda_graphs None): only the one-row bucket replays a graph (GRAPH_ROWS)
ONE_ROW = (
    "captured for batch bucket 1 (one per bucket); buckets 4, 8 run plain sessions, whose batches run "
    "side by side (cuda_graphs: true captures every bucket)"
)


@pytest.mark.parametrize("graphs", [True, None, False])  # asked for, the server's default (where buckets run), off
def test_buckets_answer_as_the_cpu_does(digits, graphs):
    images = np.load(digits["data"])["x"][:11]
    with Package.open(digits["package"]) as package:
        _, cpu = open_runtime(package, "onnx-fp32", options=RuntimeOptions(device="cpu"))
        options = RuntimeOptions(device="gpu", batch_buckets=(1, 4, 8), cuda_graphs=graphs)
        _, gpu = open_runtime(package, "onnx-fp32", options=options)
        with cpu, gpu:
            described = gpu.describe()
            assert described["batch_buckets"] == [1, 4, 8]
            assert described.get("cuda_graphs") == {True: CAPTURED, None: ONE_ROW, False: None}[graphs]
            # the smallest bucket's session is the runtime's (none was opened for any batch size)
            assert [i.shape[0] for i in gpu.session.get_inputs()] == [1]
            for rows in (8, 3, 11, 1):  # a full bucket, a padded one, two buckets, the smallest
                np.testing.assert_allclose(
                    gpu.run({"x": images[:rows]})["output"], cpu.run({"x": images[:rows]})["output"], atol=1e-4
                )


def test_bench_times_each_size_on_its_captured_graph(digits):
    """``deploy bench --cuda-graphs``: what a user measures before turning on ``cuda_graphs``."""
    result = deploy("bench", digits["package"], "--device", "gpu", "--batch-size", "1,8", "--cuda-graphs", "--json")
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["cuda_graphs"] == CAPTURED and found["batch_buckets"] == [1, 8]
    assert [r["batch_size"] for r in found["runs"]] == [1, 8]


@pytest.mark.parametrize(
    ("graphs", "sessions", "buckets", "described", "sizes"),
    [
        (True, 1, (1, 4, 8), CAPTURED, [8, 3, 1, 4, 8, 2]),
        (None, 1, (1, 4, 8), ONE_ROW, [8, 8, 1, 3, 8, 1]),
        (True, 2, (1, 8), "captured, 2 sessions per bucket", [8, 8, 5, 8, 1, 8]),
    ],
    ids=["every-bucket", "by-default-the-one-row-bucket", "two-graph-sessions"],
)
def test_two_batch_threads_answer_as_the_cpu_does(digits, graphs, sessions, buckets, described, sizes):
    """As the server runs a GPU model (two batches in flight, each on a batch thread). Every bucket
    captured as the engine opened, each on its own thread, so calls from other threads replay those
    graphs without capturing again (a capture fails the CUDA calls any other thread makes
    meanwhile); by default only bucket 1 replays one, and the batch threads run the larger buckets'
    plain sessions at once; with ``graph_sessions: 2`` (runtimes/ort_bound.GraphSessions) each
    bucket is captured twice, so the two threads' calls of one bucket replay at once."""
    images = np.load(digits["data"])["x"][:8]
    with Package.open(digits["package"]) as package:
        _, cpu = open_runtime(package, "onnx-fp32", options=RuntimeOptions(device="cpu"))
        options = RuntimeOptions(device="gpu", batch_buckets=buckets, cuda_graphs=graphs, graph_sessions=sessions)
        _, gpu = open_runtime(package, "onnx-fp32", options=options)
        with cpu, gpu, ThreadPoolExecutor(2) as batch_threads:
            assert gpu.describe()["cuda_graphs"] == described
            answers = list(batch_threads.map(lambda rows: gpu.run({"x": images[:rows]})["output"], sizes * 8))
            for rows, answer in zip(sizes * 8, answers, strict=True):
                np.testing.assert_allclose(answer, cpu.run({"x": images[:rows]})["output"], atol=1e-4)


def test_a_model_loading_with_graphs_beside_one_serving_fails_neither(digits):
    """A hot reload on a GPU: one engine answers from two batch threads while another loads and
    captures its graphs. CUDA's global capture mode fails any CUDA call another
    thread makes during a capture; the server's calls wait for it instead (runtimes/cuda_work.py)."""
    images = np.load(digits["data"])["x"][:8]
    with Package.open(digits["package"]) as package:
        _, cpu = open_runtime(package, "onnx-fp32", options=RuntimeOptions(device="cpu"))
        expected = {rows: cpu.run({"x": images[:rows]})["output"] for rows in range(1, 9)}
        serving_options = RuntimeOptions(device="gpu", batch_buckets=(1, 4, 8), cuda_graphs=True)
        _, serving = open_runtime(package, "onnx-fp32", options=serving_options)
        stop, answered = threading.Event(), []

        def serve(start: int) -> None:
            rows = start
            while not stop.is_set():
                rows = rows % 8 + 1
                np.testing.assert_allclose(serving.run({"x": images[:rows]})["output"], expected[rows], atol=1e-4)
                answered.append(rows)

        with cpu, serving, ThreadPoolExecutor(2) as batch_threads:
            calls = [batch_threads.submit(serve, start) for start in (0, 4)]
            try:
                options = RuntimeOptions(device="gpu", batch_buckets=(1, 2, 4, 8), cuda_graphs=True)
                _, loaded = open_runtime(package, "onnx-fp32", options=options)
                with loaded:
                    assert loaded.describe()["cuda_graphs"] == CAPTURED
                    np.testing.assert_allclose(loaded.run({"x": images[:3]})["output"], expected[3], atol=1e-4)
            finally:
                stop.set()
            for call in calls:
                call.result()  # a call that failed during a capture raises here
        assert answered
