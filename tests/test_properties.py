"""Property tests of the sans-IO core: random interleavings of joins, leaves, crashes,
message loss and publishes, driven through the simulator (the same `handle` the runtime
calls), with the core's invariants checked after every single input.

Checked after every input a node handles:
- the active view holds at most `max_active` peers (A may be oversubscribed up to 2A
  while stabilisation sheds the surplus), the passive view at most `passive_size`; the
  two are disjoint and never hold the node itself;
- eager and lazy are disjoint and together are exactly the active view;
- every table a peer can grow stays within its bound: cache (count, bytes), seen,
  missing ids and their announcers, held messages per publisher, publisher streams,
  by_seq, departed peers, dormant peers, near candidates;
- no application sees a message twice (by id, and by (publisher, seq)).

Checked after quiescence (loss off, no more churn, a minute of protocol time):
- active views are symmetric;
- every message published after that reaches every live node, once;
- then both ends of every link agree whether it is eager.

The configuration is small on purpose, so that the bounds bind with a handful of nodes
and a dozen messages. The suite's run is derandomized (the same examples every time, so
CI never fails on a schedule nobody has seen); `EPISUB_PROPERTY_EXAMPLES=N` runs a random
search of N examples instead, which is how the strict xfails below were found.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from episub.proto.config import BroadcastConfig, MembershipConfig, NodeConfig
from episub.proto.events import Deliver, JoinTopic, LeaveTopic, Publish, Published
from episub.proto.node import NodeState
from episub.sim.engine import Simulator
from episub.sim.latency import make_latency
from episub.sim.metrics import WARMUP, payload_for

TOPIC = "t"
SEARCH = os.environ.get("EPISUB_PROPERTY_EXAMPLES")
EXAMPLES = int(SEARCH or "40")
QUIESCENCE = 60.0  # seconds: several stabilisation, ping and neighbour-request rounds
DELIVERY_WAIT = 15.0  # seconds: a gap is pulled or given up within ~5 s, twice over

CONFIG = NodeConfig(
    membership=MembershipConfig(
        c_rand=2,
        c_near=1,
        passive_size=5,
        shuffle_active=2,
        shuffle_passive=2,
        max_left_memory=3,
        dormant_size=3,
        near_candidates=3,
        initial_probes=2,
    ),
    broadcast=BroadcastConfig(
        cache_max_messages=6,
        cache_max_bytes=5 * 60,  # binds before the count: an envelope here is ~50 bytes
        seen_max=8,
        max_missing=3,
        max_announcers=2,
        max_held_per_publisher=3,
        max_publishers=3,
        max_fetches=2,
        max_gap=16,
    ),
)


class InvariantBroken(AssertionError):
    pass


@dataclass
class Checks:
    delivered: set[tuple[int, bytes]] = field(default_factory=set)
    delivered_seq: set[tuple[int, object, int]] = field(default_factory=set)
    deliveries: dict[bytes, set[int]] = field(default_factory=dict)
    published: list[tuple[int, bytes]] = field(default_factory=list)


def check_node(node: NodeState) -> None:
    """The invariants one node keeps at all times."""
    topic = node._topics.get(TOPIC)
    if topic is None:
        return
    mem, bc = topic.membership, topic.broadcast
    mc, bcfg = mem.config, bc.config
    me = node.me
    active, passive = set(mem.active), set(mem.passive)
    if len(active) > mc.max_active:
        raise InvariantBroken(f"{me}: active view {len(active)} > max_active {mc.max_active}")
    if len(passive) > mc.passive_size:
        raise InvariantBroken(f"{me}: passive view {len(passive)} > {mc.passive_size}")
    if active & passive or me in active or me in passive:
        raise InvariantBroken(f"{me}: views overlap or hold ourselves: {active} {passive}")
    eager, lazy = set(bc.eager), set(bc.lazy)
    if eager & lazy:
        raise InvariantBroken(f"{me}: eager and lazy overlap: {eager & lazy}")
    if eager | lazy != active:
        raise InvariantBroken(f"{me}: eager {eager} + lazy {lazy} != active view {active}")
    bounds = [
        ("cache", len(bc.cache), bcfg.cache_max_messages),
        ("cache bytes", bc.cache_bytes, bcfg.cache_max_bytes),
        ("seen", len(bc.seen), bcfg.seen_max),
        ("missing", len(bc.missing), bcfg.max_missing),
        ("streams", len(bc.streams), bcfg.max_publishers),
        ("fetches", len(bc.fetches), bcfg.max_fetches),
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

    def __init__(self, peer: int, rng, checks: Checks) -> None:
        self.state = NodeState(peer, CONFIG, rng)
        self.checks = checks

    def handle(self, event, now):
        outs = self.state.handle(event, now)
        me = self.state.me
        for out in outs:
            if type(out) is Published:
                self.checks.published.append((me, out.id))
            elif type(out) is Deliver:
                key = (me, out.id)
                seq_key = (me, out.envelope.publisher, out.envelope.seq)
                if key in self.checks.delivered or seq_key in self.checks.delivered_seq:
                    raise InvariantBroken(f"{me} delivered {out.envelope.payload!r} twice")
                self.checks.delivered.add(key)
                self.checks.delivered_seq.add(seq_key)
                self.checks.deliveries.setdefault(out.id, set()).add(me)
        check_node(self.state)
        return outs

    # the scenario helpers' queries
    def active_view(self, topic):
        return self.state.active_view(topic)


# One step of the random schedule. Indexes pick among the live members modulo their number.
steps = st.one_of(
    st.tuples(st.just("join"), st.integers(0, 1 << 16)),
    st.tuples(st.just("leave"), st.integers(0, 1 << 16)),
    st.tuples(st.just("crash"), st.integers(0, 1 << 16)),
    st.tuples(st.just("publish"), st.integers(0, 1 << 16)),
    st.tuples(st.just("loss"), st.sampled_from([0.0, 0.05, 0.2, 0.5])),
    st.tuples(st.just("wait"), st.floats(0.0, 4.0)),
)


class Harness:
    def __init__(self, seed: int, initial: int) -> None:
        self.checks = Checks()
        self.sim = Simulator(
            latency=make_latency("uniform", seed),
            seed=seed,
            node_factory=lambda peer, rng: CheckedNode(peer, rng, self.checks),
        )
        self.members: list[int] = []  # alive and subscribed
        self.next_id = 0
        self.publishes = 0
        for _ in range(initial):
            self.join()
            self.run(0.05)
        self.run(5.0)

    def run(self, seconds: float) -> None:
        self.sim.run(self.sim.now + seconds)

    def join(self, contact_index: int = 0) -> None:
        node = self.next_id
        self.next_id += 1
        self.sim.add_node(node)
        # A bootstrap list of every member, rotated: with a single contact that leaves
        # during the join walk, a node stays alone (hypothesis found it: docs/reliability.md).
        k = contact_index % len(self.members) if self.members else 0
        contacts = tuple(self.members[k:] + self.members[:k])
        self.sim.input(node, JoinTopic(TOPIC, contacts))
        self.members.append(node)

    def step(self, step: tuple) -> None:
        sim, members = self.sim, self.members
        match step:
            case ("join", i):
                if len(members) < 10:
                    self.join(i)
            case ("leave", i) if len(members) > 2:
                node = members.pop(i % len(members))
                sim.input(node, LeaveTopic(TOPIC))
                sim.call_at(sim.now + 1.0, lambda: sim.crash(node))
            case ("crash", i) if len(members) > 2:
                sim.crash(members.pop(i % len(members)))
            case ("publish", i):
                self.publish(members[i % len(members)])
            case ("loss", p):
                sim.loss = p
            case ("wait", seconds):
                self.run(seconds)
        self.run(0.05)

    def publish(self, node: int) -> None:
        # The simulator's collector reads a message's kind and index from its payload.
        self.sim.input(node, Publish(TOPIC, payload_for(WARMUP, self.publishes)))
        self.publishes += 1

    def live(self) -> list[int]:
        return sorted(self.members)


@settings(
    max_examples=EXAMPLES,
    derandomize=SEARCH is None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    seed=st.integers(0, 1 << 32),
    initial=st.integers(3, 6),
    schedule=st.lists(steps, max_size=25),
    final_publishers=st.lists(st.integers(0, 1 << 16), min_size=1, max_size=3),
)
def test_random_schedules_keep_every_invariant_and_deliver_after_quiescence(
    seed: int, initial: int, schedule: list[tuple], final_publishers: list[int]
) -> None:
    check_schedule(seed, initial, schedule, final_publishers)


# Not strict: since branch perf's core changes (RTT filtering, Plumtree's parent rules)
# this one schedule no longer happens to lose the message that matters (which change did
# it was not checked); the bug itself is not fixed.
@pytest.mark.xfail(strict=False, reason="open: a lost NEIGHBOR/DISCONNECT leaves views asymmetric")
def test_known_failure_loss_leaves_active_views_asymmetric() -> None:
    schedule = [("leave", 1), ("join", 0), ("join", 0), ("join", 0), ("loss", 0.5)]
    check_schedule(0, 6, schedule, [0])


@pytest.mark.xfail(strict=True, reason="open: a link stays eager at one end only")
def test_known_failure_a_link_eager_at_one_end_after_leave_and_join() -> None:
    check_schedule(1, 3, [("publish", 0), ("leave", 0), ("join", 0)], [0])


def check_schedule(
    seed: int, initial: int, schedule: list[tuple], final_publishers: list[int]
) -> None:
    h = Harness(seed, initial)
    for step in schedule:
        h.step(step)
    # Quiescence: no more loss or churn; the protocol's own rounds repair the views.
    h.sim.loss = 0.0
    h.run(QUIESCENCE)
    live = h.live()
    views = {node: set(h.sim.nodes[node].active_view(TOPIC)) for node in live}
    asymmetric = [(a, b) for a in live for b in views[a] if a not in views.get(b, ())]
    assert not asymmetric, f"asymmetric active views after quiescence: {asymmetric}"
    assert all(b in views for a in live for b in views[a]), "a live node keeps a dead peer"
    # Everything published from now on reaches every live node exactly once.
    already = len(h.checks.published)
    for i in final_publishers:
        h.publish(live[i % len(live)])
        h.run(0.3)
    h.run(DELIVERY_WAIT)
    for publisher, mid in h.checks.published[already:]:
        missing = set(live) - {publisher} - h.checks.deliveries.get(mid, set())
        assert not missing, f"a message of {publisher} never reached {sorted(missing)}"
    # Both ends of a link agree whether it is eager: PRUNE and GRAFT act on both ends, and
    # the final messages have crossed every link, so a lost PRUNE has been sent again.
    eager = {node: set(h.sim.nodes[node].state.eager_peers(TOPIC)) for node in live}
    one_sided = [(a, b) for a in live for b in views[a] if (b in eager[a]) != (a in eager[b])]
    assert not one_sided, f"links eager at one end only: {one_sided}"
