"""Buggy or hostile peers: each bad input is dropped with a logged reason, and the node
keeps serving its honest peers with nothing lost.

Every test runs two honest nodes (a, b) in one topic and aims a hand-driven RawPeer at a;
then a and b publish to each other and every message must arrive, in order.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
import trio

from episub import BroadcastConfig, Delivery, Node, NodeConfig
from episub.net.handshake import FAILURE_REASONS, HandshakeError
from episub.proto.envelope import message_id
from episub.proto.messages import Envelope, Gossip, Ping
from tests.net_helpers import KEY, OTHER_KEY, TOPIC, WAIT, RawPeer, fast_config, run, wait_until

MAX_MESSAGE = 1000


def config(max_message: int = MAX_MESSAGE) -> NodeConfig:
    base = fast_config()
    return NodeConfig(
        membership=base.membership,
        broadcast=BroadcastConfig(max_message_size=max_message, stream_settle=0.2, gap_timeout=0.5),
    )


@asynccontextmanager
async def honest_pair(
    max_message: int = MAX_MESSAGE, **node_options: object
) -> AsyncIterator[tuple[Node, Node]]:
    async with (
        Node(key=KEY, config=config(max_message), **node_options) as a,  # type: ignore[arg-type]
        Node(key=KEY, config=config(max_message)) as b,
    ):
        await a.join(TOPIC)
        await b.join(TOPIC, bootstrap=[a.address])
        await wait_until(lambda: a.neighbors(TOPIC) and b.neighbors(TOPIC), what="a link")
        yield a, b


async def assert_still_serving(a: Node, b: Node, count: int = 20) -> None:
    """a and b exchange `count` messages each way; every one arrives, in order."""
    async with a.subscribe(TOPIC) as at_a, b.subscribe(TOPIC) as at_b:
        for i in range(count):
            await a.publish(TOPIC, b"a%d" % i)
            await b.publish(TOPIC, b"b%d" % i)
        with trio.fail_after(WAIT):
            for sub, publisher in ((at_b, a.id), (at_a, b.id)):
                got: list[int] = []
                while len(got) < count:
                    item = await sub.receive()
                    assert isinstance(item, Delivery), item
                    if item.publisher == publisher:
                        got.append(item.seq)
                assert got == list(range(count))
    assert b.id in [n.peer_id for n in a.neighbors(TOPIC)]


def unknown_kind_frame() -> bytes:
    """An Item for topic "t" whose body is oneof field 99, which no episub version has."""
    item = b"\x0a\x01t" + b"\x9a\x06\x00"  # topic = "t"; field 99, length-delimited, empty
    body = b"\x0a" + bytes([len(item)]) + item  # Frame.items[0]
    return struct.pack(">I", len(body)) + body


async def send_garbage(raw: RawPeer) -> None:
    await raw.send(b"\x00\x00\x00\x05\xff\xff\xff\xff\xff")


async def send_truncated(raw: RawPeer) -> None:
    await raw.send(struct.pack(">I", 100) + b"\x0a" * 10)
    await raw.stream.send_eof()


async def send_huge_length(raw: RawPeer) -> None:
    await raw.send(struct.pack(">I", 0xFFFFFFF0))


async def send_unknown_kind(raw: RawPeer) -> None:
    await raw.send(unknown_kind_frame())


@pytest.mark.parametrize(
    ("attack", "reason"),
    [
        (send_garbage, "invalid frame: malformed protobuf frame of 5 bytes"),
        (send_truncated, "connection closed inside a frame (14 bytes"),
        (send_huge_length, "frame of 4294967280 bytes announced"),
        (send_unknown_kind, "item has no message body (empty or of an unknown kind)"),
    ],
    ids=["garbage", "truncated", "huge-length", "unknown-kind"],
)
def test_a_bad_frame_closes_only_that_connection(
    attack: Callable[[RawPeer], Awaitable[None]],
    reason: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="episub.net")

    async def main() -> None:
        async with honest_pair() as (a, b):
            raw = await RawPeer.connect(a.address)
            await attack(raw)
            with trio.fail_after(WAIT):
                await raw.wait_closed()
            await raw.aclose()
            await wait_until(lambda: a.stats()["invalid_frames"] == 1, what="the count")
            await assert_still_serving(a, b)

    run(main)
    assert reason in caplog.text


async def gossip_with_a_wrong_id(raw: RawPeer) -> None:
    envelope = Envelope(publisher=raw.id, seq=0, timestamp_ms=0, payload=b"forged")
    await raw.send_items([(TOPIC, Gossip(id=bytes(32), envelope=envelope, hops=1))])


async def gossip_over_max_message_size(raw: RawPeer) -> None:
    envelope = Envelope(publisher=raw.id, seq=0, timestamp_ms=0, payload=b"x" * 2000)
    mid = message_id(TOPIC, envelope)
    await raw.send_items([(TOPIC, Gossip(id=mid, envelope=envelope, hops=1))])


@pytest.mark.parametrize(
    ("attack", "reason"),
    [
        (gossip_with_a_wrong_id, "GOSSIP id does not match its envelope"),
        (gossip_over_max_message_size, "GOSSIP of 2000 bytes exceeds max_message_size"),
    ],
    ids=["wrong-id", "oversized"],
)
def test_a_bad_message_is_dropped_and_reported(
    attack: Callable[[RawPeer], Awaitable[None]],
    reason: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="episub.net")

    async def main() -> None:
        async with honest_pair() as (a, b):
            raw = await RawPeer.connect(a.address)
            await attack(raw)
            await wait_until(lambda: a.stats()["peer_misbehaved"] == 1, what="the report")
            assert a.stats()["delivered"] == 0
            await assert_still_serving(a, b)
            await raw.aclose()

    run(main)
    assert reason in caplog.text


@pytest.mark.parametrize(
    ("key", "opening", "message", "reason"),
    [
        (OTHER_KEY, b"", "failed to prove the deployment key", "wrong_key"),
        (
            None,
            b"GET / HTTP/1.1\r\n\r\n",
            "handshake frame of 1195725856 bytes announced",
            "malformed",
        ),
        (None, b"", "no complete handshake within 0.5 s", "timeout"),
    ],
    ids=["wrong-key", "not-episub", "silent"],
)
def test_a_failed_handshake_is_logged_counted_by_reason_and_the_connection_closed(
    key: bytes | None,
    opening: bytes,
    message: str,
    reason: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="episub.net")

    async def main() -> None:
        async with honest_pair(handshake_timeout=0.5) as (a, b):
            try:
                raw = await RawPeer.connect(a.address, key=key)
            except HandshakeError:  # the wrong key fails here, on our side, as it should
                await wait_until(lambda: a.stats()["handshake_failures"] == 1)
            else:
                await raw.send(opening)
                with trio.fail_after(WAIT):
                    await raw.wait_closed()
                await raw.aclose()
            assert a.stats()["handshake_failures"] == 1
            stats = a.stats()
            failed = {why: stats[f"handshake_failed_{why}"] for why in FAILURE_REASONS}
            assert failed == {why: int(why == reason) for why in FAILURE_REASONS}
            await assert_still_serving(a, b)

    run(main)
    assert message in caplog.text
    assert f"(it dialled) failed ({reason}): " in caplog.text


def test_a_peer_too_slow_to_read_overflows_its_queue_and_only_it_is_cut_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="episub.net")

    async def main() -> None:
        async with honest_pair() as (a, b):
            # A 4 KiB receive window and no reading: ~20 KB fit in the kernels' buffers,
            # so the PONGs to 20,000 PINGs must overflow a SEND_QUEUE_CAP (4096) queue.
            raw = await RawPeer.connect(a.address, receive_buffer=4096)
            pings = [("elsewhere", Ping(nonce=(1 << 63) + i)) for i in range(1000)]
            try:
                for _ in range(20):
                    await raw.send_items(pings)
            except trio.BrokenResourceError:
                pass  # a cut us off while we were still sending: that is the point
            await wait_until(lambda: a.stats()["queue_overflows"] == 1, what="the overflow")
            with trio.fail_after(WAIT):
                await raw.wait_closed()
            await raw.aclose()
            assert a.stats()["dropped_queue_overflow"] > 0
            await assert_still_serving(a, b)

    run(main)
    assert "overflowed" in caplog.text and "too slow" in caplog.text
