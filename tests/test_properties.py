"""Property tests of the sans-IO core: random interleavings of joins, leaves, crashes,
message loss and publishes, driven through the simulator (the same `handle` the runtime
calls), with the core's invariants (tests/core_checks.py: views, eager/lazy, every
table's bound, no delivery twice) checked after every single input.

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

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from episub.proto.config import BroadcastConfig, NodeConfig
from episub.proto.events import JoinTopic, LeaveTopic, Publish
from episub.proto.store import RetentionConfig
from episub.sim.engine import Simulator
from episub.sim.latency import make_latency
from episub.sim.metrics import WARMUP, payload_for
from tests.core_checks import SMALL_MEMBERSHIP, TOPIC, CheckedNode, Checks

SEARCH = os.environ.get("EPISUB_PROPERTY_EXAMPLES")
EXAMPLES = int(SEARCH or "200")
QUIESCENCE = 60.0  # seconds: several stabilisation, ping and neighbour-request rounds
DELIVERY_WAIT = 15.0  # seconds: a gap is pulled or given up within ~5 s, twice over

CONFIG = NodeConfig(
    membership=SMALL_MEMBERSHIP,
    broadcast=BroadcastConfig(
        max_missing=3,
        max_announcers=2,
        max_held_per_publisher=3,
        max_publishers=3,
        max_fetches=2,
        max_gap=16,
    ),
)
STORE = RetentionConfig(
    max_messages=6,
    max_bytes=5 * 60,  # binds before the count: an envelope here is ~50 bytes
    seen_max=8,
)


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
            node_factory=lambda peer, rng: CheckedNode(peer, rng, self.checks, CONFIG, STORE),
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
# Two publishers whose last messages leave the nodes' most recently used trees on different
# streams: eagerness compares stream by stream, never one node's tree with another's.
@example(seed=104, initial=4, schedule=[("join", 0), ("join", 0)], final_publishers=[0, 1])
def test_random_schedules_keep_every_invariant_and_deliver_after_quiescence(
    seed: int, initial: int, schedule: list[tuple], final_publishers: list[int]
) -> None:
    check_schedule(seed, initial, schedule, final_publishers)


def test_a_lost_neighbor_accept_or_disconnect_leaves_no_asymmetric_view() -> None:
    # Found by a 300-example search: half the messages lost while three nodes join left
    # (6, 3) one-sided for good, until a PONG said "not a neighbour" (membership.py).
    schedule = [
        ("join", 0),
        ("leave", 0),
        ("leave", 1),
        ("join", 0),
        ("join", 0),
        ("publish", 0),
        ("publish", 0),
        ("join", 0),
        ("join", 0),
        ("join", 0),
        ("loss", 0.5),
    ]
    check_schedule(0, 3, schedule, [0])


def test_loss_after_leave_and_joins_leaves_views_symmetric() -> None:
    # Kept from the first search (seed 0, six nodes): once a strict xfail, it passes since
    # the RAND/NEAR relabel changed which links form; a lost NEIGHBOR accept is what it hit.
    schedule = [("leave", 1), ("join", 0), ("join", 0), ("join", 0), ("loss", 0.5)]
    check_schedule(0, 6, schedule, [0])


def test_a_prune_crossing_a_repair_graft_leaves_no_link_eager_at_one_end() -> None:
    # Found by a search: a neighbour leaves, eager repair GRAFTs while a PRUNE for a
    # duplicate is on its way back; taking that PRUNE left the link eager at one end only
    # (and a node with no eager link at all). broadcast.py now GRAFTs again.
    check_schedule(1, 3, [("publish", 0), ("leave", 0), ("join", 0)], [0])
    check_schedule(0, 4, [("publish", 0), ("leave", 1)], [0])


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
    # Optimisation goes on making and ending links after quiescence, so a link may be half
    # made at any one instant (an ACCEPT in flight): a pair counts only when it is found at
    # two checks RECHECK apart, as the simulator's own symmetry metric does.
    asymmetric = persistent(h, lambda: asymmetric_pairs(h, live))
    assert not asymmetric, f"asymmetric active views after quiescence: {asymmetric}"
    views = active_views(h, live)
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
    # Both ends of a link agree whether it is eager in the tree of a stream whose final
    # messages crossed every link: PRUNE and GRAFT act on both ends, and a lost PRUNE has
    # been sent again (a stream quiet since the lossy schedule repairs at its next message).
    streams = {publisher for publisher, _ in h.checks.published[already:]}
    one_sided = persistent(h, lambda: one_sided_eager(h, live, streams))
    assert not one_sided, f"links eager at one end only: {one_sided}"


RECHECK = 5.0  # seconds: longer than any handshake of membership or broadcast in flight


def persistent(h: Harness, pairs_now) -> list[tuple[int, int]]:
    first = set(pairs_now())
    if not first:
        return []
    h.run(RECHECK)
    return sorted(first & set(pairs_now()))


def active_views(h: Harness, live: list[int]) -> dict[int, set[int]]:
    return {node: set(h.sim.nodes[node].active_view(TOPIC)) for node in live}


def asymmetric_pairs(h: Harness, live: list[int]) -> list[tuple[int, int]]:
    views = active_views(h, live)
    return [(a, b) for a in live for b in views[a] if a not in views.get(b, ())]


def one_sided_eager(h: Harness, live: list[int], streams: set[int]) -> list[tuple[int, int]]:
    """Links whose two ends disagree whether they are eager, in the delivery tree of one
    of `streams` that both ends have a tree of: each stream's tree is its own, so two nodes'
    eager sets compare stream by stream (with no per-stream trees, `shared` is the one)."""
    views = active_views(h, live)
    eager = {node: stream_eager_sets(h, node, streams) for node in live}
    return sorted(
        {
            (a, b)
            for a in live
            for b in views[a]
            if a in views.get(b, ())
            for stream in eager[a].keys() & eager[b].keys()
            if (b in eager[a][stream]) != (a in eager[b][stream])
        }
    )


def stream_eager_sets(h: Harness, node: int, streams: set[int]) -> dict[object, dict[object, None]]:
    """stream -> its tree's eager neighbours at `node`, for those of `streams` it has a
    tree of (None -> the one tree, when the topic keeps no tree per stream)."""
    trees = h.sim.nodes[node].state._topics[TOPIC].broadcast.trees
    if not trees.cap:
        return {None: trees.shared.eager}
    return {s: tree.eager for s, tree in trees.by_stream.items() if s in streams}
