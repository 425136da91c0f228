"""A bounded store of recent messages, for replay by (topic, publisher, sequence range).

The node puts every message it delivers and every one it publishes here, so an
application (the Spark source, replaying a micro-batch) can read a range again after it
was delivered. It is a plain data structure: no clock, no I/O; `now` comes in as an
argument, in seconds on any monotonic clock.

Bounds: at most `max_messages` messages and `max_bytes` bytes of application data
(value + key + headers), each kept at most `max_age` seconds. The oldest stored goes
first, whatever its topic. Storing a message under a (topic, publisher, seq) already
present replaces it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

__all__ = ["RetentionConfig", "RetentionStore"]


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


M = TypeVar("M", bound=Storable)
_Key = tuple[str, bytes, int]


class RetentionStore(Generic[M]):
    def __init__(self, config: RetentionConfig) -> None:
        self.config = config
        self._by_age: OrderedDict[_Key, tuple[float, M]] = OrderedDict()  # oldest first
        self._by_stream: dict[tuple[str, bytes], dict[int, M]] = {}
        self.bytes = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._by_age)

    def add(self, message: M, now: float) -> None:
        key = (message.topic, message.publisher, message.seq)
        old = self._by_age.pop(key, None)
        if old is not None:
            self.bytes -= old[1].size
        self._by_age[key] = (now, message)
        self._by_stream.setdefault(key[:2], {})[key[2]] = message  # type: ignore[index]
        self.bytes += message.size
        self.expire(now)

    def expire(self, now: float) -> None:
        """Drop what is past any bound; `add` and `get` call it, callers may too."""
        c = self.config
        by_age = self._by_age
        while by_age and (
            len(by_age) > c.max_messages
            or self.bytes > c.max_bytes
            or next(iter(by_age.values()))[0] + c.max_age <= now
        ):
            (topic, publisher, seq), (_, message) = by_age.popitem(last=False)
            self.bytes -= message.size
            self.evicted += 1
            stream = self._by_stream[(topic, publisher)]
            del stream[seq]
            if not stream:
                del self._by_stream[(topic, publisher)]

    def get(
        self, topic: str, publisher: bytes, first_seq: int, last_seq: int, now: float
    ) -> list[M]:
        """The stored messages of `publisher` on `topic` with first_seq <= seq <= last_seq,
        in sequence order; those not (or no longer) stored are simply absent."""
        if not 0 <= first_seq <= last_seq:
            raise ValueError(f"need 0 <= first_seq <= last_seq, not {first_seq!r}..{last_seq!r}")
        self.expire(now)
        stream = self._by_stream.get((topic, publisher))
        if not stream:
            return []
        if last_seq - first_seq + 1 <= len(stream):
            return [stream[s] for s in range(first_seq, last_seq + 1) if s in stream]
        return [stream[s] for s in sorted(stream) if first_seq <= s <= last_seq]
