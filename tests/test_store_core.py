"""The core's message store (episub/proto/store.py) as NodeState keeps it: what the core
takes in or publishes enters it, for every topic; topics joined with retain=False offer
no history from it; a peer's PULL is answered from it."""

from __future__ import annotations

import pytest

from episub.proto import messages as m
from episub.proto.events import Deliver, JoinTopic, LeaveTopic, Publish, Received, Send
from episub.proto.store import MessageStore, RetentionConfig
from tests.helpers import (
    TOPIC,
    envelope,
    gossip,
    make_node,
    mid,
)

PUB = b"p" * 32


def test_what_the_core_delivers_and_publishes_enters_its_store() -> None:
    node = make_node(b"me", active=[b"a"])
    for seq in range(3):
        node.handle(Received(b"a", TOPIC, gossip(envelope(PUB, seq, b"v%d" % seq))), 1.0)
    node.handle(Publish(TOPIC, b"mine"), 1.5)
    store = node.store
    assert [raw for _, raw in store.entries(TOPIC, PUB, 0, 9, 2.0)] == [
        envelope(PUB, seq, b"v%d" % seq).raw for seq in range(3)
    ]
    assert [m.Envelope.decode(raw).payload for raw in store.get(TOPIC, node.me, 0, 0, 2.0)] == [
        b"mine"
    ]


def test_a_topic_joined_without_retain_offers_no_history_but_answers_pulls() -> None:
    node = make_node(b"me", active=[b"asker"])
    node.handle(JoinTopic("passing", retain=False), 0.0)
    node.handle(Publish(TOPIC, b"1"), 1.0)
    node.handle(Publish("passing", b"2"), 1.0)
    store = node.store
    assert store.holds(TOPIC) and not store.holds("passing")
    assert store.offsets("passing", 1.0) == {} and store.get("passing", b"me", 0, 9, 1.0) == []
    out = node.handle(Received(b"asker", "passing", m.GetHeld(nonce=7)), 1.0)
    assert [o.message for o in out if type(o) is Send] == [m.Held(nonce=7, spans=(), more=False)]
    # Its message still answers a GRAFT or PULL: gap repair is not history.
    held = store.lookup(store.places("passing"))(b"me", 0)
    assert held is not None and m.Envelope.decode(held.raw).payload == b"2"


def test_a_bound_of_zero_is_refused_with_the_bound_named() -> None:
    for name in ("max_messages", "max_bytes", "seen_max", "max_age", "seen_ttl"):
        with pytest.raises(ValueError, match=name):
            RetentionConfig(**{name: 0})


def test_a_pull_past_the_store_s_bounds_gets_what_it_still_holds() -> None:
    node = make_node(b"me", active=[b"a", b"asker"], retention=RetentionConfig(max_messages=2))
    for seq in range(5):
        node.handle(Received(b"a", TOPIC, gossip(envelope(PUB, seq))), 1.0)
    assert len(node.store) == 2
    out = node.handle(
        Received(b"asker", TOPIC, m.Pull(publisher=PUB, first_seq=0, last_seq=4)), 2.0
    )
    sent = [o.message for o in out if type(o) is Send and o.peer == b"asker"]
    assert [m.Envelope.decode(raw).seq for pack in sent for raw in pack.envelopes] == [3, 4]  # type: ignore[union-attr]


def test_a_message_held_for_a_gap_keeps_its_bytes_past_the_store_s_bounds() -> None:
    """Ordering holds a message back by its store row, pinned: however many messages pass
    through a store bounded to two meanwhile, it is delivered when the gap fills, and
    then leaves the store as the bounds say."""
    node = make_node(b"me", active=[b"a"], retention=RetentionConfig(max_messages=2))
    big = envelope(PUB, 2, b"x" * 1000)
    node.handle(Received(b"a", TOPIC, gossip(envelope(PUB, 0))), 1.0)
    assert not [
        e for e in node.handle(Received(b"a", TOPIC, gossip(big)), 1.0) if type(e) is Deliver
    ]
    other = b"o" * 32
    for seq in range(5):
        node.handle(Received(b"a", TOPIC, gossip(envelope(other, seq))), 1.1)
    assert node.store.pinned == 1 and len(node.store) == 2
    out = node.handle(Received(b"a", TOPIC, gossip(envelope(PUB, 1))), 1.2)
    delivered = [e.envelope for e in out if type(e) is Deliver]
    assert [(e.seq, e.payload) for e in delivered] == [(1, b"x"), (2, b"x" * 1000)]
    assert delivered[1].raw == big.raw
    assert node.store.pinned == 0 and node.store.cached(mid(big)) is None
    assert len(node.store) <= 2


def test_leaving_a_topic_lets_go_of_what_its_streams_held_back() -> None:
    node = make_node(b"me", active=[b"a"])
    node.handle(Received(b"a", TOPIC, gossip(envelope(PUB, 0))), 1.0)
    node.handle(Received(b"a", TOPIC, gossip(envelope(PUB, 3))), 1.0)
    assert node.store.pinned == 1
    node.handle(LeaveTopic(TOPIC), 2.0)
    assert node.store.pinned == 0


def test_a_topic_that_offers_history_again_pages_its_publishers_in_order() -> None:
    """Without history a topic keeps no ordered list of publishers (a configuration
    topic's every write is a stream); offered again, its page is in order at once."""
    store = MessageStore(RetentionConfig())
    store.offer_history(TOPIC, False)
    places = store.places(TOPIC)
    for n, publisher in enumerate((b"c", b"a", b"b")):
        store.add(places, bytes([n]) * 32, envelope(publisher, 0), 1, 0.0)
    assert places.publishers == [] and store.page(TOPIC, b"", 10, 0.0) == ([], False)
    store.offer_history(TOPIC, True)
    found, more = store.page(TOPIC, b"", 10, 0.0)
    assert [p for p, _ in found] == [b"a", b"b", b"c"] and not more
