"""HyParView membership with GoCast proximity: one test per rule of episub/proto/membership.py,
episub/proto/proximity.py and episub/proto/passive.py.

Each test drives `NodeState.handle` with an explicit `now` and compares exact outputs.
Configuration comes from tests/helpers.py: C_rand=2, C_near=1 (A=3, max_active=6),
no timer jitter. Where the core picks at random, the test reads the pick from the output
and checks it against the rule.
"""

from __future__ import annotations

import math
import random

import pytest

from episub.proto import messages as m
from episub.proto.errors import LocalProtocolError
from episub.proto.events import (
    ClosePeer,
    ConnectionLost,
    Isolated,
    JoinTopic,
    LeaveTopic,
    NeighborDown,
    NeighborUp,
    PeerMisbehaved,
    RefreshContacts,
    RttMeasured,
    ScheduleTimer,
    TimerFired,
)
from episub.proto.node import NodeState
from episub.proto.passive import LATE_REPLY_MEMORY, LATE_SHUFFLE_MEMORY
from tests.helpers import (
    ME,
    NEAR,
    RAND,
    TOPIC,
    Network,
    accept,
    broadcast,
    fire,
    make_node,
    membership,
    membership_config,
    node_config,
    only,
    received,
    request,
    send,
    sends,
    set_rtt,
    token,
)

A = 3  # C_rand + C_near in membership_config(); `make_node` neighbours claim A links
MAX_ACTIVE = 6


def stabilize_timer() -> ScheduleTimer:
    return ScheduleTimer(2.0, token("stabilize"))


def ping_nonce_of(node: NodeState, peer: int) -> int:
    """The nonce of the PING in flight to `peer`."""
    [nonce] = [n for n, p in membership(node).passive_view.pings.items() if p.peer == peer]
    return nonce


def ping_nonce(out: list, peer: int) -> int:
    return only([e for e in out if getattr(e, "peer", None) == peer], m.Ping).message.nonce


# -- joining ------------------------------------------------------------------------------


def test_join_topic_schedules_every_periodic_timer_and_asks_contacts_for_nodes():
    node = NodeState(ME, node_config(), random.Random(0))
    out = node.handle(JoinTopic(TOPIC, (5, ME, 6)), 0.0)
    assert out == [
        ScheduleTimer(2.0, token("stabilize")),
        ScheduleTimer(5.0, token("optimize")),
        ScheduleTimer(30.0, token("shuffle")),
        ScheduleTimer(5.0, token("ping")),
        ScheduleTimer(1.0, token("probe")),
        send(5, m.GetNodes()),
        send(6, m.GetNodes()),
        ScheduleTimer(3.0, token("join_retry")),
    ]


def test_join_topic_without_bootstrap_starts_a_new_overlay_quietly():
    node = NodeState(ME, node_config(), random.Random(0))
    out = node.handle(JoinTopic(TOPIC), 0.0)
    assert sends(out) == []
    assert node.topics() == [TOPIC]


def test_getnodes_is_answered_with_nodes_from_active_then_passive_view():
    node = make_node(active=[1, 2], passive=[5, 6])
    out = node.handle(received(9, m.GetNodes()), 1.0)
    assert out == [send(9, m.Nodes(peers=(1, 2, 5, 6)))]


def test_nodes_answer_leads_to_c_rand_joins_and_initial_pings():
    node = NodeState(ME, node_config(), random.Random(0))
    node.handle(JoinTopic(TOPIC, (5,)), 0.0)
    out = node.handle(received(5, m.Nodes(peers=(6, 7, ME, 8))), 0.5)

    joins = sends(out, m.Join)
    pings = sends(out, m.Ping)
    assert out == joins + pings
    assert len(joins) == 2  # C_rand
    assert len({j.peer for j in joins}) == 2
    assert {j.peer for j in joins} <= {5, 6, 7, 8}
    assert all(j.message == m.Join(peer=ME, ttl=4) for j in joins)
    # Every learned peer is probed (initial_probes=8 >= 4), none asked for its view.
    assert sorted(p.peer for p in pings) == [5, 6, 7, 8]
    assert all(not p.message.want_view for p in pings)
    assert node.passive_view(TOPIC) == [5, 6, 7, 8]
    assert node.active_view(TOPIC) == {}


def test_initial_pings_are_bounded_by_initial_probes():
    cfg = node_config(membership_config(initial_probes=2))
    node = NodeState(ME, cfg, random.Random(0))
    node.handle(JoinTopic(TOPIC, (5,)), 0.0)
    out = node.handle(received(5, m.Nodes(peers=(6, 7, 8))), 0.5)
    assert len(sends(out, m.Ping)) == 2


def test_a_second_nodes_answer_adds_to_passive_but_sends_no_more_joins():
    node = NodeState(ME, node_config(), random.Random(0))
    node.handle(JoinTopic(TOPIC, (5, 6)), 0.0)
    node.handle(received(5, m.Nodes(peers=(7,))), 0.5)
    out = node.handle(received(6, m.Nodes(peers=(8,))), 0.5)
    assert sends(out, m.Join) == []
    assert node.passive_view(TOPIC) == [5, 7, 6, 8]


def test_join_retry_asks_contacts_again_while_nothing_is_connected():
    node = NodeState(ME, node_config(), random.Random(0))
    node.handle(JoinTopic(TOPIC, (5,)), 0.0)
    assert fire(node, "join_retry", 3.0) == [
        send(5, m.GetNodes()),
        ScheduleTimer(3.0, token("join_retry")),
    ]


def test_join_retry_stops_once_a_contact_answered_and_a_link_is_up():
    node = NodeState(ME, node_config(), random.Random(0))
    node.handle(JoinTopic(TOPIC, (5,)), 0.0)
    node.handle(received(5, m.Nodes(peers=(6,))), 0.5)
    node.handle(received(5, request(RAND, high_priority=True)), 1.0)
    assert fire(node, "join_retry", 3.0) == []


def test_join_retry_goes_on_while_our_getnodes_is_unanswered_even_with_links():
    # Our GETNODES (or its NODES answer) was lost, and a newcomer joined through us: its
    # link must not stop our own join, or the two of us root an island for good (the
    # 2%-loss simulator runs that split into two full components).
    node = NodeState(ME, node_config(), random.Random(0))
    node.handle(JoinTopic(TOPIC, (5,)), 0.0)
    node.handle(received(9, m.Join(peer=9, ttl=6)), 1.0)  # 9 joins through us
    node.handle(received(9, accept()), 1.1)
    assert 9 in node.active_view(TOPIC)
    assert fire(node, "join_retry", 3.0) == [
        send(5, m.GetNodes()),
        ScheduleTimer(3.0, token("join_retry")),
    ]
    out = node.handle(received(5, m.Nodes(peers=(6, 7))), 3.5)  # answered at last
    assert {s.peer for s in sends(out, m.Join)} <= {5, 6, 7} and sends(out, m.Join)
    node.handle(received(6, request(RAND, high_priority=True)), 3.6)  # 6 took our JOIN in
    assert fire(node, "join_retry", 6.0) == []


def test_join_retry_goes_on_while_no_join_of_ours_was_taken_in():
    # The contact answered, but every JOIN we sent was lost (or dropped by full nodes at
    # the walk's end): nobody took us in, so we ask again, whatever links others made.
    node = NodeState(ME, node_config(), random.Random(0))
    node.handle(JoinTopic(TOPIC, (5,)), 0.0)
    node.handle(received(5, m.Nodes(peers=(6,))), 0.5)
    node.handle(received(9, m.Join(peer=9, ttl=6)), 1.0)
    node.handle(received(9, accept()), 1.1)
    assert fire(node, "join_retry", 3.0) == [
        send(5, m.GetNodes()),
        ScheduleTimer(3.0, token("join_retry")),
    ]


def test_each_join_retry_walks_one_hop_shorter_down_to_the_contact_itself():
    # The draft's NAT rule: "If P fails to join ... it decrements the TTL and tries another
    # starting node. This is repeated until a TTL of zero reuses the connection".
    node = NodeState(ME, node_config(membership_config(join_ttl=2)), random.Random(0))
    node.handle(JoinTopic(TOPIC, (5,)), 0.0)
    ttls = []
    for round_ in range(4):
        now = 3.0 * round_
        out = node.handle(received(5, m.Nodes(peers=(6,))), now + 0.5)
        ttls.append({s.message.ttl for s in sends(out, m.Join)})
        assert sends(fire(node, "join_retry", now + 3.0)) == [send(5, m.GetNodes())]
    assert ttls == [{2}, {1}, {0}, {0}]


def test_a_joiner_we_cannot_reach_has_its_join_walk_on_one_hop_shorter():
    # The draft's connection check: "Q tries to open a connection to P. If the connection
    # cannot be opened (e.g. because of NAT) ... Q decrements the TTL and forwards".
    node = make_node(active=[1, 2])
    node.handle(received(1, m.Join(peer=9, ttl=3)), 1.0)
    out = node.handle(ConnectionLost(9), 1.2)
    assert sends(out, m.Join) in (
        [send(1, m.Join(peer=9, ttl=2))],
        [send(2, m.Join(peer=9, ttl=2))],
    )
    # A JOIN taken at the end of its walk (ttl 0) stops there.
    node = make_node(active=[1, 2, 3])
    node.handle(received(1, m.Join(peer=9, ttl=0)), 1.0)
    assert sends(node.handle(ConnectionLost(9), 1.2), m.Join) == []


def test_joins_for_made_up_peers_cannot_grow_pending_requests_past_max_active():
    # A key holder sent JOINs naming peer after peer: each one accepted became a pending
    # NEIGHBOR request (and, on the network, a dial to wherever the id pointed).
    node = make_node(active=[1])
    for joiner in range(100, 120):
        node.handle(received(1, m.Join(peer=joiner, ttl=0)), 1.0)
    assert len(membership(node).pending) + len(node.active_view(TOPIC)) == MAX_ACTIVE


def test_join_through_a_contact_makes_a_symmetric_random_link():
    contact = make_node(1)
    joiner = NodeState(9, node_config(), random.Random(9))
    net = Network([contact, joiner])
    log = net.handle(9, JoinTopic(TOPIC, (1,)), 0.0)
    assert NeighborUp(TOPIC, 1, RAND) in log[9]
    assert NeighborUp(TOPIC, 9, RAND) in log[1]
    assert joiner.active_view(TOPIC) == {1: RAND}
    assert contact.active_view(TOPIC) == {9: RAND}
    assert joiner.passive_view(TOPIC) == []


def test_join_is_accepted_while_active_view_below_A():
    node = make_node(active=[1, 2])
    out = node.handle(received(1, m.Join(peer=9, ttl=3)), 1.0)
    assert out == [
        send(9, request(RAND, high_priority=True, links=2, rand=2)),
        send(2, m.ForwardJoin(peer=9, ttl=2)),
    ]


def test_join_with_ttl_0_is_accepted_even_when_view_is_full():
    node = make_node(active=[1, 2, 3])
    out = node.handle(received(1, m.Join(peer=9, ttl=0)), 1.0)
    assert out[0] == send(9, request(RAND, high_priority=True, links=3, rand=3))
    assert out[1:] in (
        [send(2, m.ForwardJoin(peer=9, ttl=2))],
        [send(3, m.ForwardJoin(peer=9, ttl=2))],
    )


def test_join_is_accepted_when_there_is_no_other_neighbour_to_walk_to():
    cfg = node_config(membership_config(c_rand=1, c_near=0))
    node = make_node(active=[1], config=cfg)
    out = node.handle(received(1, m.Join(peer=9, ttl=3)), 1.0)
    assert out == [send(9, request(RAND, high_priority=True, links=1, rand=1))]


def test_join_is_forwarded_with_ttl_minus_1_when_view_is_full():
    node = make_node(active=[1, 2, 3])
    out = node.handle(received(1, m.Join(peer=9, ttl=3)), 1.0)
    assert out in (
        [send(2, m.Join(peer=9, ttl=2))],
        [send(3, m.Join(peer=9, ttl=2))],
    )
    assert 9 not in node.passive_view(TOPIC)


def test_joiner_becomes_active_only_after_it_accepts():
    node = make_node(active=[1])
    node.handle(received(1, m.Join(peer=9, ttl=3)), 1.0)
    assert 9 not in node.active_view(TOPIC)
    out = node.handle(received(9, accept(RAND, links=1, rand=1)), 1.25)
    assert out == [NeighborUp(TOPIC, 9, RAND)]
    assert node.active_view(TOPIC) == {1: RAND, 9: RAND}


def test_high_priority_request_is_accepted_above_A_as_the_kind_asked():
    node = make_node(active=[1, 2, 3, 4, 5])  # above A, below max_active
    out = node.handle(received(7, request(NEAR, high_priority=True, links=3)), 1.0)
    assert out == [NeighborUp(TOPIC, 7, NEAR), send(7, accept(NEAR, links=6, rand=5))]


def test_forward_join_adds_joiner_to_passive_and_walks_on_while_ttl_positive():
    node = make_node(active=[1, 2])
    out = node.handle(received(1, m.ForwardJoin(peer=9, ttl=2)), 1.0)
    assert out == [send(2, m.ForwardJoin(peer=9, ttl=1))]
    assert node.passive_view(TOPIC) == [9]


def test_forward_join_with_ttl_0_stops_after_adding_to_passive():
    node = make_node(active=[1, 2])
    out = node.handle(received(1, m.ForwardJoin(peer=9, ttl=0)), 1.0)
    assert out == []
    assert node.passive_view(TOPIC) == [9]


# -- neighbour requests --------------------------------------------------------------------


def test_neighbor_request_is_accepted_below_A():
    node = make_node(active=[1, 2], passive=[5])
    out = node.handle(received(5, request(NEAR, rtt=0.25, links=3)), 1.0)
    assert out == [NeighborUp(TOPIC, 5, NEAR), send(5, accept(NEAR, links=3, rand=2))]
    assert node.passive_view(TOPIC) == []
    assert node.rtt(5) == 0.25  # the requester's RTT to us: its word until we measure it
    assert node.rtts.measured(5) is None


def test_a_claimed_rtt_is_the_peers_word_until_measured_and_never_sticks():
    """Issue 13, item 5: a NEIGHBOR request's claimed RTT went into the node-wide RTT
    table as a sample before the request was judged, refused or not. A claimed 0.0 stuck
    (a lower sample is taken at once, a higher one moves the value by 1/8) and the liar
    was later relabelled near. A claim now stands only until our first sample replaces
    it, and never moves a measured RTT."""
    node = make_node(active=[1, 2, 3], passive=[5])  # full: A = 3
    out = node.handle(received(5, request(RAND, rtt=0.0, links=4, rand=2)), 1.0)
    assert out == [send(5, m.Disconnect(alive=True))]
    assert node.rtt(5) == 0.0 and node.rtts.measured(5) is None
    nonce = ping_nonce(fire(node, "probe", 2.0), 5)
    node.handle(received(5, m.Pong(nonce=nonce)), 2.25)
    assert node.rtt(5) == 0.25 == node.rtts.measured(5)
    node.handle(received(5, request(RAND, rtt=0.0, links=4, rand=2)), 3.0)
    assert node.rtt(5) == 0.25  # a claim never moves a measurement


def test_a_near_request_is_held_beside_our_own_links_whatever_rtt_it_claims():
    # Full (A = 3): 5's near link is its choice, held beside our RAND 1, 2 and our own
    # NEAR 3; no link of ours is evicted for it, and its claim of 0.0 is not a sample.
    node = make_node(active={1: RAND, 2: RAND, 3: NEAR}, rtts={3: 0.25, 5: 0.5}, links={3: 4})
    out = node.handle(received(5, request(NEAR, rtt=0.0, links=4, rand=2)), 1.0)
    assert out == [NeighborUp(TOPIC, 5, NEAR), send(5, accept(NEAR, links=4, rand=2))]
    assert node.active_view(TOPIC) == {1: RAND, 2: RAND, 3: NEAR, 5: NEAR}
    assert node.rtt(5) == 0.5 == node.rtts.measured(5)
    mem = membership(node)
    assert (mem.link_count(), mem.held_for_others()) == (A, 1)
    # It is not ours to drop: a full view does not shrink it away, and our own near
    # slot stays ours to fill (3 is still the near link optimisation may replace).
    assert sends(fire(node, "stabilize", 2.0)) == []
    assert mem.proximity.farthest_near() == (3, 0.25)


def test_near_links_held_for_peers_are_bounded_by_max_active_less_A():
    # Room beside our own A links: max_active - A = 3 near links chosen by peers.
    node = make_node(active={1: RAND, 2: RAND, 3: NEAR})
    for peer in (5, 6, 7):
        out = node.handle(received(peer, request(NEAR, rtt=0.125, links=4, rand=2)), 1.0)
        assert out[0] == NeighborUp(TOPIC, peer, NEAR)
    out = node.handle(received(8, request(NEAR, rtt=0.125, links=4, rand=2)), 1.0)
    assert out == [send(8, m.Disconnect(alive=True))]
    assert len(node.active_view(TOPIC)) == MAX_ACTIVE


def test_neighbor_request_is_accepted_as_rand_when_requester_has_fewer_than_c_rand_links():
    node = make_node(active={1: RAND, 2: RAND, 3: NEAR})
    out = node.handle(received(5, request(NEAR, rtt=0.5, links=1, rand=1)), 1.0)
    assert out == [NeighborUp(TOPIC, 5, RAND), send(5, accept(RAND, links=4, rand=3))]


@pytest.mark.parametrize(
    ("msg", "proximity"),
    [
        (request(RAND, rtt=0.01, links=4), True),
        (request(NEAR, rtt=0.01, links=4), False),
    ],
    ids=["rand-with-c_rand-links", "proximity-off"],
)
def test_neighbor_request_refused_with_disconnect_when_full(msg, proximity):
    cfg = node_config(membership_config(c_near=2, proximity=proximity))
    node = make_node(
        active={1: RAND, 2: RAND, 3: NEAR, 4: NEAR}, rtts={3: 0.125, 4: 0.25}, config=cfg
    )
    out = node.handle(received(5, msg), 1.0)
    assert out == [send(5, m.Disconnect(alive=True))]
    assert 5 not in node.active_view(TOPIC)


def test_max_active_cap_refuses_even_a_high_priority_request():
    node = make_node(active=[1, 2, 3, 4, 5, 6])
    assert len(node.active_view(TOPIC)) == MAX_ACTIVE == 2 * A
    out = node.handle(received(7, request(RAND, high_priority=True, links=0)), 1.0)
    assert out == [send(7, m.Disconnect(alive=True))]


def test_repeated_request_from_a_neighbour_is_answered_with_the_existing_link():
    node = make_node(active={1: RAND, 2: NEAR})
    out = node.handle(received(2, request(NEAR, links=5, rand=1)), 1.0)
    assert out == [send(2, accept(NEAR, links=2, rand=1))]
    assert membership(node).active[2].peer_active == 5


def test_refuser_is_not_asked_again_until_recent_reject_memory_passes():
    node = make_node(passive=[5])
    asking = [send(5, request(RAND, links=0)), stabilize_timer()]
    assert fire(node, "stabilize", 1.0) == asking
    assert node.handle(received(5, m.Disconnect(alive=True)), 1.5) == []
    assert node.passive_view(TOPIC) == [5]
    assert fire(node, "stabilize", 3.5) == [stabilize_timer()]
    assert fire(node, "stabilize", 11.25) == [stabilize_timer()]
    assert fire(node, "stabilize", 11.5) == asking  # refused at 1.5 + recent_reject_memory


def test_crossed_requests_make_one_link_even_when_full():
    # We asked 5 (stabilisation), then filled up before its answer; 5 asked us meanwhile.
    node = make_node(active=[1, 2], passive=[5])
    assert sends(fire(node, "stabilize", 1.0)) == [send(5, request(NEAR, links=2, rand=2))]
    node.handle(received(3, request(RAND, high_priority=True)), 1.0)
    # Full now, and 5's request alone would be refused (no RTT, enough links).
    out = node.handle(received(5, request(NEAR, links=4)), 1.25)
    assert out == [NeighborUp(TOPIC, 5, NEAR), send(5, accept(NEAR, links=4, rand=3))]
    # 5's answer to our own request makes no second link.
    assert node.handle(received(5, accept(NEAR, links=4)), 1.5) == []
    assert list(node.active_view(TOPIC)) == [1, 2, 3, 5]


def test_crossed_requests_of_different_kinds_agree_on_the_kind():
    # 0 has no link and asks 5 for a RAND one; 5 has its C_rand RAND links and asks 0 for a
    # NEAR one. Both requests cross on the wire.
    a = make_node(0, passive=[5])
    b = make_node(5, active={1: RAND, 2: RAND}, passive=[0], rtts={0: 0.0625}, seed=5)
    a_req = only(fire(a, "stabilize", 1.0), m.Neighbor).message
    b_req = only(fire(b, "stabilize", 1.0), m.Neighbor).message
    assert (a_req.kind, b_req.kind) == (RAND, NEAR)
    a_acc = only(a.handle(received(5, b_req), 1.25), m.Neighbor).message
    b_acc = only(b.handle(received(0, a_req), 1.25), m.Neighbor).message
    a.handle(received(5, b_acc), 1.5)
    b.handle(received(0, a_acc), 1.5)
    assert a.active_view(TOPIC)[5] == b.active_view(TOPIC)[0]


def test_unsolicited_neighbor_accept_does_not_make_a_link():
    node = make_node(active=[1])
    out = node.handle(received(9, accept(RAND)), 1.0)
    assert 9 not in node.active_view(TOPIC)
    assert NeighborUp(TOPIC, 9, RAND) not in out


def test_accepting_a_join_never_takes_the_view_past_max_active():
    node = make_node(active=[1, 2, 3, 4, 5, 6])
    node.handle(received(1, m.Join(peer=9, ttl=0)), 1.0)
    node.handle(received(9, accept(RAND, links=1, rand=1)), 1.25)
    assert len(node.active_view(TOPIC)) <= MAX_ACTIVE


# -- disconnect, leave, connection loss ---------------------------------------------------


def test_disconnect_alive_moves_neighbour_from_active_to_passive():
    node = make_node(active=[1, 2])
    out = node.handle(received(1, m.Disconnect(alive=True)), 1.0)
    assert out == [NeighborDown(TOPIC, 1), ClosePeer(1)]
    assert node.active_view(TOPIC) == {2: RAND}
    assert node.passive_view(TOPIC) == [1]


def test_disconnect_not_alive_forgets_the_neighbour():
    node = make_node(active=[1, 2], passive=[5])
    out = node.handle(received(1, m.Disconnect(alive=False)), 1.0)
    assert out == [NeighborDown(TOPIC, 1), ClosePeer(1)]
    assert node.handle(received(5, m.Disconnect(alive=False)), 1.0) == []
    assert node.active_view(TOPIC) == {2: RAND}
    assert node.passive_view(TOPIC) == []


def test_leave_removes_departed_neighbour_and_is_forwarded_to_the_other_neighbours():
    node = make_node(active=[1, 2, 3])
    out = node.handle(received(2, m.Leave(peer=2, ttl=1)), 1.0)
    assert out == [
        NeighborDown(TOPIC, 2),
        send(1, m.Leave(peer=2, ttl=0)),
        send(3, m.Leave(peer=2, ttl=0)),
        ClosePeer(2),
    ]
    assert node.active_view(TOPIC) == {1: RAND, 3: RAND}
    assert node.passive_view(TOPIC) == []


def test_a_leave_about_a_neighbour_is_taken_only_from_that_neighbour():
    # Found by the adversarial model (tests/test_adversary.py): a key holder's forged
    # LEAVE for an honest node, diffused two rings out, took it out of every active view
    # there, and it missed messages until its links grew back.
    node = make_node(active=[1, 2, 3])
    assert node.handle(received(1, m.Leave(peer=2, ttl=2)), 1.0) == []
    assert node.active_view(TOPIC) == {1: RAND, 2: RAND, 3: RAND}


def test_leave_removes_departed_passive_peer_and_is_forwarded():
    node = make_node(active=[1, 2], passive=[5, 6])
    out = node.handle(received(1, m.Leave(peer=5, ttl=0)), 1.0)
    assert out == [send(2, m.Leave(peer=5, ttl=0))]
    assert node.passive_view(TOPIC) == [6]


def test_leave_of_an_unknown_peer_is_forwarded_only_while_ttl_positive():
    node = make_node(active=[1, 2, 3])
    assert node.handle(received(1, m.Leave(peer=9, ttl=0)), 1.0) == []
    out = node.handle(received(1, m.Leave(peer=8, ttl=2)), 1.0)
    assert out == [send(2, m.Leave(peer=8, ttl=1)), send(3, m.Leave(peer=8, ttl=1))]


def test_leave_is_forwarded_only_once():
    node = make_node(active=[1, 2, 3])
    assert node.handle(received(1, m.Leave(peer=9, ttl=2)), 1.0) != []
    assert node.handle(received(2, m.Leave(peer=9, ttl=2)), 1.0) == []
    assert node.handle(received(3, m.Leave(peer=9, ttl=1)), 2.0) == []


def test_leave_is_forwarded_only_once_when_the_left_memory_is_full():
    """The adversarial model (issue 13): a key holder sent LEAVEs of three strangers,
    filling every node's left memory (3 in the model), then a LEAVE of a fourth with ttl
    64. Not remembered, it was forwarded again on every copy that came back: the five
    nodes handled 200,000 messages within a simulated second and the run ran out of
    memory. Full, the memory forgets its oldest departure and keeps the new one."""
    node = make_node(active=[1, 2, 3], config=node_config(membership_config(max_left_memory=2)))
    node.handle(received(1, m.Leave(peer=7, ttl=0)), 1.0)
    node.handle(received(1, m.Leave(peer=8, ttl=0)), 1.5)
    assert node.handle(received(1, m.Leave(peer=9, ttl=64)), 2.0) != []
    assert node.handle(received(2, m.Leave(peer=9, ttl=63)), 2.1) == []
    assert node.handle(received(3, m.Leave(peer=9, ttl=62)), 2.2) == []
    assert sorted(node._topics[TOPIC].membership.left) == [8, 9]


def test_departed_peer_is_kept_out_of_views_for_left_memory():
    node = make_node(active=[1, 2])
    node.handle(received(1, m.Leave(peer=9, ttl=0)), 1.0)  # left_memory: until 61.0
    assert node.handle(received(1, m.ForwardJoin(peer=9, ttl=0)), 30.0) == []
    node.handle(received(1, m.Shuffle(origin=7, ttl=0, peers=(7, 9))), 30.0)
    assert node.passive_view(TOPIC) == [7]
    fire(node, "stabilize", 61.0)
    node.handle(received(1, m.ForwardJoin(peer=9, ttl=0)), 61.0)
    assert node.passive_view(TOPIC) == [7, 9]


def test_a_departed_peer_that_joins_again_is_taken_in_at_once():
    """Issue 13, item 6: a node that left a topic and joined again 2 s later was ignored
    for a minute by every node that had heard its LEAVE: its JOINs dropped unanswered and
    its NEIGHBOR requests refused; its subscriber missed 610 of 696 messages."""
    node = make_node(active=[1, 9])
    node.handle(received(9, m.Leave(peer=9, ttl=0)), 1.0)
    assert node.active_view(TOPIC) == {1: RAND}
    out = node.handle(received(9, m.Join(peer=9, ttl=3)), 3.0)
    assert sends(out, m.Neighbor) == [send(9, request(RAND, high_priority=True, links=1, rand=1))]
    out = node.handle(received(9, accept(RAND, links=1, rand=1)), 3.1)
    assert node.active_view(TOPIC) == {1: RAND, 9: RAND}
    # Its own NEIGHBOR request is taken as well.
    node = make_node(active=[1, 9])
    node.handle(received(9, m.Leave(peer=9, ttl=0)), 1.0)
    out = node.handle(received(9, request(RAND, high_priority=True)), 3.0)
    assert out == [NeighborUp(TOPIC, 9, RAND), send(9, accept(RAND, links=2, rand=2))]


def test_connection_lost_removes_the_peer_from_every_view():
    node = make_node(active=[1, 2], passive=[5, 6])
    assert node.handle(ConnectionLost(1), 1.0) == [NeighborDown(TOPIC, 1), ClosePeer(1)]
    assert node.handle(ConnectionLost(5), 1.0) == []
    assert node.active_view(TOPIC) == {2: RAND}
    assert node.passive_view(TOPIC) == [6]


def test_connection_lost_drops_a_pending_request():
    node = make_node(passive=[5])
    fire(node, "stabilize", 1.0)
    assert 5 in membership(node).pending
    node.handle(ConnectionLost(5), 1.25)
    assert membership(node).pending == {}
    assert node.passive_view(TOPIC) == []


def recover_timer(delay: float) -> ScheduleTimer:
    return ScheduleTimer(delay, token("recover"))


def test_a_node_left_without_any_peer_goes_back_to_its_contacts_with_backoff():
    node = NodeState(ME, node_config(), random.Random(0))
    node.handle(JoinTopic(TOPIC, (5,)), 0.0)
    node.handle(received(5, request(RAND, high_priority=True)), 0.5)  # 5 took our JOIN in
    assert node.handle(ConnectionLost(5), 1.0) == [
        NeighborDown(TOPIC, 5),
        send(5, m.GetNodes()),
        Isolated(TOPIC, 1),
        recover_timer(1.0),
        ClosePeer(5),
    ]
    # That GETNODES fails too: no new attempt before the backoff (it used to be asked
    # again at once, a dial loop at the speed of refused connections).
    assert node.handle(ConnectionLost(5), 1.1) == []
    assert fire(node, "recover", 2.0) == [
        send(5, m.GetNodes()),
        Isolated(TOPIC, 2),
        recover_timer(2.0),
    ]
    assert sends(fire(node, "recover", 4.0)) == [send(5, m.GetNodes())]
    node.handle(received(7, request(RAND, high_priority=True)), 5.0)
    assert fire(node, "recover", 8.0) == []
    assert node.stats()["recoveries"] == 3


def test_a_node_left_without_any_peer_asks_every_peer_it_remembers():
    """Issue 13, item 7: `episub sim crash --nodes 1000 --fraction 0.95 --seed 3` left two
    survivors with an empty active view for good; one of them still had a live survivor
    in its RTT table, the other was probed by survivors that held it as a passive peer."""
    node = make_node(active=[1], rtts={8: 0.1, 9: 0.2})
    out = node.handle(ConnectionLost(1), 1.0)
    assert {s.peer for s in sends(out, m.GetNodes)} == {1, 8, 9}
    out = node.handle(received(9, m.Nodes(peers=(4,))), 1.2)
    assert {s.peer for s in sends(out, m.Join)} == {9, 4}  # as at a fresh join
    # A peer that probes a node with no neighbour becomes its passive peer.
    node = make_node(active=[1])
    node.handle(ConnectionLost(1), 1.0)
    node.handle(received(6, m.Ping(nonce=1)), 1.5)
    assert node.passive_view(TOPIC) == [6]
    assert sends(fire(node, "stabilize", 2.0), m.Neighbor) == [send(6, request(RAND, links=0))]


def test_a_node_left_without_any_peer_asks_the_peers_it_pushed_out_for_room():
    """Issue 13, acceptance 5: seed 4 of `episub sim crash --nodes 1000 --fraction 0.95`
    left a survivor that knew no live peer and was known by none; it had heard of three
    survivors while it settled, but their ids had gone from its near candidates (the
    oldest dropped for newer ones) before the crash."""
    config = node_config(membership=membership_config(passive_size=2, near_candidates=2))
    node = make_node(active=[1], passive=[20, 21], config=config)
    # A FORWARDJOIN into a full passive view pushes out one of its peers.
    node.handle(received(1, m.ForwardJoin(peer=22, ttl=0)), 0.5)
    [pushed_out] = {20, 21} - set(node.passive_view(TOPIC))
    # A neighbour's view of three peers: the first is pushed out of two near candidates.
    nonce = ping_nonce(fire(node, "ping", 1.0), 1)
    node.handle(received(1, m.Pong(nonce=nonce, subscribed=True, active=(ME, 30, 31, 32))), 1.1)
    assert list(membership(node).near_candidates) == [31, 32]
    # Every peer it knows now is gone: its neighbour, then each passive peer it asks.
    out = node.handle(ConnectionLost(1), 2.0)
    while membership(node).pending:
        out = node.handle(ConnectionLost(next(iter(membership(node).pending))), 2.1)
    assert Isolated(TOPIC, 1) in out
    asked = {s.peer for s in sends(out, m.GetNodes)}
    assert {pushed_out, 30} <= asked, asked
    # Bounded: the oldest of them goes first.
    forgotten = membership(node).passive_view.forgotten
    assert list(forgotten)[:2] == [pushed_out, 30]


def test_contacts_refreshed_by_the_runtime_replace_the_old_ones_and_are_asked_at_once():
    # A bootstrap node that restarted answers its address with a new id.
    node = NodeState(ME, node_config(), random.Random(0))
    node.handle(JoinTopic(TOPIC, (5,)), 0.0)
    assert node.handle(RefreshContacts(TOPIC, (15, ME)), 1.0) == [send(15, m.GetNodes())]
    assert sends(fire(node, "join_retry", 3.0)) == [send(15, m.GetNodes())]
    assert node.handle(RefreshContacts("other", (15,)), 1.0) == []  # left meanwhile


def test_leave_topic_sends_leave_to_neighbours_and_disconnect_to_pending_peers():
    node = make_node(active=[1, 2], passive=[5])
    fire(node, "stabilize", 1.0)  # asks 5
    out = node.handle(LeaveTopic(TOPIC), 2.0)
    assert out == [
        send(1, m.Leave(peer=ME, ttl=2)),
        NeighborDown(TOPIC, 1),
        send(2, m.Leave(peer=ME, ttl=2)),
        NeighborDown(TOPIC, 2),
        send(5, m.Disconnect(alive=False)),
        ClosePeer(1),
        ClosePeer(2),
    ]
    assert node.topics() == []


# -- shuffle ------------------------------------------------------------------------------


def test_shuffle_timer_sends_a_sample_of_both_views_to_a_random_neighbour():
    node = make_node(active=[1], passive=[10, 11, 12])
    out = fire(node, "shuffle", 1.0)
    assert out[1:] == [ScheduleTimer(30.0, token("shuffle"))]
    shuffle = only(out, m.Shuffle)
    assert shuffle.peer == 1
    assert shuffle.message.origin == ME
    assert shuffle.message.ttl == 3
    peers = shuffle.message.peers
    assert peers[:2] == (ME, 1)  # ourselves, then shuffle_active=2 of the active view (1)
    assert len(peers) == 4 and set(peers[2:]) < {10, 11, 12}  # shuffle_passive=2


def test_shuffle_walks_on_while_ttl_positive_and_another_neighbour_exists():
    node = make_node(active=[1, 2], passive=[10])
    out = node.handle(received(1, m.Shuffle(origin=7, ttl=3, peers=(7, 8))), 1.0)
    assert out == [send(2, m.Shuffle(origin=7, ttl=2, peers=(7, 8)))]
    assert node.passive_view(TOPIC) == [10]


@pytest.mark.parametrize(("ttl", "active"), [(0, [1, 2]), (3, [1]), (3, [1, 7])])
def test_shuffle_ends_with_a_reply_to_the_origin_when_ttl_0_or_no_other_neighbour(ttl, active):
    node = make_node(active=active, passive=[10, 11, 12])
    out = node.handle(received(1, m.Shuffle(origin=7, ttl=ttl, peers=(7, 8))), 1.0)
    reply = only(out, m.ShuffleReply)
    assert out == [reply]
    assert reply.peer == 7
    assert len(reply.message.peers) == 2 and set(reply.message.peers) < {10, 11, 12}
    assert set(node.passive_view(TOPIC)) == {10, 11, 12, 8} | ({7} - set(active))


def test_shuffle_integration_keeps_passive_within_passive_size_evicting_what_was_sent():
    node = make_node(
        active=[1], passive=[10, 11, 12], config=node_config(membership_config(passive_size=3))
    )
    out = node.handle(received(1, m.Shuffle(origin=7, ttl=0, peers=(7, 8))), 1.0)
    sent = only(out, m.ShuffleReply).message.peers
    kept = ({10, 11, 12} - set(sent)).pop()
    assert node.passive_view(TOPIC) == [kept, 7, 8]


def test_shuffle_intake_is_bounded_by_max_shuffle_intake():
    cfg = node_config(membership_config(max_shuffle_intake=2))
    node = make_node(active=[1], config=cfg)
    node.handle(received(1, m.Shuffle(origin=7, ttl=0, peers=(7, 8, 9, 10))), 1.0)
    assert node.passive_view(TOPIC) == [7, 8]


def test_shuffle_reply_is_integrated_evicting_the_peers_we_sent_first():
    cfg = node_config(membership_config(passive_size=3))
    node = make_node(active=[1], passive=[10, 11, 12], config=cfg)
    shuffle = only(fire(node, "shuffle", 1.0), m.Shuffle).message
    kept = ({10, 11, 12} - set(shuffle.peers[2:])).pop()
    reply = m.ShuffleReply(peers=(20, 21), nonce=shuffle.nonce)
    assert node.handle(received(7, reply), 1.5) == []
    assert node.passive_view(TOPIC) == [kept, 20, 21]


def test_shuffle_reply_intake_is_bounded_by_max_shuffle_intake():
    cfg = node_config(membership_config(max_shuffle_intake=1))
    node = make_node(active=[1], config=cfg)
    nonce = only(fire(node, "shuffle", 1.0), m.Shuffle).message.nonce
    node.handle(received(7, m.ShuffleReply(peers=(20, 21, 22), nonce=nonce)), 1.5)
    assert node.passive_view(TOPIC) == [20]


def test_a_shuffle_reply_is_taken_once_and_only_for_a_shuffle_of_ours():
    """Issue 13, item 8: SHUFFLEREPLY was never matched to a SHUFFLE we sent, so any peer
    could push 16 entries into our passive view with every reply it cared to send."""
    node = make_node(active=[1])
    unasked = m.ShuffleReply(peers=(20, 21))
    misbehaved = PeerMisbehaved(7, "SHUFFLEREPLY answers no SHUFFLE of ours")
    assert node.handle(received(7, unasked), 0.5) == [misbehaved]
    nonce = only(fire(node, "shuffle", 1.0), m.Shuffle).message.nonce
    wrong = m.ShuffleReply(peers=(20, 21), nonce=nonce ^ 1)
    assert node.handle(received(7, wrong), 1.5) == [misbehaved]
    assert node.handle(received(8, m.ShuffleReply(peers=(30,), nonce=nonce)), 1.6) == []
    again = m.ShuffleReply(peers=(20, 21), nonce=nonce)
    assert node.handle(received(7, again), 1.7) == [misbehaved]
    assert node.passive_view(TOPIC) == [30]


def test_a_shuffle_reply_to_a_shuffle_a_newer_one_replaced_is_counted_late_and_ignored():
    """After a stall the reply to our previous SHUFFLE arrives after we sent the next one:
    late, counted, not taken (it would evict for peers we no longer hold as sent)."""
    node = make_node(active=[1])
    old = only(fire(node, "shuffle", 1.0), m.Shuffle).message.nonce
    new = only(fire(node, "shuffle", 6.0), m.Shuffle).message.nonce
    assert node.handle(received(7, m.ShuffleReply(peers=(20,), nonce=old)), 6.5) == []
    assert membership(node).counters.late_shuffle_replies == 1
    assert node.passive_view(TOPIC) == []
    misbehaved = PeerMisbehaved(7, "SHUFFLEREPLY answers no SHUFFLE of ours")
    assert node.handle(received(7, m.ShuffleReply(peers=(20,), nonce=old)), 6.6) == [misbehaved]
    assert node.handle(received(8, m.ShuffleReply(peers=(30,), nonce=new)), 6.7) == []
    assert node.passive_view(TOPIC) == [30]


def test_shuffles_given_up_on_are_remembered_within_a_bound():
    node = make_node(active=[1])
    nonces = [
        only(fire(node, "shuffle", float(i)), m.Shuffle).message.nonce
        for i in range(LATE_SHUFFLE_MEMORY + 3)
    ]
    view = membership(node).passive_view
    assert list(view.given_up_shuffles) == nonces[2:-1]  # the oldest forgotten
    misbehaved = PeerMisbehaved(7, "SHUFFLEREPLY answers no SHUFFLE of ours")
    assert node.handle(received(7, m.ShuffleReply(peers=(), nonce=nonces[0])), 20.0) == [misbehaved]


def test_the_shuffle_nonce_travels_with_the_walk_and_comes_back_in_the_reply():
    node = make_node(active=[1, 2], passive=[10])
    out = node.handle(received(1, m.Shuffle(origin=7, ttl=3, peers=(7, 8), nonce=42)), 1.0)
    assert out == [send(2, m.Shuffle(origin=7, ttl=2, peers=(7, 8), nonce=42))]
    out = node.handle(received(1, m.Shuffle(origin=7, ttl=0, peers=(7, 8), nonce=42)), 1.0)
    assert out == [send(7, m.ShuffleReply(peers=(10,), nonce=42))]


# -- ping, pong, probes -------------------------------------------------------------------


def test_ping_is_answered_with_pong_with_view_when_asked():
    node = make_node(active={1: RAND, 2: NEAR})
    out = node.handle(received(1, m.Ping(nonce=42, want_view=True)), 1.0)
    assert out == [send(1, m.Pong(nonce=42, active_count=2, rand_count=1, active=(1, 2)))]
    out = node.handle(received(1, m.Ping(nonce=43)), 1.0)
    assert out == [send(1, m.Pong(nonce=43, active_count=2, rand_count=1, active=()))]


def test_pong_tells_a_pinger_outside_the_active_view_that_it_is_not_a_neighbour():
    node = make_node(active={1: RAND})
    out = node.handle(received(5, m.Ping(nonce=42)), 1.0)
    pong = m.Pong(nonce=42, active_count=1, rand_count=1, not_neighbor=True)
    assert out == [send(5, pong)]


def test_a_link_the_peer_does_not_hold_is_ended_when_its_pong_says_so():
    # A lost NEIGHBOR accept or DISCONNECT leaves the link at our end only: a broadcast
    # link that carries nothing one way. The pong to a ping sent over it tells us.
    node = make_node(active=[1, 2])
    nonce = ping_nonce(fire(node, "ping", 1.0), 1)
    out = node.handle(received(1, m.Pong(nonce=nonce, not_neighbor=True)), 1.125)
    assert out == [send(1, m.Disconnect(alive=True)), NeighborDown(TOPIC, 1), ClosePeer(1)]
    assert list(node.active_view(TOPIC)) == [2]
    assert node.passive_view(TOPIC) == [1]


def test_a_pong_to_a_ping_sent_before_the_link_came_up_does_not_end_it():
    # The peer answered before it knew of the link: its "not a neighbour" is stale.
    node = make_node(passive=[5])
    nonce = ping_nonce(fire(node, "probe", 1.0), 5)
    node.handle(received(5, request(RAND, high_priority=True)), 1.0625)
    assert 5 in node.active_view(TOPIC)
    assert node.handle(received(5, m.Pong(nonce=nonce, not_neighbor=True)), 1.125) == []
    assert 5 in node.active_view(TOPIC)


def test_ping_timer_asks_every_neighbour_for_its_view_when_proximity_is_on():
    # Neighbours' neighbours are the near candidates (GoCast).
    node = make_node(active={1: RAND, 2: NEAR})
    out = fire(node, "ping", 1.0)
    assert out == [
        send(1, m.Ping(nonce=ping_nonce(out, 1), want_view=True)),
        send(2, m.Ping(nonce=ping_nonce(out, 2), want_view=True)),
        ScheduleTimer(5.0, token("ping")),
    ]


def test_ping_timer_asks_for_no_view_when_proximity_is_off_and_view_not_oversubscribed():
    cfg = node_config(membership_config(proximity=False))
    node = make_node(active={1: RAND, 2: NEAR}, config=cfg)
    out = fire(node, "ping", 1.0)
    assert out == [
        send(1, m.Ping(nonce=ping_nonce(out, 1), want_view=False)),
        send(2, m.Ping(nonce=ping_nonce(out, 2), want_view=False)),
        ScheduleTimer(5.0, token("ping")),
    ]


def test_ping_timer_asks_every_neighbour_for_its_view_when_oversubscribed():
    node = make_node(active=[1, 2, 3, 4])
    out = fire(node, "ping", 1.0)
    assert [s.message.want_view for s in sends(out, m.Ping)] == [True] * 4


def test_only_ping_and_probe_timers_may_be_coalesced_across_nodes():
    """Pings and probes may wait for a shared tick (the runtime rounds them up); timers
    whose decisions change links must not line up across nodes (ScheduleTimer.coalesce)."""
    node = make_node(active={1: RAND}, passive=[5])
    coalesced = {}
    for name in ("ping", "probe", "stabilize", "optimize", "shuffle"):
        [timer] = [e for e in fire(node, name, 1.0) if isinstance(e, ScheduleTimer)]
        coalesced[name] = timer.coalesce
    assert coalesced == {
        "ping": True,
        "probe": True,
        "stabilize": False,
        "optimize": False,
        "shuffle": False,
    }


def test_probe_timer_pings_a_passive_peer():
    node = make_node(passive=[5])
    out = fire(node, "probe", 1.0)
    assert out == [
        send(5, m.Ping(nonce=ping_nonce(out, 5), want_view=False)),
        ScheduleTimer(1.0, token("probe")),
    ]


def test_probe_timer_pings_unmeasured_peers_first():
    node = make_node(passive=[5, 6, 7], rtts={5: 0.125, 7: 0.25})
    assert only(fire(node, "probe", 1.0), m.Ping).peer == 6


def test_probe_pings_each_peer_at_most_once_per_tick():
    cfg = node_config(membership_config(passive_probes_per_tick=2))
    node = make_node(active={1: RAND, 2: RAND, 3: NEAR}, passive=[9], rtts={3: 0.25}, config=cfg)
    nonce = ping_nonce(fire(node, "ping", 1.0), 3)
    node.handle(received(3, m.Pong(nonce=nonce, active_count=4, active=(ME, 9))), 1.125)
    pinged = [s.peer for s in sends(fire(node, "probe", 2.0), m.Ping)]
    assert pinged == [9]


def test_probe_measures_more_peers_a_tick_while_near_candidates_are_unmeasured():
    # Neighbours' views bring candidates faster than one probe a tick measures them:
    # while some have no RTT, passive_probes_per_tick_unmeasured go out (then 1 again).
    cfg = node_config(membership_config(passive_probes_per_tick_unmeasured=3))
    node = make_node(active={1: RAND, 2: RAND, 3: NEAR}, passive=[8], rtts={3: 0.25}, config=cfg)
    nonce = ping_nonce(fire(node, "ping", 1.0), 3)
    node.handle(received(3, m.Pong(nonce=nonce, active_count=4, active=(ME, 9, 10))), 1.125)
    pinged = sorted(s.peer for s in sends(fire(node, "probe", 2.0), m.Ping))
    assert pinged == [8, 9, 10]
    for peer, rtt in ((8, 0.5), (9, 0.25), (10, 0.125)):
        node.handle(received(peer, m.Pong(nonce=ping_nonce_of(node, peer))), 2.0 + rtt)
    assert len(sends(fire(node, "probe", 4.0), m.Ping)) == 1


def test_pong_updates_smoothed_rtt():
    node = make_node(passive=[5])
    nonce = ping_nonce(fire(node, "probe", 1.0), 5)
    assert node.handle(received(5, m.Pong(nonce=nonce)), 1.25) == []
    assert node.rtt(5) == 0.25
    nonce = ping_nonce(fire(node, "probe", 2.0), 5)
    assert node.handle(received(5, m.Pong(nonce=nonce)), 2.75) == []
    assert node.rtt(5) == 0.25 + 0.125 * (0.75 - 0.25)  # RFC 6298 SRTT


def test_a_lower_rtt_sample_is_taken_at_once():
    # Queueing only adds delay: a first ping answered by a busy peer must not make it look
    # far for minutes (loopback links of 1-3 ms read 50-100 ms after a loaded start).
    node = make_node(passive=[5])
    nonce = ping_nonce(fire(node, "probe", 1.0), 5)
    node.handle(received(5, m.Pong(nonce=nonce)), 1.5)
    nonce = ping_nonce(fire(node, "probe", 2.0), 5)
    node.handle(received(5, m.Pong(nonce=nonce)), 2.125)
    assert node.rtt(5) == 0.125


def test_rtt_variation_is_the_smoothed_deviation_of_samples_and_0_after_one():
    node = make_node(passive=[5])
    nonce = ping_nonce(fire(node, "probe", 1.0), 5)
    node.handle(received(5, m.Pong(nonce=nonce)), 1.25)
    assert node.rtts.variation(5) == 0.0
    nonce = ping_nonce(fire(node, "probe", 2.0), 5)
    node.handle(received(5, m.Pong(nonce=nonce)), 2.75)
    assert node.rtts.variation(5) == 0.25 * abs(0.75 - 0.25)  # RFC 6298 RTTVAR, beta 1/4


def test_a_near_peer_must_be_nearer_by_more_than_the_rtt_variation_to_be_swapped_in():
    # Candidate 9 reads 1 ms against our near neighbour 3's 4 ms: alpha times nearer. With
    # steady samples that is a swap; when 9's samples wandered by ms (a busy host) it is
    # noise, and no link changes.
    def node_where_9_varies(jitter: float) -> NodeState:
        node = make_node(
            active={1: RAND, 2: RAND, 3: NEAR},
            passive=[9],
            rtts={3: 0.004, 9: 0.001 + jitter},
            links={3: 4},
            config=node_config(membership=membership_config(alpha=1.5)),
        )
        node.rtts.sample(9, 0.001)  # a lower sample is taken at once; RTTVAR = jitter / 4
        return node

    swap = [send(9, request(NEAR, rtt=0.001, links=3, rand=2))]
    assert sends(fire(node_where_9_varies(0.0), "optimize", 2.0)) == swap
    assert sends(fire(node_where_9_varies(0.016), "optimize", 2.0)) == []


def test_unsolicited_pong_is_peer_misbehaved():
    node = make_node(passive=[5])
    out = node.handle(received(5, m.Pong(nonce=7)), 1.0)
    assert out == [PeerMisbehaved(5, "PONG answers no PING we sent it")]
    assert node.rtt(5) is None


def test_pong_from_another_peer_than_the_pinged_one_is_peer_misbehaved():
    node = make_node(passive=[5])
    nonce = ping_nonce(fire(node, "probe", 1.0), 5)
    out = node.handle(received(6, m.Pong(nonce=nonce)), 1.125)
    assert out == [PeerMisbehaved(6, "PONG answers no PING we sent it")]
    assert node.rtt(6) is None
    # The spoof did not consume the ping: the real answer still counts.
    assert node.handle(received(5, m.Pong(nonce=nonce)), 1.25) == []
    assert node.rtt(5) == 0.25


def test_a_pong_to_a_ping_given_up_on_is_counted_late_not_reported():
    """After a stall, PONGs to PINGs that expired meanwhile arrive: late, not misbehaviour.
    Only the pinged peer's, once; any other stays reported."""
    node = make_node(passive=[5])
    nonce = ping_nonce(fire(node, "probe", 1.0), 5)
    fire(node, "probe", 6.0)  # expired: 5 goes dormant
    misbehaved = PeerMisbehaved(5, "PONG answers no PING we sent it")
    assert node.handle(received(6, m.Pong(nonce=nonce)), 7.0) == [
        PeerMisbehaved(6, "PONG answers no PING we sent it")
    ]
    assert node.handle(received(5, m.Pong(nonce=nonce)), 7.0) == []
    assert membership(node).counters.late_pongs == 1 and node.stats()["late_pongs"] == 1
    assert node.handle(received(5, m.Pong(nonce=nonce)), 7.5) == [misbehaved]  # twice
    assert node.rtt(5) is None  # a late answer is no RTT sample


def test_a_pong_after_its_link_was_lost_is_counted_late():
    node = make_node(active=[1])
    out: list = []
    membership(node).passive_view.send_ping(1, want_view=False, now=1.0, out=out)
    membership(node).passive_view.drop_pings(1)  # the connection went
    assert node.handle(received(1, m.Pong(nonce=ping_nonce(out, 1))), 1.5) == []
    assert membership(node).counters.late_pongs == 1


def test_pings_given_up_on_are_remembered_within_a_bound():
    node = make_node(passive=[5])
    view = membership(node).passive_view
    for i in range(LATE_REPLY_MEMORY + 10):
        view.send_ping(5, want_view=False, now=float(i), out=[])
        view.expire_pings(float(i) + 10.0)
    assert len(view.given_up_pings) == LATE_REPLY_MEMORY


def test_unanswered_probe_expires_passive_peer_after_ping_timeout():
    node = make_node(passive=[5])
    fire(node, "probe", 1.0)
    assert fire(node, "probe", 5.875) == [ScheduleTimer(1.0, token("probe"))]
    assert node.passive_view(TOPIC) == [5]
    assert fire(node, "probe", 6.0) == [ScheduleTimer(1.0, token("probe"))]
    assert node.passive_view(TOPIC) == []


def test_pong_not_subscribed_removes_a_passive_peer():
    node = make_node(passive=[5, 6])
    ping = only(fire(node, "probe", 1.0), m.Ping)
    pong = m.Pong(nonce=ping.message.nonce, subscribed=False)
    assert node.handle(received(ping.peer, pong), 1.25) == []
    assert node.passive_view(TOPIC) == [11 - ping.peer]


def test_pong_not_subscribed_removes_an_active_peer():
    node = make_node(active=[1])
    nonce = ping_nonce(fire(node, "ping", 1.0), 1)
    out = node.handle(received(1, m.Pong(nonce=nonce, subscribed=False)), 1.25)
    assert out == [NeighborDown(TOPIC, 1), ClosePeer(1)]
    assert node.active_view(TOPIC) == {}
    assert node.passive_view(TOPIC) == []


def test_message_claiming_to_come_from_ourselves_is_peer_misbehaved():
    node = make_node(active=[1])
    out = node.handle(received(ME, m.Ping(nonce=1)), 1.0)
    assert out == [PeerMisbehaved(ME, "message claims to come from ourselves")]


# -- stabilisation ------------------------------------------------------------------------


def test_stabilisation_shrinks_an_oversubscribed_view_toward_a_neighbour_with_more_than_A_links():
    node = make_node(active=[1, 2, 3, 4], links={3: 5, 4: 4})
    out = fire(node, "stabilize", 1.0)
    # The neighbour with most links loses least.
    assert out == [
        send(3, m.Disconnect(alive=True)),
        NeighborDown(TOPIC, 3),
        stabilize_timer(),
        ClosePeer(3),
    ]
    assert list(node.active_view(TOPIC)) == [1, 2, 4]
    assert node.passive_view(TOPIC) == [3]


def test_stabilisation_keeps_an_oversubscribed_view_when_no_link_is_safe_to_drop():
    node = make_node(active=[1, 2, 3, 4])  # every neighbour claims exactly A links
    assert fire(node, "stabilize", 1.0) == [stabilize_timer()]
    assert len(node.active_view(TOPIC)) == 4


def test_stabilisation_drops_a_link_that_closes_a_triangle():
    node = make_node(active=[1, 2, 3, 4])
    out = fire(node, "ping", 1.0)
    views = {1: (ME, 2), 2: (ME, 5), 3: (ME, 6), 4: (ME, 7)}
    for peer, view in views.items():
        pong = m.Pong(nonce=ping_nonce(out, peer), active_count=3, active=view)
        assert node.handle(received(peer, pong), 1.125) == []
    # 2 is also 1's neighbour: dropping 0-2 leaves the path 0-1-2.
    assert fire(node, "stabilize", 2.0) == [
        send(2, m.Disconnect(alive=True)),
        NeighborDown(TOPIC, 2),
        stabilize_timer(),
        ClosePeer(2),
    ]


def test_stabilisation_keeps_a_triangle_link_to_a_neighbour_below_A():
    node = make_node(active=[1, 2, 3, 4])
    out = fire(node, "ping", 1.0)
    views = {1: (ME, 2), 2: (ME, 5), 3: (ME, 6), 4: (ME, 7)}
    for peer, view in views.items():
        count = 2 if peer == 2 else 3
        pong = m.Pong(nonce=ping_nonce(out, peer), active_count=count, active=view)
        node.handle(received(peer, pong), 1.125)
    assert fire(node, "stabilize", 2.0) == [stabilize_timer()]


def test_stabilisation_grows_from_passive_with_rand_links_first_then_nearest():
    node = make_node(passive=[5, 6, 7], rtts={5: 0.5, 6: 0.25, 7: 0.125})
    out = fire(node, "stabilize", 1.0)
    asked = sends(out, m.Neighbor)
    assert out == [*asked, stabilize_timer()]
    assert [s.message.kind for s in asked] == [RAND, RAND, NEAR]
    rand_peers = {s.peer for s in asked[:2]}
    nearest = min({5, 6, 7} - rand_peers, key=node.rtt)
    assert asked[2] == send(nearest, request(NEAR, rtt=node.rtt(nearest), links=0))


def test_stabilisation_requests_the_nearest_passive_peer_once_c_rand_links_exist():
    node = make_node(active=[1, 2], passive=[5, 6, 7], rtts={6: 0.25, 7: 0.125})
    assert fire(node, "stabilize", 1.0) == [
        send(7, request(NEAR, rtt=0.125, links=2, rand=2)),
        stabilize_timer(),
    ]


def test_stabilisation_without_proximity_fills_near_slots_at_random():
    cfg = node_config(membership_config(proximity=False))
    node = make_node(active=[1, 2], passive=[5, 6, 7], rtts={7: 0.125}, config=cfg)
    out = fire(node, "stabilize", 1.0)
    asked = only(out, m.Neighbor)
    assert asked.peer in (5, 6, 7)
    assert asked.message.kind is NEAR


def test_stabilisation_requests_at_most_max_pending_requests():
    cfg = node_config(membership_config(max_pending_requests=1))
    node = make_node(passive=[5, 6, 7], config=cfg)
    assert len(sends(fire(node, "stabilize", 1.0), m.Neighbor)) == 1
    assert sends(fire(node, "stabilize", 2.0), m.Neighbor) == []


def test_pending_requests_time_out_after_neighbor_request_timeout():
    cfg = node_config(membership_config(c_rand=1, c_near=0))  # A = 1
    node = make_node(passive=[5, 6], config=cfg)
    first = only(fire(node, "stabilize", 1.0), m.Neighbor).peer
    assert fire(node, "stabilize", 2.875) == [stabilize_timer()]  # still waiting
    other = 11 - first
    assert fire(node, "stabilize", 3.0) == [send(other, request(RAND, links=0)), stabilize_timer()]
    assert first not in membership(node).pending


def test_stabilisation_asks_the_contacts_when_every_view_is_empty():
    node = NodeState(ME, node_config(), random.Random(0))
    node.handle(JoinTopic(TOPIC, (5,)), 0.0)
    assert fire(node, "stabilize", 2.0) == [send(5, m.GetNodes()), stabilize_timer()]


# -- optimisation -------------------------------------------------------------------------


def near_view_for_optimisation(far_links: int, proximity: bool = True) -> NodeState:
    """RAND 1, 2 and NEAR 3 at 0.25 s claiming `far_links`; passive 7 (1/16 s) and 8."""
    cfg = node_config(membership_config(proximity=proximity))
    return make_node(
        active={1: RAND, 2: RAND, 3: NEAR},
        passive=[7, 8],
        rtts={3: 0.25, 7: 0.0625, 8: 0.1},
        links={3: far_links},
        config=cfg,
    )


def test_optimisation_requests_best_passive_peer_and_drops_farthest_near_on_accept():
    node = near_view_for_optimisation(far_links=4)
    assert fire(node, "optimize", 1.0) == [
        send(7, request(NEAR, rtt=0.0625, links=3, rand=2)),
        ScheduleTimer(5.0, token("optimize")),
    ]
    out = node.handle(received(7, accept(NEAR, links=4)), 1.25)
    assert out == [
        NeighborUp(TOPIC, 7, NEAR),
        send(3, m.Disconnect(alive=True)),
        NeighborDown(TOPIC, 3),
        ClosePeer(3),
    ]
    assert node.active_view(TOPIC) == {1: RAND, 2: RAND, 7: NEAR}
    assert node.passive_view(TOPIC) == [8, 3]


def test_optimisation_keeps_the_replaced_neighbour_when_it_has_c_rand_links_or_fewer():
    node = near_view_for_optimisation(far_links=2)
    fire(node, "optimize", 1.0)
    assert node.handle(received(7, accept(NEAR, links=4)), 1.25) == [NeighborUp(TOPIC, 7, NEAR)]


def test_optimisation_never_picks_a_peer_with_a_request_pending():
    # 7, the nearest passive peer, has a RAND request of ours pending (we took its JOIN):
    # optimisation chose it anyway and overwrote that request with a NEAR one.
    node = near_view_for_optimisation(far_links=4)
    node.handle(received(1, m.Join(peer=7, ttl=0)), 0.5)
    assert membership(node).pending[7].kind is RAND
    assert fire(node, "optimize", 1.0) == [
        send(8, request(NEAR, rtt=0.1, links=3, rand=2)),
        ScheduleTimer(5.0, token("optimize")),
    ]
    assert membership(node).pending[7].kind is RAND


def swapping_node(streams: int) -> NodeState:
    """NEAR 3 at 0.25 s, passive 7 at 0.1 s; alpha 2, swap_factor_growth 3, at most 4;
    `streams` publisher streams with a tree of their own."""
    cfg = node_config(membership_config(swap_factor_growth=3.0, swap_factor_max=4.0))
    node = make_node(
        active={1: RAND, 2: RAND, 3: NEAR},
        passive=[7],
        rtts={3: 0.25, 7: 0.1},
        links={3: 4},
        config=cfg,
    )
    for publisher in range(100, 100 + streams):
        broadcast(node).trees.get(publisher)
    return node


def offer(node: NodeState, peer: int, rtt: float, now: float) -> list[object]:
    """A measured passive peer `peer` at `rtt`, then an optimisation round."""
    node.rtts.sample(peer, rtt)
    membership(node).passive_view.add(peer)
    return sends(fire(node, "optimize", now))


def test_with_several_streams_each_swap_makes_the_next_one_dearer_up_to_swap_factor_max():
    # The first swap needs a peer 2x nearer (alpha), the second 4x (not 6x: the max).
    node = swapping_node(streams=2)
    assert sends(fire(node, "optimize", 1.0)) == [send(7, request(NEAR, rtt=0.1, links=3, rand=2))]
    node.handle(received(7, accept(NEAR, links=4)), 1.25)
    assert node.active_view(TOPIC) == {1: RAND, 2: RAND, 7: NEAR}
    assert offer(node, 9, 0.04, 2.0) == []  # 2.5x nearer than 7: enough for a first swap only
    assert offer(node, 10, 0.024, 3.0) == [send(10, request(NEAR, rtt=0.024, links=3, rand=2))]
    assert membership(node).proximity.swaps_asked == 2


def test_with_one_stream_swaps_stay_at_alpha():
    # A swap touches one tree: swap_factor_growth leaves the rule GoCast's.
    node = swapping_node(streams=1)
    fire(node, "optimize", 1.0)
    node.handle(received(7, accept(NEAR, links=4)), 1.25)
    assert offer(node, 9, 0.04, 2.0) == [send(9, request(NEAR, rtt=0.04, links=3, rand=2))]


def test_swaps_cannot_get_cheaper_than_alpha():
    with pytest.raises(ValueError, match="swap_factor_growth must be >= 1"):
        membership_config(swap_factor_growth=0.9)
    with pytest.raises(ValueError, match=r"swap_factor_max must be >= alpha \(2.0\), not 1.5"):
        membership_config(swap_factor_max=1.5)


def test_optimisation_does_nothing_when_no_peer_is_closer_by_alpha():
    cfg = node_config(membership_config())
    node = make_node(
        active={1: RAND, 2: RAND, 3: NEAR}, passive=[7], rtts={3: 0.25, 7: 0.125}, config=cfg
    )
    assert fire(node, "optimize", 1.0) == [ScheduleTimer(5.0, token("optimize"))]


def test_optimisation_does_nothing_with_proximity_off():
    node = near_view_for_optimisation(far_links=4, proximity=False)
    assert fire(node, "optimize", 1.0) == [ScheduleTimer(5.0, token("optimize"))]


def test_optimisation_runs_one_swap_at_a_time():
    node = near_view_for_optimisation(far_links=4)
    fire(node, "optimize", 1.0)
    assert fire(node, "optimize", 2.0) == [ScheduleTimer(5.0, token("optimize"))]


def test_optimisation_comes_sooner_while_near_links_improve_and_backs_off_when_stable():
    # A round that asks for a near link schedules the next at optimize_interval_improving
    # (1 s); a round that finds nothing to ask goes back to optimize_interval (5 s).
    cfg = node_config(membership_config(optimize_interval_improving=1.0))
    node = make_node(
        active={1: RAND, 2: RAND, 3: NEAR},
        passive=[7],
        rtts={3: 0.25, 7: 0.0625},
        links={3: 4},
        config=cfg,
    )
    assert fire(node, "optimize", 1.0) == [
        send(7, request(NEAR, rtt=0.0625, links=3, rand=2)),
        ScheduleTimer(1.0, token("optimize")),
    ]
    node.handle(received(7, accept(NEAR, links=4)), 1.25)
    assert node.active_view(TOPIC) == {1: RAND, 2: RAND, 7: NEAR}
    # 3, now passive at 0.25 s, is no nearer than 7: nothing to ask, back to 5 s.
    assert fire(node, "optimize", 2.0) == [ScheduleTimer(5.0, token("optimize"))]


def test_optimisation_finds_candidates_in_near_neighbours_views():
    node = make_node(active={1: RAND, 2: RAND, 3: NEAR}, rtts={3: 0.25}, links={3: 4})
    nonce = ping_nonce(fire(node, "ping", 1.0), 3)
    node.handle(received(3, m.Pong(nonce=nonce, active_count=4, active=(ME, 9))), 1.25)
    set_rtt(node, 9, 0.0625)
    assert sends(fire(node, "optimize", 2.0)) == [
        send(9, request(NEAR, rtt=0.0625, links=3, rand=2))
    ]


# -- relabelling ---------------------------------------------------------------------------


def near_view_for_relabel(passive_rtt: float) -> NodeState:
    """RAND 1 (1/16 s), RAND 2 (unmeasured), NEAR 3 (1/4 s); passive 7 at `passive_rtt`."""
    return make_node(
        active={1: RAND, 2: RAND, 3: NEAR},
        passive=[7],
        rtts={1: 0.0625, 3: 0.25, 7: passive_rtt},
    )


def test_optimisation_relabels_the_nearest_rand_link_when_no_candidate_is_closer():
    node = near_view_for_relabel(0.5)
    assert fire(node, "optimize", 1.0) == [
        send(1, request(NEAR, rtt=0.0625, links=3, rand=2)),
        ScheduleTimer(5.0, token("optimize")),
    ]
    assert node.active_view(TOPIC)[1] is RAND  # until the peer agrees
    # The peer agrees: the link is NEAR, and the farthest near link is demoted at once.
    out = node.handle(received(1, accept(NEAR, links=3, rand=1)), 1.25)
    assert out == [send(3, request(RAND, rtt=0.25, links=3, rand=2))]
    assert node.active_view(TOPIC) == {1: NEAR, 2: RAND, 3: RAND}
    assert membership(node).counters.relabels == 2


def test_relabelling_waits_until_every_candidate_is_measured():
    node = make_node(active={1: RAND, 2: RAND, 3: NEAR}, passive=[7], rtts={1: 0.0625, 3: 0.25})
    assert fire(node, "optimize", 1.0) == [ScheduleTimer(5.0, token("optimize"))]


def test_a_closer_candidate_is_asked_for_a_new_link_instead_of_relabelling():
    node = near_view_for_relabel(0.03125)
    assert sends(fire(node, "optimize", 1.0)) == [
        send(7, request(NEAR, rtt=0.03125, links=3, rand=2))
    ]


def test_relabelling_needs_the_rand_link_closer_than_the_farthest_near_by_alpha():
    node = make_node(active={1: RAND, 2: RAND, 3: NEAR}, rtts={1: 0.125, 3: 0.25})
    assert fire(node, "optimize", 1.0) == [ScheduleTimer(5.0, token("optimize"))]


def test_a_node_short_of_near_links_relabels_a_surplus_rand_link():
    node = make_node(active={1: RAND, 2: RAND, 3: RAND}, rtts={1: 0.25, 2: 0.0625, 3: 0.125})
    assert sends(fire(node, "optimize", 1.0)) == [
        send(2, request(NEAR, rtt=0.0625, links=3, rand=3))
    ]
    assert node.handle(received(2, accept(NEAR, links=3, rand=1)), 1.25) == []
    assert node.active_view(TOPIC) == {1: RAND, 2: NEAR, 3: RAND}  # no demotion: C_near=1


def test_a_refused_relabel_keeps_the_link_and_is_not_asked_again_at_once():
    node = near_view_for_relabel(0.5)
    fire(node, "optimize", 1.0)
    assert node.handle(received(1, accept(RAND, links=3, rand=1)), 1.25) == []
    assert node.active_view(TOPIC) == {1: RAND, 2: RAND, 3: NEAR}
    assert fire(node, "optimize", 6.0) == [ScheduleTimer(5.0, token("optimize"))]
    # After recent_reject_memory (10 s), and stabilisation forgetting the refusal:
    fire(node, "stabilize", 11.5)
    assert sends(fire(node, "optimize", 12.0)) == [
        send(1, request(NEAR, rtt=0.0625, links=3, rand=2))
    ]


def test_an_unanswered_relabel_request_expires_with_the_neighbor_request_timeout():
    node = near_view_for_relabel(0.5)
    fire(node, "optimize", 1.0)
    assert fire(node, "optimize", 2.0) == [ScheduleTimer(5.0, token("optimize"))]  # one at a time
    fire(node, "stabilize", 3.0)  # 2 s after the request
    assert sends(fire(node, "optimize", 3.5)) == [
        send(1, request(NEAR, rtt=0.0625, links=3, rand=2))
    ]


def test_a_node_with_surplus_near_links_and_too_few_rand_demotes_its_farthest_near():
    node = make_node(active={1: RAND, 2: NEAR, 3: NEAR}, rtts={1: 0.5, 2: 0.25, 3: 0.0625})
    assert sends(fire(node, "optimize", 1.0)) == [send(2, request(RAND, rtt=0.25, links=3, rand=2))]
    assert node.active_view(TOPIC) == {1: RAND, 2: RAND, 3: NEAR}


def test_surplus_near_links_wait_while_a_candidate_could_replace_the_farthest():
    node = make_node(
        active={1: RAND, 2: NEAR, 3: NEAR}, passive=[7], rtts={2: 0.25, 3: 0.0625, 7: 0.03125}
    )
    assert sends(fire(node, "optimize", 1.0)) == [
        send(7, request(NEAR, rtt=0.03125, links=3, rand=1))
    ]


def test_relabel_to_near_is_agreed_as_the_peers_choice():
    # 1 asks to make our RAND link NEAR: its choice, agreed to; it costs none of our near
    # slots, so our own NEAR 3 stays, and our random links are one short (growth's job).
    node = make_node(active={1: RAND, 2: RAND, 3: NEAR}, rtts={1: 0.25, 3: 0.0625})
    out = node.handle(received(1, request(NEAR, rtt=0.25, links=3, rand=2)), 1.0)
    assert out == [send(1, accept(NEAR, links=3, rand=1))]
    assert node.active_view(TOPIC) == {1: NEAR, 2: RAND, 3: NEAR}
    mem = membership(node)
    assert mem.held_for_others() == 1 and mem.proximity.farthest_near() == (3, 0.0625)


def test_optimisation_adopts_a_held_near_link_nearer_than_our_farthest_and_demotes_that():
    # 5 chose us (we hold its NEAR link); at 1/16 s it beats our own NEAR 3 (1/4 s) by
    # alpha: it becomes ours too, no message needed, and 3 is demoted to RAND.
    node = make_node(active={1: RAND, 2: RAND, 3: NEAR}, rtts={3: 0.25, 5: 0.0625})
    node.handle(received(5, request(NEAR, rtt=0.0625, links=4, rand=2)), 0.5)
    assert sends(fire(node, "optimize", 1.0)) == [send(3, request(RAND, rtt=0.25, links=4, rand=3))]
    mem = membership(node)
    assert node.active_view(TOPIC) == {1: RAND, 2: RAND, 3: RAND, 5: NEAR}
    assert mem.active[5].chosen and mem.counters.near_adopted == 1
    assert mem.proximity.farthest_near() == (5, 0.0625)


def test_a_held_near_link_is_not_adopted_while_a_known_peer_could_do_better():
    # Passive 7 (1/32 s) is nearer than the held 5 (1/16 s): optimisation asks 7 for a
    # link of its own instead (a link both ends count is one link fewer in the overlay).
    node = make_node(
        active={1: RAND, 2: RAND, 3: NEAR},
        passive=[7],
        rtts={3: 0.25, 5: 0.0625, 7: 0.03125},
        links={3: 4},
    )
    node.handle(received(5, request(NEAR, rtt=0.0625, links=4, rand=2)), 0.5)
    assert sends(fire(node, "optimize", 1.0)) == [
        send(7, request(NEAR, rtt=0.03125, links=4, rand=2))
    ]
    assert not membership(node).active[5].chosen


def test_a_thin_view_adopts_a_held_near_link_instead_of_waiting_for_growth():
    # Two links of ours and 5's NEAR link: below A, optimisation still takes 5 as ours
    # (in a small overlay every peer may be linked already: nothing to grow from).
    node = make_node(active={1: RAND, 2: RAND}, rtts={5: 0.0625})
    node.handle(received(5, request(NEAR, rtt=0.0625, links=4, rand=2)), 0.5)
    mem = membership(node)
    assert mem.link_count() == A - 1
    assert sends(fire(node, "optimize", 1.0)) == []
    assert mem.link_count() == A and mem.active[5].chosen


def test_relabel_to_rand_is_always_agreed():
    node = make_node(active={1: RAND, 2: RAND, 3: NEAR}, rtts={3: 0.0625})
    out = node.handle(received(3, request(RAND, links=3, rand=1)), 1.0)
    assert out == [send(3, accept(RAND, links=3, rand=3))]
    assert node.active_view(TOPIC) == {1: RAND, 2: RAND, 3: RAND}


def test_after_a_relabel_both_ends_of_every_link_agree_on_its_kind():
    # 0 holds RAND 1 (near) and NEAR 3 (far); 1 and 3 are real nodes wired in memory.
    n0 = make_node(0, active={1: RAND, 2: RAND, 3: NEAR}, passive=[7], rtts={1: 0.0625, 3: 0.25})
    set_rtt(n0, 7, 0.5)
    n1 = make_node(1, active={0: RAND, 4: RAND, 5: NEAR}, rtts={0: 0.0625, 5: 0.5})
    n3 = make_node(3, active={0: NEAR, 8: RAND, 9: RAND}, rtts={0: 0.25})
    net = Network([n0, n1, n3])
    log = net.handle(0, TimerFired(token("optimize")), 1.0)
    assert n0.active_view(TOPIC) == {1: NEAR, 2: RAND, 3: RAND}
    # 0's choice: 1 keeps its own near link 5 (a near link held for a peer is not ours).
    assert n1.active_view(TOPIC) == {0: NEAR, 4: RAND, 5: NEAR}
    assert n3.active_view(TOPIC) == {0: RAND, 8: RAND, 9: RAND}
    assert [(s.peer, s.message.kind) for s in sends(log[1], m.Neighbor)] == [(0, NEAR)]
    # No link came up or went down: relabelling changes labels only.
    assert not [e for out in log.values() for e in out if isinstance(e, NeighborUp | NeighborDown)]


def test_crossed_relabel_requests_agree():
    # Both are short of near links and hold a surplus RAND link: each asks the other.
    n0 = make_node(0, active={1: RAND, 2: RAND, 3: RAND}, rtts={1: 0.0625})
    n1 = make_node(1, active={0: RAND, 4: RAND, 5: RAND}, rtts={0: 0.0625})
    ask0 = only(fire(n0, "optimize", 1.0), m.Neighbor)
    ask1 = only(fire(n1, "optimize", 1.0), m.Neighbor)
    assert ask0.message.kind is ask1.message.kind is NEAR
    acc0 = only(n0.handle(received(1, ask1.message), 1.125), m.Neighbor).message
    acc1 = only(n1.handle(received(0, ask0.message), 1.125), m.Neighbor).message
    n0.handle(received(1, acc1), 1.25)
    n1.handle(received(0, acc0), 1.25)
    assert n0.active_view(TOPIC)[1] is n1.active_view(TOPIC)[0] is NEAR


# -- timers -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "period"),
    [("stabilize", 2.0), ("optimize", 5.0), ("shuffle", 30.0), ("ping", 5.0), ("probe", 1.0)],
)
def test_periodic_timers_rearm_themselves(name, period):
    node = make_node(active=[1])
    out = fire(node, name, 1.0)
    assert out[-1] == ScheduleTimer(period, token(name))
    assert fire(node, name, 1.0 + period)[-1] == ScheduleTimer(period, token(name))


def test_timer_jitter_stays_within_its_bounds():
    cfg = node_config(membership_config(timer_jitter=0.25))
    node = make_node(active=[1], config=cfg)
    delays = [fire(node, "stabilize", float(t))[-1].delay for t in range(1, 50)]
    assert all(1.5 <= d <= 2.5 for d in delays)
    assert len(set(delays)) > 1


def test_timers_of_a_left_topic_are_stale():
    node = make_node(active=[1], passive=[5])
    node.handle(LeaveTopic(TOPIC), 1.0)
    stale = TimerFired(token("stabilize", generation=0))
    assert node.handle(stale, 2.0) == []
    node.handle(JoinTopic(TOPIC), 3.0)  # a new generation of the same topic
    node.handle(received(5, m.ForwardJoin(peer=5, ttl=0)), 3.0)
    assert node.handle(stale, 4.0) == []
    assert fire(node, "stabilize", 4.0) == [
        send(5, request(RAND, links=0)),
        ScheduleTimer(2.0, token("stabilize", generation=1)),
    ]


# -- settled upkeep (MembershipConfig.settled_upkeep; the runtime sets it) ----------------


def settled_node(factor: float | None) -> NodeState:
    """A node with A random links to measured peers and nothing to do."""
    config = node_config(membership_config(settled_upkeep=factor))
    return make_node(active=[1, 2, 3], rtts={1: 0.01, 2: 0.01, 3: 0.01}, config=config)


def rescheduled(out: list, name: str) -> float:
    (timer,) = [o for o in out if isinstance(o, ScheduleTimer) and o.token == token(name)]
    return timer.delay


@pytest.mark.parametrize(
    ("name", "factor", "period"),
    [
        ("ping", None, 5.0),
        ("ping", 6.0, 30.0),
        ("stabilize", None, 2.0),
        ("stabilize", 6.0, 12.0),
        ("shuffle", 6.0, 60.0),  # shuffles at most 2x: passive views stay fresh
        ("probe", None, 1.0),
        ("probe", 6.0, 15.0),  # half the settled ping period, more than 6x
    ],
)
def test_a_settled_node_stretches_its_upkeep_by_settled_upkeep_and_none_keeps_the_pace(
    name: str, factor: float | None, period: float
) -> None:
    node = settled_node(factor)
    assert node._topics[TOPIC].membership.settled()
    # At 100 s: after the timer's due time (one fired before it is stale: re-armed since).
    assert rescheduled(fire(node, name, 100.0), name) == period


def test_a_node_short_of_links_is_not_settled_and_keeps_its_pace() -> None:
    config = node_config(membership_config(settled_upkeep=6.0))
    node = make_node(active=[1, 2], rtts={1: 0.01, 2: 0.01}, config=config)
    assert not node._topics[TOPIC].membership.settled()
    assert rescheduled(fire(node, "ping", 100.0), "ping") == 5.0


def test_a_settled_node_does_not_ping_a_link_its_peer_pinged_within_the_settled_period():
    node = settled_node(6.0)
    node.handle(received(1, m.Ping(nonce=7)), 100.0)
    pinged = {s.peer for s in sends(fire(node, "ping", 101.0)) if isinstance(s.message, m.Ping)}
    assert pinged == {2, 3}
    later = fire(node, "ping", 101.0 + 30.0 + 0.5)  # the peer's ping is a period old
    assert {s.peer for s in sends(later) if isinstance(s.message, m.Ping)} == {1, 2, 3}


def test_without_settled_upkeep_both_ends_ping_whatever_the_peer_sent() -> None:
    node = settled_node(None)
    node.handle(received(1, m.Ping(nonce=7)), 1.0)
    pinged = {s.peer for s in sends(fire(node, "ping", 2.0)) if isinstance(s.message, m.Ping)}
    assert pinged == {1, 2, 3}


def test_rtt_measured_is_a_sample_and_a_bad_one_is_the_callers_error() -> None:
    node = make_node(active=[1])
    assert node.handle(RttMeasured(1, 0.004), 1.0) == []
    assert node.rtt(1) == 0.004
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(LocalProtocolError):
            node.handle(RttMeasured(1, bad), 1.0)


def test_with_pong_rtt_off_a_pong_answers_the_ping_but_takes_no_sample() -> None:
    config = node_config(membership_config(pong_rtt=False))
    node = make_node(active=[1], config=config)
    nonce = ping_nonce(fire(node, "ping", 1.0), 1)
    assert node.handle(received(1, m.Pong(nonce=nonce, subscribed=True)), 1.25) == []
    assert node.rtt(1) is None


def test_timers_set_before_the_node_settled_are_rearmed_at_the_settled_pace() -> None:
    """Settling re-arms the pings, probes, stabilisation and the first shuffle set at the
    unsettled pace: the ones armed before fire stale (no frame, no next timer).
    Optimisation keeps its round as due: it may still find a nearer peer."""
    config = node_config(membership_config(settled_upkeep=6.0))
    node = make_node(active=[1, 2], rtts={1: 0.01, 2: 0.01, 3: 0.01}, config=config)
    assert not node._topics[TOPIC].membership.settled()
    third = request(RAND, high_priority=True, rtt=0.01, links=3)
    out = node.handle(received(3, third, TOPIC), 1.0)
    assert node._topics[TOPIC].membership.settled()
    rearmed = {o.token[-1]: o.delay for o in out if isinstance(o, ScheduleTimer)}
    assert rearmed == {
        "ping": 30.0,
        "stabilize": 12.0,
        "shuffle": 60.0,
        "probe": 15.0,
    }
    old_dues = {"ping": 5.0, "stabilize": 2.0, "shuffle": 30.0, "probe": 1.0}
    for name, old_due in old_dues.items():
        assert fire(node, name, old_due) == [], name  # the timer of the old pace
    pings = [s.peer for s in sends(fire(node, "ping", 31.0)) if isinstance(s.message, m.Ping)]
    assert sorted(pings) == [1, 2, 3]
    assert rescheduled(fire(node, "shuffle", 61.0), "shuffle") == 60.0
    assert rescheduled(fire(node, "optimize", 5.0), "optimize")  # its round runs as due


def test_a_timer_armed_settled_is_not_pushed_back_by_a_flapping_view() -> None:
    """Unsettled and settled again, a node keeps the settled ping it armed: its pings are
    not postponed again at each settling."""
    config = node_config(membership_config(settled_upkeep=6.0))
    node = make_node(active=[1, 2], rtts={1: 0.01, 2: 0.01, 3: 0.01}, config=config)
    third = request(RAND, high_priority=True, rtt=0.01, links=3)
    node.handle(received(3, third, TOPIC), 1.0)  # settles: ping re-armed for 31 s
    node.handle(ConnectionLost(3), 10.0)
    assert not node._topics[TOPIC].membership.settled()
    out = node.handle(received(3, third, TOPIC), 20.0)  # settles again
    assert not [o for o in out if isinstance(o, ScheduleTimer) and o.token == token("ping")]
    pings = [s.peer for s in sends(fire(node, "ping", 31.0)) if isinstance(s.message, m.Ping)]
    assert sorted(pings) == [1, 2, 3]


def test_without_settled_upkeep_settling_rearms_nothing() -> None:
    node = make_node(active=[1, 2], rtts={1: 0.01, 2: 0.01, 3: 0.01})
    third = request(RAND, high_priority=True, rtt=0.01, links=3)
    out = node.handle(received(3, third, TOPIC), 1.0)
    assert not [o for o in out if isinstance(o, ScheduleTimer)]
    assert [s.peer for s in sends(fire(node, "ping", 5.0)) if isinstance(s.message, m.Ping)]
