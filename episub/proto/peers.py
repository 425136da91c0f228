"""What the core knows about peers regardless of topic: smoothed RTTs, and the randomness
helpers every machine uses.

Randomness comes in as an `Rng` (a seeded `random.Random` fits) and is only ever applied
to lists, never to sets or dict views whose order could vary between processes, so a
seed fixes every decision.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol, TypeVar

from episub.proto.messages import PeerId

T = TypeVar("T")


class Rng(Protocol):
    """What the core needs of a random number generator (a `random.Random` fits)."""

    def random(self) -> float: ...

    def randrange(self, stop: int, /) -> int: ...

    def getrandbits(self, k: int, /) -> int: ...


def choice(rng: Rng, items: Sequence[T]) -> T:
    return items[rng.randrange(len(items))]


def sample(rng: Rng, items: Sequence[T], k: int) -> list[T]:
    """k distinct items in random order (all of them, shuffled, if there are fewer)."""
    pool = list(items)
    k = min(k, len(pool))
    for i in range(k):
        j = i + rng.randrange(len(pool) - i)
        pool[i], pool[j] = pool[j], pool[i]
    return pool[:k]


def jittered(rng: Rng, period: float, jitter: float) -> float:
    """period +- jitter*period, so that periodic work of many nodes does not line up."""
    return period * (1.0 + jitter * (2.0 * rng.random() - 1.0))


class RttTable:
    """Smoothed RTT per peer (RFC 6298's SRTT), shared by all topics of a node.

    Bounded: the least recently updated entries go first past `max_entries`.
    """

    def __init__(self, *, smoothing: float, max_entries: int = 8192) -> None:
        self._smoothing = smoothing
        self._max_entries = max_entries
        self._srtt: OrderedDict[PeerId, float] = OrderedDict()

    def sample(self, peer: PeerId, rtt: float) -> float:
        old = self._srtt.pop(peer, None)
        new = rtt if old is None else old + self._smoothing * (rtt - old)
        self._srtt[peer] = new
        if len(self._srtt) > self._max_entries:
            self._srtt.popitem(last=False)
        return new

    def get(self, peer: PeerId) -> float | None:
        return self._srtt.get(peer)

    def forget(self, peer: PeerId) -> None:
        self._srtt.pop(peer, None)

    def __len__(self) -> int:
        return len(self._srtt)
