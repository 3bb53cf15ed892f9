"""A front end's dataplane: every call answered by the model process (``hub``), over one Unix
socket, with the tensors in this process's shared-memory slots."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from unideploy.server.dataplane import InferRequest, InferResult
from unideploy.server.errors import Unavailable
from unideploy.server.frontends.slots import Inline, Slot, SlotPool, Slotted, aligned, put
from unideploy.server.frontends.wire import Channel
from unideploy.server.shared_memory import Written
from unideploy.server.unread import Unaligned


def _gone() -> Unavailable:
    return Unavailable("the model process is gone", "the server is restarting; retry")


@dataclass
class RemoteResult(InferResult):
    request_id: int = 0
    slot: Slot | None = None  # holds the outputs' memory until the response is encoded


class RemoteDataPlane:
    """The ``DataPlaneAPI`` of a front-end process."""

    def __init__(self) -> None:
        self.channel = Channel(self._received, self._closed)
        self.pool = SlotPool()
        self.lost = asyncio.Event()  # the model process is gone: the front end stops
        self._waiting: dict[int, asyncio.Future] = {}
        self._ids = itertools.count(1)
        self.answered = 0  # inference requests whose answers are done with (encoded, or their client left)

    async def connect(self, path: str, index: int) -> None:
        """Connect to the model process's hub as front end ``index``."""
        await asyncio.get_running_loop().create_unix_connection(lambda: self.channel, path)
        self.channel.send(("hello", os.getpid(), index))

    def _received(self, message: tuple) -> None:
        future = self._waiting.pop(message[1], None)
        if future is None or future.done():  # its caller went away (a cancelled request)
            return
        if message[0] == "error":
            future.set_exception(message[2])
        else:
            future.set_result(message)

    def _closed(self) -> None:
        self.lost.set()
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(_gone())
        self._waiting.clear()

    def _send(self, *message: Any) -> tuple[int, asyncio.Future]:
        request_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        try:
            self.channel.send((message[0], request_id, *message[1:]))
        except ConnectionError:
            raise _gone() from None
        self._waiting[request_id] = future
        return request_id, future

    async def _ask(self, *message: Any) -> tuple:
        return await self._send(*message)[1]

    async def _call(self, method: str, *args: Any) -> Any:
        return (await self._ask("call", method, args))[2]

    # -- everything but inference: answered by the model process's dataplane -----------------
    async def live(self) -> bool:
        return not self.lost.is_set()

    async def ready(self) -> bool:
        return bool(await self._call("ready"))

    async def server_metadata(self) -> dict[str, Any]:
        return await self._call("server_metadata")

    async def model_ready(self, name: str, version: str | None) -> bool:
        return await self._call("model_ready", name, version)

    async def model_metadata(self, name: str, version: str | None) -> dict[str, Any]:
        return await self._call("model_metadata", name, version)

    async def model_config(self, name: str, version: str | None) -> dict[str, Any]:
        return await self._call("model_config", name, version)

    async def metrics_text(self) -> bytes:
        return await self._call("metrics_text")

    async def shm_status(self, region: str | None, kind: str = "system") -> list[dict[str, Any]]:
        return await self._call("shm_status", region, kind)

    async def shm_register(self, region: str, key: Any, offset: Any, byte_size: Any) -> None:
        await self._call("shm_register", region, key, offset, byte_size)

    async def cuda_shm_register(self, region: str, raw_handle: Any, device_id: Any, byte_size: Any) -> None:
        await self._call("cuda_shm_register", region, raw_handle, device_id, byte_size)

    async def shm_unregister(self, region: str | None, kind: str = "system") -> None:
        await self._call("shm_unregister", region, kind)

    async def repository_index(self, ready_only: bool) -> list[dict[str, Any]]:
        return await self._call("repository_index", ready_only)

    async def repository_load(self, name: str) -> None:
        await self._call("repository_load", name)

    async def repository_unload(self, name: str) -> None:
        await self._call("repository_unload", name)

    async def routing(self, name: str) -> dict[str, Any] | None:
        return await self._call("routing", name)

    async def model_statistics(self, name: str | None, version: str | None) -> dict[str, Any]:
        return await self._call("model_statistics", name, version)

    async def set_routing(self, name: str, document: Any) -> dict[str, Any]:
        return await self._call("set_routing", name, document)

    # -- inference -------------------------------------------------------------------------
    async def infer(self, request: InferRequest) -> InferResult:
        received = time.perf_counter() - request.decode_s
        arrays = {k: v for k, v in request.inputs.items() if isinstance(v, (np.ndarray, Unaligned))}
        slot = self.pool.take(sum(aligned(a.nbytes) for a in arrays.values())) if arrays else None
        if slot is not None:
            offset = 0
            for key, array in arrays.items():
                request.inputs[key] = put(slot.mapped, offset, array)
                offset += aligned(array.nbytes)
        request.headers = dict(request.headers)  # a Starlette Headers is not for pickling
        if self.pool.retired:
            self.channel.defer(("forget", self.pool.retired))  # rides with the request below
            self.pool.retired = []
        request_id, answer = self._send("infer", slot.name if slot else None, request)
        try:
            _, _, model, version, variant, placed = await asyncio.shield(answer)
        except asyncio.CancelledError:  # the client left; the model process may still write the slot
            answer.add_done_callback(lambda _: self._abandoned(request_id, slot))
            raise
        except BaseException:
            if slot is not None:
                self.pool.give(slot)
            raise
        if slot is not None:
            slot.unlink()  # the model process has it mapped: nothing is left behind if this process dies
        outputs: dict[str, np.ndarray | Written] = {}
        for name, value in placed.items():
            if isinstance(value, Slotted):
                assert slot is not None
                outputs[name] = value.view(slot.mapped)
            elif isinstance(value, Inline):
                outputs[name] = value.view()
            else:
                outputs[name] = value
        return RemoteResult(model, version, variant, outputs, received, None, request_id, slot)

    def _abandoned(self, request_id: int, slot: Slot | None) -> None:
        """A request whose caller went away has been answered: its slot is free again."""
        if slot is not None:
            slot.unlink()
            self.pool.give(slot)
        self._done(request_id, None, None)

    def activity(self) -> tuple[int, int]:
        """(requests answered, calls waiting for the model process): when a burst of traffic has
        ended (``memory.release_after_bursts``)."""
        return self.answered, len(self._waiting)

    def _done(self, request_id: int, encode_s: float | None, total_s: float | None) -> None:
        """Tell the model process the response is encoded (None: it never was; nothing to record),
        with the next message (it only records it)."""
        self.answered += 1
        with contextlib.suppress(ConnectionError):
            self.channel.defer(("done", request_id, encode_s, total_s))

    def encoded(self, result: InferResult, encode_s: float) -> None:
        assert isinstance(result, RemoteResult)
        if result.slot is not None:
            result.outputs = {}  # the views go before the slot is reused
            self.pool.give(result.slot)
        self._done(result.request_id, encode_s, time.perf_counter() - result.received)

    def close(self) -> None:
        self.channel.close()
        self.pool.close()
