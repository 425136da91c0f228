"""Fetch retries: a range of a publisher's messages asked (PULL) of one holder after
another, a chunk at a time, until this node holds all of it or the time is up. Owns the
waits: which seqs each fetch waits for, told when one of them arrives."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import trio

from episub.net.runtime import Runtime
from episub.node.retained import missing
from episub.proto.events import Fetch
from episub.records import Message

__all__ = ["FETCH_CHUNK", "FETCH_QUIET", "FETCH_RETRY", "FETCH_TIMEOUT", "Fetcher"]

# fetch(): how long one neighbour may take to start answering a PULL, and how long a
# burst of answers may pause before the next neighbour is asked for what is still missing.
FETCH_RETRY = 1.0  # guess: a PULL round trip on a busy LAN, with room
FETCH_QUIET = 0.1  # guess: answers to one PULL leave the peer back to back
FETCH_TIMEOUT = 10.0  # guess: = JOIN_TIMEOUT; a Spark task waits this long at most per range
# Seqs asked of one neighbour at a time: its answers must fit its send queue to us with
# room for live traffic (SEND_QUEUE_CAP is 4,096 messages), or it drops the link.
FETCH_CHUNK = 1024


class Fetcher:
    """Fetches in progress, per (topic, publisher): the seqs each waits for, and an event
    set when one of those arrives (live messages of the publisher do not count)."""

    def __init__(self) -> None:
        self.waiting: dict[tuple[str, bytes], list[_FetchWaiter]] = {}

    def arrived(self, topic: str, publisher: bytes, seq: int) -> None:
        """A message reached retention (the event handler calls this only while
        `waiting` is not empty)."""
        for waiter in self.waiting.get((topic, publisher), ()):
            if waiter.low <= seq <= waiter.high:
                waiter.arrived.set()

    async def fetch(
        self,
        runtime: Runtime,
        topic: str,
        publisher: bytes,
        first_seq: int,
        last_seq: int,
        timeout: float,
        holders: Iterable[bytes],
        held: Callable[[], list[Message]],
        neighbors: Callable[[], Iterable[bytes]],
    ) -> None:
        """Ask `holders`, then `neighbors()`, in turn for what `held()` lacks of the range
        (checks.check_fetch_range passed), until it lacks nothing or `timeout` passed."""
        known = [h for h in dict.fromkeys(holders) if h != runtime.me]
        key = (topic, publisher)
        waiters = self.waiting.setdefault(key, [])
        waiter = _FetchWaiter(first_seq, last_seq, trio.Event())
        waiters.append(waiter)
        try:
            with trio.move_on_after(timeout):
                for asked in itertools.count():
                    gap = missing(held(), first_seq, last_seq)
                    if gap is None:
                        break
                    peers = [*known, *(p for p in neighbors() if p not in known)]
                    if not peers:
                        await trio.sleep(FETCH_RETRY)  # no neighbour yet: one may come
                        continue
                    low, high = gap[0], min(gap[1], gap[0] + FETCH_CHUNK - 1)
                    waiter.low, waiter.high = low, high
                    waiter.arrived = trio.Event()
                    runtime.input(Fetch(topic, peers[asked % len(peers)], publisher, low, high))
                    # Answers come as a burst; once this neighbour is quiet, what is still
                    # missing is asked of the next.
                    with trio.move_on_after(FETCH_RETRY):
                        await waiter.arrived.wait()
                    while waiter.arrived.is_set():
                        waiter.arrived = trio.Event()
                        with trio.move_on_after(FETCH_QUIET):
                            await waiter.arrived.wait()
        finally:
            waiters.remove(waiter)
            if not waiters:
                del self.waiting[key]


@dataclass(slots=True)
class _FetchWaiter:
    low: int  # the seqs asked for now
    high: int
    arrived: trio.Event
