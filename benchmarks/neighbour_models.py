"""A fast model's tail beside a heavy one in the same `deploy serve`, for each of the heavy model's
thread policies (docs/server.md, "Several models on one CPU").

One server per policy, all started at once, one process each (``--frontends 0``), HTTP. The fast
model is the 16-byte averaging one of ``server_overhead.py``; the heavy one EfficientNet-Lite0 with
its ImageNet weights (the zoo's packages, ``make zoo``). In every round each server takes its turn:
perf_analyzer measures the fast model at concurrency 1 alone, then again while a second
perf_analyzer keeps EfficientNet-Lite0 at concurrency 2, whose rate is that window's. The heavy
model's ``model.yaml`` is the policy: the default (``threads``: the cores, ``spin: run``),
``spin: never``, ``threads: 1``.

    python benchmarks/neighbour_models.py [--markdown] [--json]
"""

from __future__ import annotations

import shutil
import sys
import threading
from pathlib import Path
from typing import Any

import perf_analyzer
import report
from server_overhead import REQUESTS, averaging_model

import unideploy

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from serving import start_server, stop_server

FAST, HEAVY = "noop-16b", "effnet"
POLICIES = {"default": "", "spin: never": "spin: never\n", "threads: 1": "threads: 1\n"}
ROUNDS, SECONDS = 3, 2.0


def _repository(work: Path, heavy: Path, index: int, policy: str) -> Path:
    repo = work / f"repo-{index}"
    (repo / FAST).mkdir(parents=True)
    averaging_model(REQUESTS[FAST], repo / FAST)
    shutil.copytree(heavy, repo / HEAVY / "1")
    (repo / HEAVY / "model.yaml").write_text(policy or "{}\n")
    return repo


def _beside(tool: Any, url: str, work: Path) -> tuple[dict[str, float], dict[str, float]]:
    """The fast model at concurrency 1 while the heavy one is kept at 2: both perf_analyzers' rows."""
    measured = threading.Event()
    heavy: list[dict[str, float]] = []

    def load() -> None:
        while not measured.is_set():  # windows until the fast model's measurement has ended
            heavy.append(perf_analyzer.measure(tool, url, "http", HEAVY, 2, SECONDS, {}, work / "heavy"))

    (work / "heavy").mkdir(exist_ok=True)
    loader = threading.Thread(target=load)
    loader.start()
    try:
        fast = perf_analyzer.measure(tool, url, "http", FAST, 1, SECONDS, {}, work)
    finally:
        measured.set()
        loader.join()
    return fast, heavy[0]


def neighbours(work: Path) -> dict[str, Any]:
    from zoo_models import efficientnet_lite0

    tool = perf_analyzer.ensure()
    if isinstance(tool, str):
        raise SystemExit(f"benchmarks/neighbour_models.py: {tool}")
    heavy = work / "effnet.udp"
    unideploy.export(efficientnet_lite0(work), heavy, input_shapes=["x:1x3x224x224"]).close()
    servers = {
        name: start_server(_repository(work, heavy, index, policy), work, "--frontends", "0")
        for index, (name, policy) in enumerate(POLICIES.items())
    }
    found: dict[str, dict[str, list[float]]] = {name: {"alone": [], "beside": [], "rate": []} for name in POLICIES}
    try:
        for _ in range(ROUNDS):
            for name, server in servers.items():
                url = server.http.removeprefix("http://")
                found[name]["alone"].append(
                    perf_analyzer.measure(tool, url, "http", FAST, 1, SECONDS, {}, work)["p99_ms"]
                )
                fast, loaded = _beside(tool, url, work)
                found[name]["beside"].append(fast["p99_ms"])
                found[name]["rate"].append(loaded["throughput"])
    finally:
        for server in servers.values():
            stop_server(server)

    def span(values: list[float], digits: int = 2) -> str:
        return f"{min(values):.{digits}f}-{max(values):.{digits}f}"

    rows = [
        {
            "EfficientNet-Lite0's model.yaml": name,
            "fast model p99 ms alone": span(f["alone"]),
            "fast model p99 ms beside it": span(f["beside"]),
            "EfficientNet-Lite0 c2 requests/s": span(f["rate"], 0),
        }
        for name, f in found.items()
    ]
    worst = {name: max(f["beside"]) for name, f in found.items()}
    return {
        "model": "a fast model at concurrency 1 beside EfficientNet-Lite0 at concurrency 2, one server",
        "quality": "",
        "rows": rows,
        "targets": [
            (
                "spin: never lowers the fast model's worst p99 beside the CNN",
                worst["spin: never"] < worst["default"],
                f"{worst['spin: never']:.2f} against {worst['default']:.2f} ms",
            )
        ],
        "note": f"{ROUNDS} rounds alternating the servers, perf_analyzer windows of {SECONDS:g} s, HTTP, one process",
    }


if __name__ == "__main__":
    report.main(__doc__.splitlines()[0], {"neighbours": neighbours})
