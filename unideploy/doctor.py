"""What works on this machine, and for what does not, why and the command that fixes it."""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass

from unideploy.exporters import EXPORTERS
from unideploy.guard.metrics import METRICS
from unideploy.optimizers import PASSES
from unideploy.options import PluginOptions, flag
from unideploy.runtimes import RUNTIMES
from unideploy.server import availability as server_availability
from unideploy.targets import BROKEN_TARGETS, TARGETS


@dataclass
class Finding:
    kind: str  # exporter, optimizer, metric, runtime, device, target, server, web
    name: str
    ok: bool
    detail: str
    fix: str | None = None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


REINSTALL = "reinstall the package that provides it, or uninstall it"


def diagnose() -> list[Finding]:
    """A finding per plug-in of every kind. A plug-in that does not load is a finding too (with the
    error), never the end of the report: every other command leaves it out the same way."""
    findings = []
    for kind, registry in (("exporter", EXPORTERS), ("optimizer", PASSES), ("metric", METRICS), ("runtime", RUNTIMES)):
        for name, cls in registry:
            found = cls.availability()
            options = _options(getattr(cls, "options", None))
            findings.append(Finding(kind, name, found.ok, found.detail + options, found.fix))
        findings += [Finding(kind, name, False, exc.message, REINSTALL) for name, exc in registry.broken().items()]
    findings.append(_gpu_finding())
    found = server_availability()
    findings.append(Finding("server", "serve", found.ok, found.detail, found.fix))
    for target in TARGETS.values():
        missing = target.missing()
        if missing:
            detail = f"{target.description}: needs {', '.join(missing)}"
            findings.append(Finding("target", target.name, False, detail, target.install_hint()))
        else:
            serving = f" (serving: {target.serving})" if target.serving else ""
            options = _options(target.options_model())
            findings.append(
                Finding(
                    "target", target.name, True, target.description + _runs_elsewhere(target.name) + serving + options
                )
            )
    findings += [Finding("target", name, False, why, REINSTALL) for name, why in BROKEN_TARGETS.items()]
    return findings + _web_findings()


def _web_findings() -> list[Finding]:
    """deploy bundle --platform web needs npm once per ONNX Runtime Web version; deploy verify on a
    site needs Playwright and a Chromium."""
    from unideploy.web.browser import browser_availability
    from unideploy.web.runtime import npm_availability

    built, opened = npm_availability(), browser_availability()
    return [
        Finding("web", "bundle", built.ok, "deploy bundle --platform web: " + built.detail, built.fix),
        Finding("web", "verify", opened.ok, "deploy verify SITE (headless Chromium): " + opened.detail, opened.fix),
    ]


def _options(model: type[PluginOptions] | None) -> str:
    """'; options: --a, --b' for a plug-in that declares options."""
    if model is None or not model.model_fields:
        return ""
    return "; options: " + ", ".join(flag(n, f.default) for n, f in model.model_fields.items())


def _gpu_finding() -> Finding:
    """A GPU is usable by ONNX Runtime when its CUDA provider loads: a build that lists it can
    still lack the CUDA or cuDNN libraries, and then every session quietly runs on the CPU. So a
    one-node model is opened on each GPU provider the build lists, and what loaded is reported."""
    import onnxruntime

    from unideploy.runtimes import cuda_api
    from unideploy.runtimes.cuda_devices import find_gpus
    from unideploy.runtimes.ort_providers import CUDA, GPU_PROVIDERS, TENSORRT

    gpus, detail = find_gpus()
    listed = [p for p in GPU_PROVIDERS if p in onnxruntime.get_available_providers()]
    if not listed:
        if gpus:
            return Finding(
                "device",
                "gpu",
                False,
                f"{detail}, but this onnxruntime build is CPU-only",
                "pip uninstall -y onnxruntime && pip install onnxruntime-gpu",
            )
        return Finding("device", "gpu", False, detail, "run on a machine with an NVIDIA GPU and its driver")
    lost = {p: provider_problem(p) for p in listed}
    said = "; ".join(f"{p}: " + (why or "loads") for p, why in lost.items())
    if lost.get(CUDA) is None and CUDA in lost:
        tensorrt = (
            " (TensorRT recipes need TensorRT 10 for ONNX Runtime's TensorRT provider: NVIDIA's index)"
            if lost.get(TENSORRT)
            else ""
        )
        # deploy serve page-locks merged batches (runtimes/pinned.py) and maps clients' GPU memory
        # (--shared-memory cuda) through the same CUDA runtime
        why_not = cuda_api.problem()
        served = (
            f"; merged batches stay pageable and --shared-memory cuda is refused: {why_not}"
            if why_not
            else "; merged batches are page-locked, and --shared-memory cuda is available"
        )
        return Finding("device", "gpu", True, f"{said}; {detail}{tensorrt}{served}")
    return Finding(
        "device",
        "gpu",
        False,
        f"{said}; {detail}",
        "install the CUDA and cuDNN libraries onnxruntime-gpu was built for (docs/gpu.md)",
    )


def provider_problem(provider: str) -> str | None:
    """Why ``provider`` does not load a one-node model here, or None when it does."""
    import tempfile
    from pathlib import Path

    import onnx
    from onnx import TensorProto, helper

    from unideploy.runtimes.ort_providers import open_session

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe", [x], [y])
    # IR 8, which any ONNX Runtime reads (onnx 1.23 writes IR 14 by default; ONNX Runtime 1.31 reads up to 13)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "probe.onnx"
        onnx.save(model, str(path))
        return open_session(path, None, [provider, "CPUExecutionProvider"]).lost


def _runs_elsewhere(target: str) -> str:
    """The GPU target's packages are made anywhere, but their engines need TensorRT and a GPU."""
    if target != "gpu" or RUNTIMES.get("tensorrt").availability().ok:
        return ""
    return (
        " (packages can be made here; TensorRT is not usable here, so engines are built and checked on the serving GPU)"
    )


def machine_summary() -> str:
    return f"Python {platform.python_version()} on {platform.system()} {platform.machine()}"
