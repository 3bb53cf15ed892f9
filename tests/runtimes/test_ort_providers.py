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
from unideploy.runtimes.ort_providers import (
    CPU,
    CUDA,
    TENSORRT,
    node_placement,
    nodes_left_to_cpu,
    open_session,
    tensorrt_library_problem,
)
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
    """TF32 is a precision of the CUDA provider: asked for on the CPU, fp32 is what ran, and run,
    bench and verify say that TF32 was not used, as any fallback."""
    np.savez(tmp_path / "in.npz", x=np.zeros((1, 1, 8, 8), np.float32))
    result = deploy("run", cnn_package, "--input", tmp_path / "in.npz", "--tf32", "--json")
    assert result.returncode == 0, result.stderr
    import json

    ran = json.loads(result.stdout)
    assert ran["precision"] == "fp32" and "TF32 was asked for, and this ran in exact fp32 on the CPU" in ran["fallback"]
    for command in (("bench", "--iterations", "5"), ("verify",)):
        shown = deploy(command[0], cnn_package, *command[1:], "--tf32")
        assert shown.returncode == 0, shown.stderr
        assert "TF32 was asked for" in " ".join(shown.stdout.split()), shown.stdout


def test_the_missing_tensorrt_library_is_named():
    assert "libnvinfer.so.10" in (tensorrt_library_problem() or "libnvinfer.so.10 loads")


def test_a_provider_the_session_got_but_gave_no_node_is_not_where_it_runs(cnn_package):
    """The CPU build's Azure provider loads and takes nothing of a CNN: ``get_providers`` lists it,
    the session's node placement (what the runtime reports) does not."""
    azure = "AzureExecutionProvider"
    if azure not in onnxruntime.get_available_providers():
        pytest.skip(f"this onnxruntime build has no {azure} to register beside the CPU provider")
    with Package.open(cnn_package) as pkg:
        model = pkg.path_of(pkg.manifest.base_onnx())
    opened = open_session(model, onnxruntime.SessionOptions(), [azure, CPU])
    assert opened.lost is None and opened.session.get_providers() == [azure, CPU]
    placement = node_placement(opened.session)
    assert list(placement) == [CPU]
    assert {op for op, _ in placement[CPU]} >= {"Gemm"}, placement  # the CNN's classifier, at least
    assert nodes_left_to_cpu(placement) is None  # no GPU provider runs any of it


def test_nodes_a_gpu_session_leaves_to_the_cpu_are_counted_by_operator():
    placement = {
        CUDA: [("Conv", "c1"), ("Conv", "c2"), ("Relu", "r")],
        CPU: [("DynamicQuantizeLinear", "q1"), ("ConvInteger", "ci"), ("DynamicQuantizeLinear", "q2")],
    }
    assert nodes_left_to_cpu(placement) == "3 of 6 nodes: 1 ConvInteger, 2 DynamicQuantizeLinear"
    assert nodes_left_to_cpu({CUDA: placement[CUDA]}) is None


def test_the_runtime_reports_the_providers_that_run_its_nodes(cnn_package):
    with Package.open(cnn_package) as pkg:
        artifact, engine = open_runtime(pkg)
        with engine:
            ran = what_ran(artifact, engine)
            assert engine.placement == node_placement(engine.session)
    assert ran["providers"] == [CPU] and "cpu_nodes" not in ran
