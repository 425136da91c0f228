"""HISTORY, a PULL answered in bulk (episub/proto/history.py): the holder packs what it
holds of a pulled range into a few HISTORY messages, bounded in count and bytes; the
fetching node checks every envelope (its id computed from its bytes, one publisher, rising
seqs) and keeps a fetched one as history: Recovered, never delivered nor forwarded."""

from __future__ import annotations

from episub.proto import messages as m
from episub.proto.events import Fetch, PeerMisbehaved, Recovered, Send
from episub.proto.history import HISTORY_BYTES, history_packs
from episub.proto.node import NodeState
from tests.helpers import TOPIC, envelope, make_node, mid, received

PUB = b"\x12\x20" + bytes(range(32))  # a wire publisher: HISTORY names bytes publishers


def env(seq: int, payload: bytes = b"x") -> m.Envelope:
    return envelope(PUB, seq, payload)


def history(*envelopes: m.Envelope, hops: int = 1) -> m.History:
    return m.History(
        publisher=PUB, envelopes=tuple(e.raw for e in envelopes), hops=(hops,) * len(envelopes)
    )


def fetching_node() -> NodeState:
    """A node with neighbours 1 and 2 that fetched seqs 0..99 of PUB from 2."""
    node = make_node(active=[1, 2])
    node.handle(Fetch(TOPIC, 2, PUB, 0, 99), 1.0)
    return node


def test_packs_stay_within_their_count_and_bytes_and_keep_the_order() -> None:
    small = [(env(i).raw, 1) for i in range(2 * m.MAX_HISTORY_MESSAGES + 1)]
    packs = history_packs(PUB, small, 1 << 20)
    assert [len(p.envelopes) for p in packs] == [m.MAX_HISTORY_MESSAGES] * 2 + [1]
    assert [raw for p in packs for raw in p.envelopes] == [raw for raw, _ in small]
    big = [(env(i, b"y" * 30_000).raw, 1) for i in range(5)]
    sizes = [sum(map(len, p.envelopes)) for p in history_packs(PUB, big, 1 << 20)]
    assert len(sizes) == 3 and all(size <= HISTORY_BYTES for size in sizes)
    # A message bigger than the budget still goes, alone.
    assert [len(p.envelopes) for p in history_packs(PUB, big, 10_000)] == [1] * 5


def test_a_fetched_history_is_recovered_not_delivered_nor_forwarded() -> None:
    node = fetching_node()
    out = node.handle(received(2, history(env(0), env(1), env(2))), 2.0)
    assert out == [Recovered(TOPIC, mid(env(i)), env(i)) for i in range(3)]
    assert node.stats()["recovered"] == 3


def test_a_fetched_history_is_held_in_the_store_but_not_seen() -> None:
    """History we fetched is Recovered (neither delivered nor forwarded) and held in the
    store, but not seen: a copy fetched twice is Recovered twice and held once, and a PULL
    of it is answered from the store one hop further."""
    node = fetching_node()
    node.handle(received(2, history(env(0), env(1), env(2))), 2.0)
    again = node.handle(received(2, history(env(0), env(1))), 2.1)
    assert again == [Recovered(TOPIC, mid(env(i)), env(i)) for i in range(2)]
    assert len(node.store) == 3 and node.store.replaced == 0 and not node.store.seen
    out = node.handle(received(1, m.Pull(publisher=PUB, first_seq=0, last_seq=2)), 3.0)
    assert [o.message for o in out if isinstance(o, Send)] == [
        history(env(0), env(1), env(2), hops=2)
    ]


def test_a_live_copy_of_fetched_history_is_still_a_first_copy() -> None:
    """A node that fetched history and then gets a live copy of it (it spreads still)
    takes it as a first copy, not as a duplicate of what it fetched (which would prune the
    sender); the store keeps one message at the place, now seen."""
    node = fetching_node()
    node.handle(received(2, history(env(0))), 2.0)
    out = node.handle(received(2, m.Gossip(id=mid(env(0)), envelope=env(0), hops=3)), 2.1)
    assert out == [Recovered(TOPIC, mid(env(0)), env(0))]
    assert node.stats()["duplicates_received"] == 0
    assert mid(env(0)) in node.store.seen and len(node.store) == 1
    assert node.store.replaced == 0


def test_a_history_not_fetched_goes_the_gossip_way() -> None:
    node = fetching_node()
    out = node.handle(received(2, history(env(500))), 2.0)  # not in the fetched span: live
    assert not [o for o in out if isinstance(o, Recovered)]
    assert any(isinstance(o, Send) and type(o.message) is m.Gossip for o in out)  # forwarded


def test_a_bad_pack_is_misbehaviour_and_ends_there() -> None:
    node = fetching_node()
    other = envelope(b"someone-else", 3)
    for bad in (
        history(env(1), other),  # another publisher
        history(env(5), env(4)),  # seqs not rising
        m.History(publisher=PUB, envelopes=(env(6).raw, b"\xff\xff"), hops=(1, 1)),
    ):
        out = node.handle(received(2, bad), 2.0)
        assert any(isinstance(o, PeerMisbehaved) for o in out), out
    # What came before the bad envelope was kept; nothing after it.
    assert node.stats()["recovered"] == 3  # seqs 1, 5 and 6


def test_a_pull_is_answered_in_packs_from_the_store_one_hop_further() -> None:
    holder = make_node(active=[1, 2])
    for seq in range(3):
        holder.handle(received(1, m.Gossip(id=mid(env(seq)), envelope=env(seq), hops=1)), 1.0)
    out = holder.handle(received(2, m.Pull(publisher=PUB, first_seq=0, last_seq=2)), 2.0)
    answers = [o.message for o in out if isinstance(o, Send) and o.peer == 2]
    assert answers == [history(env(0), env(1), env(2), hops=2)]
    for seq in (7, 8):  # published by the node itself: held at hop 0
        holder.store.add(holder.store.places(TOPIC), mid(env(seq)), env(seq), 0, 2.5)
    out = holder.handle(received(2, m.Pull(publisher=PUB, first_seq=7, last_seq=8)), 3.0)
    assert [o.message for o in out if isinstance(o, Send)] == [history(env(7), env(8))]
