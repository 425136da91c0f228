"""Catch-up with a neighbour whose link came up: compare what the two hold of the topic
(GETHELD, answered from the core's message store) and fetch the difference.

A link is lost with its send queue (a peer too slow for a burst overflows it and the link
closes with the queue's messages, IHAVEs included); once the burst has ended no later
message shows the gap, and no IHAVE comes again. Comparing holdings when the link returns
repairs that, whichever end lost the messages. After the tree's own repair (gap_timeout),
so that live traffic in flight is not pulled twice; at most CATCH_UP_AT_ONCE pull at once,
one link of a topic at a time, each bounded by CATCH_UP_TIMEOUT; a neighbour that does not
answer what it holds (its link cut off but not closed yet) holds up no other link.

A link of a topic that never carried a message at either end has nothing to compare: the
end that holds nothing of the topic skips its GETHELD when the link comes up, and compares
only if the other end asks it (a GETHELD from that neighbour: the asker holds something,
so there may be something to pull). An idle overlay's link churn then costs no round trip
and no wakeups after the pause, and a node that lost every message of a burst with the
link still pulls them once the neighbour that holds them asks. The skipped link is
remembered until then: by the time the neighbour asks, this end may hold something of the
topic (a live message, rows a reader fetched right after its join), and the comparison
is due all the same (a Spark reader's node otherwise never pulled a sink index published
before its link, and the sink's commit waiting for a copy timed out).

A node that joins a topic late has none of the history its neighbours retain: until one
catch-up of the topic has run to its end, catch-ups ask for everything stamped within
this node's own retention age (`max_age`), not only since the join, and fetch at most
this node's `max_messages` seqs of it, the newest of each stream, stopping once retention
is full by bytes: never more than this node can hold. The fetch asks only for what is
still missing, so a catch-up cut by a lost link resumes where it stopped when the link
returns. What is fetched this way is history: kept in retention for reads by range (the
Spark source), not delivered to subscribers, who get what is published after their
join (episub/proto/ordering.py: an answer to our own fetch of a stream we have none of
is history; what was published after the join while this node had no link reaches them
by the stream's own reach back there, not by a catch-up).

A control stream's places (a Spark sink's batch index) are stamped 0, so that a commit run
again writes the very same message: a catch-up asks for every one its neighbour holds,
whatever the time it asks from, or a node linked after an index was published would never
hold it (no broadcast or stream head names an old message to a new link)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable
from typing import Protocol

import trio

from episub.node.checks import FETCH_MAX_SPAN
from episub.proto.errors import LocalProtocolError
from episub.proto.messages import HeldSpan
from episub.proto.reserved import CONTROL_PREFIX
from episub.proto.store import MessageStore
from episub.records import NeighborLink

__all__ = ["CATCH_UP_AT_ONCE", "CATCH_UP_CLOCK_SLACK_MS", "CATCH_UP_TIMEOUT", "CatchUp"]

# How many catch-ups pull at once, and how long asking or pulling may take in all.
CATCH_UP_AT_ONCE = 4  # guess: a few neighbours' holdings compared at a time
CATCH_UP_TIMEOUT = 60.0  # guess: several FETCH_TIMEOUTs; a catch-up is background work
# Stamps are the publishers' clocks, the join time ours: asked from a little before it.
CATCH_UP_CLOCK_SLACK_MS = 2000  # guess: NTP keeps a cluster's hosts within milliseconds
# Links whose link-up skipped the comparison, remembered until their neighbour asks; the
# oldest is forgotten past this (it then compares only when a link-up finds something held).
MAX_UNCOMPARED_LINKS = 1024  # guess: topics times the active view (7), with room


class _Asks(Protocol):
    """What a catch-up asks of the node (episub.node.Node)."""

    @property
    def id(self) -> bytes: ...

    @property
    def store(self) -> MessageStore: ...

    def store_now(self) -> float: ...

    def neighbors(self, topic: str) -> list[NeighborLink]: ...

    async def held_by(
        self, topic: str, peer_id: bytes, *, since_ms: int
    ) -> list[HeldSpan] | None: ...

    async def fetch_range(
        self,
        topic: str,
        publisher: bytes,
        first_seq: int,
        last_seq: int,
        *,
        holders: Iterable[bytes],
    ) -> object: ...  # a FetchReport: what arrived is counted in the store


class CatchUp:
    """Per-link catch-ups: (topic, peer) pending or running, one per link (so bounded by
    topics times the active view), each with whether the link came up again since it
    started; and when each topic was joined (wall clock, ms): once the topic's retained
    history has been caught up, a catch-up asks only for what was published since."""

    def __init__(self, node: _Asks, pause: float) -> None:
        self._node = node
        self._pause = pause  # the broadcast's gap_timeout
        self._joined_ms: dict[str, int] = {}
        # Joined topics whose neighbours' retained history no catch-up has finished yet.
        self._history_due: set[str] = set()
        self._catching_up: dict[tuple[str, bytes], bool] = {}
        # (topic, peer) of links that came up with nothing of the topic held here, not
        # compared since (MAX_UNCOMPARED_LINKS, oldest first).
        self._uncompared: OrderedDict[tuple[str, bytes], None] = OrderedDict()
        self._locks: dict[str, trio.Lock] = {}  # topics with a catch-up pending
        self._slots = trio.CapacityLimiter(CATCH_UP_AT_ONCE)
        self._catch_ups = 0
        self._caught_up = 0
        self._skipped = 0

    def joined(self, topic: str, history: bool = True) -> None:
        """`topic` was joined now; `history`: pull what neighbours retained from before."""
        self._joined_ms[topic] = int(time.time() * 1000)
        if history:
            self._history_due.add(topic)

    def left(self, topic: str) -> None:
        self._joined_ms.pop(topic, None)
        self._history_due.discard(topic)
        for link in [link for link in self._uncompared if link[0] == topic]:
            del self._uncompared[link]

    def link_up(self, topic: str, peer: bytes, nursery: trio.Nursery | None) -> None:
        link = (topic, peer)
        if not self._node.store.holds(topic):
            self._skipped += 1  # nothing to compare unless the peer holds something: asked
            self._uncompared[link] = None
            self._uncompared.move_to_end(link)
            if len(self._uncompared) > MAX_UNCOMPARED_LINKS:
                self._uncompared.popitem(last=False)
            return
        self._uncompared.pop(link, None)
        self._start(topic, peer, nursery)

    def asked(self, topic: str, peer: bytes, nursery: trio.Nursery | None) -> None:
        """`peer` asked what we hold of `topic` (it holds something itself): if our link-up
        skipped its catch-up (we held nothing then, whatever we hold now), or we hold
        nothing, compare now (also while the topic's retained history is due: a live
        message may have come before the history), if `peer` is a neighbour of the topic
        (else its asking is a query, not a link's catch-up)."""
        link = (topic, peer)
        if (
            (
                self._node.store.holds(topic)
                and topic not in self._history_due
                and link not in self._uncompared
            )
            or topic not in self._joined_ms
            or link in self._catching_up
            or peer not in (n.peer_id for n in self._node.neighbors(topic))
        ):
            return
        self._uncompared.pop(link, None)
        self._start(topic, peer, nursery)

    def _start(self, topic: str, peer: bytes, nursery: trio.Nursery | None) -> None:
        link = (topic, peer)
        if link in self._catching_up:
            self._catching_up[link] = True  # compare again once this one is done
        elif nursery is not None:
            self._catching_up[link] = False
            nursery.start_soon(self._catch_up, *link)

    def stats(self) -> dict[str, int]:
        return {
            "catch_ups": self._catch_ups,  # links whose holdings were compared on coming up
            "caught_up": self._caught_up,  # messages those catch-ups pulled
            # links that came up with nothing of the topic held here (no GETHELD sent)
            "catch_ups_skipped": self._skipped,
        }

    async def _catch_up(self, topic: str, peer: bytes) -> None:
        """Pull from `peer` what it holds of `topic`, published since we joined, that this
        node lacks; again if the link came up again meanwhile."""
        link = (topic, peer)
        try:
            while True:
                # Asked outside the topic's lock: a neighbour that does not answer (its
                # link cut off, not closed yet) must not hold up the comparison of the
                # topic's other links for the CATCH_UP_TIMEOUT it is asked in.
                spans = await self._holdings_of(topic, peer)
                if spans is not None:
                    # One link of a topic at a time pulls: the next finds what this one
                    # pulled held, instead of pulling it a second time from another one.
                    lock = self._locks.setdefault(topic, trio.Lock())
                    async with lock, self._slots:
                        await self._pull(topic, peer, spans)
                if not self._catching_up.get(link):
                    return
                self._catching_up[link] = False  # it came up again while we compared
        except LocalProtocolError:
            return  # the node stopped
        finally:
            self._catching_up.pop(link, None)
            if not any(t == topic for t, _ in self._catching_up):
                self._locks.pop(topic, None)

    async def _holdings_of(self, topic: str, peer: bytes) -> list[HeldSpan] | None:
        """What `peer` holds of `topic` since the time a catch-up asks from; None when the
        link went, the topic was left, or it gave no answer within CATCH_UP_TIMEOUT."""
        node = self._node
        with trio.move_on_after(CATCH_UP_TIMEOUT):
            while True:
                await trio.sleep(self._pause)  # the tree's own repair first; then between asks
                if peer not in (n.peer_id for n in node.neighbors(topic)):
                    return None  # the link went again (its return starts another catch-up)
                joined = self._joined_ms.get(topic)
                if joined is None:
                    return None
                since = max(1, self._since_ms(topic, joined))
                spans = await node.held_by(topic, peer, since_ms=since)
                if spans is not None:
                    return spans  # else no answer: the link may be closing, or the peer busy
        return None

    async def _pull(self, topic: str, peer: bytes, spans: list[HeldSpan]) -> None:
        """Fetch from `peer` what of its `spans` this node lacks (see _catch_up_stream)."""
        me = self._node.id
        self._catch_ups += 1
        # Seqs this catch-up may still ask for: no more than the store can hold.
        store = self._node.store
        allowance = store.config.max_messages
        with trio.move_on_after(CATCH_UP_TIMEOUT) as scope:
            for span in spans:
                if allowance <= 0 or store.bytes >= store.config.max_bytes:
                    break  # retention holds what it can: the rest would push it out
                if span.publisher != me:
                    allowance -= await self._catch_up_stream(topic, peer, span, allowance)
        if not scope.cancelled_caught:
            self._history_due.discard(topic)  # ran to its end: the history is held

    def _since_ms(self, topic: str, joined_ms: int) -> int:
        """From when (publishers' stamps, ms) a catch-up asks: since the join (less the
        clock slack), or, while the topic's retained history is due, since as long ago as
        this node's retention keeps a message."""
        since = joined_ms - CATCH_UP_CLOCK_SLACK_MS
        if topic in self._history_due:
            horizon = int(time.time() * 1000) - int(self._node.store.config.max_age * 1000)
            since = min(since, horizon)
        return since

    async def _catch_up_stream(
        self, topic: str, peer: bytes, span: HeldSpan, allowance: int
    ) -> int:
        """Fetch from `peer` the seqs of `span` since the asked time (its since_seq) that
        this node lacks, at most the newest `allowance` of them, when `peer` holds more of
        them than we do; while the fetches gain. Returns how many seqs it asked for."""
        publisher = span.publisher
        if not isinstance(publisher, bytes) or not publisher:
            return 0
        last = span.last_seq
        newest = max(last - FETCH_MAX_SPAN, last - allowance) + 1
        # A control stream's messages are stamped 0 (a sink index: a commit run again
        # writes the very same message), so no stamp tells an old one: all are asked for.
        since = span.first_seq if publisher.startswith(CONTROL_PREFIX) else span.since_seq
        first = max(since, span.first_seq, newest)
        if first > last:
            return 0
        # The peer holds at least this many of first..last (count covers first_seq..last).
        theirs = span.count - (first - span.first_seq)
        node = self._node
        while True:
            ours = node.store.span(topic, publisher, first, last, node.store_now())
            had = 0 if ours is None else ours.count
            if had >= last - first + 1 or had >= theirs:
                return last - first + 1
            # Into retention, and counted there: the messages themselves are not read back.
            await node.fetch_range(topic, publisher, first, last, holders=[peer])
            now_held = node.store.span(topic, publisher, first, last, node.store_now())
            got = 0 if now_held is None else now_held.count
            self._caught_up += max(0, got - had)
            if got <= had:
                return last - first + 1  # nobody gave more: the rest is not to be had now
