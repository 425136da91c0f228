"""The invariants one sans-IO core keeps at all times, checked after every input it handles.

Shared by the property tests (tests/test_properties.py: random honest schedules) and the
adversarial model (tests/test_adversary.py: a key holder feeding a node arbitrary
well-formed messages). `CheckedNode` wraps the real `NodeState` for the simulator and
checks, after every single input:

- the active view holds at most `max_active` peers (A may be oversubscribed up to 2A
  while stabilisation sheds the surplus), the passive view at most `passive_size`; the
  two are disjoint and never hold the node itself;
- eager and lazy are disjoint and together are exactly the active view;
- every table a peer can grow stays within its bound: cache (count, bytes), seen,
  missing ids and their announcers, held messages per publisher, publisher streams,
  by_seq, fetches, ids dropped unheld, departed peers, dormant peers, near candidates;
- no application sees a message twice (by id, and by (publisher, seq));
- what a node says is bounded: at most `MAX_OUTPUTS_PER_INPUT` outputs for one input,
  and at most `MAX_SENDS_PER_SECOND` messages sent in one simulated second. No one input
  can be answered without bound, and no message can be passed on without bound (a
  LEAVE forwarded again on every copy flooded the adversarial model's overlay
  exponentially, 200,000 messages within a simulated second, until it ran out of
  memory).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from episub.proto.config import MembershipConfig, NodeConfig
from episub.proto.events import DataLost, Deliver, Published, Send
from episub.proto.node import NodeState

TOPIC = "t"

# Far above what any honest schedule or hostile message here makes a node say (a PULL
# answer is bounded by the cache, an IHAVE flush by the views), and far below a storm.
MAX_OUTPUTS_PER_INPUT = 1_000
MAX_SENDS_PER_SECOND = 5_000

# Views small enough that their bounds bind with a handful of nodes (A = 3, passive 5).
SMALL_MEMBERSHIP = MembershipConfig(
    c_rand=2,
    c_near=1,
    passive_size=5,
    shuffle_active=2,
    shuffle_passive=2,
    max_left_memory=3,
    dormant_size=3,
    near_candidates=3,
    initial_probes=2,
)


class InvariantBroken(AssertionError):
    pass


@dataclass
class Checks:
    """What every checked node delivered and published, across one simulation."""

    delivered: set[tuple[int, bytes]] = field(default_factory=set)
    delivered_seq: set[tuple[int, object, int]] = field(default_factory=set)
    deliveries: dict[bytes, set[int]] = field(default_factory=dict)
    published: list[tuple[int, bytes]] = field(default_factory=list)
    # node -> (publisher, seq, payload) of each delivery, in the order delivered
    in_order: dict[int, list[tuple[object, int, bytes]]] = field(default_factory=dict)
    # node -> (publisher, first_seq, last_seq) of each range given up
    lost: dict[int, list[tuple[object, int, int]]] = field(default_factory=dict)
    # node -> (simulated second, messages it sent in that second)
    sent_per_second: dict[int, tuple[int, int]] = field(default_factory=dict)


def check_node(node: NodeState) -> None:
    """The invariants one node keeps at all times."""
    topic = node._topics.get(TOPIC)
    if topic is None:
        return
    mem, bc = topic.membership, topic.broadcast
    mc, bcfg = mem.config, bc.config
    me = node.me
    active, passive = set(mem.active), set(mem.passive)
    # Hub links (configuration topics, MembershipConfig.hub_links) are held beside A.
    hub = sum(1 for link in mem.active.values() if link.hub)
    if len(active) - hub > mc.max_active:
        raise InvariantBroken(
            f"{me}: active view {len(active) - hub} (hub links aside) > max_active {mc.max_active}"
        )
    # A contact takes in at most hub_links joiners; a joiner holds one to each of its own
    # contacts (a list its application gave, not its peers) that took it in.
    if hub > mc.hub_links + len(mem.bootstrap):
        raise InvariantBroken(
            f"{me}: {hub} hub links > hub_links {mc.hub_links} + {len(mem.bootstrap)} contacts"
        )
    if len(mem.joiners) > 2 * mc.hub_links:
        raise InvariantBroken(f"{me}: {len(mem.joiners)} joiners > 2 x hub_links {mc.hub_links}")
    if len(passive) > mc.passive_size:
        raise InvariantBroken(f"{me}: passive view {len(passive)} > {mc.passive_size}")
    if active & passive or me in active or me in passive:
        raise InvariantBroken(f"{me}: views overlap or hold ourselves: {active} {passive}")
    for stream, tree in bc.trees:  # every delivery tree, `shared` (None) first
        eager, lazy = set(tree.eager), set(tree.lazy)
        if eager & lazy:
            raise InvariantBroken(f"{me}: tree {stream!r}: eager and lazy overlap: {eager & lazy}")
        if eager | lazy != active:
            raise InvariantBroken(
                f"{me}: tree {stream!r}: eager {eager} + lazy {lazy} != active view {active}"
            )
    bounds = [
        ("cache", len(bc.cache), bcfg.cache_max_messages),
        ("cache bytes", bc.cache_bytes, bcfg.cache_max_bytes),
        ("seen", len(bc.seen), bcfg.seen_max),
        ("missing", len(bc.missing), bcfg.max_missing),
        ("missing due", len(bc.missing_due), 2 * bcfg.max_missing),
        ("streams", len(bc.streams), bcfg.max_publishers),
        ("stream trees", len(bc.trees), bcfg.max_stream_trees),
        ("fetches", len(bc.fetches), bcfg.max_fetches),
        ("dropped ids", len(bc.ordering.dropped), bcfg.max_held_per_publisher),
        ("by_seq", len(bc.by_seq), len(bc.cache)),
        ("left", len(mem.left), mc.max_left_memory),
        ("dormant", len(mem.dormant), mc.dormant_size),
        ("near candidates", len(mem.near_candidates), mc.near_candidates),
    ]
    bounds += [("announcers", len(e.announcers), bcfg.max_announcers) for e in bc.missing.values()]
    bounds += [("held", len(s.held), bcfg.max_held_per_publisher) for s in bc.streams.values()]
    for name, size, bound in bounds:
        if size > bound:
            raise InvariantBroken(f"{me}: {name} holds {size}, bound {bound}")


class CheckedNode:
    """The real core, with the invariants checked after every input it handles."""

    def __init__(self, peer: int, rng, checks: Checks, config: NodeConfig) -> None:  # type: ignore[no-untyped-def]
        self.state = NodeState(peer, config, rng)
        self.checks = checks

    def handle(self, event, now):  # type: ignore[no-untyped-def]
        outs = self.state.handle(event, now)
        me = self.state.me
        checks = self.checks
        if len(outs) > MAX_OUTPUTS_PER_INPUT:
            raise InvariantBroken(f"{me}: {len(outs)} outputs for one input {event!r:.200}")
        second, sent = checks.sent_per_second.get(me, (int(now), 0))
        if second != int(now):
            second, sent = int(now), 0
        sent += sum(type(out) is Send for out in outs)
        checks.sent_per_second[me] = (second, sent)
        if sent > MAX_SENDS_PER_SECOND:
            raise InvariantBroken(f"{me}: sent {sent} messages in simulated second {second}")
        for out in outs:
            if type(out) is Published:
                checks.published.append((me, out.id))
            elif type(out) is Deliver:
                env = out.envelope
                key = (me, out.id)
                seq_key = (me, env.publisher, env.seq)
                if key in checks.delivered or seq_key in checks.delivered_seq:
                    raise InvariantBroken(f"{me} delivered {env.payload!r} twice")
                checks.delivered.add(key)
                checks.delivered_seq.add(seq_key)
                checks.deliveries.setdefault(out.id, set()).add(me)
                checks.in_order.setdefault(me, []).append((env.publisher, env.seq, env.payload))
            elif type(out) is DataLost:
                lost = (out.publisher, out.first_seq, out.last_seq)
                checks.lost.setdefault(me, []).append(lost)
        check_node(self.state)
        return outs

    # the scenario helpers' queries
    def active_view(self, topic):  # type: ignore[no-untyped-def]
        return self.state.active_view(topic)
