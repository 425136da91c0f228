"""Node.publish_many: many records in one core call, receipts in order, all or none; and
a Record is checked once, where it enters, by the same rules at every entry."""

from __future__ import annotations

from contextlib import AsyncExitStack
from random import Random

import pytest

from episub import BroadcastConfig, MessageTooLarge, Node, NodeConfig, Record
from episub.node import PUBLISH_CHUNK
from episub.proto.envelope import Envelope
from episub.proto.events import JoinTopic, Published, PublishMany, Send
from episub.proto.node import NodeState
from tests.net_helpers import TOPIC, fast_config, run
from tests.test_node_api import pair, receive_messages


def test_a_batch_is_one_core_call_whose_outputs_are_each_records_publish_in_order() -> None:
    node = NodeState(b"a", NodeConfig(), Random(1))
    node.handle(JoinTopic(TOPIC), 0.0)
    records = (Record(b"x"), Record(b"y", key=b"k", headers={"h": b"1"}), Record(b"z"))
    out = node.handle(PublishMany(TOPIC, records), 2.0)
    published = [o for o in out if type(o) is Published]
    assert [(p.envelope.seq, p.envelope.payload) for p in published] == [
        (0, b"x"),
        (1, b"y"),
        (2, b"z"),
    ]
    # The trusted stamp makes the very bytes the checking constructor makes.
    assert published[1].envelope == Envelope(
        publisher=b"a", seq=1, timestamp_ms=2000, payload=b"y", key=b"k", headers=(("h", b"1"),)
    )
    assert not [o for o in out if type(o) is Send]  # no neighbour yet


def test_a_batch_with_one_record_too_large_publishes_nothing() -> None:
    config = NodeConfig(broadcast=BroadcastConfig(max_message_size=4))
    node = NodeState(b"a", config, Random(1))
    node.handle(JoinTopic(TOPIC), 0.0)
    with pytest.raises(MessageTooLarge, match="record 1 of 2: message of 5 bytes"):
        node.handle(PublishMany(TOPIC, (Record(b"1234"), Record(b"12", key=b"345"))), 1.0)
    out = node.handle(PublishMany(TOPIC, (Record(b"1234"),)), 1.0)
    assert [o.envelope.seq for o in out if type(o) is Published] == [0]  # nothing went before


def test_a_record_is_checked_where_it_is_made_with_the_bad_value_named() -> None:
    assert Record(bytearray(b"v"), memoryview(b"k")).value == b"v"
    with pytest.raises(TypeError, match=r"value must be bytes, not str \(encode it first\)"):
        Record("text")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at most 64 headers, not 65"):
        Record(b"v", headers=[("h", b"")] * 65)
    with pytest.raises(TypeError, match="a header is a"):
        Record(b"v", headers=[(1, b"")])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="not encodable"):
        Record(b"v", headers=[("\udc80", b"")])
    # One bound for a stream's seq everywhere, the envelope's (it was 2**64 in some places)
    with pytest.raises(ValueError, match=r"seq must be an int in 0..2\*\*63-1"):
        Record(b"v", stream=(b"s", 2**63))
    with pytest.raises(ValueError, match=r"stream's publisher must be 1\.\.64 bytes, not 65"):
        Record(b"v", stream=(b"s" * 65, 0))
    with pytest.raises(ValueError, match="timestamp_ms is for a named stream"):
        Record(b"v", timestamp_ms=5)
    assert Record(b"v", headers={"a": b"12"}, key=b"k").size == 1 + 1 + 1 + 2


def test_publish_many_reaches_a_neighbour_in_order_with_receipts_in_order() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            a, b = await pair(stack)
            count = PUBLISH_CHUNK + 10  # more than one core call's worth
            async with b.subscribe(TOPIC, buffer=count + 10) as sub:
                receipts = await a.publish_many(
                    TOPIC, [b"%d" % i if i % 2 else Record(b"%d" % i) for i in range(count)]
                )
                got = await receive_messages(sub, count)
            assert [r.seq for r in receipts] == list(range(count))
            assert [r.id for r in receipts] == [m.id for m in got]
            assert [m.value for m in got] == [b"%d" % i for i in range(count)]
            assert not any(r.duplicate for r in receipts)

    run(main)


def test_named_places_in_one_batch_get_their_receipts_taken_held_or_delivered() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            a, _ = await pair(stack)
            place = b"sink/q/0/0"
            first = await a.publish_many(
                TOPIC,
                [
                    Record(b"r0", stream=(place, 0)),  # the stream starts here: delivered
                    Record(b"r2", stream=(place, 2)),  # held: place 1 has not come
                    Record(b"r1", stream=(place, 1)),  # delivers 1, then the held 2
                    Record(b"again", stream=(place, 1)),  # taken, within the same batch
                    b"own",
                ],
            )
            assert [(r.publisher, r.seq, r.duplicate) for r in first] == [
                (place, 0, False),
                (place, 2, False),
                (place, 1, False),
                (place, 1, True),
                (a.id, 0, False),
            ]
            assert first[3].id == first[2].id is not None
            assert all(r.id is not None for r in first)
            held = await a.publish_many(TOPIC, [Record(b"r5", stream=(place, 5))])
            assert held[0].id is None and not held[0].duplicate
            with pytest.raises(ValueError, match="own stream"):
                await a.publish_many(TOPIC, [b"fine", Record(b"x", stream=(a.id, 9))])
            assert [m.seq for m in a.retained(TOPIC, a.id, 0, 10)] == [0]  # all or none

    run(main)


def test_publish_many_of_nothing_publishes_nothing() -> None:
    async def main() -> None:
        async with Node(config=fast_config(), key=bytes(32)) as node:
            await node.join(TOPIC)
            assert await node.publish_many(TOPIC, []) == []
            assert (await node.publish_record(TOPIC, b"x")).seq == 0

    run(main)
