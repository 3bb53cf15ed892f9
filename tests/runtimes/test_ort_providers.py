"""What ONNX Runtime was asked for against what a session got, with real sessions on the CPU build.

A CPU-only onnxruntime given the CUDA provider warns and runs on the CPU, exactly as a GPU build
whose CUDA libraries are missing falls back: so pretending the build lists the GPU providers
(``get_available_providers``, which only chooses what is asked for) makes every session here a
real fallback for the runtime to catch.
"""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
from console import deploy

from unideploy.errors import MissingDependencyError
from unideploy.package import Package
from unideploy.runtimes import RuntimeOptions
from unideploy.runtimes.ort_providers import CUDA, TENSORRT, tensorrt_library_problem
from unideploy.runtimes.selection import open_runtime, what_ran

LISTED = [TENSORRT, CUDA, "CPUExecutionProvider"]


@pytest.fixture
def gpu_listed(monkeypatch):
    """This onnxruntime claims the GPU providers; its sessions still get only the CPU."""
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: LISTED)


def test_asking_for_the_gpu_never_runs_on_the_cpu(cnn_package, gpu_listed):
    with Package.open(cnn_package) as pkg, pytest.raises(MissingDependencyError) as refused:
        open_runtime(pkg, options=RuntimeOptions(device="gpu"))
    assert "the GPU was asked for, but ONNX Runtime would run 'model.onnx' on the CPU" in refused.value.message
    assert "CUDAExecutionProvider did not load (Specified provider 'CUDAExecutionProvider'" in refused.value.message


def test_auto_runs_where_it_can_and_names_the_fallback(cnn_package, gpu_listed):
    with Package.open(cnn_package) as pkg:
        artifact, engine = open_runtime(pkg)
        ran = what_ran(artifact, engine)
        engine.run({"x": np.zeros((2, 1, 8, 8), np.float32)})
    assert ran["device"] == "cpu" and ran["providers"] == ["CPUExecutionProvider"]
    assert ran["fallback"].startswith("CUDAExecutionProvider did not load")
    assert ran["precision"] == "fp32"


def test_a_cpu_build_refuses_the_gpu_before_opening_anything(cnn_package, tmp_path):
    np.savez(tmp_path / "in.npz", x=np.zeros((1, 1, 8, 8), np.float32))
    result = deploy("run", cnn_package, "--input", tmp_path / "in.npz", "--device", "gpu")
    assert result.returncode == 2
    assert "no GPU execution provider in this onnxruntime build" in result.stderr


def test_tf32_is_named_only_where_it_ran(cnn_package, tmp_path):
    """TF32 is a precision of the CUDA provider: asked for on the CPU, fp32 is what ran."""
    np.savez(tmp_path / "in.npz", x=np.zeros((1, 1, 8, 8), np.float32))
    result = deploy("run", cnn_package, "--input", tmp_path / "in.npz", "--tf32", "--json")
    assert result.returncode == 0, result.stderr
    import json

    assert json.loads(result.stdout)["precision"] == "fp32"


def test_the_missing_tensorrt_library_is_named():
    assert "libnvinfer.so.10" in (tensorrt_library_problem() or "libnvinfer.so.10 loads")
