"""``--target ascend``: a MindIR artifact and MindSpore Lite recipes, added to a package atomically.

The MindIR comes from MindSpore itself: the package's fp32 ONNX graph is rebuilt as a MindSpore
network (``network.py``) and written with ``mindspore.export``, every dynamic dim kept; a MindIR
source's own file is reused as it is. Either way it is loaded back through the MindSpore runtime
and checked against the package's reference outputs before anything is written. The MindSpore
Lite recipes (``runtimes/mindspore_lite.py``) for the Ascend NPU and for ``.ms`` edge models are converted here
where ``converter_lite`` is on PATH, and otherwise deferred to the serving machine with the
tolerance it will hold the result to.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import onnx

from unideploy.ascend.network import export_mindir, require_supported
from unideploy.errors import ExportError, RuntimeFailure, ValidationError
from unideploy.guard.guard import Guard, reference_rows, settings_of
from unideploy.onnx.dequantize import float_onnx, rounds_activations
from unideploy.onnx.session import basic_optimized
from unideploy.package import Artifact, Package, PlannedArtifact
from unideploy.package.files import scratch_dir
from unideploy.package.manifest import HALF_PRECISIONS, Manifest, Tolerance, ValidationRecord
from unideploy.package.writer import AddedArtifact, extend_package
from unideploy.runtimes import RUNTIMES, RuntimeOptions
from unideploy.runtimes.mindspore_lite import CONVERTER, DEVICES, LiteRecipe
from unideploy.validation import (
    measured_tolerance_record,
    reduced_precision,
    require_passed,
    times_its_errors,
    validate_like,
)

Progress = Callable[[str], None]
ASCEND_RELATIVE = 1e-2  # the NPU computes convolutions and matrix products in fp16 by default
MINDIR_PATH = "artifacts/model.mindir"


def lite_tolerance(device: str, mindir_record: ValidationRecord, references: list) -> Tolerance:
    """What a converted model is held to against the source: fp16 on the Ascend NPU, the MindIR's
    own error (ten times over) for the fp32 ``.ms`` of edge devices."""
    if device == "ascend":
        return reduced_precision(
            references,
            ASCEND_RELATIVE,
            f"Ascend: fp16 compute on the NPU, {ASCEND_RELATIVE:.0%} of each output's largest reference value",
        )
    return times_its_errors(
        mindir_record, 10, "fp32 .ms: the default tolerance, or 10x an output's own error on the MindIR artifact"
    )


def _mindir(package: Package, work: Path, say: Progress) -> tuple[Path, Artifact | PlannedArtifact, list[str]]:
    """The MindIR to ship and check, and its artifact: the package's own (a MindIR source), or a
    new one rebuilt from its fp32 ONNX (the recipes lie beside whichever it is); and the INT8
    operators made float to rebuild it (``onnx.dequantize``)."""
    manifest = package.manifest
    native = next((a for a in manifest.artifacts if a.format == "mindir"), None)
    if native is not None and manifest.source.get("framework") == "mindspore":
        say("reusing the MindIR the model was exported from")
        return package.path_of(native), native, []
    base = manifest.base_onnx()
    if base is None:
        raise ExportError("the package has no fp32 ONNX artifact to rebuild in MindSpore", "export the model again")
    if base.precision in HALF_PRECISIONS:
        raise ExportError(
            f"the MindSpore rebuild starts from an fp32 graph, and the package's ONNX artifact '{base.id}' computes "
            f"in {base.precision}, as its source model does",
            "export the fp32 model it was made from",
        )
    source, undone = float_onnx(package.path_of(base), work, say)
    # constants computed in the graph (padding sizes built by ConstantOfShape and Concat, as
    # TorchScript exports them) folded first, so shape inference fixes the sizes after them: an If
    # on a fixed length (Silero VAD's) then folds too
    model = onnx.load(str(basic_optimized(source, work / "folded.onnx")))
    require_supported(model)  # every unknown operator named, before any work
    say("rebuilding the ONNX graph as a MindSpore network and exporting MindIR")
    example = package.reference_samples()[0].inputs
    path = export_mindir(model, manifest.signature, work / "model.mindir", work, example)
    planned = PlannedArtifact(
        "mindir", MINDIR_PATH, "mindir", "fp32", ["mindspore"], derived_from=base.id, targets=["ascend", "cpu"]
    )
    return path, planned, undone


def _check_mindir(
    path: Path, manifest: Manifest, references: list, undone: list[str], accuracy: Mapping[str, Any] | None = None
) -> ValidationRecord:
    """The MindIR against the reference outputs: to the tolerance its ONNX artifact was held to (an
    output the source's own engines disagree on keeps its own), or, rebuilt from a dequantized graph
    (whose activations are no longer rounded to 8 bits), by the accuracy guard (with the budget and
    metric in ``accuracy``)."""
    framework = manifest.source["framework"]
    with RUNTIMES.get("mindspore")(path, manifest.signature, RuntimeOptions(device="cpu")) as runtime:
        if not rounds_activations(undone):
            base = manifest.base_onnx()
            record = validate_like(manifest, base.id if base else None, runtime.run, references, framework)
            require_passed(record, "the MindIR artifact (run by MindSpore on the CPU)")
            if undone:
                record["dequantized"] = undone
            return record
        guard = Guard(
            [inputs for inputs, _ in references],
            [dict(outputs) for _, outputs in references],
            rows_are=reference_rows(manifest.samples_origin()),
            output_axes=manifest.signature.output_batch_axes,
            **settings_of(accuracy),
        )
        accuracy = guard.admit(
            guard.judge(path, lambda: runtime.run),
            lambda numbers: ExportError(
                f"the MindIR of the model with its INT8 made float ({', '.join(undone)}) is over the accuracy "
                f"budget {numbers}",
                "convert the float model (before its quantization) for --target ascend",
            ),
        )
        record = measured_tolerance_record(runtime.run, references, framework)
    record["accuracy"], record["dequantized"] = accuracy, undone
    return record


def _lite_artifacts(
    mindir: Path,
    of: Artifact | PlannedArtifact,
    manifest: Manifest,
    mindir_record: ValidationRecord,
    references: list,
    work: Path,
    say: Progress,
) -> list[AddedArtifact]:
    """One recipe per MindSpore Lite device, each beside the MindIR artifact ``of``."""
    folder, beside = work / "lite", PurePosixPath(of.path).parent
    folder.mkdir()
    staged = folder / PurePosixPath(of.path).name
    shutil.copyfile(mindir, staged)
    added = []
    for device in DEVICES:
        recipe = LiteRecipe.for_signature(device, staged, manifest.signature)
        path = recipe.write(folder)
        companions = {f"{beside}/{recipe.config}": folder / recipe.config} if recipe.config else {}
        tolerance = lite_tolerance(device, mindir_record, references)
        where = f"{CONVERTER} is not on PATH here: the {device} machine converts the recipe"
        if shutil.which(CONVERTER):
            say(f"converting with {CONVERTER} for {device}")
            companions[f"{beside}/{recipe.output}"] = recipe.convert(folder)
            where = "the converted model ships beside the recipe"
        record: ValidationRecord = {
            "deferred": f"{where}; it runs on MindSpore Lite, and is checked on the {device} machine "
            "('deploy verify' there)",
            **tolerance,
        }
        added.append(
            (
                PlannedArtifact(
                    f"mindspore-lite-{device}",
                    f"{beside}/{path.name}",
                    "mindspore-lite",
                    "fp16" if device == "ascend" else "fp32",
                    ["mindspore"],
                    derived_from=of.id,
                    targets=["ascend" if device == "ascend" else "edge"],
                ),
                path,
                companions,
                record,
            )
        )
    return added


def build_ascend(
    package_path: str | Path,
    output: str | Path,
    options: Mapping[str, Any] | None = None,
    *,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> Path:
    """Write ``output``: the package with its MindIR artifact and MindSpore Lite recipes. The
    stage of ``--target ascend`` (targets.py), which has no options of its own (``accuracy``: the
    guard's budget and metric, as every stage takes them)."""
    say = progress or (lambda _msg: None)  # MindSpore's presence: checked up front (targets.py)
    with Package.open(package_path) as package, scratch_dir("unideploy-ascend-") as tmp:
        work, manifest = Path(tmp), package.manifest
        references = package.reference_pairs()
        mindir, of, undone = _mindir(package, work, say)
        say("checking the MindIR against the reference outputs with MindSpore")
        try:
            record = _check_mindir(mindir, manifest, references, undone, (options or {}).get("accuracy"))
        except (ValidationError, RuntimeFailure) as exc:
            raise ExportError(
                f"the MindIR MindSpore exported does not reproduce the model: {exc.message}",
                "export with --target cpu or edge; the ONNX artifact is unaffected",
            ) from exc
        added: list[AddedArtifact] = [(of, mindir, {}, record)] if isinstance(of, PlannedArtifact) else []
        added += _lite_artifacts(mindir, of, manifest, record, references, work, say)
        say("writing the package")
        return extend_package(package, package_path, output, added, overwrite)
