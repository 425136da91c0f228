"""Fetching a range (episub/node/fetching.py) across real nodes on real sockets: spread
over every node that holds it, never asked of a node that holds none of it, ended at once
when nobody holds the rest, and kept as history (not delivered, not forwarded)."""

from __future__ import annotations

from contextlib import AsyncExitStack

from episub import Node
from episub.node.fetching import FETCH_CHUNK
from episub.proto.store import RetentionConfig
from tests.net_helpers import KEY, TOPIC, fast_config, run, wait_until

ROWS = 10 * FETCH_CHUNK  # ten chunks: enough for both holders to be asked several


async def node(stack: AsyncExitStack) -> Node:
    retention = RetentionConfig(max_age=600)
    return await stack.enter_async_context(Node(key=KEY, config=fast_config(), retention=retention))


async def two_holders(stack: AsyncExitStack) -> tuple[Node, Node]:
    """Two linked nodes in TOPIC that both hold ROWS one-row messages of the first."""
    first, second = await node(stack), await node(stack)
    await first.join(TOPIC)
    await second.join(TOPIC, bootstrap=[first.address])
    await wait_until(lambda: first.neighbors(TOPIC) and second.neighbors(TOPIC), what="a link")
    await first.publish_many(TOPIC, [b"%d" % i for i in range(ROWS)])
    await wait_until(
        lambda: len(second.held_seqs(TOPIC, first.id, 0, ROWS - 1)) == ROWS, what="both hold all"
    )
    return first, second


async def reader_beside_an_empty_neighbour(stack: AsyncExitStack) -> tuple[Node, Node]:
    """A reader in an overlay of its own whose one neighbour holds nothing."""
    empty, reader = await node(stack), await node(stack)
    await empty.join(TOPIC)
    await reader.join(TOPIC, bootstrap=[empty.address])
    await wait_until(lambda: reader.neighbors(TOPIC), what="the reader's neighbour")
    return reader, empty


def test_a_long_range_is_fetched_from_every_holder_and_not_asked_of_a_node_holding_none() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            first, second = await two_holders(stack)
            reader, empty = await reader_beside_an_empty_neighbour(stack)
            report = await reader.fetch_range(
                TOPIC, first.id, 0, ROWS - 1, timeout=30, holders=[first.id, second.id]
            )
            assert (report.ended, report.lacking) == ("complete", 0)
            assert reader.held_seqs(TOPIC, first.id, 0, ROWS - 1) == list(range(ROWS))
            asked = {a.node: a for a in report.asked}
            assert set(asked) == {first.id, second.id, empty.id}
            assert asked[first.id].chunks_asked > 0 and asked[second.id].chunks_asked > 0
            assert asked[empty.id].held == [] and asked[empty.id].chunks_asked == 0
            assert reader.stats()["duplicates_received"] == 0

    run(main)


def test_a_fetch_of_seqs_no_node_holds_ends_when_every_node_said_so() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            first, _ = await two_holders(stack)
            reader, _ = await reader_beside_an_empty_neighbour(stack)
            # The holders hold 0..ROWS-1: ROWS.. are nobody's. A long timeout: the fetch
            # must end on the answers, not on the time.
            report = await reader.fetch_range(
                TOPIC, first.id, ROWS - 10, ROWS + 99, timeout=600, holders=[first.id]
            )
            assert (report.ended, report.lacking) == ("unheld", 100)
            assert reader.held_seqs(TOPIC, first.id, ROWS - 10, ROWS + 99) == list(
                range(ROWS - 10, ROWS)
            )

    run(main)


def test_fetched_messages_of_a_publisher_not_streamed_here_are_history() -> None:
    """Kept for readers, not delivered to subscribers, not forwarded: before, the first
    fetched message opened a live stream, went on to the neighbours, and the rest of the
    range was pulled a second time as the stream's gap."""

    async def main() -> None:
        async with AsyncExitStack() as stack:
            first, _ = await two_holders(stack)
            reader, empty = await reader_beside_an_empty_neighbour(stack)
            report = await reader.fetch_range(TOPIC, first.id, 0, ROWS - 1, holders=[first.id])
            assert report.lacking == 0
            stats = reader.stats()
            assert stats["recovered"] == ROWS
            assert stats["delivered"] == 0
            assert stats["duplicates_received"] == 0
            # Not forwarded: the neighbour delivers none of it (it may pull it as history
            # by its own catch-up, being a late joiner for it: catchup.py).
            assert empty.stats()["delivered"] == 0

    run(main)
