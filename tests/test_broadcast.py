"""Plumtree broadcast with the Episub draft's batching and per-publisher order: one test per
rule of episub/proto/broadcast.py and episub/proto/ordering.py.

Each test drives `NodeState.handle` with an explicit `now` and compares exact outputs.
Neighbours are made the real way (NEIGHBOR requests, see tests/helpers.py): they start
eager, and a PRUNE from a neighbour makes it lazy. Publisher 9 is a peer that is not a
neighbour; its messages reach us through neighbours. Broadcast timers: ihave every
0.125 s, missing every 0.25 s, gap every 0.5 s (helpers.broadcast_config).
"""

from __future__ import annotations

import pytest

from episub.proto import config as episub_config
from episub.proto import messages as m
from episub.proto.envelope import IdHasher
from episub.proto.errors import LocalProtocolError, MessageTooLarge
from episub.proto.events import (
    AlreadyPublished,
    ClosePeer,
    ConnectionLost,
    DataLost,
    Deliver,
    Fetch,
    JoinTopic,
    LeaveTopic,
    NeighborDown,
    OutEvent,
    PeerMisbehaved,
    Publish,
    Published,
    Recovered,
    ScheduleTimer,
    Send,
)
from episub.proto.node import NodeState
from episub.proto.store import RetentionConfig
from episub.proto.trees import Trees
from tests.helpers import (
    ME,
    NEAR,
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
S = (PUBLISHER,)  # PRUNE and GRAFT name the stream of the tree they change (trees.py)
IHAVE_TIMER = ScheduleTimer(0.125, token("ihave"))
FIRST_GRAFT_TIMER = ScheduleTimer(0.125, token("missing"))  # graft_timeout after an IHAVE
MISSING_TIMER = ScheduleTimer(0.25, token("missing"))  # then missing_check_interval
GAP_TIMER = ScheduleTimer(0.5, token("gap"))
HEADS_TIMER = ScheduleTimer(1.0, token("heads"))  # heads_quiet after the first message


def node_with(
    *active: int, retention: RetentionConfig | None = None, **broadcast_overrides: object
) -> NodeState:
    """A node with these (eager) neighbours, this broadcast configuration and these store
    bounds."""
    return make_node(
        active=active,
        config=node_config(broadcast=broadcast_config(**broadcast_overrides)),
        retention=retention,
    )


def env(seq: int, payload: bytes = b"x") -> m.Envelope:
    return envelope(PUBLISHER, seq, payload)


def fresh(seq: int) -> m.Envelope:
    """Publisher 9's message `seq`, stamped later than any `now` the gap tests use: it
    arrives with no age, so a PULL stands gap_retry_interval before it counts as
    unanswered (ordering's `_answer_wait`)."""
    return envelope(PUBLISHER, seq, timestamp_ms=10**6)


def deliver(e: m.Envelope, hops: int) -> Deliver:
    return Deliver(TOPIC, mid(e), e, hops)


def fake_id(n: int) -> bytes:
    return bytes([n]) * 32


def at(e: m.Envelope, hops: int = 0) -> m.StreamRange:
    """The one-message range of `e`'s place, as IHAVE and GRAFT name it."""
    return (e.publisher, e.seq, e.seq, hops)


def place(e: m.Envelope) -> tuple[object, int]:
    return (e.publisher, e.seq)


# -- publishing ---------------------------------------------------------------------------


def test_publish_sends_gossip_hops_1_to_eager_peers_queues_ihave_and_emits_published():
    node = node_with(1, 2, 3)
    make_lazy(node, 3)
    out = node.handle(Publish(TOPIC, b"hi"), 1.0)
    e = envelope(ME, 0, b"hi", timestamp_ms=1000)
    g = m.Gossip(id=mid(e), envelope=e, hops=1)
    assert out == [Published(TOPIC, mid(e), e), send(1, g), send(2, g), HEADS_TIMER, IHAVE_TIMER]
    assert fire(node, "ihave", 1.125) == [send(3, m.IHave(ranges=(at(e),)))]


def test_publish_stamps_publisher_sequence_and_timestamp():
    node = node_with()
    out = node.handle(Publish(TOPIC, b"a", key=b"k", headers=(("h", b"v"),)), 2.5)
    out += node.handle(Publish(TOPIC, b"b"), 3.0)
    published = [e.envelope for e in out if isinstance(e, Published)]
    assert published == [
        m.Envelope(
            publisher=ME, seq=0, timestamp_ms=2500, payload=b"a", key=b"k", headers=(("h", b"v"),)
        ),
        m.Envelope(publisher=ME, seq=1, timestamp_ms=3000, payload=b"b"),
    ]


def test_publish_over_max_message_size_raises_message_too_large():
    node = node_with(1, max_message_size=4)
    with pytest.raises(MessageTooLarge):
        node.handle(Publish(TOPIC, b"12345"), 1.0)
    with pytest.raises(MessageTooLarge):  # key and headers count too
        node.handle(Publish(TOPIC, b"12", key=b"3", headers=(("4", b"5"),)), 1.0)
    out = node.handle(Publish(TOPIC, b"1234"), 1.0)
    assert out[0] == Published(
        TOPIC, mid(envelope(ME, 0, b"1234", 1000)), envelope(ME, 0, b"1234", 1000)
    )


# -- gossip -------------------------------------------------------------------------------


def test_first_receipt_delivers_and_forwards_to_eager_peers_except_sender_with_hops_plus_1():
    node = node_with(1, 2, 3)
    e = env(0)
    out = node.handle(received(1, gossip(e, hops=2)), 1.0)
    forward = m.Gossip(id=mid(e), envelope=e, hops=3)
    assert out == [send(2, forward), send(3, forward), HEADS_TIMER, IHAVE_TIMER, deliver(e, 2)]


def test_duplicate_gossip_prunes_the_sender_which_becomes_lazy():
    node = node_with(1, 2, 3)
    node.handle(received(1, gossip(env(0), hops=2)), 1.0)
    assert node.handle(received(2, gossip(env(0), hops=4)), 1.0) == [send(2, m.Prune(streams=S))]
    assert node.eager_peers(TOPIC) == [1, 3]
    assert node.lazy_peers(TOPIC) == [2]
    # Copies it sent before our PRUNE reached it need no second PRUNE...
    assert node.handle(received(2, gossip(env(0), hops=4)), 1.25) == []


def test_a_lazy_peer_still_pushing_after_the_grace_is_pruned_again():
    """...but one still pushing after that holds us eager: our PRUNE, or its GRAFT's
    answer, was lost. Copies it sent before our last PRUNE reached it are spared."""
    node = node_with(1, 2, 3, graft_grace=0.5)
    node.handle(received(1, gossip(env(0), hops=2)), 1.0)
    node.handle(received(2, gossip(env(0), hops=4)), 1.0)
    node.handle(received(1, gossip(env(1), hops=2)), 2.0)
    assert node.handle(received(2, gossip(env(1), hops=4)), 2.0) == [send(2, m.Prune(streams=S))]
    assert node.lazy_peers(TOPIC) == [2]


def test_our_own_message_coming_back_is_a_duplicate():
    node = node_with(1, 2)
    out = node.handle(Publish(TOPIC, b"hi"), 1.0)
    mine = out[0]
    back = m.Gossip(id=mine.id, envelope=mine.envelope, hops=3)
    assert node.handle(received(2, back), 1.25) == [send(2, m.Prune(streams=(ME,)))]


def test_gossip_whose_id_does_not_match_its_envelope_is_dropped_as_misbehaviour():
    node = node_with(1, 2)
    forged = m.Gossip(id=mid(env(1)), envelope=env(0), hops=1)
    out = node.handle(received(1, forged), 1.0)
    assert out == [PeerMisbehaved(1, "GOSSIP id does not match its envelope")]
    # Nothing of it was remembered: the real message is still new.
    assert deliver(env(0), 1) in node.handle(received(1, gossip(env(0))), 1.0)


def test_gossip_whose_envelope_is_not_canonical_is_dropped_as_misbehaviour():
    """The envelope's bytes are its identity (envelope.py): a layout our nodes never write,
    here seq 0 written out where protobuf leaves it out, is refused on first receipt, even
    when the id matches those very bytes."""
    node = node_with(1, 2)
    raw = b"\x0a\x01a\x10\x00\x22\x01x"
    forged = m.Gossip.from_wire(IdHasher(TOPIC)(raw), raw, 1)
    out = node.handle(received(1, forged), 1.0)
    assert len(out) == 1 and isinstance(out[0], PeerMisbehaved)
    assert out[0].reason.startswith("GOSSIP envelope is not canonical")


def test_a_duplicate_gossip_is_dropped_on_its_id_without_decoding_its_envelope():
    node = node_with(1, 2)
    node.handle(received(1, gossip(env(0))), 1.0)
    garbage = m.Gossip.from_wire(mid(env(0)), b"not an envelope", 2)
    node.handle(received(2, garbage), 1.1)
    assert broadcast(node).counters.duplicates_received == 1
    assert garbage._envelope is None  # never decoded


def test_a_relay_forwards_the_envelope_bytes_it_received():
    node = node_with(1, 2)
    original = gossip(env(0))
    [forward] = [s.message for s in sends(node.handle(received(1, original), 1.0), m.Gossip)]
    assert forward.raw is original.raw and forward.hops == original.hops + 1


def test_gossip_over_max_message_size_is_dropped_as_misbehaviour():
    node = node_with(1, 2, max_message_size=4)
    out = node.handle(received(1, gossip(env(0, b"12345"))), 1.0)
    assert out == [PeerMisbehaved(1, "GOSSIP of 5 bytes exceeds max_message_size")]


def test_gossip_from_a_lazy_neighbour_makes_it_eager_again():
    node = node_with(1, 2)
    make_lazy(node, 2)
    node.handle(received(2, gossip(env(0))), 1.0)
    assert node.eager_peers(TOPIC) == [1, 2]


# -- lazy push ----------------------------------------------------------------------------


def test_ihave_is_flushed_to_lazy_peers_only_excluding_the_peer_it_came_from():
    node = node_with(1, 2, 3)
    make_lazy(node, 3)
    a, b = env(0), env(1)
    node.handle(received(1, gossip(a, hops=1)), 1.0)
    node.handle(received(2, gossip(b, hops=2)), 1.0)
    make_lazy(node, 2, now=1.0)
    assert fire(node, "ihave", 1.125) == [
        send(3, m.IHave(ranges=(at(a, 1), at(b, 2)))),  # two hop counts: two runs
        send(2, m.IHave(ranges=(at(a, 1),))),
    ]
    assert fire(node, "ihave", 1.25) == []  # the queue was emptied


def test_ihave_leaves_out_ids_a_peer_sent_or_announced_to_us_meanwhile():
    node = node_with(1, 2, 3, 4)
    make_lazy(node, 2, 3, 4)
    a, b = env(0), env(1)
    node.handle(received(1, gossip(a, hops=1)), 1.0)
    node.handle(received(1, gossip(b, hops=1)), 1.0)
    node.handle(received(2, m.IHave(ranges=(at(a, 1),))), 1.05)  # 2 holds a
    node.handle(received(3, gossip(b, hops=2)), 1.06)  # 3 holds b (a duplicate)
    assert fire(node, "ihave", 1.125) == [
        send(2, m.IHave(ranges=(at(b, 1),))),
        send(3, m.IHave(ranges=(at(a, 1),))),
        send(4, m.IHave(ranges=((PUBLISHER, 0, 1, 1),))),  # one run: seqs 0..1 at hops 1
    ]


def test_ihave_is_chunked_by_max_ihave_ids():
    node = node_with(1, 9, max_ihave_ids=2)  # 9 stays eager: a node keeps a parent
    make_lazy(node, 1)
    for i in range(5):
        node.handle(Publish(TOPIC, bytes([i])), 1.0)
    assert fire(node, "ihave", 1.125) == [
        send(1, m.IHave(ranges=((ME, 0, 1, 0),))),
        send(1, m.IHave(ranges=((ME, 2, 3, 0),))),
        send(1, m.IHave(ranges=((ME, 4, 4, 0),))),
    ]


def test_ihave_timer_is_armed_once_per_batch():
    node = node_with(1)
    assert node.handle(Publish(TOPIC, b"a"), 1.0)[-1] == IHAVE_TIMER
    assert IHAVE_TIMER not in node.handle(Publish(TOPIC, b"b"), 1.0)
    fire(node, "ihave", 1.125)
    assert node.handle(Publish(TOPIC, b"c"), 1.25)[-1] == IHAVE_TIMER


def test_ihave_of_an_unknown_id_makes_it_missing_and_arms_the_missing_timer():
    node = node_with(1, 2, 3)
    make_lazy(node, 2, 3)
    x = env(1)
    assert node.handle(received(2, m.IHave(ranges=(at(x, 3),))), 1.0) == [FIRST_GRAFT_TIMER]
    assert node.handle(received(3, m.IHave(ranges=(at(x, 1),))), 1.0) == []
    assert broadcast(node).missing[place(x)].announcers == [(2, 3), (3, 1)]


def test_ihave_of_a_seen_id_is_ignored():
    node = node_with(1, 2)
    node.handle(received(1, gossip(env(0))), 1.0)
    assert node.handle(received(2, m.IHave(ranges=(at(env(0), 1),))), 1.0) == []
    assert broadcast(node).missing == {}


def test_ihave_from_a_non_neighbour_is_ignored():
    node = node_with(1)
    assert node.handle(received(7, m.IHave(ranges=(at(env(1), 1),))), 1.0) == []
    assert broadcast(node).missing == {}


def test_a_missing_id_is_grafted_graft_timeout_after_its_first_ihave_then_from_the_next():
    node = node_with(1, 2, 3)
    make_lazy(node, 2, 3)
    x = env(1)
    node.handle(received(2, m.IHave(ranges=(at(x, 3),))), 1.0)
    node.handle(received(3, m.IHave(ranges=(at(x, 1),))), 1.0)
    assert fire(node, "missing", 1.125) == [send(2, m.Graft(ranges=(at(x),))), MISSING_TIMER]
    assert node.eager_peers(TOPIC) == [1, 2]  # grafting makes the link eager
    assert fire(node, "missing", 1.375) == [send(3, m.Graft(ranges=(at(x),))), MISSING_TIMER]
    assert fire(node, "missing", 1.625) == [send(2, m.Graft(ranges=(at(x),))), MISSING_TIMER]


def test_each_missing_id_is_due_graft_timeout_after_its_own_first_ihave():
    # Plumtree's per-message timer, as one queue: an id announced between two GRAFTs of
    # another is not kept waiting for a shared tick (crash 80%'s slowest deliveries
    # waited 200-400 ms for the old tick's mark-then-graft; docs/simulation.md).
    node = node_with(1, 2)
    make_lazy(node, 2)
    x, y = env(1), env(2)
    assert node.handle(received(2, m.IHave(ranges=(at(x, 1),))), 1.0) == [FIRST_GRAFT_TIMER]
    assert node.handle(received(2, m.IHave(ranges=(at(y, 1),))), 1.0625) == []
    assert fire(node, "missing", 1.125) == [
        send(2, m.Graft(ranges=(at(x),))),
        ScheduleTimer(0.0625, token("missing")),  # y is due at 1.1875
    ]
    assert fire(node, "missing", 1.1875) == [
        send(2, m.Graft(ranges=(at(y),))),
        ScheduleTimer(0.1875, token("missing")),  # x's retry at 1.375
    ]
    # y arrives meanwhile and is not asked again.
    node.handle(received(1, gossip(y, hops=2)), 1.25)
    assert fire(node, "missing", 1.375) == [send(2, m.Graft(ranges=(at(x),))), MISSING_TIMER]


def test_a_missing_id_that_arrives_is_no_longer_grafted():
    node = node_with(1, 2)
    make_lazy(node, 2)
    e = env(0)
    node.handle(received(2, m.IHave(ranges=(at(e, 1),))), 1.0)
    node.handle(received(1, gossip(e, hops=3)), 1.0625)
    assert fire(node, "missing", 1.125) == []


def test_a_missing_id_is_given_up_after_missing_give_up_ticks():
    node = node_with(1, 2, missing_give_up_ticks=3)
    make_lazy(node, 2)
    x = env(1)
    node.handle(received(2, m.IHave(ranges=(at(x, 1),))), 1.0)
    fire(node, "missing", 1.125)
    fire(node, "missing", 1.375)
    assert fire(node, "missing", 1.625) == [send(2, m.Graft(ranges=(at(x),))), MISSING_TIMER]
    assert fire(node, "missing", 1.875) == []
    assert broadcast(node).missing == {}


def test_a_missing_id_is_dropped_when_no_announcer_is_still_a_neighbour():
    node = node_with(1, 2)
    make_lazy(node, 2)
    node.handle(received(2, m.IHave(ranges=(at(env(1), 1),))), 1.0)
    fire(node, "missing", 1.125)
    node.handle(received(2, m.Disconnect()), 1.25)
    assert fire(node, "missing", 1.375) == []
    assert broadcast(node).missing == {}


def test_grafts_are_batched_per_peer_and_chunked_by_max_graft_ids():
    node = node_with(1, 2, max_graft_ids=2)
    make_lazy(node, 2)
    node.handle(received(2, m.IHave(ranges=((PUBLISHER, 1, 3, 1),))), 1.0)
    assert fire(node, "missing", 1.125) == [
        send(2, m.Graft(ranges=((PUBLISHER, 1, 2, 0),))),
        send(2, m.Graft(ranges=((PUBLISHER, 3, 3, 0),))),
        MISSING_TIMER,
    ]


def test_graft_makes_sender_eager_and_is_answered_from_cache():
    node = node_with(1, 2)
    published = node.handle(Publish(TOPIC, b"hi"), 1.0)[0]
    e = env(0)
    node.handle(received(2, gossip(e, hops=4)), 1.0)
    make_lazy(node, 1)
    out = node.handle(received(1, m.Graft(ranges=((ME, 0, 0, 0), at(env(7)), at(e)))), 2.0)
    assert out == [
        send(1, m.Gossip(id=published.id, envelope=published.envelope, hops=1)),
        send(1, m.Gossip(id=mid(e), envelope=e, hops=5)),
    ]
    assert node.eager_peers(TOPIC) == [2, 1]


def test_empty_graft_only_makes_the_sender_eager():
    node = node_with(1, 2)
    make_lazy(node, 1)
    assert node.handle(received(1, m.Graft()), 1.0) == []
    assert node.lazy_peers(TOPIC) == []


def test_a_peer_that_just_grafted_us_is_not_pruned_for_copies_already_in_flight():
    """It lost its parent (eager repair) or swaps to us (optimisation) and forwards what
    was already on its way to it: pruning it for those copies would undo the repair on
    every link it grafted at once. Seen in the simulator with IHAVE dropped, when a
    proximity swap took a node's parent: it was left with no eager parent at all."""
    node = node_with(1, 2, graft_grace=0.5)
    make_lazy(node, 2)
    node.handle(received(2, m.Graft(streams=S)), 1.0)
    node.handle(received(1, gossip(env(0), hops=2)), 1.0)
    assert node.handle(received(2, gossip(env(0), hops=5)), 1.2) == []
    assert node.eager_peers(TOPIC) == [1, 2]
    # After the grace a duplicate prunes it as usual.
    node.handle(received(1, gossip(env(1), hops=2)), 1.6)
    assert node.handle(received(2, gossip(env(1), hops=5)), 1.6) == [send(2, m.Prune(streams=S))]
    assert node.lazy_peers(TOPIC) == [2]


def grafted_from_two_announcers() -> tuple[NodeState, m.Envelope]:
    """Eager 1; lazy 2 and 3 announced e, and were GRAFTed for it in turn (both now eager)."""
    node = node_with(1, 2, 3)
    make_lazy(node, 2, 3)
    e = env(0)
    node.handle(received(2, m.IHave(ranges=(at(e, 1),))), 1.0)
    node.handle(received(3, m.IHave(ranges=(at(e, 1),))), 1.0)
    assert sends(fire(node, "missing", 1.125), m.Graft) == [send(2, m.Graft(ranges=(at(e),)))]
    assert sends(fire(node, "missing", 1.375), m.Graft) == [send(3, m.Graft(ranges=(at(e),)))]
    return node, e


def test_a_grafted_message_is_not_pushed_to_the_peers_that_announced_it():
    """3 said it holds e: pushing e there is a duplicate it PRUNEs us for. A node that had
    lost its eager links and grafted several announcers had those new links cut at once
    by such PRUNEs, lost them again and repaired again, in a loop (the config benchmark:
    ~500 GRAFTs a run at 50 msg/s)."""
    node, e = grafted_from_two_announcers()
    out = node.handle(received(2, gossip(e, hops=2)), 1.8)
    assert sends(out, m.Gossip) == [send(1, m.Gossip(id=mid(e), envelope=e, hops=3))]


def test_the_answer_to_our_graft_from_a_second_announcer_is_not_pruned():
    """We asked two announcers in turn and both answered: the link carries no redundant
    push. Pruning it for the copy we asked for cut the link we had just grafted, and left
    a node that had lost its eager links with none again (the config benchmark's repair
    loop, as above)."""
    node, e = grafted_from_two_announcers()
    node.handle(received(2, gossip(e, hops=2)), 1.8)
    assert node.handle(received(3, gossip(e, hops=2)), 1.85) == []  # we asked 3 for it
    assert node.eager_peers(TOPIC) == [1, 2, 3]
    # A copy we did not ask for is a redundant path as usual.
    assert node.handle(received(3, gossip(e, hops=2)), 1.9) == [send(3, m.Prune(streams=S))]


def test_a_copy_from_a_peer_we_just_pruned_leaves_it_lazy():
    """It was on its way before our PRUNE arrived: on reading the PRUNE the peer makes us
    lazy, so counting it as eager again left a node whose one "parent" pushed nothing to
    it (a benchmark trace: cut off 320 ms)."""
    node = node_with(1, 2, graft_grace=0.5)
    node.handle(received(1, gossip(env(0), hops=2)), 1.0)
    assert node.handle(received(2, gossip(env(0), hops=3)), 1.01) == [send(2, m.Prune(streams=S))]
    out = node.handle(received(2, gossip(env(1), hops=3)), 1.02)
    assert deliver(env(1), 3) in out
    assert (node.eager_peers(TOPIC), node.lazy_peers(TOPIC)) == ([1], [2])
    # Past the grace, a push from a lazy peer means it holds us eager, as Plumtree has it.
    node.handle(received(2, gossip(env(2), hops=3)), 1.6)
    assert (node.eager_peers(TOPIC), node.lazy_peers(TOPIC)) == ([1, 2], [])


def test_pruned_parents_crossing_leave_us_with_a_parent():
    """A benchmark trace: we pruned 2 for a duplicate, 2's next copy (sent before our PRUNE
    arrived) came first and we forwarded it to 1, our other parent, which had it: 1's
    duplicate of it must not prune 1 (it alone has sent us messages first: our one
    parent), and 1's PRUNE for our forward grafts 2 back (it fed us last). Pruning 1 too
    left us with IHAVEs only, every message repaired a GRAFT round later."""
    node = node_with(1, 2, graft_grace=0.5)
    node.handle(received(1, gossip(env(0), hops=2)), 1.0)
    node.handle(received(2, gossip(env(0), hops=3)), 1.01)  # PRUNE 2
    node.handle(received(2, gossip(env(1), hops=3)), 1.02)  # forwarded to 1
    fire(node, "ihave", 1.125)
    assert node.handle(received(1, gossip(env(1), hops=2)), 1.13) == []
    assert node.handle(received(1, m.Prune()), 1.14) == [send(2, m.Graft(streams=S))]
    assert (node.eager_peers(TOPIC), node.lazy_peers(TOPIC)) == ([2], [1])
    assert broadcast(node).counters.regrafts == 1


def test_a_prune_from_our_last_feeder_grafts_the_parent_that_fed_us_most_lately():
    node = node_with(1, 2, 3)
    make_lazy(node, 3)
    node.handle(received(1, gossip(env(0), hops=2)), 1.0)
    node.handle(received(2, gossip(env(1), hops=2)), 1.05)  # 2 fed us last
    fire(node, "ihave", 1.125)
    assert node.handle(received(1, m.Prune(streams=S)), 1.2) == []  # 2 still feeds us
    assert node.handle(received(2, m.Prune(streams=S)), 1.3) == [send(1, m.Graft(streams=S))]
    assert (node.eager_peers(TOPIC), node.lazy_peers(TOPIC)) == ([1], [3, 2])


def test_prune_makes_the_sender_lazy():
    node = node_with(1, 2)
    assert node.handle(received(1, m.Prune()), 1.0) == []
    assert node.eager_peers(TOPIC) == [2]
    assert node.lazy_peers(TOPIC) == [1]


def test_a_node_whose_last_eager_link_is_pruned_grafts_a_lazy_one():
    # All lazy, a node hears of messages only by IHAVE, late, or never if IHAVEs are lost.
    node = node_with(1, 2, 3)
    make_lazy(node, 1, 2)
    assert node.handle(received(3, m.Prune()), 1.0) == [send(1, m.Graft())]
    assert node.eager_peers(TOPIC) == [1]
    assert node.lazy_peers(TOPIC) == [2, 3]


def test_the_only_neighbour_that_pruned_us_is_grafted_back():
    node = node_with(1)
    assert node.handle(received(1, m.Prune()), 1.0) == [send(1, m.Graft())]
    assert node.eager_peers(TOPIC) == [1]


def test_a_first_copy_from_a_lazy_peer_grafts_it_so_both_ends_agree():
    """Plumtree makes the sender of a first copy our eager parent. A PULL answer (gap
    repair) is such a copy from a peer that holds us lazy: flipping only our end left the
    link eager here and lazy there, and the node missed the tail of a stream for good
    (`--drop ihave=1.0`). An empty GRAFT makes both ends agree."""
    node = node_with(1, 2)
    make_lazy(node, 2)
    e = env(0)
    out = node.handle(received(2, gossip(e, hops=3)), 1.0)
    assert send(2, m.Graft(streams=S)) in out
    assert node.eager_peers(TOPIC) == [1, 2]


def test_a_duplicate_from_our_last_eager_link_does_not_prune_it():
    """The first copy came from a peer that had just left our view; every neighbour then
    pushed the same message. Pruning them all left a node with lazy links only, and with
    IHAVEs lost it missed all 50 counted messages (`--drop ihave=1.0 --seed 2`)."""
    node = node_with(1, 2)
    node.handle(received(9, gossip(env(0), hops=2)), 1.0)  # 9: no longer a neighbour
    assert node.handle(received(2, gossip(env(0), hops=3)), 1.0) == [send(2, m.Prune(streams=S))]
    assert node.handle(received(1, gossip(env(0), hops=3)), 1.0) == []
    assert node.eager_peers(TOPIC) == [1]


def test_prune_or_graft_from_a_non_neighbour_changes_no_set():
    node = node_with(1)
    node.handle(received(7, m.Prune()), 1.0)
    node.handle(received(7, m.Graft()), 1.0)
    assert (node.eager_peers(TOPIC), node.lazy_peers(TOPIC)) == ([1], [])


# -- tree optimisation --------------------------------------------------------------------


def announced_then_received(eager_hops: int) -> tuple[NodeState, list, m.Envelope]:
    """Lazy 2 announced the message at hops 1; then eager 1 sends it at `eager_hops`."""
    node = node_with(1, 2, optimization_threshold=7)
    make_lazy(node, 2)
    e = env(0)
    node.handle(received(2, m.IHave(ranges=(at(e, 1),))), 1.0)
    out = node.handle(received(1, gossip(e, hops=eager_hops)), 1.125)
    return node, out, e


def test_tree_optimisation_swaps_when_the_lazy_path_is_shorter_by_the_threshold():
    # Through 2 the message is 1 + 1 = 2 hops away; through 1 it is 9: shorter by 7.
    node, out, _ = announced_then_received(eager_hops=9)
    assert sends(out, m.Graft) == [send(2, m.Graft(streams=S))]
    assert sends(out, m.Prune) == [send(1, m.Prune(streams=S))]
    assert (node.eager_peers(TOPIC), node.lazy_peers(TOPIC)) == ([2], [1])


def test_tree_optimisation_keeps_the_tree_when_the_lazy_path_is_not_short_enough():
    node, out, e = announced_then_received(eager_hops=8)
    assert out == [HEADS_TIMER, IHAVE_TIMER, deliver(e, 8)]
    assert (node.eager_peers(TOPIC), node.lazy_peers(TOPIC)) == ([1], [2])


def test_tree_optimisation_does_not_send_the_message_to_the_announcer_it_grafts():
    _, out, e = announced_then_received(eager_hops=9)
    assert send(2, m.Gossip(id=mid(e), envelope=e, hops=10)) not in out


# -- near parent ----------------------------------------------------------------------------


def far_parent_and_near_announcer(
    *, far_rtt: float = 0.1, late: float = 0.0, announced_hops: int = 2
) -> tuple[NodeState, list, m.Envelope]:
    """Eager 1 (RTT `far_rtt`) sends a message first at 1.0, hops 3; lazy 2 (RTT 0.01 s)
    announces it at `announced_hops` one flush interval (0.125 s) plus its one-way delay
    plus `late` later."""
    config = node_config(broadcast=broadcast_config())
    node = make_node(active=(1, 2), rtts={1: far_rtt, 2: 0.01}, config=config)
    make_lazy(node, 2)
    e = env(0)
    node.handle(received(1, gossip(e, hops=3)), 1.0)
    ihave = m.IHave(ranges=(at(e, announced_hops),))
    out = node.handle(received(2, ihave), 1.0 + 0.125 + 0.005 + late)
    return node, out, e


def test_a_near_lazy_announcer_as_early_as_the_far_parent_takes_its_place():
    """The zones model: a node's first copy came over a far link while a lazy zone-mate
    held the message within a ms or two; it is the parent that costs a near link."""
    node, out, _ = far_parent_and_near_announcer()
    assert out == [send(2, m.Graft(streams=S)), send(1, m.Prune(streams=S))]
    assert (node.eager_peers(TOPIC), node.lazy_peers(TOPIC)) == ([2], [1])
    assert broadcast(node).counters.near_parent_swaps == 1


@pytest.mark.parametrize(
    "case",
    [
        {"far_rtt": 0.04},  # 0.01 * 4 is not below 0.04: not near enough
        {"late": 0.02},  # its copy could not have come within its RTT (0.01) of ours
        {"announced_hops": 3},  # as many hops as ours: it may take us as its parent too
    ],
)
def test_the_far_parent_stays_unless_the_announcer_is_near_early_and_not_below_us(case):
    node, out, _ = far_parent_and_near_announcer(**case)
    assert out == []
    assert (node.eager_peers(TOPIC), node.lazy_peers(TOPIC)) == ([1], [2])


def test_near_parent_swaps_happen_at_most_once_per_graft_grace():
    config = node_config(broadcast=broadcast_config())
    rtts = {1: 0.1, 4: 0.1, 2: 0.01, 3: 0.01}
    node = make_node(active=(1, 4, 2, 3), rtts=rtts, config=config)
    make_lazy(node, 2, 3)
    a, b, c = env(0), env(1), env(2)
    node.handle(received(1, gossip(a, hops=3)), 1.0)
    node.handle(received(2, m.IHave(ranges=(at(a, 2),))), 1.13)
    # Far 4 sends b first, near 3 announces it as early: within graft_grace of the swap.
    node.handle(received(4, gossip(b, hops=3)), 1.2)
    assert node.handle(received(3, m.IHave(ranges=(at(b, 2),))), 1.33) == []
    # After the grace the same case swaps.
    node.handle(received(4, gossip(c, hops=3)), 2.0)
    out = node.handle(received(3, m.IHave(ranges=(at(c, 2),))), 2.13)
    assert (sends(out, m.Graft), sends(out, m.Prune)) == (
        [send(3, m.Graft(streams=S))],
        [send(4, m.Prune(streams=S))],
    )
    assert broadcast(node).counters.near_parent_swaps == 2


# -- lazy race ------------------------------------------------------------------------------


def parent_and_shorter_announcer(
    *, late: float = 0.0, announced_hops: int = 1
) -> tuple[NodeState, list, m.Envelope]:
    """Eager 1 sends a message first at 1.0, hops 3; lazy 2 announces it at
    `announced_hops`, 0.05 s plus `late` later (the flush period is 0.125 s)."""
    config = node_config(broadcast=broadcast_config(near_parent_factor=0.0, race_lazy_hops=1))
    node = make_node(active=(1, 2), config=config)
    make_lazy(node, 2)
    e = env(0)
    node.handle(received(1, gossip(e, hops=3)), 1.0)
    out = node.handle(received(2, m.IHave(ranges=(at(e, announced_hops),))), 1.05 + late)
    return node, out, e


def test_a_lazy_announcer_of_a_shorter_path_is_raced_against_the_parent_not_swapped_in():
    """Hops do not rank paths by latency: the announcer is asked to push (a GRAFT naming
    the stream) and the next message's duplicate rule prunes the slower of the two; we
    stay lazy towards it."""
    node, out, _ = parent_and_shorter_announcer()
    assert out == [send(2, m.Graft(streams=S))]
    assert (node.eager_peers(TOPIC), node.lazy_peers(TOPIC)) == ([1], [2])
    assert broadcast(node).counters.lazy_races == 1


@pytest.mark.parametrize(
    "case",
    [
        {"announced_hops": 2},  # its path (2 + 1 hops) is no shorter than ours (3)
        {"late": 0.125},  # its IHAVE came a flush period after our copy: a slower path
    ],
)
def test_no_race_with_an_announcer_no_shorter_or_surely_slower(case):
    node, out, _ = parent_and_shorter_announcer(**case)
    assert out == []
    assert broadcast(node).counters.lazy_races == 0


def test_a_peer_pruned_less_than_race_backoff_ago_is_not_raced():
    node, _, _ = parent_and_shorter_announcer()
    # It pushes the next message after ours: a duplicate, so it is pruned (lost the race).
    f = env(1)
    node.handle(received(1, gossip(f, hops=3)), 2.0)
    assert sends(node.handle(received(2, gossip(f, hops=2)), 2.01), m.Prune) == [
        send(2, m.Prune(streams=S))
    ]
    g = env(2)
    node.handle(received(1, gossip(g, hops=3)), 3.0)
    assert node.handle(received(2, m.IHave(ranges=(at(g, 1),))), 3.05) == []
    h = env(3)
    node.handle(received(1, gossip(h, hops=3)), 7.5)
    out = node.handle(received(2, m.IHave(ranges=(at(h, 1),))), 7.55)
    assert out == [send(2, m.Graft(streams=S))]


def test_the_near_parent_rule_is_off_at_factor_0_the_default():
    assert episub_config.BroadcastConfig().near_parent_factor == 0
    config = node_config(broadcast=broadcast_config(near_parent_factor=0.0))
    node = make_node(active=(1, 2), rtts={1: 0.1, 2: 0.01}, config=config)
    make_lazy(node, 2)
    e = env(0)
    node.handle(received(1, gossip(e, hops=3)), 1.0)
    assert node.handle(received(2, m.IHave(ranges=(at(e, 2),))), 1.13) == []


# -- links coming up ----------------------------------------------------------------------


def test_a_link_that_comes_up_while_a_parent_feeds_us_starts_lazy_and_is_pruned():
    # 1 feeds us (a parent): a new link would only carry a second copy of its messages
    # until a duplicate pruned it. It starts lazy, and a PRUNE tells the other end.
    node = node_with(1)
    node.handle(received(1, gossip(env(0), hops=2)), 1.0)
    out = node.handle(received(4, request(high_priority=True)), 1.1)
    assert sends(out, m.Prune) == [send(4, m.Prune(streams=S))]
    assert node.eager_peers(TOPIC) == [1]
    assert node.lazy_peers(TOPIC) == [4]
    # Its pushes sent before our PRUNE arrived leave it lazy: no GRAFT, no second PRUNE.
    out = node.handle(received(4, gossip(env(1), hops=2)), 1.2)
    assert sends(out, m.Graft) == [] and sends(out, m.Prune) == []
    assert node.lazy_peers(TOPIC) == [4]
    assert node.handle(received(4, gossip(env(0), hops=3)), 1.25) == []


def test_a_link_that_comes_up_at_a_node_without_a_parent_starts_eager():
    # Nothing feeds us yet: every new link may be the way messages come, so it starts
    # eager, as in Plumtree.
    node = node_with(1)
    out = node.handle(received(4, request(high_priority=True)), 1.0)
    assert sends(out, m.Prune) == []
    assert node.eager_peers(TOPIC) == [1, 4]


def test_the_other_end_of_a_link_started_lazy_agrees_or_grafts_it_back():
    # The end with a parent pruned the new link at once. The other end takes the PRUNE:
    # the link is lazy at both ends while another eager link is left to it; with none
    # left it grafts the link back, and the end that pruned makes it eager on the GRAFT.
    parent_end = node_with(1)
    parent_end.handle(received(1, gossip(env(0), hops=2)), 1.0)
    parent_end.handle(received(20, request(high_priority=True)), 1.1)
    for others in ((2,), ()):
        other_end = node_with(*others)
        other_end.handle(received(10, request(high_priority=True)), 1.1)
        assert 10 in other_end.eager_peers(TOPIC)
        out = other_end.handle(received(10, m.Prune()), 1.15)
        if others:
            assert out == [] and other_end.lazy_peers(TOPIC) == [10]
        else:
            assert sends(out, m.Graft) == [send(10, m.Graft())]
            assert other_end.eager_peers(TOPIC) == [10]
    # The GRAFT back reaches the end that pruned: the link is eager there too.
    parent_end.handle(received(20, m.Graft()), 1.2)
    assert parent_end.eager_peers(TOPIC) == [1, 20]


def test_a_near_link_starts_eager_even_while_a_parent_feeds_us():
    # A NEAR link was chosen for its low RTT: its copies race our parent's, and the slower
    # of the two is pruned by its first duplicate, so the tree moves onto fast links.
    node = node_with(1)
    node.handle(received(1, gossip(env(0), hops=2)), 1.0)
    out = node.handle(received(4, request(NEAR, high_priority=True)), 1.1)
    assert sends(out, m.Prune) == []
    assert node.eager_peers(TOPIC) == [1, 4]


def test_a_new_lazy_link_is_announced_only_what_was_queued_after_it_came_up():
    # A late joiner announced what its peer held before it came grafted it and took
    # that history for news (tests/test_node_api.py): it is left out of the flush.
    node = node_with(1)
    node.handle(received(1, gossip(env(0), hops=2)), 1.0)
    node.handle(received(4, request(high_priority=True)), 1.05)
    node.handle(received(1, gossip(env(1), hops=2)), 1.1)
    out = fire(node, "ihave", 1.125)
    assert sends(out, m.IHave) == [send(4, m.IHave(ranges=(at(env(1), 2),)))]


def test_without_lazy_start_a_link_always_starts_eager():
    node = node_with(1, lazy_start=False)
    node.handle(received(1, gossip(env(0), hops=2)), 1.0)
    assert sends(node.handle(received(4, request(high_priority=True)), 1.1), m.Prune) == []
    assert node.eager_peers(TOPIC) == [1, 4]


# -- a delivery tree per publisher stream (trees.py) ----------------------------------------

OTHER = 8  # a second publisher that is not a neighbour


def forwarded_to(out: list[OutEvent]) -> list[object]:
    return [e.peer for e in sends(out, m.Gossip)]


def test_a_duplicate_prunes_the_link_for_its_own_stream_only():
    node = node_with(1, 2, 3)
    node.handle(received(1, gossip(env(0), hops=2)), 1.0)
    assert node.handle(received(2, gossip(env(0), hops=4)), 1.0) == [send(2, m.Prune(streams=S))]
    # Another publisher's messages still go to 2: its tree kept the link eager.
    out = node.handle(received(1, gossip(envelope(OTHER, 0), hops=2)), 1.1)
    assert forwarded_to(out) == [2, 3]
    # And the first stream's do not.
    assert forwarded_to(node.handle(received(1, gossip(env(1), hops=2)), 1.2)) == [3]


def test_a_prune_naming_a_stream_leaves_the_other_streams_eager():
    node = node_with(1, 2, 3)
    make_lazy(node, 2, streams=(OTHER,))
    assert forwarded_to(node.handle(received(1, gossip(env(0), hops=2)), 1.0)) == [2, 3]
    assert forwarded_to(node.handle(received(1, gossip(envelope(OTHER, 0))), 1.1)) == [3]


def test_a_graft_naming_a_stream_makes_the_link_eager_for_that_stream_only():
    node = node_with(1, 2, 3)
    make_lazy(node, 2)  # the whole link: every tree, and what new ones start from
    node.handle(received(2, m.Graft(streams=(OTHER,))), 1.0)
    assert forwarded_to(node.handle(received(1, gossip(env(0), hops=2)), 1.1)) == [3]
    assert forwarded_to(node.handle(received(1, gossip(envelope(OTHER, 0))), 1.2)) == [3, 2]


def test_past_max_stream_trees_the_least_recently_seen_stream_starts_again_from_the_links():
    node = node_with(1, 2, 3, max_stream_trees=2)
    node.handle(received(1, gossip(env(0), hops=2)), 1.0)
    node.handle(received(2, gossip(env(0), hops=4)), 1.0)  # 2 pruned for PUBLISHER
    assert forwarded_to(node.handle(received(1, gossip(env(1), hops=2)), 1.1)) == [3]
    node.handle(received(1, gossip(envelope(OTHER, 0))), 1.2)
    node.handle(received(1, gossip(envelope(7, 0))), 1.3)  # a third stream: PUBLISHER's goes
    trees = broadcast(node).trees
    assert list(trees.by_stream) == [OTHER, 7]
    # PUBLISHER's next message takes a fresh copy of the links' sets: 2 is eager again
    # (its first duplicate prunes it once more), and the least recent tree, OTHER's, goes.
    assert forwarded_to(node.handle(received(1, gossip(env(2), hops=2)), 1.4)) == [2, 3]
    assert list(trees.by_stream) == [7, PUBLISHER]


def test_stream_trees_are_dropped_least_recently_used_first_however_streams_alternate():
    trees = Trees(cap=2)
    a, b = trees.get(b"a"), trees.get(b"b")
    assert trees.get(b"a") is a  # a run of a's messages after b's: a is the most recent
    assert trees.get(b"a") is a
    trees.get(b"c")  # past the cap: b, the least recently used, goes
    assert list(trees.by_stream) == [b"a", b"c"]
    assert trees.get(b"b") is not b  # made again from the links' sets
    assert list(trees.by_stream) == [b"c", b"b"]


def test_max_stream_trees_0_is_one_tree_for_every_stream():
    node = node_with(1, 2, 3, max_stream_trees=0)
    node.handle(received(1, gossip(env(0), hops=2)), 1.0)
    node.handle(received(2, gossip(env(0), hops=4)), 1.0)
    assert len(broadcast(node).trees) == 0
    assert forwarded_to(node.handle(received(1, gossip(envelope(OTHER, 0))), 1.1)) == [3]


def test_a_near_link_races_in_the_near_race_trees_seen_most_lately_only():
    # Each race costs its tree a duplicate or two: in every tree, a node's link churn cost
    # O(streams) redundant copies. The others start the link lazy, as for a RAND link.
    node = node_with(1, 2, near_race_trees=1)
    node.handle(received(1, gossip(env(0), hops=2)), 1.0)
    node.handle(received(1, gossip(envelope(OTHER, 0))), 1.0)  # OTHER: seen most lately
    out = node.handle(received(4, request(NEAR, high_priority=True)), 1.1)
    assert sends(out, m.Prune) == [send(4, m.Prune(streams=S))]
    trees = broadcast(node).trees
    assert 4 in trees.by_stream[OTHER].eager and 4 in trees.by_stream[PUBLISHER].lazy
    assert 4 in trees.shared.eager  # what a new stream starts from: every link as it came


def test_a_near_link_races_from_the_lower_id_end_only_but_in_the_latest_tree():
    # Both ends pushing a race costs two copies when neither end gains; one end pushing
    # costs one, and the other end grafts the link back when the pushed copy wins.
    config = node_config(broadcast=broadcast_config())
    for me, waits in ((0, False), (10, True)):
        node = make_node(me, active=[1, 2], config=config)
        node.handle(received(1, gossip(env(0), hops=2)), 1.0)
        node.handle(received(1, gossip(envelope(OTHER, 0))), 1.0)  # OTHER: seen most lately
        out = node.handle(received(4, request(NEAR, high_priority=True)), 1.1)
        assert sends(out, m.Prune) == []  # the pushing end keeps the link eager
        trees = broadcast(node).trees
        assert 4 in trees.by_stream[OTHER].eager  # both ends race in the latest tree
        assert (4 in trees.by_stream[PUBLISHER].lazy) is waits
    # The waiting end (10 > 4) takes the pushed copy and, as it came first, grafts the link.
    out = node.handle(received(4, gossip(env(1), hops=2)), 1.2)
    assert sends(out, m.Graft) == [send(4, m.Graft(streams=S))]
    assert 4 in trees.by_stream[PUBLISHER].eager


def test_a_link_coming_up_or_going_down_changes_every_tree():
    node = node_with(1, 2)
    node.handle(received(1, gossip(env(0), hops=2)), 1.0)
    node.handle(received(1, gossip(envelope(OTHER, 0))), 1.0)
    node.handle(received(5, request(high_priority=True)), 1.1)
    for _, tree in broadcast(node).trees:
        assert set(tree.eager) | set(tree.lazy) == {1, 2, 5}
    node.handle(received(2, m.Disconnect()), 1.2)
    for _, tree in broadcast(node).trees:
        assert set(tree.eager) | set(tree.lazy) == {1, 5}


# -- eager repair -------------------------------------------------------------------------


def test_eager_repair_on_neighbor_down_sends_empty_grafts_to_lazy_peers():
    node = node_with(1, 2, 3, eager_repair=True)
    make_lazy(node, 2, 3)
    out = node.handle(received(1, m.Disconnect()), 1.0)
    assert out == [
        NeighborDown(TOPIC, 1),
        send(2, m.Graft()),
        send(3, m.Graft()),
        ClosePeer(1),
    ]
    assert node.eager_peers(TOPIC) == [2, 3]


def test_eager_repair_grafts_at_most_eager_repair_grafts_lazy_peers_fed_us_first():
    # Grafting every lazy neighbour (up to 13) sent a copy of each message over each of
    # them, both ways, unpruned for graft_grace. Those that fed us most lately come first.
    node = node_with(1, 2, 3, 4, 5, eager_repair=True, eager_repair_grafts=2)
    node.handle(received(4, gossip(env(0), hops=2)), 1.0)
    node.handle(received(1, gossip(env(1), hops=2)), 1.1)
    make_lazy(node, 2, 3, 4, 5, now=1.2, streams=S)
    out = node.handle(received(1, m.Disconnect()), 1.3)
    assert sends(out, m.Graft) == [send(4, m.Graft(streams=S)), send(2, m.Graft(streams=S))]
    assert node.eager_peers(TOPIC) == [4, 2]
    assert node.lazy_peers(TOPIC) == [3, 5]


def test_eager_repair_grafts_one_lazy_peer_in_trees_but_the_latest():
    # A link going down (a proximity swap) is the parent of many trees; each one's second
    # graft cost redundant copies. The stream seen most lately grafts eager_repair_grafts.
    node = node_with(1, 2, 3, 4, 5, eager_repair=True, eager_repair_grafts=2)
    node.handle(received(4, gossip(env(0), hops=2)), 1.0)
    node.handle(received(1, gossip(env(1), hops=2)), 1.1)
    node.handle(received(1, gossip(envelope(OTHER, 0))), 1.15)
    make_lazy(node, 2, 3, 4, 5, now=1.2, streams=S)
    make_lazy(node, 2, 3, 4, 5, now=1.2, streams=(OTHER,))  # OTHER: seen most lately
    out = node.handle(received(1, m.Disconnect()), 1.3)
    assert sends(out, m.Graft) == [
        send(4, m.Graft(streams=S)),
        send(2, m.Graft(streams=(OTHER,))),
        send(3, m.Graft(streams=(OTHER,))),
    ]


def test_a_prune_that_crossed_our_graft_is_answered_by_graft_again():
    # We grafted 2 (eager repair) while 2, not yet knowing, pruned us for a duplicate: 2
    # makes us eager when our GRAFT lands, so taking its PRUNE would leave the link eager at
    # 2's end only (the property tests found it after a neighbour left).
    node = node_with(1, 2, 3, eager_repair=True, graft_grace=0.5)
    make_lazy(node, 2, 3)
    node.handle(received(1, m.Disconnect()), 1.0)
    assert node.handle(received(2, m.Prune()), 1.25) == [send(2, m.Graft())]
    assert node.eager_peers(TOPIC) == [2, 3]
    # Once only: a second PRUNE is the peer's word after our GRAFT.
    assert node.handle(received(2, m.Prune()), 1.3) == []
    assert node.eager_peers(TOPIC) == [3]


def test_a_prune_long_after_our_graft_is_taken():
    node = node_with(1, 2, 3, eager_repair=True, graft_grace=0.5)
    make_lazy(node, 2, 3)
    node.handle(received(1, m.Disconnect()), 1.0)
    assert node.handle(received(2, m.Prune()), 1.5) == []
    assert node.lazy_peers(TOPIC) == [2]


def test_eager_repair_is_skipped_while_another_eager_neighbour_feeds_us():
    # 1 last sent us a message first before 2 did: losing 1 (a child, or a parent that
    # 2 replaced) leaves 2 feeding us, and grafting every lazy peer would only set off
    # duplicates and PRUNEs. Losing 2, our latest parent, is repaired as before.
    for lost, grafts in ((1, []), (2, [send(3, m.Graft(streams=S))])):
        node = node_with(1, 2, 3, eager_repair=True)
        make_lazy(node, 3)
        node.handle(received(1, gossip(env(0), hops=2)), 1.0)
        node.handle(received(2, gossip(env(1), hops=2)), 1.1)
        fire(node, "ihave", 1.125)
        out = node.handle(received(lost, m.Disconnect()), 1.2)
        assert sends(out, m.Graft) == grafts


def test_eager_repair_ignores_a_lazy_neighbour_going_down():
    node = node_with(1, 2, 3, eager_repair=True)
    make_lazy(node, 2, 3)
    assert node.handle(ConnectionLost(3), 1.0) == [NeighborDown(TOPIC, 3), ClosePeer(3)]


def test_without_eager_repair_neighbor_down_sends_no_graft():
    node = node_with(1, 2, 3, eager_repair=False)
    make_lazy(node, 2, 3)
    assert node.handle(received(1, m.Disconnect()), 1.0) == [NeighborDown(TOPIC, 1), ClosePeer(1)]
    assert node.lazy_peers(TOPIC) == [2, 3]


def test_leaving_a_topic_with_eager_repair_sends_no_graft():
    node = node_with(1, 2, 3, eager_repair=True)
    make_lazy(node, 2, 3)
    assert sends(node.handle(LeaveTopic(TOPIC), 1.0), m.Graft) == []


# -- ordered delivery and gap repair ------------------------------------------------------


def test_out_of_order_messages_are_held_and_delivered_in_sequence():
    node = node_with(1)
    assert node.handle(received(1, gossip(env(0))), 1.0) == [
        HEADS_TIMER,
        IHAVE_TIMER,
        deliver(env(0), 1),
    ]
    assert node.handle(received(1, gossip(env(2))), 1.0) == [GAP_TIMER]
    assert node.handle(received(1, gossip(env(1))), 1.0) == [
        deliver(env(1), 1),
        deliver(env(2), 1),
    ]


def test_first_message_of_a_publisher_sets_where_its_stream_starts():
    node = node_with(1, 2)
    assert deliver(env(5), 1) in node.handle(received(1, gossip(env(5))), 1.0)
    out = node.handle(received(1, gossip(env(4))), 1.0)
    # Forwarded (live for nodes that joined earlier) and kept as history, not delivered.
    assert out == [Recovered(TOPIC, mid(env(4)), env(4)), send(2, gossip(env(4), hops=2))]


def hold_seq_2(*neighbours: int, **overrides: object) -> NodeState:
    """Publisher 9's seq 0 delivered and seq 2 held (the gap, seq 1, opens at now=1.0)."""
    node = node_with(*neighbours, **overrides)
    node.handle(received(neighbours[0], gossip(fresh(0))), 1.0)
    node.handle(received(neighbours[0], gossip(fresh(2))), 1.0)
    return node


def test_gap_older_than_gap_timeout_is_pulled_from_neighbours_in_turn():
    node = hold_seq_2(1, 2)
    assert fire(node, "gap", 1.5) == [GAP_TIMER]
    pull = m.Pull(publisher=PUBLISHER, first_seq=1, last_seq=1)
    assert fire(node, "gap", 2.0) == [send(1, pull), GAP_TIMER]
    assert fire(node, "gap", 2.5) == [send(2, pull), GAP_TIMER]
    assert fire(node, "gap", 3.0) == [send(1, pull), GAP_TIMER]


def test_pull_answer_fills_the_gap():
    node = hold_seq_2(1, 2)
    fire(node, "gap", 2.0)
    out = node.handle(received(1, gossip(fresh(1), hops=2)), 2.125)
    assert out[-2:] == [deliver(fresh(1), 2), deliver(fresh(2), 1)]
    assert fire(node, "gap", 2.5) == []


def test_pull_is_answered_from_cache_by_publisher_and_seq():
    node = node_with(1, 2)
    for seq in (0, 1, 3):
        node.handle(received(1, gossip(env(seq), hops=2)), 1.0)
    out = node.handle(received(2, m.Pull(publisher=PUBLISHER, first_seq=1, last_seq=5)), 2.0)
    # What the cache lacks is looked up in the node's store, which holds none of 2, 4, 5.
    assert out == [
        send(2, gossip(env(1), hops=3)),
        send(2, gossip(env(3), hops=3)),
    ]


def test_a_pull_of_history_the_store_holds_is_answered_without_touching_core_state():
    node = node_with(1, 2)
    old = envelope(b"sink/q/0/0", 7, b"old row", timestamp_ms=5)
    # Held as fetched history is: in the store, with no stream of its publisher here.
    node.store.add(node.store.places(TOPIC), mid(old), old, 0, 3.0)
    out = node.handle(received(2, m.Pull(publisher=b"sink/q/0/0", first_seq=6, last_seq=8)), 3.0)
    history = m.History(publisher=b"sink/q/0/0", envelopes=(old.raw,), hops=(1,))
    assert out == [send(2, history)]
    assert node.stats()["delivered"] == 0 and broadcast(node).answers.waiting(2) == 0


def test_gap_becomes_data_lost_after_gap_max_attempts_and_held_messages_are_released():
    node = hold_seq_2(1, gap_max_attempts=2)
    fire(node, "gap", 2.0)
    fire(node, "gap", 2.5)
    assert fire(node, "gap", 3.0) == [
        DataLost(TOPIC, PUBLISHER, 1, 1),
        deliver(fresh(2), 1),
        GAP_TIMER,
    ]
    assert fire(node, "gap", 3.5) == []
    # A late copy of the lost message is not delivered out of order.
    assert deliver(fresh(1), 1) not in node.handle(received(1, gossip(fresh(1))), 4.0)


def test_a_pull_stands_the_age_its_streams_messages_arrive_at_before_the_next():
    """Messages that arrive 5 s after their stamp (an executor busy with its tasks, its
    queues seconds deep) put the answer to a PULL seconds away: the next PULL, and the
    DataLost after the last, wait 5 s each (before, a gap was given up after
    gap_max_attempts x gap_retry_interval: a DataLost for what the neighbours held)."""
    from episub.proto.ordering import MAX_ANSWER_WAIT

    def aged(seq: int) -> m.Envelope:  # stamped at 95 s, received at 100 s
        return envelope(PUBLISHER, seq, timestamp_ms=95_000)

    node = node_with(1, 2, gap_max_attempts=2)
    node.handle(received(1, gossip(aged(0))), 100.0)
    node.handle(received(1, gossip(aged(2))), 100.0)
    pull = m.Pull(publisher=PUBLISHER, first_seq=1, last_seq=1)
    assert fire(node, "gap", 101.0) == [send(1, pull), GAP_TIMER]  # gap_timeout: asked
    wait = 5.0
    assert wait < MAX_ANSWER_WAIT
    for now in (101.5, 103.0, 101.0 + wait - 0.5):
        assert fire(node, "gap", now) == [GAP_TIMER]  # its answer may still come
    assert fire(node, "gap", 101.0 + wait) == [send(2, pull), GAP_TIMER]
    assert fire(node, "gap", 101.0 + 2 * wait - 0.5) == [GAP_TIMER]
    assert fire(node, "gap", 101.0 + 2 * wait) == [
        DataLost(TOPIC, PUBLISHER, 1, 1),
        deliver(aged(2), 1),
        GAP_TIMER,
    ]


def test_an_age_past_max_answer_wait_is_a_clocks_and_counts_for_nothing():
    """Messages stamped decades before our clock (a publisher's clock far behind, or a
    forged stamp) say nothing of queues: a PULL stands gap_retry_interval, as for
    messages of no age, and a stamp cannot hold a gap open for long."""
    node = node_with(1, gap_max_attempts=1)
    node.handle(received(1, gossip(envelope(PUBLISHER, 0, timestamp_ms=0))), 10_000.0)
    node.handle(received(1, gossip(envelope(PUBLISHER, 2, timestamp_ms=0))), 10_000.0)
    pull = m.Pull(publisher=PUBLISHER, first_seq=1, last_seq=1)
    assert fire(node, "gap", 10_001.0) == [send(1, pull), GAP_TIMER]
    out = fire(node, "gap", 10_001.5)
    assert DataLost(TOPIC, PUBLISHER, 1, 1) in out


def test_gap_without_any_neighbour_to_pull_from_is_given_up():
    node = make_node(config=node_config(broadcast=broadcast_config()))
    node.handle(received(7, gossip(fresh(0))), 1.0)  # a PULL answer or GRAFT from a non-neighbour
    node.handle(received(7, gossip(fresh(2))), 1.0)
    assert fire(node, "gap", 2.0) == [
        DataLost(TOPIC, PUBLISHER, 1, 1),
        deliver(fresh(2), 1),
        GAP_TIMER,
    ]


def test_the_issue_13_sequence_keeps_the_stream_and_pulls_only_valid_ranges():
    """Issue 13, item 1: GOSSIPs of one publisher with seq 0..5, then 10, then 5,000,000.
    The far jump moved next_seq past the held seq 10 (reporting 6..4995903 lost), the gap
    timer built Pull(first_seq=4995904, last_seq=9), and its ValueError, escaping the
    runtime's timer task, ended every node the messages reached. Item 3 is the same
    mistake: a forged far seq silenced every later real message of its publisher."""
    node = node_with(1, 2)
    for seq in range(6):
        node.handle(received(1, gossip(fresh(seq))), 1.0)
    node.handle(received(1, gossip(fresh(10))), 1.0)
    out = node.handle(received(1, gossip(fresh(5_000_000))), 1.0)
    assert deliveries(out) == [] and not [e for e in out if isinstance(e, DataLost)]
    assert fire(node, "gap", 1.5) == [GAP_TIMER]
    pull = m.Pull(publisher=PUBLISHER, first_seq=6, last_seq=9)
    assert fire(node, "gap", 2.0) == [send(1, pull), GAP_TIMER]
    out = node.handle(received(2, gossip(fresh(6))), 2.1)
    for seq in (7, 8, 9):
        out += node.handle(received(2, gossip(fresh(seq))), 2.1)
    assert deliveries(out) == [6, 7, 8, 9, 10]
    # The stream keeps arriving in order: it is delivered, and never resynchronised to
    # the far message held beyond it.
    now, delivered = 2.1, []
    for seq in range(11, 20):
        now += 0.5
        out = fire(node, "gap", now) + node.handle(received(1, gossip(fresh(seq))), now)
        assert not [e for e in out if isinstance(e, DataLost)] and sends(out, m.Pull) == []
        delivered += deliveries(out)
    assert delivered == list(range(11, 20))
    # Once the stream stalls, the far message, which nothing followed, is dropped alone.
    for tick in range(1, 12):
        out = fire(node, "gap", now + 0.5 * tick)
        assert deliveries(out) == [] and not [e for e in out if isinstance(e, DataLost)]
        for pull in sends(out, m.Pull):
            assert 20 <= pull.message.first_seq <= pull.message.last_seq < 5_000_000
    assert node.stats()["held_dropped"] == 1
    assert deliveries(node.handle(received(1, gossip(fresh(20))), now + 6.5)) == [20]


def test_a_gap_before_a_far_stream_that_goes_on_is_given_up_once_delivery_stalls():
    # A node that fell far behind: what lies between is beyond pulling reach, and the
    # stream beyond it goes on (two messages held there), so it resynchronises there.
    node = node_with(1, max_gap=4, gap_max_attempts=1)
    node.handle(received(1, gossip(fresh(0))), 1.0)
    node.handle(received(1, gossip(fresh(10))), 1.0)
    assert deliveries(node.handle(received(1, gossip(fresh(11))), 1.0)) == []
    pull = m.Pull(publisher=PUBLISHER, first_seq=1, last_seq=9)
    assert fire(node, "gap", 2.0) == [send(1, pull), GAP_TIMER]
    assert fire(node, "gap", 2.5) == [
        DataLost(TOPIC, PUBLISHER, 1, 9),
        deliver(fresh(10), 1),
        deliver(fresh(11), 1),
        GAP_TIMER,
    ]


def test_messages_delivered_in_order_restart_the_stall_clock():
    node = node_with(1, gap_max_attempts=1)
    node.handle(received(1, gossip(fresh(0))), 1.0)
    node.handle(received(1, gossip(fresh(3))), 1.0)  # gap: 1..2
    node.handle(received(1, gossip(fresh(1))), 1.75)  # in order: the clock starts again
    assert fire(node, "gap", 2.0) == [GAP_TIMER]
    pull = m.Pull(publisher=PUBLISHER, first_seq=2, last_seq=2)
    assert fire(node, "gap", 2.75) == [send(1, pull), GAP_TIMER]
    assert fire(node, "gap", 3.25) == [
        DataLost(TOPIC, PUBLISHER, 2, 2),
        deliver(fresh(3), 1),
        GAP_TIMER,
    ]


def test_far_messages_filling_held_never_crowd_out_the_stream():
    # A key holder fills `held` with forged far seqs; the real stream, one message
    # overtaking another, still finds room: the farthest held message goes.
    node = node_with(1, max_gap=4, max_held_per_publisher=2)
    node.handle(received(1, gossip(env(0))), 1.0)
    node.handle(received(1, gossip(env(100))), 1.0)
    node.handle(received(1, gossip(env(101))), 1.0)
    assert node.handle(received(1, gossip(env(2))), 1.1) == []
    assert deliveries(node.handle(received(1, gossip(env(1))), 1.2)) == [1, 2]
    assert node.stats()["held_dropped"] == 1
    # A newcomer farther than everything held finds no room.
    node.handle(received(1, gossip(env(150))), 1.3)
    assert node.handle(received(1, gossip(env(200))), 1.3) == []
    assert sorted(broadcast(node).streams[PUBLISHER].held) == [100, 150]
    assert node.stats()["held_dropped"] == 2


def test_a_full_held_table_keeps_its_nearest_messages_whatever_order_newcomers_come_in():
    # The farthest message goes, or the newcomer when it is the farthest, also for a
    # newcomer just beyond the nearest ones once the farthest went.
    node = node_with(1, max_gap=4, max_held_per_publisher=3)
    node.handle(received(1, gossip(env(0))), 1.0)
    for seq in (50, 60, 70):
        node.handle(received(1, gossip(env(seq))), 1.0)
    node.handle(received(1, gossip(env(80))), 1.0)  # beyond: dropped
    node.handle(received(1, gossip(env(5))), 1.0)  # nearer: 70 goes
    node.handle(received(1, gossip(env(65))), 1.0)  # beyond 60, the farthest now: dropped
    node.handle(received(1, gossip(env(55))), 1.0)  # nearer: 60 goes
    assert sorted(broadcast(node).streams[PUBLISHER].held) == [5, 50, 55]
    assert node.stats()["held_dropped"] == 4


def test_a_full_held_table_gives_up_no_gap_while_the_stream_arrives_in_order():
    """The adversarial model (issue 13): node 0 had delivered seqs 0..2 of a live stream
    and held forged places 17, 18 (within reach) and two far ones, its `held` full; a
    forged seq 8 then made it give up 3..7 at once, seqs not even published yet, and the
    honest 3..7 arrived as history. A full `held` is not a stall: the farthest message
    goes, and the stream goes on in order."""
    node = node_with(1, max_held_per_publisher=2)
    node.handle(received(1, gossip(env(0))), 1.0)
    node.handle(received(1, gossip(env(3))), 1.0)
    node.handle(received(1, gossip(env(4))), 1.0)
    assert node.handle(received(1, gossip(env(2))), 1.1) == []  # 4 goes, 2 is held
    assert sorted(broadcast(node).streams[PUBLISHER].held) == [2, 3]
    assert node.stats()["held_dropped"] == 1
    # The dropped seq 4 is still at its place in the store: delivered when the stream
    # gets there, and nothing was lost.
    assert deliveries(node.handle(received(1, gossip(env(1))), 1.2)) == [1, 2, 3, 4]
    assert node.stats()["data_lost"] == 0


def test_a_dropped_message_the_store_let_go_is_taken_again_from_a_later_copy():
    """The store's bounds let a message dropped unheld go before the stream got there: a
    later copy of it (a PULL's answer) is taken though its id is seen; a copy whose
    envelope does not match its id is not, nor is it forwarded either way."""
    # The store keeps one message's bytes beside the pinned (held) ones.
    node = node_with(1, max_held_per_publisher=2, retention=RetentionConfig(max_messages=1))
    node.handle(received(1, gossip(env(0))), 1.0)
    for seq in (2, 3, 4, 5):  # 4 and 5 are dropped unheld
        node.handle(received(1, gossip(env(seq))), 1.0)
    assert sorted(broadcast(node).streams[PUBLISHER].held) == [2, 3]
    assert node.stats()["held_dropped"] == 2
    # 1 takes the store's room: 4 and 5 are no longer held there.
    assert deliveries(node.handle(received(1, gossip(env(1))), 1.2)) == [1, 2, 3]
    forged = m.Gossip(id=mid(env(4)), envelope=env(4, b"forged"), hops=1)
    assert node.handle(received(1, forged), 2.4) == []
    assert node.handle(received(1, gossip(env(4))), 2.5) == [deliver(env(4), 1)]
    assert node.handle(received(1, gossip(env(5))), 2.5) == [deliver(env(5), 1)]
    assert node.stats()["data_lost"] == 0


def test_a_dropped_far_seq_is_pulled_within_reach_but_never_given_up():
    """`held` full, a far seq (a forger's, or the publisher's far ahead) is dropped
    unheld. Once the stream has delivered what it held, the places up to it are pulled
    (a span the wire allows), and, unanswered, forgotten: no DataLost, no jump, and the
    stream goes on in order from where it stands."""
    node = node_with(1, max_held_per_publisher=2, gap_max_attempts=1)
    node.handle(received(1, gossip(fresh(0))), 1.0)
    for seq in (2, 3, 5_000_000):
        node.handle(received(1, gossip(fresh(seq))), 1.0)
    assert node.stats()["held_dropped"] == 1
    assert deliveries(node.handle(received(1, gossip(fresh(1))), 1.1)) == [1, 2, 3]
    pull = m.Pull(publisher=PUBLISHER, first_seq=4, last_seq=4 + m.MAX_PULL_SPAN - 1)
    assert fire(node, "gap", 2.2) == [send(1, pull), GAP_TIMER]
    assert fire(node, "gap", 2.8) == [GAP_TIMER]  # unanswered: forgotten, nothing given up
    assert fire(node, "gap", 3.3) == []
    assert node.stats()["data_lost"] == 0
    assert deliveries(node.handle(received(1, gossip(fresh(4))), 3.0)) == [4]


def test_dropped_places_the_store_let_go_and_nobody_answers_are_reported_lost():
    """The end of a burst: 4 and 5 were dropped unheld and the store's bounds let them go.
    Nothing follows them, yet the stream knows they exist: they are pulled, and once the
    PULLs are spent, reported lost (not left waiting unseen for ever)."""
    node = node_with(
        1, max_held_per_publisher=2, gap_max_attempts=1, retention=RetentionConfig(max_messages=1)
    )
    node.handle(received(1, gossip(fresh(0))), 1.0)
    for seq in (2, 3, 4, 5):
        node.handle(received(1, gossip(fresh(seq))), 1.0)
    assert deliveries(node.handle(received(1, gossip(fresh(1))), 1.1)) == [1, 2, 3]
    pull = m.Pull(publisher=PUBLISHER, first_seq=4, last_seq=5)
    assert fire(node, "gap", 2.2) == [send(1, pull), GAP_TIMER]
    assert fire(node, "gap", 2.8) == [DataLost(TOPIC, PUBLISHER, 4, 5), GAP_TIMER]
    assert deliveries(node.handle(received(1, gossip(fresh(6))), 3.0)) == [6]


def test_a_burst_that_overflowed_held_ends_delivered_from_the_store_without_copies():
    """A loopback burst: a gap opened, `held` (2 here) filled and the stream's last
    messages were dropped unheld; every copy of them had come before the gap filled, so
    none comes again. The store holds them at their places: the stream delivers them from
    there once the gap fills, and no PULL goes out for them."""
    node = node_with(1, 2, max_held_per_publisher=2)
    node.handle(received(1, gossip(fresh(0))), 1.0)
    for seq in range(2, 12):
        node.handle(received(1, gossip(fresh(seq))), 1.0)
    assert node.stats()["held_dropped"] == 8
    out = node.handle(received(2, gossip(fresh(1))), 1.1)
    assert deliveries(out) == list(range(1, 12))
    assert broadcast(node).streams[PUBLISHER].held == {}
    assert sends(fire(node, "gap", 5.0), m.Pull) == []


def test_a_gossip_whose_hops_leave_no_room_to_forward_is_refused_before_it_is_kept():
    """Issue 13, item 2: a GOSSIP with hops = 65,536 was stored in the seen set and the
    cache before anything checked it; forwarding it raised (hops must be in 0..65536),
    and so did every later GRAFT or PULL for that id, which aborted the honest peer that
    asked (a subscriber lost seqs 83..90)."""
    node = node_with(1, 2)
    e = env(0)
    out = node.handle(received(1, gossip(e, hops=m.MAX_HOPS)), 1.0)
    assert out == [PeerMisbehaved(1, f"GOSSIP hops {m.MAX_HOPS} leaves no room to forward")]
    assert node.handle(received(2, m.Graft(ranges=(at(e),))), 1.1) == []
    # Not kept, so a PULL finds it neither in the cache nor in the store: nothing goes out.
    pulled = node.handle(received(2, m.Pull(publisher=PUBLISHER, first_seq=0, last_seq=0)), 1.2)
    assert pulled == []
    # One hop of room: taken, and forwarded at the bound.
    out = node.handle(received(1, gossip(e, hops=m.MAX_HOPS - 1)), 1.3)
    assert send(2, gossip(e, hops=m.MAX_HOPS)) in out
    assert node.handle(received(2, m.Graft(ranges=(at(e),))), 1.4) == [
        send(2, gossip(e, hops=m.MAX_HOPS))
    ]


# -- bounds -------------------------------------------------------------------------------


def test_max_missing_bounds_the_ids_tracked():
    node = node_with(1, 9, max_missing=2)
    make_lazy(node, 1)
    node.handle(received(1, m.IHave(ranges=((PUBLISHER, 1, 3, 1),))), 1.0)
    assert list(broadcast(node).missing) == [(PUBLISHER, 1), (PUBLISHER, 2)]
    assert sends(fire(node, "missing", 1.125)) == [send(1, m.Graft(ranges=((PUBLISHER, 1, 2, 0),)))]


def test_the_graft_queue_stays_within_twice_max_missing_when_announced_ids_keep_arriving():
    # Each announced id queues a GRAFT; one that arrives before it is due leaves a stale row.
    node = node_with(1, 2, max_missing=2)
    make_lazy(node, 2)
    for seq in range(20):
        e = env(seq)
        node.handle(received(2, m.IHave(ranges=(at(e, 1),))), 1.0)
        node.handle(received(1, gossip(e, hops=2)), 1.0)
        assert len(broadcast(node).missing_due) <= 4
    assert broadcast(node).missing == {}
    assert fire(node, "missing", 1.125) == []


def test_max_announcers_bounds_whom_we_graft_from():
    node = node_with(1, 2, 3, 9, max_announcers=2)
    make_lazy(node, 1, 2, 3)
    x = env(1)
    for peer in (1, 2, 3):
        node.handle(received(peer, m.IHave(ranges=(at(x, 1),))), 1.0)
    grafted = [sends(fire(node, "missing", t))[0].peer for t in (1.125, 1.375, 1.625)]
    assert grafted == [1, 2, 1]


def test_the_same_announcer_is_counted_once():
    node = node_with(1, 2, 9)
    make_lazy(node, 1, 2)
    x = env(1)
    for peer in (1, 1, 2):
        node.handle(received(peer, m.IHave(ranges=(at(x, 1),))), 1.0)
    assert broadcast(node).missing[place(x)].announcers == [(1, 1), (2, 1)]


def test_the_store_is_bounded_by_count():
    node = node_with(1, retention=RetentionConfig(max_messages=2))
    ids = [node.handle(Publish(TOPIC, bytes([i])), 1.0)[0].id for i in range(3)]
    out = node.handle(received(1, m.Graft(ranges=((ME, 0, 2, 0),))), 2.0)
    assert [s.message.id for s in out] == ids[1:]
    out = node.handle(received(1, m.Pull(publisher=ME, first_seq=0, last_seq=2)), 2.0)
    # The store let seq 0 go; the others go at one hop (ours).
    assert [(s.message.envelope.seq, s.message.hops) for s in sends(out)] == [(1, 1), (2, 1)]
    assert node.store.lookup(node.store.places(TOPIC))(ME, 0) is None


def test_the_store_is_bounded_by_bytes():
    node = node_with(1, retention=RetentionConfig(max_bytes=5))
    ids = [node.handle(Publish(TOPIC, b"abc"), 1.0)[0].id for _ in range(2)]
    out = node.handle(received(1, m.Graft(ranges=((ME, 0, 1, 0),))), 2.0)
    assert [s.message.id for s in out] == ids[1:]
    assert node.store.bytes == 3


def test_the_store_lets_messages_older_than_max_age_go():
    node = node_with(1, retention=RetentionConfig(max_age=10.0))
    old = node.handle(Publish(TOPIC, b"a"), 0.0)[0].id
    new = node.handle(Publish(TOPIC, b"b"), 10.0)[0].id
    out = node.handle(received(1, m.Graft(ranges=((ME, 0, 1, 0),))), 10.0)
    assert [s.message.id for s in out] == [new]
    assert node.store.cached(old) is None and old in node.store.seen


def test_seen_is_bounded_by_count():
    node = node_with(1, 2, retention=RetentionConfig(seen_max=2))
    for seq in range(3):
        node.handle(received(1, gossip(env(seq))), 1.0)
    # seq 0 was forgotten: it is not a duplicate any more (no PRUNE), but the ordered
    # stream still keeps the application from getting it twice.
    assert node.handle(received(1, gossip(env(0))), 1.0) == [
        Recovered(TOPIC, mid(env(0)), env(0)),
        send(2, gossip(env(0), hops=2)),
    ]


def test_seen_forgets_ids_older_than_seen_ttl():
    node = node_with(1, 2, retention=RetentionConfig(seen_ttl=10.0))
    node.handle(received(1, gossip(env(0))), 0.0)
    node.handle(received(1, gossip(env(1))), 10.0)
    assert node.handle(received(2, gossip(env(0))), 10.0) == [
        Recovered(TOPIC, mid(env(0)), env(0)),
        send(1, gossip(env(0), hops=2)),
    ]


def test_held_messages_are_bounded_per_publisher():
    # Full: a newcomer beyond everything held finds no room; the gap is given up only
    # once delivery stalls, and what was dropped is reported lost with it.
    node = node_with(1, max_held_per_publisher=2, gap_max_attempts=1)
    node.handle(received(1, gossip(fresh(0))), 1.0)
    node.handle(received(1, gossip(fresh(3))), 1.0)
    node.handle(received(1, gossip(fresh(4))), 1.0)
    assert node.handle(received(1, gossip(fresh(5))), 1.0) == []
    assert sorted(broadcast(node).streams[PUBLISHER].held) == [3, 4]
    pull = m.Pull(publisher=PUBLISHER, first_seq=1, last_seq=2)
    assert fire(node, "gap", 2.0) == [send(1, pull), GAP_TIMER]
    assert fire(node, "gap", 2.5) == [
        DataLost(TOPIC, PUBLISHER, 1, 2),
        deliver(fresh(3), 1),
        deliver(fresh(4), 1),
        deliver(fresh(5), 1),  # dropped unheld, taken from the store
        GAP_TIMER,
    ]


def test_messages_dropped_from_a_full_held_come_again_however_many_were_dropped():
    """A burst overflows `held` (2 here) by more than it holds: 5..9 are dropped unheld,
    seen all the same, and the store's bounds (4 messages) let most of them go. Once the
    gap before them fills, their copies (a GRAFT's or PULL's answer) are duplicates whose
    places the stream still wants: each is delivered, in order (before, only the last
    max_held_per_publisher dropped ids were remembered, and a receiver of the loopback
    burst stayed stuck with every later copy a duplicate)."""
    node = node_with(1, 2, max_held_per_publisher=2, retention=RetentionConfig(max_messages=4))
    node.handle(received(1, gossip(fresh(0))), 1.0)
    for seq in range(3, 10):
        node.handle(received(1, gossip(fresh(seq))), 1.0)
    assert sorted(broadcast(node).streams[PUBLISHER].held) == [3, 4]
    assert node.stats()["held_dropped"] == 5
    out = node.handle(received(2, gossip(fresh(1))), 1.1)
    out += node.handle(received(2, gossip(fresh(2))), 1.1)
    assert deliveries(out) == [1, 2, 3, 4]
    out = []
    for seq in range(5, 10):  # copies of what was dropped: duplicates by id
        out += node.handle(received(2, gossip(fresh(seq))), 1.2)
    assert deliveries(out) == [5, 6, 7, 8, 9]
    # A copy of what was delivered is a duplicate and nothing more.
    assert deliveries(node.handle(received(1, gossip(fresh(6))), 1.3)) == []


def test_a_full_publisher_table_forgets_its_least_recently_active_idle_stream():
    node = node_with(1, max_publishers=2)
    node.handle(received(1, gossip(env(0))), 1.0)
    node.handle(received(1, gossip(envelope(7, 0))), 1.0)
    node.handle(received(1, gossip(env(1))), 1.0)  # publisher 9 is now the most recent
    newcomer = envelope(8, 0)
    out = node.handle(received(1, gossip(newcomer)), 1.0)
    assert deliver(newcomer, 1) in out
    assert list(node._topics[TOPIC].broadcast.streams) == [PUBLISHER, 8]
    assert node.stats()["streams_evicted"] == 1


def test_a_full_publisher_table_whose_streams_all_wait_for_gaps_refuses_a_new_publisher():
    node = node_with(1, max_publishers=1, stream_settle=0.0)
    node.handle(received(1, gossip(env(0))), 1.0)
    node.handle(received(1, gossip(env(2))), 1.0)  # held: seq 1 is missing
    other = envelope(8, 0)
    out = node.handle(received(1, gossip(other)), 1.0)
    assert out == [PeerMisbehaved(8, "too many publishers on this topic")]


# -- named streams: a place (publisher, seq) chosen by the caller, published once --------


def test_a_named_stream_publish_reaches_eager_peers_and_our_own_application_in_order():
    node = node_with(1, 2)
    out = node.handle(Publish(TOPIC, b"row", stream=(b"sink/q/0/0", 0)), 2.0)
    e = envelope(b"sink/q/0/0", 0, b"row", timestamp_ms=2000)
    g = m.Gossip(id=mid(e), envelope=e, hops=1)
    assert out == [Deliver(TOPIC, mid(e), e, 0), send(1, g), send(2, g), HEADS_TIMER, IHAVE_TIMER]


def test_a_named_stream_place_taken_already_publishes_nothing():
    node = node_with(1)
    node.handle(Publish(TOPIC, b"first", stream=(b"s", 0)), 1.0)
    out = node.handle(Publish(TOPIC, b"again", stream=(b"s", 0)), 2.0)
    first = envelope(b"s", 0, b"first", timestamp_ms=1000)
    assert out == [AlreadyPublished(TOPIC, b"s", 0, mid(first))]
    assert node.stats()["republished"] == 1


def test_a_named_stream_place_delivered_from_a_peer_is_taken_for_our_publish_too():
    """A retried Spark task on another executor: the first attempt's rows came by gossip."""
    node = node_with(1)
    node.handle(received(1, gossip(env(0))), 1.0)
    out = node.handle(Publish(TOPIC, b"retry", stream=(PUBLISHER, 0)), 2.0)
    assert out == [AlreadyPublished(TOPIC, PUBLISHER, 0, mid(env(0)))]
    out = node.handle(Publish(TOPIC, b"next", stream=(PUBLISHER, 1)), 2.0)
    assert isinstance(out[0], Deliver)


def test_a_named_stream_place_takes_the_given_stamp_so_a_rewrite_is_the_same_message():
    node = node_with(1)
    out = node.handle(Publish(TOPIC, b"row", stream=(b"s", 4), timestamp_ms=1234), 9.0)
    e = envelope(b"s", 4, b"row", timestamp_ms=1234)
    assert out[0] == Deliver(TOPIC, mid(e), e, 0)
    again = node_with(1).handle(Publish(TOPIC, b"row", stream=(b"s", 4), timestamp_ms=1234), 50.0)
    assert again[0] == out[0]
    with pytest.raises(ValueError, match="named stream"):
        Publish(TOPIC, b"row", timestamp_ms=1234)


def test_a_rival_with_a_later_stamp_is_dropped_and_its_sender_gets_the_held_message():
    """A retried sink task that did not know of its first attempt's row: one message per
    place, the earlier one, and the node that sent the later one learns it."""
    node = node_with(1, 2)
    first = envelope(b"s", 0, b"row", timestamp_ms=1000)
    node.handle(received(1, gossip(first)), 1.0)
    rival = envelope(b"s", 0, b"row", timestamp_ms=2000)
    out = node.handle(received(2, gossip(rival)), 2.0)
    assert out == [send(2, m.Gossip(id=mid(first), envelope=first, hops=1))]
    assert node.stats()["rivals_refused"] == 1


def test_a_rival_that_wins_a_held_place_is_the_message_delivered_there():
    """A rival that wins a place whose message waits for a gap is what the application
    gets there, as every node keeps it (not the first-come message that lost)."""
    node = node_with(1, 2)
    node.handle(received(1, gossip(envelope(b"s", 0, b"row", timestamp_ms=1000))), 1.0)
    late = envelope(b"s", 2, b"row", timestamp_ms=3000)
    early = envelope(b"s", 2, b"row", timestamp_ms=2000)
    node.handle(received(1, gossip(late)), 1.0)
    node.handle(received(2, gossip(early)), 1.0)
    assert node.stats()["rivals_won"] == 1
    one = envelope(b"s", 1, b"row", timestamp_ms=1500)
    out = node.handle(received(1, gossip(one)), 1.1)
    assert [e for e in out if isinstance(e, Deliver)] == [
        Deliver(TOPIC, mid(one), one, 1),
        Deliver(TOPIC, mid(early), early, 1),
    ]


def test_a_rival_with_an_earlier_stamp_takes_the_place_everywhere_it_goes_without_redelivery():
    node = node_with(1, 2)
    late = envelope(b"s", 0, b"row", timestamp_ms=2000)
    node.handle(received(1, gossip(late)), 1.0)
    early = envelope(b"s", 0, b"row", timestamp_ms=1000)
    out = node.handle(received(2, gossip(early)), 2.0)
    assert Recovered(TOPIC, mid(early), early) in out  # retention takes it; no Deliver
    assert not [e for e in out if isinstance(e, Deliver)]
    assert send(1, gossip(early, hops=2)) in out  # it goes on
    pull = m.Pull(publisher=b"s", first_seq=0, last_seq=0)
    winner = m.History(publisher=b"s", envelopes=(early.raw,), hops=(2,))  # a PULL's answer
    assert node.handle(received(1, pull), 3.0) == [Send(1, TOPIC, winner, answer=True)]
    assert node.stats()["rivals_won"] == 1


def test_two_nodes_that_got_rivals_in_opposite_orders_end_up_holding_the_same_one():
    a, b = make_node(1, active=[2]), make_node(2, active=[1])
    early = envelope(b"s", 0, b"row", timestamp_ms=1000)
    late = envelope(b"s", 0, b"row", timestamp_ms=2000)
    # At once, from outside: each takes its own first, and forwards it to the other.
    in_flight = [(1, e) for e in a.handle(received(9, gossip(early)), 1.0) if isinstance(e, Send)]
    in_flight += [(2, e) for e in b.handle(received(9, gossip(late)), 1.0) if isinstance(e, Send)]
    nodes = {1: a, 2: b}
    for _ in range(10):  # bounded: what each delivery sends is delivered next
        sent, in_flight = in_flight, []
        for sender, out in sent:
            if out.peer in nodes:
                reply = nodes[out.peer].handle(received(sender, out.message), 1.5)
                in_flight += [(out.peer, e) for e in reply if isinstance(e, Send)]
    assert not in_flight
    for node in (a, b):
        assert node.store.place(node.store.places(TOPIC), b"s", 0) == mid(early)


def test_our_own_stream_cannot_be_named():
    node = node_with(1)
    with pytest.raises(LocalProtocolError):
        node.handle(Publish(TOPIC, b"x", stream=(ME, 0)), 1.0)


def test_a_stream_seen_from_seq_0_needs_no_settle_window():
    node = node_with(1, 2, stream_settle=0.5)
    out = node.handle(received(1, gossip(env(0))), 1.0)
    assert deliver(env(0), 1) in out
    assert ScheduleTimer(0.5, token("settle")) not in out


def test_leaving_and_joining_again_goes_on_with_our_stream_where_it_stopped():
    node = node_with(1)
    node.handle(Publish(TOPIC, b"a"), 1.0)
    node.handle(Publish(TOPIC, b"b"), 1.0)
    node.handle(LeaveTopic(TOPIC), 2.0)
    node.handle(JoinTopic(TOPIC, ()), 3.0)
    out = node.handle(Publish(TOPIC, b"c"), 4.0)
    assert [e.envelope.seq for e in out if isinstance(e, Published)] == [2]


# -- stream settle window: a new subscriber's first copies may arrive out of order -------


def deliveries(out: list) -> list[int]:
    return [e.envelope.seq for e in out if isinstance(e, Deliver)]


def test_a_new_streams_first_message_waits_for_the_settle_window():
    node = node_with(1, 2, stream_settle=0.5)
    out = node.handle(received(1, gossip(env(5))), 1.0)
    assert deliveries(out) == []
    assert ScheduleTimer(0.5, token("settle")) in out
    assert deliveries(fire(node, "settle", 1.5)) == [5]


def test_an_overtaken_earlier_message_inside_the_settle_window_is_delivered_first():
    node = node_with(1, 2, stream_settle=0.5)
    node.handle(received(1, gossip(env(5))), 1.0)
    node.handle(received(2, gossip(env(4))), 1.2)
    assert deliveries(fire(node, "settle", 1.5)) == [4, 5]
    later = node.handle(received(1, gossip(env(6))), 1.6)
    assert deliveries(later) == [6]


def test_a_far_seq_that_opens_a_stream_does_not_hide_the_real_one():
    # A forged far seq reached a new subscriber first: the real seq 0 then counted as
    # history (more than max_gap below it), the stream settled at the forged seq, and
    # every real message after was dropped as history too.
    node = node_with(1, 2, stream_settle=0.5)
    node.handle(received(1, gossip(env(5_000_000))), 1.0)
    node.handle(received(2, gossip(env(0))), 1.1)
    assert deliveries(fire(node, "settle", 1.5)) == [0]
    assert deliveries(node.handle(received(2, gossip(env(1))), 1.6)) == [1]


def test_after_the_settle_window_an_earlier_message_is_not_delivered():
    node = node_with(1, 2, stream_settle=0.5)
    node.handle(received(1, gossip(env(5))), 1.0)
    fire(node, "settle", 1.5)
    assert deliveries(node.handle(received(2, gossip(env(4))), 1.6)) == []


def test_a_gap_inside_the_settle_window_is_repaired_after_it():
    node = node_with(1, 2, stream_settle=0.5)
    node.handle(received(1, gossip(env(3))), 1.0)
    node.handle(received(1, gossip(env(5))), 1.1)
    out = fire(node, "settle", 1.5)
    assert deliveries(out) == [3]
    assert GAP_TIMER in out  # seq 4 is pulled like any gap


def test_a_lazy_peer_made_eager_is_told_at_once_of_ids_queued_for_ihave():
    # The race the simulator found: the message passed while the peer was lazy (so it was
    # not pushed), and the next IHAVE flush goes to lazy peers only.
    node = node_with(1, 2)
    make_lazy(node, 1)
    e = env(0)
    node.handle(received(2, gossip(e, hops=3)), 1.0)  # queued for IHAVE to lazy peer 1
    out = node.handle(received(1, m.Graft()), 1.01)
    assert out == [send(1, m.IHave(ranges=(at(e, 3),)))]
    assert node.eager_peers(TOPIC) == [2, 1]


# -- fetch: history from behind the stream's position ---------------------------------------


def test_fetch_pulls_in_spans_and_an_answer_behind_the_stream_is_recovered_not_forwarded():
    node = node_with(1, 2)
    node.handle(received(1, gossip(env(5))), 1.0)
    fire(node, "settle", 2.0)
    out = node.handle(Fetch(TOPIC, 2, PUBLISHER, 0, m.MAX_PULL_SPAN), 3.0)
    assert out == [
        send(2, m.Pull(publisher=PUBLISHER, first_seq=0, last_seq=m.MAX_PULL_SPAN - 1)),
        send(2, m.Pull(publisher=PUBLISHER, first_seq=m.MAX_PULL_SPAN, last_seq=m.MAX_PULL_SPAN)),
    ]
    out = node.handle(received(2, gossip(env(3))), 3.5)
    assert out == [Recovered(TOPIC, mid(env(3)), env(3))]
    assert node.stats()["recovered"] == 1


def test_a_fetch_answered_while_the_stream_settles_is_recovered_not_lost():
    """A node that fetches history right after joining gets the answers while the live
    stream is still settling; those far below it are history (Recovered), not dropped."""
    node = node_with(1, 2)
    live = episub_config.BroadcastConfig().max_gap + 10
    node.handle(received(1, gossip(env(live))), 1.0)  # settling from here
    node.handle(Fetch(TOPIC, 2, PUBLISHER, 0, 0), 1.1)
    out = node.handle(received(2, gossip(env(0))), 1.2)
    assert out == [Recovered(TOPIC, mid(env(0)), env(0))]
    assert node.stats()["recovered"] == 1
