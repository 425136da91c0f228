"""Bounded answers, unit by unit: a GETHELD's cost follows its answer's size, an answer lane
keeps its bounds and merges repeats, and a request budget throttles, then drops."""

from __future__ import annotations

from episub.net.answers import (
    ANSWER_MAX_BYTES,
    ANSWER_MAX_ITEMS,
    REQUEST_WORK_BURST,
    REQUEST_WORK_PER_SECOND,
    AnswerCounters,
    AnswerLane,
    RequestBudget,
    Verdict,
)
from episub.proto.envelope import Envelope
from episub.proto.messages import MAX_HELD_SPANS, GetHeld
from episub.proto.store import MessageStore, RetentionConfig

TOPIC = "t"


def hold(store: MessageStore, publisher: bytes, seq: int, timestamp_ms: int, n: int) -> None:
    """Message n (its id made of n) of `publisher` at `seq`, in the store."""
    envelope = Envelope(publisher=publisher, seq=seq, timestamp_ms=timestamp_ms, payload=b"x")
    store.add(store.places(TOPIC), n.to_bytes(32, "big"), envelope, 1, 0.0)


def store_of(publishers: int) -> MessageStore:
    store = MessageStore(RetentionConfig(max_messages=1_000_000))
    for i in range(publishers):
        hold(store, b"p%06d" % i, 0, 1000 + i, i)
    return store


def page_work(store: MessageStore, query: GetHeld) -> tuple[int, int]:
    """(spans answered, store work) of one GETHELD."""
    before = store.work
    held = store.held_page(TOPIC, query, now=0.0)
    return len(held.spans), store.work - before


def test_a_getheld_page_costs_work_bounded_by_its_answer_not_by_the_publishers_held() -> None:
    small, large = store_of(300), store_of(20_000)
    for query in (GetHeld(), GetHeld(after=b"p000100"), GetHeld(since_ms=1)):
        _, work_small = page_work(small, query)
        answered_large, work_large = page_work(large, query)
        assert answered_large == MAX_HELD_SPANS
        # Rows looked at: a few per span answered (a binary search for since_ms), never
        # one per publisher held.
        assert work_large <= 4 * answered_large + 1, (query, work_large)
        assert work_large <= work_small * 2, (query, work_small, work_large)


def test_paging_through_every_publisher_visits_each_once() -> None:
    store = store_of(1000)
    seen: list[bytes] = []
    after, more = b"", True
    while more:
        held = store.held_page(TOPIC, GetHeld(after=after), now=0.0)
        seen += [s.publisher for s in held.spans]  # type: ignore[misc]
        after, more = seen[-1], held.more
    assert seen == sorted(b"p%06d" % i for i in range(1000))


def test_first_since_is_a_binary_search_over_a_publishers_seqs() -> None:
    store = MessageStore(RetentionConfig(max_messages=1_000_000))
    for seq in range(100_000):
        hold(store, b"p", seq, seq, seq)
    before = store.work
    assert store.first_since(TOPIC, b"p", 77_777, now=0.0) == 77_777
    assert store.first_since(TOPIC, b"p", 100_000, now=0.0) is None
    assert store.work - before <= 2 * 18


def test_a_lane_merges_repeats_and_drops_past_its_bounds() -> None:
    counters = AnswerCounters()
    lane = AnswerLane(now=0.0)
    for _ in range(100):
        for seq in range(48):
            lane.add(("t", seq), 1_000_000, lambda: b"", counters)
    assert len(lane) == 48 and counters.answers_merged == 99 * 48
    assert lane.bytes == 48_000_000 and counters.answers_dropped == 0
    for seq in range(100, 100 + ANSWER_MAX_ITEMS):
        lane.add(("t", seq), 1, lambda: b"", counters)
    assert len(lane) == ANSWER_MAX_ITEMS and counters.answers_dropped == 48
    lane.add(("t", -1), ANSWER_MAX_BYTES, lambda: b"", counters)  # past the bytes too
    assert counters.answers_dropped == 49
    lane.cancel(counters)
    assert len(lane) == 0 and lane.bytes == 0


def test_a_request_budget_throttles_then_says_drop_the_peer() -> None:
    budget = RequestBudget(now=0.0)
    verdicts = [budget.charge(MAX_HELD_SPANS, now=0.0) for _ in range(1000)]
    served = verdicts.count(Verdict.OK)
    assert served == -(-REQUEST_WORK_BURST // MAX_HELD_SPANS)
    assert Verdict.THROTTLED in verdicts and verdicts[-1] is Verdict.OVER
    # A peer that pauses is served again: the bucket refills at the rate.
    later = RequestBudget(now=0.0)
    for _ in range(int(REQUEST_WORK_BURST // MAX_HELD_SPANS) + 1):
        later.charge(MAX_HELD_SPANS, now=0.0)
    assert later.charge(1, now=0.0) is Verdict.THROTTLED
    assert later.charge(1, now=2 * REQUEST_WORK_BURST / REQUEST_WORK_PER_SECOND) is Verdict.OK
