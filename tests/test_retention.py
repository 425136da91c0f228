"""The retention store: ranges by (topic, publisher, seq), bounded by count, bytes and age."""

from __future__ import annotations

import pytest
from blake3 import blake3

from episub.proto.store import RetentionConfig, RetentionStore, Span
from episub.subscription import Delivery

P = b"127.0.0.1:1/0000000000000001"
Q = b"127.0.0.1:2/0000000000000002"


def msg(
    seq: int,
    *,
    topic: str = "t",
    publisher: bytes = P,
    value: bytes = b"v",
    timestamp_ms: int = 0,
    mid: bytes | None = None,
) -> Delivery:
    return Delivery(
        topic=topic,
        publisher=publisher,
        seq=seq,
        timestamp_ms=timestamp_ms,
        key=None,
        value=value,
        headers=(),
        id=mid if mid is not None else blake3(value).digest(),
    )


def store(**limits: float) -> RetentionStore[Delivery]:
    return RetentionStore(RetentionConfig(**limits))  # type: ignore[arg-type]


def seqs(messages: list[Delivery]) -> list[int]:
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


def test_a_place_keeps_one_message_the_earliest_stamped_whatever_the_order() -> None:
    """Two writes of one sink row with other stamps (a retried task): every node keeps the
    earlier one, whichever reached it first, and the byte count follows."""
    first, retry = msg(0, value=b"old", timestamp_ms=5), msg(0, value=b"newer", timestamp_ms=9)
    for order in ((first, retry), (retry, first)):
        s = store()
        for m in order:
            s.add(m, now=0.0)
        assert [m.value for m in s.get("t", P, 0, 0, now=1.0)] == [b"old"]
        assert len(s) == 1 and s.bytes == 3


def test_equal_stamps_are_broken_by_the_smaller_id_and_the_same_message_changes_nothing() -> None:
    s = store()
    assert s.add(msg(0, value=b"a", mid=b"\x02" * 32), now=0.0)
    assert not s.add(msg(0, value=b"b", mid=b"\x03" * 32), now=0.0)
    assert s.add(msg(0, value=b"c", mid=b"\x01" * 32), now=0.0)
    assert not s.add(msg(0, value=b"c", mid=b"\x01" * 32), now=1.0)
    assert [m.value for m in s.get("t", P, 0, 0, now=1.0)] == [b"c"] and s.replaced == 1


def test_offsets_say_first_last_and_count_per_publisher_and_follow_eviction() -> None:
    s = store(max_messages=5)
    for seq in range(4):
        s.add(msg(seq, value=b"%d" % seq), now=float(seq))
    s.add(msg(7, publisher=Q), now=4.0)
    assert s.offsets("t", now=4.0) == {P: Span(0, 3, 4), Q: Span(7, 7, 1)}
    s.add(msg(9, publisher=Q, value=b"9"), now=5.0)  # evicts P's seq 0
    assert s.offsets("t", now=5.0) == {P: Span(1, 3, 3), Q: Span(7, 9, 2)}
    assert s.span("t", Q, 8, 100, now=5.0) == Span(9, 9, 1)
    assert s.span("t", Q, 0, 6, now=5.0) is None
    assert s.offsets("nothing", now=5.0) == {}


def test_first_since_finds_the_first_seq_stamped_at_or_after_a_time() -> None:
    s = store()
    for seq in range(5):
        s.add(msg(seq, value=b"%d" % seq, timestamp_ms=100 * seq), now=0.0)
    assert s.first_since("t", P, 250, now=0.0) == 3
    assert s.first_since("t", P, 0, now=0.0) == 0
    assert s.first_since("t", P, 401, now=0.0) is None
    assert s.first_since("t", Q, 0, now=0.0) is None


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


def test_ids_come_back_as_given_through_compaction_and_a_longer_one_is_refused() -> None:
    """Ids are packed 32 bytes a row (no bytes object each): a shorter one comes back as
    given, not padded, after the rows before it were compacted away; a longer one is an
    error before anything is stored."""
    s = store(max_messages=5)
    for seq in range(5000):  # past the compaction threshold (4096 spent rows)
        mid = b"\x01" + seq.to_bytes(2, "big") if seq % 2 else blake3(bytes([seq % 256])).digest()
        assert s.add(msg(seq, mid=mid), now=0.0)
    got = s.entries("t", P, 0, 10_000, now=0.0)
    assert [seq for seq in range(4995, 5000)] == [d.seq for _, d in got]
    assert [mid for mid, _ in got] == [d.id for _, d in got]
    assert got[0][0] == b"\x01" + (4995).to_bytes(2, "big")
    with pytest.raises(ValueError, match="at most 32 bytes"):
        s.add(msg(6000, mid=b"x" * 33), now=0.0)
    assert len(s) == 5 and s.span("t", P, 0, 10_000, now=0.0) == Span(4995, 4999, 5)
