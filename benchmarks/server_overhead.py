"""What one request costs `deploy serve` when the model does next to nothing.

Triton documents its own overhead this way (a trivial model, server and queue time per request);
benchmarks/server.py measures the server against in-process ONNX Runtime on real models, where a
14 ms CNN hides the fixed costs this isolates. Two ONNX models that only average their input,
one taking the ImageNet CNN's 1x3x224x224 float request (600 KB) and one a 1x4 float (16 bytes),
and one that answers its 600 KB request back (``echo-600kb``, a ReLU: a segmentation model or an
encoder's hidden states answer as much as they are sent), served as the CNN is
(``max_batch_size: 8``), driven by Triton's perf_analyzer at concurrency 1 over gRPC and HTTP
(binary tensors). Per row: p50/p99 and throughput, the server's CPU time per
request, and the server's own stage times (means from its ``/metrics``: decode, queue, the runtime
call including the hand-off to a worker thread and back, encode). Beside each row, the same
requests against a stand-in that replays the server's answers without doing any work
(``floor``: benchmarks/floor_server.py): the client, the loopback and the least a Python server
must do to receive the bytes, which no server avoids; the ``over floor`` column is what
``deploy serve`` itself adds to p50. Rows marked ``shm`` pass the tensors through system shared
memory (perf_analyzer's ``--shared-memory system``): the request names a region instead of carrying
the bytes (no floor: the stand-in has no shared memory). ``--blocks`` interleaves the repeats so their spread shows
the noise. At concurrency 1 it checks issue 44's 2-core targets (server CPU per 600 KB request in
one process: <= 0.15 ms with shared memory, <= 0.6 ms over gRPC, <= 0.5 ms over HTTP), each against
its worst block. Needs the serve and bench extras and perf_analyzer
(benchmarks/perf_analyzer.py says what it needs when it cannot run).

    python benchmarks/server_overhead.py [--blocks N] [--seconds S] [--json] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import perf_analyzer
from floor_server import GrpcFloor, HttpFloor
from onnx import TensorProto, helper
from process_cpu import server_cpu_seconds
from report import print_result
from server import console
from server_stages import stage_means_ms, stage_sums

import unideploy

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from serving import start_server, stop_server

REQUESTS = {"noop-600kb": [3, 224, 224], "noop-16b": [4], "echo-600kb": [3, 224, 224]}  # per-row shape after the batch
ECHOES = {"echo-600kb"}  # models answering their request back; the others answer its mean (4 bytes)


def averaging_model(dims: list[int], dest: Path) -> None:
    """A package whose graph is one ReduceMean over every axis but the batch."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", *dims])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])
    axes = helper.make_tensor("axes", TensorProto.INT64, [len(dims)], list(range(1, len(dims) + 1)))
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=0)], "average", [x], [y], [axes]
    )
    _package(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), dims, dest)


def echo_model(dims: list[int], dest: Path) -> None:
    """A package whose graph is one ReLU: it answers as many bytes as it is sent."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", *dims])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", *dims])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "echo", [x], [y])
    _package(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), dims, dest)


def _package(model: onnx.ModelProto, dims: list[int], dest: Path) -> None:
    model.ir_version = 8
    source = dest.parent / f"{dest.name}.onnx"
    onnx.save(model, source)
    unideploy.export(source, dest / "1", example_inputs={"x": np.zeros((1, *dims), np.float32)}).close()
    (dest / "model.yaml").write_text("max_batch_size: 8\n")


def shared_memory(model: str) -> tuple[str, ...]:
    """perf_analyzer's flags passing ``model``'s tensors through system shared memory (the request
    carries region names, not bytes), each output's region as large as its answer."""
    answer = 4 * int(np.prod(REQUESTS[model])) if model in ECHOES else 64
    return ("--shared-memory", "system", "--output-shared-memory-size", str(answer))


def measure(
    tool, server, model: str, protocol: str, seconds: float, work: Path, shared: bool = False, concurrency: int = 1
) -> dict:
    """One perf_analyzer window, with the server's CPU per request: all of it, and the share of its
    front-end processes (``--frontends``) and of the model process (the rest), and the implied
    ceiling of each (requests/s one core of it can answer)."""
    url = server.grpc if protocol == "grpc" else server.http.removeprefix("http://")
    before, cpu_before = stage_sums(server.http, model), server_cpu_seconds(server.process.pid)
    extra = shared_memory(model) if shared else ()
    row = perf_analyzer.measure(tool, url, protocol, model, concurrency, seconds, {}, work, extra=extra)
    after, cpu_after = stage_sums(server.http, model), server_cpu_seconds(server.process.pid)
    requests, means = stage_means_ms(before, after)  # every answered request, warm-up windows included
    stages = {f"{stage}_ms": ms for stage, ms in means.items()}
    model_ms, frontends_ms = ((a - b) / requests * 1000 for a, b in zip(cpu_after, cpu_before, strict=True))
    return {
        **row,
        "server_cpu_ms_per_request": round(model_ms + frontends_ms, 3),
        "frontends_cpu_ms": round(frontends_ms, 3),
        "model_process_cpu_ms": round(model_ms, 3),
        "model_process_ceiling_per_s": round(1000 / model_ms) if model_ms else "",
        "per_frontend_core_ceiling_per_s": round(1000 / frontends_ms) if frontends_ms else "",
        **stages,
    }


# Issue 44's 2-core targets: server CPU per 600 KB request at concurrency 1, one process (no front ends)
TARGETS_MS = {"shm": 0.15, "grpc": 0.6, "http": 0.5}


def targets(rows: list[dict]) -> list[tuple[str, bool, str]]:
    """Each target against the worst of its rows (every block; shared memory: the better protocol
    of each block), as (name, met, measured)."""
    fe0 = [r for r in rows if " noop-600kb " in r["row"] and " fe0" in r["row"]]
    found = []
    for what, limit in TARGETS_MS.items():
        if what == "shm":
            blocks = {r["row"].split()[0] for r in fe0}
            shm = [r for r in fe0 if r["row"].endswith(" shm")]
            measured = [min(r["server_cpu_ms_per_request"] for r in shm if r["row"].split()[0] == b) for b in blocks]
            name = "shared memory (the better protocol)"
        else:
            measured = [
                r["server_cpu_ms_per_request"] for r in fe0 if f" {what} " in r["row"] and "shm" not in r["row"]
            ]
            name = {"http": "HTTP", "grpc": "gRPC"}[what]
        if measured:
            worst = max(measured)
            found.append(
                (f"server CPU per 600 KB request, {name}, one process, <= {limit} ms", worst <= limit, f"{worst} ms")
            )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=2, help="repeat every measurement, interleaved")
    parser.add_argument("--seconds", type=float, default=3.0, help="perf_analyzer's measurement window")
    parser.add_argument(
        "--frontends", default="0,1", help="comma-separated --frontends counts, a server each, measured side by side"
    )
    parser.add_argument("--concurrency", type=int, default=1, help="perf_analyzer's concurrency")
    parser.add_argument("--models", default=",".join(REQUESTS), help=f"comma-separated, of: {', '.join(REQUESTS)}")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    tool = perf_analyzer.ensure()
    if isinstance(tool, str):
        sys.exit(f"server_overhead: {tool}")
    work = Path(tempfile.mkdtemp(prefix="unideploy-overhead-"))
    repo = work / "repo"
    models = args.models.split(",")
    for model in models:
        (repo / model).mkdir(parents=True)
        (echo_model if model in ECHOES else averaging_model)(REQUESTS[model], repo / model)
    servers = {
        count: start_server(repo, work, "--frontends", count, env={"MALLOC_ARENA_MAX": "2"})  # as docker/Dockerfile
        for count in args.frontends.split(",")
    }
    first = next(iter(servers.values()))  # whose answers the floors replay
    floors = {"grpc": GrpcFloor(first.grpc), "http": HttpFloor(first.http)}
    rows = []
    c = args.concurrency
    try:
        for block in range(1, args.blocks + 1):
            for model in models:
                for protocol in ("grpc", "http"):
                    floor = perf_analyzer.measure(
                        tool, floors[protocol].address, protocol, model, c, args.seconds, {}, work
                    )
                    for count, server in servers.items():
                        label = f"{block} {model} {protocol} fe{count}"
                        console.log(f"{label}, perf_analyzer concurrency {c}")
                        row = measure(tool, server, model, protocol, args.seconds, work, concurrency=c)
                        over = round(row["p50_ms"] - floor["p50_ms"], 2)
                        rows.append({"row": label, **row, "floor_p50_ms": floor["p50_ms"], "over_floor_ms": over})
                        console.log(f"{label} shm, perf_analyzer concurrency {c}")
                        row = measure(tool, server, model, protocol, args.seconds, work, True, c)
                        rows.append({"row": f"{label} shm", **row, "floor_p50_ms": "", "over_floor_ms": ""})
    finally:
        for floor_server in floors.values():
            floor_server.close()
        for server in servers.values():
            stop_server(server)
    result = {
        "model": f"deploy serve, averaging models, concurrency {c} ({os.cpu_count()} cores shared with the client)",
        "quality": "-",
        "rows": rows,
        "targets": targets(rows) if c == 1 else [],
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_result(result, args.markdown)


if __name__ == "__main__":
    main()
