"""The MindSpore Lite artifact: a conversion recipe for ``converter_lite`` over the package's MindIR.

MindSpore Lite converts a MindIR for the device that serves it: Ascend-oriented optimization for
the NPU (a MindIR again, for the cloud-side runtime), or a ``.ms`` flatbuffer for phones and edge
boxes. ``converter_lite`` ships with MindSpore Lite's release archives, not on PyPI, so a package
carries the recipe (which MindIR, what optimization, input shapes with their dynamic dims), runs
it at export where the converter is on PATH, and otherwise leaves it for the serving machine,
together with the tolerance the converted model will be held to there.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from unideploy.errors import ExportError, PackageError
from unideploy.package.files import digest_path, read_format_document
from unideploy.signature import Signature

RECIPE_FORMAT = "unideploy-mindspore-lite-recipe"
RECIPE_VERSION = 1
RECIPE_SUFFIX = ".mslite.json"
CONVERTER = "converter_lite"
# device -> (converter --optimize value, what the conversion writes)
DEVICES = {"ascend": ("ascend_oriented", ".mindir"), "edge": ("general", ".ms")}
DYNAMIC_BATCHES = (1, 2, 4, 8, 16)  # gears Ascend compiles for a dynamic batch (its graphs are static)


def is_recipe(path: Path) -> bool:
    return Path(path).name.endswith(RECIPE_SUFFIX)


@dataclass(frozen=True)
class LiteRecipe:
    device: str  # a key of DEVICES
    mindir: str  # file name, relative to the recipe's folder
    mindir_sha256: str
    input_shapes: dict[str, list[int]]  # -1 where the signature's dim is dynamic
    root: Path = field(default=Path("."), compare=False)

    @property
    def output(self) -> str:
        """The converted model, beside the recipe (``--outputFile`` takes it without suffix)."""
        return f"{PurePosixPath(self.mindir).stem}-{self.device}{DEVICES[self.device][1]}"

    @property
    def config(self) -> str | None:
        return f"{PurePosixPath(self.mindir).stem}-{self.device}.cfg" if self.device == "ascend" else None

    def config_text(self) -> str:
        """Ascend compiles static graphs: a dynamic batch becomes a set of batch gears."""
        shapes = ";".join(f"{name}:[{','.join(map(str, dims))}]" for name, dims in self.input_shapes.items())
        lines = ["[ascend_context]", f"input_shape={shapes}"]
        if any(-1 in dims for dims in self.input_shapes.values()):
            lines.append("dynamic_dims=" + ",".join(f"[{b}]" for b in DYNAMIC_BATCHES))
        return "\n".join(lines) + "\n"

    def command(self, out_dir: Path | None = None) -> list[str]:
        """The converter_lite command line, run from the recipe's folder (or writing to ``out_dir``)."""
        target = (out_dir or Path(".")) / Path(self.output).with_suffix("")
        args = [
            CONVERTER,
            "--fmk=MINDIR",
            f"--modelFile={self.mindir}",
            f"--outputFile={target}",
            f"--optimize={DEVICES[self.device][0]}",
        ]
        if self.config:
            args.append(f"--configFile={self.config}")
        else:
            static = all(-1 not in dims for dims in self.input_shapes.values())
            if static:
                args.append(
                    "--inputShape=" + ";".join(f"{n}:{','.join(map(str, d))}" for n, d in self.input_shapes.items())
                )
        return args

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": RECIPE_FORMAT,
            "format_version": RECIPE_VERSION,
            "device": self.device,
            "mindir": self.mindir,
            "mindir_sha256": self.mindir_sha256,
            "input_shapes": self.input_shapes,
            "output": self.output,
            "command": " ".join(self.command()),
        }

    def write(self, folder: Path) -> Path:
        """Write the recipe (and the Ascend config it names) into ``folder``; return the recipe."""
        path = folder / f"mindspore-lite-{self.device}{RECIPE_SUFFIX}"
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        if self.config:
            (folder / self.config).write_text(self.config_text())
        return path

    @classmethod
    def for_signature(cls, device: str, mindir: Path, signature: Signature) -> LiteRecipe:
        shapes = {s.name: [d if isinstance(d, int) else -1 for d in s.shape] for s in signature.inputs}
        return cls(device, mindir.name, digest_path(mindir)[0], shapes, root=mindir.parent)

    @classmethod
    def load(cls, path: Path) -> LiteRecipe:
        """Read a recipe and check it names a MindIR inside its folder that matches its checksum."""
        path = Path(path)
        data = read_format_document(path, RECIPE_FORMAT, RECIPE_VERSION, "MindSpore Lite recipe", "export it again")
        try:
            recipe = cls(
                str(data["device"]),
                str(data["mindir"]),
                str(data["mindir_sha256"]),
                {str(k): [int(d) for d in v] for k, v in data["input_shapes"].items()},
                root=path.parent,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise PackageError(
                f"MindSpore Lite recipe '{path.name}' lacks or mangles field {exc}",
                "the package is damaged; export it again",
            ) from None
        if recipe.device not in DEVICES or "/" in recipe.mindir or recipe.mindir.startswith("."):
            raise PackageError(
                f"MindSpore Lite recipe '{path.name}' names device {recipe.device!r} / {recipe.mindir!r}"
            )
        found = recipe.root / recipe.mindir
        if not found.is_file() or digest_path(found)[0] != recipe.mindir_sha256:
            raise PackageError(
                f"MindSpore Lite recipe '{path.name}': its MindIR '{recipe.mindir}' is missing or changed",
                "the package is damaged; export it again",
            )
        return recipe

    def convert(self, out_dir: Path) -> Path:
        """Run converter_lite now; return the converted model. Raises ExportError when it fails."""
        if shutil.which(CONVERTER) is None:
            raise ExportError(f"{CONVERTER} is not on PATH", "install MindSpore Lite's tools archive for this device")
        out_dir.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(
            self.command(out_dir.resolve()), cwd=self.root, capture_output=True, text=True, timeout=3600, check=False
        )
        produced = out_dir / self.output
        if result.returncode != 0 or not produced.is_file():
            said = (result.stderr or result.stdout or "no output").strip().splitlines() or ["no output"]
            raise ExportError(
                f"{CONVERTER} failed for {self.device} (exit {result.returncode}): {said[-1]}",
                "the MindIR artifact still runs through MindSpore; report the model to MindSpore Lite",
            )
        return produced
