"""NodeState: the sans-IO core of one episub node, many topics over one peer table.

The one way in is `handle(event, now)`; it returns the outputs to carry out, in order.
The node routes each event to its topic, answers node-level queries, answers messages
for topics it is not in (so that peers can clean their views), and tells the runtime
when a connection is no longer used by any topic (`ClosePeer`).

It owns the message store (store.py), one for all its topics, handed to each topic as
the RTT table is: each topic's broadcast puts what it takes in there, and answers GRAFTs
and PULLs from it; a GETHELD is answered from it, joined or not (topics joined with
`retain=False` offer no history).

Timer tokens are `(topic, generation, name)`: leaving and re-joining a topic starts a
new generation, so timers of the old one find nothing when they fire.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import assert_never

from episub.proto import messages as m
from episub.proto.config import NodeConfig
from episub.proto.errors import LocalProtocolError
from episub.proto.events import (
    AnswersCancelled,
    AnswersDrained,
    AskHeld,
    AskTopics,
    AskView,
    ClosePeer,
    ConnectionLost,
    Fetch,
    HeldQueried,
    HeldReport,
    InEvent,
    JoinTopic,
    LeaveTopic,
    NeighborDown,
    OutEvent,
    PeerMisbehaved,
    Publish,
    PublishMany,
    Received,
    ReceivedMany,
    RefreshContacts,
    RttMeasured,
    Send,
    TimerFired,
    TopicsReport,
    ViewReport,
)
from episub.proto.messages import LinkKind, PeerId
from episub.proto.peers import Rng, RttTable
from episub.proto.signing import Signer
from episub.proto.store import MessageStore, RetentionConfig
from episub.proto.tables import OwnStream
from episub.proto.topic import Topic

__all__ = ["NodeState"]


def _check_topic(topic: str) -> None:
    try:
        m.check_topic_name(topic)
    except ValueError as exc:
        raise LocalProtocolError(str(exc)) from None


class NodeState:
    def __init__(
        self,
        peer_id: PeerId,
        config: NodeConfig,
        rng: Rng,
        *,
        signer: Signer | None = None,
        retention: RetentionConfig | None = None,
    ) -> None:
        """`signer`: sign what we publish and verify what we receive (signing.py); our id
        must be bound to it. `retention`: the store's bounds (default RetentionConfig())."""
        if signer is not None and not signer.binds(peer_id):
            raise LocalProtocolError(f"peer id {peer_id!r} is not bound to {signer!r}")
        self.me = peer_id
        self.signer = signer
        self.config = config
        self.rng = rng
        self.rtts = RttTable(
            smoothing=config.membership.rtt_smoothing,
            variation_gain=config.membership.rtt_variation_gain,
        )
        # What this node has seen and holds, by place, for its topics and its application
        # (store.py): one store, handed to each topic.
        self.store = MessageStore(retention or RetentionConfig())
        self._topics: dict[str, Topic] = {}
        self._generations: dict[str, int] = {}
        self._next_generation = 0
        # Our own stream of each topic ever joined, which goes on where it stopped when we
        # leave and join again. Topics are the application's names, not a peer's, so this
        # grows only as the application asks.
        self._own_streams: dict[str, OwnStream] = {}
        self.misbehaved = 0

    def handle(
        self, event: InEvent, now: float, out: list[OutEvent] | None = None
    ) -> list[OutEvent]:
        """The one way in. Returns what the caller must carry out, in order: appended to
        `out` if given, as they arise (so a caller that contains a failure of ours still
        has what the core output before it, for a read the items before the failing one)."""
        if out is None:
            out = []
        start = len(out)
        try:
            self._dispatch(event, now, out)
        finally:
            # What went out before a failure was carried out: it is stored all the same.
            self._outputs_done(out, start, now)
        return out

    def _dispatch(self, event: InEvent, now: float, out: list[OutEvent]) -> None:
        match event:
            case Received(peer=peer, topic=topic, message=message):
                self._on_received(peer, topic, message, now, out)
            case ReceivedMany(peer=peer, items=items):
                self._on_read(peer, items, now, out)
            case TimerFired(token=token):
                self._on_timer(token, now, out)
            case ConnectionLost(peer=peer):
                for t in self._topics.values():
                    t.on_connection_lost(peer, now, out)
            case AnswersDrained(peer=peer):
                for t in self._topics.values():
                    t.broadcast.answers_drained(peer, now, out)
            case AnswersCancelled(peer=peer):
                for t in self._topics.values():
                    t.broadcast.forget_answers(peer)
            case RttMeasured(peer=peer, rtt=rtt):
                if not 0.0 <= rtt < math.inf:
                    raise LocalProtocolError(f"an RTT must be finite and >= 0, not {rtt!r}")
                self.rtts.sample(peer, rtt)
            case JoinTopic(topic=topic, bootstrap=bootstrap, retain=retain):
                self._join(topic, bootstrap, retain, now, out)
            case LeaveTopic(topic=topic):
                t = self._topic_or_raise(topic)
                t.leave(now, out)
                del self._topics[topic]
            case Fetch(topic=topic, peer=peer, publisher=publisher, first_seq=first, last_seq=last):
                self._topic_or_raise(topic).broadcast.fetch(peer, publisher, first, last, out)
            case Publish(
                topic=topic,
                payload=payload,
                key=key,
                headers=headers,
                stream=stream,
                timestamp_ms=stamp,
            ):
                self._topic_or_raise(topic).publish(payload, key, headers, now, out, stream, stamp)
            case PublishMany(topic=topic, records=records):
                self._topic_or_raise(topic).publish_many(records, now, out)
            case RefreshContacts(topic=topic, bootstrap=bootstrap):
                # The topic may have been left while the runtime dialled: nothing to do.
                t = self._topics.get(topic)
                if t is not None:
                    t.membership.refresh_contacts(tuple(bootstrap), out)
            case AskView(topic=topic, peer=peer):
                _check_topic(topic)
                out.append(Send(peer, topic, m.GetView()))
            case AskHeld(topic=topic, peer=peer, query=query):
                _check_topic(topic)
                out.append(Send(peer, topic, query))
            case AskTopics(peer=peer):
                out.append(Send(peer, None, m.GetTopics()))
            case _:
                raise LocalProtocolError(f"not an input event: {event!r}")

    def handle_received(
        self,
        peer: PeerId,
        items: list[tuple[str | None, m.PeerMessage]],
        now: float,
        out: list[OutEvent] | None = None,
    ) -> list[OutEvent]:
        """`handle(ReceivedMany(peer, items), now, out)`, the runtime's every read (the
        items of its frames from `peer`, as one input), without the event to match."""
        if out is None:
            out = []
        start = len(out)
        try:
            self._on_read(peer, items, now, out)
        finally:
            self._outputs_done(out, start, now)
        return out

    def _on_read(
        self,
        peer: PeerId,
        items: list[tuple[str | None, m.PeerMessage]],
        now: float,
        out: list[OutEvent],
    ) -> None:
        on_received = self._on_received
        for topic, message in items:
            on_received(peer, topic, message, now, out)

    # -- commands -----------------------------------------------------------------------

    def _join(
        self,
        topic: str,
        bootstrap: tuple[PeerId, ...],
        retain: bool,
        now: float,
        out: list[OutEvent],
    ) -> None:
        try:
            m.check_topic_name(topic)
        except ValueError as exc:
            raise LocalProtocolError(str(exc)) from None
        if topic in self._topics:
            raise LocalProtocolError(f"already joined topic {topic!r}")
        if len(self._topics) >= self.config.max_topics:
            raise LocalProtocolError(f"a node joins at most {self.config.max_topics} topics")
        generation = self._next_generation
        self._next_generation += 1
        self._generations[topic] = generation
        t = Topic(
            name=topic,
            me=self.me,
            config=self.config.for_topic(topic),
            rng=self.rng,
            rtts=self.rtts,
            timer_prefix=(topic, generation),
            signer=self.signer,
            store=self.store,
            retain=retain,
            own_stream=self._own_streams.setdefault(topic, OwnStream()),
        )
        self._topics[topic] = t
        self.store.offer_history(topic, retain)
        t.join(tuple(bootstrap), now, out)

    def _topic_or_raise(self, topic: str) -> Topic:
        t = self._topics.get(topic)
        if t is None:
            raise LocalProtocolError(f"not joined to topic {topic!r}")
        return t

    # -- inputs -------------------------------------------------------------------------

    def _on_received(
        self,
        peer: PeerId,
        topic: str | None,
        message: m.PeerMessage,
        now: float,
        out: list[OutEvent],
    ) -> None:
        if topic is None:
            match message:
                case m.GetTopics():
                    names = tuple(self._topics)[: m.MAX_TOPICS_PER_MESSAGE]
                    out.append(Send(peer, None, m.Topics(topics=names)))
                case m.Topics(topics=topics):
                    out.append(TopicsReport(peer, topics))
                case _:
                    if isinstance(message, m.NODE_MESSAGES):  # a bug of ours, not the peer's
                        raise AssertionError(f"node-level {message!r} has no case here")
                    self._misbehaved(peer, f"{type(message).__name__} needs a topic", out)
            return
        if isinstance(message, m.NODE_MESSAGES):
            self._misbehaved(
                peer, f"{type(message).__name__} is node-level, got topic {topic!r}", out
            )
            return
        if type(message) is m.GetView:
            # Answered from the views alone, joined or not: one bounded message per ask.
            out.append(Send(peer, topic, self.view(topic)))
            return
        if type(message) is m.View:
            out.append(ViewReport(topic, peer, message))
            return
        if type(message) is m.GetHeld:
            # Answered from the store, joined or not: one bounded page per ask.
            held = self.store.held_page(topic, message, now)
            out.append(Send(peer, topic, held, answer=True))
            out.append(HeldQueried(topic, peer))
            return
        if type(message) is m.Held:
            out.append(HeldReport(topic, peer, message))
            return
        t = self._topics.get(topic)
        if t is None:
            self._not_subscribed(peer, topic, message, out)
            return
        t.on_message(peer, message, now, out)

    def _not_subscribed(
        self, peer: PeerId, topic: str, message: m.PeerMessage, out: list[OutEvent]
    ) -> None:
        """Answer so the asker can drop us from its views of a topic we are not in."""
        match message:
            case m.Ping(nonce=nonce):
                out.append(Send(peer, topic, m.Pong(nonce=nonce, subscribed=False)))
            case m.GetNodes():
                out.append(Send(peer, topic, m.Nodes(peers=())))
            case m.Join() | m.Neighbor(op=m.NeighborOp.REQUEST) | m.Shuffle() | m.Graft():
                out.append(Send(peer, topic, m.Disconnect(alive=False)))
            case (
                m.Nodes()
                | m.ForwardJoin()
                | m.Neighbor()
                | m.Disconnect()
                | m.Leave()
                | m.ShuffleReply()
                | m.Pong()
                | m.Gossip()
                | m.IHave()
                | m.Prune()
                | m.Pull()
                | m.Heads()
                | m.History()
            ):
                pass  # answers, news or repairs of a topic we are not in: nothing to say
            case _:
                assert_never(message)  # type: ignore[arg-type]  # topic messages only here

    def _on_timer(self, token: Hashable, now: float, out: list[OutEvent]) -> None:
        if not (isinstance(token, tuple) and len(token) == 3):
            raise LocalProtocolError(f"not a timer token of ours: {token!r}")
        topic, generation, name = token
        t = self._topics.get(topic)
        if t is None or self._generations.get(topic) != generation:
            return  # a timer of a topic we left: stale, nothing to do
        t.on_timer(name, now, out)

    def _misbehaved(self, peer: PeerId, reason: str, out: list[OutEvent]) -> None:
        out.append(PeerMisbehaved(peer, reason))  # counted in _outputs_done's pass

    def _outputs_done(self, out: list[OutEvent], start: int, now: float) -> None:
        """One pass over an input's outputs from `start`: misbehaviour is counted, and
        connections no topic uses any more are released."""
        if len(out) == start:
            return
        downs = []
        for i in range(start, len(out)):
            e = out[i]
            kind = type(e)
            if kind is NeighborDown:
                downs.append(e.peer)  # type: ignore[union-attr]
            elif kind is PeerMisbehaved:
                self.misbehaved += 1
        if not downs:
            return
        released: set[PeerId] = set()
        for peer in downs:
            if peer in released or self.uses(peer):
                continue
            released.add(peer)
            out.append(ClosePeer(peer))

    def uses(self, peer: PeerId) -> bool:
        """Does any topic hold `peer` as a neighbour, or wait for it to become one?
        While it does, its connection must stay (a query: no side effects)."""
        return any(
            peer in t.membership.active or peer in t.membership.pending
            for t in self._topics.values()
        )

    def view(self, topic: str) -> m.View:
        """The active view of `topic` as GETVIEW answers it (empty when not joined)."""
        eager = set(self.eager_peers(topic))
        entries = []
        for p, kind in list(self.active_view(topic).items())[: m.MAX_PEERS_PER_MESSAGE]:
            rtt = self.rtts.get(p)
            rtt = rtt if rtt is not None and rtt < 3600.0 else None  # View's bound
            entries.append(m.ViewEntry(peer=p, kind=kind, eager=p in eager, rtt=rtt))
        passive = min(len(self.passive_view(topic)), m.MAX_PEERS_PER_MESSAGE)
        return m.View(entries=tuple(entries), passive_count=passive)

    # -- queries: no side effects ----------------------------------------------------------

    def topics(self) -> list[str]:
        return list(self._topics)

    def active_view(self, topic: str) -> dict[PeerId, LinkKind]:
        t = self._topics.get(topic)
        return {} if t is None else {p: link.kind for p, link in t.membership.active.items()}

    def passive_view(self, topic: str) -> list[PeerId]:
        t = self._topics.get(topic)
        return [] if t is None else list(t.membership.passive)

    def contacts(self, topic: str) -> list[PeerId]:
        """The nodes the topic was joined through (its bootstrap addresses' ids)."""
        t = self._topics.get(topic)
        return [] if t is None else list(t.membership.bootstrap)

    def eager_peers(self, topic: str) -> list[PeerId]:
        t = self._topics.get(topic)
        return [] if t is None else list(t.broadcast.eager)

    def lazy_peers(self, topic: str) -> list[PeerId]:
        t = self._topics.get(topic)
        return [] if t is None else list(t.broadcast.lazy)

    def rtt(self, peer: PeerId) -> float | None:
        return self.rtts.get(peer)

    def stats(self) -> dict[str, int]:
        totals: dict[str, int] = {
            "topics": len(self._topics),
            "misbehaved": self.misbehaved,
            # peers with PULL or GRAFT answers waiting for them to read the last batch
            "answer_askers": sum(len(t.broadcast.answers) for t in self._topics.values()),
        }
        for t in self._topics.values():
            for source in (t.membership.counters, t.broadcast.counters):
                for name in source.__slots__:
                    value = getattr(source, name)
                    if isinstance(value, int):
                        totals[name] = totals.get(name, 0) + value
        return totals
