"""Fan-out: a topic's delivered items go to each of its subscriptions as one batch, and
to its listeners one by one. Owns who subscribes and listens, and the listeners' errors."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from episub.proto.messages import check_topic_name
from episub.records import Delivery, Lost
from episub.subscription import Subscription

__all__ = ["Fanout", "Listener"]

log = logging.getLogger(__name__)

Listener = Callable[[Delivery | Lost], None]


class Fanout:
    """Subscriptions and listeners per topic. The node's event handler reads
    `subscriptions` and `listeners` directly (a dict lookup per delivered message)."""

    def __init__(self) -> None:
        self.subscriptions: dict[str, list[Subscription]] = {}
        self.listeners: dict[str, list[Listener]] = {}
        self.listener_errors = 0

    def add(self, sub: Subscription) -> None:
        self.subscriptions.setdefault(sub.topic, []).append(sub)

    def remove(self, sub: Subscription) -> None:
        subs = self.subscriptions.get(sub.topic, [])
        if sub in subs:
            subs.remove(sub)
        if not subs:
            self.subscriptions.pop(sub.topic, None)

    @contextmanager
    def listen(self, topic: str, callback: Listener) -> Iterator[None]:
        check_topic_name(topic)
        listeners = self.listeners.setdefault(topic, [])
        listeners.append(callback)
        try:
            yield
        finally:
            listeners.remove(callback)
            if not listeners:
                self.listeners.pop(topic, None)

    def deliver(self, batches: dict[str, list[Delivery | Lost]]) -> None:
        """Each topic's items of one core input, in order."""
        for topic, items in batches.items():
            for sub in self.subscriptions.get(topic, ()):
                sub.offer_many(items)
            if topic in self.listeners:
                for item in items:
                    self._tell_listeners(topic, item)

    def _tell_listeners(self, topic: str, item: Delivery | Lost) -> None:
        for callback in self.listeners.get(topic, ()):
            try:
                callback(item)
            except Exception:
                self.listener_errors += 1
                log.exception("listener %r of %r failed on %r", callback, topic, item)

    def close(self) -> None:
        """The node stopped: every subscription ends after what it buffered."""
        for subs in self.subscriptions.values():
            for sub in subs:
                sub.close()

    def stats(self) -> dict[str, int]:
        subs = [s for group in self.subscriptions.values() for s in group]
        return {
            "subscriptions": len(subs),
            "subscriber_dropped": sum(s.dropped for s in subs),
            "subscribers_lagged": sum(1 for s in subs if s.dropped),
            "listeners": sum(len(group) for group in self.listeners.values()),
            "listener_errors": self.listener_errors,
        }
