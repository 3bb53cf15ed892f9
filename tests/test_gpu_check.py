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


def test_gpu_benchmark_times_any_one_input_image_model_by_its_own_input(tmp_path):
    """``benchmarks/gpu.py --package`` on a model whose one input is not EfficientNet-Lite0's ``x``
    (an NHWC ``image``, as Keras's MobileNetV2 that the GPU payload carries): its photos are read
    by the input's name, and every engine is a row; here the CPU's runs and the GPU's say why not."""
    import onnx
    from onnx import TensorProto, helper

    import unideploy

    sys.path.insert(0, str(CHECK.parent))
    import gpu

    rng = np.random.default_rng(0)
    weights = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3], rng.normal(size=108).astype(np.float32))
    graph = helper.make_graph(
        [
            helper.make_node("Transpose", ["image"], ["nchw"], perm=[0, 3, 1, 2]),
            helper.make_node("Conv", ["nchw", "w"], ["features"]),
            helper.make_node("GlobalAveragePool", ["features"], ["pooled"]),
            helper.make_node("Flatten", ["pooled"], ["logits"]),
        ],
        "nhwc",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 8, 8, 3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 4])],
        [weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "nhwc.onnx")
    photos = tmp_path / "photos.npz"
    np.savez(photos, image=rng.random((16, 8, 8, 3), np.float32))
    unideploy.export(tmp_path / "nhwc.onnx", tmp_path / "nhwc.udp").close()
    unideploy.optimize(tmp_path / "nhwc.udp", quantize="fp16", calibration=str(photos)).close()
    found = gpu.cnn(tmp_path / "work", tmp_path / "nhwc.udp", photos, quick=False)
    assert found["model"] == "nhwc (nhwc.udp), image 8x8x3, real photos"
    rows = {row["engine"]: row for row in found["rows"]}
    assert rows["onnx-fp32, CPU"]["top-1 agreement %"] == 100.0 and rows["onnx-fp32, CPU"]["b32 ms"] > 0
    assert rows["onnx-fp32, exact"]["ran"].startswith("not run: no GPU execution provider")
    assert rows["onnx-fp16 + device buffers"]["ran"].startswith("failed: ")
