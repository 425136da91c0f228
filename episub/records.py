"""What the node hands its applications, as plain data: messages, subscription notices,
a neighbour's link, and the waits a client of the node uses. No trio here: the agent's
blocking client (and so Spark's Python workers) imports this, never the node runtime."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

__all__ = [
    "CRAWL_TIMEOUT",
    "HELD_TIMEOUT",
    "SUBSCRIPTION_BUFFER",
    "Delivery",
    "Item",
    "LagBuffer",
    "Lagged",
    "Lost",
    "NeighborLink",
    "Receipt",
    "format_publisher",
    "make_delivery",
    "parse_publisher",
]

SUBSCRIPTION_BUFFER = 1024  # guess: ~a second of a busy topic; trio has no default on purpose
HELD_TIMEOUT = 2.0  # guess: as node.VIEW_TIMEOUT, per page of a held_by answer
CRAWL_TIMEOUT = 10.0  # guess: a few VIEW_TIMEOUTs of breadth-first rounds


def format_publisher(publisher: bytes) -> str:
    """A publisher id as users see it everywhere (the CLI's text and JSON, the Spark
    source's `publisher` column): a node's peer id reads `host:port/tag`, a named stream
    (a Spark sink's) its name. Each byte is one character (latin-1), so any id has one
    spelling and `parse_publisher` gives its bytes back."""
    return publisher.decode("latin-1")


def parse_publisher(text: str) -> bytes:
    """The publisher id spelled `text` (as `format_publisher` writes it), for `fetch`,
    `retained` and offsets; ValueError for a character no publisher id holds."""
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        raise ValueError(f"not a publisher id: {text!r:.100}") from None


@dataclass(frozen=True, slots=True)
class NeighborLink:
    """One link of a topic's active view, as `Node.neighbors` reports it."""

    peer_id: bytes
    address: str  # "host:port" from the peer id
    kind: Literal["rand", "near"]  # GoCast: a random link, or one of the nearest by RTT
    role: Literal["eager", "lazy"]  # Plumtree: pushes payloads, or only announces ids
    rtt_ms: float | None  # smoothed RTT; None until a ping was answered


@dataclass(frozen=True, slots=True, kw_only=True)
class Delivery:
    """One published message as delivered to the application: what a subscription yields
    and `retained`/`fetch` return (Kafka's consumer record, plus its id)."""

    topic: str
    publisher: bytes  # the publishing node's peer id
    seq: int  # per-publisher sequence number, from 0, without gaps
    timestamp_ms: int  # publisher's clock, milliseconds since the Unix epoch
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    id: bytes  # blake3 of the envelope: the same on every node

    @property
    def size(self) -> int:
        """Application bytes (value, key, headers): what size limits count."""
        size = len(self.value) + (len(self.key) if self.key is not None else 0)
        return size + sum(len(name) + len(value) for name, value in self.headers)


# Delivery's slots, set straight: its frozen __init__ sets each field through
# object.__setattr__, ~2 us for the eight on a slow core, once per message delivered.
_new_object = object.__new__
(
    _SET_TOPIC,
    _SET_PUBLISHER,
    _SET_SEQ,
    _SET_TIMESTAMP,
    _SET_KEY,
    _SET_VALUE,
    _SET_HEADERS,
    _SET_ID,
) = (
    getattr(Delivery, name).__set__
    for name in ("topic", "publisher", "seq", "timestamp_ms", "key", "value", "headers", "id")
)


def make_delivery(
    topic: str,
    publisher: bytes,
    seq: int,
    timestamp_ms: int,
    key: bytes | None,
    value: bytes,
    headers: tuple[tuple[str, bytes], ...],
    id: bytes,
) -> Delivery:
    """`Delivery(topic=topic, ...)`, the same value, made in a third of the time: for the
    node's delivery of each message (retained.delivery_of)."""
    delivery: Delivery = _new_object(Delivery)
    _SET_TOPIC(delivery, topic)
    _SET_PUBLISHER(delivery, publisher)
    _SET_SEQ(delivery, seq)
    _SET_TIMESTAMP(delivery, timestamp_ms)
    _SET_KEY(delivery, key)
    _SET_VALUE(delivery, value)
    _SET_HEADERS(delivery, headers)
    _SET_ID(delivery, id)
    return delivery


@dataclass(frozen=True, slots=True)
class Receipt:
    """Where a publish went: the message id, and its place (publisher, seq).

    duplicate: the place was taken already and nothing was published; `id` is then the
    message that holds it, when this node still holds it (else None). `id` is None too
    for a named-stream publish held behind an earlier place that has not arrived yet."""

    id: bytes | None
    publisher: bytes
    seq: int
    duplicate: bool


@dataclass(frozen=True, slots=True)
class Lagged:
    """`count` items were dropped here because this subscriber was not keeping up."""

    count: int


@dataclass(frozen=True, slots=True)
class Lost:
    """`publisher`'s messages first_seq..last_seq were given up on: nobody we asked had
    them (the core's DataLost). Every subscriber of the topic is told."""

    publisher: bytes
    first_seq: int
    last_seq: int


Item: TypeAlias = Delivery | Lagged | Lost


class LagBuffer:
    """A bounded FIFO whose producer never waits: past `capacity` held items, an item is
    dropped and counted, and the consumer gets `Lagged(count)` where the drops happened.
    Shared by the async `Subscription` and the agent's blocking client."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: deque[Item] = deque()
        self._held = 0  # items that count against `capacity` (not Lagged markers)
        self._lag = 0  # dropped since the last item was queued
        self.dropped = 0  # items ever dropped here

    def put(self, item: Item) -> None:
        if self._held >= self.capacity:
            self._lag += 1
            self.dropped += 1
            return
        if self._lag:
            self._items.append(Lagged(self._lag))
            self._lag = 0
        self._items.append(item)
        self._held += 1

    def put_many(self, items: Sequence[Item]) -> None:
        """`put` each of `items`, in order: all at once when they fit and none was dropped
        since the last item (then `put` would queue each as it is)."""
        if not self._lag and self._held + len(items) <= self.capacity:
            self._items.extend(items)
            self._held += len(items)
            return
        for item in items:
            self.put(item)

    def add_lag(self, count: int) -> None:
        """Items dropped before they reached this buffer, reported at the same place."""
        self._lag += count

    def take(self) -> Item | None:
        """The next item or Lagged marker; None when there is nothing."""
        if self._items:
            item = self._items.popleft()
            if not isinstance(item, Lagged):
                self._held -= 1
            return item
        if self._lag:
            lag, self._lag = self._lag, 0
            return Lagged(lag)
        return None

    def take_many(self, limit: int | None = None) -> list[Item]:
        """What `take` gives call after call until None, at most `limit` items: the whole
        buffer at once when it fits (every item taken leaves nothing held)."""
        items = self._items
        if limit is not None and limit <= len(items):
            out: list[Item] = []
            while len(out) < limit and (item := self.take()) is not None:
                out.append(item)
            return out
        out = list(items)
        items.clear()
        self._held = 0
        if self._lag:
            out.append(Lagged(self._lag))
            self._lag = 0
        return out

    def clear(self) -> None:
        self._items.clear()
        self._held = self._lag = 0
