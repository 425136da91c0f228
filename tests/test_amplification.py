"""Amplification: what one message from a peer makes a node do, for every request kind.

A node is loaded to its configured bounds (its store full of messages of max_message_size
from four publishers, its passive view full), then sent each kind of request at its worst
(the widest span or the most ranges a message may carry). For each, the core's outputs
are measured (tests/core_checks.py `answer_cost`): bytes sent per byte received, messages
sent back to the asker and look-ups made in the core's message store for it, including
what the request's timer does next (an IHAVE or HEADS is GRAFTed graft_timeout later),
and checked against the bounds stated in core_checks.py (`check_answer`). Then the same
request comes 50 times from 50 ids and every table stays within its bound (`check_node`),
with the payload bytes its store holds within its max_bytes (held messages pinned beside).
With -s, the first test prints a row of docs/reliability.md's table per request.

PULL and GRAFT over held ranges are answered a batch at a time (episub/proto/answers.py):
answered whole, a 23-byte PULL would make 2 MB of GOSSIP at once.
"""

from __future__ import annotations

import pytest

from episub.proto import messages as m
from episub.proto.config import MembershipConfig
from episub.proto.events import Received
from episub.proto.node import NodeState
from episub.proto.store import RetentionConfig
from tests.core_checks import AnswerCost, answer_cost, check_answer, check_node
from tests.helpers import (
    TOPIC,
    broadcast,
    broadcast_config,
    envelope,
    fire,
    gossip,
    make_node,
    node_config,
)

ME = b"target"
FEEDER = b"feeder"  # the neighbour the cached messages came from
ASKER = b"asker"  # a neighbour: IHAVE, HEADS and GRAFT count from neighbours only
NEIGHBOURS = (FEEDER, ASKER, b"n3", b"n4")
PASSIVE = tuple(b"passive-%02d" % i for i in range(42))
PUBLISHERS = tuple(b"publisher-%d" % i for i in range(4))
CACHED = 128  # messages per publisher
PAYLOAD = 16_000  # bytes: each message near max_message_size
STRANGER = b"s" * m.MAX_PUBLISHER_NAME  # the longest id: the biggest answers

CONFIG = node_config(
    membership=MembershipConfig(),  # A = 7, passive 42: the draft's
    broadcast=broadcast_config(
        max_message_size=16 * 1024,
        max_missing=256,
        max_publishers=16,
        max_held_per_publisher=16,
    ),
)


STORE = RetentionConfig(
    max_messages=len(PUBLISHERS) * CACHED, max_bytes=len(PUBLISHERS) * CACHED * 16 * 1024
)


def loaded_node() -> NodeState:
    node = make_node(me=ME, active=NEIGHBOURS, passive=PASSIVE, config=CONFIG, retention=STORE)
    for seq in range(CACHED):
        for publisher in PUBLISHERS:
            message = envelope(publisher, seq, bytes([seq % 256]) * PAYLOAD)
            node.handle(Received(FEEDER, TOPIC, gossip(message)), 1.0)
    assert len(node.store) == len(PUBLISHERS) * CACHED
    return node


def request_cost(
    node: NodeState, asker: bytes, topic: str | None, msg: m.PeerMessage
) -> AnswerCost:
    """The request's cost at once, plus what its missing timer sends next."""
    now = 2.0
    work = node.store.work
    outs = node.handle(Received(asker, topic, msg), now)
    if topic is not None:
        outs += fire(node, "missing", now + CONFIG.broadcast.graft_timeout)
    return answer_cost(asker, topic, msg, outs, node.store.work - work)


def far(publisher: bytes, first: int, count: int, hops: int = 0) -> m.StreamRange:
    return (publisher, first, first + count - 1, hops)


UNKNOWN = b"u" * m.MAX_PUBLISHER_NAME
LIARS = tuple(b"%04d" % i + UNKNOWN[4:] for i in range(m.MAX_RANGES_PER_MESSAGE))  # 64 bytes
REQUESTS = [
    pytest.param(
        ASKER, TOPIC, m.Pull(publisher=PUBLISHERS[0], first_seq=0, last_seq=4095),
        id="pull-held-and-beyond",
    ),
    pytest.param(
        ASKER, TOPIC, m.Pull(publisher=UNKNOWN, first_seq=0, last_seq=4095),
        id="pull-of-history",
    ),
    pytest.param(
        ASKER, TOPIC, m.Graft(ranges=tuple(far(p, 0, CACHED) for p in PUBLISHERS)),
        id="graft-held-ranges",
    ),
    pytest.param(
        ASKER, TOPIC, m.Graft(ranges=tuple(far(UNKNOWN, i * 4, 4) for i in range(1024))),
        id="graft-1024-ranges-held-nowhere",
    ),
    pytest.param(
        ASKER, TOPIC, m.IHave(ranges=tuple(far(UNKNOWN, i * 4, 4, 1) for i in range(1024))),
        id="ihave-4096-places",
    ),
    pytest.param(
        ASKER, TOPIC,
        m.Heads(ranges=tuple((liar, m.MAX_SEQ, m.MAX_SEQ, 1) for liar in LIARS)),
        id="heads-1024-lying",
    ),
    pytest.param(
        ASKER, TOPIC, m.Heads(ranges=((PUBLISHERS[0], m.MAX_SEQ, m.MAX_SEQ, 1),)),
        id="heads-far-past-a-stream",
    ),
    pytest.param(
        ASKER, TOPIC,
        m.GetHeld(spans=tuple(m.HeldSpan(publisher=UNKNOWN, first_seq=0, last_seq=m.MAX_SEQ)
                              for _ in range(m.MAX_HELD_SPANS))),
        id="getheld-256-spans",
    ),
    pytest.param(ASKER, TOPIC, m.GetHeld(), id="getheld-everything"),
    pytest.param(STRANGER, TOPIC, m.GetNodes(), id="getnodes"),
    pytest.param(
        STRANGER, TOPIC,
        m.Shuffle(origin=STRANGER, ttl=0, peers=LIARS[: m.MAX_PEERS_PER_MESSAGE]),
        id="shuffle-256-peers",
    ),
    pytest.param(
        ASKER, TOPIC, m.Shuffle(origin=STRANGER, ttl=m.MAX_TTL, peers=(STRANGER,)),
        id="shuffle-walk",
    ),
    pytest.param(STRANGER, TOPIC, m.GetView(), id="getview"),
    pytest.param(ASKER, TOPIC, m.Ping(nonce=1, want_view=True), id="ping-want-view"),
    pytest.param(STRANGER, TOPIC, m.Join(peer=STRANGER, ttl=m.MAX_TTL), id="join"),
    pytest.param(ASKER, TOPIC, m.ForwardJoin(peer=STRANGER, ttl=m.MAX_TTL), id="forwardjoin"),
    pytest.param(ASKER, TOPIC, m.Leave(peer=STRANGER, ttl=m.MAX_TTL), id="leave"),
    pytest.param(
        ASKER, TOPIC, gossip(envelope(STRANGER, 0, b"z" * 16_000), hops=1),
        id="gossip-max-size",
    ),
    pytest.param(STRANGER, None, m.GetTopics(), id="gettopics"),
]  # fmt: skip


@pytest.mark.parametrize(("asker", "topic", "message"), REQUESTS)
def test_one_request_costs_the_node_a_bounded_answer(
    asker: bytes, topic: str | None, message: m.PeerMessage, request: pytest.FixtureRequest
) -> None:
    node = loaded_node()
    cost = request_cost(node, asker, topic, message)
    assert cost.bytes_in is not None and cost.bytes_out is not None
    # docs/reliability.md's table, a row per request: run with -s to see it
    print(f"\n| {request.node.callspec.id} | {cost.bytes_in:,} | {cost.bytes_out:,} "
          f"| {cost.items} | {cost.lookups} |")  # fmt: skip
    check_answer(cost, CONFIG, type(message).__name__)


@pytest.mark.parametrize(("asker", "topic", "message"), REQUESTS)
def test_fifty_requests_leave_the_node_within_its_bounds(
    asker: bytes, topic: str | None, message: m.PeerMessage
) -> None:
    node = loaded_node()
    b = broadcast(node)
    for i in range(50):
        sender = asker if asker in NEIGHBOURS else b"%02d" % i + asker[2:]
        node.handle(Received(sender, topic, message), 2.0 + i * 0.01)
        check_node(node)
    assert node.store.bytes <= STORE.max_bytes
    assert node.store.pinned <= sum(len(stream.held) for stream in b.streams.values())
