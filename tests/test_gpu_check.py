"""The GPU check (benchmarks/gpu_check.sh) run where no GPU is: a GPU machine is lent rarely and for
minutes, so a check broken by a change (a flag renamed, a report that no longer parses) must be
found here, not there. On the CPU every step runs: those that need no GPU pass, those that do fail
naming the missing GPU provider (never a usage error or a traceback), and the benchmarks say they
skipped and why."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from unideploy.doctor import provider_problem
from unideploy.package import Package
from unideploy.runtimes.ort_providers import CUDA

CHECK = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.sh"

pytestmark = pytest.mark.skipif(
    provider_problem(CUDA) is None, reason="a GPU is here: run benchmarks/gpu_check.sh itself (docs/gpu.md)"
)

PASS_ON_CPU = ("doctor", "export", "optimize-fp16", "run-cpu", "bench-cpu-b32")
NEED_A_GPU = ("verify-gpu", "verify-gpu-tf32", "run-gpu", "bench-gpu", "bench-fp16-b32")
SKIP_ON_CPU = ("gpu-tests", "prepare-encoder")


def test_the_gpu_check_runs_every_step_on_the_cpu_and_says_what_needs_a_gpu(digits, tmp_path):
    with Package.open(digits["package"]) as package:
        model = package.path_of(package.manifest.artifact("onnx-fp32"))
    photos = tmp_path / "photos.npz"  # real inputs under 'x', as the check takes them
    np.savez(photos, x=np.load(digits["data"])["x"][:16])
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHON": sys.executable,
    }
    out = tmp_path / "check"
    done = subprocess.run(
        ["bash", str(CHECK), str(model), str(photos), str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = (out / "gpu-check.md").read_text()
    results = dict(re.findall(r"^\| ([a-z0-9-]+) \| (.*?) \| [^|]* \| [0-9.]+ \|$", report, re.M))
    assert set(results) == {*PASS_ON_CPU, *NEED_A_GPU, *SKIP_ON_CPU}, report
    for step in PASS_ON_CPU:
        assert results[step] == "ok", (step, (out / f"{step}.log").read_text()[-1000:])
    for step in NEED_A_GPU:
        assert results[step].startswith("FAILED"), (step, results[step])
        assert re.search(r"no artifact|no GPU execution provider", results[step]), (step, results[step])
        log = (out / f"{step}.log").read_text()
        assert "Traceback" not in log and "usage:" not in log, (step, log[-1000:])
    for step in SKIP_ON_CPU:
        assert results[step].startswith("skipped: "), (step, results[step])
    # what the report gathers from the steps' own output: the CPU's bench row, the GPU's finding
    assert re.search(r"^\| bench-cpu-b32 \| onnx-fp32 \| CPUExecutionProvider \| fp32 \| 32 \|", report, re.M), report
    assert "doctor, gpu: " in report  # unavailable here; a GPU machine without CUDA's provider may say ok
    assert "benchmarks/gpu_serving.py: skipped, " in report and "benchmarks/gpu.py: skipped, " in report
    assert "Traceback" not in report and "gpu_check.sh took " in report
