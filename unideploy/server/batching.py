"""Each version's scheduler: one runtime call at a time on a thread of its own, and dynamic
batching, where requests that arrive close together share one runtime call.

Every served version has a ``DynamicBatcher``, as each Triton model instance runs one request at
a time (``max_batch_size`` 1: nothing is merged). When the model is idle a request runs at once.
Requests that queued while the previous batch ran are merged at once; with ``max_delay_s`` above
0 (the default is 0) a batch also waits that long for more, but only when there is concurrent
traffic (others were already queued), so a lone request never pays the delay. Up to
``max_batch_size`` rows are merged along the batch axis (only requests whose other dimensions
agree) and the outputs are split back by rows; where a merged call fails, its requests run again
in halves until each has its own outcome, so a request whose values the model refuses fails only
itself. A request of more rows runs in calls of ``max_batch_size`` rows. The runtime call runs in
a worker thread, except for models measured at warm-up to answer faster than that hand-off
(``LoopBudget``).

Merging is one copy, made in the worker thread: each request's rows are written straight into the
batch, at the size of the engine's batch bucket where it pads to buckets (a GPU session that
costs a re-plan per new shape), the rows past the real ones filled with the last real row, so the
engine's own padding finds nothing to do. On an H200 serving EfficientNet-Lite0, merging on the
event loop and padding again in the thread made a 16-row call cost 9.5 ms in the server against
3.2 ms in process (docs/gpu.md). Where the buckets' call times were measured at warm-up
(``bucket_seconds``), a batch that would mostly be padding runs the requests that fill the bucket
below and carries the others into the next batch, ahead of later arrivals (``cut_at_bucket``).
An input that every request of a batch keeps in shared memory the GPU can copy from (CUDA shared
memory, or a system segment page-locked for it) is merged in GPU memory by the GPU's own copies,
where the runtime reads batches there (``runtimes/device_batches.py``).

``in_flight``: how many merged batches may run at once, each on a thread of its own (Triton's
instance count). A GPU session's run is mostly waiting for the device and for copies; a second
batch merged and copied while the first runs keeps the device busy. On the CPU one (the default):
a run's threads take every core. Batches are gathered on the event loop: a turn after requests
arrive (those of one turn merge), and, where batches run side by side, in the callback that hands
a finished batch back, so a batch thread's next batch starts before the loop answers the last
one's requests (on the CPU a few turns later, merging what arrived meanwhile: ``_start``). They
share one runtime: a runtime each (Triton's instances) measured no faster on an H200, in process
or served (docs/gpu.md).

With lanes (``model.yaml``'s ``lanes``), requests that queue are not merged but run side by side,
one per lane, each lane a session with a share of the cores; a lone request still runs on the
session with all of them, and never while a lane runs, so the cores are never asked for twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from functools import partial
from itertools import accumulate, zip_longest
from typing import NamedTuple, TypeGuard, TypeVar

import numpy as np

from unideploy.errors import InputError
from unideploy.runtimes.batch_buckets import bucket_for, cut_at_bucket, pieces
from unideploy.runtimes.device_batches import DeviceArray, DeviceBatches, DeviceBatchFailure, DeviceBuffers
from unideploy.runtimes.pinned import BatchBuffers, KeptBuffers
from unideploy.samples import Axes, batch_size_of, join_rows, resize_batch, row_axis, rows_along, take_rows
from unideploy.server.unread import Unread, read_all, read_into
from unideploy.signature import contiguous

Tensors = dict[str, np.ndarray]
Inputs = Mapping[str, "np.ndarray | Unread"]  # a request's: some may still be in a client's shared memory
Result = TypeVar("Result")
log = logging.getLogger("unideploy.server")


@dataclass
class _Pending:
    inputs: Inputs
    rows: int
    future: asyncio.Future
    axes: Axes | None = None  # each input's batch axis (axis 0 where None)
    enqueued: float = field(default_factory=time.perf_counter)
    retry: object | None = None  # its merged batch failed: the half it runs again with (``_split``)

    @property
    def key(self) -> tuple:
        """What requests must share to be merged: each input's dtype and shape but for its batch
        axis, and a scalar input's value (a sample rate is one value for the whole call)."""
        return tuple(
            (k, _without(v.shape, row_axis(self.axes, k, v)), v.dtype.str, v.tobytes() if _scalar(v) else None)
            for k, v in sorted(self.inputs.items())
        )


def _scalar(value: np.ndarray | Unread) -> TypeGuard[np.ndarray]:
    return isinstance(value, np.ndarray) and value.ndim == 0  # an Unread has a dimension


def _without(shape: tuple[int, ...], axis: int | None) -> tuple[int, ...]:
    return shape if axis is None else shape[:axis] + shape[axis + 1 :]


def output_batch_axes(
    run: Callable[[Tensors], Tensors], sample: Tensors, answered: Tensors, axes: Axes
) -> dict[str, int] | None:
    """Where each output's batch is, measured: what ``run`` ``answered`` for the sample against its
    answer at one row more, each output's one axis that grew by that row. None where an output has
    no such axis or more than one (an output every row shares, a count of detections): such a
    model's requests are not merged, since its answers could not be split back."""
    rows = batch_size_of(sample, axes)
    more = run(resize_batch(sample, rows + 1, axes))
    found: dict[str, int] = {}
    for name, value in answered.items():
        grown = [
            a
            for a, (before, after) in enumerate(zip(value.shape, more[name].shape))
            if (before, after) == (rows, rows + 1)
        ]
        if len(grown) != 1 or value.ndim != more[name].ndim:
            return None
        found[name] = grown[0]
    return found


# A model whose warm-up request answers within this runs on the event loop itself: handing a call
# to a worker thread and back costs 0.13 ms back to back and 0.25 ms after idling on this machine.
INLINE_RUN_S = 0.0002
# A call on the event loop that takes longer than this has held up every other request of the
# server by as much: where it computed for at least LOOP_CALL_CPU_S of it on the loop's own thread,
# its version's calls go to a worker thread from then on (``LoopBudget``).
LOOP_CALL_LIMIT_S = 10 * INLINE_RUN_S
LOOP_CALL_CPU_S = LOOP_CALL_LIMIT_S / 4


class LoopBudget:
    """How large a call of one version may run on the event loop itself (``max_bytes``, from
    ``inline_bytes``; 0: none), shared by the version's callers, and the watch that ends it.

    The bound was measured on the warm-up sample, but a model's work can depend on its inputs'
    values (a loop's trip count, a size read from a tensor, the boxes a detector keeps), and while
    a call runs on the loop no other request of the server is read or answered. So each call on
    the loop is timed, and the first one past ``LOOP_CALL_LIMIT_S`` that the loop's thread spent
    at least ``LOOP_CALL_CPU_S`` of computing sends the version's calls to its worker thread for
    as long as it stays loaded, with one warning that says so. The CPU time tells a call that
    worked from one whose thread waited for a core: on a busy machine the fast digits model's
    calls took 2.6-5.9 ms with two CPU hogs beside the server, and were moved for nothing when
    only the clock was read. (ONNX Runtime's calling thread works its share of each parallel
    section and, spinning by default within a run, waits for the rest on the CPU.)"""

    def __init__(self, max_bytes: int = 0, served_as: str = "a model version") -> None:
        self.max_bytes = max_bytes
        self.served_as = served_as

    def takes(self, parts: Sequence[Inputs]) -> bool:
        """Whether a call on ``parts`` runs on the event loop."""
        return bool(self.max_bytes) and sum(a.nbytes for p in parts for a in p.values()) <= self.max_bytes

    def run(self, call: Callable[..., Result], *args: object) -> Result:
        """``call(*args)`` on the event loop, timed; past the limit, the last call there."""
        start, computing = time.perf_counter(), time.thread_time()  # 0.04 us and 0.4 us
        try:
            return call(*args)
        finally:
            took = time.perf_counter() - start
            if took > LOOP_CALL_LIMIT_S and self.max_bytes:
                computed = time.thread_time() - computing
                if computed >= LOOP_CALL_CPU_S:
                    self.max_bytes = 0
                    log.warning(
                        "%s: a call took %.1f ms on the event loop (%.1f ms of it computing), where its warm-up "
                        "answered within %.1f ms; its calls run on a worker thread from now on, so that other "
                        "requests do not wait for them",
                        self.served_as,
                        1000 * took,
                        1000 * computed,
                        1000 * INLINE_RUN_S,
                    )


class UnreadInputs(Exception):
    """Every request of a batch failed to read its inputs (``merged``): each its own error."""

    def __init__(self, failed: dict[int, Exception]) -> None:
        super().__init__(next(iter(failed.values())))
        self.failed = failed


def merged(
    parts: Sequence[Inputs],
    size: int,
    axes: Axes | None = None,
    buffers: BatchBuffers | None = None,
    failed: dict[int, Exception] | None = None,
    readers: Executor | None = None,
    devices: DeviceBuffers | None = None,
) -> Tensors:
    """The requests ``parts`` as one batch of ``size`` rows along each input's batch axis
    (``axes``; axis 0 where None): each request's rows copied once into place, any rows past theirs
    filled with the last real row (a bucket's padding: a real row, never values the model was not
    made for). A scalar is the same in every part (the merge key). The batch is written into
    ``buffers`` where given (kept, and on a GPU page-locked: ``runtimes.pinned``), else new arrays;
    a lone request of the batch's size is run as it is, unless an input is still in shared memory
    and there are buffers: it is read into them, as into a batch (the same one copy, into memory
    the GPU copies from directly and whose pages are already there, not a new array).

    An input still in a client's shared memory (``Unread``) is read straight into its rows (by
    ``readers`` side by side, where given: ``read_into``). An input that ``devices``' GPU can copy
    where every part holds it (``Unread.reaches_gpu``: a CUDA region, a page-locked system segment)
    is merged in GPU memory instead, in ``devices`` (a ``DeviceArray``: ``runtimes.device_batches``),
    the GPU copying each part's rows; their failure raises ``DeviceBatchFailure``. Where a read fails (the client shrank its segment or
    unregistered the region meanwhile), the part's index and error go into ``failed`` (raised where
    it is None) and its rows hold another part's first row, so one client's mistake fails its own
    request only; where every part fails, ``UnreadInputs``."""
    first = parts[0]
    if devices is not None and not devices.usable:
        devices = None
    if (
        len(parts) == 1
        and all((axis := row_axis(axes, k, a)) is None or a.shape[axis] == size for k, a in first.items())
        and ((buffers is None and devices is None) or not any(isinstance(a, Unread) for a in first.values()))
    ):  # as it is; but an input still in shared memory is read into the kept (page-locked) buffer
        return read_all(first)
    starts = list(accumulate((batch_size_of(p, axes) for p in parts), initial=0))
    lost: dict[int, Exception] = {}
    unread: list[tuple[int, Unread, np.ndarray]] = []  # (part, input, its rows in the batch)
    batch: dict[str, np.ndarray | DeviceArray] = {}
    for name, array in first.items():
        axis = row_axis(axes, name, array)
        if axis is None:
            batch[name] = np.asarray(array)  # a scalar, read with its request (the merge key holds it)
            continue
        shape = list(array.shape)
        shape[axis] = size
        if devices is not None and axis == 0 and all(_on(devices, part[name]) for part in parts):
            batch[name] = devices.array(name, tuple(shape), array.dtype)
            continue
        out = buffers.array(name, tuple(shape), array.dtype) if buffers is not None else np.empty(shape, array.dtype)
        for i, part in enumerate(parts):
            rows = rows_along(out, axis, starts[i], starts[i + 1])
            if not isinstance(value := part[name], Unread):
                rows[...] = value
            else:
                unread.append((i, value, rows))
        batch[name] = out
    for (i, _, _), error in zip(unread, read_into([(u, rows) for _, u, rows in unread], readers), strict=True):
        if error is not None:
            lost.setdefault(i, error)
    on_gpu = {name: held_there for name, held_there in batch.items() if isinstance(held_there, DeviceArray)}
    with ExitStack() as held:  # the regions stay held until the GPU's copies from them are done
        try:
            for name, target in on_gpu.items():
                _copy_on_device(parts, name, target, starts, held, lost)
            if lost and failed is None:
                raise next(iter(lost.values()))
            if len(lost) == len(parts):
                raise UnreadInputs(lost)
            good = next(i for i in range(len(parts)) if i not in lost)
            for name, kept in batch.items():
                if (axis := row_axis(axes, name, kept)) is None:
                    continue
                for i in lost:
                    _fill(kept, axis, starts[i], starts[i + 1], starts[good])
                _fill(kept, axis, starts[-1], size, starts[-1] - 1)
        finally:
            if on_gpu and devices is not None:  # a batch merged on the host waits for no stream
                devices.synchronize()
    if failed is not None:
        failed.update(lost)
    return batch  # type: ignore[return-value]  # a DeviceArray only for a runtime that takes them


def _on(devices: DeviceBuffers, value: np.ndarray | Unread) -> bool:
    """Whether the GPU ``devices`` merges on can copy ``value`` where it lies, and need not: values
    to be checked are read on the host (``Unread.checked_by``)."""
    return isinstance(value, Unread) and value.checked_by is None and value.reaches_gpu(devices.device)


def _copy_on_device(
    parts: Sequence[Inputs], name: str, out: DeviceArray, starts: Sequence[int], held: ExitStack, lost: dict
) -> None:
    """Each part's input ``name`` copied from its region into its rows of ``out`` by the GPU, queued
    on ``out``'s stream (each region held by ``held``); a part whose region is gone is ``lost``."""
    row = out.row_nbytes
    for i, part in enumerate(parts):
        value = part[name]
        assert isinstance(value, Unread)
        try:
            source = held.enter_context(value.on_gpu(out.copies.device))
        except InputError as exc:
            lost.setdefault(i, exc)
            continue
        out.copies.copy(out.pointer + starts[i] * row, source, (starts[i + 1] - starts[i]) * row)


def _fill(out: np.ndarray | DeviceArray, axis: int, start: int, stop: int, source: int) -> None:
    """Rows ``start:stop`` of ``out`` made copies of its row ``source``: in GPU memory by doubling
    the rows already copied (a few copies for a bucket's padding, not one a row)."""
    if start >= stop:
        return
    if not isinstance(out, DeviceArray):
        rows_along(out, axis, start, stop)[...] = rows_along(out, axis, source, source + 1)
        return
    row = out.row_nbytes
    out.copies.copy(out.pointer + start * row, out.pointer + source * row, row)
    done = start + 1
    while done < stop:
        count = min(done - start, stop - done)
        out.copies.copy(out.pointer + done * row, out.pointer + start * row, count * row)
        done += count


class CallParts(NamedTuple):
    """Where one runtime call's time went, in seconds: waiting for its batch thread to start
    (``to_thread``), merging its requests into the batch (``input``: Triton's compute_input), the
    runtime's run (``infer``: compute_infer; on a GPU it includes the copies to and from the
    device), and waiting for the event loop to take the answers back (``from_thread``). A call on
    the event loop has no hand-offs. Served, the request-duration stage ``compute`` is their sum;
    apart, they say whether a slow call was the model, the merge, or the threads waiting for a core
    or for Python's GIL (docs/server.md, Metrics)."""

    to_thread: float = 0.0
    input: float = 0.0
    infer: float = 0.0
    from_thread: float = 0.0


Pieces = tuple[tuple[int, float], ...]  # the calls one batch ran as: each one's rows and seconds


@dataclass(frozen=True)
class Caller:
    """How the event loop calls one version's runtime: in a worker thread, or on the loop itself
    when the version answered its warm-up (or its largest merged batch) within ``INLINE_RUN_S`` and
    the call's inputs are no larger than that (``on_loop``, shared by the version's callers; by
    default never), so a large batch never blocks the loop. The requests are merged where the call
    runs (``merged``)."""

    run: Callable[[Tensors], Tensors]
    executor: Executor
    on_loop: LoopBudget = field(default_factory=LoopBudget)

    axes: Axes | None = None  # each input's batch axis (axis 0 where None)
    buffers: BatchBuffers | None = None  # where merged batches are written: this caller's own
    readers: Executor | None = None  # threads reading a batch's shared-memory inputs side by side
    devices: DeviceBuffers | None = None  # where inputs in GPU memory are merged: this caller's own
    rows_per_call: int = 0  # the most rows one runtime call is given (``max_batch_size``; 0: any)
    output_axes: Mapping[str, int] | None = None  # each output's batch axis, where they split by rows

    def splits(self, rows: int) -> bool:
        """Whether a batch of ``rows`` runs as more than one call (``_in_calls``)."""
        return bool(self.rows_per_call) and rows > self.rows_per_call and self.output_axes is not None

    def _in_calls(self, run: Callable[[Tensors], Tensors], batch: Tensors) -> tuple[Tensors, Pieces]:
        """``run``'s outputs for ``batch``, and, where it ran as more than one call, each call's rows
        and seconds. A batch of more than ``rows_per_call`` rows (one request of more rows than the
        version merges, up to ``--max-request-rows``) runs as consecutive calls of at most that many,
        each call's outputs written into the whole answer's as they come (its pieces and their join,
        held at once, took twice the answer's memory): ``max_batch_size`` bounds what one call asks
        of the runtime's memory, whoever sends the request (one MiniLM request of 2,048 rows of 128
        tokens, 25 MB, took the server from 237 MB to 6.7 GB in one call; in calls of 32 rows, to
        361 MB). A batch in GPU memory runs as it is: that runtime runs sizes past its buckets in
        pieces."""
        rows = batch_size_of(batch, self.axes)
        if not self.splits(rows) or any(isinstance(value, DeviceArray) for value in batch.values()):
            return run(batch), ()
        outputs: dict[str, np.ndarray] = {}
        texts: list[Tensors] = []  # text outputs' pieces: their width is each piece's own
        calls = []
        for piece in pieces(rows, self.rows_per_call):
            part = {k: contiguous(v) for k, v in take_rows(batch, piece.start, piece.stop, self.axes).items()}
            start = time.perf_counter()
            answer = run(part)
            calls.append((piece.stop - piece.start, time.perf_counter() - start))
            texts.append({k: v for k, v in answer.items() if v.dtype.kind in "OSU"})
            for name, value in answer.items():  # written into the whole answer as it comes: held once
                if value.dtype.kind in "OSU":
                    continue
                if value.ndim == 0:  # one value for every row
                    outputs.setdefault(name, value)
                    continue
                axis = row_axis(self.output_axes, name, value) or 0
                if name not in outputs:
                    outputs[name] = np.empty((*value.shape[:axis], rows, *value.shape[axis + 1 :]), value.dtype)
                rows_along(outputs[name], axis, piece.start, piece.stop)[...] = value
        if texts[0]:
            outputs.update(join_rows(texts, self.output_axes))
        return {name: outputs[name] for name in answer}, tuple(calls)  # in the model's order

    def _merge_and_run(
        self, parts: Sequence[Inputs], size: int, failed: dict[int, Exception], run: Callable[[Tensors], Tensors]
    ) -> tuple[Tensors, Pieces, float, float, float]:
        """``run``'s outputs (``_in_calls``: and the calls it made, where more than one), and when
        the merge started, when the run started and when it ended. A batch that could not be
        assembled or run in GPU memory is merged on the host instead, as every later one
        (``DeviceBatches``)."""
        start = time.perf_counter()
        devices = self.devices
        while True:
            try:
                batch = merged(parts, size, self.axes, self.buffers, failed, self.readers, devices)
                running = time.perf_counter()
                outputs, calls = self._in_calls(run, batch)
                return outputs, calls, start, running, time.perf_counter()
            except DeviceBatchFailure as exc:
                if devices is None:
                    raise
                devices.batches.failed(str(exc))
                devices = None
                failed.clear()

    def _budgeted(self, batch: Tensors) -> Tensors:
        """The run on the event loop, in the loop's budget: the run only (it may depend on the
        values); the merge's time is the bytes', bounded by ``takes``, and reading shared memory
        costs the kernel more."""
        return self.on_loop.run(self.run, batch)

    def start(self, parts: Sequence[Inputs], size: int, done: Callable[[Ran | Exception], None]) -> None:
        """``run`` on ``parts`` merged into ``size`` rows; ``done`` is told, on the event loop, the
        outputs, where the call's time went and the parts whose inputs could not be read
        (``merged``), or the call's error. On the loop itself where its budget takes the call
        (``done`` before this returns), else on the caller's thread, whose end is one callback on
        the loop, not a task to resume (on a GPU the next batch starts in that callback: ``_start``)."""
        failed: dict[int, Exception] = {}
        if self.on_loop.takes(parts):
            try:
                outputs, calls, start, running, ended = self._merge_and_run(parts, size, failed, self._budgeted)
            except Exception as exc:  # the call's failure: the batcher answers it (``DynamicBatcher._answer``)
                done(exc)
                return
            done(Ran(outputs, CallParts(input=running - start, infer=ended - running), failed, calls))
            return
        loop = asyncio.get_running_loop()
        handed = time.perf_counter()

        def back(call: Future) -> None:  # on the event loop
            back = time.perf_counter()
            try:
                outputs, calls, start, running, ended = call.result()
            except Exception as exc:
                done(exc)
                return
            parts = CallParts(start - handed, running - start, ended - running, back - ended)
            done(Ran(outputs, parts, failed, calls))

        def tell(call: Future) -> None:  # on the caller's thread
            with suppress(RuntimeError):  # the loop closed meanwhile (the server stopped): nobody waits
                loop.call_soon_threadsafe(back, call)

        self.executor.submit(self._merge_and_run, parts, size, failed, self.run).add_done_callback(tell)


class Ran(NamedTuple):
    """A runtime call's outputs, where its time went, the parts it could not read (by index), and
    the calls it ran as, where more than one (``Caller._in_calls``)."""

    outputs: Tensors
    parts: CallParts
    failed: dict[int, Exception]
    calls: Pieces = ()


def _fastest(call: Callable[[], object], first_s: float) -> float:
    """The fastest of ``first_s`` (a call already timed) and up to three more ``call``s, stopping
    once it is clearly too slow for the event loop (a slow model pays no run more at load)."""
    fastest = first_s
    for _ in range(3):
        if fastest > 10 * INLINE_RUN_S:
            break
        start = time.perf_counter()
        call()
        fastest = min(fastest, time.perf_counter() - start)
    return fastest


def inline_bytes(
    run: Callable[[Tensors], Tensors],
    sample: Tensors,
    warm_up_s: float,
    largest: int = 0,
    axes: Axes | None = None,
) -> int:
    """``LoopBudget.max_bytes`` for a runtime whose warm-up request took ``warm_up_s``: the sample's
    size where it answers within ``INLINE_RUN_S`` (run again, best of three), and where the largest
    batch the version merges (``largest`` rows along ``axes``; 0: it merges none) also does, merge
    included, that batch's size: merged batches of a model this small then run on the loop too (a
    16-byte model's two-row batches went to a worker thread, and 16 concurrent gRPC clients were
    answered 5-10 % slower, docs/server.md)."""
    if _fastest(lambda: run(sample), warm_up_s) >= INLINE_RUN_S:
        return 0
    one = sum(np.asarray(a).nbytes for a in sample.values())
    rows = batch_size_of(sample, axes)
    if largest <= rows:
        return one
    parts = [sample] * -(-largest // rows)
    size = rows * len(parts)
    start = time.perf_counter()
    run(merged(parts, size, axes))
    if _fastest(lambda: run(merged(parts, size, axes)), time.perf_counter() - start) >= INLINE_RUN_S:
        return one
    return one * len(parts)


@dataclass
class BatchResult:
    outputs: Tensors
    queue_s: float
    compute_s: float
    batch_rows: int


class DynamicBatcher:
    """One version's queue of requests, run one batch at a time (``in_flight`` at a time) on a
    thread of its own (one each).

    ``run`` is the version's runtime; ``inline_bytes`` as for ``LoopBudget`` (``served_as`` names
    the version in its warning); ``on_call`` is told the rows of each runtime call that answered,
    how many requests it answered and where its time went (the batch-size metric: one observation
    per call, as Triton counts executions; the call's parts, ``CallParts``; and Triton's statistics,
    which count compute once per request); ``on_failed`` of each call that failed, and whether its
    requests then run again in halves (``_split``) or are answered its error (an operator's sign of
    a client sending values the model refuses). The thread is the batcher's, not the server's pool:
    with a pool each call woke a second idle worker besides the one that took it, which then
    competed with ONNX Runtime's threads for the GIL and the cores. With its own thread
    EfficientNet-Lite0 at concurrency 1 answered with a p99 of 6.6-8.0 ms instead of 12.5-17.2 ms,
    and its runtime call took 4.1-4.3 ms instead of 4.5-5.2 ms on average (perf_analyzer, three
    alternating rounds, docs/server.md).

    ``lanes``: callers of more sessions, each given a thread of its own too. A session whose
    threads share the cores waits at every parallel section for a thread the network took; a
    one-thread lane never waits, which is worth more than merging where merging does not pay
    (EfficientNet-Lite0 on 2 cores: docs/server.md, "Lanes")."""

    def __init__(
        self,
        run: Callable[[Tensors], Tensors],
        max_batch_size: int,
        max_delay_s: float,
        *,
        inline_bytes: int = 0,
        lanes: Sequence[Callable[[Tensors], Tensors]] = (),
        buckets: Sequence[int] = (),
        bucket_seconds: Mapping[int, float] | None = None,
        in_flight: int = 1,
        axes: Axes | None = None,
        output_axes: Mapping[str, int] | None = None,
        buffers: Callable[[], BatchBuffers] | None = None,
        readers: int = 0,
        device_batches: DeviceBatches | None = None,
        served_as: str = "a model version",
        on_call: Callable[[int, int, CallParts], None] | None = None,
        on_failed: Callable[[bool], None] | None = None,
    ) -> None:
        self._threads = [ThreadPoolExecutor(1, thread_name_prefix=f"unideploy-batch-{i}") for i in range(in_flight)]
        self.on_loop = LoopBudget(inline_bytes, served_as)  # one for every caller of the version's runtime
        self._on_call = on_call or (lambda rows, requests, parts: None)
        self._on_failed = on_failed or (lambda halved: None)
        # a call's rows are bounded where its answers split by rows (a request of more runs in pieces)
        per_call = max_batch_size if max_batch_size > 1 else 0
        self._call = Caller(run, self._threads[0], self.on_loop, axes, rows_per_call=per_call, output_axes=output_axes)
        self._idle: deque[Caller] = deque()  # the callers not running a batch
        self._buffers = [buffers() for _ in self._threads] if buffers else []  # each batch thread its own
        self._devices = [device_batches.buffers() for _ in self._threads] if device_batches else []
        # shared by the batch threads; its threads start only when a merge reads shared memory
        self._readers = ThreadPoolExecutor(readers, thread_name_prefix="unideploy-read") if readers > 1 else None
        for thread, own, devices in zip_longest(self._threads, self._buffers, self._devices):
            self._idle.append(
                Caller(run, thread, self.on_loop, axes, own, self._readers, devices, per_call, output_axes)
            )
        self.axes, self.output_axes = axes, output_axes  # where the rows are (axis 0 where None)
        self._deciding = 0  # requests waiting a turn to see whether they are alone (``submit``)
        self.max_batch_size = max_batch_size
        self.max_delay_s = max_delay_s
        self.buckets = tuple(sorted(buckets))  # the engine's batch buckets: merged batches are padded to them
        self.bucket_seconds = dict(bucket_seconds or {})  # their measured call times: ``cut_at_bucket``
        self._waiting: deque[_Pending] = deque()  # requests not gathered yet, in arrival order
        self._carried: deque[_Pending] = deque()  # gathered by one round, left to the next: served first
        self._soon: asyncio.Handle | None = None  # ``_dispatch`` at the loop's next turn
        self._delayed: asyncio.TimerHandle | None = None  # ``_dispatch`` once a batch's delay is up
        self._dispatching = False
        self._closed = False
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()  # with lanes: requests not started yet
        self._task: asyncio.Task | None = None  # the lanes' loop
        self._lane_threads = [
            ThreadPoolExecutor(1, thread_name_prefix=f"unideploy-lane-{i}") for i in range(len(lanes))
        ]
        self._idle_lanes: asyncio.Queue[Caller] = asyncio.Queue()
        for lane, thread in zip(lanes, self._lane_threads, strict=True):
            self._idle_lanes.put_nowait(
                Caller(lane, thread, axes=axes, rows_per_call=per_call, output_axes=output_axes)
            )
        self._lane_runs: set[asyncio.Task] = set()

    @property
    def in_flight(self) -> int:
        """How many merged batches may run at once."""
        return len(self._threads)

    @property
    def merges(self) -> bool:
        """Whether requests are ever merged (lanes run them side by side instead)."""
        return not self._lane_threads and self.max_batch_size > 1

    async def submit(self, inputs: Inputs) -> BatchResult:
        rows = batch_size_of(inputs, self.axes)
        if self._alone(inputs) and not self._call.splits(rows):
            enqueued = time.perf_counter()
            self._deciding += 1
            try:  # one turn of the loop: requests that arrived with this one reach submit meanwhile
                await asyncio.sleep(0)
            finally:
                self._deciding -= 1
            if self._idle_now():  # none did
                arrays = read_all(inputs)
                start = time.perf_counter()
                try:
                    outputs = self.on_loop.run(self._call.run, arrays)
                except Exception:
                    self._on_failed(False)
                    raise
                compute = time.perf_counter() - start
                self._on_call(rows, 1, CallParts(infer=compute))
                return BatchResult(outputs, start - enqueued, compute, rows)
        pending = _Pending(inputs, rows, asyncio.get_running_loop().create_future(), self.axes)
        if self._lane_threads:
            if self._task is None:
                self._task = asyncio.get_running_loop().create_task(self._lanes_loop())
            await self._queue.put(pending)
        else:
            self._waiting.append(pending)
            self._dispatch_soon()
        return await pending.future

    def _alone(self, inputs: Inputs) -> bool:
        """Whether a request may run at once, on the event loop, instead of through the queue and
        the batch loop (two turns of the loop and a task fewer: 5-10 % of a trivial model's request
        in the server, docs/server.md): its version runs such calls on the loop (``LoopBudget``), is
        idle, and no other request is queued or about to be; bursts are still merged, as the
        requests that arrive with it find it deciding and queue."""
        return (
            not self._deciding
            and self._idle_now()
            and not self.buckets
            and not self._lane_threads
            and self.on_loop.takes([inputs])
        )

    def _idle_now(self) -> bool:
        """Nothing queued or held back, no batch running."""
        return not self._waiting and not self._carried and len(self._idle) == self.in_flight

    def _dispatch_soon(self) -> None:
        """``_dispatch`` at the loop's next turn, once however many requests arrive in this one: those
        that arrive together merge."""
        if self._soon is None:
            self._soon = asyncio.get_running_loop().call_soon(self._dispatch)

    def _dispatch(self) -> None:
        """Start a batch on every idle caller while requests wait. Called a turn after requests
        arrive, and where batches run side by side at once when a caller finishes: a batch thread's
        next batch starts in the callback that hands its last one back, before that one's answers
        are handed out, so the device does not idle for the event loop's turns in between (on an
        H200 at concurrency 32 the batch threads waited about 1 ms of each 4-5 ms call for them,
        docs/gpu.md)."""
        if self._dispatching or self._closed:
            return  # a batch on the loop answered within the dispatch: the dispatch goes on
        for handle in (self._soon, self._delayed):
            if handle is not None:
                handle.cancel()
        self._soon = self._delayed = None
        if self._deciding:  # a request deciding whether to run alone joins this batch instead
            self._dispatch_soon()
            return
        self._dispatching = True
        try:
            while self._idle and (self._carried or self._waiting):
                gathered = self._gather()
                if gathered is None:  # waiting for more until the first request's delay is up
                    break
                group, rows = gathered
                call = self._idle.popleft()
                self._start(group, rows, call, partial(self._finished, call), at_once=self.in_flight > 1)
        finally:
            self._dispatching = False

    def _finished(self, call: Caller) -> None:
        """``call`` ran its batch: it takes the next one, at once where batches run side by side,
        else at the next turn (``_start``)."""
        self._idle.append(call)
        if self.in_flight > 1:
            self._dispatch()
        else:
            self._dispatch_soon()

    def _gather(self) -> tuple[list[_Pending], int] | None:
        """The next batch: the requests carried over first, then those waiting, in order, as many
        as fit ``max_batch_size`` and share the first's key; those that do not fit stay first in
        line. With ``max_delay_s`` and others waiting, None until the batch is full or the first
        request's delay is up (a lone request never waits); where buckets' call times are known, a
        batch that would mostly be padding is cut at the bucket below (``cut_at_bucket``)."""
        first = self._carried.popleft() if self._carried else self._waiting.popleft()
        if first.retry is not None:  # half of a failed batch: with the rest of its half, nothing else
            group = [first, *(p for p in self._carried if p.retry is first.retry)]
            self._carried = deque(p for p in self._carried if p.retry is not first.retry)
            return group, sum(p.rows for p in group)
        group, rows, key = [first], first.rows, first.key
        leftovers: list[_Pending] = []
        while rows < self.max_batch_size and (self._carried or self._waiting):
            item = self._carried.popleft() if self._carried else self._waiting.popleft()
            if item.key == key and rows + item.rows <= self.max_batch_size and item.retry is None:
                group.append(item)
                rows += item.rows
            else:
                leftovers.append(item)
        wait = first.enqueued + self.max_delay_s - time.perf_counter()
        if wait > 0 and rows < self.max_batch_size and len(group) + len(leftovers) > 1:
            self._carry([*group, *leftovers])
            self._delayed = asyncio.get_running_loop().call_later(wait, self._dispatch)
            return None
        if self.bucket_seconds:  # mostly padding: the rows that fill the bucket below now, the rest next
            kept = cut_at_bucket([p.rows for p in group], self.buckets, self.bucket_seconds)
            leftovers += group[kept:]
            group, rows = group[:kept], sum(p.rows for p in group[:kept])
        self._carry(leftovers)
        return group, rows

    def _carry(self, held: list[_Pending]) -> None:
        """``held`` served by the next round, first, in arrival order."""
        if held:
            self._carried = deque(sorted([*held, *self._carried], key=lambda p: p.enqueued))

    async def _lanes_loop(self) -> None:
        lanes = len(self._lane_threads)
        while True:
            first = await self._queue.get()
            if self._queue.empty() and self._idle_lanes.qsize() == lanes:
                await self._execute([first], first.rows, self._call)  # alone: every core
                continue
            lane = await self._idle_lanes.get()
            run = asyncio.get_running_loop().create_task(self._on_lane(lane, first))
            self._lane_runs.add(run)
            run.add_done_callback(self._lane_runs.discard)

    async def _on_lane(self, lane: Caller, pending: _Pending) -> None:
        try:
            await self._execute([pending], pending.rows, lane)
        finally:
            self._idle_lanes.put_nowait(lane)

    async def _execute(self, group: list[_Pending], rows: int, call: Caller) -> None:
        """``_start``, awaited: the group answered."""
        answered = asyncio.get_running_loop().create_future()
        self._start(group, rows, call, lambda: answered.set_result(None), at_once=True)
        await answered

    def _start(self, group: list[_Pending], rows: int, call: Caller, then: Callable[[], None], at_once: bool) -> None:
        """Run ``group`` merged (padded to its bucket) on ``call``; once it ran, each request answered
        with its rows, or the call's error, and ``then`` (the caller is free again). ``at_once``
        (batches that run side by side: a GPU's): ``then`` first, in the callback that ends the call,
        so the next batch starts before the answers go out. Otherwise (one batch at a time: the
        CPU, whose run takes the cores the loop needs too) the answers go a turn later and ``then``
        a turn after them, so the next batch, gathered at the turn after that, merges what arrived
        meanwhile, as the task-based batch loop did before: gathering at once merged 2.3-2.9 rows a
        call instead of 3.9 and served 13 % less (the averaging model, 600 KB over HTTP at
        concurrency 8, one process on 2 cores, docs/server.md)."""
        start = time.perf_counter()
        size = bucket_for(rows, self.buckets) if self.buckets and rows <= self.buckets[-1] else rows
        loop = asyncio.get_running_loop()

        def answer(outcome: Ran | Exception) -> None:
            self._answer(group, rows, size, start, outcome)
            loop.call_soon(then)

        def ran(outcome: Ran | Exception) -> None:
            if at_once:
                then()
                self._answer(group, rows, size, start, outcome)
            else:
                loop.call_soon(answer, outcome)

        call.start([p.inputs for p in group], size, ran)

    def _answer(self, group: list[_Pending], rows: int, size: int, start: float, outcome: Ran | Exception) -> None:
        """Each request of ``group``, whose call started at ``start``, its rows of the outputs, or its
        error: the call's (where it ran alone; a merged batch's requests run again, in halves:
        ``_split``), or its own where its inputs could not be read."""
        if isinstance(outcome, Exception):
            if not isinstance(outcome, UnreadInputs):  # the runtime was called (not so where no input was read)
                halved = len(group) > 1
                self._on_failed(halved)
                if halved:
                    self._split(group)
                    return
            each = outcome.failed if isinstance(outcome, UnreadInputs) else {}
            for i, p in enumerate(group):
                if not p.future.done():
                    p.future.set_exception(each.get(i, outcome))
            return
        outputs, parts, failed, calls = outcome
        compute = time.perf_counter() - start
        if calls:  # one request run in pieces: each a call of its own, the hand-offs the first's
            for i, (count, seconds) in enumerate(calls):
                self._on_call(
                    count, 0 if i else 1, parts._replace(infer=seconds) if i == 0 else CallParts(infer=seconds)
                )
        else:
            self._on_call(rows, len(group) - len(failed), parts)
        offset = 0
        for i, p in enumerate(group):
            if i in failed:  # its inputs could not be read: its rows held another's
                offset += p.rows
                if not p.future.done():
                    p.future.set_exception(failed[i])
                continue
            part = (
                {
                    k: rows_along(v, (self.output_axes or {}).get(k, 0), offset, offset + p.rows)
                    for k, v in outputs.items()
                }
                if size > p.rows
                else outputs
            )
            offset += p.rows
            if not p.future.done():
                p.future.set_result(BatchResult(part, start - p.enqueued, compute, rows))

    def _split(self, group: list[_Pending]) -> None:
        """A merged batch's call failed: its requests run again as two batches, its halves, first in
        line; a half that fails again is split again, so each request ends with its own answer or
        error. A failure may be one request's doing (values a kernel refused: a token id past the
        vocabulary), and merged with it, every other client's request failed too (MiniLM served, 8
        good requests and one bad sent together: 140 of 160 good ones answered its error). Halving
        finds one such request among n in about 2 log2(n) calls (10 for 32), where running each
        alone takes n, so a client sending them costs the others little; on failures only."""
        waiting = [p for p in group if not p.future.done()]  # a client that left is not run again
        half = len(waiting) // 2
        for part in (waiting[:half], waiting[half:]):
            together = object()
            for p in part:
                p.retry = together
        self._carry(waiting)
        self._dispatch_soon()

    def close(self) -> None:
        self._closed = True
        for handle in (self._soon, self._delayed):
            if handle is not None:
                handle.cancel()
        if self._task is not None:
            self._task.cancel()
        for run in self._lane_runs:
            run.cancel()
        kept: list[tuple[ThreadPoolExecutor, KeptBuffers]] = [
            *zip(self._threads, self._buffers),
            *zip(self._threads, self._devices),
        ]
        for thread, buffers in kept:
            thread.submit(buffers.close)  # after the thread's last batch has run
        for thread in (*self._threads, *self._lane_threads):
            thread.shutdown(wait=False)
        if self._readers is not None:
            self._readers.shutdown(wait=False)
