"""Slots for inbound handshakes in progress: an outsider cannot starve honest joiners.

Before its handshake a connection is a stranger's: it holds a slot (a task, a socket, a
few hundred bytes) for at most the handshake timeout. A client without the key that opens
connections and never finishes them kept all 64 slots full with ~11 connections a second,
and every honest joiner was refused. The rules:

- **A newcomer is never refused for lack of room.** When every slot is taken, the oldest
  handshake of the source holding the most slots is cut to make room (the SYN cache's
  "drop the oldest", made fair): a source of connections that never finish only ever
  evicts its own, and an honest joiner from another address holds one slot, which is never
  the most while an attack is on. A source is an IPv4 address or an IPv6 /64 (one host
  commonly holds a whole /64).
- **Under pressure the deadline shrinks.** While at least half the slots are taken, every
  handshake in progress must finish within `pressure_timeout` of its start instead of the
  handshake timeout; an honest one takes a round trip or two.

The class keeps the books and sets each handshake's cancel scope deadline; the caller runs
the handshake inside that scope, and reads `evicted` to tell an eviction from a timeout.
Times are trio's clock, passed in.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

import trio

__all__ = ["MAX_PENDING_HANDSHAKES", "PRESSURE_TIMEOUT", "HandshakeSlots", "Pending", "source_of"]

MAX_PENDING_HANDSHAKES = 64  # guess: unauthenticated inbound connections held at once
# An honest handshake is a round trip plus a few ms of CPU at each end; 1 s leaves room
# for a slow WAN link or a loaded host, and makes a slot 5x dearer to hold than 5 s did.
PRESSURE_TIMEOUT = 1.0  # guess


def source_of(host: str) -> str:
    """Whose connection it is, for fairness: the IPv4 address, or the IPv6 /64."""
    try:
        address = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


@dataclass(eq=False, slots=True)
class Pending:
    """One inbound handshake in progress: run it inside `scope`."""

    source: str
    started: float
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    evicted: bool = False


class HandshakeSlots:
    def __init__(
        self,
        *,
        timeout: float,
        capacity: int = MAX_PENDING_HANDSHAKES,
        pressure_timeout: float = PRESSURE_TIMEOUT,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, not {capacity!r}")
        self._timeout = timeout
        self._capacity = capacity
        self._pressure_timeout = min(pressure_timeout, timeout)
        self._pending: dict[Pending, None] = {}  # oldest first
        self._by_source: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._pending)

    @property
    def under_pressure(self) -> bool:
        return 2 * len(self._pending) >= self._capacity

    def open(self, source: str, now: float) -> Pending:
        """A slot for a new handshake from `source`; evicts another when all are taken."""
        if len(self._pending) >= self._capacity:
            self._evict()
        pending = Pending(source, now)
        self._pending[pending] = None
        self._by_source[source] = self._by_source.get(source, 0) + 1
        if self.under_pressure:
            for each in self._pending:
                self._set_deadline(each)
        else:
            self._set_deadline(pending)
        return pending

    def close(self, pending: Pending) -> None:
        """The handshake ended, however it ended (a second call does nothing)."""
        if pending not in self._pending:
            return
        del self._pending[pending]
        count = self._by_source[pending.source] - 1
        if count:
            self._by_source[pending.source] = count
        else:
            del self._by_source[pending.source]

    def _set_deadline(self, pending: Pending) -> None:
        timeout = self._pressure_timeout if self.under_pressure else self._timeout
        pending.scope.deadline = min(pending.scope.deadline, pending.started + timeout)

    def _evict(self) -> None:
        heaviest = max(self._by_source.values())
        # The first in insertion order is the oldest of its source.
        victim = next(p for p in self._pending if self._by_source[p.source] == heaviest)
        victim.evicted = True
        victim.scope.cancel()
        self.close(victim)
