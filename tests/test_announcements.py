"""The IHAVE queue's rules (episub/proto/announcements.py), one test each, no broadcast."""

from __future__ import annotations

from episub.proto.announcements import MAX_NOTED_RANGES, Announcements

A, B, P = b"a", b"b", b"pub"


def _queued(n: int, announcements: Announcements) -> None:
    for seq in range(n):
        announcements.add(bytes([seq]) * 32, P, seq, 1, None)


def test_a_link_that_comes_up_is_announced_only_what_was_queued_after() -> None:
    announcements = Announcements()
    _queued(2, announcements)
    announcements.link_up(B)
    announcements.add(b"x" * 32, P, 2, 1, None)
    assert announcements.unheld(A, announcements.queued_for(A)) == [(P, 0, 1), (P, 1, 1), (P, 2, 1)]
    assert announcements.unheld(B, announcements.queued_for(B)) == [(P, 2, 1)]
    announcements.link_down(B)
    assert len(announcements.queued_for(B)) == 3


def test_a_message_is_not_announced_to_its_sender_nor_to_a_neighbour_that_sent_it_since() -> None:
    announcements = Announcements()
    announcements.add(b"m" * 32, P, 0, 1, A)
    assert announcements.unheld(A, announcements.queue) == []
    announcements.note_holder(b"m" * 32, B)
    announcements.note_holder(b"m" * 32, B)
    assert announcements.unheld(B, announcements.queue) == []
    announcements.note_holder(b"n" * 32, B)  # not queued: nothing to remember
    assert announcements.unheld(b"c", announcements.queue) == [(P, 0, 1)]


def test_places_a_neighbour_announced_are_not_announced_back_and_its_notes_are_bounded() -> None:
    announcements = Announcements()
    _queued(4, announcements)
    announcements.note_announced(A, (P, 1, 2, 3))
    assert announcements.unheld(A, announcements.queue) == [(P, 0, 1), (P, 3, 1)]
    assert announcements.unheld(A, announcements.queue, skip=((P, 3, 3, 1),)) == [(P, 0, 1)]
    for seq in range(2 * MAX_NOTED_RANGES):
        announcements.note_announced(B, (b"other", seq, seq, 1))
    announcements.note_announced(B, (P, 0, 3, 1))  # past the bound: not noted
    assert len(announcements.unheld(B, announcements.queue)) == 4


def test_the_flush_empties_everything() -> None:
    announcements = Announcements()
    _queued(2, announcements)
    announcements.link_up(A)
    announcements.note_announced(B, (P, 0, 1, 1))
    announcements.clear()
    _queued(1, announcements)
    assert announcements.unheld(A, announcements.queued_for(A)) == [(P, 0, 1)]
    assert announcements.unheld(B, announcements.queue) == [(P, 0, 1)]
