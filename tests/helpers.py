"""Builders shared by the core's unit tests (in the manner of h11's tests/helpers.py).

Every test spells out its configuration: `membership_config()` and `broadcast_config()`
set every field the tests depend on (all the fields there were when they were written),
so a tuned default in episub/proto/config.py never changes what a test means; fields
added later keep their defaults. Timer jitter is 0, so every `ScheduleTimer` delay is
exact.

Peer ids are small ints, as in the simulator; the node under test is `ME` (0) and the
topic is `TOPIC` ("t"). Time is an explicit `now`, stepped by hand; randomness is a
seeded `random.Random`.

`make_node` builds a node already joined to the topic with chosen neighbours. It gets
there through real messages (h11's tests drive the machine, never poke it):

- each active peer sends us a high-priority NEIGHBOR request, which a node below
  `max_active` always accepts, as the kind the peer asked for. The request carries the
  peer's link count (`links`, default A) and, if `rtts` has one, its RTT to us (a claim
  the node never records as a measurement);
- each passive peer reaches us as the last hop (ttl 0) of a FORWARDJOIN walk.

The one shortcut is `set_rtt`, which writes a first RTT sample into the node's shared
`RttTable` (`NodeState.rtts`, a public attribute), as a PONG would: the real way, a PING
answered by a PONG, picks its target at random. `make_node` does it for every peer in
`rtts`, active ones first.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Hashable, Iterable, Mapping

from episub.proto import messages as m
from episub.proto.broadcast import Broadcast
from episub.proto.config import BroadcastConfig, MembershipConfig, NodeConfig
from episub.proto.envelope import message_id
from episub.proto.events import InEvent, JoinTopic, OutEvent, Received, Send, TimerFired
from episub.proto.membership import Membership
from episub.proto.messages import LinkKind, PeerId
from episub.proto.node import NodeState
from episub.proto.signing import Signer
from episub.proto.store import RetentionConfig

TOPIC = "t"
ME = 0
RAND = LinkKind.RAND
NEAR = LinkKind.NEAR

# -- configuration -------------------------------------------------------------------------


def membership_config(**overrides: object) -> MembershipConfig:
    """Small views (C_rand=2, C_near=1: A=3, max_active=6), no jitter, fields explicit."""
    fields: dict[str, object] = {
        "c_rand": 2,
        "c_near": 1,
        "proximity": True,
        "hub_links": 0,
        "max_active_factor": 2.0,
        "passive_size": 8,
        "join_ttl": 4,
        "forward_join_ttl": 2,
        "shuffle_ttl": 3,
        "shuffle_active": 2,
        "shuffle_passive": 2,
        "leave_ttl": 2,
        "shuffle_interval": 30.0,
        "stabilize_interval": 2.0,
        "optimize_interval": 5.0,
        "optimize_interval_improving": 5.0,  # tests of the faster pace set it
        "ping_interval": 5.0,
        "passive_probe_interval": 1.0,
        "passive_probes_per_tick": 1,
        "passive_probes_per_tick_unmeasured": 1,  # tests of the faster pace set it
        "ping_timeout": 5.0,
        "neighbor_request_timeout": 2.0,
        "join_retry_interval": 3.0,
        "timer_jitter": 0.0,
        "alpha": 2.0,
        "swap_factor_growth": 1.0,
        "swap_factor_max": 4.0,
        "rtt_smoothing": 0.125,
        "rtt_variation_gain": 0.25,
        "left_memory": 60.0,
        "max_left_memory": 4096,
        "recent_reject_memory": 10.0,
        "max_pending_requests": 4,
        "near_candidates": 16,
        "max_shuffle_intake": 16,
        "initial_probes": 8,
    }
    fields.update(overrides)
    return MembershipConfig(**fields)  # type: ignore[arg-type]


def broadcast_config(**overrides: object) -> BroadcastConfig:
    """Every Plumtree field explicit; the ticks are round binary fractions of a second."""
    fields: dict[str, object] = {
        "ihave_interval": 0.125,
        "graft_timeout": 0.125,
        "missing_check_interval": 0.25,
        "missing_give_up_ticks": 25,
        "optimization_threshold": 7,
        "near_parent_factor": 4.0,
        "race_lazy_hops": 0,
        "race_backoff": 5.0,
        "eager_repair": False,
        "eager_repair_grafts": 2,
        "lazy_start": True,
        "hub_parent": False,
        "ihave_spread": 0.0,
        "max_missing": 1000,
        "max_announcers": 8,
        "max_ihave_ids": 1024,
        "max_graft_ids": 256,
        "gap_timeout": 1.0,
        "gap_retry_interval": 0.5,
        "gap_max_attempts": 6,
        "max_gap": 4096,
        "max_held_per_publisher": 4096,
        "max_publishers": 1000,
        "max_message_size": 1 << 16,
        # Most tests check what comes after a stream's start; the settle window has its own.
        "stream_settle": 0.0,
    }
    fields.update(overrides)
    return BroadcastConfig(**fields)  # type: ignore[arg-type]


def node_config(
    membership: MembershipConfig | None = None,
    broadcast: BroadcastConfig | None = None,
    *,
    max_topics: int = 16,
) -> NodeConfig:
    return NodeConfig(
        membership=membership if membership is not None else membership_config(),
        broadcast=broadcast if broadcast is not None else broadcast_config(),
        max_topics=max_topics,
        id_key=None,
    )


# -- events --------------------------------------------------------------------------------


def received(peer: PeerId, message: m.PeerMessage, topic: str | None = TOPIC) -> Received:
    return Received(peer, topic, message)


def send(peer: PeerId, message: m.PeerMessage, topic: str | None = TOPIC) -> Send:
    return Send(peer, topic, message)


def token(name: str, topic: str = TOPIC, generation: int = 0) -> tuple[Hashable, ...]:
    """The token of one of the node's timers: (topic, generation, name)."""
    return (topic, generation, name)


def fire(node: NodeState, name: str, now: float, topic: str = TOPIC) -> list[OutEvent]:
    """Fire the node's timer `name` for the current generation of `topic`."""
    generation = node._generations[topic]
    return node.handle(TimerFired(token(name, topic, generation)), now)


def request(
    kind: LinkKind = RAND,
    *,
    high_priority: bool = False,
    rtt: float | None = None,
    links: int = 3,
    rand: int = 0,
) -> m.Neighbor:
    return m.Neighbor(
        op=m.NeighborOp.REQUEST,
        kind=kind,
        high_priority=high_priority,
        rtt=rtt,
        active_count=links,
        rand_count=rand,
    )


def accept(kind: LinkKind = RAND, *, links: int = 3, rand: int = 0) -> m.Neighbor:
    return m.Neighbor(op=m.NeighborOp.ACCEPT, kind=kind, active_count=links, rand_count=rand)


def sends(out: Iterable[OutEvent], kind: type | None = None) -> list[Send]:
    """The Send outputs, optionally only those carrying a message of class `kind`."""
    return [e for e in out if isinstance(e, Send) and (kind is None or isinstance(e.message, kind))]


def only(out: Iterable[OutEvent], kind: type) -> Send:
    """The one Send of a message of class `kind` in `out` (fails if there are 0 or 2+)."""
    found = sends(out, kind)
    assert len(found) == 1, f"expected one {kind.__name__}, got {found!r}"
    return found[0]


# -- messages of the broadcast layer --------------------------------------------------------


def envelope(
    publisher: PeerId, seq: int, payload: bytes = b"x", timestamp_ms: int = 0
) -> m.Envelope:
    return m.Envelope(publisher=publisher, seq=seq, timestamp_ms=timestamp_ms, payload=payload)


def mid(env: m.Envelope, topic: str = TOPIC) -> bytes:
    return message_id(topic, env)


def gossip(env: m.Envelope, hops: int = 1, topic: str = TOPIC) -> m.Gossip:
    """A well-formed GOSSIP: its id is blake3 of the envelope."""
    return m.Gossip(id=message_id(topic, env), envelope=env, hops=hops)


# -- nodes ---------------------------------------------------------------------------------


def make_node(
    me: PeerId = ME,
    *,
    active: Mapping[PeerId, LinkKind] | Iterable[PeerId] = (),
    passive: Iterable[PeerId] = (),
    links: Mapping[PeerId, int] | None = None,
    rtts: Mapping[PeerId, float] | None = None,
    config: NodeConfig | None = None,
    seed: int = 0,
    topic: str = TOPIC,
    now: float = 0.0,
    signer: Signer | None = None,
    retention: RetentionConfig | None = None,
) -> NodeState:
    """A node joined to `topic` with these neighbours, built by real messages (see above).

    `active` maps peers to link kinds (a plain iterable means RAND links); `links` gives
    the link count each active peer claims (default A); `rtts` gives measured RTTs (set
    with `set_rtt`), also carried by the NEIGHBOR request of an active peer.
    All set-up outputs are discarded; the node's timers are not fired.
    """
    cfg = config if config is not None else node_config()
    node = NodeState(me, cfg, random.Random(seed), signer=signer, retention=retention)
    node.handle(JoinTopic(topic), now)
    if not isinstance(active, Mapping):
        active = dict.fromkeys(active, RAND)
    links = links or {}
    rtts = dict(rtts or {})
    a = cfg.membership.active_size
    for peer in [*(p for p in rtts if p in active), *(p for p in rtts if p not in active)]:
        set_rtt(node, peer, rtts[peer])
    for peer, kind in active.items():
        msg = request(kind, high_priority=True, rtt=rtts.get(peer), links=links.get(peer, a))
        out = node.handle(received(peer, msg, topic), now)
        assert node.active_view(topic).get(peer) is kind, out
        # A NEAR link given here is one of the node's own C_near, as if it had asked for
        # it (a near link a peer asked us for does not count against ours: proximity.py).
        membership(node, topic).active[peer].chosen = kind is NEAR
    for peer in passive:
        node.handle(received(peer, m.ForwardJoin(peer=peer, ttl=0), topic), now)
    assert node.active_view(topic) == dict(active)
    assert node.passive_view(topic) == list(passive)
    return node


def set_rtt(node: NodeState, peer: PeerId, rtt: float) -> None:
    """Give the node an RTT for `peer` (its first sample, so the SRTT is exactly `rtt`)."""
    assert node.rtt(peer) is None, "set_rtt only writes a first sample"
    node.rtts.sample(peer, rtt)


def membership(node: NodeState, topic: str = TOPIC) -> Membership:
    """The topic's membership machine, for assertions on state no query exposes."""
    return node._topics[topic].membership


def broadcast(node: NodeState, topic: str = TOPIC) -> Broadcast:
    """The topic's broadcast machine, for assertions on state no query exposes."""
    return node._topics[topic].broadcast


def make_lazy(
    node: NodeState, *peers: PeerId, now: float = 0.0, streams: tuple[PeerId, ...] = ()
) -> None:
    """Move neighbours to the lazy set the real way: each sends us a PRUNE, for these
    publishers' streams (none: for every stream, the whole link)."""
    for peer in peers:
        assert node.handle(received(peer, m.Prune(streams=streams)), now) == []
    assert all(p in node.lazy_peers(TOPIC) for p in peers)


# -- nodes wired in memory ----------------------------------------------------------------


class Network:
    """Nodes wired in memory (aioquic's client/server pairs): every Send becomes a Received
    at its peer, first sent first delivered, all at the `now` given. Sends to peers that
    are not in the network are kept in `undelivered`."""

    def __init__(self, nodes: Iterable[NodeState]) -> None:
        self.nodes = {node.me: node for node in nodes}
        self.queue: deque[tuple[PeerId, Send]] = deque()
        self.undelivered: list[tuple[PeerId, Send]] = []

    def handle(self, me: PeerId, event: InEvent, now: float) -> dict[PeerId, list[OutEvent]]:
        """Feed one event to node `me`, then deliver until no message is in flight.
        Returns every output, per node, in the order it was produced."""
        log: dict[PeerId, list[OutEvent]] = {p: [] for p in self.nodes}
        self._feed(me, event, now, log)
        while self.queue:
            sender, out = self.queue.popleft()
            if out.peer not in self.nodes:
                self.undelivered.append((sender, out))
                continue
            self._feed(out.peer, Received(sender, out.topic, out.message), now, log)
        return log

    def _feed(
        self, me: PeerId, event: InEvent, now: float, log: dict[PeerId, list[OutEvent]]
    ) -> None:
        out = self.nodes[me].handle(event, now)
        log[me].extend(out)
        self.queue.extend((me, e) for e in out if isinstance(e, Send))
