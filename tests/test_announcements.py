"""The IHAVE queue's rules (episub/proto/announcements.py), one test each, no broadcast."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from episub.proto import messages as m
from episub.proto.announcements import MAX_NOTED_RANGES, Announcements

A, B, P = b"a", b"b", b"pub"


def _places(
    announcements: Announcements, peer: bytes, **kw: object
) -> list[tuple[bytes, int, int]]:
    """(publisher, seq, hops) of every place announced to `peer`, runs unrolled."""
    count, batches = announcements.runs_for(peer, **kw)  # type: ignore[arg-type]
    places = [(p, seq, hops) for runs in batches for p, first, last, hops in runs
              for seq in range(first, last + 1)]  # fmt: skip
    assert count == len(places)
    return places


def _queued(n: int, announcements: Announcements) -> None:
    for seq in range(n):
        announcements.add(bytes([seq]) * 32, P, seq, 1, None)


def test_a_link_that_comes_up_is_announced_only_what_was_queued_after() -> None:
    announcements = Announcements()
    _queued(2, announcements)
    announcements.link_up(B)
    announcements.add(b"x" * 32, P, 2, 1, None)
    assert _places(announcements, A) == [(P, 0, 1), (P, 1, 1), (P, 2, 1)]
    assert _places(announcements, B) == [(P, 2, 1)]
    announcements.link_down(B)
    assert len(_places(announcements, B)) == 3


def test_a_message_is_not_announced_to_its_sender_nor_to_a_neighbour_that_sent_it_since() -> None:
    announcements = Announcements()
    announcements.add(b"m" * 32, P, 0, 1, A)
    assert _places(announcements, A) == []
    announcements.note_holder(b"m" * 32, B)
    announcements.note_holder(b"m" * 32, B)
    assert _places(announcements, B) == []
    announcements.note_holder(b"n" * 32, B)  # not queued: nothing to remember
    assert _places(announcements, b"c") == [(P, 0, 1)]


def test_places_a_neighbour_announced_are_not_announced_back_and_its_notes_are_bounded() -> None:
    announcements = Announcements()
    _queued(4, announcements)
    announcements.note_announced(A, (P, 1, 2, 3))
    assert _places(announcements, A) == [(P, 0, 1), (P, 3, 1)]
    assert _places(announcements, A, skip=((P, 3, 3, 1),)) == [(P, 0, 1)]
    for seq in range(2 * MAX_NOTED_RANGES):
        announcements.note_announced(B, (b"other", seq, seq, 1))
    announcements.note_announced(B, (P, 0, 3, 1))  # past the bound: not noted
    assert len(_places(announcements, B)) == 4


def test_the_flush_empties_everything() -> None:
    announcements = Announcements()
    _queued(2, announcements)
    announcements.link_up(A)
    announcements.note_announced(B, (P, 0, 1, 1))
    announcements.clear()
    _queued(1, announcements)
    assert _places(announcements, A) == [(P, 0, 1)]
    assert _places(announcements, B) == [(P, 0, 1)]


def test_runs_come_in_batches_of_the_limit_and_only_for_the_publishers_asked() -> None:
    announcements = Announcements()
    _queued(5, announcements)
    announcements.add(b"q" * 32, b"other", 7, 2, None)
    count, batches = announcements.runs_for(A, limit=2)
    assert count == 6
    assert batches == [[(P, 0, 1, 1)], [(P, 2, 3, 1)], [(P, 4, 4, 1), (b"other", 7, 7, 2)]]
    count, batches = announcements.runs_for(A, (b"other").__eq__)
    assert (count, batches) == (1, [[(b"other", 7, 7, 2)]])


def test_overlapping_noted_ranges_keep_out_every_place_they_cover_and_no_other() -> None:
    announcements = Announcements()
    _queued(12, announcements)
    for first, last in ((5, 6), (1, 2), (2, 3), (9, 9), (7, 7)):
        announcements.note_announced(A, (P, first, last, 1))
    assert [seq for _, seq, _ in _places(announcements, A)] == [0, 4, 8, 10, 11]


def _reference(
    announcements: Announcements,
    peer: bytes,
    announced: Callable[[bytes], bool] | None,
    skip: tuple[m.StreamRange, ...],
    limit: int,
) -> tuple[int, list[list[m.StreamRange]]]:
    """runs_for's rule, a message at a time: the definition the blocks must agree with."""
    noted = [*announcements._announced.get(peer, []), *skip]
    places = [
        (publisher, seq, hops)
        for mid, publisher, seq, hops in announcements.queue[
            announcements._queued_before.get(peer, 0) :
        ]
        if (announced is None or announced(publisher))
        and peer not in announcements._holders.get(mid, [])
        and not any(p == publisher and a <= seq <= b for p, a, b, _ in noted)
    ]
    batches = []
    for start in range(0, len(places), limit):
        runs: list[list[object]] = []
        open_runs: dict[bytes, list[object]] = {}
        for publisher, seq, hops in places[start : start + limit]:
            run = open_runs.get(publisher)
            if run is not None and seq == run[2] + 1 and hops == run[3]:  # type: ignore[operator]
                run[2] = seq
                continue
            run = open_runs[publisher] = [publisher, seq, seq, hops]
            runs.append(run)
        batches.append([tuple(r) for r in runs])
    return len(places), batches  # type: ignore[return-value]


_PEERS = (A, B, b"c")
_ADD = st.tuples(
    st.just("add"),
    st.sampled_from((P, b"q")),
    st.integers(0, 12),  # first seq of a run
    st.integers(1, 6),  # its length
    st.integers(1, 2),  # hops
    st.sampled_from((None, *_PEERS)),  # sender
)
_NOTED = st.tuples(
    st.just("noted"), st.sampled_from(_PEERS), st.sampled_from((P, b"q")),
    st.integers(0, 16), st.integers(0, 5),
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(
        st.one_of(
            _ADD,
            st.tuples(st.just("holder"), st.integers(0, 40), st.sampled_from(_PEERS)),
            st.tuples(st.just("up"), st.sampled_from(_PEERS)),
            _NOTED,
        ),
        max_size=60,
    ),
    limit=st.integers(1, 8),
    only=st.sampled_from((None, P)),
    skip=st.lists(st.tuples(st.just(P), st.integers(0, 16), st.integers(0, 4)), max_size=2),
)
def test_runs_for_agrees_with_the_rule_taken_a_message_at_a_time(
    steps: list[tuple], limit: int, only: bytes | None, skip: list[tuple[bytes, int, int]]
) -> None:
    announcements = Announcements()
    ids: list[bytes] = []
    for step in steps:
        if step[0] == "add":
            _, publisher, first, count, hops, sender = step
            for seq in range(first, first + count):  # a run, as a burst queues them
                ids.append(len(ids).to_bytes(32, "big"))
                announcements.add(ids[-1], publisher, seq, hops, sender)
        elif step[0] == "holder" and ids:
            announcements.note_holder(ids[step[1] % len(ids)], step[2])
        elif step[0] == "up":
            announcements.link_up(step[1])
        elif step[0] == "noted":
            _, peer, publisher, first, width = step
            announcements.note_announced(peer, (publisher, first, first + width, 1))
        announced = None if only is None else only.__eq__
        skipped = tuple((p, a, a + w, 1) for p, a, w in skip)
        for peer in _PEERS:
            expected = _reference(announcements, peer, announced, skipped, limit)
            assert announcements.runs_for(peer, announced, skipped, limit) == expected


def test_a_link_that_comes_up_within_a_run_is_announced_the_part_after() -> None:
    announcements = Announcements()
    _queued(3, announcements)
    announcements.link_up(A)
    for seq in range(3, 6):
        announcements.add(bytes([seq]) * 32, P, seq, 1, None)
    assert announcements.runs_for(A) == (3, [[(P, 3, 5, 1)]])
    assert announcements.runs_for(B) == (6, [[(P, 0, 5, 1)]])


def test_a_run_is_announced_around_the_ranges_a_neighbour_announced_inside_it() -> None:
    announcements = Announcements()
    _queued(10, announcements)
    announcements.note_announced(A, (P, 2, 3, 1))
    announcements.note_announced(A, (P, 6, 6, 1))
    assert announcements.runs_for(A) == (7, [[(P, 0, 1, 1), (P, 4, 5, 1), (P, 7, 9, 1)]])
