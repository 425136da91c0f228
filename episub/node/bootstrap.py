"""Bootstrap racing: a topic's bootstrap addresses dialled at once (trio's open_tcp_stream
does the same with addresses of one host); once one answers, the others get
BOOTSTRAP_GRACE to answer as well, then are cancelled. A topic left with no neighbour and
no passive peer goes back to its addresses: at each of the core's recovery attempts
(`Isolated`, with backoff) they are dialled again and the ids they answer with now (a
contact that restarted has a new one) are handed to the core (`RefreshContacts`).

A node started together with its bootstrap nodes (`episub node ... &` three times, a
service manager starting a fleet) may dial them before they listen: `patiently` tries a
join again with backoff for a bounded time instead of failing at the first refusal."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

import trio

from episub.net.handshake import HandshakeError
from episub.net.peer_id import Address
from episub.net.runtime import Runtime
from episub.proto.events import RefreshContacts

__all__ = [
    "BOOTSTRAP_GRACE",
    "BOOTSTRAP_PATIENCE",
    "BootstrapError",
    "Bootstraps",
    "patiently",
    "reach",
]

log = logging.getLogger(__name__)

# After the first bootstrap contact answers, how long the others may still answer.
BOOTSTRAP_GRACE = 0.25  # trio's happy_eyeballs_delay default: "is the next one coming?"
# How long a node started with bootstrap addresses keeps trying them before it gives up
# (`episub node --bootstrap-timeout`). Guess: room for nodes started together on a loaded
# machine, or a bootstrap node being restarted, yet short enough that a wrong address is
# reported while someone is still looking.
BOOTSTRAP_PATIENCE = 30.0
# Backoff between those tries: the first soon (a node started a moment later), then
# doubling up to the cap, so a node waiting for a long-absent peer dials it every few s.
_RETRY_FIRST = 0.1
_RETRY_CAP = 2.0

_T = TypeVar("_T")


class BootstrapError(ConnectionError):
    """No bootstrap address could be reached; `failures` maps each address to its error."""

    def __init__(self, failures: Mapping[str, BaseException]) -> None:
        self.failures = dict(failures)
        detail = "; ".join(f"{address}: {error}" for address, error in self.failures.items())
        super().__init__(f"could not reach any bootstrap address ({detail})")

    @property
    def unanswered(self) -> bool:
        """Every address failed to connect (refused, unreachable, timed out): maybe not
        listening yet. False when one answered and refused us (a HandshakeError: another
        key, signing setting or version), which no retry mends."""
        return all(isinstance(error, OSError) for error in self.failures.values())


async def reach(runtime: Runtime, addresses: list[Address]) -> list[bytes]:
    """The peer ids of the addresses that answered (in the order given); BootstrapError
    with every failure when none did."""
    found: dict[Address, bytes] = {}
    failures: dict[str, BaseException] = {}
    remaining = len(addresses)
    async with trio.open_nursery() as nursery:

        async def grace() -> None:
            await trio.sleep(BOOTSTRAP_GRACE)
            nursery.cancel_scope.cancel()

        async def attempt(address: Address) -> None:
            nonlocal remaining
            try:
                found[address] = await runtime.connect(address)
                if len(found) == 1:
                    nursery.start_soon(grace)
            except (OSError, HandshakeError) as exc:
                failures[str(address)] = exc
            finally:
                remaining -= 1
                if remaining == 0:
                    nursery.cancel_scope.cancel()

        for address in addresses:
            nursery.start_soon(attempt, address)
    if not found:
        raise BootstrapError(failures)
    return [found[a] for a in addresses if a in found]


async def patiently(
    attempt: Callable[[], Awaitable[_T]],
    within: float,
    on_retry: Callable[[BootstrapError, float], None],
) -> _T:
    """`attempt()` (a join that dials bootstrap addresses), tried again with backoff while it
    raises a BootstrapError whose addresses did not answer, for up to `within` seconds (0:
    once); `on_retry(error, left)` is called before each wait. The last BootstrapError is
    raised when the time is up, or at once when an address answered and refused us."""
    deadline = trio.current_time() + within
    delay = _RETRY_FIRST
    while True:
        try:
            return await attempt()
        except BootstrapError as exc:
            left = deadline - trio.current_time()
            if left <= 0 or not exc.unanswered:
                raise
            on_retry(exc, left)
            await trio.sleep(min(delay, left))
            delay = min(delay * 2, _RETRY_CAP)


class Bootstraps:
    """Per joined topic: its bootstrap addresses, whether they are being dialled again
    now, and the join() waiting for the topic's first neighbour (the event, and who)."""

    def __init__(self) -> None:
        self._addresses: dict[str, list[Address]] = {}
        self._refreshing: set[str] = set()
        self._first_neighbor: dict[str, tuple[trio.Event, list[bytes]]] = {}

    def joining(self, topic: str) -> tuple[trio.Event, list[bytes]]:
        waiting = self._first_neighbor[topic] = (trio.Event(), [])
        return waiting

    def joined(self, topic: str, addresses: list[Address]) -> None:
        self._addresses[topic] = addresses

    def left(self, topic: str) -> None:
        self._addresses.pop(topic, None)

    def neighbor_up(self, topic: str, peer: bytes) -> None:
        waiting = self._first_neighbor.get(topic)
        if waiting is not None and not waiting[0].is_set():
            waiting[1].append(peer)
            waiting[0].set()

    def isolated(
        self, topic: str, running: Callable[[], Runtime], nursery: trio.Nursery | None
    ) -> None:
        """The topic has no neighbour left: dial its bootstrap addresses again."""
        addresses = self._addresses.get(topic)
        if addresses and topic not in self._refreshing and nursery is not None:
            self._refreshing.add(topic)
            nursery.start_soon(self._refresh_contacts, topic, addresses, running)

    async def _refresh_contacts(
        self, topic: str, addresses: list[Address], running: Callable[[], Runtime]
    ) -> None:
        """Dial a topic's bootstrap addresses again and hand the core the ids they answer
        with now; one at a time per topic, the core's backoff paces the attempts."""
        try:
            runtime = running()
            try:
                contacts = await reach(runtime, addresses)
            except BootstrapError as exc:
                log.info("topic %r has no neighbour; %s", topic, exc)
                return
            if topic in runtime.state.topics():
                runtime.input(RefreshContacts(topic, tuple(dict.fromkeys(contacts))))
        finally:
            self._refreshing.discard(topic)
