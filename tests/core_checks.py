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
  cached places, fetches, ids dropped unheld, departed peers, dormant peers, near candidates,
  peers with answers waiting and the ranges waiting for each;
- no application sees a message twice (by id, and by (publisher, seq));
- what a node says is bounded: at most `MAX_OUTPUTS_PER_INPUT` outputs for one input,
  and at most `MAX_SENDS_PER_SECOND` messages sent in one simulated second. No one input
  can be answered without bound, and no message can be passed on without bound (a
  LEAVE forwarded again on every copy flooded the adversarial model's overlay
  exponentially, 200,000 messages within a simulated second, until it ran out of
  memory).

Amplification (`answer_cost`, `check_answer`): what one message from a peer makes the
core do at once, per byte of it, whatever the node holds. Checked by
tests/test_amplification.py for every request kind at its worst, and by the adversarial
model's `AmplificationAdversary` after every hostile input:
- items: the messages sent back to the asker, and the look-ups made in the core's store
  for it (`store.work`), at most `MAX_ANSWER_ITEMS` each;
- bytes (peer ids that go on the wire): what it sends, to the asker and to anyone else,
  at most max_active + 1 times its own size (a GOSSIP, JOIN or LEAVE passed on to every
  active neighbour, the view's hard cap) plus `ANSWER_BUDGET_BYTES`.
An answer longer than that goes out in batches as the asker's send queue drains, never
whole (episub/proto/answers.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from episub.proto import messages as m
from episub.proto.answers import MAX_ASKERS, MAX_PENDING_RANGES
from episub.proto.config import MembershipConfig, NodeConfig
from episub.proto.events import (
    DataLost,
    Deliver,
    OutEvent,
    Published,
    Received,
    Send,
)
from episub.proto.node import NodeState
from episub.proto.wire import MAX_PEER_ID_SIZE, encode_item

TOPIC = "t"

# Far above what any honest schedule or hostile message here makes a node say (a PULL
# answer is bounded by the cache, an IHAVE flush by the views), and far below a storm.
MAX_OUTPUTS_PER_INPUT = 1_000
MAX_SENDS_PER_SECOND = 5_000

# Amplification bounds (see above). A batch of an answer: 64 KiB, or one message where the
# configured max_message_size is larger. Guess, in the spirit of gossipsub v1.1's IWANT
# limits: large enough that the largest control answer fits (a VIEW, PONG or NODES of
# MAX_PEERS_PER_MESSAGE peer ids of MAX_PEER_ID_SIZE bytes: 16 KiB and a few bytes per
# id), small enough that a 20-byte PULL cannot make a node queue megabytes at once.
ANSWER_BUDGET_BYTES = 64 * 1024
CONTROL_ANSWER_BYTES = m.MAX_PEERS_PER_MESSAGE * (MAX_PEER_ID_SIZE + 4) + 1024
assert CONTROL_ANSWER_BYTES < ANSWER_BUDGET_BYTES
# Messages sent and store look-ups made for one request at once: the messages of one
# GRAFT's worth of places (BroadcastConfig.max_graft_ids's default). A PULL may name 4,096
# (MAX_PULL_SPAN) and a GRAFT as many: their answers come in batches.
MAX_ANSWER_ITEMS = 256


@dataclass(frozen=True)
class AnswerCost:
    """What one message from `asker` made the core do at once."""

    bytes_in: int | None  # its size on the wire (None: ids that cannot go on the wire)
    bytes_out: int | None  # of every Send it caused, to anyone
    items: int  # messages sent back to the asker
    lookups: int  # look-ups in the core's store made for it (store.work's growth)


def wire_size(topic: str | None, message: m.PeerMessage) -> int | None:
    """Bytes of one item on the wire; None for the simulator's int peer ids."""
    try:
        return len(encode_item(topic, message))
    except TypeError:
        return None


def answer_cost(
    asker: object,
    topic: str | None,
    message: m.PeerMessage,
    outs: list[OutEvent],
    lookups: int = 0,
) -> AnswerCost:
    sends = [o for o in outs if type(o) is Send]
    sizes = [wire_size(o.topic, o.message) for o in sends]
    bytes_in = wire_size(topic, message)
    known = bytes_in is not None and all(size is not None for size in sizes)
    return AnswerCost(
        bytes_in=bytes_in,
        bytes_out=sum(size or 0 for size in sizes) if known else None,
        items=sum(1 for o in sends if o.peer == asker),
        lookups=lookups,
    )


def check_answer(cost: AnswerCost, config: NodeConfig, what: str) -> None:
    """The amplification bounds above, for one message from a peer to a node of `config`."""
    if cost.items > MAX_ANSWER_ITEMS:
        raise InvariantBroken(f"{what}: answered with {cost.items} messages at once")
    if cost.lookups > MAX_ANSWER_ITEMS:
        raise InvariantBroken(f"{what}: {cost.lookups} store look-ups at once")
    if cost.bytes_in is not None and cost.bytes_out is not None:
        budget = max(ANSWER_BUDGET_BYTES, config.broadcast.max_message_size + 1024)
        fanout = config.membership.max_active + 1
        if cost.bytes_out > fanout * cost.bytes_in + budget:
            raise InvariantBroken(
                f"{what}: {cost.bytes_in} bytes in made {cost.bytes_out} bytes out at once"
            )


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
    # Check every message a node receives against the amplification bounds.
    amplification: bool = False


def check_node(node: NodeState) -> None:
    """The invariants one node keeps at all times."""
    topic = node._topics.get(TOPIC)
    if topic is None:
        return
    mem, bc = topic.membership, topic.broadcast
    mc, bcfg = mem.config, bc.config
    store = node.store
    scfg = store.config
    # Rows ordering holds back stay pinned in the store past its windows, one a held message.
    pinned = store.pinned
    held = sum(len(s.held) for s in bc.streams.values())
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
        ("store", len(store), scfg.max_messages),
        ("store bytes", store.bytes, scfg.max_bytes),
        ("seen", len(store.seen), scfg.seen_max + pinned),
        ("missing", len(bc.missing), bcfg.max_missing),
        ("missing due", len(bc.missing_due), 2 * bcfg.max_missing),
        ("streams", len(bc.streams), bcfg.max_publishers),
        ("stream trees", len(bc.trees), bcfg.max_stream_trees),
        ("fetches", len(bc.fetches), bcfg.max_fetches),
        ("places", bc.places.places(), len(store) + pinned),
        ("pinned", pinned, held),
        ("left", len(mem.left), mc.max_left_memory),
        ("dormant", len(mem.dormant), mc.dormant_size),
        ("near candidates", len(mem.near_candidates), mc.near_candidates),
    ]
    bounds += [("announcers", len(e.announcers), bcfg.max_announcers) for e in bc.missing.values()]
    bounds += [("held", len(s.held), bcfg.max_held_per_publisher) for s in bc.streams.values()]
    bounds.append(("peers with answers waiting", len(bc.answers), MAX_ASKERS))
    bounds += [
        ("answer ranges waiting", bc.answers.waiting(peer), MAX_PENDING_RANGES)
        for peer in bc.answers.cursors
    ]
    for name, size, bound in bounds:
        if size > bound:
            raise InvariantBroken(f"{me}: {name} holds {size}, bound {bound}")
    # A stream reaches back only while it settles, asking for no more than max_gap below
    # where it began; the count that spares every first copy a look-up agrees.
    reaching = [s for s in bc.streams.values() if s.reach_low is not None]
    if bc.ordering._reaching != len(reaching) or any(
        s.settling_until is None or s.reach_low < s.reach_from - bcfg.max_gap  # type: ignore[operator]
        for s in reaching
    ):
        raise InvariantBroken(f"{me}: reaching streams {reaching!r:.300}")


class CheckedNode:
    """The real core, with the invariants checked after every input it handles."""

    def __init__(self, peer: int, rng, checks: Checks, config: NodeConfig, retention=None) -> None:  # type: ignore[no-untyped-def]
        self.state = NodeState(peer, config, rng, retention=retention)
        self.checks = checks

    def handle(self, event, now):  # type: ignore[no-untyped-def]
        work = self.state.store.work
        outs = self.state.handle(event, now)
        me = self.state.me
        checks = self.checks
        if len(outs) > MAX_OUTPUTS_PER_INPUT:
            raise InvariantBroken(f"{me}: {len(outs)} outputs for one input {event!r:.200}")
        if checks.amplification and type(event) is Received:
            lookups = self.state.store.work - work
            cost = answer_cost(event.peer, event.topic, event.message, outs, lookups)
            check_answer(cost, self.state.config, f"{me}: {event.message!r:.120}")
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
