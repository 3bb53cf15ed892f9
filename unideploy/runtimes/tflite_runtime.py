"""TFLite / LiteRT on ``ai-edge-litert`` (the maintained interpreter; ``tf.lite.Interpreter`` is
deprecated and its default int8 path differed on attention models).

Models are run through their signature runner, so inputs and outputs keep the package's names,
and inputs with a dynamic batch are resized per call. Converters that name outputs by position
(``output_0``, ...) are mapped onto the signature's outputs in order. An input whose artifact
signature says ``layout: "NHWC"`` (onnx2tf moved channels last) also accepts the source's
channels-first layout, so callers keep using the package signature.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from unideploy.errors import InputError, PackageError, RefusedValues, RuntimeFailure, first_line
from unideploy.quiet import quiet
from unideploy.runtimes.base import Runtime
from unideploy.signature import CHANNELS_LAST, Signature, TensorSpec, to_channels_last


class TFLiteRuntime(Runtime):
    name = "tflite"
    formats = ("tflite",)
    targets = ("edge", "cpu")
    required_modules = ("ai_edge_litert",)
    extra = "edge"

    def _load(self) -> None:
        from ai_edge_litert.interpreter import Interpreter

        with quiet():  # LiteRT's native log line on its XNNPACK delegate goes to fd 2
            try:
                self.interpreter = Interpreter(model_path=str(self.path), num_threads=self.options.threads)
            except (ValueError, RuntimeError) as exc:
                raise PackageError(f"LiteRT cannot load '{self.path.name}': {first_line(exc)}") from exc
            key, self._outputs = signature_names(self.interpreter, self.signature, self.path.name)
            try:
                self.interpreter.allocate_tensors()  # where the delegate is applied, and logs it
            except RuntimeError as exc:
                # dynamic dims stand at 1 until a call sizes them: a 3x3 convolution cannot be
                # prepared on a 1x1 image, and the signature runner prepares it per call instead
                if not self.signature.has_dynamic_inputs:
                    raise PackageError(f"LiteRT cannot prepare '{self.path.name}': {first_line(exc)}") from exc
            self.runner = self.interpreter.get_signature_runner(key)
        self._channels_last = {t.name: t for t in self.signature.inputs if t.layout == CHANNELS_LAST}
        # outputs the converter left channels-last go back to the source's channels-first layout
        self._channels_first_outputs = {t.name for t in self.signature.outputs if t.layout == CHANNELS_LAST}
        self._lock = threading.Lock()  # an interpreter runs one call at a time

    def describe(self) -> dict[str, Any]:
        return {"runtime": self.name, "threads": self.options.threads or "auto"}

    def run(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        if self._channels_last:
            inputs = {
                k: _to_model_layout(v, self._channels_last[k]) if k in self._channels_last else v
                for k, v in inputs.items()
            }
        self._require_its_size(inputs)
        return super().run(inputs)

    def run_checked(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.run(arrays)  # a channels-first array is moved to the artifact's layout first

    def _require_its_size(self, inputs: Mapping[str, Any]) -> None:
        """An artifact converted at fixed input sizes (onnx2tf, where dims could not stay dynamic)
        refuses others with its own sizes in the caller's layout and what to run instead, rather than
        a mismatch between the caller's layout and its own."""
        for spec in self.signature.inputs:
            given = np.shape(inputs.get(spec.name, ()))
            fixed = all(isinstance(d, int) for d in spec.shape)
            if spec.name not in inputs or not fixed or len(given) != len(spec.shape):
                continue  # a dynamic input, a missing one or another rank: the signature's own check says
            if given != spec.shape:
                last = spec.layout == CHANNELS_LAST
                raise InputError(
                    f"'{self.path.name}' was converted at a fixed size for '{spec.name}': "
                    f"{list(_channels_first(spec.shape) if last else spec.shape)}"
                    + (f" (channels first; {list(spec.shape)} channels last)" if last else "")
                    + f", and this request is {list(given)}",
                    "run an artifact that takes any size (the ONNX one), or export again with --input-shape at this size",
                )

    def _run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            with self._lock:
                outputs = {self._outputs[k]: np.array(v) for k, v in self.runner(**inputs).items()}
            return {k: np.moveaxis(v, -1, 1) if k in self._channels_first_outputs else v for k, v in outputs.items()}
        except (ValueError, RuntimeError) as exc:
            raise _failure(first_line(exc)) from exc

    def close(self) -> None:
        self.__dict__.pop("runner", None)
        self.__dict__.pop("interpreter", None)


def signature_names(interpreter: Any, signature: Signature, file_name: str) -> tuple[str, dict[str, str]]:
    """The model's signature key, and its output names mapped onto the package signature's.

    Generated mobile wrappers (``deploy bundle``) call the model by the same names, so this is the
    one place that decides them.
    """
    try:
        signatures = interpreter.get_signature_list()
    except (ValueError, RuntimeError) as exc:
        raise PackageError(f"LiteRT cannot read the signatures of '{file_name}': {first_line(exc)}") from exc
    if not signatures:
        raise PackageError(f"'{file_name}' has no signature", "convert it with a signature (SavedModel)")
    key, names = next(iter(signatures.items()))
    if set(names["inputs"]) != set(signature.input_names):
        raise PackageError(
            f"'{file_name}' takes inputs {sorted(names['inputs'])} but the signature lists "
            f"{sorted(signature.input_names)}",
            "the package is inconsistent; export it again",
        )
    model, wanted = names["outputs"], signature.output_names
    if set(model) == set(wanted):
        return key, {name: name for name in model}
    positional = [f"output_{i}" for i in range(len(wanted))]
    if sorted(model) == positional:
        return key, dict(zip(positional, wanted))
    raise PackageError(
        f"'{file_name}' returns outputs {sorted(model)} but the signature lists {wanted}",
        "the package is inconsistent; export it again",
    )


def _to_model_layout(value: Any, spec: TensorSpec) -> Any:
    """Move channels last when ``value`` comes in the source's channels-first layout."""
    array = np.asarray(value)
    source = _channels_first(spec.shape)
    fits = array.ndim == len(source) and all(isinstance(d, str) or d == n for d, n in zip(source, array.shape))
    return to_channels_last(array) if fits else value


def _channels_first(shape: tuple[Any, ...]) -> tuple[Any, ...]:
    """A channels-last shape as the source's channels-first layout writes it."""
    return (shape[0], shape[-1], *shape[1:-1])


# LiteRT's words for a kernel whose check failed: "<file>:<line> <condition> was not true.Node
# number 3 (DIV) failed to invoke."
_FAILED_NODE = re.compile(
    r"(?P<check>.*?)\s*(?:was not true\.?)?\s*Node number (?P<node>\d+) \((?P<op>\w+)\) failed to invoke"
)


# a kernel's check on an index the request gave (GATHER's "gather index out of bounds")
_OUT_OF_BOUNDS = re.compile(r"out of (bounds|range)", re.IGNORECASE)


def _failure(said: str) -> RuntimeFailure:
    """What LiteRT said when a run failed, with the operator first: which kernel stopped, at which
    node, on which of its checks (an int8 DIV refuses a divisor quantized to its zero point). A
    check on an index being in range is the request's values (``RefusedValues``), as ONNX Runtime's
    INVALID_ARGUMENT is."""
    found = _FAILED_NODE.search(said)
    if found is None:
        return RuntimeFailure(f"LiteRT failed: {said}")
    check = f", where its check {found['check']} did not hold" if found["check"] else ""
    stopped = f"LiteRT's {found['op']} kernel stopped at node {found['node']} of the model{check}"
    if _OUT_OF_BOUNDS.search(found["check"]):
        return RefusedValues(f"the model refused the input values: {stopped}")
    return RuntimeFailure(stopped)
