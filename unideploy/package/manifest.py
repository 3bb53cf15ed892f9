"""The manifest of a package: typed access over the JSON document, checked against its schema.

``manifest.schema.json`` (shipped beside this module) is the machine-checkable definition of
format version 1; ``docs/package-format.md`` explains it for people.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from functools import lru_cache
from importlib import resources
from typing import Any, Literal, NotRequired, TypedDict, TypeGuard, get_args

from unideploy.errors import InputError, PackageError
from unideploy.signature import Signature

FORMAT = "unideploy-package"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
SIGNATURE_NAME = "signature.sig"  # written by `deploy sign` (package/signing.py); not listed in the manifest


# The values manifest.schema.json allows, as types: a stage that names another fails the type check.
ArtifactFormat = Literal["onnx", "ort", "tflite", "tensorrt", "mindir", "mindspore-lite", "savedmodel", "torchscript"]
Precision = Literal["fp32", "fp16", "bf16", "int8", "mixed"]
TargetName = Literal["cpu", "gpu", "edge", "ascend"]
HALF_PRECISIONS: tuple[Precision, ...] = ("fp16", "bf16")  # floats of 16 bits: a model may compute in them


def is_precision(value: str) -> TypeGuard[Precision]:
    return value in get_args(Precision)


class SourceRecord(TypedDict):
    """Where the model came from and how it became ONNX."""

    framework: str
    file_name: str
    sha256: str
    exporter: str
    library_versions: dict[str, str]
    path: NotRequired[str | None]  # the source file's place in the package, where it is kept
    size: NotRequired[int]
    conversion_path: NotRequired[str]
    constants: NotRequired[dict[str, int | float | bool | str]]  # forward() arguments bound by --constant


class OutputErrors(TypedDict):
    max_abs_error: float
    max_rel_error: float
    mismatched: int


class OutputAccuracy(TypedDict):
    """One output of a candidate judged by its metric (``guard/accuracy.py``): which metric and why,
    the distances every numeric output gets, the drop against its budget, and the verdict. The
    metric adds what it measured under its own names (``accuracy_fp32`` and ``accuracy``,
    ``mask_iou``, ``character_error_rate``, ...: ``Metric.score``)."""

    metric: str
    why: str
    max_abs_error: float
    top1_agreement: float
    drop_points: float  # percentage points lost by the metric's measure, never negative
    budget_points: float
    within_budget: bool
    cosine_mean: NotRequired[float]
    cosine_min: NotRequired[float]
    relative_error: NotRequired[float]
    non_finite: NotRequired[int]  # values NaN or infinite where fp32's are finite (the output is then lost)
    values: NotRequired[int]  # how many values the output has, beside non_finite


class AccuracyRecord(TypedDict):
    """The guard's verdict on a candidate: each output's, and the deciding one (the output furthest
    over, or nearest to, its budget) as the whole candidate's; labelled accuracy where labels were
    given."""

    rows: int
    outputs: dict[str, OutputAccuracy]
    metric: str
    deciding_output: str
    top1_agreement: float
    drop_points: float
    budget_points: float
    within_budget: bool
    accuracy_fp32: NotRequired[float]
    accuracy: NotRequired[float]
    rows_are: NotRequired[str]  # what the rows were ("validation rows", "synthetic reference rows ...")


class SearchTrial(TypedDict):
    """One candidate of an accuracy search: how many of the ranked layers it left as they were."""

    restored: int
    drop_points: float
    within_budget: bool


class SearchRecord(TypedDict):
    """How an accuracy search went (``guard/search.py``): how many units (layers, channel groups)
    were ranked, how the ones restored were left (``in fp32``, ``in float``, ``whole``), every
    candidate tried, and what it cost; or why there was none (``skipped``), or why its result was
    not kept (``refused``). Passes add their own measurements (``drop_points_all_int8``, ...)."""

    ranked_layers: NotRequired[int]
    restored_as: NotRequired[str]
    units: NotRequired[str]
    within_budget: NotRequired[bool]
    trials: NotRequired[list[SearchTrial]]
    cost: NotRequired[str]
    refused: NotRequired[str]
    skipped: NotRequired[str]
    speedup: NotRequired[float]
    speedup_all_int8: NotRequired[float]
    size_ratio: NotRequired[float]
    drop_points_all_int8: NotRequired[float]
    drop_points_all_fp16: NotRequired[float]
    drop_points_all_pruned: NotRequired[float]


class ValidationRecord(TypedDict):
    """An artifact's proof: its worst errors per output against the source's reference outputs,
    the tolerance they were held to, and the batch sizes run. A record whose artifact can only run
    elsewhere has ``deferred`` (the reason) and the tolerance, and nothing measured yet."""

    atol: float
    rtol: float
    passed: NotRequired[bool]
    reference: NotRequired[str]
    batch_sizes: NotRequired[list[int]]
    outputs: NotRequired[dict[str, OutputErrors]]
    tolerance_basis: NotRequired[str]
    output_atol: NotRequired[dict[str, float]]  # an output's own atol, where it is not ``atol``
    accuracy: NotRequired[AccuracyRecord]  # a non-exact artifact's guard verdict (edge fp16/int8)
    quantization: NotRequired[str]  # an edge int8 artifact's kind (full integer or dynamic range)
    float_layers: NotRequired[list[dict[str, Any]]]  # an int8 TFLite's layers left in float, worst first
    fp32_constants: NotRequired[dict[str, str]]  # an fp16 TFLite's constants kept in fp32 -> why
    search: NotRequired[SearchRecord]  # how many were ranked, and each candidate tried
    dequantized: NotRequired[list[str]]  # the source's dynamic INT8 operators made float to convert it
    source_model: NotRequired[str]  # an artifact that is the source model itself, and what was added to it
    deferred: NotRequired[str]


class Tolerance(TypedDict):
    """What an artifact that can only be checked where it runs will be held to there, and why."""

    atol: float
    rtol: float
    tolerance_basis: str
    output_atol: NotRequired[dict[str, float]]  # an output's own atol, where it is not ``atol``


class OptimizationRecord(TypedDict):
    """How an optimized artifact was made, measured and judged."""

    name: str
    artifact: str
    derived_from: str
    passes: list[dict[str, Any]]
    data: dict[str, Any]
    accuracy: AccuracyRecord
    effects: dict[str, Any]
    notes: list[str]


class OmittedRecord(TypedDict):
    """An artifact a stage left out: the CLI shows why and what to do."""

    artifact: str
    stage: str
    reason: str
    fix: str


@lru_cache(maxsize=1)
def manifest_schema() -> dict[str, Any]:
    return json.loads(resources.files(__package__).joinpath("manifest.schema.json").read_text())


def check_schema(data: Any) -> None:
    """Raise PackageError naming the first schema violation of a manifest document."""
    import jsonschema

    if isinstance(data, dict) and data.get("format") == FORMAT and data.get("format_version") != FORMAT_VERSION:
        raise PackageError(
            f"{MANIFEST_NAME}: format version {data.get('format_version')!r} is not supported "
            f"(this unideploy reads version {FORMAT_VERSION})",
            "upgrade unideploy or re-export the model",
        )
    validator = jsonschema.Draft202012Validator(manifest_schema())
    error = jsonschema.exceptions.best_match(validator.iter_errors(data))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        raise PackageError(f"{MANIFEST_NAME} does not match the package schema at {where}: {error.message}")


@dataclass(frozen=True)
class PlannedArtifact:
    """An artifact a stage has made and not yet written: everything but what only the written
    file can tell (checksum, size, companion files), which the writer adds as it makes the
    ``Artifact`` (``PackageWriter.add_artifact``)."""

    id: str
    path: str
    format: ArtifactFormat
    precision: Precision
    runtimes: list[str]
    opset: int | None = None
    derived_from: str | None = None
    signature: Signature | None = None  # only where it differs from the package's (e.g. NHWC)
    targets: list[TargetName] | None = None


@dataclass
class Artifact:
    """One runnable form of the model inside the package (ONNX, TFLite, a TensorRT plan, ...)."""

    id: str
    path: str
    format: ArtifactFormat
    precision: Precision
    sha256: str
    size: int
    runtimes: list[str]
    opset: int | None = None
    derived_from: str | None = None
    signature: Signature | None = None  # only where it differs from the package's (e.g. NHWC)
    targets: list[TargetName] | None = None  # where it is meant to run, when narrower than everywhere (fp16: gpu, edge)
    files: list[dict[str, Any]] | None = None  # companion files shipped with it ({path, sha256, size})

    @classmethod
    def written(cls, planned: PlannedArtifact, sha256: str, size: int, files: list[dict[str, Any]] | None) -> Artifact:
        """The manifest entry of ``planned`` once its file is written (``PackageWriter.add_artifact``)."""
        shared = {f.name: getattr(planned, f.name) for f in fields(PlannedArtifact)}
        return cls(**shared, sha256=sha256, size=size, files=files)

    def planned(self) -> PlannedArtifact:
        """This artifact as a stage hands it to a writer (to copy it into another package)."""
        return PlannedArtifact(**{f.name: getattr(self, f.name) for f in fields(PlannedArtifact)})

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "path": self.path,
            "format": self.format,
            "precision": self.precision,
            "sha256": self.sha256,
            "size": self.size,
            "runtimes": list(self.runtimes),
        }
        if self.opset is not None:
            out["opset"] = self.opset
        if self.derived_from is not None:
            out["derived_from"] = self.derived_from
        if self.signature is not None:
            out["signature"] = self.signature.to_dict()
        if self.targets is not None:
            out["targets"] = list(self.targets)
        if self.files:
            out["files"] = [dict(f) for f in self.files]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Artifact:
        sig = data.get("signature")
        return cls(
            id=data["id"],
            path=data["path"],
            format=data["format"],
            precision=data["precision"],
            sha256=data["sha256"],
            size=data["size"],
            runtimes=list(data["runtimes"]),
            opset=data.get("opset"),
            derived_from=data.get("derived_from"),
            signature=Signature.from_dict(sig) if sig else None,
            targets=data.get("targets"),
            files=data.get("files"),
        )


@dataclass
class SampleSet:
    """A stored batch of reference inputs with the source framework's outputs."""

    path: str
    batch_size: int
    sha256: str
    size: int
    # "example": rows the user gave (--example-input); "synthetic": random inputs, on which an
    # optimized artifact's error can be far below its error on real rows; None: not recorded
    origin: str | None = None

    def to_dict(self) -> dict[str, Any]:
        found = {"path": self.path, "batch_size": self.batch_size, "sha256": self.sha256, "size": self.size}
        return {**found, "origin": self.origin} if self.origin else found


@dataclass
class Manifest:
    name: str
    version: str
    source: SourceRecord
    signature: Signature
    artifacts: list[Artifact] = field(default_factory=list)
    samples: list[SampleSet] = field(default_factory=list)
    optimizations: list[OptimizationRecord] = field(default_factory=list)
    validation: dict[str, ValidationRecord] = field(default_factory=dict)
    created_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    description: str | None = None
    # Artifacts a stage left out, each {artifact, stage, reason, fix}: shown by the CLI, kept here.
    omitted: list[OmittedRecord] = field(default_factory=list)

    def samples_origin(self) -> str:
        """Where the reference samples came from: "example" (the user's rows), "synthetic" (random
        inputs) or "not recorded" (a package made before it was)."""
        found = {s.origin for s in self.samples}
        return "synthetic" if "synthetic" in found else "example" if found == {"example"} else "not recorded"

    def base_onnx(self) -> Artifact | None:
        """The ONNX the exporter wrote, which every later stage (optimizers, edge, GPU, Ascend)
        starts from: fp32, or what the source computes in (int8 for a quantized .tflite or .onnx,
        fp16 or bf16 for a 16-bit .onnx), which the stages that need an fp32 model refuse."""
        return next((a for a in self.artifacts if a.format == "onnx" and a.derived_from is None), None)

    def artifact(self, artifact_id: str) -> Artifact:
        for artifact in self.artifacts:
            if artifact.id == artifact_id:
                return artifact
        raise InputError(
            f"package has no artifact '{artifact_id}'",
            f"artifacts: {', '.join(a.id for a in self.artifacts)}",
        )

    @property
    def fixed_batch(self) -> int | None:
        """The one batch size a model without a dynamic batch takes (its samples'), else None. The
        batch is dynamic wherever the signature has a batch dimension, on axis 0 or not: a recurrent
        model's state ``[2, batch, 128]`` beside its audio ``[batch, 576]`` (Silero VAD) was taken
        for a fixed batch of 1 when only axis 0 was read."""
        return None if self.signature.batch_dim is not None else self.samples[0].batch_size

    def signature_of(self, artifact: Artifact) -> Signature:
        """The artifact's own signature (an edge artifact's channels-last inputs), else the package's;
        the state is the package's either way, and a fixed-size artifact's rows lie where the
        package's do (``Signature.rows_like``)."""
        if artifact.signature is None:
            return self.signature
        return replace(artifact.signature, state=self.signature.state, rows_like=self.signature)

    def to_dict(self) -> dict[str, Any]:
        model: dict[str, Any] = {"name": self.name, "version": self.version}
        if self.description:
            model["description"] = self.description
        data = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "model": model,
            "created_at": self.created_at,
            "source": self.source,
            "signature": self.signature.to_dict(),
            "artifacts": [a.to_dict() for a in self.artifacts],
            "optimizations": self.optimizations,
            "validation": self.validation,
            "samples": [s.to_dict() for s in self.samples],
        }
        if self.omitted:
            data["omitted"] = [dict(o) for o in self.omitted]
        return data

    def copy(self) -> Manifest:
        return Manifest.from_json(self.to_json())

    def to_json(self) -> str:
        data = self.to_dict()
        check_schema(data)  # never write a manifest that the reader would refuse
        return json.dumps(data, indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as exc:  # RecursionError: nested beyond any manifest
            raise PackageError(f"{MANIFEST_NAME} is not valid JSON: {str(exc) or 'nested too deep'}") from exc
        check_schema(data)
        return cls(
            name=data["model"]["name"],
            version=data["model"]["version"],
            description=data["model"].get("description"),
            created_at=data["created_at"],
            source=data["source"],
            signature=Signature.from_dict(data["signature"]),
            artifacts=[Artifact.from_dict(a) for a in data["artifacts"]],
            samples=[SampleSet(**s) for s in data["samples"]],
            optimizations=data["optimizations"],
            validation=data["validation"],
            omitted=data.get("omitted", []),
        )
