"""Per-publisher offsets of one topic, as the agent's `offsets(topic)` reports them.

Spark's `latestOffset` needs, per publisher, the last sequence number this node holds and
the first one it can still replay. `Node` answers range reads (`retained`) but has no query
for "which publishers, up to where", so the agent keeps this ledger itself: it subscribes
to every topic it joins and records each message's (publisher, seq) here. The first
retained seq is then found by probing `retained` upward from the last one found, in
doubling windows: retention evicts the oldest first, and a publisher's messages arrive in
sequence order, so what is gone of a publisher is a prefix of its stream.

Plain data, no I/O: the server feeds it items and passes `retained` in.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

from episub.subscription import Item, Lagged, Message

__all__ = ["MAX_LEDGER_PUBLISHERS", "OffsetLedger", "Retained"]

# = BroadcastConfig.max_publishers, the core's own bound on per-publisher state per topic.
MAX_LEDGER_PUBLISHERS = 100_000

Retained = Callable[[str, bytes, int, int], Sequence[Message]]


class OffsetLedger:
    """publisher -> [first seq that may still be retained, last seq delivered], one topic."""

    def __init__(self, topic: str, max_publishers: int = MAX_LEDGER_PUBLISHERS) -> None:
        if max_publishers < 1:
            raise ValueError(f"max_publishers must be >= 1, not {max_publishers!r}")
        self.topic = topic
        self.max_publishers = max_publishers
        # Least recently delivered first, so the bound forgets the quietest publisher.
        self._streams: OrderedDict[bytes, list[int]] = OrderedDict()
        self.lagged = 0  # items the ledger's subscription dropped (see `record`)
        self.forgotten = 0  # publishers dropped by the bound

    def __len__(self) -> int:
        return len(self._streams)

    def record(self, item: Item) -> None:
        """Take one subscription item. Lost ranges need nothing: offsets count what is held.

        A Lagged item means messages went by unseen; a later message of the same publisher
        still moves its last seq on, and a publisher first seen mid-stream is probed from
        seq 0, so the ledger heals as soon as each publisher sends again.
        """
        if isinstance(item, Lagged):
            self.lagged += item.count
            return
        if not isinstance(item, Message):
            return
        stream = self._streams.get(item.publisher)
        if stream is None:
            # Probe from 0, not from this seq: the ledger may have joined (or lagged) late,
            # and retention may hold earlier messages of this publisher (delivered by repair).
            self._streams[item.publisher] = [0, item.seq]
            if len(self._streams) > self.max_publishers:
                self._streams.popitem(last=False)
                self.forgotten += 1
            return
        stream[1] = max(stream[1], item.seq)
        self._streams.move_to_end(item.publisher)

    def offsets(self, retained: Retained) -> dict[bytes, tuple[int, int]]:
        """publisher -> (first retained seq, last seq); first > last when nothing is held."""
        out = {}
        for publisher, stream in self._streams.items():
            first, last = stream
            stream[0] = first = _first_retained(retained, self.topic, publisher, first, last)
            out[publisher] = (first, last)
        return out


def _first_retained(retained: Retained, topic: str, publisher: bytes, low: int, last: int) -> int:
    """The lowest retained seq in low..last, or last + 1 when there is none."""
    window = 1
    while low <= last:
        high = min(last, low + window - 1)
        found = retained(topic, publisher, low, high)
        if found:
            return found[0].seq
        low = high + 1
        window *= 2
    return last + 1
