"""The sink's wait for acknowledgements (spark_connector/sink.py `await_acks`), against an
agent that answers Holdings from a script: it asks again until a neighbour holds every
row, and its timeout says what each neighbour answered."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("pyspark", reason="the Spark connector needs the spark extra")

from episub.agent.client import NodeHoldings
from episub.proto.messages import HeldSpan
from spark_connector.sink import SinkAckTimeout, await_acks

STREAM = b"_episub/sink/q"
ASKED = HeldSpan(publisher=STREAM, first_seq=0, last_seq=1)
HELD = HeldSpan(publisher=STREAM, first_seq=0, last_seq=1, count=2)


class Agent:
    """Answers Holdings with this node first, then its neighbours: `b` answers holding
    nothing until the `held_from`-th ask, `c` never answers."""

    def __init__(self, held_from: int) -> None:
        self.held_from = held_from
        self.asks = 0

    def holdings(self, topic: str, **asked: object) -> list[NodeHoldings]:
        self.asks += 1
        spans = [HELD] if self.asks >= self.held_from else []
        return [
            NodeHoldings(b"a", "10.0.0.1:7000", answered=True, spans=[HELD]),
            NodeHoldings(b"b", "10.0.0.2:7000", answered=True, spans=spans),
            NodeHoldings(b"c", "10.0.0.3:7000", answered=False, spans=[]),
        ]


def test_the_wait_asks_again_until_a_neighbour_holds_every_row() -> None:
    agent = Agent(held_from=3)
    await_acks(agent, "t", ASKED, "1", timeout=30.0)
    assert agent.asks == 3


def test_acks_all_waits_for_the_neighbour_that_does_not_answer() -> None:
    with pytest.raises(SinkAckTimeout, match=re.escape("10.0.0.3:7000: no answer")):
        await_acks(Agent(held_from=1), "t", ASKED, "all", timeout=0.0)


def test_an_ack_timeout_says_what_each_neighbour_answered() -> None:
    with pytest.raises(SinkAckTimeout) as raised:
        await_acks(Agent(held_from=99), "t", ASKED, "1", timeout=0.0)
    assert str(raised.value).endswith(
        "(acks=1; its 2 neighbour(s): 10.0.0.2:7000: holds 0 of them, 10.0.0.3:7000: no answer)"
    )
