"""`deploy serve` on a GPU under load: Triton's perf_analyzer at concurrency 1-32 against each batch
bucket policy, beside the same model in process at batch 32.

The server runs on cores 0-7 and perf_analyzer on 8-15 (where the machine has 16), so the load
generator does not take the server's cores. Policies (``model.yaml``):

- ``buckets``: the default, merged batches padded to powers of two up to ``max_batch_size``, a
  warmed session per bucket (runtimes/batch_buckets.py);
- ``pad to max``: ``batch_buckets: [32]``, every call padded to 32 rows, one session;
- ``every size``: ``batch_buckets: []``, each merged batch run at its own size (the behaviour that
  collapsed: every new shape re-plans the CUDA provider's convolutions);
- ``fp16 + buckets``: the onnx-fp16 artifact with the default buckets; ``finer buckets``: 12 and 24
  besides the powers of two;
- ``buckets, threads: 1``: the default with one ONNX Runtime thread per session;
- ``N front ends`` (``deploy serve --frontends N``) and ``shm`` (perf_analyzer's tensors through
  system shared memory; ``cuda shm``: in GPU memory perf_analyzer allocated, the server started with
  ``--shared-memory cuda``): the server's protocols in more processes, and no tensor bytes on the wire;
  ``one batch in flight``, ``three batches in flight``: ``batches_in_flight`` against the GPU's
  default of two; ``threads: 1``:
  the GPU session's CPU threads; ``no pinned memory``: merged batches in new pageable arrays instead
  of the default's page-locked buffers (runtimes/pinned.py); ``no CUDA graphs``, ``graphs on every
  bucket``, ``two graph sessions``: against the default's graph for the bucket of one row only;
- ``cpu, ...``: the same server with the model on the CPU (``device: cpu``) on the same cores,
  against the model in process on those cores: the host's CPU row of issue 44.

Every policy but the front-end ones runs the server as one process (``--frontends 0``), as before
the default counted front ends from the cores.

Targets: concurrency 32 >= 0.8x in-process batch-32 throughput and p99 <= 3x p50 (issue 42, the
default server); through front ends >= 0.5x over gRPC and >= 0.8x with shared memory, c1 p50 <=
in process at batch 1 + 0.5 ms, RSS <= in process + 100 MB per front end (issue 44). The server's
RSS is its processes' together, after the run, beside their PSS (a page they share counted once).
Each row also says how much CPU a request cost the model process and the front ends (their CPU
time over the requests its metrics counted; of the model process, its event loop's thread apart,
with how busy that rate kept it: a loop near 100 % is the model process's ceiling), where the
server says a request's time went (the mean of each stage of its request-duration histogram over the window: decode, queue, compute, encode;
what of a c1 p50 above the model's own call the server accounts for), the mean rows of the
runtime calls at that concurrency (``unideploy_batch_rows``: how full the batches were), and
``--profile DIR``
samples the server's stacks at each policy's highest concurrency (``stack_samples.py``: which
process, and which of its functions, holds the ceiling).

    python benchmarks/gpu_serving.py --package PKG [--seconds 2] [--only POLICY] [--protocol grpc|http] [--profile DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import perf_analyzer
import psutil
import stack_samples
import yaml
from gpu import usable_cuda
from process_cpu import server_cpu_seconds, thread_cpu_seconds
from server_stages import CALL_PARTS, STAGES, call_means_ms, rows_per_call, stage_means_ms, stage_sums

import unideploy
from unideploy.runtimes import RuntimeOptions
from unideploy.runtimes.selection import open_artifact
from unideploy.samples import resize_batch

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from serving import start_server, stop_server


@dataclass(frozen=True)
class Policy:
    settings: dict[str, Any]  # model.yaml
    levels: tuple[int, ...]  # perf_analyzer concurrencies
    protocols: tuple[str, ...]
    server: tuple[str, ...] = ("--frontends", "0")  # deploy serve's options (one process unless named)
    client: tuple[str, ...] = ()  # perf_analyzer's
    awake: bool = False  # the CPUs held out of deep idle states while it serves (``cpus_awake``)

    @property
    def device(self) -> str:
        return str(self.settings.get("device", "gpu"))

    @property
    def frontends(self) -> int:
        return int(self.server[self.server.index("--frontends") + 1]) if "--frontends" in self.server else 0


STAGES_COLUMN = "server ms: " + " / ".join(STAGES)
CALLS_COLUMN = "call ms: " + " / ".join(part.replace("_", " ") for part in CALL_PARTS)
# perf_analyzer's split of the mean latency from the server's statistics (perf_analyzer.measure): the
# server's queue and compute, and the rest but the client's own send and receive (front ends, hand-off,
# decoding, encoding, the network): the time outside the batcher a request spends at each concurrency
SPLIT_COLUMN = "pa us: server / rest"
# the model process's main thread, which runs its event loop: every request's Python there but the
# batch threads' (whether one core's worth of it is what holds concurrency 32 back)
LOOP_COLUMN = "loop ms/req (busy %)"
ON_CPU = {"device": "cpu"}
SHARED_MEMORY = ("--shared-memory", "system", "--output-shared-memory-size", "4096")
CUDA_SHARED_MEMORY = ("--shared-memory", "cuda", "--output-shared-memory-size", "4096")
POLICIES: dict[str, Policy] = {
    "buckets": Policy({}, (1, 4, 8, 16, 32), ("grpc",)),
    "buckets, HTTP": Policy({}, (1, 32), ("http",)),
    # a CUDA session's CPU threads only run the few nodes the GPU leaves: one leaves the cores to the
    # server's event loop and threads
    "buckets, threads: 1": Policy({"threads": 1}, (8, 32), ("grpc",)),
    "pad to max": Policy({"batch_buckets": [32]}, (1, 32), ("grpc",)),
    "every size": Policy({"batch_buckets": []}, (1, 8), ("grpc",)),
    "fp16 + buckets": Policy({"artifact": "onnx-fp16"}, (1, 32), ("grpc",)),
    # front-end processes (issue 44: c32 >= 0.5x in process b32 over gRPC, >= 0.8x with shared memory)
    "buckets, 2 front ends": Policy({}, (1, 32), ("grpc", "http"), ("--frontends", "2")),
    "buckets, 4 front ends": Policy({}, (1, 32), ("grpc", "http"), ("--frontends", "4")),
    # since the night of 2026-11-28 its rows are copied into the batch by the GPU from the segments,
    # page-locked (device_batches, runtimes/device_batches.py); before, read on the host: 0.17 ms a row at c32
    "buckets, 4 front ends, shm": Policy({}, (1, 32), ("grpc", "http"), ("--frontends", "4"), SHARED_MEMORY),
    "buckets, 4 front ends, shm, through the host": Policy(
        {"device_batches": False}, (1, 32), ("grpc", "http"), ("--frontends", "4"), SHARED_MEMORY
    ),
    # the GPU session's CPU threads (one per core, spinning within a run, against one), and merged
    # batches in new pageable arrays against the page-locked buffers of the default (runtimes/pinned.py)
    "buckets, 4 front ends, shm, threads: 1": Policy(
        {"threads": 1}, (1, 32), ("http",), ("--frontends", "4"), SHARED_MEMORY
    ),
    "buckets, 4 front ends, shm, no pinned memory": Policy(
        {"pinned_memory": False}, (1, 32), ("grpc", "http"), ("--frontends", "4"), SHARED_MEMORY
    ),
    "buckets, 4 front ends, shm, one batch in flight": Policy(
        {"batches_in_flight": 1}, (32,), ("grpc",), ("--frontends", "4"), SHARED_MEMORY
    ),
    # at c32 half of a request's time was waiting for one of the default two batch slots (2026-11-27)
    "buckets, 4 front ends, shm, three batches in flight": Policy(
        {"batches_in_flight": 3}, (32,), ("grpc", "http"), ("--frontends", "4"), SHARED_MEMORY
    ),
    "buckets, shm": Policy({}, (1, 32), ("grpc", "http"), client=SHARED_MEMORY),
    # a batch whose GPU run has ended waits for the GIL until a busy event loop idles, unless the model
    # process's switch interval is short (benchmarks/gil_handoff.py: 5.3 ms for a 2 ms call at 80% busy
    # with CPython's 5 ms, 2.9 with 20 us): one process at c32 made calls of 5.8 rows taking 12.5 ms
    # (2026-11-27, 20:00 UTC, CPython's interval), where in process batch 8 takes 2 ms
    "buckets, switch interval 5 ms": Policy(
        {}, (1, 32), ("grpc",), ("--frontends", "0", "--switch-interval-us", "5000")
    ),
    "buckets, 4 front ends, shm, switch interval 5 ms": Policy(
        {}, (1, 32), ("grpc", "http"), ("--frontends", "4", "--switch-interval-us", "5000"), SHARED_MEMORY
    ),
    # at c32 with two batches in flight a batch held 9-15 rows, padded to 16 (2026-11-27; the batch an
    # average request ran in, over all of a policy's levels: the metric before it counted calls):
    # finer buckets waste less of each GPU call on padding rows
    "finer buckets, 4 front ends, shm": Policy(
        {"batch_buckets": [1, 2, 4, 8, 12, 16, 24, 32]}, (32,), ("grpc",), ("--frontends", "4"), SHARED_MEMORY
    ),
    # the default until 2026-11-28 (evening): six buckets (powers of two) of plain sessions. Each bucket
    # added 46-76 MB of the model process's RSS (gpu.py --only memory), which held 1,160-1,169 MB with
    # six against 992 with three (the default since), and three made 5-19% more requests/s at c32
    "powers of two, 4 front ends, shm, no CUDA graphs": Policy(
        {"batch_buckets": [1, 2, 4, 8, 16, 32], "cuda_graphs": False},
        (1, 32),
        ("http",),
        ("--frontends", "4"),
        SHARED_MEMORY,
    ),
    # by default the one-row bucket replays a CUDA graph (model.yaml cuda_graphs, runtimes/ort_bound.py;
    # every bucket from 2026-11-28, evening: c1 0.45-0.55 ms faster served, c32 within the runs' noise), and
    # since 2026-11-30 (night) the larger ones run plain sessions, both batch threads at once: with graphs on
    # every bucket c32 served 0.55-0.60x, with none 0.71x (docs/gpu.md); these two say what each choice costs
    "buckets, 4 front ends, shm, no CUDA graphs": Policy(
        {"cuda_graphs": False}, (1, 32), ("http",), ("--frontends", "4"), SHARED_MEMORY
    ),
    "buckets, 4 front ends, shm, graphs on every bucket": Policy(
        {"cuda_graphs": True}, (1, 32), ("http",), ("--frontends", "4"), SHARED_MEMORY
    ),
    # with CUDA graphs a bucket is one session replayed by one thread (ONNX Runtime allows no concurrent run of
    # a session capturing graphs), so at c32 the two batches in flight, both cut at 8 rows, take bucket 8's
    # replays in turn: 8 rows per ~2-2.5 ms whatever the front ends do. A 16-row bucket runs twice the rows in
    # about 1.6x the time where 16 wait; c64 says whether more requests waiting (larger batches) raise the
    # rate. On the H200 (2026-11-30) neither did beyond the runs' spread: 0.56x and 0.68x against the
    # default's 0.62-0.67x (docs/gpu.md, "The H200 runs of 2026-11-30")
    "buckets 1, 8, 16, 32, 4 front ends, shm": Policy(
        {"batch_buckets": [1, 8, 16, 32]}, (1, 32), ("http",), ("--frontends", "4"), SHARED_MEMORY
    ),
    "buckets, 4 front ends, shm, c64": Policy({}, (32, 64), ("http",), ("--frontends", "4"), SHARED_MEMORY),
    # two sessions per bucket replaying its graph (model.yaml graph_sessions, ort_bound.GraphSessions): the two
    # batch slots' calls of one bucket replay side by side; two more sessions' memory (about 100-150 MB RSS)
    # c1 spends about 0.9 ms outside the model process on the H200's host (0.3 on 2 busy cores): a
    # request wakes 6-8 threads in turn, each maybe on an idle core in a deep C-state; the same policy
    # with every core held out of them (PM QoS) says how much of c1 that is
    "buckets, 4 front ends, shm, CPUs awake": Policy(
        {}, (1, 32), ("http",), ("--frontends", "4"), SHARED_MEMORY, awake=True
    ),
    "buckets, 4 front ends, shm, two graph sessions": Policy(
        {"cuda_graphs": True, "graph_sessions": 2}, (1, 32), ("http",), ("--frontends", "4"), SHARED_MEMORY
    ),
    # a batch thread waited about 1 ms between its calls for the event loop (c32, 2026-11-30: 388 calls/s of
    # 4.1 ms with two threads): would a third cover that wait? 0.57x against 0.57x with two (the night's
    # runs); the batcher has started the next batch in the callback that ends the last since
    "buckets, 4 front ends, shm, two graph sessions, three batches in flight": Policy(
        {"cuda_graphs": True, "graph_sessions": 2, "batches_in_flight": 3},
        (32,),
        ("http",),
        ("--frontends", "4"),
        SHARED_MEMORY,
    ),
    # perf_analyzer's tensors in GPU memory it allocated (CUDA shared memory, server/cuda_shared_memory.py),
    # merged in GPU memory (runtimes/device_batches.py), against the same read through the host (before
    # 2026-11-28, night): a 600 KB row's host read took 0.17 ms of a c32 call, the batch's copy back 1.3 ms
    "buckets, 4 front ends, cuda shm": Policy(
        {}, (1, 32), ("grpc", "http"), ("--frontends", "4", "--shared-memory", "cuda"), CUDA_SHARED_MEMORY
    ),
    "buckets, 4 front ends, cuda shm, through the host": Policy(
        {"device_batches": False},
        (1, 32),
        ("grpc", "http"),
        ("--frontends", "4", "--shared-memory", "cuda"),
        CUDA_SHARED_MEMORY,
    ),
    # the host's CPU (issue 44): one process, front ends, and front ends with shared memory
    "cpu, one process": Policy(ON_CPU, (1, 32), ("grpc",)),
    "cpu, 4 front ends": Policy(ON_CPU, (1, 32), ("grpc", "http"), ("--frontends", "4")),
    "cpu, 4 front ends, shm": Policy(ON_CPU, (1, 32), ("grpc",), ("--frontends", "4"), SHARED_MEMORY),
    # two of the server's eight cores left to the front ends and the event loop: on 2026-11-27 (evening)
    # its batches held 15.6 rows at c32 as the default's did, and it served 7 % less (not adopted)
    # concurrency 1 on the CPU was in process + 1.7-2.4 ms on the H200's host (2026-11-26; target + 0.5), the
    # engine alone 0.5-0.8 ms slower idling 2 ms between calls: ONNX Runtime's workers spinning between runs
    # (its own default, and the in-process baseline's) against the server's spin within a run only. On
    # 2026-11-30 two H200 hosts disagreed on c1's p50 (4.78 against 6.80 ms on one, 3.74-3.83 against
    # 4.05-4.07 on the other, two rounds) and the second doubled p99 spinning (11.7-11.8 against 5.3 ms),
    # c32 within the noise: the default stays (docs/server.md, "Threads and spinning")
    "cpu, 4 front ends, shm, spin: always": Policy(
        {**ON_CPU, "spin": "always"}, (1, 32), ("grpc",), ("--frontends", "4"), SHARED_MEMORY
    ),
    "cpu, 4 front ends, shm, threads: 6": Policy(
        {**ON_CPU, "threads": 6}, (1, 32), ("grpc",), ("--frontends", "4"), SHARED_MEMORY
    ),
}


def cores() -> tuple[list[int], list[int]]:
    """CPUs for the server and for the load generator: the two halves of those this process has."""
    allowed = sorted(os.sched_getaffinity(0))
    half = max(1, len(allowed) // 2)
    return allowed[:half], allowed[half:] or allowed


# a request every ~2.5 ms at concurrency 1 on the GPU (a 1 ms call): the engine idles between calls
PACED_GAP_S = 0.002


def in_process(package: Path, batch: int, device: str, gap_s: float = 0.0) -> tuple[float, float, float]:
    """onnx-fp32 at ``batch``, the call repeated (one shape): images per second, the median call in
    ms, and this process's RSS in MB with the session open. ``gap_s``: the engine idles that long
    before each call, as it does between the requests of concurrency 1 (what of c1's excess over
    back-to-back calls is the engine's own, caches and clocks, rather than the server's)."""
    with unideploy.open_package(package) as pkg:
        engine = open_artifact(pkg, pkg.manifest.artifact("onnx-fp32"), None, RuntimeOptions(device=device))
        inputs = resize_batch(pkg.reference_samples()[0].inputs, batch)
        for _ in range(5):
            engine.run(inputs)
        times: list[float] = []
        start = time.perf_counter()
        while time.perf_counter() - start < 2.0:
            if gap_s:
                time.sleep(gap_s)
            began = time.perf_counter()
            engine.run(inputs)
            times.append(time.perf_counter() - began)
        rss = psutil.Process().memory_info().rss / 2**20
        engine.close()
    return batch * len(times) / (time.perf_counter() - start), 1000 * statistics.median(times), rss


def server_memory_mb(server: Any) -> tuple[float, float, float]:
    """The server's resident memory, its process and every child (front ends, decoders) together:
    RSS summed (what issue 44's target counts), PSS summed, where a page the processes share (the
    front ends' slots, which the model process maps too; the libraries) counts once, as it does in
    the machine's memory and in a container's limit; and the model process's own RSS, so that a miss
    says whether the front ends or the model process (a session per batch bucket, where in process
    holds one) went over."""
    root = psutil.Process(server.process.pid)
    found = [p.memory_full_info() for p in (root, *root.children(recursive=True))]
    return sum(m.rss for m in found) / 2**20, sum(m.pss for m in found) / 2**20, found[0].rss / 2**20


def measured(
    tool: Any,
    server: Any,
    url: str,
    protocol: str,
    c: int,
    policy: Policy,
    seconds: float,
    work: Path,
    profile: Path | None,
) -> dict[str, Any]:
    """One perf_analyzer window with the server's CPU per request (model process, front ends), and
    its stacks sampled meanwhile into ``profile`` where given."""
    spy = stack_samples.record(server.process.pid, 3 * seconds, profile) if profile else None
    pid = server.process.pid
    before, cpu_before, loop_before = (
        stage_sums(server.http, "model"),
        server_cpu_seconds(pid),
        thread_cpu_seconds(pid, pid),
    )
    try:
        found: dict[str, Any] = perf_analyzer.measure(
            tool, url, protocol, "model", c, seconds, {}, work, 90, policy.client
        )
    except (RuntimeError, OSError) as exc:
        found = {"failed": " ".join(str(exc).split())[-200:]}
    after, loop_s = stage_sums(server.http, "model"), thread_cpu_seconds(pid, pid) - loop_before
    requests, means = stage_means_ms(before, after)
    found["rows per call"] = rows_per_call(before, after)  # at this concurrency only
    # a runtime call's mean parts: the hand-offs, the merge and the run (in process: the baseline)
    if parts := call_means_ms(before, after):
        found[CALLS_COLUMN] = " / ".join(f"{parts[part]:.2f}" for part in CALL_PARTS)
    if requests:
        model_s, frontends_s = (a - b for a, b in zip(server_cpu_seconds(pid), cpu_before, strict=True))
        found["model process ms/req"] = round(1000 * model_s / requests, 3)
        if "throughput" in found:  # busy: its CPU per request at the window's rate
            found[LOOP_COLUMN] = f"{1000 * loop_s / requests:.3f} ({100 * loop_s / requests * found['throughput']:.0f})"
        found["front ends ms/req"] = round(1000 * frontends_s / requests, 3) if policy.frontends else ""
        # the server's own account of a request (means): what of p50 is not the model's call
        found[STAGES_COLUMN] = " / ".join(f"{means[stage]:.2f}" for stage in STAGES)
    if split := perf_analyzer.server_split(found):  # what is outside the server's queue and compute
        found[SPLIT_COLUMN] = split
        del found["server_us"], found["rest_us"]
    if isinstance(spy, subprocess.Popen):
        spy.wait(timeout=60)
    return found


def scrape(server: Any) -> dict[str, Any]:
    """What the server says it ran, after the run: its engine labels, and the model's account of
    what it asked for on a GPU (CUDA graphs, batches merged in GPU memory), which a failure while
    serving would have turned off, saying why."""
    text = httpx.get(f"{server.http}/metrics", timeout=10).text
    engine = re.search(r"unideploy_model_engine\{([^}]*)\} 1", text)
    ran = httpx.get(f"{server.http}/v2/models/model", timeout=10).json().get("parameters", {})
    asked = "; ".join(f"{key}: {ran[key]}" for key in ("cuda_graphs", "device_batches") if key in ran)
    return {"engine": (engine.group(1) if engine else "(no engine metric)") + (f"; {asked}" if asked else "")}


@contextlib.contextmanager
def cpus_awake() -> Iterator[str]:
    """Every CPU held out of idle states that take longer than 0 us to leave, while the block runs: the
    kernel's PM QoS request, held as long as /dev/cpu_dma_latency stays open with 0 written to it
    (root only). Yields whether it is held, or why not."""
    try:
        fd = os.open("/dev/cpu_dma_latency", os.O_WRONLY)
    except OSError as exc:
        yield f"not held: /dev/cpu_dma_latency: {exc.strerror}"
        return
    try:
        os.write(fd, struct.pack("i", 0))
        yield "held (PM QoS, /dev/cpu_dma_latency 0)"
    finally:
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", type=Path, required=True, help="a package with onnx-fp32 (and onnx-fp16)")
    parser.add_argument("--seconds", type=float, default=2.0, help="perf_analyzer's measurement window")
    parser.add_argument("--only", choices=list(POLICIES), action="append", help="policies to run (default: all)")
    parser.add_argument(
        "--protocol",
        choices=("grpc", "http"),
        action="append",
        help="only these of each policy's protocols (default: all it names; the GPU check runs HTTP's)",
    )
    parser.add_argument("--device", default="gpu", help="of the in-process row (cpu: a dry run without a GPU)")
    parser.add_argument(
        "--profile", type=Path, help="a folder: py-spy stacks of the server at each highest concurrency"
    )
    args = parser.parse_args()
    tool = perf_analyzer.ensure()
    if isinstance(tool, str):
        print(f"benchmarks/gpu_serving.py: skipped, {tool}")
        return
    chosen = [p for name, p in POLICIES.items() if not args.only or name in args.only]
    devices = sorted({args.device if p.device == "gpu" else "cpu" for p in chosen})
    why = usable_cuda() if "gpu" in devices else None
    if why:
        print(f"benchmarks/gpu_serving.py: skipped, ONNX Runtime's CUDA provider is not usable here ({why})")
        return
    server_cores, client_cores = cores()
    os.sched_setaffinity(0, server_cores)  # in process on the cores the server gets
    baseline = {device: {batch: in_process(args.package, batch, device) for batch in (1, 32)} for device in devices}
    paced = {device: in_process(args.package, 1, device, PACED_GAP_S)[1] for device in devices}  # batch 1, ms
    os.sched_setaffinity(0, client_cores)  # perf_analyzer inherits it; the server gets the other half
    rows: list[dict[str, Any]] = []
    profiles: dict[str, Path] = {}
    with tempfile.TemporaryDirectory(prefix="unideploy-gpu-serving-") as folder:
        work = Path(folder)
        for name, policy in POLICIES.items():
            protocols = [p for p in policy.protocols if not args.protocol or p in args.protocol]
            if (args.only and name not in args.only) or not protocols:
                continue
            slug = re.sub(r"\W+", "-", name)
            repo = work / slug
            shutil.copytree(args.package, repo / "model" / "1")
            (repo / "model" / "model.yaml").write_text(yaml.safe_dump({"max_batch_size": 32, **policy.settings}))
            started = time.perf_counter()
            server = start_server(
                repo,
                work,
                *policy.server,
                wrapper=("taskset", "-c", ",".join(map(str, server_cores))),
                ready_within=600,
            )
            ready_s = round(time.perf_counter() - started, 1)
            held = contextlib.ExitStack()
            try:
                awake = held.enter_context(cpus_awake()) if policy.awake else ""
                for protocol in protocols:
                    url = server.grpc if protocol == "grpc" else server.http.removeprefix("http://")
                    for c in policy.levels:
                        print(f"{name}: {protocol} concurrency {c}", file=sys.stderr, flush=True)
                        profile = None
                        if args.profile and c == max(policy.levels):
                            args.profile.mkdir(parents=True, exist_ok=True)
                            profile = args.profile / f"{slug}-{protocol}-c{c}.txt"
                            profiles[f"{name}, {protocol}, concurrency {c}"] = profile
                        found = measured(tool, server, url, protocol, c, policy, args.seconds, work, profile)
                        rows.append(
                            {
                                "policy": name,
                                "device": "cpu" if policy.device == "cpu" else args.device,
                                "front ends": policy.frontends,
                                "ready s": ready_s,
                                "protocol": protocol,
                                "concurrency": c,
                                **found,
                            }
                        )
                rows[-1].update(scrape(server))
                if awake:
                    rows[-1]["engine"] += f"; CPUs awake: {awake}"
                rows[-1]["RSS MB"], rows[-1]["PSS MB"], rows[-1]["model process RSS MB"] = (
                    round(mb) for mb in server_memory_mb(server)
                )
            finally:
                held.close()
                stop_server(server)
    print_rows(rows, baseline, paced)
    for label, path in profiles.items():
        if path.exists():
            print(f"\nWhere the server's CPU went, {label} (py-spy, {path.name}):\n\n```")
            print("\n".join(stack_samples.summary(path)))
            print("```")


def print_rows(
    rows: list[dict[str, Any]], baseline: dict[str, dict[int, tuple[float, float, float]]], paced: dict[str, float]
) -> None:
    """One markdown table, and the targets; each row the mean rows of the runtime calls at its
    concurrency, and the last row of each policy its server's engine and RSS."""
    columns = ["policy", "ready s", "protocol", "concurrency", "p50_ms", "p99_ms", "throughput", "failed"]
    columns += [
        "model process ms/req",
        LOOP_COLUMN,
        "front ends ms/req",
        STAGES_COLUMN,
        SPLIT_COLUMN,
        "rows per call",
        CALLS_COLUMN,
        "RSS MB",
        "PSS MB",
        "model process RSS MB",
        "engine",
    ]
    lines = [
        f"in process on the server's cores, onnx-fp32 on the {device}: batch 1 {b[1][1]:.2f} ms "
        f"({paced[device]:.2f} ms idling {1000 * PACED_GAP_S:g} ms before each call), "
        f"batch 32 {b[32][0]:.0f} images/s, RSS {b[32][2]:.0f} MB"
        for device, b in baseline.items()
    ]
    for row in rows:
        batch1_ms, (batch32, _, rss) = baseline[row["device"]][1][1], baseline[row["device"]][32]
        shm = "shm" in row["policy"]
        if row["concurrency"] == 1 and "p50_ms" in row and (row["front ends"] or shm):
            over = row["p50_ms"] - batch1_ms
            lines.append(
                f"{'met' if over <= 0.5 else 'MISSED'}: {row['policy']} {row['protocol']} c1 p50 <= in process "
                f"+ 0.5 ms (measured + {over:.2f} ms; + {row['p50_ms'] - paced[row['device']]:.2f} over the engine idling between calls)"
            )
        if row["concurrency"] == 32 and "throughput" in row:
            ratio = row["throughput"] / batch32
            tail = row["p99_ms"] / row["p50_ms"]
            # issue 42 asked 0.8x of the default server; issue 44 0.5x through front ends, 0.8x with shared memory
            wanted = 0.5 if row["front ends"] and not shm else 0.8
            lines.append(
                f"{'met' if ratio >= wanted else 'MISSED'}: {row['policy']} {row['protocol']} c32 >= {wanted}x in "
                f"process b32 (measured {ratio:.2f}x); {'met' if tail <= 3 else 'MISSED'}: p99 <= 3x p50 ({tail:.2f}x)"
            )
        if "RSS MB" in row and row["front ends"]:
            allowed = rss + 100 * row["front ends"]
            lines.append(
                f"{'met' if row['RSS MB'] <= allowed else 'MISSED'}: {row['policy']} RSS <= in process + 100 MB "
                f"per front end ({row['RSS MB']} MB, allowed {allowed:.0f}: the model process {row['model process RSS MB']} "
                f"MB, the front ends {row['RSS MB'] - row['model process RSS MB']}; PSS, shared pages once: {row['PSS MB']} MB)"
            )
    print("| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row.get(c, "")) for c in columns) + " |")
    print()
    for line in lines:
        print(f"- {line}")


if __name__ == "__main__":
    main()
