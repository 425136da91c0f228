"""GETVIEW/VIEW: a node tells whoever asks its active view of a topic (for operators).

The core answers from its views alone, bounded to one message; an answer comes out as a
ViewReport; asking is a command (AskView) that sends GETVIEW to any peer.
"""

from __future__ import annotations

import pytest

from episub.proto import messages as m
from episub.proto.errors import LocalProtocolError
from episub.proto.events import AskView, Send, ViewReport
from episub.proto.messages import LinkKind
from tests.helpers import TOPIC, make_node, received

NEAR, RAND = LinkKind.NEAR, LinkKind.RAND


def test_a_node_answers_getview_with_its_active_view_kinds_roles_and_rtts():
    node = make_node(active={b"a": NEAR, b"b": RAND}, passive=[b"p"], rtts={b"a": 0.004})
    out = node.handle(received(b"asker", m.GetView()), 1.0)
    assert out == [
        Send(
            b"asker",
            TOPIC,
            m.View(
                entries=(
                    m.ViewEntry(peer=b"a", kind=NEAR, eager=True, rtt=0.004),
                    m.ViewEntry(peer=b"b", kind=RAND, eager=True, rtt=None),
                ),
                passive_count=1,
            ),
        )
    ]
    assert node.active_view(TOPIC) == {b"a": NEAR, b"b": RAND}  # asking changed nothing


def test_a_node_not_in_the_topic_answers_an_empty_view():
    node = make_node()
    out = node.handle(received(b"asker", m.GetView(), topic="other"), 1.0)
    assert out == [Send(b"asker", "other", m.View(entries=()))]


def test_askview_sends_getview_and_the_answer_comes_out_as_a_view_report():
    node = make_node()
    assert node.handle(AskView(TOPIC, b"far"), 0.0) == [Send(b"far", TOPIC, m.GetView())]
    view = m.View(entries=(m.ViewEntry(peer=b"x", kind=RAND, eager=False),))
    assert node.handle(received(b"far", view), 0.1) == [ViewReport(TOPIC, b"far", view)]


def test_askview_with_a_bad_topic_is_the_callers_error():
    with pytest.raises(LocalProtocolError):
        make_node().handle(AskView("", b"far"), 0.0)


def test_a_view_is_bounded_to_one_message():
    with pytest.raises(ValueError, match="at most"):
        m.View(entries=(m.ViewEntry(peer=b"x", kind=RAND, eager=False),) * 257)
    with pytest.raises(ValueError, match="rtt"):
        m.ViewEntry(peer=b"x", kind=RAND, eager=False, rtt=float("nan"))
