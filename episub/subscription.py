"""What a subscriber receives, and the bounded buffer it receives it from.

A subscriber never blocks the node and never loses silently. The node offers each item
without waiting; when a subscription's buffer is full the item is dropped and counted,
and the subscriber gets `Lagged(count)` at the place in the stream where items went
missing, before the next item it receives (or as soon as it has drained the buffer).
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING

import trio

from episub.proto.errors import LocalProtocolError
from episub.proto.messages import check_topic_name
from episub.records import Delivery, Item, LagBuffer, Lagged, Lost

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Delivery", "Item", "LagBuffer", "Lagged", "Lost", "Subscription"]


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

    def offer(self, item: Delivery | Lost) -> None:
        """Called by the node, never blocks: queue `item`, or drop and count it."""
        if self._closed:
            return
        self._buffer.put(item)
        self._wake()

    def offer_many(self, items: list[Delivery | Lost]) -> None:
        """`offer` each of `items`, in order, waking the subscriber once."""
        if self._closed:
            return
        self._buffer.put_many(items)
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
        return [first, *self._buffer.take_many(None if max_items is None else max_items - 1)]

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Item:
        try:
            return await self.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
