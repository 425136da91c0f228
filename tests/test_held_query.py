"""GETHELD/HELD: what a node's store holds of a topic, for readers that come back.

The core answers a GETHELD itself, from its message store (store.py), joined or not, with
one page (a HELD) and tells the node that the peer asked (HeldQueried: a neighbour's ask
may start a catch-up); a HELD comes out as a HeldReport. Neither changes the core's
protocol state.
"""

from __future__ import annotations

import pytest

from episub.proto import messages as m
from episub.proto.errors import LocalProtocolError
from episub.proto.events import AskHeld, HeldQueried, HeldReport, Received, Send
from tests.helpers import TOPIC, envelope, gossip, make_node, received

SPAN = m.HeldSpan(publisher=b"p", first_seq=0, last_seq=9)


def test_getheld_is_answered_from_the_store_joined_or_not_and_changes_nothing():
    node = make_node(active=[b"a"])
    for seq in range(3):
        node.handle(Received(b"a", TOPIC, gossip(envelope(b"p", seq, b"x"))), 0.5)
    query = m.GetHeld(nonce=7, spans=(SPAN,))
    before = node.stats()
    held = m.Held(nonce=7, spans=(m.HeldSpan(publisher=b"p", first_seq=0, last_seq=2, count=3),))
    assert node.handle(received(b"asker", query), 1.0) == [
        Send(b"asker", TOPIC, held),
        HeldQueried(TOPIC, b"asker"),
    ]
    # Another topic holds nothing here: an empty page, joined or not.
    assert node.handle(received(b"asker", query, topic="gone"), 1.0) == [
        Send(b"asker", "gone", m.Held(nonce=7)),
        HeldQueried("gone", b"asker"),
    ]
    assert node.stats() == before and node.active_view(TOPIC) == {b"a": m.LinkKind.RAND}


def test_the_answer_is_sent_as_an_answer_and_a_held_comes_out_as_a_report():
    node = make_node()
    (send, _) = node.handle(received(b"asker", m.GetHeld(nonce=3)), 1.0)
    assert type(send) is Send and send.answer  # sent as the asker reads, like PULL answers
    held = m.Held(nonce=7, spans=(m.HeldSpan(publisher=b"p", first_seq=2, last_seq=9, count=8),))
    assert node.handle(received(b"far", held), 1.0) == [HeldReport(TOPIC, b"far", held)]
    query = m.GetHeld(nonce=8)
    assert node.handle(AskHeld(TOPIC, b"far", query), 1.0) == [Send(b"far", TOPIC, query)]
    with pytest.raises(LocalProtocolError):
        node.handle(AskHeld("", b"far", query), 1.0)


def test_spans_are_bounded_and_consistent():
    with pytest.raises(ValueError, match="at most 256 spans"):
        m.Held(spans=(SPAN,) * 257)
    with pytest.raises(ValueError, match="count 11"):
        m.HeldSpan(publisher=b"p", first_seq=0, last_seq=9, count=11)
    with pytest.raises(ValueError, match="after is at most 64"):
        m.GetHeld(after=b"x" * 65)
    with pytest.raises(ValueError, match="nonce"):
        m.GetHeld(nonce=1 << 64)
