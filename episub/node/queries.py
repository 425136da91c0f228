"""Asking other nodes: their view of a topic (GETVIEW), what they hold (GETHELD, page after
page) and their topics (GETTOPICS); and reading this node's own view. Owns the waits: one
answer serves every caller waiting for the same (topic, peer)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from episub.net.peer_id import PeerIdError, parse_peer_id
from episub.net.runtime import Runtime
from episub.proto.events import (
    AskHeld,
    AskTopics,
    AskView,
    HeldReport,
    InEvent,
    TopicsReport,
    ViewReport,
)
from episub.proto.messages import MAX_HELD_SPANS, GetHeld, Held, HeldSpan, LinkKind, View
from episub.proto.node import NodeState
from episub.records import NeighborLink

__all__ = ["HELD_MAX_PAGES", "VIEW_TIMEOUT", "Queries", "neighbors"]

VIEW_TIMEOUT = 2.0  # guess: a dial plus a round trip on a LAN, with room; view_of's wait
HELD_MAX_PAGES = 400  # pages one held_by follows: 102,400 publishers = max_publishers


def neighbors(state: NodeState, topic: str) -> list[NeighborLink]:
    """The topic's active view: near links first, then random ones, by peer id."""
    eager = set(state.eager_peers(topic))
    out = []
    for peer, kind in state.active_view(topic).items():
        try:
            address = str(parse_peer_id(peer))
        except PeerIdError:
            address = "?"
        rtt = state.rtt(peer)
        out.append(
            NeighborLink(
                peer_id=peer,  # type: ignore[arg-type]
                address=address,
                kind="near" if kind is LinkKind.NEAR else "rand",
                role="eager" if peer in eager else "lazy",
                rtt_ms=None if rtt is None else rtt * 1000.0,
            )
        )
    return sorted(out, key=lambda n: (n.kind != "near", n.peer_id))


class Queries:
    """The calls waiting for a peer's answer, and the answers the core reports."""

    def __init__(self) -> None:
        # view_of() calls waiting for a VIEW, per (topic, peer): one answer serves them all.
        self._view_waiters: dict[tuple[str, bytes], list[_ViewWaiter]] = {}
        # held_by() and topics_of() calls waiting for their answer, by nonce / by peer.
        self._held_waiters: dict[int, _HeldWaiter] = {}
        self._held_nonces = itertools.count(1)
        self._topics_waiters: dict[bytes, list[_TopicsWaiter]] = {}

    # -- answers, from the node's event handler ---------------------------------------------

    def on_view(self, event: ViewReport) -> None:
        for waiter in self._view_waiters.pop((event.topic, event.peer), ()):
            waiter.view = event.view
            waiter.arrived.set()

    def on_held(self, event: HeldReport) -> None:
        held_waiter = self._held_waiters.get(event.held.nonce)
        if held_waiter is not None and held_waiter.peer == event.peer:
            held_waiter.held = event.held
            held_waiter.arrived.set()

    def on_topics(self, event: TopicsReport) -> None:
        for topics_waiter in self._topics_waiters.pop(event.peer, ()):
            topics_waiter.topics = event.topics
            topics_waiter.arrived.set()

    # -- asks -------------------------------------------------------------------------------

    async def view_of(
        self, runtime: Runtime, topic: str, peer_id: bytes, timeout: float
    ) -> View | None:
        if peer_id == runtime.me:
            await trio.lowlevel.checkpoint()
            return runtime.state.view(topic)
        waiter = _ViewWaiter(trio.Event())
        ask = AskView(topic, peer_id)
        await _ask_once(runtime, self._view_waiters, (topic, peer_id), waiter, ask, timeout)
        return waiter.view

    async def held_by(
        self,
        runtime: Runtime,
        topic: str,
        peer_id: bytes,
        spans: tuple[HeldSpan, ...],
        since_ms: int,
        timeout: float,
        own_page: Callable[[str, GetHeld], Held],
    ) -> list[HeldSpan] | None:
        """Page after page of `peer_id`'s holdings; `own_page` answers for this node."""
        if len(spans) > MAX_HELD_SPANS:
            raise ValueError(f"at most {MAX_HELD_SPANS} spans per ask, not {len(spans)}")
        out: list[HeldSpan] = []
        after = b""
        for _ in range(HELD_MAX_PAGES):
            nonce = next(self._held_nonces)
            query = GetHeld(nonce=nonce, spans=spans, after=after, since_ms=since_ms)
            if peer_id == runtime.me:
                await trio.lowlevel.checkpoint()
                page: Held | None = own_page(topic, query)
            else:
                page = await self._ask_held(runtime, topic, peer_id, query, timeout)
            if page is None:
                return None
            out += page.spans
            if not page.more or not page.spans:
                return out
            after = page.spans[-1].publisher  # type: ignore[assignment]
        return out

    async def _ask_held(
        self, runtime: Runtime, topic: str, peer_id: bytes, query: GetHeld, timeout: float
    ) -> Held | None:
        waiter = _HeldWaiter(peer_id, trio.Event())
        self._held_waiters[query.nonce] = waiter
        try:
            runtime.input(AskHeld(topic, peer_id, query))
            with trio.move_on_after(timeout):
                await waiter.arrived.wait()
        finally:
            del self._held_waiters[query.nonce]
        return waiter.held

    async def topics_of(self, runtime: Runtime, peer_id: bytes, timeout: float) -> list[str] | None:
        if peer_id == runtime.me:
            await trio.lowlevel.checkpoint()
            return runtime.state.topics()
        waiter = _TopicsWaiter(trio.Event())
        ask = AskTopics(peer_id)
        await _ask_once(runtime, self._topics_waiters, peer_id, waiter, ask, timeout)
        return None if waiter.topics is None else list(waiter.topics)


class _Waiter(Protocol):
    arrived: trio.Event


async def _ask_once(
    runtime: Runtime,
    table: dict[Any, list[Any]],
    key: Hashable,
    waiter: _Waiter,
    ask: InEvent,
    timeout: float,
) -> None:
    """Wait up to `timeout` for the answer to `ask`, asking only if no call waits for the
    same answer already (its answer serves every waiter of `key`)."""
    first = key not in table
    table.setdefault(key, []).append(waiter)
    try:
        if first:
            runtime.input(ask)
        with trio.move_on_after(timeout):
            await waiter.arrived.wait()
    finally:
        waiters = table.get(key)
        if waiters is not None and waiter in waiters:
            waiters.remove(waiter)
            if not waiters:
                del table[key]


@dataclass(slots=True)
class _ViewWaiter:
    arrived: trio.Event
    view: View | None = None


@dataclass(slots=True)
class _HeldWaiter:
    peer: bytes  # the one asked: an answer from anyone else is not this one's
    arrived: trio.Event
    held: Held | None = None


@dataclass(slots=True)
class _TopicsWaiter:
    arrived: trio.Event
    topics: tuple[str, ...] | None = None
