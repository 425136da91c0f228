"""A bounded store of recent messages, for replay by (topic, publisher, sequence range).

The node puts every message it delivers, publishes or recovers here, so an application
(the Spark source, replaying a micro-batch) can read a range again after it was delivered,
and other nodes can ask for it (PULL answers, HELD summaries). It is the one owner of
"which publishers does this node hold, from where to where" (`offsets`): the core keeps
only what in-order delivery needs, and the agent asks here.

A plain data structure: no clock, no I/O; `now` comes in as an argument, in seconds on any
monotonic clock.

Rules this store keeps:
- Bounds: at most `max_messages` messages and `max_bytes` bytes of application data
  (value + key + headers), each kept at most `max_age` seconds. The oldest stored goes
  first, whatever its topic.
- One message per place: a (topic, publisher, seq) holds one message. A different message
  for a taken place (a sink row written twice, with another timestamp) replaces the held
  one only if it sorts first by (timestamp, id); so every node that sees both keeps the
  same one, whatever order they came in. The same message again changes nothing.
- Per-publisher summaries (first and last seq held, how many) cost O(1) for streams that
  arrive roughly in order and age out oldest first, as publishers' streams do.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

__all__ = ["RetentionConfig", "RetentionStore", "Span"]


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


M = TypeVar("M", bound=Storable)
_Key = tuple[str, bytes, int]


class _Stream(Generic[M]):
    """One publisher's held messages of one topic, with its lowest and highest seq."""

    __slots__ = ("high", "low", "messages")

    def __init__(self, seq: int, message: M) -> None:
        self.messages: dict[int, M] = {seq: message}
        self.low = seq
        self.high = seq

    def put(self, seq: int, message: M) -> None:
        self.messages[seq] = message
        if seq < self.low:
            self.low = seq
        elif seq > self.high:
            self.high = seq

    def remove(self, seq: int) -> None:
        messages = self.messages
        del messages[seq]
        if not messages or (seq != self.low and seq != self.high):
            return
        if self.high - self.low > 4 * len(messages):  # sparse: walking would cost more
            self.low, self.high = min(messages), max(messages)
            return
        while self.low not in messages:
            self.low += 1
        while self.high not in messages:
            self.high -= 1

    def span(self, first: int, last: int) -> Span | None:
        low, high = max(first, self.low), min(last, self.high)
        if low > high:
            return None
        messages = self.messages
        if low == self.low and high == self.high:
            return Span(low, high, len(messages))
        if high - low + 1 <= len(messages):
            held = [s for s in range(low, high + 1) if s in messages]
        else:
            held = sorted(s for s in messages if low <= s <= high)
        return Span(held[0], held[-1], len(held)) if held else None


def _wins(new: Storable, old: Storable) -> bool:
    """Does `new` take `old`'s place? The earlier stamp wins, then the smaller id: one rule
    for every node, so all converge on one message per place."""
    return (new.timestamp_ms, new.id) < (old.timestamp_ms, old.id)


class RetentionStore(Generic[M]):
    def __init__(self, config: RetentionConfig) -> None:
        self.config = config
        self._by_age: OrderedDict[_Key, float] = OrderedDict()  # oldest first
        self._topics: dict[str, dict[bytes, _Stream[M]]] = {}
        self.bytes = 0
        self.evicted = 0
        self.replaced = 0  # held messages another message took the place of (see _wins)

    def __len__(self) -> int:
        return len(self._by_age)

    def add(self, message: M, now: float) -> bool:
        """Store `message`; False when its place holds another message that stays."""
        topic, publisher, seq = message.topic, message.publisher, message.seq
        streams = self._topics.setdefault(topic, {})
        stream = streams.get(publisher)
        if stream is None:
            streams[publisher] = _Stream(seq, message)
        else:
            old = stream.messages.get(seq)
            if old is not None:
                if old.id == message.id or not _wins(message, old):
                    return False
                self.bytes -= old.size
                self.replaced += 1
                del self._by_age[(topic, publisher, seq)]
            stream.put(seq, message)
        self._by_age[(topic, publisher, seq)] = now
        self.bytes += message.size
        self.expire(now)
        return True

    def expire(self, now: float) -> None:
        """Drop what is past any bound; `add` and the queries call it, callers may too."""
        c = self.config
        by_age = self._by_age
        while by_age and (
            len(by_age) > c.max_messages
            or self.bytes > c.max_bytes
            or next(iter(by_age.values())) + c.max_age <= now
        ):
            (topic, publisher, seq), _ = by_age.popitem(last=False)
            streams = self._topics[topic]
            stream = streams[publisher]
            self.bytes -= stream.messages[seq].size
            self.evicted += 1
            stream.remove(seq)
            if not stream.messages:
                del streams[publisher]
                if not streams:
                    del self._topics[topic]

    def get(
        self, topic: str, publisher: bytes, first_seq: int, last_seq: int, now: float
    ) -> list[M]:
        """The stored messages of `publisher` on `topic` with first_seq <= seq <= last_seq,
        in sequence order; those not (or no longer) stored are simply absent."""
        _check_range(first_seq, last_seq)
        self.expire(now)
        stream = self._topics.get(topic, {}).get(publisher)
        if stream is None:
            return []
        low, high = max(first_seq, stream.low), min(last_seq, stream.high)
        messages = stream.messages
        if high - low + 1 <= len(messages):
            return [messages[s] for s in range(low, high + 1) if s in messages]
        return [messages[s] for s in sorted(messages) if low <= s <= high]

    def offsets(self, topic: str, now: float) -> dict[bytes, Span]:
        """publisher -> what is held of it on `topic`, for every publisher held."""
        self.expire(now)
        streams = self._topics.get(topic, {})
        return {p: Span(s.low, s.high, len(s.messages)) for p, s in streams.items()}

    def span(
        self, topic: str, publisher: bytes, first_seq: int, last_seq: int, now: float
    ) -> Span | None:
        """What is held of `publisher` within first_seq..last_seq; None: nothing."""
        _check_range(first_seq, last_seq)
        self.expire(now)
        stream = self._topics.get(topic, {}).get(publisher)
        return None if stream is None else stream.span(first_seq, last_seq)

    def first_since(
        self, topic: str, publisher: bytes, timestamp_ms: int, now: float
    ) -> int | None:
        """The lowest held seq of `publisher` stamped at or after `timestamp_ms`; None when
        every held one is older. (A publisher's stamps rise with its seqs.)"""
        self.expire(now)
        stream = self._topics.get(topic, {}).get(publisher)
        if stream is None:
            return None
        return min(
            (s for s, m in stream.messages.items() if m.timestamp_ms >= timestamp_ms),
            default=None,
        )


def _check_range(first_seq: int, last_seq: int) -> None:
    if not 0 <= first_seq <= last_seq:
        raise ValueError(f"need 0 <= first_seq <= last_seq, not {first_seq!r}..{last_seq!r}")
