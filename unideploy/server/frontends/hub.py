"""The model process's side: front ends connect here and their requests run on the one dataplane.

Messages from a front end (``client``), each a tuple:

- ``("hello", pid, index)`` first: whose slots its tensors live in, which front end it is; ``("listening",)`` once it serves;
- ``("call", id, method, args)``: a dataplane call other than inference (metadata, readiness,
  shared-memory regions, repository, routing, metrics), answered ``("ok", id, value)``;
- ``("infer", id, slot, request)``: an ``InferRequest`` whose tensors are ``Slotted`` in the named
  slot (or ``Placed`` in a client's shared memory), answered ``("result", id, model, version,
  variant, outputs)`` with each output ``Slotted`` in the same slot, ``Inline`` or ``Written``;
- ``("done", id, encode_s, total_s)`` once its response is encoded (the stages the model process
  records, since /metrics is one for all front ends; None when its client had left);
- ``("forget", names)``: slots the front end gave back.

Any refusal is answered ``("error", id, exception)``: the same error the protocol maps to a status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from unideploy.errors import UnideployError
from unideploy.server.dataplane import REMOTE_CALLS, DataPlane, InferRequest
from unideploy.server.frontends.slots import Inline, SlotMaps, Slotted, aligned, put
from unideploy.server.frontends.wire import Channel
from unideploy.server.metrics import RequestSeries
from unideploy.server.shared_memory import Written

log = logging.getLogger("unideploy.server")


class FrontendLink:
    """One connected front end."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.channel = Channel(self._received, self._closed)
        self.pid: int | None = None
        self.requests: Any = None  # its series of unideploy_frontend_requests
        self.slots: SlotMaps | None = None
        self.series: dict[int, RequestSeries] = {}  # answered requests whose encoding is not yet recorded
        self.tasks: set[asyncio.Task] = set()

    def _received(self, message: tuple) -> None:
        kind = message[0]
        if kind == "done":
            _, request_id, encode_s, total_s = message
            series = self.series.pop(request_id, None)
            if series is not None and encode_s is not None:  # None: the front end's client had left
                DataPlane.record_encoded(series, encode_s, total_s)
        elif kind == "forget":
            assert self.slots is not None
            for name in message[1]:
                self.slots.forget(name)
        elif kind == "hello":
            _, self.pid, index = message
            self.slots = SlotMaps(self.pid)
            self.requests = self.hub.dataplane.metrics.frontend_requests.labels(str(index))
        elif kind == "listening":
            self.hub.joined(self)
        else:
            task = asyncio.get_running_loop().create_task(self._answer(message))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _answer(self, message: tuple) -> None:
        kind, request_id = message[0], message[1]
        try:
            if kind == "infer":
                reply = await self._infer(request_id, message[2], message[3])
            elif kind == "call" and message[2] in REMOTE_CALLS:
                reply = ("ok", request_id, await getattr(self.hub.dataplane, message[2])(*message[3]))
            else:
                raise ValueError(f"unknown message {kind!r}")
        except UnideployError as exc:
            reply = ("error", request_id, exc)
        except Exception as exc:  # a bug: the front end answers 500 and the trace is logged here
            log.exception("a front end's request failed")
            reply = ("error", request_id, RuntimeError(f"{type(exc).__name__}: {exc}"))
        with contextlib.suppress(ConnectionError):  # the front end is gone; its client went with it
            self.channel.send(reply)

    async def _infer(self, request_id: int, slot_name: str | None, request: InferRequest) -> tuple:
        self.requests.inc()
        mapped = None
        end = 0
        if slot_name is not None:
            assert self.slots is not None
            mapped = self.slots.get(slot_name)
            for key, value in request.inputs.items():
                if isinstance(value, Slotted):
                    request.inputs[key] = view = value.view(mapped)
                    end = max(end, value.offset + aligned(view.nbytes))  # outputs go after the inputs
        result = await self.hub.dataplane.infer(request)
        request.inputs = {}  # no view of the slot outlives the answer (shadow copies are their own)
        outputs: dict[str, Slotted | Inline | Written] = {}
        for name, array in result.outputs.items():
            if isinstance(array, Written):
                outputs[name] = array
            elif mapped is not None and end + array.nbytes <= len(mapped):
                outputs[name] = put(mapped, end, array)
                end += aligned(array.nbytes)
            else:
                outputs[name] = Inline(array.tobytes(), array.dtype.str, tuple(array.shape))
        assert result.series is not None
        self.series[request_id] = result.series
        return ("result", request_id, result.model, result.version, result.variant, outputs)

    def _closed(self) -> None:
        for task in self.tasks:
            task.cancel()
        self.series.clear()
        self.hub.left(self)


class Hub:
    """Where front ends connect (a Unix socket in the server's private folder)."""

    def __init__(self, dataplane: DataPlane, path: str) -> None:
        self.dataplane = dataplane
        self.path = path
        self.links: dict[int, FrontendLink] = {}  # by front end pid
        self.changed = asyncio.Event()  # set whenever a front end joins or leaves
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        self._server = await asyncio.get_running_loop().create_unix_server(
            lambda: FrontendLink(self).channel, self.path
        )

    def joined(self, link: FrontendLink) -> None:
        assert link.pid is not None
        self.links[link.pid] = link
        self.dataplane.metrics.frontends.set(len(self.links))
        self.changed.set()

    def left(self, link: FrontendLink) -> None:
        if link.pid is not None and self.links.get(link.pid) is link:
            del self.links[link.pid]
            self.dataplane.metrics.frontends.set(len(self.links))
        self.changed.set()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
