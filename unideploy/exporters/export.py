"""The export verb: source model -> validated package, the same for every framework.

Like Optimum's ``export`` + ``validate_model_outputs``, proof is part of the verb: the package is
written only if ONNX Runtime reproduces the source framework's outputs at two batch sizes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime

import unideploy
from unideploy.errors import AccuracyBudgetError, InputError, MissingDependencyError, UntranslatableError
from unideploy.exporters import EXPORTERS, ConvertedModel, Exporter, ExportOptions, torch_save
from unideploy.exporters.source_process import EngineSpread, run_source
from unideploy.guard.guard import Guard, reference_rows, settings_of
from unideploy.package import Artifact, Manifest, PackageWriter, PlannedArtifact
from unideploy.package.files import digest_path, scratch_dir
from unideploy.package.manifest import HALF_PRECISIONS, OmittedRecord, SourceRecord, ValidationRecord
from unideploy.runtimes.selection import cpu_reference
from unideploy.samples import batch_size_of
from unideploy.signature import Signature
from unideploy.targets import require_target
from unideploy.validation import (
    DEFAULT_ATOL,
    DEFAULT_RTOL,
    TEN_BIT_RELATIVE,
    TOLERANCE_MARGIN,
    Run,
    at_least_ten_bits,
    measured_tolerance_record,
    require_passed,
    share_of_each_output,
    validate,
)

Progress = Callable[[str], None]


def find_exporter(src: Path, name: str | None = None) -> type[Exporter]:
    if name:
        return EXPORTERS.get(name)
    for _, cls in EXPORTERS:
        if cls.detect(src):
            return cls
    saved = torch_save.refusal(src)  # the most common PyTorch file: say what it is and how to convert it
    if saved is not None:
        raise saved
    raise InputError(
        f"cannot tell what kind of model '{src}' is",
        f"name the exporter with --exporter ({', '.join(EXPORTERS.names())})",
    )


def model_name_from(src: Path) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]", "-", src.stem if src.is_file() else src.name).strip("-._")
    return name or "model"


def export(
    src: str | Path,
    output: str | Path,
    *,
    name: str | None = None,
    version: str = "1",
    exporter: str | None = None,
    target: str = "cpu",
    options: ExportOptions | None = None,
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
    overwrite: bool = False,
    progress: Progress | None = None,
    accuracy: Mapping[str, Any] | None = None,
) -> Path:
    """Export ``src`` to a verified package at ``output`` (a directory, or a ``.zip``).
    ``accuracy``: the budget and metric (``guard.settings_of``) an ONNX artifact that cannot give the
    source's outputs bit for bit (a quantized source's int8 kernels) is judged with."""
    src, options = Path(src), options or ExportOptions()
    say = progress or (lambda _msg: None)
    if not src.exists():
        raise InputError(f"source model '{src}' does not exist")
    serving = require_target(target)
    exporter_cls = find_exporter(src, exporter)
    found = exporter_cls.availability()
    if not found.ok:
        raise MissingDependencyError(f"the {exporter_cls.name} exporter cannot run: {found.detail}", found.fix)

    if options.constants and not exporter_cls.binds_constants:
        raise InputError(
            f"--constant binds non-tensor forward() arguments of TorchScript and torch.export sources and settings "
            f"inputs of ONNX files; '{src.name}' is a {exporter_cls.framework} model ({exporter_cls.name})",
            "leave --constant out: this source's inputs are its tensors",
        )
    if options.native_only and not exporter_cls.native_format:
        raise InputError(
            f"--keep-native-only needs a source that runs natively (MindIR); '{src.name}' "
            f"is a {exporter_cls.framework} model",
            "export it without --keep-native-only",
        )

    with (
        PackageWriter(output, overwrite=overwrite) as writer,
        scratch_dir("unideploy-export-") as tmp,
    ):
        omitted: list[OmittedRecord] = []
        try:
            ran = run_source(exporter_cls, src, Path(tmp), options, atol, rtol, say)
        except UntranslatableError as exc:
            if not exporter_cls.native_format or exporter_cls.framework not in serving.runtimes:
                raise
            # the target runs the source's own format: it serves without the ONNX artifact
            say(f"no ONNX artifact ({exc.message}): --target {target} runs the {exporter_cls.native_format} itself")
            omitted.append(
                {
                    "artifact": "onnx-fp32",
                    "stage": "export",
                    "reason": exc.message,
                    "fix": f"the {exporter_cls.native_format} artifact serves --target {target}; the other targets "
                    "need the ONNX artifact, so those operators translated",
                }
            )
            ran = run_source(exporter_cls, src, Path(tmp), replace(options, native_only=True), atol, rtol, say)
        converted, signature, references = ran.converted, ran.signature, ran.references

        artifacts: list[Artifact] = []
        validation: dict[str, ValidationRecord] = {}
        if converted.onnx_path is not None:
            say("validating the ONNX artifact on ONNX Runtime")
            with cpu_reference(converted.onnx_path, signature) as runtime:
                if converted.inexact is None:
                    held_atol, held_rtol, output_atol = _held_to(converted, references, atol, rtol)
                    record = validate(
                        runtime.run, references, held_atol, held_rtol, exporter_cls.framework, output_atol
                    )
                    if ran.spread is not None:
                        record = _within_spread(runtime.run, references, record, ran.spread)
                    require_passed(record, f"the ONNX export of '{src.name}'")
                    if converted.precision in HALF_PRECISIONS:
                        record["tolerance_basis"] = (
                            f"the source computes in {converted.precision}: on another device its kernels round "
                            f"their own way, so it is held to {TEN_BIT_RELATIVE:.0%} of each output's largest "
                            "reference value"
                        )
                else:
                    say(f"judging the ONNX artifact against {exporter_cls.framework}: {converted.inexact}")
                    record = _judged(
                        runtime.run,
                        references,
                        signature,
                        converted,
                        exporter_cls.framework,
                        accuracy,
                        src.name,
                        reference_rows("synthetic" if options.example_inputs is None else "example"),
                    )
                    record["quantization"] = converted.inexact
            artifact_id = f"onnx-{converted.precision}"
            artifacts.append(
                writer.add_artifact(
                    converted.onnx_path,
                    PlannedArtifact(
                        id=artifact_id,
                        path="artifacts/model.onnx",
                        format="onnx",
                        precision=converted.precision,
                        runtimes=["onnxruntime"],
                        opset=converted.opset,
                    ),
                    converted.companions,
                )
            )
            validation[artifact_id] = record

        say("writing the package")
        source_sha, source_size = digest_path(src)
        source: SourceRecord = {
            "framework": exporter_cls.framework,
            "file_name": src.name,
            "sha256": source_sha,
            "size": source_size,
            "path": None,
            "exporter": exporter_cls.name,
            "conversion_path": converted.conversion_path,
            "library_versions": {
                "unideploy": unideploy.__version__,
                "onnxruntime": onnxruntime.__version__,
                **converted.library_versions,
            },
        }
        if options.constants:
            source["constants"] = dict(options.constants)
        if exporter_cls.keeps_source:
            source["path"] = source_path = f"source/{src.name}"
            writer.add_file(src, source_path)
        if ran.native_validation is not None:
            native = _native_artifact(exporter_cls, src, source_sha, source_size)
            validation[native.id] = ran.native_validation
            artifacts.append(native)
        names = [f"samples/batch{batch_size_of(inputs)}" for inputs, _ in references]
        origin = "synthetic" if options.example_inputs is None else "example"
        samples = [
            writer.add_samples(
                f"{name}{'' if names.count(name) == 1 else f'-{i}'}.npz", batch_size_of(inputs), inputs, outputs, origin
            )
            for i, (name, (inputs, outputs)) in enumerate(zip(names, references))
        ]
        manifest = Manifest(
            name=name or model_name_from(src),
            version=version,
            source=source,
            signature=signature,
            artifacts=artifacts,
            samples=samples,
            validation=validation,
            omitted=omitted,
        )
        return writer.commit(manifest)


def _judged(
    run: Callable[[dict[str, Any]], Mapping[str, Any]],
    references: list,
    signature: Signature,
    converted: ConvertedModel,
    framework: str,
    accuracy: Mapping[str, Any] | None,
    file_name: str,
    rows_are: str,
) -> ValidationRecord:
    """The ONNX artifact of a source no other engine reproduces bit for bit, held to the accuracy
    guard on the reference rows (the user's --example-input, or synthetic ones), quantized outputs
    read as the numbers they stand for; then to the error it shows now (so ``deploy verify`` catches
    drift)."""
    scales = converted.output_scales

    def real(outputs: Mapping[str, Any]) -> dict[str, Any]:
        return {
            k: (v.astype(np.float32) - scales[k][1]) * scales[k][0] if k in scales else v for k, v in outputs.items()
        }

    guard = Guard(
        [inputs for inputs, _ in references],
        [real(outputs) for _, outputs in references],
        **settings_of(accuracy),
        rows_are=rows_are,
        output_axes=signature.output_batch_axes,
    )
    verdict = guard.admit(
        guard.judge("onnx", lambda: lambda inputs: real(run(inputs))),
        lambda numbers: AccuracyBudgetError(
            f"the ONNX export of '{file_name}' is over the accuracy budget against {framework} {numbers}",
            "raise --max-accuracy-drop if the engines' difference is acceptable (on random inputs, give real ones "
            "with --example-input)",
        ),
    )
    record = measured_tolerance_record(run, references, framework)
    record["accuracy"] = verdict
    return record


def _held_to(
    converted: ConvertedModel, references: list, atol: float, rtol: float
) -> tuple[float, float, dict[str, float]]:
    """The tolerance the ONNX artifact is checked and recorded under (atol, rtol, each output's own
    atol): the one asked for, or for a model that computes in fp16 or bf16 (brought so as an ONNX
    file) at least what its precision keeps, because every later check (``deploy verify --device
    gpu``) runs it on other kernels."""
    if converted.precision not in HALF_PRECISIONS:
        return atol, rtol, {}
    return atol, *at_least_ten_bits(references, atol, rtol, {})


def _within_spread(run: Run, references: list, record: ValidationRecord, spread: EngineSpread) -> ValidationRecord:
    """The ONNX artifact checked again with each output whose values the source's own engines
    disagree on by more than ``record``'s atol held to ``TOLERANCE_MARGIN`` times that: no
    conversion can agree with one of them more closely than they agree with each other, where that
    is rounding: within 1 % of the output's largest value. Recorded even where the ONNX artifact is
    closer (an ONNX source is its own reference): the artifacts converted from it later (TFLite,
    MindIR) are held to its record."""
    # rounding moves an output by a sliver of its scale; engines further apart compute something
    # else (rows that interact), which no tolerance should absorb; labels and ids stay judged by equality
    rounding = share_of_each_output(references, TEN_BIT_RELATIVE)
    wider = {
        name: TOLERANCE_MARGIN * apart
        for name, apart in spread.max_abs.items()
        if name in rounding and TOLERANCE_MARGIN * apart > record["atol"] and apart <= rounding[name]
    }
    if not wider:
        return record  # the source's engines agree: the difference is the conversion's
    widened = validate(run, references, record["atol"], record["rtol"], record["reference"], wider)
    apart = ", ".join(f"'{name}' by {spread.max_abs[name]:.3g}" for name in wider)
    widened["tolerance_basis"] = (
        f"the source's own engines differ on these inputs ({spread.engine} against the reference: "
        f"{apart}): {'that output is' if len(wider) == 1 else 'those outputs are'} held to "
        f"{TOLERANCE_MARGIN:g}x that"
    )
    return widened


def _native_artifact(exporter_cls: type[Exporter], src: Path, sha256: str, size: int) -> Artifact:
    """The packaged source itself, listed as an artifact the runtime named after its framework runs."""
    native = exporter_cls.native_format
    if not exporter_cls.keeps_source or native is None:
        raise ValueError(f"exporter {exporter_cls.name} has no native format it keeps as its source")
    return Artifact(
        id=native,
        path=f"source/{src.name}",
        format=native,
        precision="fp32",
        sha256=sha256,
        size=size,
        runtimes=[exporter_cls.framework],
    )
