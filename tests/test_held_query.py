"""GETHELD/HELD: what a node's retention holds of a topic, for readers that come back.

The core only routes them: a GETHELD comes out as HeldAsked (retention lives above the
core, in episub/node/serving.py), the answer goes back as AnswerHeld, and a HELD comes out as a
HeldReport. None of it changes the core's state, joined or not.
"""

from __future__ import annotations

import pytest

from episub.proto import messages as m
from episub.proto.errors import LocalProtocolError
from episub.proto.events import AnswerHeld, AskHeld, HeldAsked, HeldReport, Send
from tests.helpers import TOPIC, make_node, received

SPAN = m.HeldSpan(publisher=b"p", first_seq=0, last_seq=9)


def test_getheld_goes_above_the_core_joined_or_not_and_changes_nothing():
    node = make_node(active=[b"a"])
    query = m.GetHeld(nonce=7, spans=(SPAN,), since_ms=5)
    before = node.stats()
    assert node.handle(received(b"asker", query), 1.0) == [HeldAsked(TOPIC, b"asker", query)]
    assert node.handle(received(b"asker", query, topic="gone"), 1.0) == [
        HeldAsked("gone", b"asker", query)
    ]
    assert node.stats() == before and node.active_view(TOPIC) == {b"a": m.LinkKind.RAND}


def test_the_answer_goes_back_as_held_and_an_answer_comes_out_as_a_report():
    node = make_node()
    held = m.Held(nonce=7, spans=(m.HeldSpan(publisher=b"p", first_seq=2, last_seq=9, count=8),))
    assert node.handle(AnswerHeld(TOPIC, b"asker", held), 1.0) == [Send(b"asker", TOPIC, held)]
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
