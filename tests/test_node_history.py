"""What a node holds, asked and served across nodes, on real sockets: `held_by` (GETHELD),
PULLs answered from retention after the broadcast cache forgot, fetches from known holders
that are not neighbours, control streams kept out of subscriptions, `topics_of`."""

from __future__ import annotations

from contextlib import AsyncExitStack

from episub import Delivery, Node, NodeConfig
from episub.proto.messages import HeldSpan
from episub.proto.reserved import CONTROL_PREFIX
from episub.proto.store import RetentionConfig
from tests.net_helpers import KEY, TOPIC, fast_config, run, wait_until


async def node(stack: AsyncExitStack, config: NodeConfig | None = None, **kw: object) -> Node:
    return await stack.enter_async_context(Node(key=KEY, config=config or fast_config(), **kw))  # type: ignore[arg-type]


async def pair(stack: AsyncExitStack) -> tuple[Node, Node]:
    """Two nodes in TOPIC, each the other's neighbour."""
    a, b = await node(stack), await node(stack)
    await a.join(TOPIC)
    await b.join(TOPIC, bootstrap=[a.address])
    await wait_until(lambda: a.neighbors(TOPIC) and b.neighbors(TOPIC), what="a link")
    return a, b


def test_held_by_reports_first_last_and_count_per_publisher_of_another_node() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            a, b = await pair(stack)
            for i in range(5):
                await a.publish(TOPIC, b"%d" % i)
            await wait_until(lambda: len(b.retained(TOPIC, a.id, 0, 4)) == 5, what="b holds all")
            spans = await a.held_by(TOPIC, b.id)
            assert spans == [HeldSpan(publisher=a.id, first_seq=0, last_seq=4, count=5)]
            asked = (HeldSpan(publisher=a.id, first_seq=3, last_seq=100),)
            assert await a.held_by(TOPIC, b.id, spans=asked) == [
                HeldSpan(publisher=a.id, first_seq=3, last_seq=4, count=2, since_seq=3)
            ]
            assert await a.held_by(TOPIC, a.id) == spans  # our own, read without a message
            assert await a.held_by("other", b.id) == []  # not joined there: holds nothing

    run(main)


def test_held_by_pages_through_more_publishers_than_one_answer_carries() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            a, b = await pair(stack)
            names = [b"stream-%04d" % i for i in range(600)]
            for name in names:
                await a.publish_record(TOPIC, b"x", stream=(name, 0))
            spans = await b.held_by(TOPIC, a.id)
            assert spans is not None
            assert [s.publisher for s in spans] == names  # in order, over three pages

    run(main)


def test_since_ms_finds_the_first_seq_stamped_at_or_after_a_time() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            a, b = await pair(stack)
            for i in range(4):
                await a.publish_record(TOPIC, b"%d" % i, stream=(b"s", i), timestamp_ms=1000 * i)
            await wait_until(lambda: len(b.retained(TOPIC, b"s", 0, 3)) == 4, what="b holds all")
            (span,) = await a.held_by(TOPIC, b.id, since_ms=1500) or [None]
            assert span is not None and span.since_seq == 2
            (span,) = await a.held_by(TOPIC, b.id, since_ms=99_999) or [None]
            assert span is not None and span.since_seq == 4  # none that new: after the last

    run(main)


def test_a_late_joiner_fetches_history_from_the_store_with_the_same_ids() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            a = await node(stack)
            await a.join(TOPIC)
            ids = [await a.publish(TOPIC, b"old%d" % i) for i in range(5)]
            late = await node(stack)
            await late.join(TOPIC, bootstrap=[a.address])
            got = await late.fetch(TOPIC, a.id, 0, 4, timeout=10)
            assert [m.id for m in got] == ids
            assert late.stats()["bad_ids"] == 0

    run(main)


def test_a_signed_nodes_history_served_from_the_store_keeps_its_signatures() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            a = await node(stack, sign=True)
            await a.join(TOPIC)
            ids = [await a.publish(TOPIC, b"old%d" % i) for i in range(3)]
            late = await node(stack, sign=True)
            await late.join(TOPIC, bootstrap=[a.address])
            got = await late.fetch(TOPIC, a.id, 0, 2, timeout=10)
            assert [m.id for m in got] == ids
            assert late.stats()["bad_signatures"] == 0

    run(main)


def test_a_fetch_asks_a_known_holder_that_is_no_neighbour() -> None:
    """The Spark source's case: only the publisher's own node still holds the start of a
    range, and the reading executor's node is not its neighbour."""

    async def main() -> None:
        async with AsyncExitStack() as stack:
            holder = await node(stack, retention=RetentionConfig(max_age=600))
            await holder.join(TOPIC)
            ids = [await holder.publish(TOPIC, b"%d" % i) for i in range(3)]
            elsewhere = await node(stack)
            await elsewhere.join("other-topic")
            await elsewhere.join(TOPIC)  # an overlay of its own: no neighbour holds anything
            got = await elsewhere.fetch(TOPIC, holder.id, 0, 2, timeout=10, holders=[holder.id])
            assert [m.id for m in got] == ids
            assert not elsewhere.neighbors(TOPIC)

    run(main)


def test_control_streams_are_held_and_relayed_but_never_reach_subscribers() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            a, b = await pair(stack)
            control = CONTROL_PREFIX + b"sink/q"
            async with b.subscribe(TOPIC) as sub:
                await a.publish_record(TOPIC, b'{"batch": 0}', stream=(control, 0))
                data = await a.publish(TOPIC, b"data")
                item = await sub.receive()
                assert isinstance(item, Delivery) and item.id == data
            await wait_until(lambda: b.retained(TOPIC, control, 0, 0) != [], what="held at b")

    run(main)


def test_topics_of_lists_another_nodes_topics() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            a, b = await pair(stack)
            await a.join("events.eu")
            assert sorted(await b.topics_of(a.id) or []) == ["events.eu", TOPIC]
            assert await b.topics_of(b.id) == [TOPIC]
            assert await b.peer_at(a.address) == a.id

    run(main)


def test_a_topic_joined_with_retain_false_is_delivered_but_not_held() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            a, b = await node(stack), await node(stack)
            await a.join(TOPIC)
            await b.join(TOPIC, bootstrap=[a.address], retain=False)
            await wait_until(lambda: a.neighbors(TOPIC) and b.neighbors(TOPIC), what="a link")
            got: list[bytes] = []
            with b.deliver_to(TOPIC, lambda d: got.append(d.value)):  # type: ignore[union-attr]
                for i in range(3):
                    await a.publish(TOPIC, b"%d" % i)
                await wait_until(lambda: len(got) == 3, what="b got all three")
            assert got == [b"0", b"1", b"2"]
            assert len(a.retained(TOPIC, a.id, 0, 2)) == 3  # the publisher retains its own
            assert b.retained(TOPIC, a.id, 0, 2) == []
            assert await a.held_by(TOPIC, b.id) == []

    run(main)
