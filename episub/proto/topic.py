"""One topic: HyParView membership and Plumtree broadcast composed, as iroh-gossip does.

The two machines never call each other. Membership reports NeighborUp/NeighborDown as
outputs; this class reads them off the output list and feeds them to broadcast, so the
eager/lazy sets always partition the active view.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import assert_never

from episub.proto import messages as m
from episub.proto.broadcast import Broadcast
from episub.proto.config import NodeConfig
from episub.proto.envelope import Record
from episub.proto.events import NeighborDown, NeighborUp, OutEvent
from episub.proto.membership import Membership
from episub.proto.messages import MessageId, PeerId
from episub.proto.peers import Rng, RttTable
from episub.proto.signing import Signer
from episub.proto.store import MessageStore
from episub.proto.tables import OwnStream
from episub.proto.timers import BroadcastTimer, timer_named


class Topic:
    def __init__(
        self,
        *,
        name: str,
        me: PeerId,
        config: NodeConfig,
        rng: Rng,
        rtts: RttTable,
        timer_prefix: tuple[Hashable, ...],
        signer: Signer | None = None,
        store: MessageStore | None = None,
        retain: bool = True,
        own_stream: OwnStream | None = None,
    ) -> None:
        self.name = name
        # Are this topic's messages kept in the node's store (NodeState puts them there)?
        # False for state that catches up otherwise (JoinTopic's `retain`).
        self.retain = retain
        self.membership = Membership(
            me=me,
            topic=name,
            config=config.membership,
            rng=rng,
            rtts=rtts,
            timer_prefix=timer_prefix,
        )
        self.broadcast = Broadcast(
            me=me,
            topic=name,
            config=config.broadcast,
            timer_prefix=timer_prefix,
            id_key=config.id_key,
            signer=signer,
            # Near parents are part of proximity: with it off, Plumtree as it is.
            rtts=rtts if config.membership.proximity else None,
            store=store,
            own_stream=own_stream,
        )

    def join(self, bootstrap: tuple[PeerId, ...], now: float, out: list[OutEvent]) -> None:
        self.broadcast.ordering.joined(now)
        start = len(out)
        self.membership.join(bootstrap, now, out)
        self._feed_neighbor_changes(out, start, now)

    def leave(self, now: float, out: list[OutEvent]) -> None:
        self.broadcast.ordering.close()
        start = len(out)
        self.membership.leave(now, out)
        self._feed_neighbor_changes(out, start, now, repair=False)

    def publish(
        self,
        payload: bytes,
        key: bytes | None,
        headers: tuple[tuple[str, bytes], ...],
        now: float,
        out: list[OutEvent],
        stream: tuple[PeerId, int] | None = None,
        timestamp_ms: int | None = None,
    ) -> MessageId | None:
        return self.broadcast.publish(payload, key, headers, now, out, stream, timestamp_ms)

    def publish_many(self, records: Sequence[Record], now: float, out: list[OutEvent]) -> None:
        self.broadcast.publish_many(records, now, out)

    def on_message(
        self, peer: PeerId, msg: m.TopicMessage, now: float, out: list[OutEvent]
    ) -> None:
        if isinstance(msg, m.BROADCAST_MESSAGES):
            self.broadcast.on_message(peer, msg, now, out)
        elif isinstance(msg, m.MEMBERSHIP_MESSAGES):
            start = len(out)
            self.membership.on_message(peer, msg, now, out)
            self._feed_neighbor_changes(out, start, now)
        else:
            assert_never(msg)

    def on_timer(self, name: Hashable, now: float, out: list[OutEvent]) -> None:
        """Timer `name` fired; LocalProtocolError for a name no layer sets (a bug)."""
        timer = timer_named(name)
        if isinstance(timer, BroadcastTimer):
            self.broadcast.on_timer(timer, now, out)
            return
        start = len(out)
        # Optimisation weighs a swap by the trees it touches (proximity.swap_factor).
        self.membership.proximity.stream_trees = len(self.broadcast.trees)
        self.membership.on_timer(timer, now, out)
        self._feed_neighbor_changes(out, start, now)

    def on_connection_lost(self, peer: PeerId, now: float, out: list[OutEvent]) -> None:
        self.broadcast.forget_answers(peer)
        start = len(out)
        self.membership.on_connection_lost(peer, now, out)
        self._feed_neighbor_changes(out, start, now)

    def _feed_neighbor_changes(
        self, out: list[OutEvent], start: int, now: float, *, repair: bool = True
    ) -> None:
        # Broadcast may append (eager repair GRAFTs); only the membership's slice is read.
        end = len(out)
        for i in range(start, end):
            event = out[i]
            if isinstance(event, NeighborUp):
                self.broadcast.neighbor_up(event.peer, now, out, event.kind)
            elif isinstance(event, NeighborDown):
                self.broadcast.neighbor_down(event.peer, now, out, repair=repair)
