"""Each version's scheduler: one runtime call at a time on a thread of its own, and dynamic
batching, where requests that arrive close together share one runtime call.

Every served version has a ``DynamicBatcher``, as each Triton model instance runs one request at
a time (``max_batch_size`` 1: nothing is merged). When the model is idle a request runs at once.
Requests that queued while the previous batch ran are merged at once; with ``max_delay_s`` above
0 (the default is 0) a batch also waits that long for more, but only when there is concurrent
traffic (others were already queued), so a lone request never pays the delay. Up to
``max_batch_size`` rows are merged along the batch axis (only requests whose other dimensions
agree) and the outputs are split back by rows. The runtime call runs in a worker thread, except
for models measured at warm-up to answer faster than that hand-off (``Caller``).

With lanes (``model.yaml``'s ``lanes``), requests that queue are not merged but run side by side,
one per lane, each lane a session with a share of the cores; a lone request still runs on the
session with all of them, and never while a lane runs, so the cores are never asked for twice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

Tensors = dict[str, np.ndarray]


@dataclass
class _Pending:
    inputs: Tensors
    rows: int
    future: asyncio.Future
    enqueued: float = field(default_factory=time.perf_counter)

    @property
    def key(self) -> tuple:
        """What requests must share to be merged: each input's dtype and shape past the batch
        axis, and a scalar input's value (a sample rate is one value for the whole call)."""
        return tuple(
            (k, v.shape[1:], v.dtype.str, v.tobytes() if v.ndim == 0 else None) for k, v in sorted(self.inputs.items())
        )


# A model whose warm-up request answers within this runs on the event loop itself: handing a call
# to a worker thread and back costs 0.13 ms back to back and 0.25 ms after idling on this machine.
INLINE_RUN_S = 0.0002


@dataclass(frozen=True)
class Caller:
    """How the event loop calls one version's runtime: in a worker thread, or on the loop itself
    when the version answered its warm-up within ``INLINE_RUN_S`` and the call's inputs are no
    larger than that warm-up's (``inline_bytes``; 0: never), so a large batch never blocks the loop."""

    run: Callable[[Tensors], Tensors]
    executor: Executor
    inline_bytes: int = 0

    async def __call__(self, inputs: Tensors) -> Tensors:
        if self.inline_bytes and sum(a.nbytes for a in inputs.values()) <= self.inline_bytes:
            return self.run(inputs)
        return await asyncio.get_running_loop().run_in_executor(self.executor, self.run, inputs)


def inline_bytes(run: Callable[[Tensors], Tensors], sample: Tensors, warm_up_s: float) -> int:
    """``Caller.inline_bytes`` for a runtime whose warm-up request took ``warm_up_s``: that request
    run again, best of three, unless the warm-up was clearly too slow (a slow model pays no run
    more at load)."""
    fastest = warm_up_s
    for _ in range(3):
        if fastest > 10 * INLINE_RUN_S:
            break
        start = time.perf_counter()
        run(sample)
        fastest = min(fastest, time.perf_counter() - start)
    return sum(np.asarray(a).nbytes for a in sample.values()) if fastest < INLINE_RUN_S else 0


@dataclass
class BatchResult:
    outputs: Tensors
    queue_s: float
    compute_s: float
    batch_rows: int


class DynamicBatcher:
    """One version's queue of requests, run one batch at a time on a thread of its own.

    ``run`` is the version's runtime; ``inline_bytes`` as for ``Caller``. The thread is the
    batcher's, not the server's pool: with a pool each call woke a second idle worker besides the
    one that took it, which then competed with ONNX Runtime's threads for the GIL and the cores. With its own thread EfficientNet-Lite0 at concurrency 1 answered with a p99
    of 6.6-8.0 ms instead of 12.5-17.2 ms, and its runtime call took 4.1-4.3 ms instead of
    4.5-5.2 ms on average (perf_analyzer, three alternating rounds, docs/server.md).

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
    ) -> None:
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="unideploy-batch")
        self._call = Caller(run, self._thread, inline_bytes)
        self.max_batch_size = max_batch_size
        self.max_delay_s = max_delay_s
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._task: asyncio.Task | None = None
        self._lane_threads = [
            ThreadPoolExecutor(1, thread_name_prefix=f"unideploy-lane-{i}") for i in range(len(lanes))
        ]
        self._idle_lanes: asyncio.Queue[Caller] = asyncio.Queue()
        for lane, thread in zip(lanes, self._lane_threads, strict=True):
            self._idle_lanes.put_nowait(Caller(lane, thread))
        self._lane_runs: set[asyncio.Task] = set()

    @property
    def merges(self) -> bool:
        """Whether requests are ever merged (lanes run them side by side instead)."""
        return not self._lane_threads and self.max_batch_size > 1

    async def submit(self, inputs: Tensors) -> BatchResult:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._lanes_loop() if self._lane_threads else self._loop()
            )
        rows = max((a.shape[0] for a in inputs.values() if a.ndim), default=1)
        pending = _Pending(inputs, rows, asyncio.get_running_loop().create_future())
        await self._queue.put(pending)
        return await pending.future

    async def _loop(self) -> None:
        while True:
            first = await self._queue.get()
            group, rows = [first], first.rows
            deadline = first.enqueued + self.max_delay_s
            leftovers: list[_Pending] = []
            while rows < self.max_batch_size:
                timeout = deadline - time.perf_counter()
                if self._queue.empty() and (len(group) + len(leftovers) == 1 or timeout <= 0):
                    break  # alone (no concurrent traffic), or waited long enough
                try:
                    item = (
                        self._queue.get_nowait()
                        if not self._queue.empty()
                        else await asyncio.wait_for(self._queue.get(), timeout)
                    )
                except TimeoutError:
                    break
                if item.key == first.key and rows + item.rows <= self.max_batch_size:
                    group.append(item)
                    rows += item.rows
                else:
                    leftovers.append(item)
            for item in leftovers:  # served by the next round, in arrival order
                self._queue.put_nowait(item)
            await self._execute(group, rows, self._call)

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
        start = time.perf_counter()
        first = group[0].inputs
        merged = (
            first
            if len(group) == 1
            else {  # a scalar is the same in every request of a group (its key)
                name: np.concatenate([p.inputs[name] for p in group]) if first[name].ndim else first[name]
                for name in first
            }
        )
        try:
            outputs = await call(merged)
        except Exception as exc:  # the runtime's failure belongs to every request in the batch
            for p in group:
                if not p.future.done():
                    p.future.set_exception(exc)
            return
        compute = time.perf_counter() - start
        offset = 0
        for p in group:
            part = {k: v[offset : offset + p.rows] for k, v in outputs.items()} if len(group) > 1 else outputs
            offset += p.rows
            if not p.future.done():
                p.future.set_result(BatchResult(part, start - p.enqueued, compute, rows))

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for run in list(self._lane_runs):
            run.cancel()
        for thread in (self._thread, *self._lane_threads):
            thread.shutdown(wait=False)
