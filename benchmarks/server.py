"""What serving costs: `deploy serve` against in-process ONNX Runtime on the same models, one run.

Models: a ResNet-18-shaped CNN at 1x3x224x224 and MiniLM-L6 (batch 1, seq 128), both exported
through unideploy. For each: p50/p99 latency and throughput at concurrency 1 and 8, in process
and over REST binary, REST JSON and gRPC (tritonclient, the clients users run), plus the server's
cold start and memory. Needs the bench and serve extras (`make bench` runs it).

    python benchmarks/server.py [--seconds S] [--markdown]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import yaml
from rich.console import Console

import unideploy
from models import imagenet_cnn_torchscript, minilm_torchscript

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from serving import start_server, stop_server  # noqa: E402

console = Console(stderr=True)
CONCURRENCY = (1, 8)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def drive(call: Callable[[], Any], concurrency: int, seconds: float, max_calls: int = 5000) -> dict[str, float]:
    """Latency percentiles and throughput of ``call`` from ``concurrency`` threads (bounded)."""
    latencies: list[float] = []
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds

    def worker() -> None:
        call()  # warm-up (connection, first allocation)
        while time.perf_counter() < deadline and len(latencies) < max_calls:
            start = time.perf_counter()
            call()
            with lock:
                latencies.append(time.perf_counter() - start)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    ms = np.array(latencies) * 1000
    return {"p50_ms": round(float(np.percentile(ms, 50)), 2), "p99_ms": round(float(np.percentile(ms, 99)), 2),
            "throughput": round(len(latencies) / elapsed, 1), "calls": len(latencies)}


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
    code = ("import sys, unideploy\n"
            "from unideploy.runtimes.selection import open_runtime\n"
            "engines = []\n"
            "for p in sys.argv[1:]:\n"
            "    pkg = unideploy.open_package(p); _, e = open_runtime(pkg); e.run(pkg.reference_samples()[0].inputs)\n"
            "    engines.append((pkg, e))\n"
            "print([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1])\n")
    out = subprocess.run([sys.executable, "-c", code, *map(str, packages)], capture_output=True, text=True, check=True)
    return int(out.stdout.strip()) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="per measurement")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="unideploy-serve-bench-"))
    try:
        console.log("building the models")
        repo = work / "repo"
        cnn_pt = imagenet_cnn_torchscript(work)
        unideploy.export(cnn_pt, repo / "cnn" / "1", input_shapes=["x:1x3x224x224"]).close()
        minilm_pt, arrays = minilm_torchscript(work, count=8)
        unideploy.export(minilm_pt, repo / "minilm" / "1", example_inputs={k: v[:2] for k, v in arrays.items()}).close()
        for model in ("cnn", "minilm"):
            (repo / model / "model.yaml").write_text(yaml.safe_dump({"max_batch_size": 8, "max_queue_delay_ms": 2}))
        inputs = {"cnn": {"x": np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)},
                  "minilm": {k: np.ascontiguousarray(v[:1]) for k, v in arrays.items()}}

        started = time.perf_counter()
        server = start_server(repo, work, env={"MALLOC_ARENA_MAX": "2"})  # as docker/Dockerfile sets it
        cold_start = time.perf_counter() - started
        rows = []
        try:
            for model in ("cnn", "minilm"):
                with unideploy.open_package(repo / model / "1") as pkg:
                    from unideploy.runtimes.selection import open_runtime

                    _, engine = open_runtime(pkg)
                    for c in CONCURRENCY:
                        console.log(f"{model}: in-process, concurrency {c}")
                        rows.append({"model": model, "path": "in-process", "concurrency": c,
                                     **drive(lambda e=engine, x=inputs[model]: e.run(x), c, args.seconds)})
                    engine.close()
                for name, factory in clients(server, model, inputs[model]).items():
                    if name == "rest-json" and model == "cnn":
                        # steady-state memory, before 150k-float JSON bodies leave their high-water mark
                        server_rss = rss_mb(server.process.pid)
                    for c in CONCURRENCY:
                        console.log(f"{model}: {name}, concurrency {c}")
                        callables = iter([factory() for _ in range(c)])
                        per_thread = threading.local()

                        def call(callables=callables, per_thread=per_thread):
                            if not hasattr(per_thread, "fn"):
                                per_thread.fn = next(callables)
                            return per_thread.fn()

                        rows.append({"model": model, "path": name, "concurrency": c, **drive(call, c, args.seconds)})
            peak_rss = rss_mb(server.process.pid)
        finally:
            stop_server(server)
        baseline_rss = in_process_rss([repo / "cnn" / "1", repo / "minilm" / "1"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(rows, cold_start, server_rss, peak_rss, baseline_rss, args.markdown)


def report(rows: list[dict], cold_start: float, server_rss: float, peak_rss: float, baseline_rss: float,
           markdown: bool) -> None:
    def find(model: str, path: str, c: int) -> dict:
        return next(r for r in rows if r["model"] == model and r["path"] == path and r["concurrency"] == c)

    lines = ["| model | path | concurrency | p50 ms | p99 ms | throughput /s | p50 vs in-process |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        base = find(r["model"], "in-process", r["concurrency"])["p50_ms"]
        lines.append(f"| {r['model']} | {r['path']} | {r['concurrency']} | {r['p50_ms']} | {r['p99_ms']} | "
                     f"{r['throughput']} | {r['p50_ms'] / base:.2f}x |")
    single = find("cnn", "in-process", 1)
    targets = [
        ("gRPC p50 within 1.15x of in-process (CNN, concurrency 1)", find("cnn", "grpc", 1)["p50_ms"] / single["p50_ms"]),
        ("REST binary p50 within 1.15x of in-process (CNN, concurrency 1)",
         find("cnn", "rest-binary", 1)["p50_ms"] / single["p50_ms"]),
    ]
    results = [(name, ratio <= 1.15, f"{ratio:.3f}x") for name, ratio in targets]
    best8 = max(find("cnn", p, 8)["throughput"] for p in ("rest-binary", "grpc"))
    results.append(("throughput at concurrency 8 >= in-process single-stream (CNN)", best8 >= single["throughput"],
                    f"{best8} vs {single['throughput']} /s"))
    results.append(("cold start to ready < 2 s", cold_start < 2.0, f"{cold_start:.2f} s"))
    results.append(("server RSS < in-process RSS + 100 MB", server_rss < baseline_rss + 100,
                    f"{server_rss:.0f} MB vs {baseline_rss:.0f} MB in process; {peak_rss:.0f} MB after the "
                    "REST JSON runs"))
    text = "\n".join(lines) + "\n\n" + "\n".join(f"- {'met' if ok else 'MISSED'}: {n} (measured {v})" for n, ok, v in results)
    if markdown:
        print(text)
    else:
        Console().print(text)


if __name__ == "__main__":
    main()
