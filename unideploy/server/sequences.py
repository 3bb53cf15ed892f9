"""Sequences of a streaming model (Triton's sequence batcher with implicit state): a client sends a
stream's calls with one ``sequence_id`` (``sequence_start`` on the first, ``sequence_end`` on the
last) and only its real inputs; the server keeps the state the model returns (``Signature.state``)
and feeds it to the sequence's next call.

The state lives in the process that owns the models, so any front end may take any call of a
sequence. A sequence keeps the version it started on (A/B routing picks it once), and its calls run
one after another in the order they arrive: a call waits for the one before it. Memory is bounded:
at most ``max_sequences`` live at once, and one idle for ``idle_s`` may be reclaimed (a call to it
is then told to start again).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from unideploy.server.errors import BadRequest, ServerError

SequenceId = int | str
MAX_ID_CHARS = 256  # a string id longer than this is refused: the server keeps every live one
CONTROLS = frozenset(("sequence_id", "sequence_start", "sequence_end"))  # a request's parameters for it


class TooManySequences(ServerError):
    """Every sequence slot holds a live sequence: 429 / RESOURCE_EXHAUSTED (end some, then retry)."""

    http_status = 429
    grpc_code = "RESOURCE_EXHAUSTED"


@dataclass(frozen=True)
class SequenceControl:
    """A request's place in a sequence, from its ``sequence_*`` parameters."""

    id: SequenceId
    start: bool = False
    end: bool = False


def sequence_control(parameters: Mapping[str, Any]) -> SequenceControl | None:
    """The ``sequence_id``, ``sequence_start`` and ``sequence_end`` parameters of a request (REST's
    JSON, or gRPC's as Python values), as Triton's clients send them; None where the request is not
    part of a sequence (no id, or Triton's 0 or empty string)."""
    found = {key: parameters[key] for key in CONTROLS if parameters.get(key) is not None}
    ident = found.get("sequence_id")
    flags = {key: found.get(key, False) for key in ("sequence_start", "sequence_end")}
    for key, value in flags.items():
        if not isinstance(value, bool):
            raise BadRequest(f"request parameter '{key}' must be true or false, got {value!r}")
    if ident is None or ident == 0 or ident == "":
        if any(flags.values()):
            raise BadRequest(
                "sequence_start/sequence_end given without a sequence_id",
                "give each call of a sequence the same non-zero sequence_id",
            )
        return None
    if isinstance(ident, bool) or not isinstance(ident, (int, str)):
        raise BadRequest(f"request parameter 'sequence_id' must be an integer or a string, got {ident!r}")
    if isinstance(ident, int) and not 0 < ident < 2**64:
        raise BadRequest(f"sequence_id {ident} is out of range", "use an integer from 1 to 2**64 - 1")
    if isinstance(ident, str) and len(ident) > MAX_ID_CHARS:
        raise BadRequest(f"sequence_id is {len(ident)} characters long", f"use at most {MAX_ID_CHARS}")
    return SequenceControl(ident, flags["sequence_start"], flags["sequence_end"])


@dataclass
class Sequence:
    """One live sequence: the version it runs on, the state its last call returned, and a lock that
    keeps its calls in order."""

    version: str
    state: dict[str, np.ndarray] = field(default_factory=dict)
    last_used: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class SequenceStates:
    """Every live sequence of every model, keyed by model name and sequence id."""

    def __init__(
        self,
        max_sequences: int,
        idle_s: float,
        clock: Callable[[], float] = time.monotonic,
        header: str | None = None,
    ) -> None:
        self.max_sequences = max_sequences
        self.idle_s = idle_s
        # the header a load balancer in front routes a sequence's calls by (``check_routed``)
        self.header = header.lower() if header else None
        self._clock = clock
        self._live: dict[tuple[str, SequenceId], Sequence] = {}

    def __len__(self) -> int:
        return len(self._live)

    def check_routed(self, control: SequenceControl, headers: Mapping[str, str]) -> None:
        """Behind a load balancer that routes by a header (Ray Serve's session header, an Istio
        consistent hash), a sequence's calls reach the replica that holds its state only if each
        carries its id there; one that does not may land anywhere, and is refused here at once
        rather than on whichever later call lands on another replica."""
        if self.header is not None and headers.get(self.header) != str(control.id):
            raise BadRequest(
                f"a call of sequence {control.id!r} without its id in the '{self.header}' header",
                f"send '{self.header}: {control.id}' with every call of the sequence: the replicas are chosen by it, "
                "so that each call reaches the one holding the sequence's state",
            )

    def version_of(self, model: str, control: SequenceControl) -> str | None:
        """The version a continuing sequence runs on (None: a starting one, which routing picks)."""
        if control.start:
            return None
        return self._continuing(model, control).version

    def _continuing(self, model: str, control: SequenceControl) -> Sequence:
        found = self._live.get((model, control.id))
        if found is not None and not found.lock.locked() and self._idle(found):
            del self._live[model, control.id]
            found = None
        if found is None:
            raise BadRequest(
                f"sequence {control.id!r} of model '{model}' is not live (never started, ended, idle for more than "
                f"{self.idle_s:g} s, or its version was unloaded)",
                "start it again with sequence_start: true",
            )
        return found

    def _idle(self, sequence: Sequence) -> bool:
        return self._clock() - sequence.last_used > self.idle_s

    def _slot(self, model: str, control: SequenceControl, version: str) -> Sequence:
        """A starting sequence's entry: its own, restarted, or a new one where a slot is free (idle
        sequences reclaimed first)."""
        key = (model, control.id)
        if key in self._live:
            return self._live[key]
        if len(self._live) >= self.max_sequences:
            for other, sequence in list(self._live.items()):
                if not sequence.lock.locked() and self._idle(sequence):
                    del self._live[other]
        if len(self._live) >= self.max_sequences:
            raise TooManySequences(
                f"all {self.max_sequences} sequence slots hold a live sequence",
                "end sequences with sequence_end: true, retry later, or raise the server's --max-sequences",
            )
        self._live[key] = Sequence(version)
        return self._live[key]

    @asynccontextmanager
    async def call(self, model: str, control: SequenceControl, version: str) -> AsyncIterator[Sequence]:
        """Hold ``control``'s sequence for one call, after the calls before it; a starting call gets
        it with no state (the caller starts it from the signature's initial values). The sequence
        ends when an ending call is done, or when a starting call fails (nothing to go on from)."""
        sequence = await self._held(model, control, version)
        try:
            if control.start:
                sequence.version, sequence.state = version, {}
            ok = False
            try:
                yield sequence
                ok = True
            finally:
                sequence.last_used = self._clock()
                if control.end or (control.start and not ok):
                    self._live.pop((model, control.id), None)
        finally:
            sequence.lock.release()

    async def _held(self, model: str, control: SequenceControl, version: str) -> Sequence:
        """``control``'s sequence with its lock taken, once the calls before have run. One that ended
        meanwhile (its sequence_end call ran first): a starting call starts it afresh, any other is
        refused."""
        while True:
            sequence = self._slot(model, control, version) if control.start else self._continuing(model, control)
            await sequence.lock.acquire()
            if self._live.get((model, control.id)) is sequence:
                return sequence
            sequence.lock.release()
            if not control.start:
                raise BadRequest(
                    f"sequence {control.id!r} of model '{model}' ended before this call of it ran",
                    "send a sequence's calls after its sequence_end call, never beside it; start it again "
                    "with sequence_start: true",
                )
