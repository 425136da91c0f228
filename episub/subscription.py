"""What a subscriber receives, and the bounded buffer it receives it from.

A subscriber never blocks the node and never loses silently. The node offers each item
without waiting; when a subscription's buffer is full the item is dropped and counted,
and the subscriber gets `Lagged(count)` at the place in the stream where items went
missing, before the next item it receives (or as soon as it has drained the buffer).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, TypeAlias

import trio

from episub.proto.errors import LocalProtocolError
from episub.proto.messages import check_topic_name

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Item", "LagBuffer", "Lagged", "Lost", "Message", "Subscription"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """One published message as the application sees it (Kafka's record, plus its id)."""

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


Item: TypeAlias = Message | Lagged | Lost


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

    def clear(self) -> None:
        self._items.clear()
        self._held = self._lag = 0


class Subscription:
    """A topic's items for one subscriber: `async for item in sub`, or `await sub.receive()`.

    Use it as `async with node.subscribe(topic) as sub:`; it receives from entering until
    leaving that block. Iteration ends when the node closes, after what is buffered.
    `buffer` items (messages and Lost notices) are held at most; Lagged markers are extra.
    """

    def __init__(
        self,
        topic: str,
        buffer: int,
        on_enter: Callable[[Subscription], None],
        on_exit: Callable[[Subscription], None],
    ) -> None:
        check_topic_name(topic)
        if not isinstance(buffer, int) or isinstance(buffer, bool) or buffer < 1:
            raise ValueError(f"buffer must be an int >= 1, not {buffer!r}")
        self.topic = topic
        self.buffer = buffer
        self._on_enter = on_enter
        self._on_exit = on_exit
        self._buffer = LagBuffer(buffer)
        self._changed = trio.Event()
        self._entered = False
        self._closed = False

    async def __aenter__(self) -> Subscription:
        self._on_enter(self)
        self._entered = True
        await trio.lowlevel.checkpoint()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._on_exit(self)
        self.close()

    def offer(self, item: Message | Lost) -> None:
        """Called by the node, never blocks: queue `item`, or drop and count it."""
        if self._closed:
            return
        self._buffer.put(item)
        self._wake()

    def offer_many(self, items: list[Message | Lost]) -> None:
        """`offer` each of `items`, in order, waking the subscriber once."""
        if self._closed:
            return
        put = self._buffer.put
        for item in items:
            put(item)
        self._wake()

    @property
    def dropped(self) -> int:
        """All items ever dropped for this subscriber."""
        return self._buffer.dropped

    def close(self) -> None:
        """No more items; the subscriber gets what is buffered, then the end."""
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def receive(self) -> Item:
        """The next item; trio.EndOfChannel once the subscription is closed and drained."""
        if not self._entered:
            raise LocalProtocolError(
                f"subscription to {self.topic!r} receives nothing until entered: "
                "use `async with node.subscribe(...) as sub`"
            )
        await trio.lowlevel.checkpoint()
        while True:
            changed = self._changed
            item = self._buffer.take()
            if item is not None:
                return item
            if self._closed:
                raise trio.EndOfChannel(f"subscription to {self.topic!r} is closed")
            await changed.wait()

    async def receive_batch(self, max_items: int | None = None) -> list[Item]:
        """Every item buffered (at most `max_items`), in order, once there is one; raises
        trio.EndOfChannel once the subscription is closed and drained. One call where
        `receive` would take one per item: what a fast consumer uses."""
        if max_items is not None and max_items < 1:
            raise ValueError(f"max_items must be >= 1, not {max_items!r}")
        first = await self.receive()
        batch = [first]
        take = self._buffer.take
        while max_items is None or len(batch) < max_items:
            item = take()
            if item is None:
                break
            batch.append(item)
        return batch

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Item:
        try:
            return await self.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
