"""Fuzzing what a stranger's bytes reach first: the frame decoder and the handshake.

The documented failures are `FrameError` (wire.FrameDecoder) and `HandshakeError`
(net.handshake.Handshake); any other exception is a bug. A short run is part of the
suite; `EPISUB_FUZZ_EXAMPLES=N` raises the example count of every test here (see
docs/reliability.md for the long run and scripts/fuzz.sh).

Inputs are built three ways: raw bytes; bytes behind a correct length prefix, so the
protobuf parser and the message constructors see them; and valid frames or handshake
messages with a few bytes changed, which get past the parser far more often.
"""

from __future__ import annotations

import os
import struct

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from episub.net.handshake import MAX_HANDSHAKE_FRAME, Handshake, HandshakeError
from episub.proto import episub_pb2 as pb
from episub.proto import messages as m
from episub.proto.wire import FrameDecoder, FrameError, encode_frame

SEARCH = os.environ.get("EPISUB_FUZZ_EXAMPLES")
EXAMPLES = int(SEARCH or "100")
FUZZ = settings(
    max_examples=EXAMPLES,
    # The suite's run is the same every time; a long run (scripts/fuzz.sh) searches at random.
    derandomize=SEARCH is None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
MAX_FRAME = 1 << 16

KEY = bytes(range(32))
ALICE = b"127.0.0.1:7001/00000000000000a1"
BOB = b"127.0.0.1:7002/00000000000000b0"


def prefixed(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def assert_decodes_or_frame_error(chunks: list[bytes], max_frame: int = MAX_FRAME) -> None:
    """Feed `chunks` one by one and take every frame; only FrameError may come out, every
    item decoded is well formed, and the buffer stays bounded (asserted here)."""
    decoder = FrameDecoder(max_frame_size=max_frame, max_items_per_frame=64)
    try:
        for chunk in chunks:
            decoder.feed(chunk)
            while (frame := decoder.next_frame()) is not None:
                for topic, message in frame:
                    assert topic is None or isinstance(topic, str)
                    assert isinstance(message, m.GetTopics | m.Topics) == (topic is None)
            assert decoder.buffered <= max_frame + 4 + max(len(c) for c in chunks)
    except FrameError:
        return


# -- the frame decoder ---------------------------------------------------------------------

SAMPLE_FRAME = encode_frame(
    [
        ("t", m.Ping(nonce=7, want_view=True)),
        ("t", m.Pong(nonce=7, subscribed=True, active_count=2, rand_count=1, active=(b"p",))),
        ("t", m.Neighbor(op=m.NeighborOp.REQUEST, kind=m.LinkKind.NEAR, rtt=0.01)),
        ("t", m.IHave(ranges=((b"\x01" * 32, 0, 3, 3),))),
        ("t", m.Graft(ranges=((b"\x02" * 32, 5, 5, 0),))),
        ("t", m.Pull(publisher=b"pub", first_seq=1, last_seq=9)),
        ("t", m.Shuffle(origin=b"o", ttl=3, peers=(b"a", b"b"))),
        (
            "t",
            m.Gossip(
                id=b"\x03" * 32,
                envelope=m.Envelope(
                    publisher=b"pub",
                    seq=4,
                    timestamp_ms=5,
                    payload=b"hello",
                    key=b"k",
                    headers=(("h", b"v"),),
                ),
                hops=2,
            ),
        ),
        (None, m.Topics(topics=("a", "b"))),
        (None, m.GetTopics()),
    ]
)


@FUZZ
@given(st.lists(st.binary(max_size=200), min_size=1, max_size=6))
@example([b"\x00\x00\x00\x00"])  # an empty frame
@example([b"\xff\xff\xff\xff"])  # a 4 GiB header
@example([prefixed(b"\x0a\x00")])  # an empty item
def test_fuzz_raw_bytes_raise_only_frame_error(chunks: list[bytes]) -> None:
    assert_decodes_or_frame_error(chunks)


@FUZZ
@given(st.lists(st.binary(max_size=300).map(prefixed), min_size=1, max_size=4))
def test_fuzz_prefixed_garbage_raises_only_frame_error(chunks: list[bytes]) -> None:
    assert_decodes_or_frame_error(chunks)


@FUZZ
@given(
    edits=st.lists(
        st.tuples(st.integers(4, len(SAMPLE_FRAME) - 1), st.integers(0, 255)),
        min_size=1,
        max_size=8,
    ),
    cut=st.integers(1, 64),
)
def test_fuzz_mutated_valid_frames_raise_only_frame_error(
    edits: list[tuple[int, int]], cut: int
) -> None:
    data = bytearray(SAMPLE_FRAME)
    for position, value in edits:
        data[position] = value
    chunks = [bytes(data[i : i + cut]) for i in range(0, len(data), cut)]
    assert_decodes_or_frame_error(chunks)


# Protobuf-level fuzzing: a Frame built field by field with arbitrary values, so that
# every message type's constructor sees out-of-range numbers, odd lengths and bad enums.
_any_int = st.integers(0, (1 << 64) - 1)
_small_bytes = st.binary(max_size=80)
_text = st.text(max_size=20)


@st.composite
def pb_frames(draw: st.DrawFn) -> bytes:
    frame = pb.Frame()
    for _ in range(draw(st.integers(1, 4))):
        item = frame.items.add()
        if draw(st.booleans()):
            item.topic = draw(_text)
        kind = draw(st.sampled_from([f.name for f in item.DESCRIPTOR.oneofs[0].fields]))
        sub = getattr(item, kind)
        sub.SetInParent()
        for fd in sub.DESCRIPTOR.fields:
            if not draw(st.booleans()):
                continue
            _fill(draw, sub, fd)
    return prefixed(frame.SerializeToString())


def _fill(draw: st.DrawFn, msg, fd) -> None:
    from google.protobuf.descriptor import FieldDescriptor as F

    repeated = fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == F.LABEL_REPEATED
    count = draw(st.integers(0, 3)) if repeated else 1
    for _ in range(count):
        if fd.type == F.TYPE_MESSAGE:
            child = getattr(msg, fd.name).add() if repeated else getattr(msg, fd.name)
            child.SetInParent()
            for sub_fd in child.DESCRIPTOR.fields:
                if draw(st.booleans()):
                    _fill(draw, child, sub_fd)
            continue
        if fd.type in (F.TYPE_BYTES,):
            value = draw(_small_bytes)
        elif fd.type == F.TYPE_STRING:
            value = draw(_text)
        elif fd.type == F.TYPE_BOOL:
            value = draw(st.booleans())
        elif fd.type in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
            value = draw(st.floats(allow_nan=True, allow_infinity=True, width=32))
        elif fd.type == F.TYPE_ENUM:
            value = draw(st.integers(-2, 5))
        elif fd.type in (F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32):
            value = draw(st.integers(-(1 << 31), (1 << 31) - 1))
        elif fd.type in (F.TYPE_UINT32, F.TYPE_FIXED32):
            value = draw(st.integers(0, (1 << 32) - 1))
        elif fd.type in (F.TYPE_INT64, F.TYPE_SINT64, F.TYPE_SFIXED64):
            value = draw(st.integers(-(1 << 63), (1 << 63) - 1))
        else:
            value = draw(_any_int)
        if repeated:
            getattr(msg, fd.name).append(value)
        else:
            setattr(msg, fd.name, value)


@FUZZ
@given(st.lists(pb_frames(), min_size=1, max_size=3))
def test_fuzz_structured_protobuf_frames_raise_only_frame_error(frames: list[bytes]) -> None:
    assert_decodes_or_frame_error([b"".join(frames)])


# -- the handshake ---------------------------------------------------------------------------


def responder() -> Handshake:
    return Handshake(key=KEY, my_id=BOB, initiator=False, nonce=b"\x02" * 32)


def valid_hello() -> bytes:
    return Handshake(key=KEY, my_id=ALICE, initiator=True, nonce=b"\x01" * 32).data_to_send()


def assert_handshake_fails_cleanly(chunks: list[bytes]) -> None:
    """Feed `chunks` to a responder; only HandshakeError may come out, and after one the
    machine refuses further input with HandshakeError too."""
    machine = responder()
    for chunk in chunks:
        if machine.done:
            return
        try:
            machine.receive_data(chunk)
        except HandshakeError:
            try:
                machine.receive_data(b"x")
            except HandshakeError:
                return
            raise AssertionError("a failed handshake accepted more input") from None
        assert len(machine._buffer) <= MAX_HANDSHAKE_FRAME + 4 + len(chunk)


@FUZZ
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=5))
@example([b"\x00\x00\x00\x01\x0a"])  # a Hello field with no length
@example([prefixed(b"\x12\x00")])  # an empty Proof before any Hello
def test_fuzz_handshake_raw_bytes_raise_only_handshake_error(chunks: list[bytes]) -> None:
    assert_handshake_fails_cleanly(chunks)


@st.composite
def pb_handshakes(draw: st.DrawFn) -> bytes:
    message = pb.Handshake()
    if draw(st.booleans()):
        message.hello.version = draw(st.integers(0, (1 << 32) - 1))
        message.hello.peer_id = draw(st.binary(max_size=80) | st.just(ALICE) | st.just(BOB))
        message.hello.nonce = draw(st.binary(max_size=40) | st.just(b"\x02" * 32))
    else:
        message.proof.mac = draw(st.binary(max_size=40))
    return prefixed(message.SerializeToString())


@FUZZ
@given(st.lists(pb_handshakes(), min_size=1, max_size=3), st.integers(1, 50))
def test_fuzz_structured_handshake_messages_raise_only_handshake_error(
    messages: list[bytes], cut: int
) -> None:
    data = b"".join(messages)
    assert_handshake_fails_cleanly([data[i : i + cut] for i in range(0, len(data), cut)])


@FUZZ
@given(
    st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), min_size=1, max_size=6),
    st.binary(max_size=60),
)
def test_fuzz_mutated_valid_hello_raises_only_handshake_error(
    edits: list[tuple[int, int]], tail: bytes
) -> None:
    data = bytearray(valid_hello())
    for position, value in edits:
        data[position % len(data)] = value
    assert_handshake_fails_cleanly([bytes(data), tail])
