"""TFLite / LiteRT on ``ai-edge-litert`` (the maintained interpreter; ``tf.lite.Interpreter`` is
deprecated and its default int8 path differed on attention models).

Models are run through their signature runner, so inputs and outputs keep the package's names,
and inputs with a dynamic batch are resized per call.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from unideploy.errors import PackageError, RuntimeFailure, first_line
from unideploy.registry import Availability, modules_availability
from unideploy.runtimes.base import Runtime


class TFLiteRuntime(Runtime):
    name = "tflite"
    formats = ("tflite",)
    targets = ("edge", "cpu")

    @classmethod
    def availability(cls) -> Availability:
        return modules_availability(("ai_edge_litert",), "edge")

    def _load(self) -> None:
        from ai_edge_litert.interpreter import Interpreter

        try:
            self.interpreter = Interpreter(model_path=str(self.path), num_threads=self.options.threads)
            signatures = self.interpreter.get_signature_list()
        except (ValueError, RuntimeError) as exc:
            raise PackageError(f"LiteRT cannot load '{self.path.name}': {first_line(exc)}") from exc
        if not signatures:
            raise PackageError(f"'{self.path.name}' has no signature", "convert it with a signature (SavedModel)")
        key, names = next(iter(signatures.items()))
        if set(names["inputs"]) != set(self.signature.input_names):
            raise PackageError(f"'{self.path.name}' takes inputs {sorted(names['inputs'])} but the signature lists "
                               f"{sorted(self.signature.input_names)}", "the package is inconsistent; export it again")
        self.runner = self.interpreter.get_signature_runner(key)
        self._lock = threading.Lock()  # an interpreter runs one call at a time

    def describe(self) -> dict[str, Any]:
        return {"runtime": self.name, "threads": self.options.threads or "auto"}

    def _run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            with self._lock:
                outputs = self.runner(**inputs)
                return {k: np.array(v) for k, v in outputs.items()}
        except (ValueError, RuntimeError) as exc:
            raise RuntimeFailure(f"LiteRT failed: {first_line(exc)}") from exc

    def close(self) -> None:
        self.__dict__.pop("runner", None)
        self.__dict__.pop("interpreter", None)
