"""The core's message store: every message this node has seen, the bytes of those it
still holds, and what sits at each (topic, publisher, seq).

The core (`NodeState`) owns one store for all its topics and hands it to each topic's
broadcast. A first copy enters it once, where broadcast takes it in (`add`): its id is
seen from then on, its bytes answer GRAFTs and PULLs, and its place is what ordering
delivers in turn, what a GETHELD is answered from and what an application reads back by
sequence range (the Spark source, replaying a micro-batch). It is the owner of "which
message does this node hold at (topic, publisher, seq)" (`Places`, the one place index),
of "which publishers does this node hold, from where to where" (`offsets`) and of the
rule for which of two messages takes a place (`takes_place`).

A plain data structure: no clock, no I/O; `now` comes in as an argument, in seconds on any
monotonic clock (the core's).

Rules this store keeps:
- Two windows, one table: the last `seen_max` messages taken in, each for `seen_ttl`
  seconds, are seen (a copy of one is a duplicate); a message's bytes are held for at
  most `max_messages` messages, `max_bytes` bytes of application data (value + key +
  headers) and `max_age` seconds. The oldest goes first, whatever its topic. Bytes never
  outlive their row in the seen window. History we fetched is held but not seen
  (`add(seen=False)`): a live copy of it is still a first copy.
- A message ordering holds back for a gap is pinned: it keeps its bytes and id past the
  windows until ordering lets it go (at most max_held_per_publisher a stream).
- One message per place: a (topic, publisher, seq) holds one message. A different message
  for a taken place (a sink row written twice, with another stamp) takes it only if it
  sorts first by (timestamp, id) (`takes_place`), so every node that sees both keeps the
  same one, whatever order they came in. The one it replaced lets its bytes go.
- Topics joined with retain=False (`offer_history`) offer no history: nothing of them is
  in `offsets`, a GETHELD's answer or a range read; their messages still answer GRAFTs
  and PULLs, as every topic's do.
- Per-publisher summaries (first and last seq held, how many) cost O(1) for streams that
  arrive roughly in order and age out oldest first, as publishers' streams do.
- A page of publishers (`page`, `held_page`: those after a cursor, in byte order) costs
  O(log P + page), not O(P): each topic keeps its publishers sorted. What a query looks at
  (streams, rows) is counted in `work`, so that whoever asks on a peer's behalf can charge
  the peer for it.

Storage: rows numbered in arrival order (serials). Ids are an IdIndex (idindex.py: packed,
~50 bytes an id), arrival times an array from `_seen_base`; the bytes' columns (the
envelope's bytes as they arrived, hops, size, stamp, place, first sender) lists and arrays
from `_base`. The oldest seen row is `_seen_head`, the oldest row whose bytes may be held
`_head` (>= `_seen_head`); a row holds bytes while its raw is not None. A message costs
its envelope's bytes (the very object the GOSSIP carried) plus ~110 bytes of table; see
docs/operations.md.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right, insort
from collections.abc import Callable
from dataclasses import dataclass
from heapq import heappop, heappush
from typing import Any

from episub.proto.envelope import Envelope, MessageId, PeerId
from episub.proto.idindex import IdIndex
from episub.proto.messages import MAX_HELD_SPANS, GetHeld, Gossip, Held, HeldSpan
from episub.proto.seqindex import SeqIndex

__all__ = ["Cached", "MessageStore", "PlaceStream", "Places", "RetentionConfig", "Span"]

_COMPACT_AT = 4096  # spent rows before the columns are shifted down (amortised O(1))


@dataclass(frozen=True, slots=True, kw_only=True)
class RetentionConfig:
    """The store's bounds: how many messages, bytes and seconds of them it holds, and how
    many ids, and for how long, it remembers as seen."""

    # Enough for a Spark micro-batch to be re-read after a task retry on a busy topic.
    max_messages: int = 100_000  # guess: Kafka keeps days; we keep a replay window
    max_bytes: int = 64 * 1024 * 1024  # guess: a replay window of 1 MiB Arrow batches
    max_age: float = 600.0  # guess: ten minutes covers Spark's task retries and restarts
    seen_max: int = 1_000_000  # guess
    seen_ttl: float = 600.0  # guess: must exceed the longest time a copy can wander

    def __post_init__(self) -> None:
        for name in ("max_messages", "max_bytes", "seen_max"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"{name} must be an int >= 1, not {value!r}")
        for name in ("max_age", "seen_ttl"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name} must be > 0 seconds, not {value!r}")


@dataclass(frozen=True, slots=True)
class Span:
    """What is held of one publisher (within an asked range): first and last seq, and how
    many seqs between them are held (count == last - first + 1: no hole)."""

    first: int
    last: int
    count: int


@dataclass(slots=True)
class Cached:
    """A held message, as read (made on demand; the table keeps columns)."""

    id: MessageId
    raw: bytes  # the envelope's canonical bytes
    hops: int  # hops at which we received it (0: we published it)
    received_at: float
    size: int
    publisher: PeerId  # as the core names it (an int in the simulator, whose bytes differ)
    sender: PeerId | None  # the neighbour its first copy came from (None: we published it)

    @property
    def envelope(self) -> Envelope:
        return _decoded(self.raw, self.publisher)

    def gossip(self, hops: int) -> Gossip:
        """The GOSSIP that sends it on with `hops`: its bytes as they arrived."""
        if isinstance(self.publisher, bytes):
            return Gossip.from_wire(self.id, self.raw, hops)
        return Gossip(id=self.id, envelope=self.envelope, hops=hops)  # the simulator's ids


class PlaceStream(SeqIndex):
    """One publisher's places in one topic: seq -> the row that holds the message there."""

    __slots__ = ("publisher", "topic")

    def __init__(self, topic: str, publisher: Any) -> None:
        super().__init__()
        self.topic = topic
        self.publisher = publisher


class Places:
    """The place index of one topic: (publisher, seq) -> row, through a `PlaceStream` a
    publisher; for a topic that offers history, its publishers in order too, for paging.
    A publisher's stream goes with its last place, so the index holds only publishers it
    has a place of."""

    __slots__ = ("history", "publishers", "streams", "topic")

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.streams: dict[Any, PlaceStream] = {}
        self.publishers: list[Any] = []  # in order (bytes: a node's ids), if `history`
        self.history = True  # offered as history (False: joined with retain=False)

    def offer_history(self, offered: bool) -> None:
        """Offer history or not; only a topic that does keeps its publishers in order (a
        configuration topic's every write is a stream of its own: none is paged)."""
        if offered and not self.history:
            self.publishers = sorted(self.streams)
        elif not offered:
            self.publishers = []
        self.history = offered

    def __len__(self) -> int:
        """Publishers with a place."""
        return len(self.streams)

    def row(self, publisher: Any, seq: int) -> int | None:
        """The row at (publisher, seq), if any."""
        stream = self.streams.get(publisher)
        return None if stream is None else stream.get(seq)

    def stream(self, publisher: Any) -> PlaceStream:
        """`publisher`'s stream, opened if it has none."""
        stream = self.streams.get(publisher)
        if stream is None:
            stream = self.streams[publisher] = PlaceStream(self.topic, publisher)
            if self.history:
                insort(self.publishers, publisher)
        return stream

    def remove(self, stream: PlaceStream, seq: int) -> None:
        """`seq` of `stream` (one of ours) holds nothing any more; an emptied stream goes."""
        stream.remove(seq)
        if not stream.count:
            del self.streams[stream.publisher]
            if self.history:
                publishers = self.publishers
                del publishers[bisect_right(publishers, stream.publisher) - 1]

    def places(self) -> int:
        """Places held, all publishers together: O(publishers)."""
        return sum(stream.count for stream in self.streams.values())


def _takes(timestamp_ms: int, mid: MessageId, held_timestamp_ms: int, held_id: MessageId) -> bool:
    """The winner rule: the earlier stamp, then the smaller id; the same message never
    takes its own place. One rule on every node, so all converge on one message per place,
    whatever order the two came in."""
    return mid != held_id and (timestamp_ms, mid) < (held_timestamp_ms, held_id)


def _decoded(raw: bytes, publisher: PeerId) -> Envelope:
    envelope = Envelope.decode(raw)
    envelope.publisher = publisher  # the simulator's int ids: bytes on the wire
    return envelope


class MessageStore:
    """Seen ids, held bytes and places of all the node's topics (see the module)."""

    def __init__(self, config: RetentionConfig | None = None) -> None:
        self.config = config = config or RetentionConfig()
        self._index = IdIndex()  # seen ids -> serials; its `next` numbers the rows
        self.seen = self._index  # `mid in store.seen`, `len(store.seen)`
        self._at = array("d")  # arrival times: serial - _seen_base
        self._seen_base = self._seen_head = 0
        # the bytes' columns: serial - _base; the oldest that may hold bytes at _head
        self._raws: list[bytes | None] = []  # None: not held (any more)
        self._hops = array("H")  # hops < MAX_HOPS (2**16)
        self._sizes = array("I")  # application bytes: < max_message_size, far below 2**32
        self._stamps = array("q")  # timestamp_ms
        self._streams: list[PlaceStream] = []  # a row's publisher: one object a publisher
        self._seqs = array("q")
        self._senders: list[PeerId | None] = []  # a row's first sender (a shared reference)
        self._base = self._head = 0
        self._held = 0  # rows from _head whose raw is not None
        self._topics: dict[str, Places] = {}
        # Rows ordering holds back (pinned), and those of them a window's head has passed:
        # they keep bytes and id until unpinned.
        self._pinned: set[int] = set()
        self._behind: set[int] = set()
        self._behind_order: list[int] = []  # a heap of _behind (and of rows left it since)
        # No sooner than this is the oldest row past an age bound (inf: nothing held): an
        # add before then, within the count and byte bounds, has nothing to expire.
        self._due = math.inf
        self.bytes = 0  # application bytes held, pinned rows past the windows aside
        self.evicted = 0  # messages whose bytes a bound let go
        self.replaced = 0  # held messages another message took the place of
        self.released = 0  # bytes let go (evicted or replaced), from the start
        self.work = 0  # streams and rows the queries looked at, from the start

    def __len__(self) -> int:
        """Messages whose bytes are held (pinned ones past the windows aside)."""
        return self._held

    @property
    def pinned(self) -> int:
        """Rows ordering holds back (held past the windows while they are)."""
        return len(self._pinned)

    # -- writing ------------------------------------------------------------------------

    def places(self, topic: str) -> Places:
        """`topic`'s place index, made at its first use (a topic joined or received)."""
        places = self._topics.get(topic)
        if places is None:
            places = self._topics[topic] = Places(topic)
        return places

    def offer_history(self, topic: str, offered: bool) -> None:
        """Does `topic` offer history (JoinTopic's `retain`)?"""
        self.places(topic).offer_history(offered)

    def add(
        self,
        places: Places,
        mid: MessageId,
        envelope: Envelope,
        hops: int,
        now: float,
        sender: PeerId | None = None,
        seen: bool = True,
    ) -> int:
        """`mid` is seen, and its envelope held at its place in `places`, from `now`; then
        the bounds apply. The caller has checked that it takes the place (`takes_place`).
        Its serial, or -1 when `mid` was seen already (nothing changes).

        `seen=False`: history we fetched, held but not seen, so that a live copy of it is
        still a first copy (forwarded, announced); -1 when its place holds it already."""
        stream = places.streams.get(envelope.publisher)
        if seen:
            serial = self._index.add(mid)
            if serial < 0:
                return -1
        else:
            held = None if stream is None else stream.get(envelope.seq)
            if held is not None and self._index.id_of(held) == mid:
                return -1
            serial = self._index.append(mid)
        self._at.append(now)
        self._raws.append(envelope.raw)
        self._hops.append(hops)
        size = envelope.size
        self._sizes.append(size)
        self._stamps.append(envelope.timestamp_ms)
        if stream is None:
            stream = places.stream(envelope.publisher)
        self._streams.append(stream)
        seq = envelope.seq
        self._seqs.append(seq)
        self._senders.append(sender)
        replaced = stream.put(seq, serial)
        self._held += 1
        self.bytes += size
        if replaced is not None:
            self._replaced(replaced, self._index.id_of(replaced) != mid)
        c = self.config
        rows = serial + 1 - self._seen_head  # in the seen window
        if (
            now >= self._due
            or self._held > c.max_messages
            or self.bytes > c.max_bytes
            or rows > c.seen_max
        ):
            self.expire(now)
        elif rows == 1 or self._held == 1:
            self._due = min(self._due, now + min(c.max_age, c.seen_ttl))
        return serial

    def _replaced(self, serial: int, rival: bool = True) -> None:
        """Row `serial` lost its place to a later row (a rival's, or the same message's
        live copy after it was fetched): its bytes go (a pinned row's when ordering lets it
        go)."""
        self.replaced += rival
        if serial not in self._pinned:
            self._let_go(serial, counted=serial >= self._head)

    def _let_go(self, serial: int, counted: bool) -> None:
        """Row `serial`'s bytes go, and its place if it still holds it. `counted`: the row
        is within the bytes' window (its bytes count in `bytes`)."""
        i = serial - self._base
        if self._raws[i] is None:
            return
        self._raws[i] = None
        size = self._sizes[i]
        self.released += size
        if counted:
            self._held -= 1
            self.bytes -= size
        stream, seq = self._streams[i], self._seqs[i]
        if stream.get(seq) == serial:
            self.places(stream.topic).remove(stream, seq)

    def pin(self, serial: int) -> bool:
        """Keep row `serial` (ordering holds it back) until `unpin`; False when its bytes
        are gone already."""
        if serial < self._base or self._raws[serial - self._base] is None:
            return False
        self._pinned.add(serial)
        return True

    def unpin(self, serial: int) -> None:
        """Ordering let row `serial` go: it leaves the windows if they passed it, and its
        bytes go if another message took its place meanwhile."""
        self._pinned.discard(serial)
        if serial in self._behind:
            self._behind.discard(serial)
            if serial < self._head:
                self._let_go(serial, counted=False)
                self.evicted += 1
            if serial < self._seen_head:
                self._index.remove(serial)
            return
        i = serial - self._base
        stream = self._streams[i]
        if stream.get(self._seqs[i]) != serial:
            self._let_go(serial, counted=True)

    def expire(self, now: float) -> None:
        """Let go of what is past a bound: bytes first, then ids (with their bytes, if the
        seen bounds are the tighter). Pinned rows stay."""
        c = self.config
        at, index, raws, pinned = self._at, self._index, self._raws, self._pinned
        end = index.next
        while self._held and (
            self._held > c.max_messages
            or self.bytes > c.max_bytes
            or at[self._head - self._seen_base] + c.max_age <= now
        ):
            serial = self._head
            i = serial - self._base
            if raws[i] is not None:
                if serial in pinned:
                    self._pass_pinned(serial)
                    self._held -= 1
                    self.bytes -= self._sizes[i]
                else:
                    self._let_go(serial, counted=True)
                    self.evicted += 1
            self._head += 1
        while self._seen_head < end and (
            end - self._seen_head > c.seen_max
            or at[self._seen_head - self._seen_base] + c.seen_ttl <= now
        ):
            serial = self._seen_head
            if serial >= self._head:
                if raws[serial - self._base] is not None and serial not in pinned:
                    self._let_go(serial, counted=True)
                    self.evicted += 1
                elif serial in pinned:
                    self._held -= 1
                    self.bytes -= self._sizes[serial - self._base]
                self._head = serial + 1
            if serial in pinned:
                self._pass_pinned(serial)
            else:
                index.remove(serial)  # False: history's, held but not seen
            self._seen_head += 1
        if not self._held:
            self._head = end
        if (
            self._seen_head - self._seen_base >= _COMPACT_AT
            or self._head - self._base >= _COMPACT_AT
        ):
            self._compact()
        due = math.inf
        if self._held:
            due = at[self._head - self._seen_base] + c.max_age
        if self._seen_head < end:
            due = min(due, at[self._seen_head - self._seen_base] + c.seen_ttl)
        self._due = due

    def _pass_pinned(self, serial: int) -> None:
        """A window's head passes pinned row `serial`: it stays until unpinned."""
        if serial not in self._behind:
            self._behind.add(serial)
            heappush(self._behind_order, serial)

    def _floor(self) -> int | None:
        """The oldest pinned row a head has passed: no compaction goes beyond it."""
        order, behind = self._behind_order, self._behind
        while order and order[0] not in behind:
            heappop(order)
        return order[0] if order else None

    def _compact(self, force: bool = False) -> None:
        """Give back the spent rows before the heads (not past a pinned row), once they are
        an eighth of a table: each row is moved O(1) times on average, and the columns stay
        within ~1/8 of what they hold."""
        seen_end, end = self._seen_head, self._head
        if self._behind:
            floor = self._floor()
            if floor is not None:
                seen_end, end = min(seen_end, floor), min(end, floor)
        spent = seen_end - self._seen_base
        if spent > 0 and (force or (spent >= _COMPACT_AT and 8 * spent >= len(self._at))):
            del self._at[:spent]
            self._seen_base += spent
            self._index.drop_before(self._seen_base)
        spent = end - self._base
        if spent > 0 and (force or (spent >= _COMPACT_AT and 8 * spent >= len(self._raws))):
            for column in self._columns():
                del column[:spent]
            self._base += spent

    def _columns(self) -> tuple[Any, ...]:
        return (self._raws, self._hops, self._sizes, self._stamps, self._streams, self._seqs,
                self._senders)  # fmt: skip

    def shrink(self) -> None:
        """Give back every spent row before the heads and copy the columns to the size of
        what they hold: a list or array keeps the room it grew to, so after a large release
        that room stays unless copied. O(rows held): for a quiet node (episub/allocator.py),
        never per message."""
        self._compact(force=True)
        self._at = array("d", self._at)
        for name in ("_raws", "_hops", "_sizes", "_stamps", "_streams", "_seqs", "_senders"):
            column = getattr(self, name)
            setattr(self, name, column[:])

    # -- the broadcast's reads ----------------------------------------------------------

    def find(self, mid: MessageId) -> int:
        """The serial of `mid`'s row while it holds bytes, or -1."""
        serial = self._index.find(mid)
        if serial < self._base or self._raws[serial - self._base] is None:
            return -1
        return serial

    def cached(self, mid: MessageId) -> Cached | None:
        """`mid`'s message while its bytes are held."""
        serial = self.find(mid)
        return None if serial < 0 else self.row(serial)

    def row(self, serial: int) -> Cached:
        """Row `serial` (holding bytes) as read."""
        i = serial - self._base
        raw = self._raws[i]
        assert raw is not None
        return Cached(
            self._index.id_of(serial),
            raw,
            self._hops[i],
            self._at[serial - self._seen_base],
            self._sizes[i],
            self._streams[i].publisher,
            self._senders[i],
        )

    def message(self, serial: int) -> tuple[MessageId, Envelope, int]:
        """(id, envelope, hops) of row `serial` (pinned, or holding bytes)."""
        i = serial - self._base
        raw = self._raws[i]
        assert raw is not None
        envelope = _decoded(raw, self._streams[i].publisher)
        return self._index.id_of(serial), envelope, self._hops[i]

    def stamp(self, serial: int) -> int:
        return self._stamps[serial - self._base]

    def place_of(self, mid: MessageId) -> tuple[PeerId, int] | None:
        """(publisher, seq) of `mid`'s message while its bytes are held."""
        serial = self.find(mid)
        if serial < 0:
            return None
        i = serial - self._base
        return self._streams[i].publisher, self._seqs[i]

    def place(self, places: Places, publisher: PeerId, seq: int) -> MessageId | None:
        """The id of the message at (publisher, seq) of `places`, if any."""
        serial = places.row(publisher, seq)
        return None if serial is None else self._index.id_of(serial)

    def takes_place(
        self, places: Places, publisher: PeerId, seq: int, timestamp_ms: int, mid: MessageId
    ) -> int:
        """Does a message (stamped `timestamp_ms`, id `mid`) take (publisher, seq) of
        `places`? -1: yes, nothing else is there; -2: yes, it wins over the one there;
        else the serial of the one that keeps the place."""
        serial = places.row(publisher, seq)
        if serial is None:
            return -1
        held_id = self._index.id_of(serial)
        if held_id == mid:
            return -1
        if _takes(timestamp_ms, mid, self._stamps[serial - self._base], held_id):
            return -2
        return serial

    def lookup(self, places: Places) -> Callable[[PeerId, int], Cached | None]:
        """The message at (publisher, seq) of `places`, if any: what a GRAFT's places read."""

        def at_place(publisher: PeerId, seq: int) -> Cached | None:
            serial = places.row(publisher, seq)
            return None if serial is None else self.row(serial)

        return at_place

    def reader(
        self, places: Places, publisher: PeerId, now: float
    ) -> Callable[[int], tuple[bytes, int] | None]:
        """(bytes, hops) of the message held at a seq of `publisher` in `places` and
        younger than `max_age`, or None: what a PULL's batch reads, a seq at a time, with
        the stream and columns found once. Each look-up is counted in `work`. Valid while
        the store does not change (within one input)."""
        stream = places.streams.get(publisher)
        if stream is None:

            def none_held(seq: int) -> tuple[bytes, int] | None:
                self.work += 1
                return None

            return none_held
        row_of, raws, hops, at = stream.get, self._raws, self._hops, self._at
        base, seen_base, max_age = self._base, self._seen_base, self.config.max_age

        def held_at(seq: int) -> tuple[bytes, int] | None:
            self.work += 1
            serial = row_of(seq)
            if serial is None or at[serial - seen_base] + max_age <= now:
                return None  # not held, or aged out (the next `expire` lets it go)
            raw = raws[serial - base]
            assert raw is not None
            return raw, hops[serial - base]

        return held_at

    # -- history: what an application and a GETHELD read --------------------------------

    def _history(self, topic: str) -> Places | None:
        places = self._topics.get(topic)
        return places if places is not None and places.history else None

    def _stream(self, topic: str, publisher: object) -> PlaceStream | None:
        places = self._history(topic)
        return None if places is None else places.streams.get(publisher)

    def _rows(self, topic: str, publisher: bytes, first: int, last: int) -> list[int]:
        stream = self._stream(topic, publisher)
        if stream is None:
            return []
        base = self._base
        return [row - base for _, row in stream.rows_in(first, last)]

    def get(
        self, topic: str, publisher: bytes, first_seq: int, last_seq: int, now: float
    ) -> list[bytes]:
        """The held envelopes' bytes of `publisher` on `topic` with first_seq <= seq <=
        last_seq, in sequence order; those not (or no longer) held are simply absent."""
        _check_range(first_seq, last_seq)
        self.expire(now)
        raws = self._raws
        return [raws[i] for i in self._rows(topic, publisher, first_seq, last_seq)]  # type: ignore[misc]

    def entries(
        self, topic: str, publisher: bytes, first_seq: int, last_seq: int, now: float
    ) -> list[tuple[bytes, bytes]]:
        """`get`, with each message's id: (id, bytes) pairs in sequence order."""
        _check_range(first_seq, last_seq)
        self.expire(now)
        raws, id_of, base = self._raws, self._index.id_of, self._base
        rows = self._rows(topic, publisher, first_seq, last_seq)
        return [(id_of(base + i), raws[i]) for i in rows]  # type: ignore[misc]

    def seqs(
        self, topic: str, publisher: bytes, first_seq: int, last_seq: int, now: float
    ) -> list[int]:
        """The seqs `get` would return messages of, without the messages (what a fetch
        still lacks is found from these)."""
        _check_range(first_seq, last_seq)
        self.expire(now)
        stream = self._stream(topic, publisher)
        return [] if stream is None else [seq for seq, _ in stream.rows_in(first_seq, last_seq)]

    def holds(self, topic: str) -> bool:
        """Does `topic` offer history that stays held (a stream goes with its last row)?"""
        places = self._history(topic)
        return places is not None and bool(places.streams)

    def offsets(self, topic: str, now: float) -> dict[bytes, Span]:
        """publisher -> what is held of it on `topic`, for every publisher held."""
        self.expire(now)
        places = self._history(topic)
        if places is None:
            return {}
        return {p: Span(s.low, s.high, s.count) for p, s in places.streams.items()}

    def page(
        self, topic: str, after: bytes, limit: int, now: float
    ) -> tuple[list[tuple[bytes, Span]], bool]:
        """What is held of the first `limit` publishers of `topic` after `after` in byte
        order, and whether more follow: O(log P + limit), a cursor for paging."""
        self.expire(now)
        places = self._history(topic)
        if places is None:
            return [], False
        streams, publishers = places.streams, places.publishers
        start = bisect_right(publishers, after)
        chosen = publishers[start : start + limit]
        self.work += len(chosen) + 1
        out = [(p, Span((s := streams[p]).low, s.high, s.count)) for p in chosen]
        return out, start + limit < len(publishers)

    def span(
        self, topic: str, publisher: bytes, first_seq: int, last_seq: int, now: float
    ) -> Span | None:
        """What is held of `publisher` within first_seq..last_seq; None: nothing."""
        _check_range(first_seq, last_seq)
        self.expire(now)
        stream = self._stream(topic, publisher)
        self.work += 1
        if stream is None:
            return None
        low, high = max(first_seq, stream.low), min(last_seq, stream.high)
        if low > high:
            return None
        if low == stream.low and high == stream.high:
            return Span(low, high, stream.count)
        held = stream.rows_in(low, high)
        self.work += high - low + 1
        return Span(held[0][0], held[-1][0], len(held)) if held else None

    def first_since(
        self, topic: str, publisher: bytes, timestamp_ms: int, now: float
    ) -> int | None:
        """The lowest held seq of `publisher` stamped at or after `timestamp_ms`; None when
        every held one is older. A publisher's stamps rise with its seqs: a binary search
        over its seqs, O(log held) rows looked at (plus the holes skipped)."""
        self.expire(now)
        stream = self._stream(topic, publisher)
        if stream is None:
            return None
        stamps, base = self._stamps, self._base
        low, high = stream.low, stream.high + 1  # the answer is in low..high, high: none
        while low < high:
            self.work += 1
            middle = (low + high) // 2
            held = stream.next_held(middle)
            assert held is not None  # stream.high is held
            seq, row = held
            if stamps[row - base] >= timestamp_ms:
                high = middle
            else:
                low = seq + 1
        found = stream.next_held(low)  # low may be a hole: the held seq it stands for
        return None if found is None else found[0]

    def held_page(self, topic: str, query: GetHeld, now: float) -> Held:
        """A GETHELD's answer: one page, never more than MAX_HELD_SPANS. Its cost follows
        the page's size, not the number of publishers held (`page`'s cursor): a peer
        asking again and again pays per answer."""
        more = False
        found: list[tuple[bytes, Span]] = []
        if query.spans:
            for asked in query.spans:
                publisher: bytes = asked.publisher  # type: ignore[assignment]
                span = self.span(topic, publisher, asked.first_seq, asked.last_seq, now)
                if span is not None:
                    found.append((publisher, span))
        else:
            found, more = self.page(topic, query.after, MAX_HELD_SPANS, now)  # type: ignore[arg-type]
        spans = []
        for publisher, span in found:
            since = span.first
            if query.since_ms:
                first = self.first_since(topic, publisher, query.since_ms, now)
                since = span.last + 1 if first is None or first > span.last else max(first, since)
            spans.append(
                HeldSpan(
                    publisher=publisher,
                    first_seq=span.first,
                    last_seq=span.last,
                    count=span.count,
                    since_seq=since,
                )
            )
        return Held(nonce=query.nonce, spans=tuple(spans), more=more)


def _check_range(first_seq: int, last_seq: int) -> None:
    if not 0 <= first_seq <= last_seq:
        raise ValueError(f"need 0 <= first_seq <= last_seq, not {first_seq!r}..{last_seq!r}")
