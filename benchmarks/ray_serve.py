"""What a second Ray Serve replica buys: `deploy serve REPO --ray` with 1 and 2 replicas, one run.

The ResNet-18-shaped CNN of bench_models.py (1x3x224x224, batch 1 requests), each replica
one intra-op thread on one reserved CPU (``threads: 1`` in model.yaml), dynamic batching on as by
default; tritonclient's REST binary client at concurrency 8 from this machine. Blocks alternate 1
and 2 replicas so the spread shows the noise; the ratio is of throughputs in the same block. The
plain `deploy serve` (one process, every core) runs in each block too, for reference. Last, one of
two replicas is killed (SIGKILL) under load: the failed requests and the time until Ray Serve runs
a replacement. Needs the serve, ray, bench and dev extras (`make bench` runs it).

    python benchmarks/ray_serve.py [--seconds S] [--blocks N] [--markdown]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml
from bench_models import imagenet_cnn_torchscript
from rich.console import Console
from server import clients, drive, per_thread

import unideploy

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from serving import Load, kill_a_replica, ray_replicas, start_server, stop_server

console = Console(stderr=True)
CONCURRENCY = 8
SETUPS = {"deploy serve (one process)": (), "ray, 1 replica": ("--ray",), "ray, 2 replicas": ("--ray",)}


def measure(repo: Path, work: Path, setup: str, x: np.ndarray, seconds: float) -> dict:
    replicas = 2 if setup.endswith("2 replicas") else 1
    settings = {"replicas": replicas, "threads": 1} if "ray" in setup else {}
    (repo / "cnn" / "model.yaml").write_text(yaml.safe_dump(settings))
    server = start_server(repo, work, *SETUPS[setup], ready_within=240)
    try:
        if "ray" in setup:
            server.wait_for(lambda: len(ray_replicas("cnn")) == replicas, timeout=120, what=f"{replicas} replicas")
        factory = clients(server, "cnn", {"x": x})["rest-binary"]
        return drive(per_thread(factory, CONCURRENCY), CONCURRENCY, seconds)
    finally:
        stop_server(server)


def kill_one(repo: Path, work: Path, x: np.ndarray) -> dict:
    """Two replicas under a steady client; one is killed; failures and recovery time."""
    (repo / "cnn" / "model.yaml").write_text(yaml.safe_dump({"replicas": 2, "threads": 1}))
    server = start_server(repo, work, "--ray", ready_within=240)
    try:
        server.wait_for(lambda: len(ray_replicas("cnn")) == 2, timeout=120, what="2 replicas")
        load = Load(server, x, model="cnn")
        load.start()
        try:
            return kill_a_replica(server, "cnn", load, settle=30)
        finally:
            load.finish()
    finally:
        stop_server(server)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="per measurement")
    parser.add_argument("--blocks", type=int, default=2, help="repeat every measurement, interleaved")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="unideploy-ray-bench-"))
    try:
        console.log("building the model")
        repo = work / "repo"
        unideploy.export(imagenet_cnn_torchscript(work), repo / "cnn" / "1", input_shapes=["x:1x3x224x224"]).close()
        x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
        rows = []
        for block in range(1, args.blocks + 1):
            for setup in SETUPS:
                console.log(f"block {block}: {setup}, concurrency {CONCURRENCY}")
                rows.append({"block": block, "setup": setup, **measure(repo, work, setup, x, args.seconds)})
        console.log("killing one of two replicas under load")
        killed = kill_one(repo, work, x)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(rows, killed, args.markdown)


def report(rows: list[dict], killed: dict, markdown: bool) -> None:
    lines = ["| block | setup | p50 ms | p99 ms | throughput /s |", "|---:|---|---:|---:|---:|"]
    lines += [f"| {r['block']} | {r['setup']} | {r['p50_ms']} | {r['p99_ms']} | {r['throughput']} |" for r in rows]
    ratios = []
    for block in sorted({r["block"] for r in rows}):
        one, two = (
            next(r["throughput"] for r in rows if r["block"] == block and r["setup"] == s)
            for s in ("ray, 1 replica", "ray, 2 replicas")
        )
        ratios.append(two / one)
    lines += [
        "",
        f"- 2 replicas / 1 replica throughput at concurrency {CONCURRENCY}: "
        + ", ".join(f"{r:.2f}x" for r in ratios)
        + f" (median {statistics.median(ratios):.2f}x)",
        f"- one of two replicas killed under load: {killed['failed']} of {killed['requests']} requests failed; "
        f"a replacement replica was running {killed['recovery_s']} s later",
    ]
    text = "\n".join(lines)
    if markdown:
        print(text)
    else:
        Console().print(text, markup=False)


if __name__ == "__main__":
    main()
