"""Length-prefixed frames (episub/proto/framing.py): the one decoder the node wire and the
agent protocol both split their streams with, and its one bound. Tested here, once; the
node wire's item decoding on top of it is tests/test_wire.py's."""

from __future__ import annotations

import pytest

from episub.agent import agent_pb2 as pb
from episub.agent.wire import encode_frame
from episub.proto.framing import (
    LENGTH_PREFIX_SIZE,
    MAX_ENCODABLE_FRAME,
    FrameError,
    FrameSplitter,
    frame,
)


def bodies(splitter: FrameSplitter) -> list[bytes]:
    out = []
    while (body := splitter.next_body()) is not None:
        out.append(body)
    return out


def test_bodies_come_out_whole_and_in_order_fed_one_byte_at_a_time() -> None:
    stream = b"".join(frame(b"x" * n) for n in (1, 0, 7, 100))
    splitter = FrameSplitter(100)
    out = []
    for byte in stream:
        splitter.feed(bytes([byte]))
        out += bodies(splitter)
    assert out == [b"x", b"", b"x" * 7, b"x" * 100]
    assert splitter.buffered == 0


def test_an_agent_request_frame_is_a_length_prefixed_protobuf() -> None:
    frames = [encode_frame(pb.Request(id=i, inspect=pb.Inspect())) for i in range(3)]
    splitter = FrameSplitter(100)
    splitter.feed(b"".join(frames))
    assert [pb.Request.FromString(b).id for b in bodies(splitter)] == [0, 1, 2]


def test_a_header_over_the_bound_is_refused_from_its_four_bytes_alone() -> None:
    splitter = FrameSplitter(100)
    splitter.feed(b"\x00\x00\x00\x65")  # 101 bytes announced, none of them sent
    with pytest.raises(FrameError, match=r"frame of 101 bytes announced; frames must be 0\.\.100"):
        splitter.next_body()


def test_the_body_of_a_refused_frame_is_never_held() -> None:
    splitter = FrameSplitter(100)
    splitter.feed(b"\x00\x00\x10\x00" + b"y" * 50)
    assert splitter.buffered == 0
    splitter.feed(b"y" * 1000)  # the rest of it
    assert splitter.buffered == 0


def test_an_unfinished_frame_holds_at_most_the_bound_and_its_header() -> None:
    splitter = FrameSplitter(100)
    splitter.feed(frame(b"z" * 100)[:-1])
    assert splitter.next_body() is None
    assert splitter.buffered == LENGTH_PREFIX_SIZE + 99
    splitter.feed(b"z")
    assert splitter.next_body() == b"z" * 100


def test_frames_before_a_bad_header_are_handed_out_first() -> None:
    splitter = FrameSplitter(10)
    splitter.feed(frame(b"a") + frame(b"b") + b"\xff\xff\xff\xff")
    assert splitter.next_body() == b"a"
    assert splitter.next_body() == b"b"
    with pytest.raises(FrameError):
        splitter.next_body()


def test_after_an_error_the_splitter_only_raises() -> None:
    splitter = FrameSplitter(10)
    splitter.feed(b"\xff\xff\xff\xff")
    with pytest.raises(FrameError):
        splitter.next_body()
    with pytest.raises(FrameError, match="error state"):
        splitter.feed(frame(b"ok"))
    with pytest.raises(FrameError, match="error state"):
        splitter.next_body()


def test_a_body_its_caller_could_not_decode_breaks_the_stream_too() -> None:
    splitter = FrameSplitter(10)
    splitter.feed(frame(b"bad") + frame(b"next"))
    assert splitter.next_body() == b"bad"
    splitter.fail()
    assert splitter.buffered == 0
    with pytest.raises(FrameError, match="error state"):
        splitter.next_body()


def test_the_node_wire_has_no_empty_frame_the_agent_protocol_may() -> None:
    node = FrameSplitter(10, min_size=1)
    node.feed(frame(b""))
    with pytest.raises(FrameError, match=r"empty frame; frames must be 1\.\.10 bytes"):
        node.next_body()
    agent = FrameSplitter(10)
    agent.feed(frame(b""))
    assert agent.next_body() == b""


def test_bounds_must_make_sense() -> None:
    for bad in (0, -1, MAX_ENCODABLE_FRAME + 1):
        with pytest.raises(ValueError, match="max_size"):
            FrameSplitter(bad)
    with pytest.raises(ValueError, match="min_size"):
        FrameSplitter(10, min_size=11)
