"""Sealed records: frames after the handshake are encrypted and authenticated.

Unit tests of the record layer on memory streams, then two real nodes talking through a
TCP proxy the test controls: it captures the traffic, flips a byte, replays a record."""

from __future__ import annotations

import logging
import struct
from contextlib import AsyncExitStack

import pytest
import trio
import trio.testing

from episub import Node
from episub.net.sealing import (
    RECORD_PLAINTEXT,
    RecordOpener,
    RecordSealer,
    SealedStream,
    SealError,
    direction_keys,
)
from tests.net_helpers import KEY, TOPIC, fast_config, run, wait_until

SESSION = bytes(range(32))


def sealed_pair() -> tuple[SealedStream, SealedStream, trio.testing.MemoryStreamPair]:  # type: ignore[name-defined]
    left, right = trio.testing.memory_stream_pair()
    a_send, a_receive = direction_keys(SESSION, initiator=True)
    b_send, b_receive = direction_keys(SESSION, initiator=False)
    a = SealedStream(left, send_key=a_send, receive_key=a_receive)
    b = SealedStream(right, send_key=b_send, receive_key=b_receive)
    return a, b, (left, right)


async def receive_exactly(stream: SealedStream, size: int) -> bytes:
    out = b""
    while len(out) < size:
        chunk = await stream.receive_some()
        assert chunk, "the stream ended early"
        out += chunk
    return out


def test_records_round_trip_both_ways_and_large_writes_are_split() -> None:
    async def main() -> None:
        a, b, _ = sealed_pair()
        big = bytes(range(256)) * (3 * RECORD_PLAINTEXT // 256 + 7)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(a.send_all, big)
            assert await receive_exactly(b, len(big)) == big
        await b.send_all(b"back")
        assert await receive_exactly(a, 4) == b"back"

    run(main)


def test_the_two_directions_use_different_keys() -> None:
    assert direction_keys(SESSION, initiator=True) == direction_keys(SESSION, initiator=False)[::-1]
    send, receive = direction_keys(SESSION, initiator=True)
    assert send != receive


def test_a_record_fed_one_byte_at_a_time_opens() -> None:
    a_send, _ = direction_keys(SESSION, initiator=True)
    _, b_receive = direction_keys(SESSION, initiator=False)
    sealer, opener = RecordSealer(a_send), RecordOpener(b_receive)
    wire = sealer.seal(b"hello") + sealer.seal(b" world")
    opened = b"".join(opener.feed(bytes([byte])) for byte in wire)
    assert opened == b"hello world" and opener.buffered == 0


def test_records_fed_in_any_split_open_in_order() -> None:
    a_send, _ = direction_keys(SESSION, initiator=True)
    _, b_receive = direction_keys(SESSION, initiator=False)
    sealer, opener = RecordSealer(a_send), RecordOpener(b_receive)
    big = bytes(range(256)) * (RECORD_PLAINTEXT // 256 + 3)  # two records
    wire = sealer.seal(b"one") + sealer.seal(big) + sealer.seal(b"two")
    cut = len(wire) // 3
    opened = (
        opener.feed(wire[:cut]) + opener.feed(wire[cut : 2 * cut]) + opener.feed(wire[2 * cut :])
    )
    assert opened == b"one" + big + b"two"


@pytest.mark.parametrize(
    "size", [1, RECORD_PLAINTEXT - 1, RECORD_PLAINTEXT, RECORD_PLAINTEXT + 1, 3 * RECORD_PLAINTEXT]
)
def test_a_write_is_sealed_as_whole_records_each_with_its_length_and_tag(size: int) -> None:
    """Records are written into one buffer: each is its 4-byte length, then ciphertext and
    tag; a write of n bytes takes ceil(n / RECORD_PLAINTEXT) of them."""
    a_send, _ = direction_keys(SESSION, initiator=True)
    _, b_receive = direction_keys(SESSION, initiator=False)
    sealer, opener = RecordSealer(a_send), RecordOpener(b_receive)
    data = bytes(i % 251 for i in range(size))
    wire = sealer.seal(memoryview(data))
    lengths, pos = [], 0
    while pos < len(wire):
        (length,) = struct.unpack_from(">I", wire, pos)
        lengths.append(length - 16)
        pos += 4 + length
    expected = [min(RECORD_PLAINTEXT, size - s) for s in range(0, size, RECORD_PLAINTEXT)]
    assert pos == len(wire) and lengths == expected
    assert opener.feed(bytes(wire)) == data and opener.buffered == 0
    assert opener.feed(sealer.seal(bytearray(b"next"))) == b"next"  # the counters agree


@pytest.mark.parametrize("damage", ["flip", "replay", "drop", "huge"])
def test_an_altered_replayed_dropped_or_oversized_record_does_not_open(damage: str) -> None:
    a_send, _ = direction_keys(SESSION, initiator=True)
    _, b_receive = direction_keys(SESSION, initiator=False)
    sealer, opener = RecordSealer(a_send), RecordOpener(b_receive)
    first, second = sealer.seal(b"one"), sealer.seal(b"two")
    wire = {
        "flip": first[:-1] + bytes([first[-1] ^ 1]),
        "replay": first + first,
        "drop": second,
        "huge": struct.pack(">I", 1 << 30),
    }[damage]
    with pytest.raises(SealError):
        opener.feed(wire)


# -- two nodes through a proxy --------------------------------------------------------------


class Proxy:
    """Forwards TCP both ways between a client and `target`, recording every byte; can
    damage the client-to-target direction, whose units (4-byte length + body: first the two
    handshake frames, then sealed records) it parses."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.captured = bytearray()
        self.units: list[bytes] = []  # client to target, whole units
        self.damage: str | None = None  # "flip" or "replay": applied to the next unit
        self.address = ""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        self.address = f"127.0.0.1:{port}"
        task_status.started()
        await trio.serve_listeners(self._serve, listeners)

    async def _serve(self, client: trio.SocketStream) -> None:
        server = await trio.open_tcp_stream(*self.target)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._client_to_server, client, server, nursery.cancel_scope)
            nursery.start_soon(self._copy, server, client, nursery.cancel_scope)

    async def _copy(
        self, src: trio.SocketStream, dst: trio.SocketStream, scope: trio.CancelScope
    ) -> None:
        try:
            while data := await src.receive_some(65536):
                self.captured += data
                await dst.send_all(data)
        except trio.BrokenResourceError:
            pass
        scope.cancel()

    async def _client_to_server(
        self, src: trio.SocketStream, dst: trio.SocketStream, scope: trio.CancelScope
    ) -> None:
        pending = bytearray()
        try:
            while data := await src.receive_some(65536):
                self.captured += data
                pending += data
                while len(pending) >= 4:
                    (length,) = struct.unpack_from(">I", pending)
                    if len(pending) < 4 + length:
                        break
                    unit = bytes(pending[: 4 + length])
                    del pending[: 4 + length]
                    self.units.append(unit)
                    if self.damage == "flip" and len(self.units) > 2:
                        unit = unit[:-1] + bytes([unit[-1] ^ 0x01])
                        self.damage = None
                    elif self.damage == "replay" and len(self.units) > 3:
                        unit = unit + self.units[2]  # the first sealed record, again
                        self.damage = None
                    await dst.send_all(unit)
        except trio.BrokenResourceError:
            pass
        scope.cancel()


async def linked_through_proxy(stack: AsyncExitStack, nursery: trio.Nursery, encrypt: bool = True):  # type: ignore[no-untyped-def]
    config = fast_config()
    b = await stack.enter_async_context(Node(key=KEY, config=config, encrypt=encrypt))
    a = await stack.enter_async_context(Node(key=KEY, config=config, encrypt=encrypt))
    host, port = b.address.rsplit(":", 1)
    proxy = Proxy((host, int(port)))
    await nursery.start(proxy.run)
    await b.join(TOPIC)
    await a.join(TOPIC, bootstrap=[proxy.address])
    await wait_until(lambda: a.neighbors(TOPIC) and b.neighbors(TOPIC), what="a link")
    return a, b, proxy


@pytest.mark.parametrize("encrypt", [True, False])
def test_a_capture_of_the_traffic_shows_no_payload_when_encryption_is_on(encrypt: bool) -> None:
    secret = b"SECRET-PAYLOAD-0123456789"

    async def main() -> None:
        async with AsyncExitStack() as stack:
            nursery = await stack.enter_async_context(trio.open_nursery())
            a, b, proxy = await linked_through_proxy(stack, nursery, encrypt)
            async with b.subscribe(TOPIC) as sub:
                await a.publish(TOPIC, secret)
                with trio.fail_after(10):
                    message = await sub.receive()
            assert message.value == secret  # type: ignore[union-attr]
            # The control (encryption off) proves the capture would show it.
            assert (secret in proxy.captured) is (not encrypt)
            nursery.cancel_scope.cancel()

    run(main)


@pytest.mark.parametrize("damage", ["flip", "replay"])
def test_a_record_altered_or_replayed_in_flight_closes_the_connection(
    damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            nursery = await stack.enter_async_context(trio.open_nursery())
            a, b, proxy = await linked_through_proxy(stack, nursery)
            async with b.subscribe(TOPIC) as sub:
                await a.publish(TOPIC, b"before")
                with trio.fail_after(10):
                    assert (await sub.receive()).value == b"before"  # type: ignore[union-attr]
                proxy.damage = damage
                await a.publish(TOPIC, b"damaged")
                await wait_until(lambda: "does not open" in caplog.text, what="the rejection")
                # The connection that carried it ended as invalid. (Not "b holds no
                # connection": a node that lost its only neighbour dials its peers again.)
                await wait_until(lambda: b.stats()["invalid_frames"] == 1, what="the close")
            nursery.cancel_scope.cancel()

    with caplog.at_level(logging.WARNING):
        run(main)


def test_nodes_that_disagree_on_encryption_fail_the_handshake_with_the_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        async with Node(key=KEY, encrypt=False) as plain, Node(key=KEY) as sealed:
            await plain.join(TOPIC)
            with pytest.raises(Exception):  # noqa: B017 - the join fails, whatever its type
                await sealed.join(TOPIC, bootstrap=[plain.address], timeout=2)

    with caplog.at_level(logging.WARNING):
        run(main)
    assert "peer has encryption" in caplog.text
