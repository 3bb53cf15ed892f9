"""Triton's perf_analyzer as the load generator for `deploy serve` (benchmarks/server.py).

perf_analyzer is the C++ client Triton's own numbers come from; it drives any server that speaks
the Open Inference Protocol and answers Triton's model-config request, as `deploy serve` does.
Its binary ships inside the tritonclient 2.49.0 manylinux wheel (later wheels need a newer glibc);
it links libcudart.so.12 (from the nvidia-cuda-runtime-cu12 wheel, no GPU needed) and Debian's
libb64 (`apt-get install libb64-0d`). `ensure` fetches both wheels with pip into a cache folder and
unpacks the two files; where that cannot happen it says why, and the benchmark leaves the rows out.
"""

from __future__ import annotations

import csv
import ctypes
import os
import subprocess
import sys
import zipfile
from pathlib import Path

TRITONCLIENT = "tritonclient==2.49.0"
CUDART = "nvidia-cuda-runtime-cu12"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "unideploy" / "perf_analyzer"


def ensure(cache: Path = CACHE) -> tuple[Path, dict[str, str]] | str:
    """The perf_analyzer binary and the environment it runs in, or why it cannot run here."""
    binary, libs = cache / "perf_analyzer", cache / "lib"
    if not binary.exists() or not (libs / "libcudart.so.12").exists():
        cache.mkdir(parents=True, exist_ok=True)
        fetched = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(cache), TRITONCLIENT, CUDART],
            capture_output=True,
            text=True,
        )
        if fetched.returncode != 0:
            return f"pip could not download {TRITONCLIENT} and {CUDART}: {fetched.stderr.strip()[-300:]}"
        libs.mkdir(exist_ok=True)
        for wheel in cache.glob("*.whl"):
            with zipfile.ZipFile(wheel) as zf:
                for name in zf.namelist():
                    if name.endswith("/bin/perf_analyzer"):
                        binary.write_bytes(zf.read(name))
                        binary.chmod(0o755)
                    elif name.endswith("/libcudart.so.12"):
                        (libs / "libcudart.so.12").write_bytes(zf.read(name))
    if not _loadable("libb64.so.0d"):
        return "perf_analyzer needs Debian's libb64 (apt-get install libb64-0d)"
    env = {**os.environ, "LD_LIBRARY_PATH": f"{libs}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    return binary, env


def _loadable(library: str) -> bool:
    """Whether the dynamic loader finds ``library`` as it will for perf_analyzer: through
    LD_LIBRARY_PATH too, which ``ctypes.util.find_library`` ignores (a GPU machine's payload puts
    libb64 there, benchmarks/gpu_payload.sh)."""
    try:
        ctypes.CDLL(library)
    except OSError:
        return False
    return True


def measure(
    tool: tuple[Path, dict[str, str]],
    url: str,
    protocol: str,
    model: str,
    concurrency: int,
    seconds: float,
    shapes: dict[str, list[int]],
    work: Path,
    timeout: float = 300,
    extra: tuple[str, ...] = (),
) -> dict[str, float]:
    """p50/p99 latency (ms) and throughput of batch-1 requests at ``concurrency``, zeros as input
    (valid token ids; latency does not depend on the values), over ``protocol`` (grpc or http: its
    HTTP client sends binary tensors). Where the server answers Triton's statistics extension (Triton,
    and `deploy serve` since 2026-11-28), also its mean split of a request as perf_analyzer reads it:
    ``server_us`` the server's queue and compute (input, infer, output), ``rest_us`` everything else
    of the mean latency but the client's own sending and receiving (the network, the server's
    protocol, decoding and encoding): the same measure for any server, so the one to compare front
    ends by."""
    binary, env = tool
    out = work / f"pa-{model}-{protocol}-{concurrency}.csv"
    command = [str(binary), "-m", model, "-u", url, "-i", protocol, "-b", "1", "--input-data", "zero"]
    command += [
        "--concurrency-range",
        f"{concurrency}:{concurrency}",
        "--measurement-interval",
        str(int(seconds * 1000)),
    ]
    # three windows within 100% of each other: on 2 shared cores the default 10% is never reached
    # at concurrency 8; the blocks of benchmarks/server.py show the spread instead
    command += ["--stability-percentage", "100", "--max-trials", "10", "-f", str(out)]
    for name, dims in shapes.items():
        command += ["--shape", f"{name}:{','.join(map(str, dims))}"]
    command += list(extra)  # e.g. --shared-memory system
    try:
        ran = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"perf_analyzer found no stable rate within {timeout:.0f} s") from exc
    if ran.returncode != 0:
        raise RuntimeError(f"perf_analyzer failed: {(ran.stderr or ran.stdout).strip()[-500:]}")
    with open(out) as fh:
        row = next(csv.DictReader(fh))
    found = {
        "p50_ms": round(float(row["p50 latency"]) / 1000, 2),
        "p99_ms": round(float(row["p99 latency"]) / 1000, 2),
        "throughput": round(float(row["Inferences/Second"]), 1),
    }
    if "Server Queue" in row:  # only where the server lists the statistics extension
        parts = ("Queue", "Compute Input", "Compute Infer", "Compute Output")
        found["server_us"] = round(sum(float(row[f"Server {part}"]) for part in parts))
        found["rest_us"] = round(float(row["Network+Server Send/Recv"]))
    return found


def server_split(row: dict) -> str | None:
    """A measured row's reading of the server's statistics as one cell, "server / rest" in us
    (``measure``), or None where the server has no statistics extension."""
    return f"{row['server_us']} / {row['rest_us']}" if "server_us" in row else None
