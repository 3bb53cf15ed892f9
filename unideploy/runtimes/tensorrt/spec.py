"""The TensorRT artifact: an engine recipe over an ONNX file of the same package.

A serialized engine only runs on the GPU model and TensorRT version it was built with, so a
package cannot ship "the" engine. It ships the recipe instead (which ONNX, precision, how int8
gets its scales, optimization profiles, workspace), and engines are built from it on the GPU
that serves, then cached under a key of all that (``engine_cache.py``). Plans built at export
time on a GPU ride along in ``engines/`` beside the recipe and are used where the key matches.

Both GPU paths read the same recipe: the TensorRT runtime, and ONNX Runtime's TensorRT/CUDA
execution providers when TensorRT itself is absent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from unideploy.errors import InputError, PackageError
from unideploy.package.files import digest_path, read_format_document
from unideploy.runtimes.tensorrt.profiles import InputProfile, shape_text

SPEC_FORMAT = "unideploy-tensorrt-engine"
SPEC_VERSION = 1
SPEC_SUFFIX = ".engine.json"
INT8_MODES = ("explicit", "calibrated")  # scales from a QDQ ONNX, or TensorRT's entropy calibrator


def is_engine_spec(path: Path) -> bool:
    return Path(path).name.endswith(SPEC_SUFFIX)


@dataclass(frozen=True)
class EngineSpec:
    onnx: str  # file name, relative to the recipe's folder
    onnx_sha256: str
    precision: str  # fp32, fp16, int8
    profiles: tuple[InputProfile, ...]
    int8: str | None = None  # one of INT8_MODES when precision is int8
    workspace_mib: int | None = None  # builder memory pool limit; None lets TensorRT use what it needs
    calibration: str | None = None  # .npz of calibration inputs, for int8 == "calibrated"
    calibration_sha256: str | None = None
    engines: str = "engines"  # folder of plans built at export time
    root: Path = field(default=Path("."), compare=False)  # the folder holding the recipe

    @property
    def onnx_path(self) -> Path:
        return self.root / self.onnx

    @property
    def calibration_path(self) -> Path | None:
        return self.root / self.calibration if self.calibration else None

    @property
    def engines_dir(self) -> Path:
        return self.root / self.engines

    @property
    def max_batch_size(self) -> int | None:
        """Most rows one call may carry: the smallest profile maximum of a dynamic batch axis."""
        dynamic = [p.max[0] for p in self.profiles if p.max and p.min[0] != p.max[0]]
        return min(dynamic) if dynamic else None

    def profile_text(self) -> dict[str, str]:
        """Profiles as ``min / opt / max`` per input, each shape ``1x3x32x32``, for people."""
        return {p.name: " / ".join(shape_text(s) for s in (p.min, p.opt, p.max)) for p in self.profiles}

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": SPEC_FORMAT,
            "format_version": SPEC_VERSION,
            "onnx": self.onnx,
            "onnx_sha256": self.onnx_sha256,
            "precision": self.precision,
            "int8": self.int8,
            "profiles": {p.name: p.to_dict() for p in self.profiles},
            "workspace_mib": self.workspace_mib,
            "calibration": self.calibration,
            "calibration_sha256": self.calibration_sha256,
            "engines": self.engines,
        }

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: Path) -> EngineSpec:
        """Read a recipe and check that it and the files it names are whole, inside its folder,
        and match their checksums: the key of every engine built from it rests on them."""
        path = Path(path)
        data = read_format_document(path, SPEC_FORMAT, SPEC_VERSION, "TensorRT recipe", "export it again")
        try:
            spec = cls(
                onnx=_inside(data["onnx"], path),
                onnx_sha256=str(data["onnx_sha256"]),
                precision=str(data["precision"]),
                profiles=tuple(
                    InputProfile(name, tuple(p["min"]), tuple(p["opt"]), tuple(p["max"]))
                    for name, p in data["profiles"].items()
                ),
                int8=data.get("int8"),
                workspace_mib=data.get("workspace_mib"),
                calibration=_inside(data["calibration"], path) if data.get("calibration") else None,
                calibration_sha256=data.get("calibration_sha256"),
                engines=_inside(data.get("engines", "engines"), path),
                root=path.parent,
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise PackageError(
                f"TensorRT recipe '{path.name}' lacks or mangles field {exc}", "the package is damaged; export it again"
            ) from None
        spec.check()
        return spec

    def check(self) -> None:
        if self.precision not in ("fp32", "fp16", "int8"):
            raise PackageError(f"TensorRT recipe: unknown precision '{self.precision}'")
        if (self.precision == "int8") != (self.int8 in INT8_MODES):
            raise PackageError(f"TensorRT recipe: precision {self.precision} with int8 mode {self.int8!r}")
        if self.int8 == "calibrated" and not self.calibration:
            raise PackageError("TensorRT recipe: calibrated int8 names no calibration data")
        files: list[tuple[Path, str | None]] = [(self.onnx_path, self.onnx_sha256)]
        if self.calibration_path is not None:
            files.append((self.calibration_path, self.calibration_sha256))
        for file, expected in files:
            if not file.is_file():
                raise PackageError(f"TensorRT recipe: '{file.name}' is missing", "the package is incomplete")
            if digest_path(file)[0] != expected:
                raise PackageError(
                    f"TensorRT recipe: '{file.name}' does not match its checksum",
                    "the package was modified after export; export it again",
                )


def _inside(relpath: Any, spec_path: Path) -> str:
    """A path from the recipe, refused if it could point outside the recipe's folder."""
    text = str(relpath)
    pure = PurePosixPath(text)
    if not text or pure.is_absolute() or ".." in pure.parts or "\\" in text:
        raise PackageError(
            f"TensorRT recipe '{spec_path.name}' names '{text}', outside its folder",
            "the package was tampered with; do not use it",
        )
    return text


def check_shapes(profiles: tuple[InputProfile, ...], inputs: dict[str, Any]) -> None:
    """Refuse inputs an engine was not built for, with the range it was built for."""
    for profile in profiles:
        shape = tuple(inputs[profile.name].shape) if profile.name in inputs else None
        if shape is None or profile.contains(shape):
            continue
        grow = shape_text(tuple(map(max, shape, profile.max))) if len(shape) == len(profile.max) else None
        raise InputError(
            f"input '{profile.name}' has shape {list(shape)}, outside the TensorRT engine's profile "
            f"(min {list(profile.min)}, max {list(profile.max)})",
            f"send inputs within that range{', e.g. fewer rows per request' if grow else ''}, or export again with "
            f"--trt-profile {profile.name}:MIN,OPT,{grow or 'MAX'}",
        )
