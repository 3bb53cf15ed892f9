"""The front end <-> model process channel: framing, and deferred messages that ride with the next."""

from __future__ import annotations

import asyncio
import socket

import pytest

from unideploy.server.frontends.wire import Channel


def _loops() -> list:
    """The event loops the server may run on: asyncio's, and uvloop's where installed (the default)."""
    try:
        import uvloop
    except ImportError:
        return [asyncio.new_event_loop]
    return [asyncio.new_event_loop, uvloop.new_event_loop]


class Received:
    """The messages one end got, and how many reads brought them."""

    def __init__(self) -> None:
        self.messages: list = []
        self.reads = 0
        self.arrived = asyncio.Event()
        self.closed = asyncio.Event()
        self.channel = Channel(self._message, self.closed.set)
        data_received = self.channel.data_received

        def counted(data: bytes) -> None:
            self.reads += 1
            data_received(data)

        self.channel.data_received = counted  # type: ignore[method-assign]

    def _message(self, message: object) -> None:
        self.messages.append(message)
        self.arrived.set()

    async def next(self, count: int) -> list:
        while len(self.messages) < count:
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), 10)
        return self.messages


async def _pair() -> tuple[Channel, Received]:
    loop = asyncio.get_running_loop()
    near, far = socket.socketpair()
    sender = Channel(lambda _m: None, lambda: None)
    received = Received()
    await loop.connect_accepted_socket(lambda: sender, near)
    await loop.connect_accepted_socket(lambda: received.channel, far)
    return sender, received


def test_a_deferred_message_rides_with_the_next_in_one_read():
    async def run() -> None:
        sender, received = await _pair()
        sender.defer(("done", 1, 0.1, 0.2))
        sender.send(("infer", 2, None, {"x": b"\x00" * 100}))
        assert await received.next(2) == [("done", 1, 0.1, 0.2), ("infer", 2, None, {"x": b"\x00" * 100})]
        assert received.reads == 1  # one write carried both
        sender.close()
        await asyncio.wait_for(received.closed.wait(), 10)

    asyncio.run(run())


def test_a_deferred_message_alone_still_arrives_and_close_sends_what_waits():
    async def run() -> None:
        sender, received = await _pair()
        sender.defer(("done", 1, None, None))
        assert await received.next(1) == [("done", 1, None, None)]  # no other message came: its timer sent it
        sender.defer(("done", 2, None, None))
        sender.close()
        await asyncio.wait_for(received.closed.wait(), 10)
        assert received.messages == [("done", 1, None, None), ("done", 2, None, None)]

    asyncio.run(run())


@pytest.mark.parametrize("loop_factory", _loops(), ids=lambda f: f.__module__.split(".")[0])
def test_messages_sent_in_one_turn_go_in_one_write_and_large_ones_arrive_whole_in_order(loop_factory):
    """Three answers sent in one turn of the loop arrive in one read; messages far larger than the
    socket's buffer (written straight to the socket as far as it takes them, the rest through the
    transport) arrive whole and in order, with small ones sent between them."""

    async def run() -> None:
        sender, received = await _pair()
        for i in range(3):
            sender.send(("result", i))
        assert await received.next(3) == [("result", i) for i in range(3)]
        assert received.reads == 1
        big = [bytes([i]) * (8 << 20) for i in range(3)]
        for i, blob in enumerate(big):
            sender.send(("big", i, blob))
            await asyncio.sleep(0)  # each its own turn: the second finds the first still buffered
            sender.send(("small", i))
        messages = await received.next(9)
        assert messages[3:] == [m for i, blob in enumerate(big) for m in (("big", i, blob), ("small", i))]
        sender.close()
        await asyncio.wait_for(received.closed.wait(), 10)

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(run())
