"""A stream first seen after the topic's join reaches back (episub/proto/ordering.py): the
messages before its first one may have been published after the join too, while this
node had no link; those are delivered, in order, and those from before the join are not.

The node joins at now=0.0 (its join time, 0 ms); a stamp above 0 is after the join."""

from __future__ import annotations

from episub.proto import messages as m
from episub.proto.config import NodeConfig
from episub.proto.events import DataLost, Deliver, JoinTopic, OutEvent, Publish, Recovered, Send
from episub.proto.node import NodeState
from episub.proto.store import RetentionConfig
from episub.sim.engine import Simulator
from episub.sim.latency import make_latency
from episub.sim.metrics import WARMUP, payload_for
from tests.core_checks import CheckedNode, Checks
from tests.helpers import (
    TOPIC,
    broadcast_config,
    envelope,
    fire,
    gossip,
    make_node,
    mid,
    node_config,
    received,
    send,
)

PUBLISHER = 9
# ms: stamped after the join (at 0 ms), and later than any `now` here: messages arrive
# with no age, so a step stands gap_retry_interval before it counts as unanswered.
AFTER_JOIN = 10**6
BEFORE_JOIN = 0  # the join's own millisecond counts as before it


def node_with(
    *active: int, retention: RetentionConfig | None = None, **overrides: object
) -> NodeState:
    config = node_config(broadcast=broadcast_config(stream_settle=0.5, **overrides))
    return make_node(active=active, config=config, retention=retention)


def env(seq: int, stamp: int = AFTER_JOIN) -> m.Envelope:
    return envelope(PUBLISHER, seq, timestamp_ms=stamp)


def pull(first: int, last: int) -> m.Pull:
    return m.Pull(publisher=PUBLISHER, first_seq=first, last_seq=last)


def deliveries(out: list[OutEvent]) -> list[int]:
    return [e.envelope.seq for e in out if isinstance(e, Deliver)]


def pulls(out: list[OutEvent]) -> list[tuple[object, int, int]]:
    return [
        (e.peer, e.message.first_seq, e.message.last_seq)
        for e in out
        if isinstance(e, Send) and isinstance(e.message, m.Pull)
    ]


def test_a_stream_first_seen_after_the_join_pulls_back_to_seq_0_and_delivers_all_in_order():
    node = node_with(1, 2)
    assert deliveries(node.handle(received(1, gossip(env(5))), 1.0)) == []
    out = fire(node, "settle", 1.5)
    assert deliveries(out) == []
    assert pulls(out) == [(1, 4, 4)]  # the seq below, from the first neighbour
    out = node.handle(received(1, gossip(env(4))), 1.6)
    assert pulls(out) == [(1, 3, 3)]  # from the neighbour that held it, one more
    out = node.handle(received(1, gossip(env(3))), 1.7)
    assert pulls(out) == [(1, 1, 2)]  # twice as many: as many as the reach covered
    out = node.handle(received(1, gossip(env(1))), 1.8)  # a PULL's answers come rising
    assert pulls(out) == [(1, 0, 0)]  # the step's lowest came: on at once
    got = deliveries(out) + deliveries(node.handle(received(1, gossip(env(2))), 1.8))
    got += deliveries(node.handle(received(1, gossip(env(0))), 1.9))
    assert got == [0, 1, 2, 3, 4, 5]
    stats = node.stats()
    assert (stats["reach_backs"], stats["reached_back"], stats["reach_backs_cut"]) == (1, 5, 0)


def test_the_reach_stops_at_a_message_from_before_the_join_which_is_history():
    node = node_with(1, 2)
    node.handle(received(1, gossip(env(5))), 1.0)
    node.handle(received(1, gossip(env(6))), 1.1)
    fire(node, "settle", 1.5)
    old = env(4, BEFORE_JOIN)
    out = node.handle(received(1, gossip(old)), 1.6)
    assert Recovered(TOPIC, mid(old), old) in out
    assert deliveries(out) == [5, 6]
    assert deliveries(node.handle(received(2, gossip(env(7))), 1.7)) == [7]


def test_an_answer_within_the_reach_is_not_forwarded():
    node = node_with(1, 2)
    node.handle(received(1, gossip(env(5))), 1.0)
    fire(node, "settle", 1.5)
    out = node.handle(received(1, gossip(env(4))), 1.6)
    assert [e for e in out if isinstance(e, Send) and isinstance(e.message, m.Gossip)] == []


def test_a_step_nobody_answers_is_asked_of_each_neighbour_once_then_the_stream_starts():
    """Unanswered: nobody holds the seq below, as with messages from long before the join
    (expired everywhere); no DataLost for them, the stream starts at what it holds."""
    node = node_with(1, 2)
    node.handle(received(1, gossip(env(5))), 1.0)
    assert pulls(fire(node, "settle", 1.5)) == [(1, 4, 4)]
    assert pulls(fire(node, "settle", 2.0)) == [(2, 4, 4)]
    out = fire(node, "settle", 2.5)
    assert pulls(out) == [] and deliveries(out) == [5]
    assert not any(isinstance(e, DataLost) for e in out)
    assert node.stats()["reach_backs_cut"] == 1


def test_a_stale_settle_timer_does_not_hurry_a_step():
    node = node_with(1, 2)
    node.handle(received(1, gossip(env(5))), 1.0)
    fire(node, "settle", 1.5)
    node.handle(received(1, gossip(env(4))), 1.6)  # the next step is due at 2.1
    assert fire(node, "settle", 2.0) == []


def test_the_reach_goes_no_further_than_max_gap_below_the_first_message():
    node = node_with(1, max_gap=4)
    node.handle(received(1, gossip(env(10))), 1.0)
    asked = pulls(fire(node, "settle", 1.5))
    for seq in range(9, 5, -1):
        out = node.handle(received(1, gossip(env(seq))), 1.6)
        asked += pulls(out)
    assert asked == [(1, 9, 9), (1, 8, 8), (1, 6, 7)]
    assert deliveries(out) == [6, 7, 8, 9, 10]
    assert node.stats()["reach_backs_cut"] == 1


def test_a_stream_first_seen_at_a_message_from_before_the_join_starts_there():
    node = node_with(1, 2)
    node.handle(received(1, gossip(env(5, BEFORE_JOIN))), 1.0)
    out = fire(node, "settle", 1.5)
    assert deliveries(out) == [5] and pulls(out) == []


def test_a_node_with_no_neighbour_left_starts_the_stream_at_once():
    node = node_with(1)
    node.handle(received(1, gossip(env(5))), 1.0)
    node.handle(received(1, m.Disconnect(alive=False)), 1.2)
    out = fire(node, "settle", 1.5)
    assert deliveries(out) == [5] and pulls(out) == []
    assert node.stats()["reach_backs_cut"] == 1


def test_a_gap_above_a_message_from_before_the_join_is_repaired_as_any_gap():
    node = node_with(1, 2)
    node.handle(received(1, gossip(env(5))), 1.0)
    fire(node, "settle", 1.5)
    node.handle(received(1, gossip(env(4))), 1.6)
    node.handle(received(1, gossip(env(3))), 1.7)  # asks 1..2
    out = node.handle(received(1, gossip(env(1, BEFORE_JOIN))), 1.8)
    assert deliveries(out) == []  # 2 is missing, after the join: a gap, pulled as usual
    out = node.handle(received(1, gossip(env(2))), 1.9)
    assert deliveries(out) == [2, 3, 4, 5]


def test_a_pull_answer_that_is_not_the_whole_step_is_asked_again():
    node = node_with(1, 2)
    node.handle(received(1, gossip(env(5))), 1.0)
    fire(node, "settle", 1.5)
    node.handle(received(1, gossip(env(4))), 1.6)
    node.handle(received(1, gossip(env(3))), 1.7)  # asks 1..2 of 1
    node.handle(received(1, gossip(env(2))), 1.8)  # 1 does not come
    assert send(2, pull(1, 1)) in fire(node, "settle", 2.2)


def test_live_messages_that_fill_held_end_the_reach_where_they_start():
    node = node_with(1, 2, max_held_per_publisher=2)
    node.handle(received(1, gossip(env(5))), 1.0)
    out = fire(node, "settle", 1.5)
    assert pulls(out) == [(1, 4, 4)]  # room for one more
    node.handle(received(2, gossip(env(6))), 1.6)  # held is full now
    out = node.handle(received(1, gossip(env(4))), 1.7)
    assert deliveries(out) == [5, 6]
    assert Recovered(TOPIC, mid(env(4)), env(4)) in out
    assert node.stats()["reach_backs_cut"] == 1


def test_a_forgotten_streams_messages_are_not_delivered_again_by_a_reach():
    """A stream forgotten to make room (max_publishers) starts anew when its publisher
    sends again; its reach treats what was delivered before as history, even where `seen`
    has forgotten the ids too."""
    node = node_with(1, max_publishers=1, retention=RetentionConfig(seen_max=2))
    for seq in range(3):
        node.handle(received(1, gossip(env(seq))), 1.0)
    node.handle(received(1, gossip(envelope(8, 0, timestamp_ms=AFTER_JOIN))), 1.1)  # evicts 9
    node.handle(received(1, gossip(envelope(8, 1, timestamp_ms=AFTER_JOIN))), 1.1)
    node.handle(received(1, gossip(env(3, AFTER_JOIN + 5))), 1.2)  # evicts 8, settles
    assert pulls(fire(node, "settle", 1.7)) == [(1, 2, 2)]
    out = node.handle(received(1, gossip(env(2))), 1.8)  # delivered before, forgotten since
    assert deliveries(out) == [3]
    assert node.stats()["streams_evicted"] == 2


def test_in_the_simulator_a_node_cut_off_after_its_join_gets_every_later_message():
    """Node 5 joins, is partitioned off while node 1 publishes 0..4 (its first messages),
    links again once the partition heals, and node 1 publishes 5..9: node 5 gets 0..9 in
    order, the first five by its stream's reach back (it got 5..9 alone, or 4..9 when a
    HEADS named 4)."""
    checks = Checks()
    sim = Simulator(
        latency=make_latency("uniform", 1),
        seed=1,
        node_factory=lambda peer, rng: CheckedNode(peer, rng, checks, NodeConfig()),
    )
    for node in range(6):
        sim.add_node(node)
        sim.input(node, JoinTopic(TOPIC, tuple(range(node))))
    sim.run(5.0)
    sim.partition(bytearray([0, 0, 0, 0, 0, 1]))
    sim.run(6.0)
    for i in range(5):
        sim.input(1, Publish(TOPIC, payload_for(WARMUP, i)))
    sim.run(8.0)
    sim.heal()
    sim.run(40.0)
    assert sim.nodes[5].state.active_view(TOPIC)  # linked again
    for i in range(5, 10):
        sim.input(1, Publish(TOPIC, payload_for(WARMUP, i)))
    sim.run(60.0)
    assert [seq for publisher, seq, _ in checks.in_order[5] if publisher == 1] == list(range(10))
    assert 5 not in checks.lost
