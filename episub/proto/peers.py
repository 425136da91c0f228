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

# Peers' own words for their RTTs kept at once (RttTable.claim), so that a flood of
# requests from made-up ids cannot push our measurements out of the table. Guess: a few
# views' worth of requesters not yet measured.
MAX_CLAIMS = 256


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

    A peer's own word for its RTT (a NEIGHBOR request's `rtt`) is kept as a claim: it
    stands until our first sample of the peer replaces it outright, and never moves a
    measured value (`claim`); `measured` tells the two apart.

    Bounded: the least recently updated entries go first past `max_entries`; at most
    `MAX_CLAIMS` of them are claims.
    """

    def __init__(
        self, *, smoothing: float, variation_gain: float = 0.25, max_entries: int = 8192
    ) -> None:
        self._smoothing = smoothing
        self._variation_gain = variation_gain
        self._max_entries = max_entries
        self._srtt: OrderedDict[PeerId, float] = OrderedDict()
        self._rttvar: dict[PeerId, float] = {}
        self._claimed: set[PeerId] = set()  # entries that are a peer's word, not our sample

    def claim(self, peer: PeerId, rtt: float) -> None:
        """The peer's own word for its RTT to us (a NEIGHBOR request's): kept only while
        we have no sample of ours, and replaced outright by our first one. As a sample, a
        claimed 0.0 stuck, since a lower sample is taken at once and a higher one moves the
        value by 1/8."""
        if peer in self._srtt or len(self._claimed) >= MAX_CLAIMS:
            return
        self._srtt[peer] = rtt
        self._rttvar[peer] = 0.0
        self._claimed.add(peer)
        self._trim()

    def sample(self, peer: PeerId, rtt: float) -> float:
        old = self._srtt.pop(peer, None)
        if peer in self._claimed:
            self._claimed.discard(peer)
            old = None
        if old is None:
            new, var = rtt, 0.0
        else:
            var = self._rttvar.get(peer, 0.0)
            var += self._variation_gain * (abs(rtt - old) - var)
            new = rtt if rtt <= old else old + self._smoothing * (rtt - old)
        self._srtt[peer] = new
        self._rttvar[peer] = var
        self._trim()
        return new

    def _trim(self) -> None:
        if len(self._srtt) > self._max_entries:
            gone, _ = self._srtt.popitem(last=False)
            self._rttvar.pop(gone, None)
            self._claimed.discard(gone)

    def get(self, peer: PeerId) -> float | None:
        return self._srtt.get(peer)

    def variation(self, peer: PeerId) -> float:
        """RTTVAR of `peer` (0 with fewer than two samples or none)."""
        return self._rttvar.get(peer, 0.0)

    def peers(self) -> list[PeerId]:
        """Every peer with an entry, least recently updated first."""
        return list(self._srtt)

    def measured(self, peer: PeerId) -> float | None:
        """Our own smoothed RTT to `peer`: None while we only have its word."""
        return None if peer in self._claimed else self._srtt.get(peer)

    def __len__(self) -> int:
        return len(self._srtt)
