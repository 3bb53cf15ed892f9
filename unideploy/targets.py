"""Deployment targets: which artifacts a package needs for where it will run.

A target describes itself: the runtimes that serve it, the stage that adds its artifacts to an
exported package (``"module:function"``, imported only when that target is asked for) and the
export options that belong to it (``"module:Model"``, a ``PluginOptions`` model: the CLI's flags
and the Python API's checks come from it). The pipeline (``pipeline.py``), ``deploy doctor`` and the CLI
iterate over ``TARGETS``, so a package adds a target through the ``unideploy.targets`` entry
points (a ``Target`` object) with no core file edited. A target whose stage needs a module that is
not installed is refused up front, before any work, with the install command.

A stage is called as ``stage(package, output, options, overwrite=..., progress=...)`` with
``options`` the target's options by name, checked against its model, plus ``calibration`` and
``accuracy`` (the guard's budget and metric, ``guard.settings_of``), and returns the package it wrote.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from unideploy.errors import InputError, MissingDependencyError, UnideployError
from unideploy.options import PluginOptions, flag
from unideploy.registry import missing_modules

Stage = Callable[..., Path]
GROUP = "unideploy.targets"


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    runtimes: tuple[str, ...]
    stage: str | None = None  # "module:function" adding this target's artifacts; None: the export alone
    options: str | None = None  # "module:Model", the PluginOptions of this target alone; None: none
    requires: tuple[str, ...] = ()  # modules the stage imports (checked before any work)
    extra: str | None = None  # the unideploy extra that installs them
    serving: str = ""  # what the machine that serves the target's artifacts needs, for deploy doctor
    install: str = ""  # the install command, where the extra alone does not install everything the stage uses

    def missing(self) -> list[str]:
        """The modules this target's stage needs that are not installed here."""
        return missing_modules(self.requires)

    def install_hint(self) -> str:
        if self.install:
            return self.install
        return f"pip install 'unideploy[{self.extra}]'" if self.extra else f"pip install {' '.join(self.missing())}"

    def options_model(self) -> type[PluginOptions] | None:
        if self.options is None:
            return None
        module, _, attr = self.options.partition(":")
        try:
            model: type[PluginOptions] = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise UnideployError(
                f"the options of target '{self.name}' ({self.options}) cannot be loaded: {exc}"
            ) from exc
        return model

    def load_stage(self) -> Stage | None:
        if self.stage is None:
            return None
        module, _, attr = self.stage.partition(":")
        try:
            stage: Stage = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise UnideployError(f"the stage of target '{self.name}' ({self.stage}) cannot be loaded: {exc}") from exc
        return stage


# onnx2tf pins an old stack (numpy 1.26, protobuf 4, tensorflow 2.19): its own dependencies come
# from the edge extra at current versions, and onnx2tf itself without them.
EDGE_INSTALL = "pip install 'unideploy[edge]' && pip install --no-deps 'onnx2tf==1.29.24'"

BUILTIN = (
    Target("cpu", "ONNX artifact for ONNX Runtime on CPU servers", ("onnxruntime",)),
    Target(
        "gpu",
        "TensorRT engine recipes (fp16/int8/fp32), built and cached per GPU (TensorRT, or ONNX "
        "Runtime's TensorRT provider); without TensorRT the ONNX artifacts run on ONNX Runtime's CUDA provider",
        ("tensorrt", "onnxruntime"),
        stage="unideploy.gpu.build:target_stage",
        options="unideploy.gpu.options:GpuOptions",
    ),
    Target(
        "edge",
        "ORT-mobile and TFLite (fp32, fp16, int8) artifacts for phones and edge boxes",
        ("tflite", "onnxruntime"),
        stage="unideploy.edge.build:target_stage",
        # LiteRT checks every TFLite artifact and TensorFlow's converter writes them, from any source;
        # onnx2tf is needed only from ONNX and says so when it is missing
        requires=("ai_edge_litert", "tensorflow"),
        extra="edge",
        install=EDGE_INSTALL,
    ),
    Target(
        "ascend",
        "MindIR rebuilt through MindSpore (checked on its CPU) and MindSpore Lite conversion recipes for Ascend "
        "NPUs and .ms edge models",
        ("mindspore",),
        stage="unideploy.ascend.build:build_ascend",
        requires=("mindspore",),
        extra="mindspore",
        serving="an Ascend machine with CANN and MindSpore Lite (mindspore_lite, converter_lite) converts and runs "
        "the recipes; the MindIR also runs through MindSpore on any CPU",
    ),
)


def _targets() -> tuple[dict[str, Target], dict[str, str]]:
    """The targets, and those entry points that do not load with why: a broken plug-in must not
    break the CLI (the same policy as the registries'); deploy doctor names it."""
    found, broken = {t.name: t for t in BUILTIN}, {}
    for ep in entry_points(group=GROUP):
        if ep.name in found:
            continue
        try:
            target = ep.load()
        except Exception as exc:
            broken[ep.name] = f"target plug-in '{ep.name}' ({ep.value}) cannot be loaded: {exc}"
            continue
        if isinstance(target, Target):
            found[ep.name] = target
        else:
            broken[ep.name] = f"target plug-in '{ep.name}' ({ep.value}) is a {type(target).__name__}, not a Target"
    return found, broken


TARGETS, BROKEN_TARGETS = _targets()


def require_target(name: str) -> Target:
    if name not in TARGETS:
        raise InputError(f"unknown target '{name}'", f"choose one of: {', '.join(sorted(TARGETS))}")
    target = TARGETS[name]
    missing = target.missing()
    if missing:
        raise MissingDependencyError(
            f"target '{name}' needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not installed",
            target.install_hint(),
        )
    return target


def check_options(target: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """``target``'s own options among ``given`` (option name -> value; None: not given), checked
    against its model; options that belong to another target are refused."""
    for other in TARGETS.values():
        model = other.options_model()
        if model is not None and other.name != target and any(given.get(o) is not None for o in model.model_fields):
            flags = ", ".join(flag(o) for o in model.model_fields)
            raise InputError(f"{flags} apply to --target {other.name} only")
    model = require_target(target).options_model()
    if model is None:
        return {}
    return dict(
        model.parse({k: v for k, v in given.items() if k in model.model_fields and v is not None}, f"--target {target}")
    )
