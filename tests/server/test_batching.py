"""The dynamic batcher's rules, checked deterministically (no timing assertions)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from unideploy.doctor import provider_problem
from unideploy.runtimes.ort_providers import CUDA
from unideploy.server.batching import (
    LOOP_CALL_LIMIT_S,
    Caller,
    CallParts,
    DynamicBatcher,
    LoopBudget,
    UnreadInputs,
    inline_bytes,
    merged,
)
from unideploy.server.unread import Unread


class InMemory(Unread):
    """An input whose bytes are elsewhere, as a shared-memory region's are (a real ``Unread``)."""

    def __init__(self, value: np.ndarray) -> None:
        super().__init__(value.shape, value.dtype)
        self.value = value

    def _into(self, out: memoryview) -> None:
        out[:] = self.value.tobytes()


async def called(call: Caller, parts: list[dict], size: int):
    """What ``call`` answered for ``parts`` merged into ``size`` rows (``Caller.start``, awaited), or
    its error raised."""
    answered = asyncio.get_running_loop().create_future()
    call.start(parts, size, answered.set_result)
    outcome = await answered
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


def behind_a_held_call(run, first: dict, queued: list[dict], **settings) -> tuple[list, list]:
    """Submit ``first``, hold its runtime call until every one of ``queued`` has been submitted
    (so they queue behind it), then let it go; returns the results (first's first) and, per
    runtime call, what ``run`` returned for it. Waits on events, not time."""
    started, release = threading.Event(), threading.Event()
    calls: list = []

    def held(inputs):
        calls.append(run(inputs))
        if len(calls) == 1:
            started.set()
            release.wait(30)
        return {"y": inputs["x"] * 10}

    async def scenario():
        batcher = DynamicBatcher(held, **{"max_batch_size": 8, "max_delay_s": 0.0, **settings})
        tasks = [asyncio.ensure_future(batcher.submit(first))]
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 30)  # the first call runs
        tasks += [asyncio.ensure_future(batcher.submit(inputs)) for inputs in queued]
        await asyncio.sleep(0)  # each submit puts its request in the queue at its first step
        release.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)  # each request's own outcome
        later = await batcher.submit(first)  # idle again: runs alone, at once
        batcher.close()
        return [*results, later]

    results = asyncio.run(scenario())
    return results, calls


def test_queued_requests_are_merged_straight_into_the_engines_batch_bucket():
    """With batch buckets (a GPU session that pays for each new shape), three queued rows are one
    call of the 4-row bucket, the fourth row a copy of the third (a real row), and each request gets
    its own rows back; a lone request of a bucket's size runs on its own array, uncopied."""
    rows = [np.full((1, 2), float(i), np.float32) for i in range(4)]
    results, calls = behind_a_held_call(
        lambda inputs: inputs["x"].copy(), {"x": rows[0]}, [{"x": r} for r in rows[1:]], buckets=(1, 2, 4, 8)
    )
    assert [c[:, 0].tolist() for c in calls] == [[0.0], [1.0, 2.0, 3.0, 3.0], [0.0]]
    assert [r.outputs["y"][:, 0].tolist() for r in results] == [[0.0], [10.0], [20.0], [30.0], [0.0]]
    assert [r.batch_rows for r in results] == [1, 3, 3, 3, 1]
    lone = {"x": np.ones((4, 2), np.float32)}
    assert merged([lone], 4) is lone
    two = merged([{"x": rows[1]}, {"x": rows[2]}], 2)["x"]
    assert two[:, 0].tolist() == [1.0, 2.0] and not np.shares_memory(two, rows[1])


def test_a_batch_that_would_mostly_be_padding_runs_the_bucket_below_and_carries_the_rest_first():
    """With the buckets' call times measured (H200-like: a 16-row call costs almost twice an 8-row
    one), nine queued one-row requests run as a call of 8 and the last one next, ahead of anything
    that arrives later; where padding costs nothing measurable they run as one padded call of 16."""
    rows = [np.full((1, 1), float(i), np.float32) for i in range(10)]
    seconds = {1: 1.0, 2: 1.0, 4: 1.2, 8: 2.0, 16: 3.6}
    settings = {"max_batch_size": 16, "buckets": tuple(seconds)}
    results, calls = behind_a_held_call(
        lambda inputs: inputs["x"][:, 0].tolist(),
        {"x": rows[0]},
        [{"x": r} for r in rows[1:]],
        bucket_seconds=seconds,
        **settings,
    )
    assert calls == [[0.0], [float(i) for i in range(1, 9)], [9.0], [0.0]]
    assert [r.outputs["y"].item() for r in results] == [10.0 * i for i in range(10)] + [0.0]
    assert [r.batch_rows for r in results] == [1] + [8] * 8 + [1, 1]
    flat = dict.fromkeys(seconds, 1.0)
    results, calls = behind_a_held_call(
        lambda inputs: len(inputs["x"]), {"x": rows[0]}, [{"x": r} for r in rows[1:]], bucket_seconds=flat, **settings
    )
    assert calls == [1, 16, 1] and [r.batch_rows for r in results[1:-1]] == [9] * 9


def test_requests_carried_over_from_a_cut_batch_go_before_those_still_queued():
    """Fourteen one-row requests queue behind a call, at most 12 rows a batch: the first 12 are
    gathered and cut at 8, and the four carried run next, before the two that were never gathered
    (put back at the queue's end, they would have gone behind them, and could be cut again)."""
    x = [{"x": np.full((1, 1), float(i), np.float32)} for i in range(15)]
    seconds = {1: 1.0, 2: 1.0, 4: 1.2, 8: 2.0, 16: 3.6}
    results, calls = behind_a_held_call(
        lambda inputs: inputs["x"][:, 0].tolist(),
        x[0],
        x[1:],
        max_batch_size=12,
        buckets=tuple(seconds),
        bucket_seconds=seconds,
    )
    rows = [float(i) for i in range(15)]
    assert calls == [rows[:1], rows[1:9], rows[9:13], rows[13:15], rows[:1]]  # 6 rows: 4 now, 2 next
    assert [r.outputs["y"].item() for r in results] == [10.0 * i for i in range(15)] + [0.0]


@pytest.mark.parametrize("readers", [0, 3], ids=["one-reader", "readers"])
def test_a_request_whose_shared_memory_cannot_be_read_fails_alone_in_its_batch(readers):
    """Inputs still in clients' shared memory are read straight into the batch when it is merged
    (by the batch thread, or side by side by reader threads). One whose client shrank its segment
    meanwhile fails its own request with the reason; its rows hold another request's first row, the
    others are answered; where every part fails, each gets its own error (``UnreadInputs``)."""
    shm = pytest.importorskip("tritonclient.utils.shared_memory", reason="tritonclient is in the dev extra")
    from unideploy.server.errors import BadRequest
    from unideploy.server.shared_memory import Placement, SharedMemoryRegions

    regions, made = SharedMemoryRegions("system"), []

    def region(value: float) -> tuple:
        x = np.full((1, 2), value, np.float32)
        name, key = f"r{uuid.uuid4().hex[:8]}", f"/unideploy-test-{uuid.uuid4().hex[:12]}"
        made.append(shm.create_shared_memory_region(name, key, x.nbytes))
        shm.set_shared_memory_region(made[-1], [x])
        regions.register(name, key, 0, x.nbytes)
        return regions.input(Placement(name, x.nbytes), "FP32", x.shape, "x"), f"/dev/shm/{key.lstrip('/')}"

    try:
        (one, _), (two, shrunk), (three, _) = region(1.0), region(2.0), region(3.0)
        os.truncate(shrunk, 4)
        results, calls = behind_a_held_call(
            lambda inputs: inputs["x"][:, 0].tolist(),
            {"x": np.zeros((1, 2), np.float32)},
            [{"x": one}, {"x": two}, {"x": three}],
            buckets=(1, 4),
            readers=readers,
        )
        assert calls == [[0.0], [1.0, 1.0, 3.0, 3.0], [0.0]]  # one call for the three, padded to 4
        assert isinstance(results[2], BadRequest) and "which now holds 4" in str(results[2])
        assert [results[i].outputs["y"][0, 0] for i in (1, 3)] == [10.0, 30.0]

        with (
            pytest.raises(UnreadInputs) as every,
            ThreadPoolExecutor(readers or 1) as pool,
        ):
            merged([{"x": two}, {"x": two}], 2, failed={}, readers=pool if readers else None)
        assert sorted(every.value.failed) == [0, 1]
        with pytest.raises(BadRequest, match="which now holds 4"):  # no ``failed`` to tell: raised
            merged([{"x": one}, {"x": two}], 2)
    finally:
        regions.close()
        for handle in made:
            shm.destroy_shared_memory_region(handle)


def test_a_merged_call_that_fails_runs_its_requests_again_in_halves_until_each_has_its_own_outcome():
    """A merged batch's call that fails may be one request's doing (values the model refuses): its
    requests run again as two halves, first in line, and a half that fails again is halved again,
    so only that request gets the error and the others their answers; a lone request's failure is
    its own at once. Halving finds one bad request of 16 in 8 calls where running each alone took 16."""
    from unideploy.errors import RefusedValues

    attempts: list[list[float]] = []

    def refusing(inputs):
        attempts.append(inputs["x"][:, 0].tolist())
        if (inputs["x"] < 0).any():
            raise RefusedValues("the model refused the input values: x below 0")
        return len(attempts)

    def rows(value: float, count: int = 1) -> dict:
        return {"x": np.full((count, 1), value, np.float32)}

    results, _ = behind_a_held_call(refusing, rows(0.0), [rows(1.0), rows(-1.0), rows(2.0, 2)])
    assert attempts[1:-1] == [
        [1.0, -1.0, 2.0, 2.0],  # the three queued requests, merged: refused
        [1.0],  # its first half, answered
        [-1.0, 2.0, 2.0],  # its second half, refused: halved again
        [-1.0],
        [2.0, 2.0],
    ]
    np.testing.assert_array_equal(results[1].outputs["y"], [[10.0]])
    assert isinstance(results[2], RefusedValues) and "x below 0" in str(results[2])
    np.testing.assert_array_equal(results[3].outputs["y"], [[20.0], [20.0]])
    assert results[1].batch_rows == 1 and results[3].batch_rows == 2
    assert attempts[-1] == [0.0]  # and the version serves on

    attempts.clear()
    queued = [rows(float(i + 1)) for i in range(16)]
    queued[11] = rows(-1.0)
    results, _ = behind_a_held_call(refusing, rows(0.0), queued, max_batch_size=16)
    assert len(attempts) - 2 == 1 + 8  # the merged call, then two calls at each of four halvings
    assert [type(r).__name__ for r in results[1:-1]].count("RefusedValues") == 1
    assert all(results[i + 1].outputs["y"][0, 0] == 10.0 * (i + 1) for i in range(16) if i != 11)


def test_a_token_id_past_a_real_models_table_fails_only_its_own_request(tmp_path):
    """An embedding model served (ONNX Runtime's Gather over a table of 10 rows): three requests that
    arrive together, one with an id past the table, are merged, refused as a batch, and run again in
    halves: the two good ones are answered with exactly what the model gives them alone, the bad one
    is refused as the request's fault (400), only the answered calls count as batches, and the
    failed ones are counted apart, by what followed them."""
    from onnx_models import embedding_package

    import unideploy
    from unideploy.errors import RefusedValues
    from unideploy.server.errors import http_status
    from unideploy.server.metrics import ServerMetrics
    from unideploy.server.models import ModelRegistry

    package = embedding_package(tmp_path / "src", tmp_path / "repo" / "words" / "1")
    good = [np.array([[0, 1, 2, 3]], np.int64), np.array([[9, 9, 8, 8], [4, 4, 4, 4]], np.int64)]
    bad = np.array([[1, 2, 10, 3]], np.int64)
    alone = [unideploy.run(package, {"ids": ids})["y"] for ids in good]

    async def scenario():
        with ThreadPoolExecutor(2) as pool:
            metrics = ServerMetrics()
            registry = ModelRegistry(tmp_path / "repo", pool, metrics)
            await registry.sync()
            batcher = registry.get("words").batcher
            results = await asyncio.gather(
                *(batcher.submit({"ids": ids}) for ids in (good[0], bad, good[1])), return_exceptions=True
            )
            labels = {"model": "words", "version": "1"}
            calls = tuple(
                metrics.registry.get_sample_value(f"unideploy_batch_rows_{s}", labels) for s in ("sum", "count")
            )
            failures = {
                then: metrics.registry.get_sample_value(
                    "unideploy_runtime_call_failures_total", {**labels, "then": then}
                )
                for then in ("halved", "failed")
            }
            await registry.close()
            return results, calls, failures

    (first, refused, second), calls, failures = asyncio.run(scenario())
    np.testing.assert_array_equal(first.outputs["y"], alone[0])
    np.testing.assert_array_equal(second.outputs["y"], alone[1])
    np.testing.assert_array_equal(alone[0], [[1.5, 1.5, 1.5]])  # the ids' mean: the rows it read
    assert isinstance(refused, RefusedValues) and http_status(refused) == 400
    assert "idx=10 must be within the inclusive range [-10,9]" in str(refused)
    assert calls[0] == 3.0 and calls[1] <= 2  # the good rows, answered in the calls of the good half
    assert failures["failed"] == 1 and failures["halved"] >= 1  # the bad one alone; the batches it was in


def test_a_batchs_shared_memory_inputs_are_read_side_by_side():
    """With reader threads, each input of a merged batch is read on a thread of its own, the batch
    thread reading the first: each read here waits until all three have started (one after the
    other, the first would wait in vain), and each lands in its own rows."""
    started = threading.Barrier(3, timeout=30)
    threads: set[str] = set()

    class Waiting(InMemory):
        def _into(self, out: memoryview) -> None:
            threads.add(threading.current_thread().name)
            started.wait()
            super()._into(out)

    with ThreadPoolExecutor(2, thread_name_prefix="reader") as readers:
        parts = [{"x": Waiting(np.full((1, 2), float(i), np.float32))} for i in range(3)]
        batch = merged(parts, 4, readers=readers)["x"]
    assert batch[:, 0].tolist() == [0.0, 1.0, 2.0, 2.0] and len(threads) == 3


def test_a_merged_batch_is_written_into_the_callers_kept_buffers():
    """With ``buffers`` (on a GPU, page-locked ones) each merged batch is written into the same
    memory, padded with the last real row; without, a new array each time."""
    from unideploy.runtimes.pinned import BatchBuffers

    buffers = BatchBuffers()
    parts = [{"x": np.full((1, 2), float(i), np.float32)} for i in range(3)]
    first = merged(parts, 4, None, buffers)["x"]
    assert first[:, 0].tolist() == [0.0, 1.0, 2.0, 2.0]
    second = merged(parts[1:], 4, None, buffers)["x"]
    assert second is first and second[:, 0].tolist() == [1.0, 2.0, 2.0, 2.0]
    assert merged(parts[1:], 4)["x"] is not first


def test_a_lone_request_still_in_shared_memory_is_read_into_the_kept_buffer():
    """A request alone in its call is run as it is, but an input still in shared memory must be
    read anyway: into the caller's kept (on a GPU page-locked) buffer where it has one, else into an
    array of its own."""
    from unideploy.runtimes.pinned import BatchBuffers

    buffers, value = BatchBuffers(), np.full((1, 2), 7.0, np.float32)
    read = merged([{"x": InMemory(value)}], 1, None, buffers)["x"]
    assert read is buffers.array("x", (1, 2), np.dtype(np.float32)) and read.tolist() == [[7.0, 7.0]]
    alone = merged([{"x": InMemory(value)}], 1)["x"]
    assert alone is not read and alone.tolist() == [[7.0, 7.0]]
    ready = {"x": value}
    assert merged([ready], 1, None, buffers) is ready  # already an array: run as it is


def test_inputs_every_request_keeps_in_gpu_memory_are_merged_there():
    """An input that every request of a batch holds in GPU memory (a CUDA region's) is merged into
    the caller's device buffer, each request's rows copied there, the bucket's padding made by
    doubling copies (3 for 4 rows), all waited for once; an input in host memory beside it is
    merged on the host as before. The batch holds what the host's merge holds."""
    from device_memory import HostDeviceBuffers, InDeviceMemory

    from unideploy.runtimes.device_batches import DeviceArray

    rows = [np.arange(k * 3, dtype=np.float32).reshape(k, 3) + 10 * i for i, k in enumerate((1, 2, 1))]
    masks = [np.full((len(r), 1), i, np.int64) for i, r in enumerate(rows)]
    devices = HostDeviceBuffers()
    parts = [{"x": InDeviceMemory(r), "mask": m} for r, m in zip(rows, masks, strict=True)]
    batch = merged(parts, 8, None, None, {}, None, devices)
    host = merged([{"x": r, "mask": m} for r, m in zip(rows, masks, strict=True)], 8)
    assert isinstance(batch["x"], DeviceArray) and isinstance(batch["mask"], np.ndarray)
    np.testing.assert_array_equal(batch["x"].value.numpy(), host["x"])
    np.testing.assert_array_equal(batch["mask"], host["mask"])
    assert len(devices.copied) == 3 + 3 and devices.waits == 1
    again = merged(parts[:1], 1, None, None, {}, None, devices)["x"]  # a lone request too: one copy
    assert isinstance(again, DeviceArray) and again.value.numpy().tolist() == [[0.0, 1.0, 2.0]]


def test_a_request_whose_gpu_memory_is_gone_fails_alone_and_a_mixed_batch_merges_on_the_host():
    """A request whose CUDA region was unregistered before its batch was merged fails with the
    reason, its rows holding the first good request's; a batch where some requests sent the input
    in host memory is merged on the host, every part read there; and with device batches turned off
    (a CUDA call failed), on the host too."""
    from device_memory import HostDeviceBuffers, InDeviceMemory

    from unideploy.runtimes.device_batches import DeviceBatches
    from unideploy.server.errors import BadRequest

    one, two = np.ones((1, 3), np.float32), np.full((1, 3), 2.0, np.float32)
    devices, failed = HostDeviceBuffers(), {}
    batch = merged(
        [{"x": InDeviceMemory(one, gone=True)}, {"x": InDeviceMemory(two)}], 2, None, None, failed, None, devices
    )
    assert batch["x"].value.numpy().tolist() == [[2.0] * 3, [2.0] * 3]
    assert list(failed) == [0] and isinstance(failed[0], BadRequest) and "not registered" in str(failed[0])
    waits = devices.waits
    mixed = merged([{"x": InDeviceMemory(one)}, {"x": two}], 2, None, None, {}, None, devices)["x"]
    assert isinstance(mixed, np.ndarray) and mixed[:, 0].tolist() == [1.0, 2.0]
    assert devices.waits == waits  # merged on the host: no wait for the GPU's stream
    off = HostDeviceBuffers(DeviceBatches())
    off.batches.failed("a copy in GPU memory failed")
    assert isinstance(merged([{"x": InDeviceMemory(one)}], 1, None, None, {}, None, off)["x"], np.ndarray)


def test_a_system_segment_the_gpu_cannot_copy_from_is_read_on_the_host(regions, caplog):
    """A system shared-memory segment is page-locked for the GPU on the first batch that wants it in
    GPU memory; where CUDA cannot lock it (here: no GPU), the region says why once and its inputs
    are read through the descriptor into a host batch as before, even with device buffers given."""
    import tritonclient.utils.shared_memory as shm
    from device_memory import HostDeviceBuffers

    from unideploy.runtimes import cuda_api
    from unideploy.server.shared_memory import Placement, SharedMemoryRegions

    if cuda_api.problem() is None:
        pytest.skip("this machine's GPU locks the segment: tests/server/test_cuda_shared_memory.py")
    held, x = SharedMemoryRegions("system"), np.arange(6, dtype=np.float32).reshape(1, 6)
    handle, name, key = regions(x.nbytes)
    shm.set_shared_memory_region(handle, [x])
    held.register(name, key, 0, x.nbytes)
    try:
        unread = held.input(Placement(name, x.nbytes), "FP32", x.shape, "x")
        devices = HostDeviceBuffers()
        for _ in range(2):
            batch = merged([{"x": unread}, {"x": unread}], 2, None, None, {}, None, devices)["x"]
            assert isinstance(batch, np.ndarray) and batch.tolist() == [x[0].tolist()] * 2 and not devices.copied
        said = [r.getMessage() for r in caplog.records if "is read on the host" in r.getMessage()]
        assert len(said) == 1 and f"region '{name}'" in said[0] and "cuda" in said[0].lower()  # once, with why
    finally:
        held.close()


def test_a_batch_that_cannot_be_merged_in_gpu_memory_is_merged_on_the_host_from_then_on():
    """The real device buffers on a machine without a CUDA build of ONNX Runtime: the buffer cannot
    be allocated, so the caller merges that batch on the host and runs it, the version's account
    is told why once, and the next batch goes straight to the host."""
    from device_memory import InDeviceMemory

    from unideploy.runtimes import cuda_api
    from unideploy.runtimes.device_batches import DeviceBatches

    if cuda_api.problem() is None:
        pytest.skip("this machine's GPU would merge the batch in its memory: tests/server/test_cuda_shared_memory.py")
    told: list[str] = []
    batches = DeviceBatches(on_failure=told.append)
    seen: list = []

    def run(inputs):
        seen.append(type(inputs["x"]))
        return {"y": inputs["x"] * 10}

    with ThreadPoolExecutor(1) as thread:
        call = Caller(run, thread, devices=batches.buffers())
        parts = [{"x": InDeviceMemory(np.full((1, 2), float(i), np.float32))} for i in range(2)]
        for _ in range(2):
            ran = asyncio.run(called(call, parts, 2))
            assert ran.outputs["y"][:, 0].tolist() == [0.0, 10.0] and not ran.failed
    assert seen == [np.ndarray, np.ndarray] and len(told) == 1 and batches.problem == told[0]
    assert "buffer in GPU memory" in told[0]


def test_batches_in_flight_run_at_once_each_on_a_thread_of_its_own():
    """``in_flight=2``: a request that arrives while a batch runs starts a second batch at once
    (each call here waits until the other has started too: with one batch at a time it would wait
    in vain)."""
    both = threading.Barrier(2, timeout=30)
    first_runs = threading.Event()
    threads: list[str] = []

    def run(inputs):
        threads.append(threading.current_thread().name)
        first_runs.set()
        both.wait()
        return {"y": inputs["x"] * 2}

    async def scenario():
        batcher = DynamicBatcher(run, max_batch_size=8, max_delay_s=0, in_flight=2)
        try:
            first = asyncio.ensure_future(batcher.submit({"x": np.full((1, 1), 1, np.float32)}))
            await asyncio.get_running_loop().run_in_executor(None, first_runs.wait, 30)
            second = await batcher.submit({"x": np.full((1, 1), 2, np.float32)})
            return [(await first).outputs["y"].item(), second.outputs["y"].item()]
        finally:
            batcher.close()

    assert asyncio.run(scenario()) == [2.0, 4.0]
    assert len(set(threads)) == 2 and all(t.startswith("unideploy-batch") for t in threads)


def test_lone_request_does_not_wait_for_the_delay():
    async def scenario() -> int:
        batcher = DynamicBatcher(lambda x: {"y": x["x"] * 2}, max_batch_size=8, max_delay_s=3600)
        # a lone request must not sit out the (hour-long) delay
        result = await asyncio.wait_for(batcher.submit({"x": np.ones((1, 2), np.float32)}), timeout=30)
        batcher.close()
        return result.batch_rows

    assert asyncio.run(scenario()) == 1


def test_a_version_runs_one_call_at_a_time_on_a_thread_of_its_own():
    """Always the same thread, not a pool: a pool woke a second idle worker on every call, which
    then took a core from the runtime's own threads."""
    threads: list[str] = []

    def run(inputs):
        threads.append(threading.current_thread().name)
        return {"y": inputs["x"]}

    async def scenario() -> None:
        batcher = DynamicBatcher(run, max_batch_size=8, max_delay_s=0)
        for _ in range(5):
            await batcher.submit({"x": np.ones((1, 2), np.float32)})
        batcher.close()

    asyncio.run(scenario())
    assert len(threads) == 5 and set(threads) == {threads[0]} and threads[0].startswith("unideploy-batch")
    for thread in [t for t in threading.enumerate() if t.name == threads[0]]:
        thread.join(30)  # closing the batcher ends its thread
    assert not any(t.name == threads[0] for t in threading.enumerate())


def test_requests_queued_during_a_run_are_merged_and_split_back():
    results, calls = behind_a_held_call(
        lambda inputs: inputs["x"].shape[0],
        {"x": np.full((1, 1), 0.0, np.float32)},
        [{"x": np.full((2, 1), float(i), np.float32)} for i in range(1, 4)],
        max_delay_s=0.001,
    )
    assert calls == [1, 6, 1]  # the three queued requests (2 rows each) ran as one call
    for i, result in enumerate(results[1:4], 1):
        np.testing.assert_array_equal(result.outputs["y"], np.full((2, 1), 10.0 * i))
        assert result.batch_rows == 6


def test_without_a_delay_only_requests_that_queued_while_busy_are_merged():
    """The default (max_queue_delay_ms 0): a request never waits for others; those that arrived
    while the model was running go together as the next call."""
    results, calls = behind_a_held_call(
        lambda inputs: inputs["x"].shape[0],
        {"x": np.zeros((1, 1), np.float32)},
        [{"x": np.zeros((1, 1), np.float32)}] * 3,
    )
    assert calls == [1, 3, 1] and results[-1].batch_rows == 1


def test_the_batch_size_metric_is_told_each_runtime_calls_rows_once():
    """``on_call`` (the server's ``unideploy_batch_rows`` and Triton statistics) hears of every runtime
    call once, with its real rows and the requests it answered: queued requests merged, and a fast
    model's lone request run at once on the loop."""
    observed: list[int] = []
    answered: list[int] = []

    def on_call(rows: int, requests: int, parts: CallParts) -> None:
        observed.append(rows)
        answered.append(requests)

    behind_a_held_call(
        lambda inputs: inputs["x"].shape[0],
        {"x": np.zeros((1, 1), np.float32)},
        [{"x": np.zeros((2, 1), np.float32)}] * 3,
        on_call=on_call,
    )
    assert observed == [1, 6, 1] and answered == [1, 3, 1]  # five requests, three calls

    async def lone() -> None:
        batcher = DynamicBatcher(lambda x: x, max_batch_size=8, max_delay_s=0.0, inline_bytes=1024, on_call=on_call)
        await batcher.submit({"x": np.zeros((3, 1), np.float32)})
        batcher.close()

    asyncio.run(lone())
    assert observed == [1, 6, 1, 3] and answered == [1, 3, 1, 1]


def test_a_request_of_more_rows_than_a_call_takes_runs_in_calls_of_at_most_max_batch_size():
    """``max_batch_size`` bounds every runtime call's rows, a lone request's too: one of 10 rows runs
    as calls of 4, 4 and 2 rows on the batch thread, its answer joined in order (each output on its
    own rows' axis, text as wide as its widest piece, a scalar once, in the model's order), each
    call told to the metrics as a call of its own (the request once); with lanes too. A version
    whose answers do not split by rows (no output axes) runs it whole."""
    calls: list[int] = []
    observed: list[tuple[int, int]] = []

    def run(inputs):
        x = inputs["x"]
        calls.append(x.shape[0])
        words = np.array(["a" * int(v) for v in x[:, 0]])
        return {"label": words, "y": x * 10, "rate": np.array(16000), "t": np.ascontiguousarray(x.T)}

    async def submitted(**settings):
        batcher = DynamicBatcher(run, max_batch_size=4, max_delay_s=0.0, **settings)
        try:
            return await batcher.submit({"x": np.arange(10, dtype=np.float32).reshape(10, 1)})
        finally:
            batcher.close()

    axes = {"label": 0, "y": 0, "rate": None, "t": 1}
    result = asyncio.run(submitted(output_axes=axes, on_call=lambda rows, n, parts: observed.append((rows, n))))
    assert calls == [4, 4, 2] and observed == [(4, 1), (4, 0), (2, 0)]
    assert list(result.outputs) == ["label", "y", "rate", "t"]
    np.testing.assert_array_equal(result.outputs["y"], np.arange(10).reshape(10, 1) * 10.0)
    np.testing.assert_array_equal(result.outputs["t"], np.arange(10, dtype=np.float32).reshape(1, 10))
    assert result.outputs["label"].tolist() == ["a" * i for i in range(10)] and result.outputs["rate"] == 16000
    calls.clear()
    asyncio.run(submitted())  # output axes unknown: whole
    assert calls == [10]
    calls.clear()
    asyncio.run(submitted(output_axes=axes, lanes=[run]))
    assert calls == [4, 4, 2]


def test_a_real_models_request_past_max_batch_size_runs_in_calls_of_that_size(tmp_path):
    """The embedding model served with ``max_batch_size: 4`` and a request of 10 rows: answered
    exactly as the model answers the 10 rows in one run, in three runtime calls (4, 4, 2 rows, as
    the server's batch-size metric counts them)."""
    import yaml
    from onnx_models import embedding_package

    import unideploy
    from unideploy.server.metrics import ServerMetrics
    from unideploy.server.models import ModelRegistry

    package = embedding_package(tmp_path / "src", tmp_path / "repo" / "words" / "1")
    (tmp_path / "repo" / "words" / "model.yaml").write_text(yaml.safe_dump({"max_batch_size": 4}))
    ids = np.random.default_rng(0).integers(0, 10, (10, 4))
    whole = unideploy.run(package, {"ids": ids})["y"]

    async def scenario():
        with ThreadPoolExecutor(2) as pool:
            metrics = ServerMetrics()
            registry = ModelRegistry(tmp_path / "repo", pool, metrics)
            await registry.sync()
            result = await registry.get("words").batcher.submit({"ids": ids})
            labels = {"model": "words", "version": "1"}
            rows = [metrics.registry.get_sample_value(f"unideploy_batch_rows_{s}", labels) for s in ("sum", "count")]
            fours = metrics.registry.get_sample_value("unideploy_batch_rows_bucket", {**labels, "le": "4.0"})
            await registry.close()
            return result, rows, fours

    result, rows, fours = asyncio.run(scenario())
    np.testing.assert_array_equal(result.outputs["y"], whole)
    assert rows == [10.0, 3.0] and fours == 3.0  # three calls, none of more than 4 rows


def test_each_call_says_where_its_time_went():
    """``CallParts``: a call on the batch thread has both hand-offs, its merge (``input``) and its
    run (``infer``: here at least the 20 ms the runtime waits) apart, their sum within the request's
    ``compute``; a lone request on the event loop has only its run."""
    told: list[tuple[int, CallParts]] = []

    def run(inputs):
        if inputs["x"].shape[0] > 1:
            threading.Event().wait(0.02)  # a slow merged run
        return {"y": inputs["x"] * 2}

    async def scenario() -> list:
        batcher = DynamicBatcher(
            run,
            max_batch_size=8,
            max_delay_s=0.0,
            buckets=(4,),
            on_call=lambda rows, requests, parts: told.append((rows, parts)),
        )
        try:
            results = await asyncio.gather(*(batcher.submit({"x": np.ones((1, 2), np.float32)}) for _ in range(3)))
        finally:
            batcher.close()
        fast = DynamicBatcher(
            run,
            max_batch_size=8,
            max_delay_s=0.0,
            inline_bytes=64,
            on_call=lambda rows, requests, parts: told.append((rows, parts)),
        )
        results.append(await fast.submit({"x": np.ones((1, 2), np.float32)}))
        fast.close()
        return results

    results = asyncio.run(scenario())
    (rows, threaded), (lone_rows, on_loop) = told
    assert rows == 3 and lone_rows == 1
    assert threaded.to_thread > 0 and threaded.input > 0 and threaded.from_thread > 0 and threaded.infer >= 0.02
    assert sum(threaded) <= results[0].compute_s
    assert on_loop == CallParts(infer=results[-1].compute_s)


def test_a_fast_models_lone_request_runs_at_once_and_requests_arriving_together_still_merge():
    """A version answering on the event loop (``inline_bytes``): a lone request to it runs at once on
    the loop, and requests submitted in the same turn still go as one call, each answer its own
    rows, whether the batch loop has started yet or not."""
    calls: list[tuple[int, str]] = []

    def run(inputs):
        calls.append((inputs["x"].shape[0], threading.current_thread().name))
        return {"y": inputs["x"] * 10}

    def rows(value: float, count: int = 1) -> dict:
        return {"x": np.full((count, 1), value, np.float32)}

    async def scenario():
        batcher = DynamicBatcher(run, max_batch_size=8, max_delay_s=0.0, inline_bytes=1024)
        together = await asyncio.gather(*(batcher.submit(rows(i)) for i in (1.0, 2.0, 3.0)))  # loop not started
        alone = await batcher.submit(rows(4.0))
        again = await asyncio.gather(*(batcher.submit(rows(i, 2)) for i in (5.0, 6.0)))  # loop waiting
        batcher.close()
        return together, alone, again

    together, alone, again = asyncio.run(scenario())
    loop_thread = threading.main_thread().name
    assert calls == [(3, loop_thread), (1, loop_thread), (4, loop_thread)]
    for value, result in zip((1.0, 2.0, 3.0), together, strict=True):
        np.testing.assert_array_equal(result.outputs["y"], np.full((1, 1), 10 * value))
        assert result.batch_rows == 3
    np.testing.assert_array_equal(alone.outputs["y"], np.full((1, 1), 40.0))
    assert alone.batch_rows == 1
    for value, result in zip((5.0, 6.0), again, strict=True):
        np.testing.assert_array_equal(result.outputs["y"], np.full((2, 1), 10 * value))


def test_requests_with_other_shapes_are_not_merged():
    calls: list[tuple] = []

    def run(inputs):
        calls.append(inputs["x"].shape)
        return {"y": inputs["x"]}

    async def scenario():
        batcher = DynamicBatcher(run, max_batch_size=8, max_delay_s=0.05)
        await asyncio.gather(
            batcher.submit({"x": np.zeros((1, 3), np.float32)}), batcher.submit({"x": np.zeros((1, 4), np.float32)})
        )
        batcher.close()

    asyncio.run(scenario())
    assert sorted(calls) == [(1, 3), (1, 4)]


def test_a_model_whose_largest_batch_is_fast_too_runs_its_merged_batches_on_the_event_loop():
    """Where the largest batch a version merges answers within the hand-off's cost too (merge
    included, timed at load), that batch's size is the bound; where it does not, the sample's."""
    sample = {"x": np.zeros((1, 4), np.float32)}
    fast = lambda inputs: {"y": inputs["x"] + 1}  # noqa: E731
    assert inline_bytes(fast, sample, warm_up_s=0.0001, largest=8) == 8 * sample["x"].nbytes
    assert inline_bytes(fast, sample, warm_up_s=0.0001, largest=6, axes={"x": 0}) == 6 * sample["x"].nbytes

    def slower_past_one_row(inputs):
        if inputs["x"].shape[0] > 1:
            threading.Event().wait(0.005)
        return {"y": inputs["x"]}

    assert inline_bytes(slower_past_one_row, sample, warm_up_s=0.0001, largest=8) == sample["x"].nbytes
    assert inline_bytes(fast, sample, warm_up_s=0.0001, largest=1) == sample["x"].nbytes  # merges nothing


def test_a_fast_model_runs_on_the_event_loop_but_never_a_larger_call():
    """A call no larger than a warm-up that answered within the hand-off's cost runs on the loop's
    own thread; anything larger (a merged batch, a big request) still goes to a worker thread."""
    threads: list[int] = []

    def run(inputs):
        threads.append(threading.get_ident())
        return {"y": inputs["x"] + 1}

    sample = {"x": np.zeros((2, 4), np.float32)}
    assert inline_bytes(run, sample, warm_up_s=0.001) == sample["x"].nbytes  # adding 1 to 8 floats is fast
    assert inline_bytes(lambda inputs: threading.Event().wait(0.01) or {}, sample, warm_up_s=0.001) == 0
    ran_again = len(threads)
    assert inline_bytes(run, sample, warm_up_s=0.05) == 0 and len(threads) == ran_again  # a slow warm-up: no run more

    async def scenario() -> int:
        with ThreadPoolExecutor(1) as pool:
            call = Caller(run, pool, LoopBudget(inline_bytes(run, sample, warm_up_s=0.001)))
            threads.clear()
            small = (await called(call, [{"x": np.ones((1, 4), np.float32)}], 1)).outputs
            large = (await called(call, [{"x": np.ones((64, 4), np.float32)}], 64)).outputs
            assert small["y"][0, 0] == 2 and large["y"].shape == (64, 4)
            return threading.get_ident()

    loop_thread = asyncio.run(scenario())
    assert threads[0] == loop_thread and threads[1] != loop_thread


def test_a_call_that_holds_the_event_loop_too_long_sends_the_versions_calls_to_its_thread(caplog):
    """A version on the event loop whose work depends on a value (here: a flag in the input): the
    first call past ``LOOP_CALL_LIMIT_S`` still answers, one warning names the version and the
    time, and from then on its lone requests and merged batches run on its worker thread."""
    threads: list[int] = []

    def run(inputs):
        threads.append(threading.get_ident())
        if inputs["x"].max() > 0:  # the value asks for more work than the warm-up's zeros did:
            hashlib.sha256(bytes(64 << 20)).digest()  # 64 MB hashed on this thread, tens of ms
        return {"y": inputs["x"] + 1}

    quick, slow = np.zeros((1, 2), np.float32), np.ones((1, 2), np.float32)

    async def scenario():
        batcher = DynamicBatcher(
            run, max_batch_size=8, max_delay_s=0.0, inline_bytes=4 * quick.nbytes, served_as="model m version 1"
        )
        answers = [await batcher.submit({"x": x}) for x in (quick, slow, quick, slow)]
        together = await asyncio.gather(*(batcher.submit({"x": quick}) for _ in range(3)))
        batcher.close()
        return threading.get_ident(), batcher.on_loop.max_bytes, answers + together

    with caplog.at_level("WARNING", logger="unideploy.server"):
        loop_thread, budget, answers = asyncio.run(scenario())
    assert [t == loop_thread for t in threads] == [True, True, False, False, False]  # the last: 3 rows merged
    assert budget == 0 and [a.outputs["y"][0, 0] for a in answers] == [1, 2, 1, 2, 1, 1, 1]
    (warning,) = [r.getMessage() for r in caplog.records if "event loop" in r.getMessage()]
    assert warning.startswith("model m version 1: a call took ") and "worker thread from now on" in warning


def test_a_call_on_the_event_loop_that_only_waited_for_a_core_keeps_its_version_there(caplog):
    """A call that took long on the clock but not on the loop's thread (it waited: on a busy
    machine, for a core) says nothing about the model: its version's calls stay on the loop."""
    threads: list[int] = []

    def run(inputs):
        threads.append(threading.get_ident())
        if inputs["x"].max() > 0:
            threading.Event().wait(5 * LOOP_CALL_LIMIT_S)  # waiting, not computing
        return {"y": inputs["x"] + 1}

    quick, waits = np.zeros((1, 2), np.float32), np.ones((1, 2), np.float32)

    async def scenario():
        batcher = DynamicBatcher(run, max_batch_size=8, max_delay_s=0.0, inline_bytes=quick.nbytes)
        for x in (waits, quick):
            await batcher.submit({"x": x})
        batcher.close()
        return threading.get_ident(), batcher.on_loop.max_bytes

    with caplog.at_level("WARNING", logger="unideploy.server"):
        loop_thread, budget = asyncio.run(scenario())
    assert threads == [loop_thread, loop_thread] and budget == quick.nbytes
    assert not [r for r in caplog.records if "event loop" in r.getMessage()]


def test_queued_requests_run_side_by_side_on_lanes_and_a_lone_one_on_every_core():
    """With lanes, a lone request runs on the session with every core; requests that queued while
    it ran go one each to the lanes, which run at the same time (never merged), and the session
    with every core never runs while a lane does."""
    release, held = threading.Event(), threading.Event()
    both_lanes = threading.Barrier(2, timeout=30)  # passes only when two lane runs overlap
    running: list[str] = []
    log: list[tuple[str, int, list[str]]] = []
    lock = threading.Lock()

    def runner(kind: str):
        def run(inputs):
            with lock:
                log.append((kind, inputs["x"].shape[0], list(running)))
                running.append(kind)
            try:
                if kind == "all-cores" and len(log) == 1:
                    held.set()
                    release.wait(30)  # hold the lone request while the others queue
                elif kind == "lane" and sum(k == "lane" for k, _, _ in log) <= 2:
                    both_lanes.wait()
                return {"y": inputs["x"] * 10}
            finally:
                with lock:
                    running.remove(kind)

        return run

    async def scenario():
        batcher = DynamicBatcher(
            runner("all-cores"),
            max_batch_size=8,
            max_delay_s=0,
            lanes=[runner("lane"), runner("lane")],
        )
        assert not batcher.merges
        first = asyncio.ensure_future(batcher.submit({"x": np.zeros((1, 1), np.float32)}))
        await asyncio.get_running_loop().run_in_executor(None, held.wait, 30)  # the lone request runs
        others = [asyncio.ensure_future(batcher.submit({"x": np.full((1, 1), i, np.float32)})) for i in (1, 2, 3, 4)]
        await asyncio.sleep(0)  # each submit puts its request in the queue at its first step
        release.set()
        results = await asyncio.gather(first, *others)
        lone = await batcher.submit({"x": np.full((1, 1), 5, np.float32)})  # all lanes idle again
        batcher.close()
        return [*results, lone]

    results = asyncio.run(scenario())
    assert [kind for kind, _, _ in log] == ["all-cores", "lane", "lane", "lane", "lane", "all-cores"]
    assert all(rows == 1 for _, rows, _ in log)  # one request per lane run: nothing merged
    assert all("all-cores" not in running and (kind == "lane" or not running) for kind, _, running in log)
    for i, result in enumerate(results):
        np.testing.assert_array_equal(result.outputs["y"], np.full((1, 1), 10.0 * i))
        assert result.batch_rows == 1


def test_lanes_serve_a_real_model_with_their_share_of_the_cores(digits, tmp_path):
    """``lanes: 2`` in model.yaml: two more sessions of the package, each with half the threads,
    answering concurrent requests exactly as the session with every core answers a lone one. A
    version that does not merge (``max_batch_size: 1``) is scheduled by a batcher all the same."""
    import shutil

    import yaml

    from unideploy.runtimes.base import usable_cores
    from unideploy.server.dataplane import DataPlane
    from unideploy.server.metrics import ServerMetrics
    from unideploy.server.models import ModelRegistry

    shutil.copytree(digits["package"], tmp_path / "digits" / "1")
    (tmp_path / "digits" / "model.yaml").write_text(yaml.safe_dump({"lanes": 2}))
    shutil.copytree(digits["package"], tmp_path / "unmerged" / "1")
    (tmp_path / "unmerged" / "model.yaml").write_text(yaml.safe_dump({"max_batch_size": 1}))
    images = np.load(digits["data"])["x"][:24]

    async def scenario():
        with ThreadPoolExecutor(2) as pool:
            metrics = ServerMetrics()
            registry = ModelRegistry(tmp_path, pool, metrics)
            await registry.sync()
            served = registry.get("digits")
            threads = [lane.session.get_session_options().intra_op_num_threads for lane in served.lanes]
            dataplane = DataPlane(registry, metrics, 64)
            config = await dataplane.model_config("digits", None)
            alone = served.runtime.run({"x": images})["output"]
            results = await asyncio.gather(
                *(served.batcher.submit({"x": images[i : i + 1]}) for i in range(len(images)))
            )
            lane_threads = {t.name for t in threading.enumerate() if t.name.startswith("unideploy-lane")}
            unmerged = registry.get("unmerged").batcher
            assert not unmerged.merges and not registry.get("unmerged").lanes
            single = await unmerged.submit({"x": images[:3]})
            await registry.close()
            return threads, config, alone, results, lane_threads, single

    threads, config, alone, results, lane_threads, single = asyncio.run(scenario())
    np.testing.assert_allclose(single.outputs["output"], alone[:3], rtol=1e-5, atol=1e-6)
    assert threads == [max(1, usable_cores() // 2)] * 2
    assert "dynamic_batching" not in config  # lanes do not merge requests
    assert len(lane_threads) == 2  # both lanes ran
    np.testing.assert_allclose(np.concatenate([r.outputs["output"] for r in results]), alone, rtol=1e-5, atol=1e-6)


def test_requests_merge_only_with_the_same_scalar_inputs():
    """A rank-0 input (a sample rate) is one value for the whole runtime call: queued requests that
    agree on it are merged (rows concatenated, the scalar passed once), others run apart."""

    def request(rows: int, rate: int) -> dict:
        return {"x": np.full((rows, 2), float(rate), np.float32), "rate": np.array(rate, np.int64)}

    results, calls = behind_a_held_call(
        lambda inputs: (inputs["x"].shape[0], int(inputs["rate"])),
        request(1, 8000),
        [request(2, 16000), request(1, 8000), request(3, 16000)],
    )
    assert calls == [(1, 8000), (5, 16000), (1, 8000), (1, 8000)]
    for result, (rows, rate) in zip(results[1:4], [(2, 16000), (1, 8000), (3, 16000)], strict=True):
        np.testing.assert_array_equal(result.outputs["y"], np.full((rows, 2), 10.0 * rate))


def test_model_yaml_device_pins_a_model_to_the_cpu_or_refuses_without_a_gpu(digits, tmp_path):
    """``device`` in model.yaml (Triton's instance kind): ``cpu`` keeps a model off a GPU host's GPU
    and says where it ran; ``gpu`` where ONNX Runtime has no usable GPU is a failed load naming why,
    never a model quietly served from the CPU."""
    import shutil

    import yaml

    from unideploy.server.metrics import ServerMetrics
    from unideploy.server.models import ModelRegistry

    for name, settings in (
        ("on-cpu", {"device": "cpu", "pinned_memory": True}),
        ("on-gpu", {"device": "gpu"}),
        ("default", {"device": "cpu"}),
    ):
        shutil.copytree(digits["package"], tmp_path / name / "1")
        (tmp_path / name / "model.yaml").write_text(yaml.safe_dump(settings))

    async def scenario():
        with ThreadPoolExecutor(2) as pool:
            registry = ModelRegistry(tmp_path, pool, ServerMetrics())
            await registry.sync()
            ran = registry.get("on-cpu").ran
            failures = dict(registry.models["on-gpu"].failures)
            on_gpu = None if failures else registry.get("on-gpu").ran
            default = registry.get("default").ran
            await registry.close()
            return ran, failures, on_gpu, default

    ran, failures, on_gpu, default = asyncio.run(scenario())
    assert (ran["device"], ran["providers"]) == ("cpu", ["CPUExecutionProvider"])
    # page-locked batches: asked for on the CPU, named off and why; by default, on a GPU only
    assert ran["pinned_memory"] == "off: the model runs on the CPU" and "pinned_memory" not in default
    if provider_problem(CUDA) is None:  # a GPU host (the GPU check runs this file there): it loads on the GPU
        assert not failures and on_gpu is not None and on_gpu["device"] == "gpu"
        return
    ((_, reason),) = failures.values()
    assert "no GPU execution provider" in reason and "device: cpu in model.yaml" in reason, reason


def test_served_version_names_its_spin_policy(tmp_path, digits):
    """The spin policy a version runs with is in its metadata's parameters, as its providers and
    precision are: model.yaml's where it names one, else the server's default (spinning within a
    run only: on the H200 host's 8 cores, spinning between runs too doubled p99 at concurrency 1,
    docs/server.md, "Threads and spinning")."""
    import shutil

    import yaml

    from unideploy.server.dataplane import DataPlane
    from unideploy.server.metrics import ServerMetrics
    from unideploy.server.models import ModelRegistry

    for name, settings in (("named", {"spin": "never"}), ("default", {})):
        shutil.copytree(digits["package"], tmp_path / name / "1")
        (tmp_path / name / "model.yaml").write_text(yaml.safe_dump(settings))

    async def scenario():
        with ThreadPoolExecutor(2) as pool:
            metrics = ServerMetrics()
            registry = ModelRegistry(tmp_path, pool, metrics)
            await registry.sync()
            dataplane = DataPlane(registry, metrics, max_request_rows=64)
            found = {
                name: (await dataplane.model_metadata(name, None))["parameters"]["spin"]
                for name in ("named", "default")
            }
            await registry.close()
            return found

    assert asyncio.run(scenario()) == {"named": "never", "default": "run"}


def test_requests_merge_along_each_tensors_own_batch_axis(tmp_path):
    """Recurrent state laid out [2, batch, 3]: requests are merged along axis 1 of the state (and
    axis 0 of 'x'), and each answer's state split back along axis 1, the axes of the outputs
    measured on the warm-up sample; every answer equals the model's answer to that request alone."""
    import yaml
    from onnx_models import rows_of_state, stateful_model

    import unideploy
    from unideploy.server.metrics import ServerMetrics
    from unideploy.server.models import ModelRegistry

    (tmp_path / "src").mkdir()
    np.savez(tmp_path / "src" / "example.npz", **rows_of_state(4, 1))
    model = stateful_model(tmp_path / "src" / "stateful.onnx")
    unideploy.export(
        model, tmp_path / "repo" / "stateful" / "1", example_inputs=str(tmp_path / "src" / "example.npz")
    ).close()
    (tmp_path / "repo" / "stateful" / "model.yaml").write_text(yaml.safe_dump({"max_batch_size": 8}))
    requests = [rows_of_state(rows, seed) for rows, seed in ((1, 10), (2, 11), (3, 12))]
    alone = [unideploy.run(tmp_path / "repo" / "stateful" / "1", r) for r in requests]

    async def scenario():
        with ThreadPoolExecutor(2) as pool:
            registry = ModelRegistry(tmp_path / "repo", pool, ServerMetrics())
            await registry.sync()
            served = registry.get("stateful")
            axes = (served.batcher.axes, served.batcher.output_axes, served.batcher.merges)
            results = await asyncio.gather(*(served.batcher.submit(r) for r in requests))
            await registry.close()
            return axes, results

    axes, results = asyncio.run(scenario())
    assert axes == ({"x": 0, "state": 1}, {"y": 0, "stateN": 1}, True)
    for got, want in zip(results, alone, strict=True):
        np.testing.assert_allclose(got.outputs["y"], want["y"], rtol=1e-6)
        np.testing.assert_allclose(got.outputs["stateN"], want["stateN"], rtol=1e-6)
    assert [r.batch_rows for r in results] == [6, 6, 6]  # one call: all three queued before the batcher ran


def test_a_real_model_whose_work_grows_with_a_value_leaves_the_event_loop_after_one_long_call(
    tmp_path, caplog, monkeypatch
):
    """An ONNX graph whose work is set by an input's value (a count of 2**26 ones: a 256 MB fill
    and sum) warms up in microseconds on its reference sample (a count of 1), so its calls run on
    the event loop; the first large count still answers, exactly as the model alone does, and
    moves the version's calls to its worker thread with one warning naming it. The warm-up's
    allowance is widened so that a busy machine (the suite's other workers) cannot decide where
    the calls start: a warm-up once took over 0.2 ms there, and the calls started on the thread."""
    from onnx_models import value_sized_model

    import unideploy
    from unideploy.server import batching

    monkeypatch.setattr(batching, "INLINE_RUN_S", 0.05)
    from unideploy.server.metrics import ServerMetrics
    from unideploy.server.models import ModelRegistry

    (tmp_path / "src").mkdir()
    np.savez(tmp_path / "src" / "example.npz", n=np.array([1], np.int64))
    model = value_sized_model(tmp_path / "src" / "counter.onnx")
    package = tmp_path / "repo" / "counter" / "1"
    unideploy.export(model, package, example_inputs=str(tmp_path / "src" / "example.npz")).close()
    large = {"n": np.array([2**26], np.int64)}
    alone = unideploy.run(package, large)["total"]

    async def scenario():
        with ThreadPoolExecutor(2) as pool:
            registry = ModelRegistry(tmp_path / "repo", pool, ServerMetrics())
            await registry.sync()
            budget = registry.get("counter").batcher.on_loop
            on_load = budget.max_bytes
            small = await registry.get("counter").batcher.submit({"n": np.array([3], np.int64)})
            answers = [await registry.get("counter").batcher.submit(large) for _ in range(2)]
            await registry.close()
            return on_load, budget.max_bytes, small, answers

    with caplog.at_level("WARNING", logger="unideploy.server"):
        on_load, after, small, answers = asyncio.run(scenario())
    assert on_load == 8 and after == 0  # 8 bytes of input answered within 0.2 ms at load: on the loop, then not
    assert small.outputs["total"].tolist() == [3.0]
    for answer in answers:
        np.testing.assert_array_equal(answer.outputs["total"], alone)
    (warning,) = [r.getMessage() for r in caplog.records if "event loop" in r.getMessage()]
    assert warning.startswith("model counter version 1: a call took "), warning


def test_a_model_whose_answer_is_not_per_row_is_not_merged(tmp_path):
    """An output that does not grow by rows (a sum over the whole call) cannot be split from a
    merged batch: such a version runs every request on its own, and each total is its own."""
    from onnx_models import batch_statistic_model

    import unideploy
    from unideploy.server.metrics import ServerMetrics
    from unideploy.server.models import ModelRegistry

    model = batch_statistic_model(tmp_path / "statistic.onnx")
    unideploy.export(model, tmp_path / "repo" / "statistic" / "1", input_shapes=["x:batch=2,4"]).close()
    requests = [{"x": np.full((rows, 4), float(rows), np.float32)} for rows in (1, 2, 3)]

    async def scenario():
        with ThreadPoolExecutor(2) as pool:
            registry = ModelRegistry(tmp_path / "repo", pool, ServerMetrics())
            await registry.sync()
            served = registry.get("statistic")
            batcher = served.batcher
            results = await asyncio.gather(*(batcher.submit(r) for r in requests))
            await registry.close()
            return (served.signature.batch_dim, batcher.merges), results

    merges, results = asyncio.run(scenario())
    assert merges == ("batch", False)  # a dynamic batch, and still not merged
    assert [float(r.outputs["total"]) for r in results] == [4.0, 16.0, 36.0]
    assert [r.batch_rows for r in results] == [1, 2, 3]
