"""The adversarial model: a key holder feeds one node arbitrary well-formed messages of
every kind beside honest traffic (issue 13).

Five honest cores (the real `NodeState`, tests/core_checks.py's `CheckedNode`) run in the
simulator; node 1 publishes one message every `PUBLISH_EVERY` seconds from the start to
the end. The target is node 0. Beside them lives node 5, the hostile node: a simulated
node that holds the key (it takes part in the overlay's connections) but runs no core:
it answers nothing and sends what hypothesis chooses. Hostile messages come from node 5
or from ids that no node has (a key holder can open connections under any id), and carry
any publisher (the honest one included), seq, hops, ttl, ids, ranges and peers, in any
order and repeated.

Checked after every input any honest node handles: `handle` never raises (the simulator
stops on the first exception), and every table stays within its bound with no message
delivered twice (core_checks.check_node). Checked at the end, after the hostile node
stops, the honest stream goes on for `TAIL` seconds and the overlay is left `QUIESCENCE`
seconds more: every honest subscriber got the honest publisher's places, each once and
in order, all of those published during the attack among them, and none of those given
up as lost. Without signatures a key holder can speak for the publisher: a place it
forged before the honest message arrived may carry its payload (and only then).

The suite's run is derandomized with `EXAMPLES` examples (the same every run, so CI never
fails on an example nobody has seen); `EPISUB_ADVERSARY_EXAMPLES=N` searches N random
examples instead:

    EPISUB_ADVERSARY_EXAMPLES=5000 python -m pytest -q tests/test_adversary.py
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from episub.proto import messages as m
from episub.proto.config import BroadcastConfig, NodeConfig
from episub.proto.envelope import message_id
from episub.proto.events import InEvent, JoinTopic, Publish, Received
from episub.proto.store import RetentionConfig
from episub.sim.engine import Simulator
from episub.sim.latency import make_latency
from episub.sim.metrics import WARMUP, payload_for
from tests.core_checks import SMALL_MEMBERSHIP, TOPIC, CheckedNode, Checks

SEARCH = os.environ.get("EPISUB_ADVERSARY_EXAMPLES")
EXAMPLES = int(SEARCH or "400")
STEPS = 30

TARGET = 0
PUBLISHER = 1
HONEST = (0, 1, 2, 3, 4)
HOSTILE = 5  # a simulated node without a core: connections to it work, it answers nothing
GHOSTS = (100, 101, 102)  # ids nobody has: sends to them fail (a hostile connection ended)
STRANGERS = tuple(range(100, 110))  # peer ids the hostile names in its messages
PUBLISH_EVERY = 0.5  # seconds: the honest stream never pauses long enough to stall
TAIL = 20.0  # seconds the honest stream goes on after the attack (40 messages)
QUIESCENCE = 10.0  # seconds after its last message: gaps pulled or given up

# Small bounds, so that the hostile node reaches them in a few dozen messages (as in
# tests/test_properties.py).
CONFIG = NodeConfig(
    membership=SMALL_MEMBERSHIP,
    broadcast=BroadcastConfig(
        max_missing=3,
        max_announcers=2,
        max_held_per_publisher=4,
        max_publishers=4,
        max_fetches=2,
        max_gap=16,
        # On, so that hostile IHAVEs meet the near parent rule too (off by default).
        near_parent_factor=4.0,
    ),
)
STORE = RetentionConfig(max_messages=64, seen_max=128)


class Silent:
    """The hostile node as the simulator sees it: it takes everything and answers nothing
    (what it sends is injected by the test)."""

    def handle(self, event: InEvent, now: float) -> list[Any]:
        return []


# -- what the hostile node sends ----------------------------------------------------------

peers = st.sampled_from((*HONEST, HOSTILE, *STRANGERS))
ttls = st.one_of(st.integers(0, 3), st.just(m.MAX_TTL))
hops = st.one_of(st.integers(0, 20), st.sampled_from([m.MAX_HOPS - 1, m.MAX_HOPS]))
# A seq relative to the honest publisher's next one ("rel") or absolute ("abs"): near the
# live stream, just past pulling reach (max_gap 16), far past it, or at the ends.
seqs = st.one_of(
    st.tuples(st.just("rel"), st.integers(-4, 8)),
    st.tuples(st.just("rel"), st.sampled_from([15, 16, 17, 4096, 4097, 5_000_000])),
    st.tuples(st.just("abs"), st.sampled_from([0, 1, (1 << 63) - 1])),
)
publishers = st.sampled_from((PUBLISHER, PUBLISHER, PUBLISHER, HOSTILE, TARGET, 2, 104))


class Adversary(RuleBasedStateMachine):
    """One run: the honest overlay, the hostile node's messages, the final delivery check."""

    @initialize(seed=st.integers(0, 1 << 16))
    def start(self, seed: int) -> None:
        self.checks = Checks()
        self.sim = Simulator(
            latency=make_latency("uniform", seed),
            seed=seed,
            node_factory=self._node,
        )
        for node in HONEST:
            self.sim.add_node(node)
            self.sim.input(node, JoinTopic(TOPIC, tuple(p for p in HONEST if p < node)))
            self.sim.run(self.sim.now + 0.05)
        self.sim.add_node(HOSTILE)
        self.sim.run(self.sim.now + 5.0)
        self.published = 0
        self.publishing = True
        self.forged: set[int] = set()  # honest publisher's seqs the hostile node forged
        self.sent: list[tuple[int, str | None, m.PeerMessage]] = []
        self.ids: list[bytes] = [bytes(32)]  # message ids the hostile node may name
        self.known = 0  # honest publishes already among them
        self._publish()

    def _node(self, peer: int, rng: Any) -> Any:
        if peer == HOSTILE:
            return Silent()
        return CheckedNode(peer, rng, self.checks, CONFIG, STORE)

    def _publish(self) -> None:
        if not self.publishing:
            return
        # The simulator's collector reads a message's kind and index from its payload.
        self.sim.input(PUBLISHER, Publish(TOPIC, payload_for(WARMUP, self.published)))
        self.published += 1
        self.sim.call_at(self.sim.now + PUBLISH_EVERY, self._publish)

    def _run(self, seconds: float) -> None:
        self.sim.run(self.sim.now + seconds)
        self.ids.extend(mid for _, mid in self.checks.published[self.known :])
        self.known = len(self.checks.published)

    # -- building a hostile message from what was drawn -----------------------------------

    def _seq(self, spec: tuple[str, int]) -> int:
        kind, value = spec
        seq = self.published + value if kind == "rel" else value
        return min(max(seq, 0), (1 << 63) - 1)

    def _ranges(self, draw: Any, least: int) -> tuple[m.StreamRange, ...]:
        """IHAVE/GRAFT ranges near the live stream or far from it, up to the bound of
        messages one may name (4 x 1,024 = MAX_IDS_PER_MESSAGE)."""
        out = []
        for _ in range(draw(st.integers(least, 4), label="ranges")):
            first = self._seq(draw(seqs, label="first"))
            span = draw(st.sampled_from([0, 1, 7, 63, 1023]), label="span")
            last = min(first + span, (1 << 63) - 1)
            out.append((draw(publishers, label="publisher"), first, last, draw(hops)))
        return tuple(out)

    def _message(self, data: st.DataObject) -> tuple[str | None, m.PeerMessage]:
        ids = st.sampled_from(self.ids) | st.binary(min_size=32, max_size=32)
        kind = data.draw(
            st.sampled_from(
                [
                    "gossip", "gossip", "gossip", "ihave", "graft", "prune", "pull",
                    "join", "forwardjoin", "neighbor", "disconnect", "leave", "shuffle",
                    "shufflereply", "ping", "pong", "getnodes", "nodes", "gettopics",
                    "topics", "getview", "view", "heads",
                ]
            ),
            label="kind",
        )  # fmt: skip
        draw = data.draw
        match kind:
            case "gossip":
                publisher = draw(publishers, label="publisher")
                seq = self._seq(draw(seqs, label="seq"))
                envelope = m.Envelope(
                    publisher=publisher,
                    seq=seq,
                    timestamp_ms=draw(st.integers(0, 1 << 40)),
                    payload=b"forged %d" % seq,
                )
                right = message_id(TOPIC, envelope)
                mid = right if draw(st.booleans(), label="right id") else draw(ids)
                if publisher == PUBLISHER and mid == right:
                    self.forged.add(seq)
                self.ids.append(right)
                return TOPIC, m.Gossip(id=mid, envelope=envelope, hops=draw(hops, label="hops"))
            case "ihave":
                return TOPIC, m.IHave(ranges=self._ranges(draw, least=1))
            case "graft":
                streams = tuple(draw(st.lists(publishers, max_size=3), label="streams"))
                return TOPIC, m.Graft(ranges=self._ranges(draw, least=0), streams=streams)
            case "prune":
                # For the streams named (the honest publisher's among them), or, naming
                # none, for every tree: the whole link.
                streams = tuple(draw(st.lists(publishers, max_size=3), label="streams"))
                return TOPIC, m.Prune(streams=streams)
            case "heads":
                heads = tuple((p, last, last, h) for p, _, last, h in self._ranges(draw, least=1))
                return TOPIC, m.Heads(ranges=heads)
            case "pull":
                first = self._seq(draw(seqs, label="first"))
                span = draw(st.integers(0, m.MAX_PULL_SPAN - 1))
                last = min(first + span, (1 << 63) - 1)
                return TOPIC, m.Pull(publisher=draw(publishers), first_seq=first, last_seq=last)
            case "join":
                return TOPIC, m.Join(peer=draw(peers), ttl=draw(ttls))
            case "forwardjoin":
                return TOPIC, m.ForwardJoin(peer=draw(peers), ttl=draw(ttls))
            case "neighbor":
                active = draw(st.integers(0, 8))
                return TOPIC, m.Neighbor(
                    op=draw(st.sampled_from(m.NeighborOp)),
                    kind=draw(st.sampled_from(m.LinkKind)),
                    high_priority=draw(st.booleans()),
                    rtt=draw(st.none() | st.sampled_from([0.0, 0.001, 0.2, 3599.0])),
                    active_count=active,
                    rand_count=draw(st.integers(0, active)),
                )
            case "disconnect":
                return TOPIC, m.Disconnect(alive=draw(st.booleans()))
            case "leave":
                return TOPIC, m.Leave(peer=draw(peers), ttl=draw(ttls))
            case "shuffle":
                listed = tuple(draw(st.lists(peers, max_size=20)))
                return TOPIC, m.Shuffle(origin=draw(peers), ttl=draw(ttls), peers=listed)
            case "shufflereply":
                return TOPIC, m.ShuffleReply(peers=tuple(draw(st.lists(peers, max_size=20))))
            case "ping":
                return TOPIC, m.Ping(nonce=draw(st.integers(0, 3)), want_view=draw(st.booleans()))
            case "pong":
                active = draw(st.integers(0, 8))
                return TOPIC, m.Pong(
                    nonce=draw(st.integers(0, 3)),
                    subscribed=draw(st.booleans()),
                    active_count=active,
                    rand_count=draw(st.integers(0, active)),
                    active=tuple(draw(st.lists(peers, max_size=8))),
                    not_neighbor=draw(st.booleans()),
                )
            case "getnodes":
                return TOPIC, m.GetNodes()
            case "nodes":
                return TOPIC, m.Nodes(peers=tuple(draw(st.lists(peers, max_size=20))))
            case "gettopics":
                return None, m.GetTopics()
            case "topics":
                return None, m.Topics(topics=(TOPIC,))
            case "getview":
                return TOPIC, m.GetView()
            case _:
                return TOPIC, m.View(entries=(), passive_count=draw(st.integers(0, 5)))

    # -- rules ------------------------------------------------------------------------------

    def _inject(
        self, sender: int, topic: str | None, message: m.PeerMessage, settle: float
    ) -> None:
        self.sim.input(TARGET, Received(sender, topic, message))
        self._run(settle)

    @rule(
        data=st.data(),
        sender=st.sampled_from((HOSTILE, HOSTILE, HOSTILE, *GHOSTS)),
        settle=st.sampled_from([0.0, 0.01, 0.2]),
    )
    def hostile_message(self, data: st.DataObject, sender: int, settle: float) -> None:
        topic, message = self._message(data)
        self.sent.append((sender, topic, message))
        self._inject(sender, topic, message, settle)

    @rule(data=st.data(), settle=st.sampled_from([0.0, 0.2]))
    def replay(self, data: st.DataObject, settle: float) -> None:
        if self.sent:
            sender, topic, message = data.draw(st.sampled_from(self.sent), label="replayed")
            self._inject(sender, topic, message, settle)

    @rule(seconds=st.sampled_from([0.1, 0.5, 1.0, 2.0]))
    def wait(self, seconds: float) -> None:
        self._run(seconds)

    # -- the final check ----------------------------------------------------------------------

    def teardown(self) -> None:
        if not hasattr(self, "sim"):
            return
        # The honest stream goes on after the attack: its later messages show every node
        # the gaps it may have (Plumtree announces a message once; a node cut off when the
        # last one passed learns of it from the next).
        attacked = self.published
        self._run(TAIL)
        self.publishing = False
        self._run(QUIESCENCE)
        honest = {seq: payload_for(WARMUP, seq) for seq in range(self.published)}
        for node in HONEST:
            if node == PUBLISHER:
                continue
            got = [(s, p) for pub, s, p in self.checks.in_order.get(node, []) if pub == PUBLISHER]
            seqs = [s for s, _ in got]
            assert seqs == sorted(set(seqs)), f"node {node}: out of order: {compress(seqs)}"
            assert seqs[:attacked] == list(range(attacked)), (
                f"node {node} got the honest publisher's seqs {compress(seqs)}, "
                f"not 0..{attacked - 1} and on"
            )
            # Places past the last honest publish can only be forged ones.
            assert set(seqs[self.published :]) <= self.forged, seqs
            for seq, payload in got:
                assert payload == honest.get(seq) or seq in self.forged, (node, seq, payload)
            lost = [r for r in self.checks.lost.get(node, []) if r[0] == PUBLISHER]
            lost = [(a, b) for _, a, b in lost if a < attacked]
            assert not lost, f"node {node} gave up the honest publisher's seqs {lost}"


def compress(seqs: list[int]) -> str:
    """[0, 1, 2, 5, 6] -> '0..2, 5..6': short enough for an assertion message."""
    runs: list[list[int]] = []
    for s in seqs:
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    return ", ".join(f"{a}..{b}" if a != b else f"{a}" for a, b in runs) or "none"


Adversary.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    derandomize=SEARCH is None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestAdversary = Adversary.TestCase

# The same attack on a topic run as configuration topics are (episub/proto/config.py
# CONFIG_TOPIC_MEMBERSHIP and CONFIG_TOPIC_BROADCAST): proximity off, a contact holding hub
# links to the nodes that joined through it (a bound of 2, which the hostile node's
# GETNODES + JOIN reach in a few messages), hub links kept eager, IHAVEs at a period of
# each node's own.
HUB_CONFIG = replace(
    CONFIG,
    topic_membership=(
        (TOPIC, (("proximity", False), ("hub_links", 2), ("c_near", 0), ("c_rand", 2))),
    ),
    topic_broadcast=((TOPIC, (("hub_parent", True), ("ihave_spread", 1.0))),),
)


class HubAdversary(Adversary):
    """The adversarial model on a topic with hub links."""

    def _node(self, peer: int, rng: Any) -> Any:
        if peer == HOSTILE:
            return Silent()
        return CheckedNode(peer, rng, self.checks, HUB_CONFIG, STORE)


HubAdversary.TestCase.settings = settings(
    Adversary.TestCase.settings, max_examples=max(1, EXAMPLES // 4)
)
TestHubAdversary = HubAdversary.TestCase


class AmplificationAdversary(Adversary):
    """The adversarial model, every hostile input also checked against the amplification
    bounds (tests/core_checks.py `check_answer`: messages sent back and store look-ups
    at once). It fails on a core that answers a PULL whole (one of more than 256 seqs the
    cache lacks looked up in the store in one input)."""

    def _node(self, peer: int, rng: Any) -> Any:
        self.checks.amplification = True
        return super()._node(peer, rng)


AmplificationAdversary.TestCase.settings = settings(
    Adversary.TestCase.settings, max_examples=max(1, EXAMPLES // 8)
)
TestAmplificationAdversary = AmplificationAdversary.TestCase
