"""Stream heads (heads.py, broadcast.py `_on_heads`): a stream's lost last message is found.

Sans-IO, exact outputs: a node is wired to in-memory neighbours (tests/helpers.py), time is
stepped by hand, and each test checks one rule.
"""

from __future__ import annotations

from episub.proto import messages as m
from episub.proto.broadcast import MAX_TAIL_PLACES
from episub.proto.events import Deliver, Publish, ScheduleTimer, Send
from episub.proto.heads import MAX_HEAD_HOLDERS
from episub.proto.node import NodeState
from tests.helpers import (
    TOPIC,
    broadcast,
    broadcast_config,
    envelope,
    fire,
    gossip,
    make_lazy,
    make_node,
    mid,
    node_config,
    received,
    request,
    send,
    sends,
    token,
)

PUBLISHER = 9
QUIET = 1.0  # heads_quiet of these tests' configuration (the default)
FIRST_GRAFT_TIMER = ScheduleTimer(0.125, token("missing"))  # graft_timeout after a head
MISSING_TIMER = ScheduleTimer(0.25, token("missing"))  # then missing_check_interval


def node_with(*active: int, **overrides: object) -> NodeState:
    return make_node(active=active, config=node_config(broadcast=broadcast_config(**overrides)))


def env(seq: int) -> m.Envelope:
    return envelope(PUBLISHER, seq, b"x")


def head(seq: int, hops: int = 1, publisher: object = PUBLISHER) -> m.StreamRange:
    return (publisher, seq, seq, hops)


def heads(*ranges: m.StreamRange) -> m.Heads:
    return m.Heads(ranges=ranges)


# -- the sender: a quiet stream's head is named once ---------------------------------------


def test_a_quiet_streams_head_goes_to_every_neighbour_but_its_sender_once():
    node = node_with(1, 2, 3)
    make_lazy(node, 3)
    node.handle(received(1, gossip(env(0), hops=1)), 1.0)
    node.handle(received(1, gossip(env(1), hops=2)), 1.75)
    # Not quiet yet (a quarter period): the timer comes back when the head is due.
    assert fire(node, "heads", 2.0) == [ScheduleTimer(0.75, token("heads"))]
    # Eager child and lazy neighbour alike: an eager copy may have been lost too.
    assert fire(node, "heads", 2.75) == [send(2, heads(head(1, 2))), send(3, heads(head(1, 2)))]
    assert fire(node, "heads", 3.75) == []  # once, and no timer while nothing is pending


def test_our_own_streams_head_is_named_to_every_neighbour():
    node = node_with(1, 2)
    node.handle(Publish(TOPIC, b"mine"), 1.0)
    assert fire(node, "heads", 2.0) == [
        send(1, heads(head(0, 0, publisher=0))),
        send(2, heads(head(0, 0, publisher=0))),
    ]


def test_heads_gone_quiet_together_go_in_one_message_per_link():
    node = node_with(1, 2)
    node.handle(received(1, gossip(env(4), hops=3)), 1.0)
    node.handle(received(1, gossip(envelope(8, 0, b"y"), hops=1)), 1.0)
    assert fire(node, "heads", 2.0) == [send(2, heads(head(4, 3), (8, 0, 0, 1)))]


def test_the_heads_timer_fires_at_most_twice_per_quiet_period():
    node = node_with(1, 2)
    node.handle(received(1, gossip(env(4))), 1.0)
    node.handle(received(1, gossip(envelope(8, 0, b"y"))), 1.25)
    # The second is due a quarter period later: it waits for half a period.
    assert fire(node, "heads", 2.0) == [
        send(2, heads(head(4))),
        ScheduleTimer(QUIET / 2, token("heads")),
    ]
    assert fire(node, "heads", 2.5) == [send(2, heads((8, 0, 0, 1)))]


def test_a_stream_that_keeps_arriving_sends_no_heads():
    node = node_with(1, 2)
    now = 1.0
    for seq in range(8):  # every 0.6 s: no gap stays hidden for long
        node.handle(received(1, gossip(env(seq))), now)
        now += 0.6
        assert not sends(fire(node, "heads", now), m.Heads)


def test_a_neighbour_that_named_the_head_first_is_not_told_it():
    node = node_with(1, 2, 3)
    node.handle(received(1, gossip(env(5))), 1.0)
    node.handle(received(2, heads(head(5, 2))), 1.5)
    assert fire(node, "heads", 2.0) == [send(3, heads(head(5, 1)))]


def test_a_link_that_came_up_after_the_head_is_not_told_it():
    node = node_with(1, 2)
    node.handle(received(1, gossip(env(0))), 1.0)
    node.handle(received(5, request(high_priority=True)), 1.5)
    assert 5 in node.active_view(TOPIC)
    assert fire(node, "heads", 2.0) == [send(2, heads(head(0)))]


# -- the receiver: a lost last message is found and pulled ---------------------------------


def test_a_lost_last_message_is_grafted_from_the_neighbour_that_named_it_and_delivered():
    node = node_with(1, 2)
    node.handle(received(1, gossip(env(0))), 1.0)
    node.handle(received(1, gossip(env(1))), 1.2)
    # env(2), the stream's last, never came: no later message shows the gap.
    assert node.handle(received(2, heads(head(2, 3))), 2.5) == [FIRST_GRAFT_TIMER]
    graft = m.Graft(ranges=((PUBLISHER, 2, 2, 0),))
    assert fire(node, "missing", 2.625) == [send(2, graft), MISSING_TIMER]
    out = node.handle(received(2, gossip(env(2), hops=4)), 2.7)
    assert [o for o in out if type(o) is Deliver] == [Deliver(TOPIC, mid(env(2)), env(2), 4)]
    assert broadcast(node).missing == {}


def test_several_lost_tail_messages_are_grafted_in_one_range():
    node = node_with(1, 2)
    node.handle(received(1, gossip(env(0))), 1.0)
    node.handle(received(2, heads(head(3))), 2.5)
    assert fire(node, "missing", 2.625) == [
        send(2, m.Graft(ranges=((PUBLISHER, 1, 3, 0),))),
        MISSING_TIMER,
    ]


def test_a_head_of_a_stream_never_seen_is_grafted_alone():
    # Where the stream starts for us is not the head's business: only its last is asked.
    node = node_with(1, 2)
    node.handle(received(2, heads(head(7))), 1.0)
    assert list(broadcast(node).missing) == [(PUBLISHER, 7)]


def test_a_head_we_hold_or_are_past_asks_nothing():
    node = node_with(1, 2)
    for seq in range(3):
        node.handle(received(1, gossip(env(seq))), 1.0)
    assert node.handle(received(2, heads(head(2), head(1), head(0, publisher=0))), 2.5) == []
    assert broadcast(node).missing == {}


def test_heads_from_a_non_neighbour_are_ignored():
    node = node_with(1)
    assert node.handle(received(7, heads(head(3))), 1.0) == []
    assert broadcast(node).missing == {}


# -- a lying head is bounded and harmless -------------------------------------------------


def test_a_head_far_past_the_stream_makes_at_most_max_tail_places_missing():
    node = node_with(1, 2)
    node.handle(received(1, gossip(env(0))), 1.0)
    far = m.MAX_SEQ
    node.handle(received(2, heads(head(far))), 1.5)
    missing = broadcast(node).missing
    assert len(missing) == MAX_TAIL_PLACES
    assert min(seq for _, seq in missing) == far - MAX_TAIL_PLACES + 1
    assert broadcast(node).streams[PUBLISHER].next_seq == 1  # the stream did not move


def test_a_heads_of_a_thousand_lying_publishers_costs_at_most_the_missing_table():
    node = node_with(1, 2, max_missing=50)
    lies = tuple(head(m.MAX_SEQ, publisher=b"liar-%d" % i) for i in range(m.MAX_RANGES_PER_MESSAGE))
    assert node.handle(received(2, heads(*lies)), 1.0) == [FIRST_GRAFT_TIMER]
    assert len(broadcast(node).missing) == 50
    assert broadcast(node).streams == {}  # no stream opened by a word alone


def test_a_lying_head_is_given_up_after_its_grafts_and_leaves_the_stream_as_it_was():
    node = node_with(1, 2, missing_give_up_ticks=3)
    node.handle(received(1, gossip(env(0))), 1.0)
    node.handle(received(2, heads(head(1))), 1.5)
    grafts = []
    now = 1.625
    for _ in range(4):
        out = fire(node, "missing", now)
        grafts += sends(out, m.Graft)
        now += 0.25
    assert [g.peer for g in grafts] == [2, 2, 2]  # the liar only, then given up
    assert broadcast(node).missing == {}
    node.handle(received(1, gossip(env(1))), now)  # the honest message comes after all
    assert broadcast(node).streams[PUBLISHER].next_seq == 2


def test_holders_noted_per_head_are_bounded():
    node = node_with(1)
    node.handle(received(1, gossip(env(0))), 1.0)
    b = broadcast(node)
    for peer in range(100, 100 + 3 * MAX_HEAD_HOLDERS):
        b.heads.held_by(PUBLISHER, 0, peer)
    assert len(b.heads.pending[PUBLISHER].holders) == MAX_HEAD_HOLDERS


def test_pending_heads_are_bounded_by_max_publishers():
    node = node_with(1, max_publishers=4)
    for i in range(10):
        node.handle(received(1, gossip(envelope(100 + i, 0, b"z"))), 1.0)
    assert list(broadcast(node).heads.pending) == [106, 107, 108, 109]
    assert all(type(o) is not Send for o in fire(node, "heads", 1.0))
