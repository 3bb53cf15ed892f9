"""Fixed-shape ONNX Runtime sessions: a batch bucket's session knows its batch size, and may replay
a captured CUDA graph on buffers bound once.

A bucket's session only ever sees one batch size (``batch_buckets.py``), so it can be told so:
ONNX Runtime then folds the shape arithmetic a dynamic batch leaves in the graph. Exported
EfficientNet-Lite0 keeps the head's reshape (``Shape``, ``Gather``, ``Unsqueeze``, ``Concat``), which
the CUDA provider leaves to the CPU; on the CPU provider 28 of its reshapes went with a fixed batch
(194 -> 153 nodes). With every node on the CUDA provider, a session can capture its calls as a CUDA
graph and replay them, which takes the launch of each kernel off the host: 1.22x at batch 32 and
1.26x at batch 1 for exact fp32 on an H200 (docs/gpu.md), and the fp16 graph could not be captured
until its shape nodes went. A graph replays on the memory it was captured on, so its inputs and
outputs are buffers on the device bound once (``BoundRun``): a call copies the batch in, replays,
and copies the answer out.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def batch_dimension_names(inputs: Sequence[Any], batch_axes: Mapping[str, int | None]) -> list[str]:
    """The symbolic names of the inputs' batch dimensions (``inputs``: a session's ``get_inputs()``)
    that name nothing else: fixing a name that also sizes another axis (a sequence's length, say)
    would fix that axis too."""
    at_batch: set[str] = set()
    elsewhere: set[str] = set()
    for spec in inputs:
        axis = batch_axes.get(spec.name)
        for i, dim in enumerate(spec.shape):
            if isinstance(dim, str):
                (at_batch if i == axis else elsewhere).add(dim)
    return sorted(at_batch - elsewhere)


def fix_batch(session_options: Any, names: Sequence[str], rows: int) -> None:
    """Tell a session its batch dimensions (``batch_dimension_names``) hold ``rows``."""
    for name in names:
        session_options.add_free_dimension_override_by_name(name, rows)


# ONNX Runtime's element type names where numpy's differ
_ORT_TYPES = {"float": "float32", "double": "float64"}


def _fixed(spec: Any, what: str) -> tuple[np.dtype, tuple[int, ...]]:
    """A session input's or output's dtype and shape, which must be fixed to be bound once."""
    element = spec.type.removeprefix("tensor(").removesuffix(")")
    if element == "string" or not all(isinstance(d, int) for d in spec.shape):
        raise ValueError(f"{what} '{spec.name}' ({spec.type}, shape {spec.shape}) is not a fixed-size tensor")
    return np.dtype(_ORT_TYPES.get(element, element)), tuple(spec.shape)


class BoundRun:
    """A session run at fixed shapes through IO binding (its own, or those given): its inputs and
    outputs are buffers on ``device`` allocated once (``cuda``: the GPU's memory, where a captured CUDA graph replays;
    ``cpu`` elsewhere). Calls are one at a time (the buffers are the session's), and each answer is
    the caller's own array, never a view of a buffer the next call overwrites."""

    def __init__(
        self,
        session: Any,
        device: str,
        shapes: Mapping[str, tuple[np.dtype, tuple[int, ...]]] | None = None,
        run_options: Any = None,
    ) -> None:
        """``shapes``: each input's and output's dtype and shape, for a session whose own are not
        fixed (one session replaying a CUDA graph per batch size, the graph's ``gpu_graph_id`` in
        ``run_options``); without them, raises ``ValueError`` naming an input or output whose size
        is not fixed."""
        import onnxruntime as ort

        def sized(spec: Any, what: str) -> tuple[np.dtype, tuple[int, ...]]:
            return shapes[spec.name] if shapes else _fixed(spec, what)

        inputs = {spec.name: sized(spec, "input") for spec in session.get_inputs()}
        outputs = {spec.name: sized(spec, "output") for spec in session.get_outputs()}
        self.session, self.device, self.run_options = session, device, run_options
        self._binding = session.io_binding()
        self._inputs = {
            name: ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, dtype), device, 0)
            for name, (dtype, shape) in inputs.items()
        }
        self._outputs = {
            name: ort.OrtValue.ortvalue_from_shape_and_type(list(shape), dtype.type, device, 0)
            for name, (dtype, shape) in outputs.items()
        }
        for name, value in self._inputs.items():
            self._binding.bind_ortvalue_input(name, value)
        for name, value in self._outputs.items():
            self._binding.bind_ortvalue_output(name, value)
        self._lock = threading.Lock()

    def capture(self) -> None:
        """The first two calls, on the buffers' zeros: ONNX Runtime runs the first plainly (its
        allocations) and captures the CUDA graph on the second; a graph it cannot capture raises here."""
        with self._lock:
            for _ in range(2):
                self.session.run_with_iobinding(self._binding, self.run_options)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The answer to ``inputs``, copied into the input buffers first."""
        with self._lock:
            for name, value in self._inputs.items():
                value.update_inplace(np.ascontiguousarray(inputs[name]))
            return self._replayed()

    def replay(self) -> dict[str, np.ndarray]:
        """The answer to what the input buffers already hold: a request that never crossed the
        host costs this (``benchmarks/gpu.py`` times it against ``run``)."""
        with self._lock:
            return self._replayed()

    def _replayed(self) -> dict[str, np.ndarray]:
        self.session.run_with_iobinding(self._binding, self.run_options)
        # from the GPU, numpy() copies to the host; a CPU buffer's numpy() is a view of it
        return {
            name: value.numpy().copy() if self.device == "cpu" else value.numpy()
            for name, value in self._outputs.items()
        }
