"""The IHAVE queue's rules (episub/proto/announcements.py), one test each, no broadcast."""

from __future__ import annotations

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
    assert len(announcements.queued_for(B)) == 3


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
