"""From an S3 upload to the new version serving: `deploy serve s3://...` against a local S3 store.

moto's S3 server runs on 127.0.0.1; the digits CNN package (exported here, on scikit-learn's
digits) is uploaded as version 1, the server started, then versions 2, 3, ... are uploaded, each
as a directory (object by object) or as one .zip, while one client polls for the new version. The
time is from the end of the upload to the first response from the new version; it is bounded
below by nothing and above by the poll interval plus download, verification, load and warm-up.
Needs the serve, remote and dev extras.

    python benchmarks/remote_repository.py [--rounds N] [--poll-interval S] [--markdown]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_models import digits_torchscript
from rich.console import Console

import unideploy

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from serving import free_port, start_server, stop_server

console = Console(stderr=True)


def digits_package(work: Path) -> tuple[Path, np.ndarray]:
    x_train, _, x_test, _ = digits_torchscript(work)  # a CNN trained on scikit-learn's real digits
    unideploy.export(work / "digits.pt", work / "digits.udp", example_inputs={"x": x_train[:8]}).close()
    return work / "digits.udp", x_test[:2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="uploads of each kind")
    parser.add_argument("--poll-interval", type=float, default=2.0, help="the server's --poll-interval")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()

    import fsspec
    from moto.server import ThreadedMotoServer

    port = free_port()
    s3 = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    s3.start()
    env = {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
    }
    fs = fsspec.filesystem("s3", key="bench", secret="bench", endpoint_url=env["AWS_ENDPOINT_URL"])
    fs.mkdir("bench")
    work = Path(tempfile.mkdtemp(prefix="unideploy-remote-bench-"))
    server = None
    try:
        package, x = digits_package(work)
        archive = Path(shutil.make_archive(str(work / "digits"), "zip", package))
        fs.put(str(package), "bench/repo/digits/1", recursive=True)
        server = start_server("s3://bench/repo", work, "--poll-interval", str(args.poll_interval), env=env)
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]}
        times: dict[str, list[float]] = {"directory": [], "zip": []}
        version = 1
        with server.client() as http:
            for _ in range(args.rounds):
                for kind in times:
                    version += 1
                    if kind == "zip":
                        fs.put_file(str(archive), f"bench/repo/digits/{version}.zip")
                    else:
                        fs.put(str(package), f"bench/repo/digits/{version}", recursive=True)
                    uploaded = time.perf_counter()
                    server.wait_for(
                        lambda v=str(version): (
                            http.post("/v2/models/digits/infer", json=body).json().get("model_version") == v
                        ),
                        timeout=120,
                        what=f"version {version}",
                    )
                    times[kind].append(time.perf_counter() - uploaded)
                    console.log(f"{kind} version {version}: serving {times[kind][-1]:.2f} s after its upload")
    finally:
        if server is not None:
            stop_server(server)
        s3.stop()
        shutil.rmtree(work, ignore_errors=True)
    rows = [(kind, statistics.median(t), min(t), max(t)) for kind, t in times.items()]
    if args.markdown:
        print(f"| upload (poll interval {args.poll_interval:g} s) | median s | min s | max s |\n|---|---:|---:|---:|")
        for kind, median, low, high in rows:
            print(f"| {kind} | {median:.2f} | {low:.2f} | {high:.2f} |")
    else:
        for kind, median, low, high in rows:
            print(f"{kind}: median {median:.2f} s (min {low:.2f}, max {high:.2f})")


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
