"""``--target gpu``: add a TensorRT artifact per precision to a package, atomically.

Each artifact is a recipe (``runtimes/tensorrt/spec.py``) over an ONNX artifact of the package:
the fp32 one, or for int8 the symmetric QDQ one when there is one. Everything that can be checked
without a GPU is checked here, so a package that exports is one that builds: the profiles against
the signature, the int8 route, the calibration data against the profile.

Where this machine can run TensorRT, the engines are built now, checked against the reference
outputs, and shipped in the package (``artifacts/engines/``) for GPUs of the same model. Elsewhere
the check is deferred to the serving GPU, with the tolerance it will be held to written down now.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from unideploy.errors import InputError
from unideploy.gpu.precision import PRECISIONS, BuildPlan, plan_build
from unideploy.package import Artifact, Manifest, Package, PlannedArtifact
from unideploy.package.files import digest_path, scratch_dir
from unideploy.package.manifest import Tolerance, ValidationRecord
from unideploy.package.writer import AddedArtifact, extend_package
from unideploy.runtimes import RUNTIMES, RuntimeOptions
from unideploy.runtimes.selection import cpu_reference
from unideploy.runtimes.tensorrt.profiles import build_profiles
from unideploy.runtimes.tensorrt.spec import SPEC_SUFFIX, EngineSpec
from unideploy.validation import (
    DEFAULT_ATOL,
    DEFAULT_RTOL,
    TEN_BIT_RELATIVE,
    reduced_precision,
    require_passed,
    times_its_errors,
    validate,
)

Progress = Callable[[str], None]
ARTIFACTS = PurePosixPath("artifacts")
CALIBRATION_FILE = "tensorrt-calibration.npz"
MAX_CALIBRATION_ROWS = 512  # TensorRT's guidance: a few hundred representative inputs
CALIBRATED_INT8_RELATIVE = 0.1  # int8 from TensorRT's calibrator, which no accuracy budget guards


@dataclass(frozen=True)
class GpuRequest:
    precisions: tuple[str, ...] = ("fp16",)
    profiles: list[str] = field(default_factory=list)  # --trt-profile NAME:MIN,OPT,MAX
    workspace_mib: int | None = None
    calibration: str | Path | None = None  # for int8 without a symmetric QDQ artifact


def engine_tolerance(plan: BuildPlan, manifest: Manifest, references: list[tuple[dict, dict]]) -> Tolerance:
    """The tolerance an engine is held to against the source model, at export or on the serving
    GPU: what its precision can keep, on the scale of this model's outputs."""
    if plan.precision == "fp32":
        return times_its_errors(
            manifest.validation.get(plan.artifact.id),
            10,
            "fp32: the default tolerance, or 10x an output's own error on the ONNX artifact",
        )
    if plan.precision == "fp16":
        return reduced_precision(
            references, TEN_BIT_RELATIVE, f"fp16: {TEN_BIT_RELATIVE:.0%} of each output's largest reference value"
        )
    if not plan.calibrate:
        qdq = manifest.validation.get(plan.artifact.id)
        return {
            "atol": 2 * (qdq["atol"] if qdq else DEFAULT_ATOL),
            "rtol": 2 * (qdq["rtol"] if qdq else DEFAULT_RTOL),
            "tolerance_basis": f"explicit int8: twice the tolerance of '{plan.artifact.id}' on ONNX Runtime",
        }
    return reduced_precision(
        references,
        CALIBRATED_INT8_RELATIVE,
        f"calibrated int8: {CALIBRATED_INT8_RELATIVE:.0%} of each output's largest reference value "
        "(no accuracy budget; export with --int8-variant symmetric for one)",
    )


def _calibration_file(path: str | Path, package: Package, artifact: Artifact, work: Path) -> Path:
    """The rows TensorRT's calibrator reads (a streaming model's stream, each row with the state
    ``artifact`` carries to it on ONNX Runtime's CPU provider)."""
    from unideploy.guard.data import carrying_state, load_dataset

    signature = package.manifest.signature
    dataset = load_dataset(path, signature).take(0, MAX_CALIBRATION_ROWS)
    if dataset.stream_starts is not None:
        with cpu_reference(package.path_of(artifact), signature) as fp32:
            dataset = carrying_state(dataset, fp32.run, signature)
    out = work / CALIBRATION_FILE
    with open(out, "wb") as fh:
        np.savez(fh, **dataset.inputs)  # type: ignore[arg-type]  # numpy stub: **arrays read as allow_pickle
    return out


def _stage_recipe(
    package: Package, plan: BuildPlan, request: GpuRequest, profiles: list, work: Path, calibration: Path | None
) -> tuple[EngineSpec, Path]:
    """Write the recipe into ``work/artifacts`` beside a link to its ONNX, as it will lie in the
    package, so the same files serve the checks here, the build here and the package; return it
    and its path."""
    folder = work / ARTIFACTS
    folder.mkdir(exist_ok=True)
    onnx_name = PurePosixPath(plan.artifact.path).relative_to(ARTIFACTS).as_posix()
    if not (folder / onnx_name).exists():
        os.symlink(package.path_of(plan.artifact), folder / onnx_name)
    if calibration is not None and not (folder / CALIBRATION_FILE).exists():
        os.symlink(calibration, folder / CALIBRATION_FILE)
    spec = EngineSpec(
        onnx=onnx_name,
        onnx_sha256=plan.artifact.sha256,
        precision=plan.precision,
        profiles=tuple(profiles),
        int8=("calibrated" if plan.calibrate else "explicit") if plan.precision == "int8" else None,
        workspace_mib=request.workspace_mib,
        calibration=CALIBRATION_FILE if plan.calibrate else None,
        calibration_sha256=digest_path(calibration)[0] if plan.calibrate and calibration else None,
        engines=f"engines/tensorrt-{plan.precision}",
        root=folder,
    )
    path = spec.write(folder / f"tensorrt-{plan.precision}{SPEC_SUFFIX}")
    spec.check()
    if plan.calibrate:
        from unideploy.runtimes.tensorrt.build import calibration_batches

        calibration_batches(spec)  # enough rows for one batch of the profile, or a clear error now
    return spec, path


def build_gpu(
    package_path: str | Path,
    output: str | Path,
    request: GpuRequest | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> Path:
    """Write ``output``: the package with its TensorRT artifacts first, so that a GPU machine
    serves them and any other machine passes over them to the ONNX artifact."""
    request = request or GpuRequest()
    say = progress or (lambda _msg: None)
    unknown = [p for p in request.precisions if p not in PRECISIONS]
    if unknown or not request.precisions:
        raise InputError(f"unknown TensorRT precision(s) {unknown}", f"use {', '.join(PRECISIONS)}")
    if request.workspace_mib is not None and request.workspace_mib < 1:
        raise InputError("--trt-workspace must be at least 1 MiB")
    tensorrt = RUNTIMES.get("tensorrt")
    found = tensorrt.availability()
    with Package.open(package_path) as package, scratch_dir("unideploy-gpu-") as tmp:
        work, manifest = Path(tmp), package.manifest
        profiles = build_profiles(manifest.signature, request.profiles)
        references = package.reference_pairs()
        calibration = None
        added: list[AddedArtifact] = []
        for precision in dict.fromkeys(request.precisions):
            plan = plan_build(manifest, precision, package.path_of, request.calibration is not None)
            say(f"TensorRT {precision}: {plan.reason}")
            if plan.calibrate and calibration is None:
                assert request.calibration is not None  # plan_build calibrates only when there is data
                calibration = _calibration_file(request.calibration, package, plan.artifact, work)
            spec, spec_path = _stage_recipe(package, plan, request, profiles, work, calibration)
            tolerance = engine_tolerance(plan, manifest, references)
            companions: dict[str, Path] = (
                {f"{ARTIFACTS}/{CALIBRATION_FILE}": calibration} if calibration and spec.calibration else {}
            )
            record: ValidationRecord
            if found.ok:
                say(f"building and checking the TensorRT {precision} engine on this GPU")
                cache = work / "engines" / precision
                with tensorrt(spec_path, manifest.signature, RuntimeOptions(device="gpu", engine_cache=cache)) as trt:
                    record = validate(
                        trt.run,
                        references,
                        tolerance["atol"],
                        tolerance["rtol"],
                        manifest.source["framework"],
                        tolerance.get("output_atol"),
                    )
                record["tolerance_basis"] = tolerance["tolerance_basis"]
                require_passed(record, f"the TensorRT {precision} engine")
                companions.update(
                    {
                        f"{ARTIFACTS}/{spec.engines}/{f.name}": f
                        for f in sorted(cache.glob("*.*"))
                        if f.suffix in (".plan", ".json")
                    }
                )
            else:
                record = {
                    "deferred": f"TensorRT cannot run where the package was made ({found.detail}); the engine "
                    "is built and checked on the serving GPU ('deploy verify --device gpu')",
                    **tolerance,
                }
            added.append(
                (
                    PlannedArtifact(
                        f"tensorrt-{precision}",
                        f"{ARTIFACTS}/{spec_path.name}",
                        "tensorrt",
                        plan.precision,
                        ["tensorrt", "onnxruntime"],
                        derived_from=plan.artifact.id,
                        targets=["gpu"],
                    ),
                    spec_path,
                    companions,
                    record,
                )
            )

        say("writing the package")
        return extend_package(package, package_path, output, added, overwrite, first=True)


def target_stage(
    package: Path,
    output: Path,
    options: Mapping[str, Any],
    *,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> Path:
    """``--target gpu`` (targets.py): TensorRT recipes from ``trt_precision`` (default fp16),
    ``trt_profile``, ``trt_workspace`` and ``calibration``."""
    request = GpuRequest(
        tuple(options.get("trt_precision") or ("fp16",)),
        list(options.get("trt_profile") or []),
        options.get("trt_workspace"),
        options.get("calibration"),
    )
    return build_gpu(package, output, request, overwrite=overwrite, progress=progress)
