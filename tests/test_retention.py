"""The retention store: ranges by (topic, publisher, seq), bounded by count, bytes and age."""

from __future__ import annotations

import pytest

from episub.retention import RetentionConfig, RetentionStore
from episub.subscription import Message

P = b"127.0.0.1:1/0000000000000001"
Q = b"127.0.0.1:2/0000000000000002"


def msg(seq: int, *, topic: str = "t", publisher: bytes = P, value: bytes = b"v") -> Message:
    return Message(
        topic=topic,
        publisher=publisher,
        seq=seq,
        timestamp_ms=0,
        key=None,
        value=value,
        headers=(),
        id=bytes(32),
    )


def store(**limits: float) -> RetentionStore[Message]:
    return RetentionStore(RetentionConfig(**limits))  # type: ignore[arg-type]


def seqs(messages: list[Message]) -> list[int]:
    return [m.seq for m in messages]


def test_a_range_comes_back_in_sequence_order_with_absent_ones_skipped() -> None:
    s = store()
    for seq in (3, 1, 2, 5):
        s.add(msg(seq), now=0.0)
    assert seqs(s.get("t", P, 1, 5, now=0.0)) == [1, 2, 3, 5]
    assert seqs(s.get("t", P, 2, 3, now=0.0)) == [2, 3]
    assert s.get("t", P, 6, 9, now=0.0) == []


def test_a_huge_range_does_not_walk_every_sequence_number() -> None:
    s = store()
    s.add(msg(7), now=0.0)
    assert seqs(s.get("t", P, 0, (1 << 63) - 1, now=0.0)) == [7]


def test_topics_and_publishers_are_kept_apart() -> None:
    s = store()
    s.add(msg(0), now=0.0)
    s.add(msg(0, publisher=Q, value=b"q"), now=0.0)
    s.add(msg(0, topic="u", value=b"u"), now=0.0)
    assert [m.value for m in s.get("t", P, 0, 0, now=0.0)] == [b"v"]
    assert [m.value for m in s.get("t", Q, 0, 0, now=0.0)] == [b"q"]
    assert [m.value for m in s.get("u", P, 0, 0, now=0.0)] == [b"u"]


def test_past_max_messages_the_oldest_stored_goes_first_whatever_its_topic() -> None:
    s = store(max_messages=2)
    s.add(msg(0, topic="a"), now=0.0)
    s.add(msg(0, topic="b"), now=1.0)
    s.add(msg(1, topic="b"), now=2.0)
    assert s.get("a", P, 0, 0, now=2.0) == []
    assert seqs(s.get("b", P, 0, 1, now=2.0)) == [0, 1]
    assert len(s) == 2 and s.evicted == 1


def test_past_max_bytes_the_oldest_go_until_it_fits() -> None:
    s = store(max_bytes=10)
    s.add(msg(0, value=b"x" * 4), now=0.0)
    s.add(msg(1, value=b"x" * 4), now=0.0)
    s.add(msg(2, value=b"x" * 4), now=0.0)
    assert seqs(s.get("t", P, 0, 2, now=0.0)) == [1, 2]
    assert s.bytes == 8


def test_messages_age_out_after_max_age() -> None:
    s = store(max_age=10.0)
    s.add(msg(0), now=0.0)
    s.add(msg(1), now=5.0)
    assert seqs(s.get("t", P, 0, 1, now=9.9)) == [0, 1]
    assert seqs(s.get("t", P, 0, 1, now=10.0)) == [1]
    assert s.get("t", P, 0, 1, now=15.0) == [] and len(s) == 0 and s.bytes == 0


def test_storing_the_same_message_again_replaces_it_and_keeps_the_byte_count() -> None:
    s = store()
    s.add(msg(0, value=b"old"), now=0.0)
    s.add(msg(0, value=b"newer"), now=1.0)
    assert [m.value for m in s.get("t", P, 0, 0, now=1.0)] == [b"newer"]
    assert len(s) == 1 and s.bytes == 5


def test_zero_limits_keep_nothing() -> None:
    s = store(max_messages=0)
    s.add(msg(0), now=0.0)
    assert len(s) == 0


def test_a_bad_range_is_an_error_showing_it() -> None:
    with pytest.raises(ValueError, match=r"5\.\.4"):
        store().get("t", P, 5, 4, now=0.0)


@pytest.mark.parametrize(
    ("limits", "error"),
    [
        ({"max_messages": -1}, "max_messages must be >= 0"),
        ({"max_bytes": -1}, "max_bytes must be >= 0"),
        ({"max_age": 0}, "max_age must be > 0 seconds, not 0"),
    ],
)
def test_bad_limits_are_refused(limits: dict[str, float], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        RetentionConfig(**limits)  # type: ignore[arg-type]
