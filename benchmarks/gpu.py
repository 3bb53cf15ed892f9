"""GPU engines against ONNX Runtime: TensorRT fp32/fp16/int8 and ORT CUDA, relative to ORT on the CPU.

(a) a ResNet-18-shaped CNN at 1x3x224x224 (random weights: latency does not depend on them);
(b) MiniLM-L6 sentence embeddings (seq 128; quality: cosine of each engine's embeddings to ONNX
    fp32 on the CPU, on real sentences).

Each model goes through the real pipeline (TorchScript -> ``unideploy.export --target gpu`` with
fp32, fp16 and int8 recipes; int8 calibrated by TensorRT on half of the inputs), then every engine
is opened on its runtime and timed in one process, taking turns, at batch 1 and 32. On a machine
without TensorRT or a CUDA provider it says so and exits 0: nothing here can be measured on a CPU.

    python benchmarks/gpu.py [--only cnn|minilm] [--json] [--markdown]
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import report
from bench_models import imagenet_cnn_torchscript, minilm_torchscript
from rich.console import Console

import unideploy
from unideploy.errors import MissingDependencyError
from unideploy.optimizers.measure import interleaved_latency
from unideploy.runtimes import RUNTIMES, Runtime, RuntimeOptions
from unideploy.runtimes.onnxruntime_runtime import GPU_PROVIDERS

console = Console(stderr=True)
BATCHES = (1, 32)


class _Timed:
    """A runtime behind the ``run(None, inputs)`` call the latency helper makes."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def run(self, _names: Any, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        return list(self.runtime.run(inputs).values())


def gpu_paths() -> tuple[bool, bool, str]:
    """Whether TensorRT and ORT's CUDA provider are usable here, and why not."""
    import onnxruntime

    found = RUNTIMES.get("tensorrt").availability()
    cuda = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    why = f"TensorRT: {found.detail}; onnxruntime GPU providers: " + (
        ", ".join(p for p in GPU_PROVIDERS if p in onnxruntime.get_available_providers()) or "none"
    )
    return found.ok, cuda, why


def _measure(
    package_path: Path, sample: dict[str, np.ndarray], work: Path, quality: Callable[[Runtime], float]
) -> list[dict[str, Any]]:
    has_trt, has_cuda, _ = gpu_paths()
    with unideploy.open_package(package_path) as package:
        m = package.manifest
        onnx = package.path_of("onnx-fp32")
        engines: dict[str, Runtime] = {
            "ort-cpu": RUNTIMES.get("onnxruntime")(onnx, m.signature, RuntimeOptions(device="cpu", spin="never"))
        }
        if has_cuda:
            engines["ort-cuda"] = RUNTIMES.get("onnxruntime")(onnx, m.signature, RuntimeOptions(device="gpu"))
        for artifact in (a for a in m.artifacts if a.format == "tensorrt"):
            runtime = "tensorrt" if has_trt else "onnxruntime"  # without TensorRT: ORT's TensorRT provider
            console.log(f"loading {artifact.id} on {runtime} (builds the engine on first use)")
            try:
                engines[artifact.id] = RUNTIMES.get(runtime)(
                    package.path_of(artifact), m.signature, RuntimeOptions(device="gpu", engine_cache=work / "engines")
                )
            except MissingDependencyError as exc:  # calibrated int8 needs TensorRT itself
                console.log(f"{artifact.id} not measured: {exc}")
        console.log(f"timing {', '.join(engines)} at batch sizes {BATCHES}")
        timings = interleaved_latency(
            {k: _Timed(r) for k, r in engines.items()}, sample, BATCHES, rounds=7, max_seconds=6.0
        )
        rows = []
        for name, runtime in engines.items():
            row = {"engine": name, "runtime": runtime.name, "quality": quality(runtime)}
            for b in BATCHES:
                row[f"b{b}_ms"] = timings[b][name]
                row[f"b{b}_vs_cpu"] = round(timings[b]["ort-cpu"] / timings[b][name], 2)
                if "ort-cuda" in timings[b]:
                    row[f"b{b}_vs_cuda"] = round(timings[b]["ort-cuda"] / timings[b][name], 2)
            rows.append(row)
        for runtime in engines.values():
            runtime.close()
    return rows


def _targets(rows: list[dict[str, Any]]) -> list[tuple[str, bool, str]]:
    by = {r["engine"]: r for r in rows}
    if "tensorrt-fp16" not in by or "ort-cuda" not in by:
        return []
    speedup = by["tensorrt-fp16"][f"b{BATCHES[-1]}_vs_cuda"]
    return [(f"TensorRT fp16 faster than ORT CUDA fp32 at batch {BATCHES[-1]}", speedup > 1.0, f"{speedup}x")]


# -- (a) ResNet-18-shaped CNN -----------------------------------------------------------------------
def cnn(work: Path) -> dict[str, Any]:
    path = imagenet_cnn_torchscript(work)
    rng = np.random.default_rng(0)
    images = rng.standard_normal((128, 3, 224, 224), dtype=np.float32)
    np.savez(work / "calibration.npz", x=images[:64])
    console.log("exporting with --target gpu (fp32, fp16, int8 calibrated by TensorRT)")
    unideploy.export(
        path,
        work / "cnn.udp",
        input_shapes=["x:1x3x224x224"],
        target="gpu",
        target_options={
            "trt_precision": ("fp32", "fp16", "int8"),
            "trt_profile": ["x:1x3x224x224,8x3x224x224,32x3x224x224"],
            "calibration": work / "calibration.npz",
        },
    ).close()
    held_out = {"x": images[64:96]}
    with unideploy.open_package(work / "cnn.udp") as package:
        reference = unideploy.run(package, held_out, artifact="onnx-fp32", device="cpu")["output"]

    def top1(runtime: Runtime) -> float:
        return round(float((runtime.run(held_out)["output"].argmax(1) == reference.argmax(1)).mean() * 100), 1)

    rows = _measure(work / "cnn.udp", {"x": images[:1]}, work, top1)
    return {
        "model": "ResNet-18-shaped CNN, 1x3x224x224",
        "quality": "top-1 agreement with fp32 %",
        "rows": rows,
        "targets": _targets(rows),
        "note": "random weights: agreement, not accuracy",
    }


# -- (b) MiniLM-L6 ----------------------------------------------------------------------------------
def minilm(work: Path) -> dict[str, Any]:
    model_path, arrays = minilm_torchscript(work, count=400)
    cut = len(arrays["input_ids"]) // 2
    np.savez(work / "calibration.npz", **{k: v[:cut] for k, v in arrays.items()})
    validation = {k: v[cut : cut + 32] for k, v in arrays.items()}
    profile = ",".join(f"{b}x128" for b in (1, 8, 32))
    console.log("exporting with --target gpu (fp32, fp16, int8 calibrated by TensorRT)")
    unideploy.export(
        model_path,
        work / "minilm.udp",
        example_inputs={k: v[:4] for k, v in arrays.items()},
        target="gpu",
        target_options={
            "trt_precision": ("fp32", "fp16", "int8"),
            "trt_profile": [f"{name}:{profile}" for name in arrays],
            "calibration": work / "calibration.npz",
        },
    ).close()
    with unideploy.open_package(work / "minilm.udp") as package:
        reference = next(iter(unideploy.run(package, validation, artifact="onnx-fp32", device="cpu").values()))

    def cosine(runtime: Runtime) -> float:
        out = next(iter(runtime.run(validation).values()))
        cos = (out * reference).sum(1) / (np.linalg.norm(out, axis=1) * np.linalg.norm(reference, axis=1))
        return round(float(cos.mean()), 5)

    rows = _measure(work / "minilm.udp", {k: v[:1] for k, v in validation.items()}, work, cosine)
    return {
        "model": "MiniLM-L6 sentence embeddings (seq 128)",
        "quality": "mean cosine to ONNX fp32",
        "rows": rows,
        "targets": _targets(rows),
        "note": None,
    }


if __name__ == "__main__":
    has_trt, has_cuda, why = gpu_paths()
    if not (has_trt or has_cuda):
        print(f"benchmarks/gpu.py: skipped, no GPU path on this machine ({why})")
        sys.exit(0)
    report.main(__doc__.splitlines()[0], {"cnn": cnn, "minilm": minilm})
