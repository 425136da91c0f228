"""The source's offset planner (spark_connector/planner.py), with no Spark: holdings in,
offsets and ranges out, time stepped by hand. One test per rule of the module's docstring,
and the pipeline simulation of issue 15's acceptance 3 (offsets stay bounded)."""

from __future__ import annotations

import dataclasses
import json
import logging
import random
from collections import deque

import pytest

from episub.proto.messages import HeldSpan
from episub.recordbatch import BATCH_HEADER, encode
from episub.subscription import Delivery
from spark_connector.planner import (
    GONE_GRACE,
    NEW_MARK,
    DataLossError,
    Holding,
    OffsetPlanner,
    Range,
    pack,
    union,
)
from spark_connector.rowmap import MixedStreamError, StreamRows

T = "t"


def held(first: int, last: int, *holders: bytes) -> Holding:
    return Holding(first=first, last=last, holders=holders or (b"n1",))


def planner(**kw: object) -> OffsetPlanner:
    return OffsetPlanner(fail_on_data_loss=kw.pop("fail", True), **kw)  # type: ignore[arg-type]


# -- what is held: the union of every reachable node's answer ----------------------------


def test_the_union_takes_the_lowest_first_and_highest_last_and_names_who_holds_the_first() -> None:
    a = [HeldSpan(publisher=b"p", first_seq=5, last_seq=9, count=5)]
    b = [HeldSpan(publisher=b"p", first_seq=0, last_seq=7, count=8)]
    control = [HeldSpan(publisher=b"_episub/sink/q", first_seq=0, last_seq=3, count=4)]
    held_ = union([(b"a", a), (b"b", [*b, *control]), (b"", [])])
    assert held_ == {"p": Holding(first=0, last=9, holders=(b"b", b"a"), since=0)}


def test_the_union_of_times_is_the_earliest_seq_stamped_late_enough_anywhere() -> None:
    early = HeldSpan(publisher=b"p", first_seq=0, last_seq=9, count=10, since_seq=10)  # none
    late = HeldSpan(publisher=b"p", first_seq=4, last_seq=12, count=9, since_seq=11)
    assert union([(b"a", [early]), (b"b", [late])])["p"].since == 11
    assert union([(b"a", [early])])["p"].since == 10  # none that recent: after the last


# -- where a query starts -----------------------------------------------------------------


def test_earliest_latest_and_json_with_kafkas_minus_two_and_minus_one() -> None:
    holdings = {T: {"p": held(3, 9), "q": held(0, 4)}}
    p = planner()
    assert p.start_offsets([T], "earliest", holdings) == {T: {"p": 3, "q": 0}}
    assert p.start_offsets([T], "latest", holdings) == {T: {"p": 10, "q": 5}}
    named = {T: {"p": -2, "q": -1, "gone": -2, "r": 7}}
    assert p.start_offsets([T], named, holdings) == {T: {"p": 3, "q": 5, "r": 7}}


def test_a_starting_time_starts_each_publisher_at_its_first_row_stamped_then_or_later() -> None:
    holdings = {T: {"p": Holding(0, 9, (b"a",), since=4), "q": Holding(0, 5, (b"a",), since=6)}}
    with pytest.raises(DataLossError, match="startingOffsetsByTimestampStrategy=latest"):
        planner().start_offsets([T], "latest", holdings, by_time=True)
    start = planner().start_offsets([T], "latest", holdings, by_time=True, strategy_latest=True)
    assert start == {T: {"p": 4, "q": 6}}


# -- each micro-batch ---------------------------------------------------------------------


def test_a_new_publisher_is_read_in_the_batch_that_finds_it_from_its_earliest_held_row() -> None:
    """Issue 15: the driver's node was asked twice (held, then available), so a publisher
    seen only in the second answer entered at seq 0 and the next batch raised DataLossError.
    One answer now: it starts where it is held from. Issue 16: and it is read in the batch
    that finds it, as Kafka reads a new partition; its start travels in the end offsets, so
    a planner that remembers nothing (a re-run after a restart) reads the same rows."""
    p = planner()
    end = p.latest({T: {}}, [T], {T: {"p": held(100, 120)}}, now=0.0)
    assert end == {T: {"p": 121, NEW_MARK + "p": 100}}
    assert p.ranges({T: {}}, end) == [Range(T, "p", 100, 120, (b"n1",))]
    assert planner().ranges({T: {}}, end) == [Range(T, "p", 100, 120)]  # nothing remembered
    later = p.latest(end, [T], {T: {"p": held(100, 130)}}, now=1.0)
    assert later == {T: {"p": 131}}  # the mark is gone: p is in the start now
    assert p.ranges(end, later) == [Range(T, "p", 121, 130, (b"n1",))]


def test_a_new_publisher_shares_max_rows_with_the_others() -> None:
    holdings = {T: {"old": held(0, 999), "new": held(50, 999)}}
    end = planner().latest({T: {"old": 0}}, [T], holdings, now=0.0, max_rows=100)
    assert end == {T: {"old": 50, "new": 100, NEW_MARK + "new": 50}}


def test_rows_nobody_holds_fail_the_batch_naming_them() -> None:
    with pytest.raises(DataLossError, match=r"'p': seqs 10\.\.19 \(10 rows\) are held by no"):
        planner().latest({T: {"p": 10}}, [T], {T: {"p": held(20, 30)}}, now=0.0)


def test_skipped_rows_are_warned_once_with_their_count_and_not_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    p = planner(fail=False)
    start = {T: {"p": 10}}
    with caplog.at_level(logging.WARNING, logger="spark_connector.source"):
        end = p.latest(start, [T], {T: {"p": held(20, 30)}}, now=0.0)
        p.latest(start, [T], {T: {"p": held(20, 30)}}, now=0.5)  # the same batch, planned again
    assert end == {T: {"p": 31}}
    assert [r.message.split(":")[0] for r in caplog.records] == ["skipping 10 lost rows"]
    assert p.ranges(start, end) == [Range(T, "p", 20, 30, (b"n1",))]
    assert p.skipped_rows == 10


def test_rows_held_anywhere_reachable_are_no_loss_though_the_drivers_node_lost_them() -> None:
    """Issue 15: a restarted driver's node holds nothing old; an executor's node does."""
    answers = [
        (b"driver", []),
        (b"executor", [HeldSpan(publisher=b"p", first_seq=0, last_seq=99, count=100)]),
    ]
    p = planner()
    end = p.latest({T: {"p": 40}}, [T], {T: union(answers)}, now=0.0)
    assert p.ranges({T: {"p": 40}}, end) == [Range(T, "p", 40, 99, (b"executor",))]


def test_max_rows_is_shared_fairly_between_publishers() -> None:
    holdings = {T: {"busy": held(0, 999), "quiet": held(0, 4)}}
    end = planner().latest({T: {"busy": 0, "quiet": 0}}, [T], holdings, now=0.0, max_rows=25)
    assert end == {T: {"busy": 20, "quiet": 5}}


def test_min_rows_holds_a_batch_back_until_enough_wait_or_the_delay_has_passed() -> None:
    p = planner(min_rows=10, max_trigger_delay=5.0, now=0.0)
    start = {T: {"p": 0}}
    assert p.latest(start, [T], {T: {"p": held(0, 3)}}, now=1.0) == start
    assert p.latest(start, [T], {T: {"p": held(0, 9)}}, now=2.0) == {T: {"p": 10}}
    start = {T: {"p": 10}}
    assert p.latest(start, [T], {T: {"p": held(0, 12)}}, now=6.0) == start  # 4 s since
    assert p.latest(start, [T], {T: {"p": held(0, 12)}}, now=7.5) == {T: {"p": 13}}


def test_available_now_reads_up_to_its_target_and_no_publisher_that_came_after() -> None:
    target = {T: {"p": 5}}
    end = planner().latest(
        {T: {"p": 0}}, [T], {T: {"p": held(0, 9), "new": held(0, 2)}}, now=0.0, target=target
    )
    assert end == {T: {"p": 5}}


def test_a_publisher_held_nowhere_leaves_the_offsets_after_the_grace() -> None:
    p = planner()
    start = {T: {"p": 10, "q": 3}}
    holdings = {T: {"p": held(0, 9), "q": held(0, 2)}}
    end = p.latest(start, [T], holdings, now=0.0)
    assert end == start
    gone = {T: {"q": held(0, 2)}}
    assert p.latest(end, [T], gone, now=1.0) == start  # out of reach for a moment, maybe
    assert p.latest(end, [T], gone, now=1.0 + GONE_GRACE) == {T: {"q": 3}}


def test_a_publisher_whose_unread_rows_vanish_from_every_node_lost_them() -> None:
    p = planner()
    p.latest({T: {"p": 0}}, [T], {T: {"p": held(0, 9)}}, now=0.0, max_rows=5)
    assert p.latest({T: {"p": 5}}, [T], {T: {}}, now=1.0) == {T: {"p": 5}}  # a moment?
    with pytest.raises(DataLossError, match=r"seqs 5\.\.9 \(5 rows\)"):
        p.latest({T: {"p": 5}}, [T], {T: {}}, now=1.0 + GONE_GRACE)


# -- the ranges a batch reads ---------------------------------------------------------------


def test_pack_cuts_big_ranges_and_puts_small_ones_together() -> None:
    ranges = [Range(T, "a", 0, 24), Range(T, "b", 0, 2), Range(T, "c", 5, 6)]
    tasks = pack(ranges, max_rows=10)
    assert [[(r.publisher, r.first_seq, r.last_seq) for r in task] for task in tasks] == [
        [("a", 0, 9)],
        [("a", 10, 19)],
        [("a", 20, 24), ("b", 0, 2), ("c", 5, 6)],
    ]
    assert len(pack([Range(T, "a", 0, 99)], max_rows=1000, min_partitions=4)) == 4


def test_a_batch_read_ends_at_latest_json_or_a_time() -> None:
    holdings = {T: {"p": Holding(0, 9, (b"a",), since=6), "q": Holding(2, 4, (b"a",), since=5)}}
    p = planner()
    assert p.end_of_batch_read([T], "latest", holdings) == {T: {"p": 10, "q": 5}}
    assert p.end_of_batch_read([T], {T: {"p": -1, "q": 3}}, holdings) == {T: {"p": 10, "q": 3}}
    assert p.end_of_batch_read([T], "latest", holdings, by_time=True) == {T: {"p": 6, "q": 5}}


# -- acceptance 3: offsets stay bounded over a long sink-to-source pipeline -------------------


class SimulatedTopic:
    """What every node of a topic holds, with time-based retention: per publisher, the
    seqs published in the last `max_age` seconds."""

    def __init__(self, max_age: float) -> None:
        self.max_age = max_age
        self.streams: dict[str, deque[tuple[int, float]]] = {}

    def publish(self, publisher: str, count: int, now: float) -> None:
        stream = self.streams.setdefault(publisher, deque())
        next_seq = stream[-1][0] + 1 if stream else self._next.get(publisher, 0)
        for i in range(count):
            stream.append((next_seq + i, now))
        self._next[publisher] = next_seq + count

    _next: dict[str, int] = {}

    def holdings(self, now: float) -> dict[str, Holding]:
        out = {}
        for publisher, stream in list(self.streams.items()):
            while stream and stream[0][1] + self.max_age <= now:
                stream.popleft()
            if not stream:
                del self.streams[publisher]
                continue
            out[publisher] = Holding(stream[0][0], stream[-1][0], (b"node",))
        return out


def test_ten_thousand_planned_batches_of_a_sink_to_source_pipeline_keep_the_offsets_bounded() -> (
    None
):
    """A sink writes each batch's rows to per-partition streams (sink.py's keying); its
    driver restarts three times, each time losing its index, so a new generation of streams
    starts (the worst case); an outside publisher restarts every 1,000 batches under a new
    id. The reading query plans 10,000 batches. Retention forgets what is 60 s old; a
    batch takes 0.5 s. The offsets' JSON grows while the first streams are held, then stops."""
    rng = random.Random(15)
    SimulatedTopic._next = {}
    topic = SimulatedTopic(max_age=60.0)
    p = planner()
    offsets: dict[str, dict[str, int]] = {T: {}}
    sizes, publishers = [], []
    generation, outside = 0, "127.0.0.1:7000/0"
    for batch in range(10_000):
        now = batch * 0.5
        if batch and batch % 3000 == 0:
            generation = batch  # a restarted driver found no index: a new generation
        if batch % 1000 == 0:
            outside = f"127.0.0.1:7000/{batch}"  # an outside node restarted: a new id
        for partition in range(8):
            if rng.random() < 0.7:
                topic.publish(f"sink/q/{generation}/{partition}", rng.randint(1, 50), now)
        topic.publish(outside, 10, now)
        end = p.latest(offsets, [T], {T: topic.holdings(now)}, now=now)
        for r in p.ranges(offsets, end):
            assert r.first_seq <= r.last_seq  # every range is read whole: nothing skipped
        # A new publisher's mark is in the end of the batch that finds it, and only there.
        marks = {p.removeprefix(NEW_MARK) for p in end[T] if p.startswith(NEW_MARK)}
        assert not marks & set(offsets[T])
        offsets = end
        kept = {p: seq for p, seq in offsets[T].items() if not p.startswith(NEW_MARK)}
        sizes.append(len(json.dumps({T: kept})))
        publishers.append(len(kept))
    assert p.skipped_rows == 0
    # Held streams: 8 partitions of at most two generations, and at most two outside ids,
    # for the 60 s of retention plus the 60 s grace: 240 batches.
    assert max(publishers) <= 8 * 2 + 2
    assert publishers[-1] == 8 + 1  # once the old ones aged out: today's streams only
    # The JSON stops growing: past the first retention window it only gains digits (seqs
    # and generation names get longer), never entries.
    assert max(sizes[5000:]) <= 1.1 * max(sizes[1000:5000]), (
        max(sizes[1000:5000]),
        max(sizes[5000:]),
    )


class _Held:
    """A node's retention of one stream, as read_range answers it (values cut as asked)."""

    def __init__(self, messages: list[Delivery]) -> None:
        self.messages = messages

    def read_range(self, topic, publisher, first, last, *, value_prefix=0, **_):  # type: ignore[no-untyped-def]
        return [
            dataclasses.replace(m, value=m.value[:value_prefix] if value_prefix else m.value)
            for m in self.messages
            if first <= m.seq <= last
        ]


def _message(seq: int, value: bytes, batch: bool) -> Delivery:
    headers = ((BATCH_HEADER, b"1"),) if batch else ()
    return Delivery(
        topic=T, publisher=b"s", seq=seq, timestamp_ms=0, key=None, value=value,
        headers=headers, id=b"",
    )  # fmt: skip


def test_row_offsets_of_a_batched_stream_come_from_its_batches_headers() -> None:
    held = _Held([_message(s, encode(s * 3, [(0, None, b"v", ())] * 3), True) for s in range(4)])
    rows = StreamRows()
    rows.update(held, T, b"s", 1, 3, ())
    assert rows.batched and rows.rows_of(1, 3) == (3, 11)
    assert [rows.seq_of(r) for r in (3, 5, 6, 11)] == [1, 1, 2, 3]
    held.messages.append(_message(4, encode(12, [(0, None, b"v", ())] * 2), True))
    rows.update(held, T, b"s", 2, 4, ())  # only seq 4 is new; seq 1 is no longer held
    assert rows.rows_of(2, 4) == (6, 13) and rows.seqs == [2, 3, 4]
    plain = StreamRows()
    plain.update(_Held([_message(7, b"x", False)]), T, b"s", 7, 7, ())
    assert not plain.batched and plain.rows_of(5, 7) == (5, 7)


def test_a_stream_mixing_plain_messages_and_record_batches_fails_naming_it() -> None:
    messages = [_message(0, b"plain", False), _message(1, encode(1, [(0, None, b"v", ())]), True)]
    with pytest.raises(MixedStreamError, match=r"publisher 's': seq 0 is a plain message"):
        StreamRows().update(_Held(messages), T, b"s", 0, 1, ())
