"""MindSpore Lite for .ms and MindIR artifacts, or MindSpore itself for MindIR on CPU.

``mindspore_lite`` is what Ascend and edge images ship; it is used whenever it is installed. A
MindSpore Lite recipe (``--target ascend``, ``mindspore_lite.py``) runs its converted model, shipped
beside it or converted on first load with ``converter_lite`` into the engine cache; where
``mindspore_lite`` is absent the recipe is passed over and the package's MindIR runs instead.
Where only ``mindspore`` is (a training machine, this project's CI), MindIR artifacts run through
``nn.GraphCell(mindspore.load(...))`` in GRAPH_MODE (PYNATIVE fails its first op under numpy 2).
Both take inputs positionally, in the order of the package signature.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

from unideploy.errors import ExportError, MissingDependencyError, PackageError, RuntimeFailure, first_line
from unideploy.quiet import quiet
from unideploy.registry import Availability
from unideploy.runtimes.base import Runtime
from unideploy.runtimes.mindspore_lite import LiteRecipe, is_recipe
from unideploy.runtimes.tensorrt.engine_cache import default_cache_dir
from unideploy.signature import Signature, contiguous


def mindspore_defaults() -> None:
    """Where MindSpore writes and what it logs, unless the user said, set before it is imported.
    It writes ``rank_0/om/analyze_fail.ir`` into the working directory when a graph fails to compile
    unless ``MS_OM_PATH`` says where: a user's folder is not the place. Its C++ log prints warnings
    to stderr when a graph compiles at its first run, outside any quiet block (Silero VAD's MindIR:
    ten lines on squeezes of dynamic rank, while its outputs were right): ``GLOG_v`` 3 keeps errors."""
    os.environ.setdefault("MS_OM_PATH", str(Path(tempfile.gettempdir()) / "unideploy-mindspore"))
    os.environ.setdefault("GLOG_v", "3")


def placeholders(ms: Any, signature: Signature) -> list[Any]:
    """MindSpore tensors standing for the signature's inputs, ``None`` for each dynamic dim: what
    ``mindspore.export`` writes a MindIR for, and what a loaded MindIR is compiled for."""
    return [
        ms.Tensor(
            shape=[d if isinstance(d, int) else None for d in spec.shape],
            dtype=getattr(ms, "bool_" if spec.dtype == "bool" else spec.dtype),
        )
        for spec in signature.inputs
    ]


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


class MindSporeRuntime(Runtime):
    name = "mindspore"
    formats = ("mindir", "ms", "mindspore-lite")
    targets = ("cpu", "edge", "ascend")

    @classmethod
    def availability(cls) -> Availability:
        for module in ("mindspore_lite", "mindspore"):
            if _installed(module):
                return Availability(True, f"{module} is installed")
        return Availability(
            False,
            "neither mindspore_lite nor mindspore is installed",
            "pip install 'unideploy[mindspore]' (or mindspore-lite on Ascend/edge images)",
        )

    def _load(self) -> None:
        self._lock = threading.Lock()  # one call at a time per loaded model, as in both engines' docs
        self.engine = "mindspore-lite" if _installed("mindspore_lite") else "mindspore"
        if is_recipe(self.path):
            if self.engine != "mindspore-lite":
                raise MissingDependencyError(
                    f"'{self.path.name}' is a MindSpore Lite recipe and mindspore_lite is not installed",
                    "install MindSpore Lite on the serving machine; the package's MindIR runs through MindSpore here",
                )
            self.path = self._converted(LiteRecipe.load(self.path))
        if self.engine == "mindspore-lite":
            self._load_lite()
        elif self.path.suffix == ".ms":
            raise PackageError(
                f"'{self.path.name}' is a MindSpore Lite model and mindspore_lite is not installed",
                "install mindspore-lite, or run the package's MindIR or ONNX artifact",
            )
        else:
            self._load_graph_cell()

    def _converted(self, recipe: LiteRecipe) -> Path:
        """The recipe's converted model: shipped beside it, or converted now into the engine cache."""
        shipped = recipe.root / recipe.output
        if shipped.is_file():
            return shipped
        cache = self.options.engine_cache or default_cache_dir()
        folder = cache / f"mindspore-lite-{recipe.device}-{recipe.mindir_sha256[:16]}"
        if (folder / recipe.output).is_file():
            return folder / recipe.output
        try:
            return recipe.convert(folder)
        except ExportError as exc:
            raise PackageError(exc.message, exc.hint) from exc

    def _load_graph_cell(self) -> None:
        mindspore_defaults()
        with quiet():
            import mindspore as ms

            ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
            try:
                self.cell = ms.nn.GraphCell(ms.load(str(self.path)))
            except (RuntimeError, ValueError, TypeError) as exc:
                raise PackageError(
                    f"MindSpore cannot load '{self.path.name}': {first_line(exc)}",
                    "the MindIR file is corrupt or from an incompatible MindSpore",
                ) from exc
            if self.signature.has_dynamic_inputs:
                # Compiled for its first call's shapes, a loaded graph keeps some of them (a Concat
                # of a branch of known size and one whose size is computed from a tensor, as in
                # PP-OCRv4's recogniser); compiled for the signature's dynamic dims, it does not.
                self.cell.set_inputs(*placeholders(ms, self.signature))
        self._tensor = ms.Tensor

    def _load_lite(self) -> None:
        import mindspore_lite as mslite

        context = mslite.Context()
        context.target = ["ascend" if self.options.device == "gpu" or "-ascend." in self.path.name else "cpu"]
        if self.options.threads:
            context.cpu.thread_num = self.options.threads
        model_type = mslite.ModelType.MINDIR_LITE if self.path.suffix == ".ms" else mslite.ModelType.MINDIR
        self.model = mslite.Model()
        try:
            self.model.build_from_file(str(self.path), model_type, context)
        except (RuntimeError, ValueError) as exc:
            raise PackageError(f"MindSpore Lite cannot load '{self.path.name}': {first_line(exc)}") from exc

    def describe(self) -> dict[str, Any]:
        return {"runtime": self.name, "engine": self.engine, "device": "cpu", "threads": self.options.threads or "auto"}

    def _run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ordered = [inputs[name] for name in self.signature.input_names]
        try:
            with self._lock:
                results = self._run_lite(ordered) if self.engine == "mindspore-lite" else self._run_graph_cell(ordered)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise RuntimeFailure(f"{self.engine} failed: {first_line(exc)}") from exc
        if len(results) != len(self.signature.outputs):
            raise RuntimeFailure(
                f"the model returned {len(results)} outputs, the signature lists {len(self.signature.outputs)}"
            )
        outputs = dict(zip(self.signature.output_names, results))
        wrong = self.signature.output_mismatches(inputs, outputs)
        if wrong:  # a loaded MindIR can keep the shapes of an earlier call for some networks
            raise RuntimeFailure(
                f"{self.engine} returned outputs of the wrong shape for these inputs: {'; '.join(wrong)}",
                "MindSpore reused the shapes of an earlier call; run the package's ONNX artifact instead",
            )
        return outputs

    def _run_graph_cell(self, ordered: list[np.ndarray]) -> list[np.ndarray]:
        out = self.cell(*[self._tensor(a) for a in ordered])
        return [t.asnumpy() for t in _leaves(out)]

    def _run_lite(self, ordered: list[np.ndarray]) -> list[np.ndarray]:
        tensors = self.model.get_inputs()
        if [list(t.shape) for t in tensors] != [list(a.shape) for a in ordered]:
            self.model.resize(tensors, [list(a.shape) for a in ordered])
        for tensor, array in zip(tensors, ordered):
            tensor.set_data_from_numpy(contiguous(array))
        return [t.get_data_to_numpy() for t in self.model.predict(tensors)]

    def close(self) -> None:
        self.__dict__.pop("cell", None)
        self.__dict__.pop("model", None)


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, (tuple, list)):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]
