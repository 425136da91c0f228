"""The ids one topic's broadcast has seen, and the envelopes it keeps to answer GRAFT and PULL.

One table, in arrival order, because both are kept in the order messages arrive and the
cache is always the newest part of what was seen: a message is seen and cached at once
(`remember`), and the cache's bounds drop its oldest while seen keeps the id longer. The
cache keeps each envelope's bytes as they arrived (the very object the GOSSIP carried and
the node's store holds, store.py), never a decoded Envelope: an answer is sent as those
bytes, and a message costs its bytes plus ~100 bytes of table here
(its packed id, index slot and arrival time, ~55, and ~45 bytes of columns).

Rows are numbered in arrival order (serials). Seen's ids are an IdIndex (idindex.py: the
ids packed in one bytearray, found through a table of serials; ~50 bytes an id, not the
~165 of a dict of bytes objects), its arrival times an array indexed by serial minus
`_seen_base`; the cache's columns (bytes, hops, size, place) are lists and arrays indexed
by serial minus `_cache_base`. The oldest seen row is `_seen_head`, the oldest cached one
`_cache_head` (>= `_seen_head`: the cache never keeps what seen forgot); a row is cached
while its bytes are not None. A place's cached row is found through the topic's place
index for these rows (store.py's `Places`, the one definition of a place index).

Bounds (BroadcastConfig): seen at most `seen_max` ids, each `seen_ttl` seconds; the cache
at most `cache_max_messages` messages and `cache_max_bytes` of application data
(`Envelope.size`), each `cache_ttl` seconds. A plain data structure: `now` comes in.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from episub.proto.config import BroadcastConfig
from episub.proto.envelope import Envelope, MessageId, PeerId
from episub.proto.idindex import IdIndex
from episub.proto.messages import Gossip
from episub.proto.store import Places, PlaceStream

__all__ = ["Cached", "MessageCache"]

_COMPACT_AT = 4096  # spent rows before the columns are shifted down (amortised O(1))


@dataclass(slots=True)
class Cached:
    """A cached message, as read (made on demand; the table keeps columns)."""

    id: MessageId
    raw: bytes  # the envelope's canonical bytes
    hops: int  # hops at which we received it (0: we published it)
    received_at: float
    size: int
    publisher: PeerId  # as the core names it (an int in the simulator, whose bytes differ)
    sender: PeerId | None  # the neighbour its first copy came from (None: we published it)

    @property
    def envelope(self) -> Envelope:
        envelope = Envelope.decode(self.raw)
        envelope.publisher = self.publisher
        return envelope

    def gossip(self, hops: int) -> Gossip:
        """The GOSSIP that sends it on with `hops`: its bytes as they arrived."""
        if isinstance(self.publisher, bytes):
            return Gossip.from_wire(self.id, self.raw, hops)
        return Gossip(id=self.id, envelope=self.envelope, hops=hops)  # the simulator's ids


class MessageCache:
    """Seen ids and cached envelope bytes of one topic (see the module's docstring)."""

    def __init__(self, config: BroadcastConfig, topic: str = "") -> None:
        self.config = config
        self._index = IdIndex()  # seen ids -> serials; its `next` numbers the rows
        # seen's arrival times: serial - _seen_base; the oldest held at _seen_head
        self._at = array("d")
        self._seen_base = self._seen_head = 0
        # the cache's columns: serial - _cache_base; the oldest held at _cache_head
        self._raws: list[bytes | None] = []  # None: not cached (any more)
        self._hops = array("H")  # hops < MAX_HOPS (2**16)
        self._sizes = array("I")  # application bytes: < max_message_size, far below 2**32
        self._row_places: list[PlaceStream] = []  # a row's publisher: one object a publisher
        self._seqs = array("q")
        self._senders: list[PeerId | None] = []  # a row's first sender (a shared reference)
        self._cache_base = self._cache_head = 0
        self._cached = 0  # messages cached (rows from _cache_head whose raw is not None)
        # No sooner than this is the oldest row past a ttl (inf: nothing held): a remember
        # before then, within the count and byte bounds, has nothing to expire.
        self._ttl_due = math.inf
        self.cache_bytes = 0
        self._places = Places(topic)  # (publisher, seq) -> cached row
        self.seen = self._index  # `mid in seen`, `len(seen)`, iteration (oldest first)
        self.cache = _CacheView(self)

    # -- writing ------------------------------------------------------------------------

    def remember(
        self,
        mid: MessageId,
        envelope: Envelope,
        hops: int,
        now: float,
        sender: PeerId | None = None,
    ) -> None:
        """`mid` is seen, and its envelope cached, from `now`; then the bounds apply."""
        serial = self._index.add(mid)
        if serial < 0:  # taken again (not done by broadcast.py): its old row is spent
            self._forget(-1 - serial)
            serial = self._index.add(mid)
        self._at.append(now)
        self._raws.append(envelope.raw)
        self._hops.append(hops)
        size = envelope.size
        self._sizes.append(size)
        stream = self._places.stream(envelope.publisher)
        self._row_places.append(stream)
        self._seqs.append(envelope.seq)
        self._senders.append(sender)
        stream.put(envelope.seq, serial)
        self._cached += 1
        self.cache_bytes += size
        c = self.config
        if (
            now >= self._ttl_due
            or self._cached > c.cache_max_messages
            or self.cache_bytes > c.cache_max_bytes
            or self._index.count > c.seen_max
        ):
            self.expire(now)
        else:  # a row alone in the cache or in seen is its oldest: its ttl is the next due
            if self._cached == 1:
                self._ttl_due = min(self._ttl_due, now + c.cache_ttl)
            if self._index.count == 1:
                self._ttl_due = min(self._ttl_due, now + c.seen_ttl)

    def _forget(self, serial: int) -> None:
        if serial >= self._cache_head:
            self._uncache(serial - self._cache_base)
        self._index.remove(serial)  # the row stays, spent, until the head passes it

    def _uncache(self, i: int) -> None:
        """Drop cache row i's envelope from the cache (if it is still there)."""
        if self._raws[i] is None:
            return
        self._raws[i] = None
        self._cached -= 1
        self.cache_bytes -= self._sizes[i]
        serial = self._cache_base + i
        stream = self._row_places[i]
        seq = self._seqs[i]
        if stream.get(seq) == serial:  # else a later row took the place
            self._places.remove(stream, seq)

    def expire(self, now: float) -> None:
        """Drop what is past a bound: the cache's oldest, then seen's (with its envelope,
        if the cache's bounds are the wider)."""
        c = self.config
        at = self._at
        index = self._index
        while self._cached and (
            self._cached > c.cache_max_messages
            or self.cache_bytes > c.cache_max_bytes
            or at[self._cache_head - self._seen_base] + c.cache_ttl <= now
        ):
            self._uncache(self._cache_head - self._cache_base)
            self._cache_head += 1
        while index.count and (
            index.count > c.seen_max or at[self._seen_head - self._seen_base] + c.seen_ttl <= now
        ):
            serial = self._seen_head
            if serial >= self._cache_head:
                self._uncache(serial - self._cache_base)
                self._cache_head = serial + 1
            index.remove(serial)  # False: spent (taken again later)
            self._seen_head += 1
        if not index.count:
            self._seen_head = index.next
        if not self._cached:
            self._cache_head = index.next
        if (
            self._seen_head - self._seen_base >= _COMPACT_AT
            or self._cache_head - self._cache_base >= _COMPACT_AT
        ):
            self._compact()
        due = math.inf
        if self._cached:
            due = at[self._cache_head - self._seen_base] + c.cache_ttl
        if index.count:
            due = min(due, at[self._seen_head - self._seen_base] + c.seen_ttl)
        self._ttl_due = due

    def _compact(self) -> None:
        """Give back the spent rows before the heads, once they are an eighth of a table:
        each row is moved O(1) times on average, and the columns stay within ~1/8 of
        what they hold."""
        spent = self._seen_head - self._seen_base
        if spent >= _COMPACT_AT and 8 * spent >= len(self._at):
            del self._at[:spent]
            self._index.drop_before(self._seen_head)
            self._seen_base = self._seen_head
        spent = self._cache_head - self._cache_base
        if spent >= _COMPACT_AT and 8 * spent >= len(self._raws):
            for column in (
                self._raws,
                self._hops,
                self._sizes,
                self._row_places,
                self._seqs,
                self._senders,
            ):
                del column[:spent]
            self._cache_base = self._cache_head

    # -- reading ------------------------------------------------------------------------

    def cached_row(self, mid: MessageId) -> int:
        """The serial of `mid`'s cached row, or -1."""
        serial = self._index.find(mid)
        if serial < self._cache_head or self._raws[serial - self._cache_base] is None:
            return -1
        return serial

    def get(self, mid: MessageId) -> Cached | None:
        serial = self.cached_row(mid)
        return None if serial < 0 else self._row(serial, mid)

    def at_place(self, publisher: PeerId, seq: int) -> Cached | None:
        """The cached message at (publisher, seq), if any: `get(place(...))` without
        finding the id again (asked of every seq a PULL or GRAFT names)."""
        serial = self._places.row(publisher, seq)
        return None if serial is None else self._row(serial, self._index.id_of(serial))

    def history_reader(self, publisher: PeerId) -> Callable[[int], tuple[bytes, int] | None]:
        """`at_place` for many seqs of one publisher, (bytes, hops) only: what a PULL's
        batch reads, with the publisher's places found once. Valid while the cache does
        not change (within one input)."""
        stream = self._places.streams.get(publisher)
        if stream is None:
            return _none_cached
        serial_of, raws, hops, base = stream.get, self._raws, self._hops, self._cache_base

        def cached_at(seq: int) -> tuple[bytes, int] | None:
            serial = serial_of(seq)
            if serial is None:
                return None
            raw = raws[serial - base]
            assert raw is not None
            return raw, hops[serial - base]

        return cached_at

    def _row(self, serial: int, mid: MessageId) -> Cached:
        """Cached row `serial` (whose id is `mid`) as read."""
        i = serial - self._cache_base
        raw = self._raws[i]
        assert raw is not None
        at = self._at[serial - self._seen_base]
        publisher = self._row_places[i].publisher
        return Cached(mid, raw, self._hops[i], at, self._sizes[i], publisher, self._senders[i])

    def place_of(self, mid: MessageId) -> tuple[PeerId, int] | None:
        """(publisher, seq) of `mid`'s cached message, if cached."""
        serial = self.cached_row(mid)
        if serial < 0:
            return None
        i = serial - self._cache_base
        return self._row_places[i].publisher, self._seqs[i]

    def holds_place(self, publisher: PeerId, seq: int) -> bool:
        """Is a message cached at (publisher, seq)?"""
        return self._places.row(publisher, seq) is not None

    def place(self, publisher: PeerId, seq: int) -> MessageId | None:
        """The cached message's id at (publisher, seq), if any."""
        serial = self._places.row(publisher, seq)
        return None if serial is None else self._index.id_of(serial)

    def cached_ids(self) -> Iterator[MessageId]:
        id_of = self._index.id_of
        for serial in range(self._cache_head, self._index.next):
            if self._raws[serial - self._cache_base] is not None:
                yield id_of(serial)

    def places(self) -> int:
        """Places cached, all publishers together."""
        return self._places.places()


class _CacheView:
    """`mid in cache`, `cache.get(mid)`, `len(cache)`, iteration (oldest first)."""

    __slots__ = ("_table",)

    def __init__(self, table: MessageCache) -> None:
        self._table = table

    def __contains__(self, mid: object) -> bool:
        return self._table.cached_row(mid) >= 0  # type: ignore[arg-type]

    def get(self, mid: MessageId) -> Cached | None:
        return self._table.get(mid)

    def __len__(self) -> int:
        return self._table._cached

    def __iter__(self) -> Iterator[MessageId]:
        return self._table.cached_ids()


def _none_cached(seq: int) -> None:
    return None
