"""The message store's rules, one at a time: ranges by (topic, publisher, seq), bounded by
count, bytes and age, one message per place, and what history reads cost."""

from __future__ import annotations

import pytest

from episub.proto.envelope import MAX_SEQ, Envelope
from episub.proto.messages import GetHeld, HeldSpan
from episub.proto.store import MessageStore, RetentionConfig, Span
from tests.helpers import mid as message_id

P = b"127.0.0.1:1/0000000000000001"
Q = b"127.0.0.1:2/0000000000000002"


def store(**limits: float) -> MessageStore:
    return MessageStore(RetentionConfig(**limits))  # type: ignore[arg-type]


def envelope(
    seq: int, *, publisher: bytes = P, value: bytes = b"v", timestamp_ms: int = 0
) -> Envelope:
    return Envelope(publisher=publisher, seq=seq, timestamp_ms=timestamp_ms, payload=value)


def id_of(seq: int, value: bytes = b"v") -> bytes:
    """The id `put` gives P's message `seq` with `value` on topic "t", stamped 0."""
    return message_id(envelope(seq, value=value))


def put(
    s: MessageStore,
    seq: int,
    *,
    topic: str = "t",
    publisher: bytes = P,
    value: bytes = b"v",
    timestamp_ms: int = 0,
    now: float = 0.0,
    mid: bytes | None = None,
) -> int | None:
    """A first copy taken in as broadcast takes it: the winner rule for its place
    (`takes_place`), then `add`. Its serial; -1 when its id was seen; None when the message
    at its place keeps it."""
    env = envelope(seq, publisher=publisher, value=value, timestamp_ms=timestamp_ms)
    mid = mid if mid is not None else message_id(env, topic)
    places = s.places(topic)
    if s.takes_place(places, publisher, seq, timestamp_ms, mid) >= 0:
        return None
    return s.add(places, mid, env, hops=1, now=now)


def seqs(raws: list[bytes]) -> list[int]:
    return [Envelope.decode(raw).seq for raw in raws]


def values(raws: list[bytes]) -> list[bytes]:
    return [Envelope.decode(raw).payload for raw in raws]


# -- ranges ---------------------------------------------------------------------------------


def test_a_range_comes_back_in_sequence_order_with_absent_ones_skipped() -> None:
    s = store()
    for seq in (3, 1, 2, 5):
        put(s, seq, value=b"%d" % seq)
    assert seqs(s.get("t", P, 1, 5, now=0.0)) == [1, 2, 3, 5]
    assert seqs(s.get("t", P, 2, 3, now=0.0)) == [2, 3]
    assert s.get("t", P, 6, 9, now=0.0) == []
    assert s.seqs("t", P, 0, 4, now=0.0) == [1, 2, 3]
    got = s.entries("t", P, 0, 9, now=0.0)
    assert [Envelope.decode(raw).seq for _, raw in got] == [1, 2, 3, 5]
    envs = [envelope(q, value=b"%d" % q) for q in (1, 2, 3, 5)]
    assert got == [(message_id(env), env.raw) for env in envs]


def test_a_huge_range_does_not_walk_every_sequence_number() -> None:
    s = store()
    put(s, 7)
    put(s, MAX_SEQ, value=b"last")
    assert seqs(s.get("t", P, 0, MAX_SEQ, now=0.0)) == [7, MAX_SEQ]
    assert s.span("t", P, 0, MAX_SEQ, now=0.0) == Span(7, MAX_SEQ, 2)


def test_topics_and_publishers_are_kept_apart() -> None:
    s = store()
    put(s, 0)
    put(s, 0, publisher=Q, value=b"q")
    put(s, 0, topic="u", value=b"u")
    assert values(s.get("t", P, 0, 0, now=0.0)) == [b"v"]
    assert values(s.get("t", Q, 0, 0, now=0.0)) == [b"q"]
    assert values(s.get("u", P, 0, 0, now=0.0)) == [b"u"]
    assert s.get("u", Q, 0, 0, now=0.0) == []
    assert set(s.offsets("t", now=0.0)) == {P, Q} and set(s.offsets("u", now=0.0)) == {P}


# -- bounds ---------------------------------------------------------------------------------


def test_past_max_messages_the_oldest_stored_goes_first_whatever_its_topic() -> None:
    s = store(max_messages=2)
    put(s, 0, topic="a", now=0.0)
    put(s, 0, topic="b", now=1.0)
    put(s, 1, topic="b", value=b"w", now=2.0)
    assert s.get("a", P, 0, 0, now=2.0) == []
    assert seqs(s.get("b", P, 0, 1, now=2.0)) == [0, 1]
    assert len(s) == 2 and s.evicted == 1 and s.bytes == 2


def test_past_max_bytes_the_oldest_go_until_it_fits() -> None:
    s = store(max_bytes=10)
    for seq in range(3):
        put(s, seq, value=b"%d" % seq * 4)
    assert seqs(s.get("t", P, 0, 2, now=0.0)) == [1, 2]
    assert s.bytes == 8 and s.released == 4


def test_messages_age_out_after_max_age() -> None:
    s = store(max_age=10.0)
    put(s, 0, now=0.0)
    put(s, 1, value=b"w", now=5.0)
    assert seqs(s.get("t", P, 0, 1, now=9.9)) == [0, 1]
    assert seqs(s.get("t", P, 0, 1, now=10.0)) == [1]
    assert s.get("t", P, 0, 1, now=15.0) == [] and len(s) == 0 and s.bytes == 0


def test_an_add_expires_what_aged_meanwhile_without_a_read() -> None:
    s = store(max_age=10.0, seen_ttl=20.0)
    first = put(s, 0, now=0.0)
    assert first is not None and first >= 0
    put(s, 1, value=b"w", now=10.0)  # seq 0 is max_age old now: its bytes go, its id stays
    assert len(s) == 1 and s.bytes == 1 and s.evicted == 1
    assert s.find(id_of(0)) == -1 and s.cached(id_of(0)) is None and id_of(0) in s.seen


def test_ids_are_seen_longer_than_bytes_are_held_and_never_the_other_way() -> None:
    s = store(max_messages=1, seen_max=2)
    for seq in range(3):
        put(s, seq, value=b"%d" % seq)
    ids = [id_of(q, b"%d" % q) for q in range(3)]
    assert [i in s.seen for i in ids] == [False, True, True] and len(s.seen) == 2
    assert [s.cached(i) is not None for i in ids] == [False, False, True]
    assert put(s, 1, value=b"1") == -1  # still seen: a second copy changes nothing
    # A seen bound tighter than the bytes' takes the bytes with the ids.
    t = store(seen_max=1)
    put(t, 0)
    put(t, 1, value=b"w")
    assert len(t) == 1 and len(t.seen) == 1 and seqs(t.get("t", P, 0, 1, now=0.0)) == [1]
    u = store(max_age=10.0, seen_ttl=1.0)
    put(u, 0, now=0.0)
    assert u.get("t", P, 0, 0, now=1.0) == [] and len(u.seen) == 0 and len(u) == 0


# -- one message per place ------------------------------------------------------------------


def test_a_place_keeps_one_message_the_earliest_stamped_whatever_the_order() -> None:
    """Two writes of one sink row with other stamps (a retried task): every node keeps the
    earlier one, whichever reached it first, and the byte count follows."""
    first = {"value": b"old", "timestamp_ms": 5}
    retry = {"value": b"newer", "timestamp_ms": 9}
    for order in ((first, retry), (retry, first)):
        s = store()
        for fields in order:
            put(s, 0, **fields)  # type: ignore[arg-type]
        assert values(s.get("t", P, 0, 0, now=1.0)) == [b"old"]
        assert len(s) == 1 and s.bytes == 3
        assert s.replaced == (1 if order[0] is retry else 0)
        assert s.released == (5 if order[0] is retry else 0)


def test_equal_stamps_are_broken_by_the_smaller_id_and_the_same_message_changes_nothing() -> None:
    s = store()
    places = s.places("t")
    assert put(s, 0, value=b"a", mid=b"\x02" * 32) == 0
    assert s.takes_place(places, P, 0, 0, b"\x03" * 32) == 0  # the keeper's serial
    assert put(s, 0, value=b"b", mid=b"\x03" * 32) is None
    assert s.takes_place(places, P, 0, 0, b"\x01" * 32) == -2  # it wins over the one there
    assert put(s, 0, value=b"c", mid=b"\x01" * 32) == 1
    assert s.takes_place(places, P, 0, 0, b"\x01" * 32) == -1  # the same message: no rival
    assert put(s, 0, value=b"c", mid=b"\x01" * 32, now=1.0) == -1
    assert s.takes_place(places, P, 1, 0, b"\x09" * 32) == -1  # nothing there
    assert values(s.get("t", P, 0, 0, now=1.0)) == [b"c"] and s.replaced == 1
    assert s.place(places, P, 0) == b"\x01" * 32 and s.place_of(b"\x01" * 32) == (P, 0)
    assert s.cached(b"\x02" * 32) is None and b"\x02" * 32 in s.seen
    assert len(s) == 1 and s.bytes == 1


def test_an_earlier_stamp_wins_whatever_the_ids() -> None:
    s = store()
    assert put(s, 0, value=b"late", timestamp_ms=2, mid=b"\x00" * 32) == 0
    assert put(s, 0, value=b"early", timestamp_ms=1, mid=b"\xff" * 32) == 1
    assert put(s, 0, value=b"later", timestamp_ms=3, mid=b"\x00" * 31 + b"\x01") is None
    assert values(s.get("t", P, 0, 0, now=0.0)) == [b"early"]


# -- what is held, and what it costs to ask ---------------------------------------------------


def test_offsets_say_first_last_and_count_per_publisher_and_follow_eviction() -> None:
    s = store(max_messages=5)
    for seq in range(4):
        put(s, seq, value=b"%d" % seq, now=float(seq))
    put(s, 7, publisher=Q, now=4.0)
    assert s.offsets("t", now=4.0) == {P: Span(0, 3, 4), Q: Span(7, 7, 1)}
    put(s, 9, publisher=Q, value=b"9", now=5.0)  # evicts P's seq 0
    assert s.offsets("t", now=5.0) == {P: Span(1, 3, 3), Q: Span(7, 9, 2)}
    assert s.span("t", Q, 8, 100, now=5.0) == Span(9, 9, 1)
    assert s.span("t", Q, 0, 6, now=5.0) is None
    assert s.span("t", b"nobody", 0, 6, now=5.0) is None
    assert s.offsets("nothing", now=5.0) == {}
    assert s.holds("t") and not s.holds("nothing")


def test_a_page_follows_its_cursor_and_costs_the_page_not_the_publishers() -> None:
    s = store()
    publishers = [b"p%02d" % i for i in range(10)]
    for i, publisher in enumerate(reversed(publishers)):
        put(s, i, publisher=publisher)
    before = s.work
    page, more = s.page("t", b"", 3, now=0.0)
    assert [p for p, _ in page] == publishers[:3] and more
    assert page[0][1] == Span(9, 9, 1)
    assert s.work - before == 4
    page, more = s.page("t", b"p03", 100, now=0.0)
    assert [p for p, _ in page] == publishers[4:] and not more
    before = s.work
    assert s.page("t", b"p09", 3, now=0.0) == ([], False) and s.work - before == 1
    assert s.page("none", b"", 3, now=0.0) == ([], False)


def test_a_span_of_a_whole_stream_costs_one_and_of_part_of_it_the_seqs_looked_at() -> None:
    s = store()
    for seq in (*range(10), 20):
        put(s, seq)
    before = s.work
    assert s.span("t", P, 0, 100, now=0.0) == Span(0, 20, 11)
    assert s.work - before == 1
    before = s.work
    assert s.span("t", P, 3, 5, now=0.0) == Span(3, 5, 3)
    assert s.work - before == 1 + 3
    assert s.span("t", P, 10, 19, now=0.0) is None  # a hole: looked at, nothing held


def test_first_since_finds_the_first_seq_stamped_at_or_after_a_time() -> None:
    s = store()
    for seq in range(5):
        put(s, seq, value=b"%d" % seq, timestamp_ms=100 * seq)
    assert s.first_since("t", P, 250, now=0.0) == 3
    assert s.first_since("t", P, 300, now=0.0) == 3
    assert s.first_since("t", P, 0, now=0.0) == 0
    assert s.first_since("t", P, 401, now=0.0) is None
    assert s.first_since("t", Q, 0, now=0.0) is None


def test_first_since_is_a_binary_search_over_a_publishers_seqs() -> None:
    s = store()
    for seq in range(4096):
        put(s, seq, timestamp_ms=seq)
    before = s.work
    assert s.first_since("t", P, 3000, now=0.0) == 3000
    assert s.first_since("t", P, 5000, now=0.0) is None
    assert s.work - before <= 2 * 13


def test_held_page_answers_a_page_or_the_asked_spans_with_since() -> None:
    s = store()
    for seq in range(5):
        put(s, seq, value=b"%d" % seq, timestamp_ms=100 * seq)
    put(s, 3, publisher=Q, timestamp_ms=50)
    held = s.held_page("t", GetHeld(nonce=7), now=0.0)
    assert held.nonce == 7 and not held.more
    assert [(h.publisher, h.first_seq, h.last_seq, h.count, h.since_seq) for h in held.spans] == [
        (P, 0, 4, 5, 0),
        (Q, 3, 3, 1, 3),
    ]
    held = s.held_page("t", GetHeld(since_ms=250), now=0.0)
    assert [(h.publisher, h.since_seq) for h in held.spans] == [(P, 3), (Q, 4)]  # Q: none
    asked = GetHeld(spans=(HeldSpan(publisher=P, first_seq=1, last_seq=2),), since_ms=250)
    held = s.held_page("t", asked, now=0.0)
    assert [(h.first_seq, h.last_seq, h.count, h.since_seq) for h in held.spans] == [(1, 2, 2, 3)]
    held = s.held_page("t", GetHeld(after=P), now=0.0)
    assert [h.publisher for h in held.spans] == [Q]


def test_a_topic_that_offers_no_history_shows_none_but_still_answers_grafts_and_pulls() -> None:
    s = store()
    s.offer_history("quiet", False)
    for seq in range(3):
        assert put(s, seq, topic="quiet", value=b"%d" % seq, timestamp_ms=seq) == seq
    put(s, 0, topic="t")
    assert s.offsets("quiet", now=0.0) == {} and not s.holds("quiet")
    assert s.get("quiet", P, 0, MAX_SEQ, now=0.0) == []
    assert s.entries("quiet", P, 0, MAX_SEQ, now=0.0) == []
    assert s.seqs("quiet", P, 0, MAX_SEQ, now=0.0) == []
    assert s.span("quiet", P, 0, MAX_SEQ, now=0.0) is None
    assert s.first_since("quiet", P, 0, now=0.0) is None
    assert s.page("quiet", b"", 10, now=0.0) == ([], False)
    assert s.held_page("quiet", GetHeld(), now=0.0).spans == ()
    asked = GetHeld(spans=(HeldSpan(publisher=P, first_seq=0, last_seq=9),))
    assert s.held_page("quiet", asked, now=0.0).spans == ()
    assert s.offsets("t", now=0.0) == {P: Span(0, 0, 1)}  # other topics are not hidden
    places = s.places("quiet")
    at = s.lookup(places)(P, 1)
    assert at is not None and at.envelope.payload == b"1" and at.publisher == P
    read = s.reader(places, P, now=0.0)
    before = s.work
    got = read(2)
    assert got is not None and Envelope.decode(got[0]).payload == b"2" and got[1] == 1
    assert read(3) is None and s.work - before == 2
    s.offer_history("quiet", True)  # offered again: the same messages show
    assert s.offsets("quiet", now=0.0) == {P: Span(0, 2, 3)}


def test_a_reader_skips_what_aged_and_counts_each_look_up() -> None:
    s = store(max_age=10.0)
    put(s, 0, now=0.0)
    put(s, 1, value=b"w", now=5.0)
    places = s.places("t")
    before = s.work
    read = s.reader(places, P, now=12.0)  # seq 0 aged, not yet expired
    assert read(0) is None
    got = read(1)
    assert got is not None and Envelope.decode(got[0]).payload == b"w"
    assert s.work - before == 2
    none = s.reader(places, Q, now=0.0)
    assert none(0) is None and s.work - before == 3


# -- refusals -------------------------------------------------------------------------------


def test_a_bad_range_is_an_error_showing_it() -> None:
    with pytest.raises(ValueError, match=r"5\.\.4"):
        store().get("t", P, 5, 4, now=0.0)


@pytest.mark.parametrize(
    ("limits", "error"),
    [
        ({"max_messages": 0}, "max_messages must be an int >= 1, not 0"),
        ({"max_messages": -1}, "max_messages must be an int >= 1"),
        ({"max_messages": 2.5}, "max_messages must be an int >= 1"),
        ({"max_bytes": 0}, "max_bytes must be an int >= 1, not 0"),
        ({"seen_max": 0}, "seen_max must be an int >= 1, not 0"),
        ({"max_age": 0}, "max_age must be > 0 seconds, not 0"),
        ({"max_age": -1.0}, "max_age must be > 0 seconds"),
        ({"seen_ttl": 0}, "seen_ttl must be > 0 seconds, not 0"),
    ],
)
def test_bad_limits_are_refused(limits: dict[str, float], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        RetentionConfig(**limits)  # type: ignore[arg-type]


def test_ids_come_back_as_given_through_compaction_and_a_wrong_size_one_is_refused() -> None:
    """Ids are packed 32 bytes a row (no bytes object each): they come back as given after
    the rows before them were compacted away; an id of another size is an error before
    anything is stored."""
    s = store(max_messages=5)
    ids = [seq.to_bytes(2, "big") * 16 for seq in range(5000)]  # past 4096 spent rows
    for seq, mid in enumerate(ids):
        assert put(s, seq, mid=mid) == seq
    got = s.entries("t", P, 0, 10_000, now=0.0)
    assert [mid for mid, _ in got] == ids[-5:]
    assert seqs([raw for _, raw in got]) == list(range(4995, 5000))
    assert s._base > 0  # the columns were compacted
    for bad in (b"x" * 33, b"x" * 31):
        with pytest.raises(ValueError, match="32 bytes"):
            put(s, 6000, mid=bad)
    assert len(s) == 5 and len(s.seen) == 5000
    assert s.span("t", P, 0, 10_000, now=0.0) == Span(4995, 4999, 5)
