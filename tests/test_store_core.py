"""The core's message store (episub/proto/store.py) as NodeState keeps it: what the core
delivers, publishes or recovers enters it in the core itself, but for topics joined with
retain=False; a peer's PULL of what only the store still holds is answered from it."""

from __future__ import annotations

import random

from episub.proto import messages as m
from episub.proto.events import JoinTopic, Publish, Received, Send
from episub.proto.node import NodeState
from episub.proto.store import RetentionConfig
from tests.helpers import (
    TOPIC,
    broadcast,
    broadcast_config,
    envelope,
    gossip,
    make_node,
    node_config,
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


def test_a_topic_joined_without_retain_keeps_nothing_in_the_store() -> None:
    node = NodeState(b"me", node_config(), random.Random(0))
    node.handle(JoinTopic("kept"), 0.0)
    node.handle(JoinTopic("passing", retain=False), 0.0)
    node.handle(Publish("kept", b"1"), 1.0)
    node.handle(Publish("passing", b"2"), 1.0)
    assert node.store.holds("kept") and not node.store.holds("passing")


def test_a_store_with_a_zero_bound_keeps_nothing_and_looks_nothing_up() -> None:
    node = NodeState(
        b"me", node_config(), random.Random(0), retention=RetentionConfig(max_messages=0)
    )
    node.handle(JoinTopic(TOPIC), 0.0)
    node.handle(Publish(TOPIC, b"1"), 1.0)
    assert len(node.store) == 0 and node.store.work == 0


def test_a_pull_for_what_the_cache_let_go_is_answered_from_the_store() -> None:
    config = node_config(broadcast=broadcast_config(cache_max_messages=2))
    node = make_node(b"me", active=[b"a", b"asker"], config=config)
    for seq in range(5):
        node.handle(Received(b"a", TOPIC, gossip(envelope(PUB, seq))), 1.0)
    assert len(broadcast(node).cache) == 2
    out = node.handle(
        Received(b"asker", TOPIC, m.Pull(publisher=PUB, first_seq=0, last_seq=4)), 2.0
    )
    sent = [o.message for o in out if type(o) is Send and o.peer == b"asker"]
    assert [m.Envelope.decode(raw).seq for pack in sent for raw in pack.envelopes] == [
        0,
        1,
        2,
        3,
        4,
    ]  # type: ignore[union-attr]
