"""Every dispatch on a message union is exhaustive: each kind of message a peer may send
reaches a case written for it, and a kind without one fails loudly (`assert_never`)
instead of being dropped in silence.

The unions are written once (messages.py); the tuples that dispatch on them are derived.
The examples are the wire tests' (one or more of every kind, checked to cover the union
there), fed to a node's core as a peer's input in each situation that dispatches
differently: joined to the topic, not joined, and without a topic.
"""

from __future__ import annotations

from typing import get_args

import pytest

from episub.proto import messages as m
from episub.proto.events import OutEvent, Received
from tests.helpers import TOPIC, broadcast, make_node, membership
from tests.test_wire import NODE_EXAMPLES, TOPIC_EXAMPLES

PEER = 1
EXAMPLES = TOPIC_EXAMPLES + NODE_EXAMPLES


def test_the_dispatch_tuples_are_the_unions() -> None:
    assert get_args(m.MembershipMessage) == m.MEMBERSHIP_MESSAGES
    assert get_args(m.BroadcastMessage) == m.BROADCAST_MESSAGES
    assert set(m.TOPIC_MESSAGES) == {*m.MEMBERSHIP_MESSAGES, *m.BROADCAST_MESSAGES}
    assert not set(m.MEMBERSHIP_MESSAGES) & set(m.BROADCAST_MESSAGES)
    views_and_holdings = {*get_args(m.ViewMessage), *get_args(m.HeldMessage)}
    assert set(m.PEER_MESSAGES) == {*m.TOPIC_MESSAGES, *m.NODE_MESSAGES, *views_and_holdings}


@pytest.mark.parametrize("message", EXAMPLES, ids=repr)
@pytest.mark.parametrize("topic", [TOPIC, "not-joined", None])
def test_every_kind_reaches_a_case_joined_or_not_with_a_topic_or_without(
    message: m.PeerMessage, topic: str | None
) -> None:
    node = make_node(active=[2, 3])
    out = node.handle(Received(PEER, topic, message), 0.0)  # an assert_never would raise here
    # Whatever the case did, it answered with the core's own outputs and nothing else.
    assert all(isinstance(o, get_args(OutEvent)) for o in out), out


def test_a_kind_the_broadcast_has_no_case_for_fails_loudly() -> None:
    node = make_node(active=[2])
    with pytest.raises(AssertionError):
        broadcast(node).on_message(PEER, m.Ping(nonce=1), 0.0, [])  # type: ignore[arg-type]


def test_a_kind_the_membership_has_no_case_for_fails_loudly() -> None:
    node = make_node(active=[2])
    with pytest.raises(AssertionError):
        membership(node).on_message(PEER, m.Prune(), 0.0, [])  # type: ignore[arg-type]


def test_a_kind_no_part_of_a_topic_takes_fails_loudly() -> None:
    node = make_node(active=[2])
    with pytest.raises(AssertionError):
        node._topics[TOPIC].on_message(PEER, m.GetView(), 0.0, [])  # type: ignore[arg-type]
