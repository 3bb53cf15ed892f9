"""``deploy export --target gpu`` then ``deploy verify --device gpu`` where there is a GPU: the
recipes become TensorRT engines on this GPU and every engine matches the reference outputs within
the tolerance the package recorded for it. Skipped on machines without an NVIDIA GPU and TensorRT
(CI has neither); the GPU benchmark (benchmarks/gpu.py) runs beside it there."""

from __future__ import annotations

import json

import pytest
from console import deploy

from unideploy.runtimes import RUNTIMES

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not RUNTIMES.get("tensorrt").availability().ok,
        reason="needs an NVIDIA GPU with TensorRT (docs/gpu.md); this machine has neither",
    ),
]


def test_engines_are_built_and_verified_on_the_gpu(torch_models, tmp_path):
    path, shapes = torch_models["cnn_scripted"]
    package = tmp_path / "cnn.udp"
    args = ["export", path, "-o", package, "--target", "gpu", "--trt-precision", "fp16", "--trt-precision", "fp32"]
    args += ["--trt-profile", "x:1x1x8x8,4x1x8x8,16x1x8x8"]
    for shape in shapes:
        args += ["--input-shape", shape]
    assert (result := deploy(*args)).returncode == 0, result.stderr
    result = deploy("verify", package, "--device", "gpu", "--json")
    assert result.returncode == 0, result.stderr
    checks = {c["artifact"]: c for c in json.loads(result.stdout)["artifacts"]}
    for precision in ("fp16", "fp32"):
        assert checks[f"tensorrt-{precision}"]["status"] == "passed", checks[f"tensorrt-{precision}"]
