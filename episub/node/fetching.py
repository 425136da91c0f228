"""Fetching a range: what this node lacks of a publisher's seqs first..last, asked (PULL)
of the nodes that hold it. Owns the waits (which seqs each fetch waits for, told when one
of them arrives) and the pace of a fetch.

Rules a fetch keeps:
- Every node named as a holder, then every neighbour, is first asked what it holds of the
  range (GETHELD, in parallel); a node that answers holding none of it is not asked for it.
  A node that did not answer is asked (PULL) only for what no answering node holds.
- The range is cut in chunks of FETCH_CHUNK seqs; each node that holds a chunk may have
  FETCH_WINDOW chunks asked at once, so answers stream back to back, and the chunks are
  spread over every node that holds them (the one with the fewest in flight first).
- A node that sends nothing of its chunks for FETCH_RETRY gives them back to be asked of
  another (and a chunk that stops part-way, of another that holds it); holders that
  claimed a chunk are asked again in turn while the fetch progresses.
- `timeout` bounds a pause, not the whole range: the fetch ends when it lacks nothing,
  when no node asked holds what it lacks, or when nothing arrived for `timeout` seconds.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

import trio

from episub.net.handshake import HandshakeError
from episub.net.runtime import Runtime
from episub.proto.events import Fetch
from episub.proto.messages import HeldSpan

__all__ = [
    "FETCH_CHUNK",
    "FETCH_RETRY",
    "FETCH_TIMEOUT",
    "FETCH_WINDOW",
    "FetchReport",
    "Fetcher",
    "NodeAnswer",
]

# How long a node asked for chunks may send none of them before they are asked of
# another; guess: a PULL round trip on a busy LAN, with room.
FETCH_RETRY = 1.0
FETCH_TIMEOUT = 10.0  # guess: = JOIN_TIMEOUT; the longest a fetch waits with nothing arriving
# Seqs asked of one node in one PULL, and PULLs in flight per node: a node's answers must
# fit its send queue to us with room for live traffic (SEND_QUEUE_CAP is 4,096 messages),
# or it drops the link; 2 x 1,024 keeps half of it free and one chunk always queued behind
# the one being sent, so the link never waits for a round trip.
FETCH_CHUNK = 1024
FETCH_WINDOW = 2
# Nodes one fetch asks at most (holders first): bounds its GETHELD fan-out.
MAX_FETCH_NODES = 64  # guess: = AgentLimits.max_holdings_nodes
# Seconds each node gets to say what it holds; guess: = HELD_TIMEOUT's order, shorter
# because the planner's holders were asked moments ago.
HOLDINGS_WAIT = 2.0


@dataclass(slots=True)
class NodeAnswer:
    """One node a fetch asked: what it said it holds of the range (None: no answer in
    time, or `error`) and how many chunks of it were asked of it (PULL)."""

    node: bytes
    held: list[HeldSpan] | None
    error: str = ""  # why it could not be asked, when it could not
    chunks_asked: int = 0


@dataclass(slots=True)
class FetchReport:
    """How a fetch ended: `lacking` seqs of the range still not held; `ended` says why:
    "complete", "unheld" (no node asked holds the rest), "no progress" (nothing arrived for
    the timeout)."""

    lacking: int
    ended: str
    asked: list[NodeAnswer] = field(default_factory=list)
    released: int = 0  # chunks given back by a node that stalled, to be asked again


class Fetcher:
    """Fetches in progress, per (topic, publisher): the seqs each waits for, told of each
    one that arrives (live messages of the publisher too: any copy will do)."""

    def __init__(self) -> None:
        self.waiting: dict[tuple[str, bytes], list[_FetchWaiter]] = {}

    def arrived(self, topic: str, publisher: bytes, seq: int) -> None:
        """A message reached retention (the event handler calls this only while
        `waiting` is not empty)."""
        for waiter in self.waiting.get((topic, publisher), ()):
            if waiter.first <= seq <= waiter.last:
                waiter.recent.append(seq)
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
        held_seqs: Callable[[], Iterable[int]],
        neighbors: Callable[[], Iterable[bytes]],
        held_by: Callable[[bytes, HeldSpan, float], Awaitable[list[HeldSpan] | None]],
        on_progress: Callable[[], None] | None = None,
    ) -> FetchReport:
        """Fetch what `held_seqs()` lacks of first..last (checks.check_fetch_range passed)
        from `holders` and `neighbors()` by the rules above; `on_progress()` is called
        when seqs of the range arrive."""
        key = (topic, publisher)
        waiter = _FetchWaiter(first_seq, last_seq)
        self.waiting.setdefault(key, []).append(waiter)
        try:
            fetch = _Fetch(runtime, topic, publisher, waiter, timeout, on_progress)
            fetch.fetcher_waiters = self.waiting[key]
            return await fetch.run(holders, held_seqs, neighbors, held_by)
        finally:
            waiter.asking.clear()  # fetches waiting on its chunks ask them themselves
            waiters = self.waiting[key]
            waiters.remove(waiter)
            if not waiters:
                del self.waiting[key]


class _FetchWaiter:
    __slots__ = ("arrived", "asking", "first", "last", "recent")

    def __init__(self, first: int, last: int) -> None:
        self.first = first
        self.last = last
        self.recent: list[int] = []  # seqs arrived since the fetch last looked
        self.arrived = trio.Event()
        self.asking: list[_Chunk] = []  # its chunks asked of some node now


@dataclass(slots=True, eq=False)
class _Chunk:
    low: int  # the lacking seqs of one FETCH_CHUNK-wide cell: first..last lacking
    high: int
    lacking: int
    tried: set[bytes] = field(default_factory=set)
    node: bytes | None = None  # asked of now
    got_at: float = 0.0  # the last arrival of one of its seqs, while asked (0: none)


@dataclass(slots=True)
class _Node:
    answer: NodeAnswer
    covers: list[tuple[int, int]]  # seq spans it holds of the range; None-answer: all
    known: bool  # answered GETHELD
    in_flight: list[_Chunk] = field(default_factory=list)
    got_at: float = 0.0  # the last arrival of one of its chunks' seqs


class _Fetch:
    """One fetch's state: the range's cells, the nodes asked and their chunks in flight."""

    def __init__(
        self,
        runtime: Runtime,
        topic: str,
        publisher: bytes,
        waiter: _FetchWaiter,
        timeout: float,
        on_progress: Callable[[], None] | None,
    ) -> None:
        self.runtime = runtime
        self.topic = topic
        self.publisher = publisher
        self.waiter = waiter
        self.timeout = timeout
        self.on_progress = on_progress
        size = waiter.last - waiter.first + 1
        self.have = bytearray(size)  # 1: held here
        self.lacking = size
        self.cells: list[_Chunk | None] = []
        self.nodes: dict[bytes, _Node] = {}
        self.released = 0
        self.fetcher_waiters: list[_FetchWaiter] = []  # every fetch of this publisher

    async def run(
        self,
        holders: Iterable[bytes],
        held_seqs: Callable[[], Iterable[int]],
        neighbors: Callable[[], Iterable[bytes]],
        held_by: Callable[[bytes, HeldSpan, float], Awaitable[list[HeldSpan] | None]],
    ) -> FetchReport:
        started = trio.current_time()  # the wait for a neighbour and GETHELD count as pauses
        first = self.waiter.first
        for seq in held_seqs():
            self._mark(seq)
        self.waiter.recent.clear()
        if not self.lacking:
            return FetchReport(0, "complete")
        self._cut()
        me = self.runtime.me
        holders = list(holders)
        candidates = [n for n in dict.fromkeys([*holders, *neighbors()]) if n != me]
        with trio.move_on_after(self.timeout):
            while not candidates:  # a node that just joined: its first neighbour may come
                await trio.sleep(FETCH_RETRY)
                candidates = [n for n in neighbors() if n != me]
        asked = HeldSpan(publisher=self.publisher, first_seq=first, last_seq=self.waiter.last)
        wait = min(HOLDINGS_WAIT, self.timeout)

        async def ask(node: bytes) -> None:
            error = ""
            try:
                held = await held_by(node, asked, wait)
            except (OSError, HandshakeError) as exc:
                held, error = None, str(exc) or type(exc).__name__  # it cannot be reached
            answer = NodeAnswer(node, held, error=error)
            spans = [s for s in held or () if s.publisher == self.publisher and s.count]
            covers = [(s.first_seq, s.last_seq) for s in spans]
            if held is None:
                covers = [(first, self.waiter.last)]  # unknown: it may hold any of it
            self.nodes[node] = _Node(answer, covers, known=held is not None)

        async with trio.open_nursery() as nursery:
            for node in candidates[:MAX_FETCH_NODES]:
                nursery.start_soon(ask, node)
        # Holders first, as asked: the planner's knowledge orders ties.
        self.nodes = {n: self.nodes[n] for n in candidates if n in self.nodes}
        return await self._stream(started)

    async def _stream(self, started: float) -> FetchReport:
        last_progress = started
        seen = self.lacking
        while True:
            now = trio.current_time()
            self._take_arrivals(now)
            if self.lacking != seen:
                seen, last_progress = self.lacking, now
                if self.on_progress is not None:
                    self.on_progress()
            if not self.lacking:
                return self._report("complete")
            if now - last_progress >= self.timeout:
                return self._report("no progress")
            self._release_stalled(now)
            self._ask(now)
            if not any(n.in_flight for n in self.nodes.values()) and not any(
                c is not None and c.lacking and self._asked_by_another(c) for c in self.cells
            ):
                return self._report("unheld")
            self.waiter.arrived = trio.Event()
            if self.waiter.recent:
                continue
            with trio.move_on_after(FETCH_RETRY / 4):  # re-look for stalls while waiting
                await self.waiter.arrived.wait()

    def _report(self, ended: str) -> FetchReport:
        asked = [n.answer for n in self.nodes.values()]
        return FetchReport(self.lacking, ended, asked, self.released)

    def _mark(self, seq: int) -> bool:
        i = seq - self.waiter.first
        if 0 <= i < len(self.have) and not self.have[i]:
            self.have[i] = 1
            self.lacking -= 1
            return True
        return False

    def _cut(self) -> None:
        """The lacking seqs, one chunk per cell of FETCH_CHUNK seqs; cells start at
        multiples of FETCH_CHUNK, so fetches of one publisher ask the same chunks (see
        _asked_by_another) and a seq finds its chunk by division."""
        first, have = self.waiter.first, self.have
        base = first - first % FETCH_CHUNK
        for start in range(base, self.waiter.last + 1, FETCH_CHUNK):
            low_i = max(start, first) - first
            cell = have[low_i : start + FETCH_CHUNK - first]
            low = cell.find(0)
            if low < 0:
                self.cells.append(None)
                continue
            high = len(cell) - 1 - cell[::-1].find(0)
            self.cells.append(_Chunk(first + low_i + low, first + low_i + high, cell.count(0)))

    def _take_arrivals(self, now: float) -> None:
        recent, self.waiter.recent = self.waiter.recent, []
        first = self.waiter.first
        for seq in recent:
            if not self._mark(seq):
                continue
            chunk = self.cells[seq // FETCH_CHUNK - first // FETCH_CHUNK]
            if chunk is None:
                continue
            chunk.lacking -= 1
            if chunk.node is not None:
                chunk.got_at = now
                node = self.nodes[chunk.node]
                node.got_at = now
                if not chunk.lacking:
                    node.in_flight.remove(chunk)
                    self.waiter.asking.remove(chunk)
                    chunk.node = None

    def _release_stalled(self, now: float) -> None:
        """Chunks given back: those of a node that sent none of them for FETCH_RETRY, and
        one that stopped part-way (its node holds no more of it) for as long."""
        for node_id, node in self.nodes.items():
            quiet = now - node.got_at  # got_at starts when its first chunk is asked
            for chunk in list(node.in_flight):
                stalled = quiet >= FETCH_RETRY or (
                    chunk.got_at and now - chunk.got_at >= FETCH_RETRY
                )
                if stalled:
                    self.released += 1
                    chunk.tried.add(node_id)
                    chunk.node = None
                    node.in_flight.remove(chunk)
                    self.waiter.asking.remove(chunk)

    def _ask(self, now: float) -> None:
        """Fill every node's window with the next chunks it holds that nobody is asked for."""
        for chunk in self.cells:
            if chunk is None or not chunk.lacking or chunk.node is not None:
                continue
            if self._asked_by_another(chunk):
                continue  # its answers reach this fetch too
            node_id = self._server(chunk)
            if node_id is None:
                continue
            node = self.nodes[node_id]
            # What arrived since the chunk was cut is not asked again.
            base = self.waiter.first
            cell = self.have[chunk.low - base : chunk.high - base + 1]
            chunk.low, chunk.high = chunk.low + cell.find(0), chunk.high - cell[::-1].find(0)
            if not node.in_flight:
                node.got_at = now  # its quiet time counts from its first chunk asked
            node.in_flight.append(chunk)
            self.waiter.asking.append(chunk)
            node.answer.chunks_asked += 1
            chunk.node, chunk.got_at = node_id, 0.0
            self.runtime.input(Fetch(self.topic, node_id, self.publisher, chunk.low, chunk.high))

    def _asked_by_another(self, chunk: _Chunk) -> bool:
        """Is all of `chunk` asked now by another fetch of the same publisher (a catch-up
        beside a reader, two tasks reading one range)? Its answers reach this one too."""
        others = self.fetcher_waiters
        return any(
            c.low <= chunk.low and chunk.high <= c.high
            for w in others
            if w is not self.waiter
            for c in w.asking
        )

    def _server(self, chunk: _Chunk) -> bytes | None:
        """The node to ask for `chunk`: of those that said they hold some of it and were
        not tried for it, the least busy with room in its window; when every one of them
        was tried, they are tried again; nodes that did not answer come last, once each."""
        holding = [n for n, node in self.nodes.items() if node.known and _covers(node, chunk)]
        if holding and all(n in chunk.tried for n in holding):
            chunk.tried.difference_update(holding)  # another round, while time is left
        choices = [n for n in holding if n not in chunk.tried]
        if not choices:
            choices = [
                n for n, node in self.nodes.items() if not node.known and n not in chunk.tried
            ]
        free = [n for n in choices if len(self.nodes[n].in_flight) < FETCH_WINDOW]
        if not free:
            return None
        return min(free, key=lambda n: len(self.nodes[n].in_flight))


def _covers(node: _Node, chunk: _Chunk) -> bool:
    return any(low <= chunk.high and high >= chunk.low for low, high in node.covers)
