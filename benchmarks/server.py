"""What serving costs: `deploy serve` against in-process ONNX Runtime on the same models, one run.

Models: EfficientNet-Lite0 with its ImageNet weights at 1x3x224x224 (a MobileNet-class CNN; a
real photo is the request) and MiniLM-L6 (batch 1, seq 128), both exported through unideploy
(``--cnn resnet18-shaped``: the random-weight ResNet-18-shaped CNN of the tables before
2026-11-24, compute-bound where the real CNN is not). For each: p50/p99 latency and throughput at concurrency 1 and 8, in process
and over REST binary, REST JSON and gRPC (tritonclient, the clients users run), each with the
share of the cores the model's process and the client used (``with_cpu``), plus the server's
cold start and memory. The server runs under its default policy, the one it replaced and with
lanes (``POLICIES``); under the default policy, Triton's perf_analyzer drives it too (``pa-grpc``,
``pa-http``: benchmarks/perf_analyzer.py), MLServer serves the same ONNX files as a peer
(``mlserver``: benchmarks/mlserver_peer.py), and so does Triton through PyTriton, driven by the same
perf_analyzer (``pytriton``: benchmarks/pytriton_peer.py), each left out with the reason where it
cannot run.
``--blocks`` repeats everything, interleaved, so the spread shows the noise. Needs the bench and
serve extras (`make bench` runs it).

    python benchmarks/server.py [--seconds S] [--blocks N] [--no-peers] [--cnn NAME] [--markdown]
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlserver_peer
import numpy as np
import perf_analyzer
import pytriton_peer
import yaml
from bench_models import imagenet_cnn_torchscript, minilm_torchscript
from process_cpu import cpu_seconds
from rich.console import Console

import unideploy
from unideploy.runtimes.base import usable_cores

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from serving import free_port, start_server, stop_server

console = Console(stderr=True)
CONCURRENCY = (1, 8)
IDLE_WAIT_S = 3.0  # the server gives memory back after a quiet second (unideploy/server/memory.py)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def with_cpu(model_pid: int | None, measure: Callable[..., dict[str, float]], *args: Any) -> dict[str, float]:
    """``measure``'s row with the CPU used while it ran, in % of the machine's cores: by the process
    running the model (the server; ``None``: this one, in process) and by the client (this process
    and the children it waited for, perf_analyzer; in process there is no separate client). Client
    and server share these cores, while the in-process baseline has them to itself."""

    def own() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    server_before = cpu_seconds(model_pid) if model_pid else 0.0
    own_before, began = own(), time.perf_counter()
    row = measure(*args)
    share = 100 / ((time.perf_counter() - began) * (os.cpu_count() or 1))
    client = (own() - own_before) * share
    if model_pid is None:
        return {**row, "model_cpu_pct": round(client), "client_cpu_pct": float("nan")}
    return {
        **row,
        "model_cpu_pct": round((cpu_seconds(model_pid) - server_before) * share),
        "client_cpu_pct": round(client),
    }


def drive(call: Callable[[], Any], concurrency: int, seconds: float, max_calls: int = 5000) -> dict[str, float]:
    """Latency percentiles and throughput of ``call`` from ``concurrency`` threads (bounded)."""
    latencies: list[float] = []
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds

    def worker() -> None:
        call()  # warm-up (connection, first allocation)
        while True:  # at least one measured call each, even when the warm-up outlasted the window
            start = time.perf_counter()
            call()
            with lock:
                latencies.append(time.perf_counter() - start)
            if time.perf_counter() >= deadline or len(latencies) >= max_calls:
                return

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    ms = np.array(latencies) * 1000
    return {
        "p50_ms": round(float(np.percentile(ms, 50)), 2),
        "p99_ms": round(float(np.percentile(ms, 99)), 2),
        "throughput": round(len(latencies) / elapsed, 1),
        "calls": len(latencies),
    }


def clients(server, model: str, inputs: dict[str, np.ndarray]) -> dict[str, Callable[[], Callable[[], Any]]]:
    """Per protocol, a factory of per-thread callables (each thread gets its own client)."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import np_to_triton_dtype

    def http(binary: bool) -> Callable[[], Callable[[], Any]]:
        def make() -> Callable[[], Any]:
            client = httpclient.InferenceServerClient(server.http.removeprefix("http://"))
            tensors = []
            for name, array in inputs.items():
                t = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
                t.set_data_from_numpy(array, binary_data=binary)
                tensors.append(t)
            outputs = [httpclient.InferRequestedOutput("output", binary_data=binary)]
            return lambda: client.infer(model, tensors, outputs=outputs).as_numpy("output")

        return make

    def grpc() -> Callable[[], Any]:
        client = grpcclient.InferenceServerClient(server.grpc)
        tensors = []
        for name, array in inputs.items():
            t = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            t.set_data_from_numpy(array)
            tensors.append(t)
        return lambda: client.infer(model, tensors).as_numpy("output")

    return {"rest-binary": http(True), "rest-json": http(False), "grpc": grpc}


def in_process_rss(packages: list[Path]) -> float:
    """RSS of a fresh process that loads the same models in ONNX Runtime and runs each once."""
    code = (
        "import sys, unideploy\n"
        "from unideploy.runtimes.selection import open_runtime\n"
        "engines = []\n"
        "for p in sys.argv[1:]:\n"
        "    pkg = unideploy.open_package(p); _, e = open_runtime(pkg); e.run(pkg.reference_samples()[0].inputs)\n"
        "    engines.append((pkg, e))\n"
        "print([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1])\n"
    )
    out = subprocess.run([sys.executable, "-c", code, *map(str, packages)], capture_output=True, text=True, check=True)
    return int(out.stdout.strip()) / 1024


# Server configurations compared in the same run (model.yaml settings): the default, the policy it
# replaced (no spinning at all, requests waiting up to 2 ms for others to join them), and lanes
# (one one-thread session per core for requests that queue, instead of merging them).
DEFAULT_POLICY = "default"
POLICIES = {
    DEFAULT_POLICY: {},
    "no-spin+2ms": {"spin": "never", "max_queue_delay_ms": 2},
    "lanes": {"lanes": usable_cores()},
}


def per_thread(factory: Callable[[], Callable[[], Any]], count: int) -> Callable[[], Any]:
    """A callable that gives each calling thread a client of its own."""
    callables = iter([factory() for _ in range(count)])
    local = threading.local()

    def call() -> Any:
        if not hasattr(local, "fn"):
            local.fn = next(callables)
        return local.fn()

    return call


def in_process_rows(repo: Path, model: str, inputs: dict[str, np.ndarray], block: int, seconds: float) -> list[dict]:
    from unideploy.runtimes.selection import open_runtime

    rows = []
    with unideploy.open_package(repo / model / "1") as pkg:
        _, engine = open_runtime(pkg)  # in-process default: threads spin, as a lone caller's should
        for c in CONCURRENCY:
            console.log(f"block {block}: {model}, in-process, concurrency {c}")
            rows.append(
                {
                    "block": block,
                    "server": "",
                    "model": model,
                    "path": "in-process",
                    "concurrency": c,
                    **with_cpu(None, drive, lambda: engine.run(inputs), c, seconds),
                }
            )
        engine.close()
    return rows


def efficientnet_lite0(work: Path, dest: Path) -> np.ndarray:
    """The real MobileNet-class CNN (weights from the zoo's packages); returns a photo as its request."""
    from zoo_models import efficientnet_lite0 as traced
    from zoo_models import imagenet_photos

    unideploy.export(traced(work), dest, input_shapes=["x:1x3x224x224"]).close()
    return imagenet_photos(1)


def resnet18_shaped(work: Path, dest: Path) -> np.ndarray:
    unideploy.export(imagenet_cnn_torchscript(work), dest, input_shapes=["x:1x3x224x224"]).close()
    return np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)


CNNS: dict[str, Callable[[Path, Path], np.ndarray]] = {
    "efficientnet-lite0": efficientnet_lite0,
    "resnet18-shaped": resnet18_shaped,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="per measurement")
    parser.add_argument("--blocks", type=int, default=1, help="repeat every measurement, interleaved")
    parser.add_argument("--no-peers", action="store_true", help="leave out perf_analyzer, MLServer and PyTriton")
    parser.add_argument("--cnn", choices=CNNS, default="efficientnet-lite0", help="the ImageNet CNN served")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="unideploy-serve-bench-"))
    left_out: list[str] = []
    analyzer = perf_analyzer.ensure() if not args.no_peers else "--no-peers"
    if isinstance(analyzer, str):
        left_out.append(f"perf_analyzer: {analyzer}")
    mlserver = mlserver_peer.ensure() if not args.no_peers else "--no-peers"
    if isinstance(mlserver, str):
        left_out.append(f"MLServer: {mlserver}")
    pytriton = pytriton_peer.ensure() if not args.no_peers else "--no-peers"
    if isinstance(pytriton, str):
        left_out.append(f"Triton (PyTriton): {pytriton}")
    try:
        console.log("building the models")
        repo = work / "repo"
        cnn_input = CNNS[args.cnn](work, repo / "cnn" / "1")
        minilm_pt, arrays = minilm_torchscript(work, count=8)
        unideploy.export(minilm_pt, repo / "minilm" / "1", example_inputs={k: v[:2] for k, v in arrays.items()}).close()
        inputs = {
            "cnn": {"x": cnn_input},
            "minilm": {k: np.ascontiguousarray(v[:1]) for k, v in arrays.items()},
        }
        cold_start = server_rss = peak_rss = idle_rss = float("nan")
        rows: list[dict] = []
        for block in range(1, args.blocks + 1):  # the spread between blocks is the machine's noise
            for model in ("cnn", "minilm"):
                rows += in_process_rows(repo, model, inputs[model], block, args.seconds)
            for policy, settings in POLICIES.items():
                for model in ("cnn", "minilm"):
                    (repo / model / "model.yaml").write_text(yaml.safe_dump({"max_batch_size": 8, **settings}))
                first = policy == DEFAULT_POLICY and block == 1
                started = time.perf_counter()
                server = start_server(repo, work, env={"MALLOC_ARENA_MAX": "2"})  # as docker/Dockerfile sets it
                try:
                    cold_start = time.perf_counter() - started if first else cold_start
                    for model in ("cnn", "minilm"):
                        for name, factory in clients(server, model, inputs[model]).items():
                            if first and name == "rest-json" and model == "cnn":
                                # steady-state memory, before 150k-float JSON bodies leave their high-water mark
                                server_rss = rss_mb(server.process.pid)
                            for c in CONCURRENCY:
                                console.log(f"block {block}, {policy}: {model}, {name}, concurrency {c}")
                                rows.append(
                                    {
                                        "block": block,
                                        "server": policy,
                                        "model": model,
                                        "path": name,
                                        "concurrency": c,
                                        **with_cpu(
                                            server.process.pid,
                                            drive,
                                            per_thread(factory, c),
                                            c,
                                            args.seconds,
                                        ),
                                    }
                                )
                    peak_rss = rss_mb(server.process.pid) if first else peak_rss
                    if first:  # once traffic stops the server gives back what the bursts grew
                        time.sleep(IDLE_WAIT_S)
                        idle_rss = rss_mb(server.process.pid)
                    if policy == DEFAULT_POLICY and not isinstance(analyzer, str):
                        rows += perf_analyzer_rows(analyzer, server, inputs, block, args.seconds, work)
                finally:
                    stop_server(server)
            if not isinstance(mlserver, str):
                rows += mlserver_rows(mlserver, repo, inputs, block, args.seconds, work)
            if not isinstance(pytriton, str) and not isinstance(analyzer, str):
                try:
                    rows += pytriton_rows(analyzer, pytriton, repo, inputs, block, args.seconds, work)
                except RuntimeError as exc:  # a peer that fails leaves its rows out, not the others'
                    left_out.append(f"Triton (PyTriton), block {block}: {' '.join(str(exc).split())[-300:]}")
        baseline_rss = in_process_rss([repo / "cnn" / "1", repo / "minilm" / "1"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(rows, cold_start, (server_rss, peak_rss, idle_rss), baseline_rss, args.markdown, left_out)


def perf_analyzer_rows(
    tool: tuple[Path, dict[str, str]],
    server,
    inputs: dict[str, dict[str, np.ndarray]],
    block: int,
    seconds: float,
    work: Path,
    label: str = DEFAULT_POLICY,
) -> list[dict]:
    """perf_analyzer against a running server (ours, or a peer's, named by ``label``): both
    models, both protocols, both concurrencies."""
    rows = []
    for model, arrays in inputs.items():
        shapes = {} if model == "cnn" else {name: list(a.shape[1:]) for name, a in arrays.items()}  # seq is dynamic
        for protocol, url in (("grpc", server.grpc), ("http", server.http.removeprefix("http://"))):
            for c in CONCURRENCY:
                console.log(f"block {block}: {label}, {model}, perf_analyzer {protocol}, concurrency {c}")
                measured = with_cpu(
                    server.process.pid, perf_analyzer.measure, tool, url, protocol, model, c, seconds, shapes, work
                )
                rows.append(
                    {
                        "block": block,
                        "server": label,
                        "model": model,
                        "path": f"pa-{protocol}",
                        "concurrency": c,
                        **measured,
                    }
                )
    return rows


def pytriton_rows(
    analyzer: tuple[Path, dict[str, str]],
    peer: tuple[Path, dict[str, str]],
    repo: Path,
    inputs: dict[str, dict[str, np.ndarray]],
    block: int,
    seconds: float,
    work: Path,
) -> list[dict]:
    """Triton (PyTriton) on the same ONNX files and batch limit, driven by the same perf_analyzer.
    Its "model process" CPU is the Python process running the callable (tritonserver is its child)."""
    from serving import RunningServer

    ports = (free_port(), free_port(), free_port())
    models = {m: repo / m / "1" / "artifacts" / "model.onnx" for m in inputs}
    process = pytriton_peer.start(peer, models, work, ports, max_batch_size=8)
    triton = RunningServer(
        repo, f"http://127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[1]}", process, work / "pytriton.log"
    )
    try:
        return perf_analyzer_rows(analyzer, triton, inputs, block, seconds, work, "pytriton")
    finally:
        pytriton_peer.stop(process)


def mlserver_rows(
    command: Path, repo: Path, inputs: dict[str, dict[str, np.ndarray]], block: int, seconds: float, work: Path
) -> list[dict]:
    """MLServer on the same ONNX files, through the same tritonclient clients (JSON over REST)."""
    from serving import RunningServer

    http_port, grpc_port = free_port(), free_port()
    models = {m: repo / m / "1" / "artifacts" / "model.onnx" for m in inputs}
    process = mlserver_peer.start(command, models, work, http_port, grpc_port)
    peer = RunningServer(
        repo, f"http://127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", process, work / "mlserver.log"
    )
    rows = []
    try:
        for model, arrays in inputs.items():
            paths = clients(peer, model, arrays)
            for name in ("rest-json", "grpc"):
                for c in CONCURRENCY:
                    console.log(f"block {block}: {model}, MLServer {name}, concurrency {c}")
                    rows.append(
                        {
                            "block": block,
                            "server": "mlserver",
                            "model": model,
                            "path": name,
                            "concurrency": c,
                            **with_cpu(process.pid, drive, per_thread(paths[name], c), c, seconds),
                        }
                    )
    finally:
        process.terminate()
        process.wait(timeout=60)
    return rows


def report(
    rows: list[dict],
    cold_start: float,
    server_rss: tuple[float, float, float],  # under load, after the REST JSON runs, once idle
    baseline_rss: float,
    markdown: bool,
    left_out: list[str],
) -> None:
    def find(model: str, path: str, c: int, block: int, server: str = "") -> dict:
        return next(
            r
            for r in rows
            if (r["model"], r["path"], r["concurrency"], r["block"], r["server"]) == (model, path, c, block, server)
        )

    def has(model: str, path: str, c: int, block: int, server: str) -> bool:
        return any(
            (r["model"], r["path"], r["concurrency"], r["block"], r["server"]) == (model, path, c, block, server)
            for r in rows
        )

    lines = [
        "| block | server | model | path | concurrency | p50 ms | p99 ms | throughput /s | p50 vs in-process "
        "| CPU % model process | CPU % client | perf_analyzer's server / rest us |",
        "|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        base = find(r["model"], "in-process", r["concurrency"], r["block"])["p50_ms"]
        client = "-" if math.isnan(r["client_cpu_pct"]) else r["client_cpu_pct"]  # in process: no separate client
        lines.append(
            f"| {r['block']} | {r['server'] or '-'} | {r['model']} | {r['path']} | {r['concurrency']} | "
            f"{r['p50_ms']} | {r['p99_ms']} | {r['throughput']} | {r['p50_ms'] / base:.2f}x | "
            f"{r['model_cpu_pct']} | {client} | {perf_analyzer.server_split(r) or '-'} |"
        )
    results = []
    for block in sorted({r["block"] for r in rows}):
        single = find("cnn", "in-process", 1, block)
        for path, label in (("grpc", "gRPC"), ("rest-binary", "REST binary")):
            ratio = find("cnn", path, 1, block, DEFAULT_POLICY)["p50_ms"] / single["p50_ms"]
            results.append(
                (
                    f"block {block}: {label} p50 within 1.15x of in-process (CNN, concurrency 1)",
                    ratio <= 1.15,
                    f"{ratio:.3f}x",
                )
            )
        for model, limit in (("cnn", 1.15), ("minilm", 1.05)):
            single = find(model, "in-process", 1, block)
            for path in ("pa-grpc", "pa-http"):
                if has(model, path, 1, block, DEFAULT_POLICY):
                    ratio = find(model, path, 1, block, DEFAULT_POLICY)["p50_ms"] / single["p50_ms"]
                    results.append(
                        (
                            f"block {block}: perf_analyzer {path[3:]} p50 within {limit}x of in-process "
                            f"({model}, concurrency 1)",
                            ratio <= limit,
                            f"{ratio:.3f}x",
                        )
                    )
            for path in ("pa-grpc", "pa-http"):
                for c in CONCURRENCY:
                    if has(model, path, c, block, "pytriton") and has(model, path, c, block, DEFAULT_POLICY):
                        ours, theirs = (find(model, path, c, block, s) for s in (DEFAULT_POLICY, "pytriton"))
                        results.append(
                            (
                                f"block {block}: ahead of Triton (PyTriton), perf_analyzer {path[3:]} ({model}, "
                                f"concurrency {c}: p50 no higher, throughput no lower)",
                                ours["p50_ms"] <= theirs["p50_ms"] and ours["throughput"] >= theirs["throughput"],
                                f"{ours['p50_ms']} vs {theirs['p50_ms']} ms, {ours['throughput']} vs "
                                f"{theirs['throughput']} /s",
                            )
                        )
            if has(model, "rest-json", 1, block, "mlserver"):
                ours, theirs = (find(model, "rest-json", 1, block, s)["p50_ms"] for s in (DEFAULT_POLICY, "mlserver"))
                results.append(
                    (
                        f"block {block}: REST JSON p50 no slower than MLServer's ({model}, concurrency 1)",
                        ours <= theirs,
                        f"{ours} vs {theirs} ms",
                    )
                )
        for model in ("cnn", "minilm"):
            single = find(model, "in-process", 1, block)
            # the server as model.yaml can set it up: any of its policies (batching on, off, lanes)
            candidates = [
                find(model, p, 8, block, policy)
                for policy in POLICIES
                for p in ("rest-binary", "grpc", "pa-grpc", "pa-http")
                if has(model, p, 8, block, policy)
            ]
            best = max(candidates, key=lambda r: r["throughput"])
            results.append(
                (
                    f"block {block}: throughput at concurrency 8 >= in-process single-stream ({model})",
                    best["throughput"] >= single["throughput"],
                    f"{best['throughput']} vs {single['throughput']} /s ({best['server']}, {best['path']}; its "
                    f"client took {best['client_cpu_pct']} % of the cores)",
                )
            )
    results.append(("cold start to ready < 2 s", cold_start < 2.0, f"{cold_start:.2f} s"))
    loaded, peak, idle = server_rss
    results.append(
        (
            "server RSS < in-process RSS + 100 MB, under load",
            loaded < baseline_rss + 100,
            f"{loaded:.0f} MB vs {baseline_rss:.0f} MB in process; {peak:.0f} MB after the REST JSON runs",
        )
    )
    results.append(
        (
            f"server RSS < in-process RSS + 100 MB, {IDLE_WAIT_S:.0f} s after the last request",
            idle < baseline_rss + 100,
            f"{idle:.0f} MB vs {baseline_rss:.0f} MB in process",
        )
    )
    text = (
        "\n".join(lines)
        + "\n\n"
        + "\n".join(f"- {'met' if ok else 'MISSED'}: {n} (measured {v})" for n, ok, v in results)
        + "".join(f"\n- left out: {why}" for why in left_out)
    )
    if markdown:
        print(text)
    else:
        Console().print(text)


if __name__ == "__main__":
    main()
