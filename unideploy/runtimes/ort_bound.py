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

Two facts of ONNX Runtime's CUDA provider shape how a graph is captured (cuda_execution_provider.h,
cuda_graph.cc, inference_session.cc): it keeps a session's captured graphs in the *calling thread's*
context, so a graph captured on one thread is not there for a call from another, which captures
its own (a thread's first call runs the model until it has: two plain runs for the allocations,
the third captured); and it captures in CUDA's global mode, where a CUDA call any other thread of
the process makes meanwhile fails (error 900) and breaks the capture. So a ``BoundRun`` given a ``thread`` makes its
every call there: the graph captured by ``capture`` is the one its calls replay, whichever thread
asks; the engine captures before it serves (``runtimes/onnxruntime_runtime.py``), and a capture
holds the rest of the process's CUDA work off (``cuda_work.py``).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from typing import Any, TypeVar

import numpy as np

from unideploy.runtimes.cuda_work import CUDA_WORK
from unideploy.runtimes.device_batches import DeviceArray


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


# calls that capture a graph: the first (ONNX Runtime runs it again until it has captured, the
# CUDA provider's min_num_runs_before_cuda_graph_capture_ plain runs first), and one replay, so that
# a graph that cannot replay fails at load rather than on a request
CAPTURE_CALLS = 2

Answer = TypeVar("Answer")

# ONNX Runtime's element type names where numpy's differ
_ORT_TYPES = {"float": "float32", "double": "float64"}


def _not_captured() -> Any:
    """Run options for a run neither captured nor replayed as a CUDA graph (``gpu_graph_id`` -1;
    read by the CUDA provider only)."""
    import onnxruntime as ort

    options = ort.RunOptions()
    options.add_run_config_entry("gpu_graph_id", "-1")
    return options


def _fixed(spec: Any, what: str) -> tuple[np.dtype, tuple[int, ...]]:
    """A session input's or output's dtype and shape, which must be fixed to be bound once."""
    element = spec.type.removeprefix("tensor(").removesuffix(")")
    shape = spec.shape
    if element == "string" or not all(isinstance(d, int) for d in shape):
        raise ValueError(f"{what} '{spec.name}' ({spec.type}, shape {shape}) is not a fixed-size tensor")
    return np.dtype(_ORT_TYPES.get(element, element)), tuple(shape)


class BoundRun:
    """A session run at fixed shapes through IO binding (its own, or those given): its inputs and
    outputs are buffers on ``device`` allocated once (``cuda``: the GPU's memory, where a captured CUDA graph replays;
    ``cpu`` elsewhere). Calls are one at a time (the buffers are the session's), and each answer is
    the caller's own array, never a view of a buffer the next call overwrites. With ``thread`` (a
    single-thread executor; its owner shuts it down), every call is made on that thread, where the
    session keeps the CUDA graph it captured."""

    def __init__(self, session: Any, device: str, thread: Executor | None = None) -> None:
        """Raises ``ValueError`` naming an input or output whose size is not fixed."""
        import onnxruntime as ort

        inputs = {spec.name: _fixed(spec, "input") for spec in session.get_inputs()}
        outputs = {spec.name: _fixed(spec, "output") for spec in session.get_outputs()}
        self.session, self.device, self._thread = session, device, thread
        self._binding = session.io_binding()
        self._dtypes = {name: dtype for name, (dtype, _) in inputs.items()}
        with CUDA_WORK.shared():
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
        """The first calls, on the buffers' zeros: one neither captured nor replayed (``gpu_graph_id``
        -1), which plans the kernels for this shape (a second or so for a CNN on the CUDA provider)
        beside the process's other CUDA work; then, holding that work off (``cuda_work.py``),
        ``CAPTURE_CALLS``: ONNX Runtime captures the CUDA graph in the first and replays it in the
        next. A graph it cannot capture raises here."""
        plain = _not_captured()

        def calls() -> None:
            for _ in range(CAPTURE_CALLS):
                self.session.run_with_iobinding(self._binding)

        self._made(lambda: self.session.run_with_iobinding(self._binding, plain))
        with CUDA_WORK.exclusive():
            self._made(calls)

    def run(self, inputs: Mapping[str, np.ndarray | DeviceArray]) -> dict[str, np.ndarray]:
        """The answer to ``inputs``, copied into the input buffers first: from the host on the
        binding's thread, and a batch merged in GPU memory from device to device by the calling
        thread, which holds the process's CUDA work for it (on the binding's thread, a copy waiting
        for that while a capture waited for the caller would wait for ever)."""
        on_device = {name: given for name, given in inputs.items() if isinstance(given, DeviceArray)}
        for name, given in on_device.items():
            bound = self._inputs[name]
            if given.shape != tuple(bound.shape()) or given.dtype != self._dtypes[name]:
                raise ValueError(f"input '{name}' {given.shape} does not fit its bound {tuple(bound.shape())}")

        def copied_in() -> dict[str, np.ndarray]:
            for name, value in self._inputs.items():
                if name not in on_device:
                    value.update_inplace(np.ascontiguousarray(inputs[name]))
            return self._replayed()

        def from_device() -> None:
            for name, given in on_device.items():
                given.copy_to(int(self._inputs[name].data_ptr()))

        return self._made(copied_in, from_device)

    def replay(self) -> dict[str, np.ndarray]:
        """The answer to what the input buffers already hold: a request that never crossed the
        host costs this (``benchmarks/gpu.py`` times it against ``run``)."""
        return self._made(self._replayed)

    def _made(self, call: Callable[[], Answer], first: Callable[[], None] | None = None) -> Answer:
        """``call``'s answer, one call at a time, made on the binding's thread where it has one
        (CUDA work: ``cuda_work.py``; within ``capture``, the capture's exclusive side), after
        ``first``, made by the calling thread in the same turn."""
        with CUDA_WORK.shared(), self._lock:
            if first is not None:
                first()
            return call() if self._thread is None else self._thread.submit(call).result()

    def _replayed(self) -> dict[str, np.ndarray]:
        self.session.run_with_iobinding(self._binding)
        # from the GPU, numpy() copies to the host; a CPU buffer's numpy() is a view of it
        return {
            name: value.numpy().copy() if self.device == "cpu" else value.numpy()
            for name, value in self._outputs.items()
        }


class GraphSessions:
    """One batch bucket's sessions replaying its CUDA graph, each a ``BoundRun`` on a thread of its
    own: a call takes one that is free. ONNX Runtime allows no concurrent run of a session that
    captures graphs, so with one session the calls of one bucket take turns: at concurrency 32 on
    the H200 both batch threads cut their batches at 8 rows, and so, by the code and that run's
    figures (not yet measured apart: docs/gpu.md), took bucket 8's replays in turn. More sessions
    let them run side by side, each another bucket's memory (``graph_sessions`` in model.yaml).
    ``session``: the first's ONNX Runtime session, for what they all share (inputs, providers)."""

    def __init__(self, runs: Sequence[BoundRun]) -> None:
        self.runs = tuple(runs)
        self._free: queue.SimpleQueue[BoundRun] = queue.SimpleQueue()
        for run in self.runs:
            self._free.put(run)

    @property
    def session(self) -> Any:
        return self.runs[0].session

    def run(self, inputs: Mapping[str, np.ndarray | DeviceArray]) -> dict[str, np.ndarray]:
        """``BoundRun.run`` on a session no other call is using, waiting for one where none is free."""
        bound = self._free.get()
        try:
            return bound.run(inputs)
        finally:
            self._free.put(bound)
