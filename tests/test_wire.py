"""The wire codec: every message survives a round trip, and every bad input is a FrameError."""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from episub.proto import episub_pb2 as pb
from episub.proto.envelope import Signature, message_id
from episub.proto.messages import (
    MAX_HEADERS,
    MAX_HELD_SPANS,
    MAX_HISTORY_MESSAGES,
    MAX_HOPS,
    MAX_PEERS_PER_MESSAGE,
    MAX_STREAMS_PER_MESSAGE,
    MAX_TTL,
    MESSAGE_ID_SIZE,
    Disconnect,
    Envelope,
    ForwardJoin,
    GetHeld,
    GetNodes,
    GetTopics,
    GetView,
    Gossip,
    Graft,
    Heads,
    Held,
    HeldSpan,
    History,
    IHave,
    Join,
    Leave,
    LinkKind,
    Neighbor,
    NeighborOp,
    Nodes,
    PeerMessage,
    Ping,
    Pong,
    Prune,
    Pull,
    Shuffle,
    ShuffleReply,
    Topics,
    View,
    ViewEntry,
)
from episub.proto.wire import (
    MAX_ITEMS_PER_FRAME,
    MAX_PEER_ID_SIZE,
    MAX_TOPIC_NAME,
    FrameDecoder,
    FrameError,
    encode_frame,
    encode_item,
    frame_from_items,
)

MAX_FRAME = 1 << 20
# A libp2p-style peer id: sha2-256 multihash (0x12, 0x20, digest).
ALICE = b"\x12\x20" + bytes(range(32))
BOB = b"\x12\x20" + bytes(range(100, 132))
CAROL = b"\x12\x20" + b"\xc0" * 32
ID1 = bytes.fromhex("af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262")
ID2 = bytes(range(32))

ENVELOPE = Envelope(
    publisher=ALICE,
    seq=41,
    timestamp_ms=1_732_240_000_123,
    payload=b'{"temperature": 21.5}',
    key=b"sensor-7",
    headers=(("content-type", b"application/json"), ("trace", b"\x00\x01\xff")),
)

TOPIC_EXAMPLES: list[PeerMessage] = [
    GetNodes(),
    Nodes(peers=(ALICE, BOB, CAROL)),
    Join(peer=ALICE, ttl=6),
    ForwardJoin(peer=BOB, ttl=3),
    Neighbor(op=NeighborOp.REQUEST, kind=LinkKind.NEAR, high_priority=True, rtt=0.0125),
    Neighbor(op=NeighborOp.ACCEPT, kind=LinkKind.RAND, active_count=5, rand_count=3),
    Disconnect(alive=False),
    Disconnect(alive=True),
    Leave(peer=CAROL, ttl=MAX_TTL),
    Shuffle(origin=ALICE, ttl=5, peers=(BOB, CAROL)),
    Shuffle(origin=ALICE, ttl=5, peers=(BOB,), nonce=(1 << 64) - 1),
    ShuffleReply(peers=(CAROL,)),
    ShuffleReply(peers=(CAROL,), nonce=7),
    ShuffleReply(peers=()),
    Ping(nonce=(1 << 64) - 1, want_view=True),
    Pong(nonce=7, subscribed=False, active_count=7, rand_count=4, active=(ALICE, BOB)),
    Gossip(id=ID1, envelope=ENVELOPE, hops=3),
    Gossip(id=ID2, envelope=Envelope(publisher=BOB, seq=0, timestamp_ms=0, payload=b""), hops=1),
    IHave(ranges=((ALICE, 0, 9, 2), (BOB, (1 << 63) - 4086, (1 << 63) - 1, MAX_HOPS))),
    Prune(),
    Prune(streams=(ALICE, BOB)),
    Graft(ranges=((ALICE, 3, 3, 0), (BOB, 7, 9, 0))),
    Graft(),
    Graft(streams=(CAROL,)),
    Graft(ranges=((ALICE, 3, 3, 0),), streams=(BOB,)),
    Pull(publisher=ALICE, first_seq=100, last_seq=163),
    History(publisher=ALICE, envelopes=(ENVELOPE.raw,), hops=(1,)),
    History(publisher=ALICE, envelopes=(ENVELOPE.raw, ENVELOPE.raw), hops=(2, MAX_HOPS)),
    Heads(ranges=((ALICE, 9, 9, 2), (BOB, (1 << 63) - 1, (1 << 63) - 1, MAX_HOPS))),
    GetView(),
    View(
        entries=(
            ViewEntry(peer=ALICE, kind=LinkKind.NEAR, eager=True, rtt=0.0031),
            ViewEntry(peer=BOB, kind=LinkKind.RAND, eager=False),
        ),
        passive_count=42,
    ),
    View(entries=()),
    GetHeld(),
    GetHeld(
        nonce=(1 << 64) - 1,
        spans=(HeldSpan(publisher=b"sink/q/0/3", first_seq=10, last_seq=19),),
        since_ms=1_732_240_000_000,
    ),
    GetHeld(nonce=3, after=ALICE),
    Held(nonce=3),
    Held(
        nonce=4,
        spans=(
            HeldSpan(publisher=ALICE, first_seq=0, last_seq=(1 << 63) - 1, count=5, since_seq=2),
            HeldSpan(publisher=BOB, first_seq=7, last_seq=9, count=3, since_seq=10),
        ),
        more=True,
    ),
]
NODE_EXAMPLES: list[PeerMessage] = [
    GetTopics(),
    Topics(topics=("sensors", "config/живой", "x" * 256)),
]


def decode_all(data: bytes, **limits: int) -> list[list[tuple[str | None, PeerMessage]]]:
    decoder = FrameDecoder(max_frame_size=limits.pop("max_frame_size", MAX_FRAME), **limits)
    decoder.feed(data)
    frames = []
    while (frame := decoder.next_frame()) is not None:
        frames.append(frame)
    assert decoder.buffered == 0
    return frames


def raw_frame(frame: pb.Frame) -> bytes:
    """Length-prefix a hand-built protobuf frame, to send what encode_frame would refuse."""
    body = frame.SerializeToString()
    return struct.pack(">I", len(body)) + body


def raw_item(**fields: object) -> bytes:
    return raw_frame(pb.Frame(items=[pb.Item(**fields)]))


def assert_refused(data: bytes, match: str, **limits: int) -> None:
    with pytest.raises(FrameError, match=match):
        decode_all(data, **limits)


# -- round trips ------------------------------------------------------------------------


def test_examples_cover_every_message_type() -> None:
    assert {type(m) for m in TOPIC_EXAMPLES + NODE_EXAMPLES} == set(PeerMessage.__args__)


@pytest.mark.parametrize("message", TOPIC_EXAMPLES, ids=repr)
def test_every_topic_message_round_trips(message: PeerMessage) -> None:
    assert decode_all(encode_frame([("sensors", message)])) == [[("sensors", message)]]


@pytest.mark.parametrize("message", NODE_EXAMPLES, ids=repr)
def test_every_node_level_message_round_trips_without_topic(message: PeerMessage) -> None:
    assert decode_all(encode_frame([(None, message)])) == [[(None, message)]]


def test_gossip_keeps_a_missing_key_apart_from_an_empty_one() -> None:
    for key in (None, b""):
        envelope = Envelope(publisher=ALICE, seq=1, timestamp_ms=2, payload=b"p", key=key)
        gossip = Gossip(id=ID1, envelope=envelope, hops=1)
        [[(_, decoded)]] = decode_all(encode_frame([("t", gossip)]))
        assert isinstance(decoded, Gossip)
        assert decoded.envelope.key == key


def test_neighbor_rtt_round_trips_as_none_or_exact_float() -> None:
    for rtt in (None, 0.0, 0.000_123_456_789, 3599.999):
        message = Neighbor(op=NeighborOp.REQUEST, kind=LinkKind.NEAR, rtt=rtt)
        [[(_, decoded)]] = decode_all(encode_frame([("t", message)]))
        assert isinstance(decoded, Neighbor)
        assert decoded.rtt == rtt
        assert decoded == message


def test_decoded_enums_are_the_messages_enums() -> None:
    message = Neighbor(op=NeighborOp.ACCEPT, kind=LinkKind.NEAR)
    [[(_, decoded)]] = decode_all(encode_frame([("t", message)]))
    assert isinstance(decoded, Neighbor)
    assert type(decoded.op) is NeighborOp and type(decoded.kind) is LinkKind


def test_schema_enums_match_the_message_enums() -> None:
    assert dict(pb.Neighbor.NeighborOp.items()) == {e.name: e.value for e in NeighborOp}
    assert dict(pb.Neighbor.LinkKind.items()) == {e.name: e.value for e in LinkKind}


def test_one_frame_carries_several_topics_and_a_node_level_message() -> None:
    items: list[tuple[str | None, PeerMessage]] = [
        ("sensors", Gossip(id=ID1, envelope=ENVELOPE, hops=2)),
        ("config", IHave(ranges=((BOB, 4, 4, 4),))),
        (None, Topics(topics=("sensors", "config"))),
        ("sensors", Prune()),
        (None, GetTopics()),
    ]
    assert decode_all(encode_frame(items)) == [items]


def test_feeding_one_byte_at_a_time_gives_the_same_frames() -> None:
    data = encode_frame([("a", m) for m in TOPIC_EXAMPLES]) + encode_frame([(None, GetTopics())])
    decoder = FrameDecoder(max_frame_size=MAX_FRAME)
    frames = []
    for i in range(len(data)):
        decoder.feed(data[i : i + 1])
        while (frame := decoder.next_frame()) is not None:
            frames.append(frame)
    assert frames == decode_all(data)
    assert frames == [[("a", m) for m in TOPIC_EXAMPLES], [(None, GetTopics())]]


def test_two_frames_back_to_back_in_one_feed_decode_in_order() -> None:
    first = [("t", Join(peer=ALICE, ttl=6))]
    second = [("u", Graft(ranges=((ALICE, 1, 1, 0),)))]
    assert decode_all(encode_frame(first) + encode_frame(second)) == [first, second]


# -- framing ----------------------------------------------------------------------------


def test_trailing_garbage_after_a_valid_frame_still_yields_the_frame_first() -> None:
    items = [("t", Ping(nonce=1))]
    decoder = FrameDecoder(max_frame_size=1024)
    decoder.feed(encode_frame(items) + b"\xde\xad\xbe\xef\x00garbage")
    assert decoder.next_frame() == items
    with pytest.raises(FrameError, match="3735928559 bytes announced"):
        decoder.next_frame()


def test_header_announcing_2_31_bytes_raises_with_only_the_header_fed() -> None:
    decoder = FrameDecoder(max_frame_size=MAX_FRAME)
    decoder.feed(struct.pack(">I", 2**31))
    with pytest.raises(FrameError, match=f"frame of {2**31} bytes announced; .*1..{MAX_FRAME}"):
        decoder.next_frame()


def test_body_of_an_oversized_frame_is_never_buffered() -> None:
    decoder = FrameDecoder(max_frame_size=1000)
    decoder.feed(struct.pack(">I", 1001) + b"\x00" * 5000)
    assert decoder.buffered == 0
    with pytest.raises(FrameError):
        decoder.next_frame()


def test_unfinished_frame_holds_at_most_max_frame_size_plus_header() -> None:
    data = encode_frame([("t", Nodes(peers=(ALICE,) * MAX_PEERS_PER_MESSAGE))])
    decoder = FrameDecoder(max_frame_size=len(data) - 4)
    for i in range(0, len(data) - 1, 97):
        decoder.feed(data[i : min(i + 97, len(data) - 1)])
        assert decoder.next_frame() is None
        assert decoder.buffered <= len(data) - 1
    decoder.feed(data[-1:])
    assert decoder.next_frame() is not None
    assert decoder.buffered == 0


def test_frame_of_exactly_max_frame_size_is_accepted() -> None:
    data = encode_frame([("t", Prune())])
    assert decode_all(data, max_frame_size=len(data) - 4) == [[("t", Prune())]]
    assert_refused(data, "announced", max_frame_size=len(data) - 5)


def test_truncated_frame_returns_none_until_the_rest_arrives() -> None:
    data = encode_frame([("t", Gossip(id=ID1, envelope=ENVELOPE, hops=1))])
    decoder = FrameDecoder(max_frame_size=MAX_FRAME)
    decoder.feed(data[:2])
    assert decoder.next_frame() is None
    decoder.feed(data[2:-1])
    assert decoder.next_frame() is None
    assert decoder.buffered == len(data) - 1
    decoder.feed(data[-1:])
    assert decoder.next_frame() == [("t", Gossip(id=ID1, envelope=ENVELOPE, hops=1))]


def test_zero_length_frame_is_refused() -> None:
    assert_refused(b"\x00\x00\x00\x00", "empty frame")


def test_garbage_bytes_raise_frame_error() -> None:
    assert_refused(b"\x00\x00\x00\x05\xff\xff\xff\xff\xff", "malformed protobuf")


def test_frame_without_items_is_refused() -> None:
    # Field 15 is unknown to Frame: a well-formed protobuf that carries nothing.
    assert_refused(b"\x00\x00\x00\x02\x78\x01", "no items")


def test_decoder_refuses_all_use_after_an_error() -> None:
    decoder = FrameDecoder(max_frame_size=MAX_FRAME)
    decoder.feed(b"\x00\x00\x00\x00")
    with pytest.raises(FrameError):
        decoder.next_frame()
    with pytest.raises(FrameError, match="error state"):
        decoder.next_frame()
    with pytest.raises(FrameError, match="error state"):
        decoder.feed(encode_frame([("t", Prune())]))
    assert decoder.buffered == 0


def test_decoder_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_frame_size"):
        FrameDecoder(max_frame_size=0)
    with pytest.raises(ValueError, match="max_frame_size"):
        FrameDecoder(max_frame_size=1 << 32)
    with pytest.raises(ValueError, match="max_items_per_frame"):
        FrameDecoder(max_frame_size=10, max_items_per_frame=0)


# -- bad items --------------------------------------------------------------------------


def test_item_with_empty_body_is_refused() -> None:
    assert_refused(raw_item(topic="t"), "no message body")


def test_too_many_items_in_a_frame_is_refused() -> None:
    data = encode_frame([("t", Prune())] * (MAX_ITEMS_PER_FRAME + 1))
    assert_refused(data, f"{MAX_ITEMS_PER_FRAME + 1} items, more than {MAX_ITEMS_PER_FRAME}")
    assert len(decode_all(data, max_items_per_frame=MAX_ITEMS_PER_FRAME + 1)[0]) == 1025


def test_join_with_ttl_1000_is_refused_by_the_message_constructor() -> None:
    assert_refused(
        raw_item(topic="t", join=pb.Join(peer=ALICE, ttl=1000)), "invalid join: ttl.*1000"
    )


def test_ihave_naming_more_than_4096_messages_is_refused() -> None:
    # One range may not name more, nor may several together: the work an IHAVE asks of
    # the receiver (a look-up per place it does not hold) is bounded at entry.
    wide = [pb.StreamRange(publisher=ALICE, first_seq=0, last_seq=4096, hops=1)]
    assert_refused(raw_item(topic="t", ihave=pb.IHave(ranges=wide)), "invalid ihave.*4097")
    runs = [
        pb.StreamRange(publisher=ALICE, first_seq=i * 10, last_seq=i * 10 + 9) for i in range(410)
    ]
    assert_refused(raw_item(topic="t", ihave=pb.IHave(ranges=runs)), "invalid ihave.*4100")
    many = [pb.StreamRange(publisher=ALICE, first_seq=i, last_seq=i) for i in range(1025)]
    assert_refused(raw_item(topic="t", graft=pb.Graft(ranges=many)), "at most 1024 ranges")


def test_prune_or_graft_naming_too_many_or_bad_streams_is_refused() -> None:
    # The trees a PRUNE or GRAFT changes (a link-up touches every tree of the topic) are
    # bounded at entry, before any stream is looked at.
    many = [ALICE] * (MAX_STREAMS_PER_MESSAGE + 1)
    assert_refused(raw_item(topic="t", prune=pb.Prune(streams=many)), "at most 256 streams")
    assert_refused(raw_item(topic="t", graft=pb.Graft(streams=many)), "at most 256 streams")
    assert_refused(raw_item(topic="t", prune=pb.Prune(streams=[b""])), "peer id must be")
    assert_refused(raw_item(topic="t", graft=pb.Graft(streams=[b"x" * 65])), "peer id must be")


def test_ihave_without_ranges_is_refused() -> None:
    assert_refused(raw_item(topic="t", ihave=pb.IHave()), "invalid ihave")


def test_a_range_that_runs_backwards_past_63_bits_or_without_a_publisher_is_refused() -> None:
    backwards = pb.StreamRange(publisher=ALICE, first_seq=5, last_seq=4)
    assert_refused(raw_item(topic="t", ihave=pb.IHave(ranges=[backwards])), "bad range 5..4")
    top = pb.StreamRange(publisher=ALICE, first_seq=1 << 63, last_seq=1 << 63)
    assert_refused(raw_item(topic="t", graft=pb.Graft(ranges=[top])), "invalid graft: bad range")
    nobody = pb.StreamRange(first_seq=1, last_seq=1)
    assert_refused(raw_item(topic="t", graft=pb.Graft(ranges=[nobody])), "peer id must be")
    hops = pb.StreamRange(publisher=ALICE, first_seq=1, last_seq=1, hops=MAX_HOPS + 1)
    assert_refused(raw_item(topic="t", ihave=pb.IHave(ranges=[hops])), "hops must be")


def test_heads_are_bounded_and_checked_at_decode() -> None:
    # A head names one seq; at most 1,024 of them, as an IHAVE's ranges; none is no HEADS.
    span = [pb.StreamRange(publisher=ALICE, first_seq=3, last_seq=9, hops=1)]
    assert_refused(raw_item(topic="t", heads=pb.Heads(ranges=span)), "head names one seq")
    many = [pb.StreamRange(publisher=ALICE, first_seq=i, last_seq=i) for i in range(1025)]
    assert_refused(raw_item(topic="t", heads=pb.Heads(ranges=many)), "at most 1024 ranges")
    assert_refused(raw_item(topic="t", heads=pb.Heads()), "invalid heads")
    top = pb.StreamRange(publisher=ALICE, first_seq=1 << 63, last_seq=1 << 63)
    assert_refused(raw_item(topic="t", heads=pb.Heads(ranges=[top])), "bad range")
    nobody = pb.StreamRange(first_seq=1, last_seq=1)
    assert_refused(raw_item(topic="t", heads=pb.Heads(ranges=[nobody])), "peer id must be")


def test_gossip_without_envelope_is_refused() -> None:
    assert_refused(raw_item(topic="t", gossip=pb.Gossip(id=ID1, hops=1)), "without an envelope")


def test_envelope_with_too_many_headers_is_refused_when_decoded() -> None:
    """A GOSSIP's envelope is decoded on its first receipt, not by the frame decoder (a
    duplicate never is): broadcast reports the sender then (test_broadcast.py)."""
    headers = [pb.Envelope.Header(name="h", value=b"")] * (MAX_HEADERS + 1)
    envelope = pb.Envelope(publisher=ALICE, payload=b"x", headers=headers)
    data = raw_item(topic="t", gossip=pb.Gossip(id=ID1, envelope=envelope, hops=1))
    decoder = FrameDecoder(max_frame_size=1 << 20)
    decoder.feed(data)
    [(topic, gossip)] = decoder.next_frame() or []
    assert topic == "t" and isinstance(gossip, Gossip)
    with pytest.raises(ValueError, match="at most 64 headers"):
        _ = gossip.envelope


def test_peer_id_longer_than_the_limit_is_refused_and_shown() -> None:
    long_peer = b"\xab" * (MAX_PEER_ID_SIZE + 1)
    data = raw_item(topic="t", nodes=pb.Nodes(peers=[ALICE, long_peer]))
    assert_refused(data, rf"1..{MAX_PEER_ID_SIZE} bytes, not 65: b'\\xab")


def test_empty_peer_id_is_refused() -> None:
    assert_refused(raw_item(topic="t", join=pb.Join(ttl=3)), "peer id must be")


def test_topic_on_a_node_level_message_is_refused() -> None:
    assert_refused(raw_item(topic="t", get_topics=pb.GetTopics()), "node-level get_topics")


def test_topic_message_without_topic_is_refused() -> None:
    assert_refused(raw_item(prune=pb.Prune()), "prune carries no topic")


def test_topic_name_over_the_limit_is_refused() -> None:
    name = "é" * (MAX_TOPIC_NAME // 2) + "x"  # 257 bytes of UTF-8
    assert_refused(raw_item(topic=name, prune=pb.Prune()), "topic name must be 1..256 bytes")
    assert_refused(raw_item(topic="", prune=pb.Prune()), "not 0")
    topics = pb.Topics(topics=["ok", name])
    assert_refused(raw_item(topics=topics), "topic name must be")


def test_topic_that_is_not_utf8_is_refused() -> None:
    item = pb.Item(prune=pb.Prune()).SerializeToString()
    body = b"\x0a\x07" + b"\x0a\x01\xff" + item  # Frame.items[0] = {topic: b"\xff", prune: {}}
    assert_refused(struct.pack(">I", len(body)) + body, "malformed protobuf")


@pytest.mark.parametrize("field", ["op", "kind"])
def test_unknown_enum_value_is_refused(field: str) -> None:
    neighbor = pb.Neighbor(**{field: 7})
    assert_refused(raw_item(topic="t", neighbor=neighbor), r"unknown \w+ value 7")


def test_held_spans_past_the_bound_or_inconsistent_are_refused() -> None:
    span = pb.HeldSpan(publisher=ALICE, first_seq=0, last_seq=0)
    too_many = pb.Held(spans=[span] * (MAX_HELD_SPANS + 1))
    assert_refused(raw_item(topic="t", held=too_many), f"at most {MAX_HELD_SPANS} spans")
    bad = [
        (pb.HeldSpan(publisher=ALICE, first_seq=5, last_seq=4), "bad span"),
        (pb.HeldSpan(publisher=ALICE, first_seq=0, last_seq=3, count=5), "count 5"),
        (pb.HeldSpan(publisher=ALICE, first_seq=0, last_seq=3, since_seq=9), "since_seq 9"),
        (pb.HeldSpan(publisher=ALICE, first_seq=0, last_seq=1 << 63), "bad span"),
        (pb.HeldSpan(first_seq=0, last_seq=0), "peer id must be"),
    ]
    for wrong, match in bad:
        assert_refused(raw_item(topic="t", held=pb.Held(spans=[wrong])), match)
        assert_refused(raw_item(topic="t", get_held=pb.GetHeld(spans=[wrong])), match)
    long_after = pb.GetHeld(after=b"x" * (MAX_PEER_ID_SIZE + 1))
    assert_refused(raw_item(topic="t", get_held=long_after), "after is at most")
    assert_refused(raw_item(get_held=pb.GetHeld()), "get_held carries no topic")


def test_out_of_range_numbers_are_refused() -> None:
    assert_refused(
        raw_item(topic="t", pull=pb.Pull(publisher=ALICE, first_seq=10, last_seq=2)), "bad range"
    )
    assert_refused(raw_item(topic="t", neighbor=pb.Neighbor(rtt_seconds=-1.0)), "rtt")
    assert_refused(raw_item(topic="t", neighbor=pb.Neighbor(rtt_seconds=float("nan"))), "rtt")
    assert_refused(raw_item(topic="t", pong=pb.Pong(active_count=1, rand_count=2)), "invalid pong")


def test_a_history_out_of_its_bounds_is_refused() -> None:
    too_many = [ENVELOPE.raw] * (MAX_HISTORY_MESSAGES + 1)
    bad = [
        (pb.History(publisher=ALICE), "1..1024 messages"),
        (pb.History(publisher=ALICE, envelopes=too_many, hops=[1] * len(too_many)), "at most"),
        (pb.History(publisher=ALICE, envelopes=[ENVELOPE.raw] * 2, hops=[1]), "2 messages and 1"),
        (pb.History(publisher=ALICE, envelopes=[ENVELOPE.raw], hops=[0]), "hops must be"),
        (pb.History(publisher=ALICE, envelopes=[ENVELOPE.raw], hops=[MAX_HOPS + 1]), "hops"),
        (pb.History(envelopes=[ENVELOPE.raw], hops=[1]), "peer id must be"),
    ]
    for wrong, match in bad:
        assert_refused(raw_item(topic="t", history=wrong), match)
    assert_refused(raw_item(history=pb.History(publisher=ALICE)), "history carries no topic")


# -- encoding misuse --------------------------------------------------------------------


def test_int_peer_id_from_the_simulator_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="int ids exist only in the simulator, not 42"):
        encode_frame([("t", Join(peer=42, ttl=3))])
    with pytest.raises(TypeError, match="must be bytes"):
        encode_frame([("t", Nodes(peers=(ALICE, "bob")))])


def test_encoding_refuses_what_the_decoder_would_refuse() -> None:
    with pytest.raises(ValueError, match="peer id"):
        encode_frame([("t", Join(peer=b"x" * (MAX_PEER_ID_SIZE + 1), ttl=3))])
    with pytest.raises(ValueError, match="node-level"):
        encode_frame([("t", GetTopics())])
    with pytest.raises(TypeError, match="needs a str topic"):
        encode_frame([(None, Prune())])
    with pytest.raises(ValueError, match="topic name"):
        encode_frame([("x" * (MAX_TOPIC_NAME + 1), Prune())])
    with pytest.raises(ValueError, match="topic name"):
        encode_frame([(None, Topics(topics=("",)))])
    with pytest.raises(ValueError, match="at least one"):
        encode_frame([])
    with pytest.raises(TypeError, match="not an episub message"):
        encode_frame([("t", "hello")])  # type: ignore[list-item]


# -- properties -------------------------------------------------------------------------


@settings(max_examples=300)
@given(
    chunks=st.lists(
        st.binary(max_size=64)
        | st.binary(max_size=60).map(lambda b: struct.pack(">I", len(b)) + b),
        max_size=8,
    )
)
def test_random_bytes_raise_nothing_but_frame_error(chunks: list[bytes]) -> None:
    # Half the chunks carry a correct length prefix, so the protobuf parser sees garbage too.
    decoder = FrameDecoder(max_frame_size=4096, max_items_per_frame=16)
    try:
        for chunk in chunks:
            decoder.feed(chunk)
            while decoder.next_frame() is not None:
                pass
            assert decoder.buffered <= 4096 + 4
    except FrameError:
        pass


VALID_FRAME = encode_frame([("t", m) for m in TOPIC_EXAMPLES] + [(None, m) for m in NODE_EXAMPLES])


@settings(max_examples=300)
@given(
    edits=st.lists(st.tuples(st.integers(4, len(VALID_FRAME) - 1), st.integers(0, 255)), max_size=4)
)
def test_corrupted_valid_frames_raise_nothing_but_frame_error(edits: list[tuple[int, int]]) -> None:
    # Flipping bytes inside a real frame reaches the message constructors, not just the parser.
    data = bytearray(VALID_FRAME)
    for position, value in edits:
        data[position] = value
    decoder = FrameDecoder(max_frame_size=MAX_FRAME)
    decoder.feed(bytes(data))
    try:
        items = decoder.next_frame()
    except FrameError:
        return
    # The length prefix is intact, so the whole frame is there: it decodes completely, and
    # every item is a validated message with a topic exactly when it needs one.
    assert items is not None
    for topic, message in items:
        node_level = isinstance(message, GetTopics | Topics)
        assert (topic is None) == node_level, (topic, message)
        assert node_level or isinstance(topic, str)


peer_ids = st.binary(min_size=1, max_size=MAX_PEER_ID_SIZE)
message_ids = st.binary(min_size=MESSAGE_ID_SIZE, max_size=MESSAGE_ID_SIZE)
ttls = st.integers(0, MAX_TTL)
hops = st.integers(0, MAX_HOPS)
peer_lists = st.lists(peer_ids, max_size=8).map(tuple)
seqs = st.integers(0, (1 << 63) - 1)
stream_ranges = st.builds(
    lambda publisher, first, span, hops: (publisher, first, min(first + span, (1 << 63) - 1), hops),
    peer_ids,
    seqs,
    st.integers(0, 100),
    hops,
)
nonces = st.integers(0, (1 << 64) - 1)
counts = st.tuples(st.integers(0, 8), st.integers(0, 8)).map(sorted)
envelopes = st.builds(
    Envelope,
    publisher=peer_ids,
    seq=seqs,
    timestamp_ms=seqs,
    payload=st.binary(max_size=200),
    key=st.none() | st.binary(max_size=16),
    headers=st.lists(st.tuples(st.text(max_size=10), st.binary(max_size=10)), max_size=4).map(
        tuple
    ),
)
topic_messages = st.one_of(
    st.just(GetNodes()),
    st.builds(Nodes, peers=peer_lists),
    st.builds(Join, peer=peer_ids, ttl=ttls),
    st.builds(ForwardJoin, peer=peer_ids, ttl=ttls),
    st.builds(
        lambda op, kind, high, rtt, c: Neighbor(
            op=op, kind=kind, high_priority=high, rtt=rtt, rand_count=c[0], active_count=c[1]
        ),
        st.sampled_from(NeighborOp),
        st.sampled_from(LinkKind),
        st.booleans(),
        st.none() | st.floats(0.0, 3599.0),
        counts,
    ),
    st.builds(Disconnect, alive=st.booleans()),
    st.builds(Leave, peer=peer_ids, ttl=ttls),
    st.builds(Shuffle, origin=peer_ids, ttl=ttls, peers=peer_lists, nonce=nonces),
    st.builds(ShuffleReply, peers=peer_lists, nonce=nonces),
    st.builds(Ping, nonce=st.integers(0, (1 << 64) - 1), want_view=st.booleans()),
    st.builds(
        lambda nonce, sub, c, active: Pong(
            nonce=nonce, subscribed=sub, rand_count=c[0], active_count=c[1], active=active
        ),
        st.integers(0, (1 << 64) - 1),
        st.booleans(),
        counts,
        peer_lists,
    ),
    st.builds(Gossip, id=message_ids, envelope=envelopes, hops=hops),
    st.builds(IHave, ranges=st.lists(stream_ranges, min_size=1, max_size=5).map(tuple)),
    st.builds(Prune, streams=st.lists(peer_ids, max_size=3).map(tuple)),
    st.builds(
        Heads,
        ranges=st.lists(
            stream_ranges.map(lambda r: (r[0], r[2], r[2], r[3])), min_size=1, max_size=5
        ).map(tuple),
    ),
    st.builds(
        Graft,
        ranges=st.lists(stream_ranges, max_size=5).map(tuple),
        streams=st.lists(peer_ids, max_size=3).map(tuple),
    ),
    st.builds(
        lambda publisher, first, span: Pull(
            publisher=publisher, first_seq=first, last_seq=first + span
        ),
        peer_ids,
        st.integers(0, 1 << 40),
        st.integers(0, 4095),
    ),
    st.builds(
        lambda nonce, spans, more: Held(nonce=nonce, spans=tuple(spans), more=more),
        st.integers(0, (1 << 64) - 1),
        st.lists(
            st.builds(
                lambda publisher, first, span, count: HeldSpan(
                    publisher=publisher,
                    first_seq=first,
                    last_seq=first + span,
                    count=count % (span + 1) + 1,
                    since_seq=first,
                ),
                peer_ids,
                st.integers(0, 1 << 40),
                st.integers(0, 1 << 20),
                st.integers(0, 1 << 20),
            ),
            max_size=4,
        ),
        st.booleans(),
    ),
)
topic_names = st.text(min_size=1, max_size=20)
node_messages = st.just(GetTopics()) | st.builds(
    Topics, topics=st.lists(topic_names, max_size=4).map(tuple)
)
items = st.lists(
    st.tuples(topic_names, topic_messages) | st.tuples(st.none(), node_messages),
    min_size=1,
    max_size=6,
)


@settings(max_examples=300)
@given(frames=st.lists(items, min_size=1, max_size=3), chunk=st.integers(1, 50))
def test_generated_messages_round_trip_in_any_chunking(
    frames: list[list[tuple[str | None, PeerMessage]]], chunk: int
) -> None:
    data = b"".join(encode_frame(frame) for frame in frames)
    decoder = FrameDecoder(max_frame_size=MAX_FRAME)
    decoded = []
    for i in range(0, len(data), chunk):
        decoder.feed(data[i : i + chunk])
        while (frame := decoder.next_frame()) is not None:
            decoded.append(frame)
    assert decoded == frames
    assert decoder.buffered == 0


# -- the hand-written GOSSIP and IHAVE layouts are protobuf's ---------------------------------

ENVELOPES = st.builds(
    Envelope,
    publisher=st.binary(min_size=1, max_size=MAX_PEER_ID_SIZE),
    seq=st.integers(0, 2**63 - 1),
    timestamp_ms=st.integers(0, 2**63 - 1),
    payload=st.binary(max_size=300),
    key=st.none() | st.binary(max_size=20),
    headers=st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=8)), max_size=4).map(tuple),
)


@given(envelope=ENVELOPES)
def test_an_envelopes_bytes_are_protobufs_and_decode_back_to_it(envelope: Envelope) -> None:
    parsed = pb.Envelope.FromString(envelope.raw)
    assert parsed.SerializeToString() == envelope.raw  # protobuf writes these very bytes
    assert (parsed.publisher, parsed.seq, parsed.timestamp_ms, parsed.payload) == (
        envelope.publisher,
        envelope.seq,
        envelope.timestamp_ms,
        envelope.payload,
    )
    assert (parsed.key if parsed.HasField("key") else None) == envelope.key
    assert tuple((h.name, h.value) for h in parsed.headers) == envelope.headers
    assert Envelope.decode(envelope.raw) == envelope


@pytest.mark.parametrize(
    "raw",
    [
        pb.Envelope(publisher=ALICE, seq=1).SerializeToString() + b"\x10\x02",  # seq twice
        pb.Envelope(seq=1, publisher=ALICE).SerializeToString()[::-1],  # nonsense order
        b"\x0a\x01a\x10\x81\x00",  # a varint padded with a zero byte
        b"\x0a\x01a\x10\x00",  # seq 0 written out (proto3 leaves defaults out)
        b"\x0a\x01a\x40\x01",  # an unknown field
        b"\x0a\x05a",  # cut short
    ],
)
def test_an_envelope_in_any_other_layout_is_refused(raw: bytes) -> None:
    with pytest.raises(ValueError):
        Envelope.decode(raw)


def test_an_envelopes_id_is_over_its_bytes_before_the_signature() -> None:
    envelope = Envelope(publisher=ALICE, seq=1, timestamp_ms=2, payload=b"x")
    signed = envelope.signed(Signature(signer=b"k" * 32, value=b"s" * 64))
    assert bytes(envelope.unsigned) == bytes(signed.unsigned) == envelope.raw != signed.raw
    decoded = Envelope.decode(signed.raw)
    assert bytes(decoded.unsigned) == envelope.raw
    assert message_id("t", decoded) == message_id("t", envelope)


@pytest.mark.parametrize("value", [127, 128, 255, 16383, 16384])
def test_lengths_and_seqs_of_one_two_and_three_varint_bytes_read_back(value: int) -> None:
    envelope = Envelope(publisher=ALICE, seq=value, timestamp_ms=value, payload=b"p" * value)
    assert Envelope.decode(envelope.raw) == envelope
    gossip = Gossip(id=ID1, envelope=envelope, hops=1)
    assert decode_all(encode_frame([("t", gossip)])) == [[("t", gossip)]]


def _padded(n: int) -> bytes:
    """`n` (< 128) as a two-byte varint that is not minimal (protobuf reads it; we do not)."""
    return bytes((n | 0x80, 0))


def test_a_gossip_item_with_a_length_padded_by_a_zero_byte_is_refused() -> None:
    raw = Envelope(publisher=ALICE, seq=1, timestamp_ms=1, payload=b"x" * 10).raw

    def frame_of(item_length: bytes, gossip_length: bytes, raw_length: bytes) -> bytes:
        gossip = b"\x0a\x20" + ID1 + b"\x12" + raw_length + raw
        item = b"\x0a\x01t\x12" + gossip_length + gossip  # Item{topic, gossip}
        return frame_from_items([b"\x0a" + item_length + item])

    gossip_size = 2 + len(ID1) + 1 + 1 + len(raw)
    item_size = 3 + 1 + 1 + gossip_size
    sizes = (bytes((item_size,)), bytes((gossip_size,)), bytes((len(raw),)))
    assert decode_all(frame_of(*sizes))[0][0][1].raw == raw  # minimal: read
    assert_refused(frame_of(_padded(item_size), *sizes[1:]), "not minimal")
    assert_refused(frame_of(bytes((item_size + 1,)), _padded(gossip_size), sizes[2]), "not minimal")
    assert_refused(
        frame_of(bytes((item_size + 1,)), bytes((gossip_size + 1,)), _padded(len(raw))),
        "not minimal",
    )
    payload = raw.index(b"\x22\x0axxxxxxxxxx")  # the envelope's payload length, padded
    with pytest.raises(ValueError, match="not minimal"):
        Envelope.decode(raw[: payload + 1] + _padded(10) + raw[payload + 2 :])


@given(envelope=ENVELOPES, hops=st.integers(0, MAX_HOPS))
def test_a_gossip_item_written_by_hand_is_what_protobuf_writes(
    envelope: Envelope, hops: int
) -> None:
    gossip = Gossip(id=ID1, envelope=envelope, hops=hops)
    expected = pb.Frame(
        items=[
            pb.Item(
                topic="t",
                gossip=pb.Gossip(id=ID1, envelope=pb.Envelope.FromString(envelope.raw), hops=hops),
            )
        ]
    ).SerializeToString()
    assert encode_item("t", gossip) == expected
    [[(topic, decoded)]] = decode_all(frame_from_items([expected]))
    assert (topic, decoded) == ("t", gossip) and decoded.envelope == envelope


@given(
    publisher=st.binary(min_size=1, max_size=MAX_PEER_ID_SIZE),
    packed=st.lists(
        st.tuples(st.binary(max_size=300), st.integers(1, MAX_HOPS)),
        min_size=1,
        max_size=MAX_HISTORY_MESSAGES,
    ),
    topic=st.sampled_from(["t", "ä" * 100]),
)
def test_a_history_item_written_by_hand_is_what_protobuf_writes(
    publisher: bytes, packed: list[tuple[bytes, int]], topic: str
) -> None:
    envelopes, hops = tuple(raw for raw, _ in packed), tuple(hop for _, hop in packed)
    history = History(publisher=publisher, envelopes=envelopes, hops=hops)
    expected = pb.Frame(
        items=[
            pb.Item(
                topic=topic,
                history=pb.History(publisher=publisher, envelopes=envelopes, hops=hops),
            )
        ]
    ).SerializeToString()
    assert encode_item(topic, history) == expected
    [[(decoded_topic, decoded)]] = decode_all(frame_from_items([expected]))
    assert (decoded_topic, decoded) == (topic, history)


def _reads(chunks: list[bytes], *, whole_frames: bool) -> list[object]:
    """The frames of `chunks` fed one by one (then "FrameError" if one raised);
    `whole_frames`: a chunk that is one whole frame is taken by whole_frame(), as a
    connection does, instead of feed() + next_frame()."""
    decoder = FrameDecoder(max_frame_size=4096, max_items_per_frame=16)
    out: list[object] = []
    try:
        for chunk in chunks:
            frame = decoder.whole_frame(chunk) if whole_frames else None
            if frame is not None:
                out.append(frame)
                continue
            decoder.feed(chunk)
            while (frame := decoder.next_frame()) is not None:
                out.append(frame)
    except FrameError:
        out.append("FrameError")
    return out


@settings(max_examples=300)
@given(
    chunks=st.lists(
        st.sampled_from([VALID_FRAME[:4096], encode_frame([(None, GetTopics())])])
        | st.binary(max_size=64)
        | st.binary(max_size=60).map(lambda b: struct.pack(">I", len(b)) + b),
        max_size=8,
    )
)
def test_a_read_that_is_one_whole_frame_decodes_as_if_fed(chunks: list[bytes]) -> None:
    # Connection._received takes a read that is exactly one frame straight (whole_frame);
    # the frames and the first error must be those of feeding every read.
    assert _reads(chunks, whole_frames=True) == _reads(chunks, whole_frames=False)


def test_a_whole_frame_is_not_taken_behind_buffered_bytes_or_after_an_error() -> None:
    one = encode_frame([(None, GetTopics())])
    decoder = FrameDecoder(max_frame_size=1024)
    decoder.feed(one[:3])
    assert decoder.whole_frame(one) is None  # bytes of an earlier frame come first
    decoder.feed(one[3:])
    assert decoder.next_frame() == [(None, GetTopics())]
    assert decoder.whole_frame(one) == [(None, GetTopics())]  # nothing buffered now
    broken = FrameDecoder(max_frame_size=1024)
    broken.feed(struct.pack(">I", 0))
    assert broken.whole_frame(one) is None
    with pytest.raises(FrameError):
        broken.next_frame()


def test_one_sequence_bound_holds_for_envelopes_records_publishes_and_ranges() -> None:
    """MAX_SEQ is the largest seq everywhere a seq is checked, and MAX_SEQ + 1 is refused."""
    from episub.proto.envelope import MAX_SEQ, MAX_TIMESTAMP_MS, Envelope, Record
    from episub.proto.events import Publish

    def made(seq: int) -> list[Callable[[], object]]:
        return [
            lambda: Envelope(publisher=ALICE, seq=seq, timestamp_ms=1, payload=b""),
            lambda: Record(b"v", stream=(b"s", seq)),
            lambda: Publish(topic="t", payload=b"", stream=(b"s", seq)),
            lambda: Pull(publisher=ALICE, first_seq=seq, last_seq=seq),
            lambda: HeldSpan(publisher=ALICE, first_seq=0, last_seq=seq),
        ]

    for make in made(MAX_SEQ):
        make()
    for make in made(MAX_SEQ + 1):
        with pytest.raises(ValueError):
            make()
    Envelope(publisher=ALICE, seq=0, timestamp_ms=MAX_TIMESTAMP_MS, payload=b"")
    with pytest.raises(ValueError):
        Envelope(publisher=ALICE, seq=0, timestamp_ms=MAX_TIMESTAMP_MS + 1, payload=b"")
