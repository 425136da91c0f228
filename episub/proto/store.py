"""The core's message store: what this node holds of each (topic, publisher, seq), for
replay by sequence range and for answering other nodes.

The core (`NodeState`) owns one store for all its topics and puts into it every message it
delivers, publishes or recovers (history fetched from a neighbour), except on topics joined
with `retain=False`; each topic's broadcast answers the seqs of a PULL its cache no longer
has from here, and `NodeState` answers a GETHELD (`held_page`) from here, joined or not. An
application (the Spark source, replaying a micro-batch) reads ranges back through the node.
It is the owner of "which message does this node hold at (topic, publisher, seq)" and of
"which publishers does this node hold, from where to where" (`offsets`); `wins` is the
one rule for which of two messages takes a place, and `Places` the one place index
(publisher, seq) -> row: the store keeps one per topic over its rows, and each topic's
broadcast cache (cache.py) one over its recent rows, to answer GRAFTs and find rivals
on topics the store keeps nothing of.

A plain data structure: no clock, no I/O; `now` comes in as an argument, in seconds on any
monotonic clock (the core's).

Rules this store keeps:
- Bounds: at most `max_messages` messages and `max_bytes` bytes of application data
  (value + key + headers), each kept at most `max_age` seconds. The oldest stored goes
  first, whatever its topic. A store with a zero bound keeps nothing (the simulator's).
- One message per place: a (topic, publisher, seq) holds one message. A different message
  for a taken place (a sink row written twice, with another timestamp) replaces the held
  one only if it `wins`: it sorts first by (timestamp, id); so every node that sees both
  keeps the same one, whatever order they came in. The same message again changes nothing.
- Per-publisher summaries (first and last seq held, how many) cost O(1) for streams that
  arrive roughly in order and age out oldest first, as publishers' streams do.
- A page of publishers (`page`, `held_page`: those after a cursor, in byte order) costs
  O(log P + page), not O(P): each topic keeps its publishers sorted. What a query looks at
  (streams, rows) is counted in `work`, so that whoever asks on a peer's behalf can charge
  the peer for it.

Storage: rows in columns (`array`s and lists) in the order stored, and each publisher's
places in a SeqIndex (an array indexed by seq while the stream is dense). A message costs
what `add` was given (the core gives the envelope's bytes, the same object its broadcast
cache holds: one copy of a payload per node) plus ~85 bytes (the id packed in 33 of them);
see docs/operations.md.
`add_item` and `entries` are `add` and `get` for a caller that keeps the fields apart from
the stored item.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right, insort
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from episub.proto.messages import MAX_HELD_SPANS, GetHeld, Held, HeldSpan, MessageId
from episub.proto.seqindex import SeqIndex

__all__ = ["PlaceStream", "Places", "RetentionConfig", "RetentionStore", "Span", "wins"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RetentionConfig:
    # Enough for a Spark micro-batch to be re-read after a task retry on a busy topic.
    max_messages: int = 100_000  # guess: Kafka keeps days; we keep a replay window
    max_bytes: int = 64 * 1024 * 1024  # guess: a quarter of the core's own payload cache
    max_age: float = 600.0  # guess: ten minutes covers Spark's task retries and restarts

    def __post_init__(self) -> None:
        if self.max_messages < 0:
            raise ValueError(
                f"max_messages must be >= 0 (0: keep nothing), not {self.max_messages}"
            )
        if self.max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0 (0: keep nothing), not {self.max_bytes}")
        if not self.max_age > 0:
            raise ValueError(f"max_age must be > 0 seconds, not {self.max_age}")


@dataclass(frozen=True, slots=True)
class Span:
    """What is held of one publisher (within an asked range): first and last seq, and how
    many seqs between them are held (count == last - first + 1: no hole)."""

    first: int
    last: int
    count: int


class Storable(Protocol):
    """What the store needs of a message."""

    @property
    def topic(self) -> str: ...

    @property
    def publisher(self) -> bytes: ...

    @property
    def seq(self) -> int: ...

    @property
    def size(self) -> int: ...

    @property
    def timestamp_ms(self) -> int: ...

    @property
    def id(self) -> bytes: ...


M = TypeVar("M")

_COMPACT_AT = 4096  # spent rows before the columns are shifted down (amortised O(1))
_ID_ROOM = 32  # bytes a row keeps for its message's id (a message id's size: 32)


def wins(timestamp_ms: int, mid: MessageId, held_timestamp_ms: int, held_id: MessageId) -> bool:
    """Does a message stamped `timestamp_ms` with id `mid` take a place that holds another
    (stamped `held_timestamp_ms`, id `held_id`)? The earlier stamp wins, then the smaller
    id: one rule on every node, so all converge on one message per place, whatever order
    the two came in. The same message never wins its own place."""
    return mid != held_id and (timestamp_ms, mid) < (held_timestamp_ms, held_id)


class PlaceStream(SeqIndex):
    """One publisher's places in one topic: seq -> the row that holds the message there
    (a row of whichever table owns the `Places` this stream belongs to)."""

    __slots__ = ("publisher", "topic")

    def __init__(self, topic: str, publisher: Any) -> None:
        super().__init__()
        self.topic = topic
        self.publisher = publisher


class Places:
    """The place index of one topic: (publisher, seq) -> row, through a `PlaceStream` a
    publisher. The one definition of "what sits at (publisher, seq)": the store keeps one
    per topic over its rows (publishers in byte order, `ordered`, for paging), and each
    topic's broadcast cache one over its own recent rows (cache.py). A publisher's stream
    goes with its last place, so the index holds only publishers it has a place of."""

    __slots__ = ("_ordered", "publishers", "streams", "topic")

    def __init__(self, topic: str, *, ordered: bool = False) -> None:
        self.topic = topic
        self.streams: dict[Any, PlaceStream] = {}
        self._ordered = ordered
        # the publishers in order, when `ordered` (bytes: a node's ids); else empty
        self.publishers: list[Any] = []

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
            if self._ordered:
                insort(self.publishers, publisher)
        return stream

    def remove(self, stream: PlaceStream, seq: int) -> None:
        """`seq` of `stream` (one of ours) holds nothing any more; an emptied stream goes."""
        stream.remove(seq)
        if not stream.count:
            del self.streams[stream.publisher]
            if self._ordered:
                publishers = self.publishers
                del publishers[bisect_right(publishers, stream.publisher) - 1]

    def places(self) -> int:
        """Places held, all publishers together: O(publishers)."""
        return sum(stream.count for stream in self.streams.values())


class RetentionStore(Generic[M]):
    """The messages held, as rows in the order stored: columns (lists and arrays) indexed
    by row serial - `_base`, the oldest live row at or after `_head`. A message costs its
    item (what `add` was given: the node stores the envelope's bytes, the very object its
    broadcast cache holds) and ~85 bytes of columns and index. A replaced or evicted row
    is spent (its item None) until the head passes it or the columns are compacted."""

    def __init__(self, config: RetentionConfig) -> None:
        self.config = config
        self._topics: dict[str, Places] = {}  # a topic's places, publishers in byte order
        self._items: list[M | None] = []  # None: spent
        # ids packed, _ID_ROOM bytes a row (row i's at i * _ID_ROOM), their lengths beside:
        # 33 bytes a row, where a list of bytes objects costs 8 + 80 (the object stays
        # alive as long as retention holds its message)
        self._ids = bytearray()
        self._id_sizes = array("B")
        self._added = array("d")  # when stored
        self._stamps = array("q")  # timestamp_ms
        self._sizes = array("I")  # application bytes of one message: < 2**32
        self._streams: list[PlaceStream | None] = []
        self._seqs = array("q")
        self._base = 0  # serial of the row at index 0
        self._head = 0  # serial of the oldest row that may be live
        self._live = 0
        # When the oldest live row passes max_age (inf: none held): an add before then,
        # within the count and byte bounds, has nothing to expire (rows come in time order).
        self._age_due = math.inf
        self.bytes = 0
        self.evicted = 0
        self.replaced = 0  # held messages another message took the place of (see add_item)
        self.released = 0  # bytes of messages let go (evicted or replaced), from the start
        self.work = 0  # streams and rows the queries looked at, from the start

    def __len__(self) -> int:
        return self._live

    def add(self, message: M, now: float) -> bool:
        """Store `message` (a Storable); False when its place holds another that stays."""
        m: Storable = message  # type: ignore[assignment]
        return self.add_item(
            message,
            topic=m.topic,
            publisher=m.publisher,
            seq=m.seq,
            timestamp_ms=m.timestamp_ms,
            size=m.size,
            id=m.id,
            now=now,
        )

    def add_item(
        self,
        item: M,
        *,
        topic: str,
        publisher: bytes,
        seq: int,
        timestamp_ms: int,
        size: int,
        id: bytes,
        now: float,
    ) -> bool:
        """`add`, with the message's fields given apart from what is stored (`item`, which
        `get` returns): the node keeps only the envelope's bytes. An id is at most 32
        bytes (a message id's size)."""
        if len(id) > _ID_ROOM:
            raise ValueError(f"a retained message's id is at most {_ID_ROOM} bytes, not {len(id)}")
        places = self._topics.get(topic)
        if places is None:
            places = self._topics[topic] = Places(topic, ordered=True)
        stream = places.stream(publisher)
        held = stream.get(seq)
        if held is not None:
            i = held - self._base
            if not wins(timestamp_ms, id, self._stamps[i], self._id(i)):
                return False
            self.replaced += 1
            self._spend(i, taken=True)
        serial = self._base + len(self._items)
        self._items.append(item)
        self._ids += id.ljust(_ID_ROOM, b"\0") if len(id) < _ID_ROOM else id
        self._id_sizes.append(len(id))
        self._added.append(now)
        self._stamps.append(timestamp_ms)
        self._sizes.append(size)
        self._streams.append(stream)
        self._seqs.append(seq)
        stream.put(seq, serial)
        self._live += 1
        self.bytes += size
        c = self.config
        if (
            held is not None
            or now >= self._age_due
            or self._live > c.max_messages
            or self.bytes > c.max_bytes
        ):
            self.expire(now)
        elif self._live == 1:
            self._age_due = now + c.max_age
        return True

    def _spend(self, i: int, taken: bool = False) -> None:
        """Row i (live) is held no more; its place stays indexed if `taken`: another
        message is taking it (and the index its row)."""
        stream = self._streams[i]
        assert stream is not None
        self._items[i] = None
        self._streams[i] = None
        self._live -= 1
        size = self._sizes[i]
        self.bytes -= size
        self.released += size
        if not taken:
            places = self._topics[stream.topic]
            places.remove(stream, self._seqs[i])
            if not places.streams:
                del self._topics[stream.topic]

    def expire(self, now: float) -> None:
        """Drop what is past any bound; `add` and the queries call it, callers may too."""
        c = self.config
        items, added, base = self._items, self._added, self._base
        end = base + len(items)
        while self._live:
            i = self._head - base
            if items[i] is None:  # spent: not held, not counted
                self._head += 1
                continue
            if not (
                self._live > c.max_messages
                or self.bytes > c.max_bytes
                or added[i] + c.max_age <= now
            ):
                break
            self._spend(i)
            self.evicted += 1
            self._head += 1
        if not self._live:
            self._head = end
        if self._head - base >= _COMPACT_AT or end - base > 2 * self._live + _COMPACT_AT:
            self._compact()
        self._age_due = self._added[self._head - self._base] + c.max_age if self._live else math.inf

    def _compact(self) -> None:
        """Give back spent rows: those before the head once they are an eighth of the
        table (each row moves O(1) times on average; the columns stay within ~1/8 of what
        they hold), or every spent row once they outnumber the live ones (replacements)."""
        spent_before = self._head - self._base
        total = len(self._items)
        if total - spent_before > 2 * self._live + _COMPACT_AT:  # spent rows amid live ones
            keep = [i for i in range(spent_before, total) if self._items[i] is not None]
            self._rebuild(keep)
        elif spent_before >= _COMPACT_AT and 8 * spent_before >= total:
            for column in self._columns():
                del column[:spent_before]
            del self._ids[: spent_before * _ID_ROOM]
            self._base = self._head

    def shrink(self) -> None:
        """Copy the columns to the size of what they hold from the head on: a list or array
        keeps the room it grew to (an eighth more, and the rows spent before compaction),
        so after a large release that room stays unless copied. O(rows held): for a quiet
        node (episub/allocator.py), never per message."""
        start = self._head - self._base
        (self._items, self._id_sizes, self._added, self._stamps, self._sizes, self._streams,
         self._seqs) = (column[start:] for column in self._columns())  # fmt: skip
        self._ids = self._ids[start * _ID_ROOM :]
        self._base = self._head

    def _columns(self) -> tuple[Any, ...]:
        """The columns of one entry a row (the packed ids are apart: _ID_ROOM a row)."""
        return (self._items, self._id_sizes, self._added, self._stamps, self._sizes,
                self._streams, self._seqs)  # fmt: skip

    def _id(self, i: int) -> bytes:
        at = i * _ID_ROOM
        return bytes(self._ids[at : at + self._id_sizes[i]])

    def _rebuild(self, keep: list[int]) -> None:
        base = self._next_serial()
        ids = self._ids
        self._ids = bytearray().join(ids[i * _ID_ROOM : (i + 1) * _ID_ROOM] for i in keep)
        for column in self._columns():
            column[:] = (
                type(column)(column[i] for i in keep)
                if isinstance(column, list)
                else (array(column.typecode, [column[i] for i in keep]))
            )
        for i, (stream, seq) in enumerate(zip(self._streams, self._seqs, strict=True)):
            assert stream is not None
            stream.put(seq, base + i)
        self._base = self._head = base

    def _stream(self, topic: str, publisher: object) -> PlaceStream | None:
        places = self._topics.get(topic)
        return None if places is None else places.streams.get(publisher)

    def _next_serial(self) -> int:
        return self._base + len(self._items)

    def _rows(self, topic: str, publisher: bytes, first: int, last: int) -> list[int]:
        stream = self._stream(topic, publisher)
        if stream is None:
            return []
        base = self._base
        return [row - base for _, row in stream.rows_in(first, last)]

    def get(
        self, topic: str, publisher: bytes, first_seq: int, last_seq: int, now: float
    ) -> list[M]:
        """The stored messages of `publisher` on `topic` with first_seq <= seq <= last_seq,
        in sequence order; those not (or no longer) stored are simply absent."""
        _check_range(first_seq, last_seq)
        self.expire(now)
        items = self._items
        return [items[i] for i in self._rows(topic, publisher, first_seq, last_seq)]  # type: ignore[misc]

    def entries(
        self, topic: str, publisher: bytes, first_seq: int, last_seq: int, now: float
    ) -> list[tuple[bytes, M]]:
        """`get`, with each message's id: (id, item) pairs in sequence order."""
        _check_range(first_seq, last_seq)
        self.expire(now)
        items, id_of = self._items, self._id
        rows = self._rows(topic, publisher, first_seq, last_seq)
        return [(id_of(i), items[i]) for i in rows]  # type: ignore[misc]

    def seqs(
        self, topic: str, publisher: bytes, first_seq: int, last_seq: int, now: float
    ) -> list[int]:
        """The seqs `get` would return messages of, without the messages (what a fetch
        still lacks is found from these)."""
        _check_range(first_seq, last_seq)
        self.expire(now)
        stream = self._stream(topic, publisher)
        return [] if stream is None else [seq for seq, _ in stream.rows_in(first_seq, last_seq)]

    def reader(self, topic: str, publisher: object, now: float) -> Callable[[int], M | None]:
        """The item held at a seq of (topic, publisher) and younger than `max_age`, or
        None: what a PULL's batch reads, a seq at a time, with the stream and columns found
        once. Each look-up is counted in `work`. Valid while the store does not change
        (within one input)."""
        stream = self._stream(topic, publisher)
        if stream is None:

            def none_held(seq: int) -> M | None:
                self.work += 1
                return None

            return none_held
        row_of, items, added = stream.get, self._items, self._added
        base, max_age = self._base, self.config.max_age

        def item_at(seq: int) -> M | None:
            self.work += 1
            row = row_of(seq)
            if row is None:
                return None
            i = row - base
            if added[i] + max_age <= now:
                return None  # aged out; the next `expire` lets it go
            return items[i]

        return item_at

    @property
    def keeps_nothing(self) -> bool:
        """Does a zero bound leave nothing stored (the simulator's store)?"""
        return not (self.config.max_messages and self.config.max_bytes)

    def holds(self, topic: str) -> bool:
        """Does anything of `topic` stay held (a stream goes with its last row)?"""
        return topic in self._topics

    def offsets(self, topic: str, now: float) -> dict[bytes, Span]:
        """publisher -> what is held of it on `topic`, for every publisher held."""
        self.expire(now)
        places = self._topics.get(topic)
        if places is None:
            return {}
        return {p: Span(s.low, s.high, s.count) for p, s in places.streams.items()}

    def page(
        self, topic: str, after: bytes, limit: int, now: float
    ) -> tuple[list[tuple[bytes, Span]], bool]:
        """What is held of the first `limit` publishers of `topic` after `after` in byte
        order, and whether more follow: O(log P + limit), a cursor for paging."""
        self.expire(now)
        places = self._topics.get(topic)
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
