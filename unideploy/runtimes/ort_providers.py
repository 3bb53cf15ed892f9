"""Which ONNX Runtime execution providers a session asks for, with which options, and which it got.

ONNX Runtime never fails when a provider it was asked for cannot load: its Python layer prints an
"EP Error" block and retries on the providers that remain, and a CPU-only build warns and runs on
the CPU. So what a session was asked for says nothing about where it runs; ``open_session``
reads the providers the session actually got and says why any were lost, and the runtime decides
from that (a TensorRT recipe without TensorRT is not run as something else; ``--device gpu`` is
never answered from the CPU). Where a session runs is read per node (``node_placement``): a provider it got may
take none of the model's nodes, and a GPU session leaves the nodes its provider has no kernel for
(ONNX Runtime's dynamic INT8, shape arithmetic) to the CPU, which the runtime reports.
"""

from __future__ import annotations

import contextlib
import io
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unideploy.errors import MissingDependencyError, RefusedValues, RunOutOfMemory, RuntimeFailure, first_line
from unideploy.runtimes.tensorrt.profiles import shape_text
from unideploy.runtimes.tensorrt.spec import EngineSpec

TENSORRT = "TensorrtExecutionProvider"
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
GPU_PROVIDERS = (TENSORRT, CUDA)

Provider = str | tuple[str, dict[str, Any]]
# Set on every session (open_session): ONNX Runtime records which provider runs each node only
# when asked (its session API since 1.24).
ASSIGNMENT_INFO = "session.record_ep_graph_assignment_info"


def cuda_options(precision: str, tf32: bool) -> dict[str, str]:
    """The CUDA provider's options for an ONNX artifact of ``precision``.

    fp32 runs in fp32: the provider's own default (``use_tf32=1``) computes convolutions and
    matmuls in TF32, which moved EfficientNet-Lite0's logits by 0.0128 from the CPU's (7.9e-06 with
    TF32 off, H200), so a correct package failed ``deploy verify --device gpu``. TF32 is a
    precision the user asks for (``tf32``), and is then named and judged as such. fp16 keeps the
    provider's layout: cuDNN's NHWC kernels (``prefer_nhwc``) measured no faster for it on the H200
    (5.60 against 5.46 ms at batch 32, docs/gpu.md)."""
    return {"use_tf32": "1" if tf32 and precision == "fp32" else "0"}


def tensorrt_options(spec: EngineSpec, cache_dir: Path) -> dict[str, Any]:
    """The recipe as options of ORT's TensorRT provider, whose engines are cached per GPU by ORT."""

    def shapes(which: str) -> str:
        return ",".join(f"{p.name}:{shape_text(getattr(p, which))}" for p in spec.profiles)

    options: dict[str, Any] = {
        "trt_fp16_enable": spec.precision in ("fp16", "int8"),
        "trt_int8_enable": spec.precision == "int8",
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": str(cache_dir),
        "trt_timing_cache_enable": True,
        "trt_timing_cache_path": str(cache_dir),
    }
    if spec.profiles:
        options.update(
            trt_profile_min_shapes=shapes("min"),
            trt_profile_opt_shapes=shapes("opt"),
            trt_profile_max_shapes=shapes("max"),
        )
    if spec.workspace_mib:
        options["trt_max_workspace_size"] = spec.workspace_mib << 20
    return options


def onnx_providers(device: str, available: list[str], precision: str, tf32: bool) -> list[Provider]:
    """Providers for a plain ONNX artifact: the CUDA provider when asked for or present, then the
    CPU. Never TensorRT: a package reaches TensorRT through its recipe (``--target gpu``), whose
    profiles and precision the TensorRT provider needs; asked for bare, it built an engine per
    input shape or, where it could not load, printed its error for every session."""
    if device == "cpu":
        return [CPU]
    if device == "gpu" and CUDA not in available:
        raise MissingDependencyError(
            f"no GPU execution provider in this onnxruntime build (available: {', '.join(available)})",
            "pip install onnxruntime-gpu on a machine with a CUDA GPU, or run on the CPU (--device cpu; device: cpu in model.yaml)",
        )
    return [(CUDA, cuda_options(precision, tf32)), CPU] if CUDA in available else [CPU]


def recipe_providers(spec: EngineSpec, device: str, available: list[str], cache_dir: Path) -> list[Provider]:
    """Providers for a TensorRT recipe: ORT's TensorRT provider or nothing, since the recipe's
    precision and profiles mean TensorRT; run on the CUDA provider it would be an fp32 model
    labelled with a precision it never ran in. The CUDA provider takes what TensorRT leaves, the
    CPU the rest."""
    if device == "cpu":
        raise MissingDependencyError(
            "a TensorRT artifact runs on GPUs, and the CPU was asked for",
            "run the onnx-fp32 artifact on the CPU (--artifact onnx-fp32)",
        )
    if spec.int8 == "calibrated":
        raise MissingDependencyError(
            "this int8 recipe is calibrated by TensorRT itself when its engine is built, which ONNX Runtime cannot do",
            "install TensorRT, or export with --int8-variant symmetric for explicit int8",
        )
    if TENSORRT not in available:
        raise MissingDependencyError(
            "a TensorRT artifact needs the TensorRT runtime or ONNX Runtime's TensorRT provider, and neither "
            f"is usable here (onnxruntime providers: {', '.join(available)})",
            "'deploy doctor' says what is missing; without --artifact the package's ONNX artifacts run instead",
        )
    cuda = [(CUDA, cuda_options("fp32", False))] if CUDA in available else []
    return [(TENSORRT, tensorrt_options(spec, cache_dir)), *cuda, CPU]


def provider_names(providers: list[Provider]) -> list[str]:
    return [p if isinstance(p, str) else p[0] for p in providers]


_ORT_NOISE = (
    re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : "),
    re.compile(r"^Load model from .*? failed:"),
    re.compile(r"^\S+\.(?:cc|h):\d+ (?:\S+ )?[\w:~<>]+\(.*?\) "),  # C++ file:line and signature
)


def ort_message(exc: BaseException) -> str:
    """ORT's error text without its status prefix, model path and C++ source location."""
    return _without_noise(first_line(exc, limit=2000))[:400]


def run_failure(exc: BaseException, inputs: Mapping[str, Any], arena_limit: int | None = None) -> RuntimeFailure:
    """A session run's error on ``inputs`` as ours. Their names, dtypes and shapes have passed the
    signature's checks, so ONNX Runtime's INVALID_ARGUMENT from a run is a kernel's check on their
    values (a Gather's index past its table: a token id past the vocabulary): ``RefusedValues``,
    the request's to fix. A block its arena could not give within ``arena_limit`` (the server's
    --max-run-memory) is ``RunOutOfMemory``. Anything else is the runtime's failure, named with the
    shapes it ran on: a signature that leaves a size open may still be given one the model cannot
    compute (a detector's Concat of feature maps from an image whose sides are no multiple of 32)."""
    from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

    if isinstance(exc, InvalidArgument):
        return RefusedValues(f"the model refused the input values: {ort_message(exc)}")
    shapes = ", ".join(f"{name} {list(value.shape)}" for name, value in inputs.items())
    if arena_limit is not None and (short := _ARENA_SHORT.search(str(exc))):
        left, asked = (int(n) for n in short.groups())
        return RunOutOfMemory(
            f"the model's run on inputs of shape {shapes} needs a block of {asked} bytes, where its runs may "
            f"hold {left} bytes more (at most {arena_limit} at once: the server's --max-run-memory)",
            "send fewer rows or smaller inputs per request, or start the server with a larger --max-run-memory",
        )
    return RuntimeFailure(f"ONNX Runtime failed on inputs of shape {shapes}: {ort_message(exc)}")


_ARENA_SHORT = re.compile(
    r"BFCArena::AllocateRawInternal.*?Available memory of (\d+) is smaller than requested bytes of (\d+)", re.S
)


def _without_noise(text: str) -> str:
    for pattern in _ORT_NOISE:
        text = pattern.sub("", text.strip()).strip()
    return text


@dataclass(frozen=True)
class Opened:
    """A session, and why a provider it asked for is not in it (None: it got every one)."""

    session: Any
    lost: str | None


_EP_ERROR = re.compile(r"^EP Error (.*?) when using \[", re.S | re.M)


def open_session(model: Path, session_options: Any | None, providers: list[Provider]) -> Opened:
    """Create the session, keeping ONNX Runtime's fallback text to ourselves: what it printed or
    warned becomes the one reason in ``Opened.lost``. Once a GPU provider is asked for, ONNX
    Runtime's own log is left at fatal errors only: its errors reach us as exceptions, worded by
    us, and its cuDNN frontend logs an error line for each convolution it found no plan for (36
    lines verifying one fp16 EfficientNet-Lite0, H200) while the run succeeds on another kernel."""
    import onnxruntime as ort

    printed = io.StringIO()
    session_options = session_options or ort.SessionOptions()
    session_options.add_session_config_entry(ASSIGNMENT_INFO, "1")
    gpu = any(name in GPU_PROVIDERS for name in provider_names(providers))
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(printed):
        warnings.simplefilter("always")
        if gpu:
            ort.set_default_logger_severity(4)
        session = ort.InferenceSession(str(model), session_options, providers=providers)
    session.disable_fallback()  # a failing run raises rather than quietly moving to the CPU
    got = set(session.get_providers())
    lost = [name for name in provider_names(providers) if name not in got]
    if not lost:
        return Opened(session, None)
    # what ONNX Runtime said: its fallback's "EP Error" text, or the warning a build without the
    # provider gives (it then runs on the CPU)
    said = [_without_noise(m.group(1)) for m in _EP_ERROR.finditer(printed.getvalue())]
    said += [str(w.message) for w in caught if any(name in str(w.message) for name in lost)]
    if TENSORRT in lost:
        said.append(tensorrt_library_problem() or "")
    why = " ".join(" ".join(said).split())[:400] or "ONNX Runtime gave no reason"
    return Opened(session, f"{' and '.join(lost)} did not load ({why})")


def node_placement(session: Any) -> dict[str, list[tuple[str, str]]]:
    """Provider -> the nodes it runs, as (operator, node name), after ONNX Runtime's graph rewrites
    (a fused node counts once, as its fused operator), in the session's provider order. A provider
    the session got but gave no node is absent: it runs nothing of this model."""
    found: dict[str, list[tuple[str, str]]] = {}
    for subgraph in session.get_provider_graph_assignment_info():
        found.setdefault(subgraph.ep_name, []).extend((n.op_type, n.name) for n in subgraph.get_nodes())
    return {name: found[name] for name in session.get_providers() if name in found}


def nodes_left_to_cpu(placement: dict[str, list[tuple[str, str]]]) -> str | None:
    """Where a GPU provider runs the model: how many of its nodes the CPU provider runs, by
    operator (each costs copies between the devices and a CUDA graph cannot hold them), or None."""
    if CPU not in placement or not set(placement) & set(GPU_PROVIDERS):
        return None
    on_cpu = [op for op, _ in placement[CPU]]
    total = sum(len(nodes) for nodes in placement.values())
    return f"{len(on_cpu)} of {total} nodes: " + ", ".join(f"{on_cpu.count(op)} {op}" for op in sorted(set(on_cpu)))


TENSORRT_LIBRARY = "libnvinfer.so.10"  # what ONNX Runtime 1.31's TensorRT provider links


def tensorrt_library_problem() -> str | None:
    """Why TensorRT's library does not load here (the dynamic loader's words, naming the file),
    or None when it does: ONNX Runtime's own message names no library."""
    import ctypes

    try:
        ctypes.CDLL(TENSORRT_LIBRARY)
    except OSError as exc:
        return str(exc)
    return None
