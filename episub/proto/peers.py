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


def on_grid(now: float, period: float) -> float:
    """The delay from `now` to the next multiple of `period` (a whole period when `now` is
    on one): timers of many nodes set this way fire at the same instants of the shared
    clock, so what they send each other arrives while they are awake anyway."""
    return period - now % period


def jittered(rng: Rng, period: float, jitter: float) -> float:
    """period +- jitter*period, so that periodic work of many nodes does not line up."""
    return period * (1.0 + jitter * (2.0 * rng.random() - 1.0))


class RttTable:
    """Smoothed RTT per peer (RFC 6298's SRTT), shared by all topics of a node.

    A sample below the smoothed value is taken at once; one above it moves the value by
    `smoothing` of the difference. Queueing and a busy host's scheduling only ever add
    to a ping's time, so the lowest samples are the ones that measure distance (as
    TCP's min-RTT filters, BBR's min_rtt). With plain SRTT a first ping answered while
    33 node processes started on 2 cores put 50-100 ms on loopback links of 1-3 ms, for
    minutes (pings every 10 s move it by 1/8), and proximity swapped links on that noise
    (the config benchmark: 10-13 swaps and ~20 evictions in 4 s at 32 nodes).

    Beside it, the variation (RFC 6298's RTTVAR: the smoothed mean deviation of samples
    from the SRTT, `variation_gain` its beta), 0 until a second sample: how far apart two
    RTTs must be before they say anything about distance (`Proximity.nearer`, proximity.py).

    Bounded: the least recently updated entries go first past `max_entries`.
    """

    def __init__(
        self, *, smoothing: float, variation_gain: float = 0.25, max_entries: int = 8192
    ) -> None:
        self._smoothing = smoothing
        self._variation_gain = variation_gain
        self._max_entries = max_entries
        self._srtt: OrderedDict[PeerId, float] = OrderedDict()
        self._rttvar: dict[PeerId, float] = {}

    def sample(self, peer: PeerId, rtt: float) -> float:
        old = self._srtt.pop(peer, None)
        if old is None:
            new, var = rtt, 0.0
        else:
            var = self._rttvar.get(peer, 0.0)
            var += self._variation_gain * (abs(rtt - old) - var)
            new = rtt if rtt <= old else old + self._smoothing * (rtt - old)
        self._srtt[peer] = new
        self._rttvar[peer] = var
        if len(self._srtt) > self._max_entries:
            gone, _ = self._srtt.popitem(last=False)
            self._rttvar.pop(gone, None)
        return new

    def get(self, peer: PeerId) -> float | None:
        return self._srtt.get(peer)

    def variation(self, peer: PeerId) -> float:
        """RTTVAR of `peer` (0 with fewer than two samples or none)."""
        return self._rttvar.get(peer, 0.0)

    def forget(self, peer: PeerId) -> None:
        self._srtt.pop(peer, None)
        self._rttvar.pop(peer, None)

    def __len__(self) -> int:
        return len(self._srtt)
