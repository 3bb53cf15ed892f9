"""The exporter plug-in contract: turn one source model into ONNX plus a way to run the source.

An exporter only converts. Sampling, validation against the source framework and writing the
package are the same for every framework and live in ``exporters/export.py``.
"""

from __future__ import annotations

import json
import zipfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from unideploy.errors import InputError
from unideploy.package.manifest import ArtifactFormat, Precision
from unideploy.registry import Availability, modules_availability
from unideploy.signature import InputShape, Signature, StateSpec

SourceRunner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
Constant = int | float | bool | str  # a non-tensor forward() argument's value (--constant NAME=VALUE)


@dataclass
class ExportOptions:
    input_shapes: list[InputShape] = field(default_factory=list)
    example_inputs: dict[str, np.ndarray] | None = None
    static_shapes: bool = False
    opset: int | None = None
    signature: str | None = None  # SavedModel signature to export (default: serving_default)
    native_only: bool = False  # package the source's native artifact alone, without ONNX (MindIR)
    trust_source: bool = False  # run a model that holds file-system or Python-calling operations (trust.py)
    constants: dict[str, Constant] = field(default_factory=dict)  # non-tensor forward() arguments (--constant)
    state: tuple[StateSpec, ...] = ()  # inputs each call's outputs feed back to the next (--state)

    @classmethod
    def from_user(
        cls,
        *,
        input_shapes: Sequence[str] = (),
        example_inputs: Mapping[str, np.ndarray] | str | Path | None = None,
        static_shapes: bool = False,
        opset: int | None = None,
        signature: str | None = None,
        keep_native_only: bool = False,
        trust_source: bool = False,
        constants: Sequence[str] | Mapping[str, Constant] = (),
        state: Sequence[str] = (),
    ) -> ExportOptions:
        """From what a user gives, the same for ``deploy export``'s flags and ``unideploy.export``'s
        keywords: ``--input-shape`` texts parsed, an example-input ``.npz`` path loaded."""
        from unideploy.samples import load_npz_inputs
        from unideploy.signature import parse_input_shape, parse_state

        if isinstance(example_inputs, (str, Path)):
            example_inputs = load_npz_inputs(str(example_inputs))
        return cls(
            input_shapes=[parse_input_shape(s) for s in input_shapes],
            example_inputs=dict(example_inputs) if example_inputs is not None else None,
            static_shapes=static_shapes,
            opset=opset,
            signature=signature,
            native_only=keep_native_only,
            trust_source=trust_source,
            constants=dict(constants) if isinstance(constants, Mapping) else parse_constants(constants),
            state=tuple(parse_state(s) for s in state),
        )


def parse_constants(items: Sequence[str]) -> dict[str, Constant]:
    """``--constant NAME=VALUE`` items: a JSON number, true/false or quoted string, else the text as
    a string (``sr=16000`` -> 16000, ``mode=fast`` -> "fast")."""
    found: dict[str, Constant] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name.isidentifier():
            raise InputError(f"--constant '{item}' is not NAME=VALUE", "e.g. --constant sample_rate=16000")
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        if not isinstance(value, (int, float, bool, str)):
            raise InputError(f"--constant {name}: {text!r} is not a number, true/false or a string")
        found[name] = value
    return found


@dataclass
class ConvertedModel:
    """What an exporter hands back: the ONNX file, its signature and the source model to compare."""

    onnx_path: Path | None  # None when only the native artifact is packaged (ExportOptions.native_only)
    signature: Signature
    run_source: SourceRunner
    conversion_path: str  # e.g. "torch.onnx legacy" or "TS2EP + torch.export"
    library_versions: dict[str, str]
    opset: int
    # Sizes of dynamic dims the model's own metadata gives (e.g. an image size), keyed by dim name.
    size_hints: dict[str, int] = field(default_factory=dict)
    # Files that ship beside the ONNX artifact (package path -> file), e.g. its external data.
    companions: dict[str, Path] = field(default_factory=dict)
    precision: Precision = "fp32"  # what the ONNX artifact computes in: int8 where the source's kernels are
    # Why ONNX Runtime cannot give the source's outputs bit for bit (int8 kernels round their own way):
    # the ONNX artifact is then judged by the accuracy guard against them, not by the default tolerance.
    inexact: str | None = None
    # Outputs stored as integers that stand for real numbers (scale, zero point): a quantized model's
    # uint8 class scores are judged as the scores they are, not as labels.
    output_scales: dict[str, tuple[float, int]] = field(default_factory=dict)
    # The source run by another engine of its own framework (LiteRT's builtin kernels beside XNNPACK),
    # and that engine's name: how far the source's own engines disagree is the least a conversion
    # of it can be held to (SourceRun.spread).
    second_engine: tuple[str, SourceRunner] | None = None
    # Where the source's second engine is its own engine on each row of a batch alone, that engine's
    # name (an ONNX file: ONNX Runtime; a batched product sums in another order than one row's).
    rows_alone: str | None = None
    # A streaming model's state the exporter found (a TFLite model's resource variables made inputs
    # and outputs), recorded in the signature beside what --state names.
    state: tuple[StateSpec, ...] = ()


def zip_members(src: Path) -> list[str]:
    """The entry names of a zip file (TorchScript, ``.pt2`` and ``.keras`` are zips), else none."""
    if not src.is_file() or not zipfile.is_zipfile(src):
        return []
    with zipfile.ZipFile(src) as zf:
        return zf.namelist()


class Exporter(ABC):
    name: ClassVar[str]
    framework: ClassVar[str]
    required_modules: ClassVar[tuple[str, ...]] = ()
    extra: ClassVar[str | None] = None  # the pip extra that installs required_modules
    keeps_source: ClassVar[bool] = True  # store the source file in the package (later targets convert from it)
    # The artifact format of a source that runs as it is (MindIR on MindSpore): the packaged source
    # is then also listed as an artifact, validated on the runtime registered under the same name.
    native_format: ClassVar[ArtifactFormat | None] = None
    binds_constants: ClassVar[bool] = False  # takes --constant for non-tensor forward() arguments

    @classmethod
    def availability(cls) -> Availability:
        return modules_availability(cls.required_modules, cls.extra)

    @classmethod
    @abstractmethod
    def detect(cls, src: Path) -> bool:
        """Whether ``src`` looks like this exporter's input (by name or content, never by import)."""

    @abstractmethod
    def convert(self, src: Path, workdir: Path, options: ExportOptions) -> ConvertedModel:
        """Write ``workdir/model.onnx`` (unless ``options.native_only``) and describe it."""
