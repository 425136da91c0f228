"""Catch-up on a link's return (episub/node/catchup.py): a link of a topic that never
carried a message at this end sends no GETHELD, unless the other end, which holds
something, asks first; then this end compares back and pulls what it lacks."""

from __future__ import annotations

import time
from collections.abc import Iterable
from contextlib import AsyncExitStack

import pytest
import trio
import trio.testing

from episub.node.catchup import MAX_UNCOMPARED_LINKS, CatchUp
from episub.node.fetching import FetchReport
from episub.proto.envelope import Envelope
from episub.proto.messages import HeldSpan
from episub.proto.reserved import SINK_INDEX_PREFIX
from episub.proto.store import MessageStore, RetentionConfig
from episub.records import Delivery, NeighborLink
from tests.net_helpers import TOPIC, run, wait_until
from tests.test_node_history import node, pair

TOPIC_NAME = "t"
PEER = b"p" * 32
PUBLISHER = b"q" * 32
PAUSE = 1.0


def hold_one(store: MessageStore) -> None:
    """A message of TOPIC_NAME in `store` (publisher o..o, seq 0)."""
    envelope = Envelope(publisher=b"o" * 32, seq=0, timestamp_ms=1, payload=b"x")
    store.add(store.places(TOPIC_NAME), b"i" * 32, envelope, 1, 0.0)


class Neighbourhood:
    """What a catch-up asks of the node, answered from a script: `peer` is a neighbour of
    TOPIC_NAME holding seqs 0..2 of PUBLISHER; every question is written down."""

    def __init__(self) -> None:
        self.id = b"m" * 32
        self.store = MessageStore(RetentionConfig())
        self.asked: list[tuple[str, bytes]] = []
        self.fetched: list[tuple[bytes, int, int]] = []

    def store_now(self) -> float:
        return trio.current_time()

    def neighbors(self, topic: str) -> list[NeighborLink]:
        return [
            NeighborLink(peer_id=PEER, address="127.0.0.1:1", kind="rand", role="eager", rtt_ms=1)
        ]

    async def held_by(self, topic: str, peer_id: bytes, *, since_ms: int) -> list[HeldSpan]:
        self.asked.append((topic, peer_id))
        return [HeldSpan(publisher=PUBLISHER, first_seq=0, last_seq=2, count=3)]

    async def fetch_range(
        self, topic: str, publisher: bytes, first: int, last: int, *, holders: Iterable[bytes]
    ) -> FetchReport:
        self.fetched.append((publisher, first, last))
        return FetchReport(last - first + 1, "unheld")


def catch_up_after(act: str, held: bool) -> tuple[Neighbourhood, dict[str, int]]:
    """A link of TOPIC_NAME to PEER comes up (and PEER asks what we hold, if `act` says
    so) at a node holding a message of the topic or not; run until every catch-up is
    done (simulated time)."""
    node = Neighbourhood()
    if held:
        hold_one(node.store)
    catch_up = CatchUp(node, PAUSE)
    catch_up.joined(TOPIC_NAME)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            catch_up.link_up(TOPIC_NAME, PEER, nursery)
            if act == "asked":
                catch_up.asked(TOPIC_NAME, PEER, nursery)
            elif act == "asked by a stranger":
                catch_up.asked(TOPIC_NAME, b"s" * 32, nursery)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return node, catch_up.stats()


def test_a_link_of_a_topic_never_carried_here_sends_no_getheld() -> None:
    node, stats = catch_up_after("none", held=False)
    assert node.asked == []
    assert stats["catch_ups_skipped"] == 1
    assert stats["catch_ups"] == 0


def test_a_link_of_a_topic_with_messages_held_compares_holdings() -> None:
    node, stats = catch_up_after("none", held=True)
    assert node.asked == [(TOPIC_NAME, PEER)]
    assert node.fetched == [(PUBLISHER, 0, 2)]
    assert stats["catch_ups_skipped"] == 0
    assert stats["catch_ups"] == 1


def test_a_neighbour_that_asks_what_we_hold_gets_compared_back() -> None:
    """The end that lost every message of a burst holds nothing of the topic: its
    neighbour's GETHELD (it holds something) starts the comparison it skipped."""
    node, stats = catch_up_after("asked", held=False)
    assert node.asked == [(TOPIC_NAME, PEER)]
    assert node.fetched == [(PUBLISHER, 0, 2)]
    assert stats["catch_ups"] == 1


def test_a_query_from_a_node_that_is_no_neighbour_starts_no_catch_up() -> None:
    node, stats = catch_up_after("asked by a stranger", held=False)
    assert node.asked == []
    assert stats["catch_ups"] == 0


def test_real_nodes_linked_on_an_idle_topic_skip_the_exchange() -> None:
    """On real sockets: the link of a topic without messages costs no GETHELD at either
    end (a node joining a topic with history still catches up: test_node_history.py)."""

    async def main() -> None:
        async with AsyncExitStack() as stack:
            a, b = await pair(stack)
            assert a.stats()["catch_ups_skipped"] >= 1
            assert b.stats()["catch_ups_skipped"] >= 1
            assert a.stats()["catch_ups"] == b.stats()["catch_ups"] == 0

    run(main)


def test_a_node_joining_a_topic_with_history_pulls_what_was_published_as_it_joined() -> None:
    """On real sockets: c joins right after a published (within the catch-up's clock
    slack, so the messages are c's to hold) and holds nothing of the topic when its link
    comes up, so it skips its own GETHELD; its neighbour, which holds them, asks, and c
    compares back and pulls them."""

    async def main() -> None:
        async with AsyncExitStack() as stack:
            a, b = await pair(stack)
            for i in range(5):
                await a.publish(TOPIC, b"%d" % i)
            await wait_until(lambda: len(b.retained(TOPIC, a.id, 0, 4)) == 5, what="b holds all")
            c = await node(stack)
            await c.join(TOPIC, bootstrap=[b.address])
            await wait_until(lambda: len(c.retained(TOPIC, a.id, 0, 4)) == 5, what="c holds all")
            assert c.stats()["catch_ups_skipped"] >= 1
            assert c.stats()["catch_ups"] >= 1  # the comparison its neighbour's ask started

    run(main)


class History(Neighbourhood):
    """A neighbour holding seqs 0..9 of each of `publishers`, all stamped before we
    joined: it reports since_seq 0 when asked since a time before the stamps, else none
    (10)."""

    def __init__(self, stamp_ms: int) -> None:
        super().__init__()
        self.stamp_ms = stamp_ms
        self.since: list[int] = []
        self.publishers = [PUBLISHER]

    async def held_by(self, topic: str, peer_id: bytes, *, since_ms: int) -> list[HeldSpan]:
        self.asked.append((topic, peer_id))
        self.since.append(since_ms)
        since_seq = 0 if since_ms <= self.stamp_ms else 10
        return [
            HeldSpan(publisher=p, first_seq=0, last_seq=9, count=10, since_seq=since_seq)
            for p in self.publishers
        ]


def late_join(config: RetentionConfig, history: bool = True) -> History:
    """We join TOPIC_NAME holding nothing (pulling history or not); PEER, which holds 10
    messages stamped a minute before our join, asks what we hold; run until every
    catch-up is done."""
    node = History(stamp_ms=int(time.time() * 1000) - 60_000)
    node.store = MessageStore(config)
    catch_up = CatchUp(node, PAUSE)
    catch_up.joined(TOPIC_NAME, history)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            catch_up.link_up(TOPIC_NAME, PEER, nursery)
            catch_up.asked(TOPIC_NAME, PEER, nursery)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return node


def test_a_late_joiner_asks_for_the_history_its_retention_would_keep() -> None:
    """Stamped a minute before the join (past the clock slack), inside retention's age:
    fetched (before, the catch-up asked only since the join and fetched nothing)."""
    node = late_join(RetentionConfig())
    assert node.fetched == [(PUBLISHER, 0, 9)]


def test_a_late_joiner_without_history_asks_only_since_its_join() -> None:
    """Joined with history=False (a node whose readers fetch their own ranges): the
    comparison still runs, from the join on, and pulls none of the minute-old history."""
    node = late_join(RetentionConfig(), history=False)
    assert node.asked == [(TOPIC_NAME, PEER)]
    assert node.since[0] >= node.stamp_ms and node.fetched == []


def test_a_late_joiner_asks_for_no_more_than_its_retention_holds() -> None:
    node = late_join(RetentionConfig(max_messages=4))
    assert node.fetched == [(PUBLISHER, 6, 9)]  # the newest 4


def test_a_late_joiner_asks_for_nothing_older_than_its_retention_age() -> None:
    node = late_join(RetentionConfig(max_age=30.0))  # the history is a minute old
    assert node.fetched == []


def test_a_late_joiner_whose_retention_is_full_stops_asking_for_history() -> None:
    """Once retention holds what it can, the history counts as caught up: the next
    catch-up asks only since the join (not the whole history on every GETHELD)."""
    node = History(stamp_ms=int(time.time() * 1000) - 60_000)
    node.publishers = [PUBLISHER, b"r" * 32]  # the second finds no room left
    node.store = MessageStore(RetentionConfig(max_messages=4))
    catch_up = CatchUp(node, PAUSE)
    catch_up.joined(TOPIC_NAME)

    async def main() -> None:
        for _ in range(2):  # the link comes up, and PEER asks; twice
            async with trio.open_nursery() as nursery:
                catch_up.link_up(TOPIC_NAME, PEER, nursery)
                catch_up.asked(TOPIC_NAME, PEER, nursery)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert len(node.since) == 2
    assert node.since[0] <= node.stamp_ms < node.since[1]
    assert node.fetched == [(PUBLISHER, 6, 9)]


def test_a_subscriber_gets_what_was_published_after_it_joined_while_its_node_was_unlinked() -> None:
    """On real sockets: b joins and subscribes; a publishes 0..4 before it is linked to b
    (as when the link is lost to an overflow while a publishes), then links and publishes
    5..9. b first sees a's stream at a seq stamped after its join, so the stream reaches
    back (ordering.py) for 0..4, stamped after the join too, and the subscriber gets all
    ten in order (it got 5..9 alone, and no Lost: the catch-up pulled 0..4 as history)."""

    async def main() -> None:
        async with AsyncExitStack() as stack:
            b = await node(stack)
            await b.join(TOPIC)
            sub = await stack.enter_async_context(b.subscribe(TOPIC))
            # A stamp in the millisecond of the join counts as before it (ordering.py), and
            # a fast machine gets this far within that millisecond: let the clock pass it.
            await trio.sleep(0.002)
            a = await node(stack)
            await a.join(TOPIC)
            for i in range(5):
                await a.publish(TOPIC, b"%d" % i)  # a has no neighbour: they reach no one
            await a.leave(TOPIC)
            await a.join(TOPIC, bootstrap=[b.address])
            for i in range(5, 10):
                await a.publish(TOPIC, b"%d" % i)
            seqs: list[int] = []
            while not seqs or seqs[-1] < 9:
                item = await sub.receive()
                if isinstance(item, Delivery):
                    seqs.append(item.seq)
            await wait_until(lambda: len(b.retained(TOPIC, a.id, 0, 4)) == 5, what="b pulls 0..4")
            assert seqs == list(range(10))
            # b first saw 5, or 4 (a's stream head, named on the link's return, GRAFTed).
            stats = b.stats()
            assert stats["reach_backs"] == 1 and stats["reach_backs_cut"] == 0
            assert stats["reached_back"] >= 4

    run(main)


@pytest.mark.parametrize("history", [True, False], ids=["history", "no-history"])
@pytest.mark.parametrize("b_holds", [True, False], ids=["b-holds-its-own", "b-holds-nothing"])
def test_a_neighbour_linked_after_a_control_message_was_published_pulls_it(
    b_holds: bool, history: bool
) -> None:
    """On real sockets: a holds a control stream's message stamped 0 (a Spark sink's batch
    index: a commit run again writes the same message), published while a had no
    neighbour, so no broadcast carried it and no stream head will name it to a link made
    later. b joins through a (holding messages of its own in the topic, or none: then a's
    ask starts b's comparison): b's catch-up must pull the index whatever its stamp (it
    asked only for places stamped since its join, and a sink commit waiting for another
    node to hold its index timed out). Without history (a Spark reader's node), b's
    link-up held nothing and skipped the comparison, and b held its own message by the
    time a asked: b must compare all the same (it never did, and the commit timed out)."""

    async def main() -> None:
        async with AsyncExitStack() as stack:
            a, b = await node(stack), await node(stack)
            await a.join(TOPIC)
            control = SINK_INDEX_PREFIX + b"query"
            await a.publish_record(TOPIC, b"{}", stream=(control, 0), timestamp_ms=0)
            await b.join(TOPIC, bootstrap=[a.address], history=history)
            if b_holds:
                await b.publish(TOPIC, b"b's own")
            await wait_until(lambda: len(b.retained(TOPIC, control, 0, 0)) == 1, what="b holds it")
            assert [d.value for d in b.retained(TOPIC, control, 0, 0)] == [b"{}"]

    run(main)


def test_links_whose_comparison_was_skipped_are_remembered_within_a_bound() -> None:
    """A skipped link is remembered until its neighbour asks, then compared even though
    this node holds something by then; past MAX_UNCOMPARED_LINKS the oldest is forgotten."""
    node = Neighbourhood()
    store = node.store
    catch_up = CatchUp(node, PAUSE)  # type: ignore[arg-type]
    catch_up.joined(TOPIC_NAME, history=False)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for i in range(MAX_UNCOMPARED_LINKS):
                catch_up.link_up(TOPIC_NAME, i.to_bytes(4, "big"), nursery)
            catch_up.link_up(TOPIC_NAME, PEER, nursery)
            hold_one(store)
            assert len(catch_up._uncompared) == MAX_UNCOMPARED_LINKS
            assert (TOPIC_NAME, (0).to_bytes(4, "big")) not in catch_up._uncompared
            catch_up.asked(TOPIC_NAME, PEER, nursery)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert node.asked == [(TOPIC_NAME, PEER)]
    assert node.fetched == [(PUBLISHER, 0, 2)]


class OneSilentNeighbour(Neighbourhood):
    """PEER answers as in Neighbourhood; SILENT, a neighbour too (its link cut off but
    not closed yet), never answers what it holds."""

    def neighbors(self, topic: str) -> list[NeighborLink]:
        return [
            *super().neighbors(topic),
            NeighborLink(
                peer_id=SILENT, address="127.0.0.1:2", kind="rand", role="eager", rtt_ms=1
            ),
        ]

    async def held_by(self, topic: str, peer_id: bytes, *, since_ms: int) -> list[HeldSpan] | None:
        if peer_id == SILENT:
            self.asked.append((topic, peer_id))
            await trio.sleep(2.0)  # the node's own wait for an answer
            return None
        return await super().held_by(topic, peer_id, since_ms=since_ms)

    async def fetch_range(
        self, topic: str, publisher: bytes, first: int, last: int, *, holders: Iterable[bytes]
    ) -> FetchReport:
        self.fetched_at = trio.current_time()
        return await super().fetch_range(topic, publisher, first, last, holders=holders)


SILENT = b"s" * 32


def test_a_neighbour_that_does_not_answer_holds_up_no_other_links_catch_up() -> None:
    """The topic's catch-ups pull one link at a time; a link whose neighbour gives no
    answer (cut off, TCP not closed yet) came up first: the other link still compares and
    pulls after the pause, not once the silent one's CATCH_UP_TIMEOUT has run out."""
    node = OneSilentNeighbour()
    store = node.store
    hold_one(store)
    catch_up = CatchUp(node, PAUSE)  # type: ignore[arg-type]
    catch_up.joined(TOPIC_NAME)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            catch_up.link_up(TOPIC_NAME, SILENT, nursery)
            await trio.sleep(0.5)
            catch_up.link_up(TOPIC_NAME, PEER, nursery)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert node.fetched == [(PUBLISHER, 0, 2)]
    assert node.fetched_at == pytest.approx(0.5 + PAUSE)
    assert (TOPIC_NAME, SILENT) in node.asked
